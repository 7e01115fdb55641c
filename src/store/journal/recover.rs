//! Rebuilding the index from the segment files at start.
//!
//! Metadata comes from the newest complete segment alone: every segment opens
//! with a snapshot of all sessions and streams, and the records after it are
//! the changes since, so older segments' metadata records are superseded.
//! Entries come from every segment, kept only for streams that still exist;
//! where two records hold the same seq (an entry copied forward), the later
//! one wins, and a stream keeps its entries up to the first missing seq. A torn record can only be at the end of the last segment (writes
//! are sequential and a segment is synced before the next one starts) with
//! nothing but zero fill after it, so it is cut off there; anywhere else it
//! is damage and opening fails with the file and offset rather than silently
//! dropping what follows.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use super::index::{Index, Loc, SegmentNo, StreamState};
use super::record::{self, Record, Scan, MAGIC};
use super::segment;
use crate::id::{SessionId, StreamId};
use crate::store::{Result, SessionRecord, StoreError, StreamMeta};

pub struct Recovered {
    pub index: Index,
    pub files: HashMap<SegmentNo, Arc<File>>,
    /// The highest segment number in use (0 for an empty journal).
    pub last: SegmentNo,
}

#[derive(Default)]
struct Metadata {
    sessions: HashMap<SessionId, SessionRecord>,
    streams: HashMap<StreamId, StreamMeta>,
}

impl Metadata {
    fn apply(&mut self, record: &Record) {
        match record {
            Record::Session(s) => {
                self.sessions.insert(s.id, s.clone());
            }
            Record::SessionGone(id) => {
                self.sessions.remove(id);
            }
            Record::Stream(meta) => {
                self.streams.insert(meta.id, (**meta).clone());
            }
            Record::Status { stream, end } => {
                if let Some(meta) = self.streams.get_mut(stream) {
                    meta.finish(end);
                }
            }
            Record::Change { stream, change } => {
                if let Some(meta) = self.streams.get_mut(stream) {
                    meta.apply(change);
                }
            }
            Record::Upstream { stream, mark } => {
                if let Some(meta) = self.streams.get_mut(stream) {
                    meta.upstream = Some(mark.clone());
                }
            }
            Record::StreamGone(id) => {
                self.streams.remove(id);
            }
            Record::Entries { .. } | Record::SnapshotEnd => {}
        }
    }
}

fn corrupt(dir: &Path, no: SegmentNo, at: usize, why: &str) -> StoreError {
    StoreError::Corrupt(format!(
        "{} at byte {at}: {why}",
        segment::path(dir, no).display()
    ))
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

pub fn recover(dir: &Path) -> Result<Recovered> {
    let numbers = segment::list(dir).map_err(io)?;
    let mut entries: HashMap<StreamId, Vec<Option<Loc>>> = HashMap::new();
    let mut metadata = Metadata::default();
    let mut files = HashMap::new();
    let mut last = 0;
    for (i, &no) in numbers.iter().enumerate() {
        let is_last = i + 1 == numbers.len();
        let Some(bytes) = segment::read_all(dir, no).map_err(io)? else {
            if is_last {
                // Created, then the crash: it holds nothing.
                std::fs::remove_file(segment::path(dir, no)).map_err(io)?;
                continue;
            }
            return Err(corrupt(dir, no, 0, "segment shorter than its header"));
        };
        let mut seg_meta = Metadata::default();
        let mut complete = false;
        let mut at = MAGIC.len();
        loop {
            match record::decode(&bytes[at..]) {
                Scan::End => break,
                Scan::Torn(why) if is_last && only_zeros_after(&bytes[at..]) => {
                    tracing::warn!(
                        segment = %segment::path(dir, no).display(),
                        offset = at,
                        why,
                        "journal ends in a torn record (a write a crash interrupted); cutting it off"
                    );
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(segment::path(dir, no))
                        .and_then(|f| f.set_len(at as u64).and_then(|_| f.sync_all()))
                        .map_err(io)?;
                    break;
                }
                Scan::Torn(why) => return Err(corrupt(dir, no, at, &why)),
                Scan::Record(record, used) => {
                    match &record {
                        Record::SnapshotEnd => complete = true,
                        Record::Entries {
                            stream,
                            first,
                            messages,
                        } => {
                            let locs = entries.entry(*stream).or_default();
                            place(locs, *first, messages, no, at as u64);
                        }
                        _ => seg_meta.apply(&record),
                    }
                    at += used;
                }
            }
        }
        if !complete {
            if is_last {
                // The crash came while the snapshot that opens it was being
                // written: nothing else can be in it.
                std::fs::remove_file(segment::path(dir, no)).map_err(io)?;
                continue;
            }
            return Err(corrupt(dir, no, at, "segment has no complete snapshot"));
        }
        metadata = seg_meta;
        files.insert(no, segment::open_read(dir, no).map_err(io)?);
        last = no;
    }

    let mut index = Index::default();
    index.sessions = metadata.sessions;
    for (id, meta) in metadata.streams {
        let slots = entries.remove(&id).unwrap_or_default();
        let locs: Vec<Loc> = slots.iter().map_while(|slot| *slot).collect();
        if locs.len() < slots.len() {
            tracing::warn!(stream = %id, kept = locs.len(), "journal entries after a gap ignored");
        }
        index.add_stream(StreamState::new(meta, locs));
    }
    Ok(Recovered { index, files, last })
}

/// Whether a bad record at the start of `bytes` is the tail a crash tore:
/// no valid record follows it before the zero fill. (A damaged length can
/// claim any extent, so the bytes after it are searched for a record rather
/// than trusted.) Records after it mean damage, which must not be cut off
/// silently.
fn only_zeros_after(bytes: &[u8]) -> bool {
    let written = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    !(1..written).any(|at| matches!(record::decode(&bytes[at..]), Scan::Record(..)))
}

/// Puts the entries of one record at their seqs; a later record for the
/// same seq (an entry copied forward out of a sparse segment) wins. Records
/// may come in any seq order: copies forward are written after newer entries.
fn place(
    slots: &mut Vec<Option<Loc>>,
    first: u64,
    messages: &[(u64, u32)],
    no: SegmentNo,
    record_at: u64,
) {
    let start = (first - 1) as usize;
    if slots.len() < start + messages.len() {
        slots.resize(start + messages.len(), None);
    }
    for (i, &(offset, len)) in messages.iter().enumerate() {
        slots[start + i] = Some(Loc {
            segment: no,
            len,
            offset: record_at + offset,
        });
    }
}
