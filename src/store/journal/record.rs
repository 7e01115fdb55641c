//! The journal's on-disk record: framing, checksums and the few kinds of
//! change the log is made of.
//!
//! A record is `len: u32 LE | crc32: u32 LE | kind: u8 | payload`, where `len`
//! counts kind and payload and the CRC covers them. Decoding never trusts a
//! length it has not bounds-checked, so a torn tail (a crash in the middle of
//! a `write`) or a flipped bit is reported as [`Scan::Torn`] at its offset,
//! never as a panic or a wrong record. This module knows bytes only: what a
//! record *means* for the index is `index.rs`'s business.

use bytes::Bytes;

use super::codes::{outcome_byte, outcome_of, status_byte, status_of};
use super::summary::{self, Summary, SummaryHead};
use crate::id::{Seq, SessionId, StreamId, TaskId};
use crate::store::{Change, Finish, SessionRecord, StreamMeta, TaskRecord, UpstreamMark};

/// `len` + `crc`.
const FRAME: usize = 8;

/// Where the messages of an `Entries` record start in its payload: stream,
/// first seq, count.
const ENTRIES_HEAD: usize = 16 + 8 + 4;

/// A record bigger than this is corruption, not data: a batch is split well
/// below it and one message is capped far lower (64 MiB upstream).
const MAX_RECORD: usize = 1 << 30;

const SESSION: u8 = 1;
const SESSION_GONE: u8 = 2;
const STREAM: u8 = 3;
const STATUS: u8 = 4;
const ENTRIES: u8 = 5;
const STREAM_GONE: u8 = 6;
const SNAPSHOT_END: u8 = 7;
const CHANGE: u8 = 8;
const UPSTREAM: u8 = 9;
const TASK: u8 = 10;
const TASK_GONE: u8 = 11;
/// A retired stream's summary, or a thawed one (`summary.rs`).
const SUMMARY: u8 = 12;

/// One decoded change. Entries carry where their messages sit in the record
/// (offsets from the record's start), not the messages: recovery rebuilds an
/// index, it does not load the log into memory.
#[derive(Debug, PartialEq)]
pub enum Record {
    /// Boxed: the largest record by far, and the rarest.
    Session(Box<SessionRecord>),
    SessionGone(SessionId),
    /// A stream's full metadata: written when it is created, and again when
    /// compaction empties the segment that held it.
    Stream(Box<StreamMeta>),
    Status {
        stream: StreamId,
        end: Finish,
    },
    /// A small metadata change (cursor, touch, marks).
    Change {
        stream: StreamId,
        change: Change,
    },
    /// Where the upstream's SSE stream stood after the entries before it.
    Upstream {
        stream: StreamId,
        mark: UpstreamMark,
    },
    Entries {
        stream: StreamId,
        first: Seq,
        /// `(offset from the record's first byte, length)` of each message.
        messages: Vec<(u64, u32)>,
    },
    StreamGone(StreamId),
    /// A task's whole record: written when it is created or updated, and
    /// again when compaction empties the segment that held it.
    Task(Box<TaskRecord>),
    TaskGone(TaskId),
    /// A finished stream written whole when it retired (or again when it
    /// changed since): recovery keeps only its head.
    Retired(Box<SummaryHead>),
    /// A retired stream taken back into the index whole (appended to, or
    /// made live again): as a stream record with its entries' locations.
    Thawed(Box<Summary>),
    /// Closed the snapshot every segment started with in journals written
    /// before replay-all recovery: the metadata before it was complete, so
    /// what it did not hold was gone. Read, never written any more.
    SnapshotEnd,
}

fn frame(out: &mut Vec<u8>, kind: u8, payload: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME]);
    out.push(kind);
    payload(out);
    let body = &out[start + FRAME..];
    let len = body.len() as u32;
    let crc = crc32fast::hash(body);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn json(value: &impl serde::Serialize, out: &mut Vec<u8>) {
    // Serializing our own plain structs into a Vec cannot fail.
    serde_json::to_writer(out, value).expect("store records serialize");
}

pub fn session(out: &mut Vec<u8>, record: &SessionRecord) {
    frame(out, SESSION, |o| json(record, o));
}

pub fn session_gone(out: &mut Vec<u8>, id: SessionId) {
    frame(out, SESSION_GONE, |o| o.extend_from_slice(id.as_bytes()));
}

pub fn stream(out: &mut Vec<u8>, meta: &StreamMeta) {
    frame(out, STREAM, |o| json(meta, o));
}

pub fn status(out: &mut Vec<u8>, stream: StreamId, end: &Finish) {
    frame(out, STATUS, |o| {
        o.extend_from_slice(stream.as_bytes());
        o.push(status_byte(end.status));
        o.extend_from_slice(&end.at_ms.to_le_bytes());
        o.push(outcome_byte(end.outcome));
    });
}

pub fn change(out: &mut Vec<u8>, stream: StreamId, change: &Change) {
    let (tag, value) = match *change {
        Change::Ack(seq) => (1, seq),
        Change::Touch { at_ms } => (2, at_ms),
        Change::Request(seq) => (3, seq),
        Change::Coalesced => (4, 0),
    };
    frame(out, CHANGE, |o| {
        o.extend_from_slice(stream.as_bytes());
        o.push(tag);
        o.extend_from_slice(&value.to_le_bytes());
    });
}

pub fn upstream(out: &mut Vec<u8>, stream: StreamId, mark: &UpstreamMark) {
    frame(out, UPSTREAM, |o| {
        o.extend_from_slice(stream.as_bytes());
        o.extend_from_slice(&mark.seq.to_le_bytes());
        o.extend_from_slice(mark.event_id.as_bytes());
    });
}

fn change_of(tag: u8, value: u64) -> Option<Change> {
    Some(match tag {
        1 => Change::Ack(value),
        2 => Change::Touch { at_ms: value },
        3 => Change::Request(value),
        4 => Change::Coalesced,
        _ => return None,
    })
}

/// A finished stream's summary (`thawed`: taken back into the index).
pub fn summary(out: &mut Vec<u8>, meta: &StreamMeta, locs: &[super::segment::Loc], thawed: bool) {
    frame(out, SUMMARY, |o| summary::encode(o, meta, locs, thawed));
}

/// The whole summary in `bytes`, one framed summary record as read back
/// from its place; `None` when it is not one (checksum included).
pub fn read_summary(bytes: &[u8]) -> Option<Summary> {
    let (len, crc) = (u32_at(bytes, 0)? as usize, u32_at(bytes, 4)?);
    let body = bytes.get(FRAME..FRAME + len)?;
    if crc32fast::hash(body) != crc || body.first() != Some(&SUMMARY) {
        return None;
    }
    summary::parse(&body[1..])
}

pub fn stream_gone(out: &mut Vec<u8>, id: StreamId) {
    frame(out, STREAM_GONE, |o| o.extend_from_slice(id.as_bytes()));
}

pub fn task(out: &mut Vec<u8>, record: &TaskRecord) {
    frame(out, TASK, |o| json(record, o));
}

pub fn task_gone(out: &mut Vec<u8>, id: TaskId) {
    frame(out, TASK_GONE, |o| o.extend_from_slice(id.as_bytes()));
}

/// A legacy snapshot's end (tests write journals as older versions did).
#[cfg(test)]
pub fn snapshot_end(out: &mut Vec<u8>) {
    frame(out, SNAPSHOT_END, |_| {});
}

/// Encodes `messages` as one record starting at seq `first`; returns each
/// message's `(offset from out's start as passed in, length)`.
pub fn entries(
    out: &mut Vec<u8>,
    stream: StreamId,
    first: Seq,
    messages: &[Bytes],
) -> Vec<(u64, u32)> {
    let mut at = Vec::with_capacity(messages.len());
    frame(out, ENTRIES, |o| {
        o.extend_from_slice(stream.as_bytes());
        o.extend_from_slice(&first.to_le_bytes());
        o.extend_from_slice(&(messages.len() as u32).to_le_bytes());
        for m in messages {
            o.extend_from_slice(&(m.len() as u32).to_le_bytes());
            at.push((o.len() as u64, m.len() as u32));
            o.extend_from_slice(m);
        }
    });
    at
}

/// What the next bytes of a segment hold (records end at the file's end or
/// at a zero length: segments are zero-filled ahead of their records).
#[derive(Debug, PartialEq)]
pub enum Scan {
    /// A whole, checksummed record and the length it occupies.
    Record(Record, usize),
    /// Nothing left.
    End,
    /// Not a valid record: a torn write at the tail, or damage.
    Torn(String),
}

/// Decodes the record at the start of `bytes`.
pub fn decode(bytes: &[u8]) -> Scan {
    if bytes.is_empty() {
        return Scan::End;
    }
    if bytes.len() < FRAME + 1 {
        if bytes.iter().all(|&b| b == 0) {
            return Scan::End;
        }
        return Scan::Torn(format!(
            "{} trailing bytes, too short for a record",
            bytes.len()
        ));
    }
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if len == 0 {
        // Segments are zero-filled ahead of their records: no record has
        // length 0, so this is where the records end.
        return Scan::End;
    }
    if len > MAX_RECORD {
        return Scan::Torn(format!("record length {len} out of range"));
    }
    let Some(body) = bytes.get(FRAME..FRAME + len) else {
        return Scan::Torn(format!("record of {len} bytes cut short"));
    };
    if crc32fast::hash(body) != crc {
        return Scan::Torn("record checksum mismatch".into());
    }
    match parse(body[0], &body[1..]) {
        Some(record) => Scan::Record(record, FRAME + len),
        None => Scan::Torn(format!("record of kind {} does not parse", body[0])),
    }
}

fn id16(p: &[u8]) -> Option<[u8; 16]> {
    p.get(..16)?.try_into().ok()
}

fn u64_at(p: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(p.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(p: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(p.get(at..at + 4)?.try_into().ok()?))
}

fn parse(kind: u8, p: &[u8]) -> Option<Record> {
    Some(match kind {
        SESSION => Record::Session(Box::new(serde_json::from_slice(p).ok()?)),
        SESSION_GONE if p.len() == 16 => Record::SessionGone(SessionId(id16(p)?)),
        STREAM => Record::Stream(serde_json::from_slice(p).ok()?),
        // 25 bytes: written before outcomes were recorded.
        STATUS if p.len() == 25 || p.len() == 26 => Record::Status {
            stream: StreamId(id16(p)?),
            end: Finish {
                status: status_of(p[16])?,
                at_ms: u64_at(p, 17)?,
                outcome: match p.get(25) {
                    Some(&b) => outcome_of(b)?,
                    None => None,
                },
            },
        },
        CHANGE if p.len() == 25 => Record::Change {
            stream: StreamId(id16(p)?),
            change: change_of(p[16], u64_at(p, 17)?)?,
        },
        UPSTREAM if p.len() >= 24 => Record::Upstream {
            stream: StreamId(id16(p)?),
            mark: UpstreamMark {
                seq: u64_at(p, 16)?,
                event_id: std::str::from_utf8(&p[24..]).ok()?.to_owned(),
            },
        },
        ENTRIES => {
            let stream = StreamId(id16(p)?);
            let first = u64_at(p, 16)?;
            let count = u32_at(p, 24)? as usize;
            // Offsets are reported from the record's start: frame + kind.
            let base = (FRAME + 1) as u64;
            let mut messages = Vec::with_capacity(count.min(p.len() / 4));
            let mut at = ENTRIES_HEAD;
            for _ in 0..count {
                let len = u32_at(p, at)?;
                at += 4;
                p.get(at..at + len as usize)?;
                messages.push((base + at as u64, len));
                at += len as usize;
            }
            if at != p.len() || first == 0 {
                return None;
            }
            Record::Entries {
                stream,
                first,
                messages,
            }
        }
        STREAM_GONE if p.len() == 16 => Record::StreamGone(StreamId(id16(p)?)),
        TASK => Record::Task(serde_json::from_slice(p).ok()?),
        TASK_GONE if p.len() == 16 => Record::TaskGone(TaskId(id16(p)?)),
        SNAPSHOT_END if p.is_empty() => Record::SnapshotEnd,
        SUMMARY if summary::is_thawed(p) => Record::Thawed(Box::new(summary::parse(p)?)),
        SUMMARY => Record::Retired(Box::new(summary::parse_head(p)?)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Outcome, StreamStatus};
    use proptest::prelude::*;

    fn one(bytes: &[u8]) -> Record {
        match decode(bytes) {
            Scan::Record(r, used) => {
                assert_eq!(used, bytes.len());
                r
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn entries_decode_to_the_offsets_they_were_written_at() {
        let stream = StreamId::random();
        let msgs = [
            Bytes::from_static(b"{\"a\":1}"),
            Bytes::new(),
            Bytes::from_static(b"xyz"),
        ];
        let mut out = b"prefix".to_vec();
        let at = entries(&mut out, stream, 7, &msgs);
        let Record::Entries {
            stream: s,
            first,
            messages,
        } = one(&out[6..])
        else {
            panic!("not entries")
        };
        assert_eq!((s, first), (stream, 7));
        for ((written, m), (read_off, read_len)) in at.iter().zip(&msgs).zip(&messages) {
            assert_eq!(written.0, read_off + 6);
            let (o, l) = (written.0 as usize, written.1 as usize);
            assert_eq!(&out[o..o + l], &m[..]);
            assert_eq!(*read_len as usize, m.len());
        }
    }

    #[test]
    fn status_and_tombstones_round_trip() {
        let (stream, session) = (StreamId::random(), SessionId::random());
        let mut out = Vec::new();
        let end = Finish {
            status: StreamStatus::Completed,
            outcome: Some(Outcome::Error),
            at_ms: 42,
        };
        status(&mut out, stream, &end);
        assert_eq!(one(&out), Record::Status { stream, end });
        for c in [
            Change::Ack(7),
            Change::Touch { at_ms: 9 },
            Change::Request(3),
            Change::Coalesced,
        ] {
            out.clear();
            change(&mut out, stream, &c);
            assert_eq!(one(&out), Record::Change { stream, change: c });
        }
        out.clear();
        let mark = UpstreamMark {
            event_id: "ev-41_é".into(),
            seq: 12,
        };
        upstream(&mut out, stream, &mark);
        assert_eq!(one(&out), Record::Upstream { stream, mark });
        out.clear();
        session_gone(&mut out, session);
        assert_eq!(one(&out), Record::SessionGone(session));
        out.clear();
        snapshot_end(&mut out);
        assert_eq!(one(&out), Record::SnapshotEnd);
    }

    #[test]
    fn task_records_and_their_tombstones_round_trip() {
        let mut record = crate::store::contract::task(TaskId::random(), 1_000, 60_000);
        record.legs = vec![StreamId::random(), StreamId::random()];
        record.input = Some(crate::store::PendingInput {
            request_state: Some(r#"{"s":1}"#.into()),
            asked: vec!["name".into()],
            answered: [("name".to_owned(), r#""Ada""#.to_owned())].into(),
        });
        let mut out = Vec::new();
        task(&mut out, &record);
        assert_eq!(one(&out), Record::Task(Box::new(record.clone())));
        out.clear();
        task_gone(&mut out, record.id);
        assert_eq!(one(&out), Record::TaskGone(record.id));
    }

    proptest! {
        /// No prefix of a valid record short of the whole, and no copy with a
        /// flipped bit, decodes as a record (it is torn, or the end of the
        /// records when what is left reads as zero fill); nothing panics.
        #[test]
        fn cut_or_flipped_records_are_torn(
            msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..5),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
        ) {
            let msgs: Vec<Bytes> = msgs.into_iter().map(Bytes::from).collect();
            let mut out = Vec::new();
            entries(&mut out, StreamId::random(), 1, &msgs);
            let cut = cut.index(out.len());
            if cut > 0 {
                prop_assert!(!matches!(decode(&out[..cut]), Scan::Record(..)));
            }
            let bit = flip.index(out.len() * 8);
            out[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(!matches!(decode(&out), Scan::Record(..)));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }
    }
}
