//! A retired stream's summary record: a finished stream written whole —
//! its metadata and where each of its entries is — so that the index can
//! forget all of it but a few dozen bytes (`retired.rs`).
//!
//! The record opens with a fixed binary head holding what recovery needs to
//! list the stream without reading its metadata (ids, times, counts, the
//! request ids it answers), then the entries' locations, then the metadata
//! as JSON. Recovery reads the head only; a read of the stream decodes the
//! rest. The same layout, marked *thawed*, takes a retired stream back into
//! the index whole (it was appended to, or made live again): recovery then
//! decodes all of it, as it does a stream record.
//!
//! This module knows bytes only, like `record.rs`; when a summary is written
//! and what it means for the index is `mod.rs`'s and `index.rs`'s business.

use super::segment::{Loc, SegmentNo};
use crate::id::{SessionId, StreamId};
use crate::jsonrpc::RequestId;
use crate::store::StreamMeta;

const THAWED: u8 = 1;
const COALESCED: u8 = 2;
const ABANDONS: u8 = 4;

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
        out.extend_from_slice(&(id.0.len() as u32).to_le_bytes());
        out.extend_from_slice(id.0.as_bytes());
    }
    // Serializing our own plain struct into a Vec cannot fail.
    serde_json::to_writer(out, meta).expect("store records serialize");
}

/// Whether the payload is a thawed stream (decoded whole at recovery).
pub fn is_thawed(p: &[u8]) -> bool {
    p.first().is_some_and(|f| f & THAWED != 0)
}

/// A little-endian reader that fails instead of panicking on short input.
struct Cursor<'a> {
    p: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.p.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn id(&mut self) -> Option<[u8; 16]> {
        self.take(16)?.try_into().ok()
    }
}

/// Decodes the head of a summary payload, skipping the locations; returns
/// it and the cursor past the request ids (where the JSON starts).
fn head(p: &[u8]) -> Option<(SummaryHead, usize, usize)> {
    if p.len() < HEAD + 4 {
        return None;
    }
    let mut c = Cursor { p, at: 0 };
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
        let len = c.u32()? as usize;
        let text = std::str::from_utf8(c.take(len)?).ok()?;
        request_ids.push(RequestId(text.to_owned()));
    }
    let head = SummaryHead {
        stream,
        session,
        created_ms,
        finished_ms,
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
    let (head, locs_at, json_at) = head(p)?;
    let mut c = Cursor { p, at: locs_at };
    let mut locs = Vec::with_capacity(head.entries as usize);
    for _ in 0..head.entries {
        let (segment, len, offset) = (c.u32()?, c.u32()?, c.u64()?);
        locs.push(Loc {
            segment,
            len,
            offset,
        });
    }
    let mut meta: StreamMeta = serde_json::from_slice(p.get(json_at..)?).ok()?;
    if meta.id != head.stream {
        return None;
    }
    meta.entries = locs.len() as u64;
    meta.bytes = locs.iter().map(|l| u64::from(l.len)).sum();
    Some(Summary { meta, locs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Finish, Outcome, StreamStatus};

    fn finished() -> (StreamMeta, Vec<Loc>) {
        let mut meta = crate::store::contract::meta(SessionId::random());
        meta.origin_ids = vec![RequestId("7".into()), RequestId("\"é\"".into())];
        meta.params_digest = Some("ab".repeat(32));
        meta.abandon_at_ms = Some(99);
        meta.coalesced = true;
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
    fn a_cut_summary_does_not_parse() {
        let (meta, locs) = finished();
        let mut out = Vec::new();
        encode(&mut out, &meta, &locs, false);
        for cut in 0..out.len() {
            assert_eq!(parse(&out[..cut]), None, "cut at {cut}");
        }
    }
}
