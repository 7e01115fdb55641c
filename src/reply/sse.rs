//! Server-Sent Events: an encoder for what the proxy writes to clients and an
//! incremental decoder for what upstreams write to the proxy.
//!
//! The decoder follows the WHATWG event-stream grammar (LF, CRLF and CR line
//! ends, comments, `data`/`id`/`event`/`retry` fields, an event ends only at a
//! blank line) and accepts its input cut at arbitrary byte boundaries, because
//! TCP and chunked encoding cut wherever they like. It keeps the `data` payload
//! as the upstream wrote it: a one-line payload is handed out without a copy.
//!
//! This module knows nothing of JSON-RPC or of the log; it only frames bytes.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// One decoded event. `data` is the payload with multiple `data:` lines joined
/// by `\n`, as the spec prescribes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Bytes,
    /// Whether at least one `data` field was present (a priming event carries an
    /// empty one).
    pub has_data: bool,
    pub retry: Option<u64>,
}

/// Incremental decoder: feed chunks with [`Decoder::push`], take events with
/// [`Decoder::next_event`].
#[derive(Debug, Default)]
pub struct Decoder {
    buf: BytesMut,
    /// The previous chunk ended in `\r`; a `\n` at the start of the next one
    /// belongs to the same line end.
    skip_lf: bool,
    pending: Event,
    /// Fields seen since the last dispatch (comments do not count).
    dirty: bool,
    data_lines: Vec<Bytes>,
    /// Wire bytes of `data_lines` (each line with one byte for its line end),
    /// so that [`Decoder::buffered`] counts an event that never ends.
    held: usize,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes held for the event in progress: the incomplete line and the
    /// `data` lines of an event whose blank line has not come yet. Never more
    /// than was pushed since the last blank line, so a caller can bound the
    /// decoder's memory by checking it after taking the events.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.held
    }

    /// The next complete event, if the buffered input holds one.
    pub fn next_event(&mut self) -> Option<Event> {
        while let Some(line) = self.next_line() {
            if line.is_empty() {
                if let Some(event) = self.dispatch() {
                    return Some(event);
                }
                continue;
            }
            self.field(line);
        }
        None
    }

    fn next_line(&mut self) -> Option<Bytes> {
        if self.skip_lf && !self.buf.is_empty() {
            if self.buf[0] == b'\n' {
                self.buf.advance(1);
            }
            self.skip_lf = false;
        }
        let end = memchr::memchr2(b'\n', b'\r', &self.buf)?;
        let line = self.buf.split_to(end).freeze();
        let terminator = self.buf[0];
        self.buf.advance(1);
        if terminator == b'\r' {
            match self.buf.first() {
                Some(b'\n') => self.buf.advance(1),
                Some(_) => {}
                None => self.skip_lf = true,
            }
        }
        Some(line)
    }

    fn field(&mut self, line: Bytes) {
        if line[0] == b':' {
            return; // comment (keep-alive)
        }
        let (name, value) = match memchr::memchr(b':', &line) {
            Some(colon) => {
                let mut value = line.slice(colon + 1..);
                if value.first() == Some(&b' ') {
                    value.advance(1);
                }
                (line.slice(..colon), value)
            }
            None => (line.clone(), Bytes::new()),
        };
        match &name[..] {
            b"data" => {
                self.held += line.len() + 1;
                self.data_lines.push(value);
                self.pending.has_data = true;
            }
            b"id" => {
                // An id containing NUL is ignored, as the spec says.
                if !value.contains(&0) {
                    self.pending.id = Some(String::from_utf8_lossy(&value).into_owned());
                }
            }
            b"event" => self.pending.event = Some(String::from_utf8_lossy(&value).into_owned()),
            b"retry" => {
                if let Ok(ms) = std::str::from_utf8(&value).unwrap_or("").parse::<u64>() {
                    self.pending.retry = Some(ms);
                }
            }
            _ => return, // unknown fields are ignored and do not make an event
        }
        self.dirty = true;
    }

    fn dispatch(&mut self) -> Option<Event> {
        if !self.dirty {
            return None;
        }
        self.dirty = false;
        self.held = 0;
        let mut event = std::mem::take(&mut self.pending);
        event.data = match self.data_lines.len() {
            0 => Bytes::new(),
            1 => self.data_lines.pop().unwrap_or_default(),
            _ => {
                let mut joined = BytesMut::new();
                for (i, line) in self.data_lines.drain(..).enumerate() {
                    if i > 0 {
                        joined.put_u8(b'\n');
                    }
                    joined.extend_from_slice(&line);
                }
                joined.freeze()
            }
        };
        Some(event)
    }
}

/// Appends one `message` event. `data` may contain line breaks (an upstream is
/// free to pretty-print its JSON); each line then becomes its own `data:` field
/// so that the client's decoder joins them back to the same bytes (CRLF and CR
/// come back as LF, which JSON treats as the same whitespace).
pub fn encode_event(out: &mut BytesMut, id: Option<&str>, data: &[u8]) {
    out.reserve(data.len() + 64);
    if let Some(id) = id {
        out.put_slice(b"id: ");
        out.put_slice(id.as_bytes());
        out.put_u8(b'\n');
    }
    out.put_slice(b"event: message\n");
    if memchr::memchr2(b'\n', b'\r', data).is_none() {
        out.put_slice(b"data: ");
        out.put_slice(data);
        out.put_u8(b'\n');
    } else {
        let mut rest = data;
        loop {
            let end = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
            out.put_slice(b"data: ");
            out.put_slice(&rest[..end]);
            out.put_u8(b'\n');
            if end == rest.len() {
                break;
            }
            let skip = if rest[end] == b'\r' && rest.get(end + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            rest = &rest[end + skip..];
        }
    }
    out.put_u8(b'\n');
}

/// Appends a priming event: an id with an empty `data` field (2025-11-25
/// clients use its id as `Last-Event-ID` before any message arrived), with the
/// reconnection delay when one is configured.
pub fn encode_priming(out: &mut BytesMut, id: &str, retry_ms: Option<u64>) {
    out.put_slice(b"id: ");
    out.put_slice(id.as_bytes());
    out.put_u8(b'\n');
    if let Some(ms) = retry_ms {
        encode_retry_field(out, ms);
    }
    out.put_slice(b"data: \n\n");
}

/// Appends a `retry:` field line; the event that follows carries it. (A
/// retry-only event would reach some older clients as an empty message.)
pub fn encode_retry_field(out: &mut BytesMut, ms: u64) {
    use std::fmt::Write;
    out.put_slice(b"retry: ");
    // Formatted into the buffer: no string per event.
    let _ = write!(out, "{ms}");
    out.put_u8(b'\n');
}

/// A comment line: keeps idle connections alive through proxies and load
/// balancers without producing an event.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(chunks: &[&[u8]]) -> Vec<Event> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        for c in chunks {
            d.push(c);
            while let Some(e) = d.next_event() {
                out.push(e);
            }
        }
        out
    }

    #[test]
    fn joins_multiline_data_with_lf() {
        let events = decode_all(&[b"data: a\ndata: b\n\n"]);
        assert_eq!(events.len(), 1);
        assert_eq!(&events[0].data[..], b"a\nb");
    }

    #[test]
    fn crlf_and_cr_line_ends_are_equivalent_to_lf() {
        let lf = decode_all(&[b"id: 1\ndata: x\n\n"]);
        let crlf = decode_all(&[b"id: 1\r\ndata: x\r\n\r\n"]);
        let cr = decode_all(&[b"id: 1\rdata: x\r\r"]);
        assert_eq!(lf, crlf);
        assert_eq!(lf, cr);
    }

    #[test]
    fn cr_at_chunk_end_followed_by_lf_is_one_line_end() {
        let events = decode_all(&[b"data: x\r", b"\n\r", b"\n"]);
        assert_eq!(events.len(), 1);
        assert_eq!(&events[0].data[..], b"x");
    }

    #[test]
    fn comments_do_not_make_events() {
        assert!(decode_all(&[b": keep-alive\n\n"]).is_empty());
    }

    #[test]
    fn priming_event_has_id_and_empty_data() {
        let events = decode_all(&[b"id: abc\nretry: 1500\ndata: \n\n"]);
        assert_eq!(events[0].id.as_deref(), Some("abc"));
        assert_eq!(events[0].retry, Some(1500));
        assert!(events[0].has_data);
        assert!(events[0].data.is_empty());
    }

    #[test]
    fn incomplete_event_is_held_until_blank_line() {
        let mut d = Decoder::new();
        d.push(b"data: {\"a\":1}\n");
        assert!(d.next_event().is_none());
        d.push(b"\n");
        assert_eq!(&d.next_event().unwrap().data[..], b"{\"a\":1}");
    }

    #[test]
    fn encoder_splits_multiline_payloads_into_data_fields() {
        let mut out = BytesMut::new();
        encode_event(&mut out, Some("e1"), b"{\n  \"a\": 1\r\n}");
        assert_eq!(
            &out[..],
            b"id: e1\nevent: message\ndata: {\ndata:   \"a\": 1\ndata: }\n\n"
        );
        let events = decode_all(&[&out]);
        assert_eq!(&events[0].data[..], b"{\n  \"a\": 1\n}");
    }

    fn arb_event() -> impl Strategy<Value = (Option<String>, Vec<u8>)> {
        (
            proptest::option::of("[a-zA-Z0-9_-]{1,20}"),
            proptest::collection::vec(
                prop_oneof![
                    8 => 0x20u8..0x7f,
                    1 => Just(b'\n'),
                ],
                0..200,
            ),
        )
    }

    proptest! {
        #[test]
        fn decoding_is_independent_of_chunk_boundaries(
            events in proptest::collection::vec(arb_event(), 1..8),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
            crlf in any::<bool>(),
        ) {
            let mut wire = BytesMut::new();
            for (id, data) in &events {
                encode_event(&mut wire, id.as_deref(), data);
                wire.extend_from_slice(KEEP_ALIVE);
            }
            let wire: Vec<u8> = if crlf {
                let mut v = Vec::new();
                for b in wire.iter() {
                    if *b == b'\n' { v.extend_from_slice(b"\r\n") } else { v.push(*b) }
                }
                v
            } else {
                wire.to_vec()
            };
            let whole = decode_all(&[&wire]);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut start = 0;
            for p in points {
                chunks.push(&wire[start..p]);
                start = p;
            }
            chunks.push(&wire[start..]);
            let pieces = decode_all(&chunks);
            prop_assert_eq!(&whole, &pieces);
            prop_assert_eq!(whole.len(), events.len());
            for ((id, data), got) in events.iter().zip(&whole) {
                prop_assert_eq!(id, &got.id);
                prop_assert_eq!(&data[..], &got.data[..]);
            }
        }
    }
}
