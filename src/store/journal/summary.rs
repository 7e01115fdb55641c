//! A retired stream's summary record: a finished stream written whole —
//! its metadata and where each of its entries is — so that the index can
//! forget all of it but a few dozen bytes (`retired.rs`).
//!
//! The record opens with a fixed binary head holding what recovery needs to
//! list the stream without reading the rest (ids, times, counts, the request
//! ids it answers), then the entries' locations, then the rest of the
//! metadata, binary too: a summary is written for every call, so it costs
//! ~150 bytes and a few copies rather than JSON's ~400 bytes and a
//! serializer. Recovery reads the head only; a read of the stream decodes
//! the rest. The same layout, marked *thawed*, takes a retired stream back into
//! the index whole (it was appended to, or made live again): recovery then
//! decodes all of it, as it does a stream record.
//!
//! This module knows bytes only, like `record.rs`; when a summary is written
//! and what it means for the index is `mod.rs`'s and `index.rs`'s business.

use std::sync::Arc;

use super::codes::{outcome_byte, outcome_of, status_byte, status_of};
use super::cursor::Cursor;
use super::segment::{Loc, SegmentNo};
use crate::id::{SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
use crate::store::{StreamKind, StreamMeta, UpstreamMark};

const THAWED: u8 = 1;
const COALESCED: u8 = 2;
const ABANDONS: u8 = 4;
const FINISHED: u8 = 8;

/// Flags, stream, session, created, finished, abandon-at, first segment.
const HEAD: usize = 1 + 16 + 16 + 8 + 8 + 8 + 4;
/// One location: segment, length, offset.
const LOC: usize = 4 + 4 + 8;

/// What recovery keeps of a retired stream's summary.
#[derive(Debug, PartialEq, Eq)]
pub struct SummaryHead {
    pub stream: StreamId,
    pub session: SessionId,
    pub created_ms: u64,
    /// 0 for a thawed stream that is live again.
    pub finished_ms: u64,
    pub abandon_at_ms: Option<u64>,
    pub coalesced: bool,
    /// The lowest segment holding one of its entries (0: it has none).
    pub first_segment: SegmentNo,
    pub entries: u32,
    pub request_ids: Vec<RequestId>,
}

/// A stream written whole: its metadata (`entries` and `bytes` counted from
/// the locations) and where its entries are.
#[derive(Debug, PartialEq)]
pub struct Summary {
    pub meta: StreamMeta,
    pub locs: Vec<Loc>,
}

/// The lowest segment holding one of `locs` (0: none).
pub fn first_segment(locs: &[Loc]) -> SegmentNo {
    locs.iter().map(|l| l.segment).min().unwrap_or(0)
}

/// Encodes the payload of a summary record (after the record's kind byte).
pub fn encode(out: &mut Vec<u8>, meta: &StreamMeta, locs: &[Loc], thawed: bool) {
    let mut flags = 0;
    if thawed {
        flags |= THAWED;
    }
    if meta.coalesced {
        flags |= COALESCED;
    }
    if meta.abandon_at_ms.is_some() {
        flags |= ABANDONS;
    }
    if meta.finished_ms.is_some() {
        flags |= FINISHED;
    }
    out.push(flags);
    out.extend_from_slice(meta.id.as_bytes());
    out.extend_from_slice(meta.session.as_bytes());
    out.extend_from_slice(&meta.created_ms.to_le_bytes());
    out.extend_from_slice(&meta.finished_ms.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&meta.abandon_at_ms.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&first_segment(locs).to_le_bytes());
    out.extend_from_slice(&(locs.len() as u32).to_le_bytes());
    for loc in locs {
        out.extend_from_slice(&loc.segment.to_le_bytes());
        out.extend_from_slice(&loc.len.to_le_bytes());
        out.extend_from_slice(&loc.offset.to_le_bytes());
    }
    out.extend_from_slice(&(meta.origin_ids.len() as u32).to_le_bytes());
    for id in &meta.origin_ids {
        text(out, &id.0);
    }
    body(out, meta);
}

fn text(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Flags of the body: which optional fields follow.
const METHOD: u8 = 1;
const DIGEST: u8 = 2;
const DIGEST_HEX: u8 = 4;
const ABANDON_AFTER: u8 = 8;
const UPSTREAM: u8 = 16;
const TASK: u8 = 32;

/// A params digest as the proxy writes them: 64 lowercase hex digits,
/// stored as the 32 bytes they spell.
fn hex32(digest: &str) -> Option<[u8; 32]> {
    let bytes = digest.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// What the head does not hold of the metadata. Destructured whole, so a
/// field added to [`StreamMeta`] does not compile until it is written here.
fn body(out: &mut Vec<u8>, meta: &StreamMeta) {
    let StreamMeta {
        id: _,
        session: _,
        kind,
        origin_ids: _,
        method,
        progress,
        status,
        created_ms: _,
        finished_ms: _,
        params_digest,
        acked,
        touched_ms,
        abandon_after_ms,
        abandon_at_ms: _,
        outcome,
        last_request,
        coalesced: _,
        upstream,
        task,
        entries: _,
        bytes: _,
    } = meta;
    let digest = params_digest.as_deref();
    let packed = digest.and_then(hex32);
    let mut flags = 0;
    for (set, flag) in [
        (method.is_some(), METHOD),
        (digest.is_some() && packed.is_none(), DIGEST),
        (packed.is_some(), DIGEST_HEX),
        (abandon_after_ms.is_some(), ABANDON_AFTER),
        (upstream.is_some(), UPSTREAM),
        (task.is_some(), TASK),
    ] {
        if set {
            flags |= flag;
        }
    }
    out.push(flags);
    out.push(u8::from(*kind == StreamKind::Standalone));
    out.push(status_byte(*status));
    out.push(outcome_byte(*outcome));
    for n in [*acked, *touched_ms, *last_request] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&(progress.len() as u32).to_le_bytes());
    for token in progress {
        text(out, token);
    }
    if let Some(method) = method {
        text(out, method);
    }
    match (packed, digest) {
        (Some(bytes), _) => out.extend_from_slice(&bytes),
        (None, Some(digest)) => text(out, digest),
        (None, None) => {}
    }
    if let Some(after) = abandon_after_ms {
        out.extend_from_slice(&after.to_le_bytes());
    }
    if let Some(mark) = upstream {
        out.extend_from_slice(&mark.seq.to_le_bytes());
        text(out, &mark.event_id);
    }
    if let Some(task) = task {
        out.extend_from_slice(task.as_bytes());
    }
}

/// Whether the payload is a thawed stream (decoded whole at recovery).
pub fn is_thawed(p: &[u8]) -> bool {
    p.first().is_some_and(|f| f & THAWED != 0)
}

/// Decodes the head of a summary payload, skipping the locations; returns
/// it and the cursor past the request ids (where the JSON starts).
fn head(p: &[u8]) -> Option<(SummaryHead, usize, usize)> {
    if p.len() < HEAD + 4 {
        return None;
    }
    let mut c = Cursor::at(p, 0);
    let flags = c.take(1)?[0];
    let stream = StreamId(c.id()?);
    let session = SessionId(c.id()?);
    let (created_ms, finished_ms, abandon_at) = (c.u64()?, c.u64()?, c.u64()?);
    let first_segment = c.u32()?;
    let entries = c.u32()?;
    let locs_at = c.at;
    c.take((entries as usize).checked_mul(LOC)?)?;
    let ids = c.u32()? as usize;
    let mut request_ids = Vec::with_capacity(ids.min(p.len() / 4));
    for _ in 0..ids {
        request_ids.push(RequestId(c.text()?.into()));
    }
    let head = SummaryHead {
        stream,
        session,
        created_ms,
        finished_ms: if flags & FINISHED != 0 {
            finished_ms
        } else {
            0
        },
        abandon_at_ms: (flags & ABANDONS != 0).then_some(abandon_at),
        coalesced: flags & COALESCED != 0,
        first_segment,
        entries,
        request_ids,
    };
    Some((head, locs_at, c.at))
}

/// The head of a summary payload (what recovery reads).
pub fn parse_head(p: &[u8]) -> Option<SummaryHead> {
    head(p).map(|(head, _, _)| head)
}

/// The whole summary of a payload.
pub fn parse(p: &[u8]) -> Option<Summary> {
    let (head, locs_at, body_at) = head(p)?;
    let mut c = Cursor::at(p, locs_at);
    let mut locs = Vec::with_capacity(head.entries as usize);
    for _ in 0..head.entries {
        let (segment, len, offset) = (c.u32()?, c.u32()?, c.u64()?);
        locs.push(Loc {
            segment,
            len,
            offset,
        });
    }
    let flags = p[0];
    let mut meta = parse_body(&mut Cursor::at(p, body_at), head)?;
    meta.finished_ms = (flags & FINISHED != 0).then_some(meta.finished_ms.unwrap_or(0));
    meta.entries = locs.len() as u64;
    meta.bytes = locs.iter().map(|l| u64::from(l.len)).sum();
    Some(Summary { meta, locs })
}

/// The metadata from the head and the body at the cursor (which must end
/// with it: trailing bytes are damage).
fn parse_body(c: &mut Cursor<'_>, head: SummaryHead) -> Option<StreamMeta> {
    let flags = c.byte()?;
    let kind = match c.byte()? {
        0 => StreamKind::Request,
        1 => StreamKind::Standalone,
        _ => return None,
    };
    let status = status_of(c.byte()?)?;
    let outcome = outcome_of(c.byte()?)?;
    let (acked, touched_ms, last_request) = (c.u64()?, c.u64()?, c.u64()?);
    let tokens = c.u32()? as usize;
    let mut progress = Vec::with_capacity(tokens.min(c.left() / 4));
    for _ in 0..tokens {
        progress.push(Arc::from(c.text()?));
    }
    let method = if flags & METHOD != 0 {
        Some(Arc::from(c.text()?))
    } else {
        None
    };
    let params_digest = if flags & DIGEST_HEX != 0 {
        let bytes = c.take(32)?;
        Some(Arc::from(crate::id::hex(bytes)))
    } else if flags & DIGEST != 0 {
        Some(Arc::from(c.text()?))
    } else {
        None
    };
    let abandon_after_ms = if flags & ABANDON_AFTER != 0 {
        Some(c.u64()?)
    } else {
        None
    };
    let upstream = if flags & UPSTREAM != 0 {
        let seq = c.u64()?;
        Some(UpstreamMark {
            seq,
            event_id: c.text()?,
        })
    } else {
        None
    };
    let task = if flags & TASK != 0 {
        Some(TaskId(c.id()?))
    } else {
        None
    };
    if !c.is_done() {
        return None;
    }
    Some(StreamMeta {
        id: head.stream,
        session: head.session,
        kind,
        origin_ids: head.request_ids,
        method,
        progress,
        status,
        created_ms: head.created_ms,
        finished_ms: Some(head.finished_ms),
        params_digest,
        acked,
        touched_ms,
        abandon_after_ms,
        abandon_at_ms: head.abandon_at_ms,
        outcome,
        last_request,
        coalesced: head.coalesced,
        upstream,
        task,
        entries: 0,
        bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Finish, Outcome, StreamStatus};

    fn finished() -> (StreamMeta, Vec<Loc>) {
        let mut meta = crate::store::contract::meta(SessionId::random());
        meta.origin_ids = vec![RequestId("7".into()), RequestId("\"é\"".into())];
        meta.params_digest = Some("ab".repeat(32).into());
        meta.abandon_at_ms = Some(99);
        meta.abandon_after_ms = Some(60_000);
        meta.coalesced = true;
        meta.progress = vec!["tok-1".into(), "é".into()];
        meta.acked = 1;
        meta.last_request = 2;
        meta.upstream = Some(UpstreamMark {
            event_id: "ev-7".into(),
            seq: 2,
        });
        meta.task = Some(TaskId::random());
        meta.finish(&Finish::new(StreamStatus::Completed, Some(Outcome::Result)));
        let locs = vec![
            Loc {
                segment: 4,
                len: 10,
                offset: 8,
            },
            Loc {
                segment: 3,
                len: 5,
                offset: 1 << 33,
            },
        ];
        meta.entries = 2;
        meta.bytes = 15;
        (meta, locs)
    }

    #[test]
    fn a_summary_reads_back_whole() {
        let (meta, locs) = finished();
        let mut out = Vec::new();
        encode(&mut out, &meta, &locs, false);
        assert!(!is_thawed(&out));
        assert_eq!(parse(&out), Some(Summary { meta, locs }));
    }

    #[test]
    fn its_head_names_what_recovery_lists_it_by() {
        let (meta, locs) = finished();
        let mut out = Vec::new();
        encode(&mut out, &meta, &locs, true);
        assert!(is_thawed(&out));
        let head = parse_head(&out).expect("a head");
        assert_eq!(
            head,
            SummaryHead {
                stream: meta.id,
                session: meta.session,
                created_ms: meta.created_ms,
                finished_ms: meta.finished_ms.unwrap_or(0),
                abandon_at_ms: Some(99),
                coalesced: true,
                first_segment: 3,
                entries: 2,
                request_ids: meta.origin_ids.clone(),
            }
        );
    }

    #[test]
    fn a_live_stream_and_an_odd_digest_read_back_as_they_were() {
        let (mut meta, locs) = finished();
        meta.finish(&Finish::new(StreamStatus::Live, None));
        meta.params_digest = Some("not hex".into());
        meta.method = None;
        meta.upstream = None;
        meta.task = None;
        meta.kind = StreamKind::Standalone;
        let mut out = Vec::new();
        encode(&mut out, &meta, &locs, true);
        assert_eq!(parse(&out).map(|s| s.meta), Some(meta));
    }

    #[test]
    fn a_cut_summary_does_not_parse() {
        let (meta, locs) = finished();
        let mut out = Vec::new();
        encode(&mut out, &meta, &locs, false);
        for cut in 0..out.len() {
            assert_eq!(parse(&out[..cut]), None, "cut at {cut}");
        }
    }
}
