//! Rebuilding the index from the segment files at start.
//!
//! It starts from the checkpoint (`checkpoint.rs`) when there is a usable
//! one, as if every record before its cut had been replayed, and replays
//! the records after the cut; without one, from the first segment. What
//! follows is how records replay either way.
//!
//! Metadata comes from replaying every segment's records in order: an object
//! lives from its full record (created, or written again whole when its
//! segment was compacted) through the changes after it to its tombstone.
//! Segments are deleted oldest first and only once nothing in them is needed
//! (see `holdings.rs`), so whatever survives replays to the state that was
//! written. Journals written before that opened every segment with a
//! snapshot of all sessions, tasks and streams (ended by a `SnapshotEnd`
//! record) and deleted segments in any order: a snapshot still resets the
//! metadata to what it holds, so they recover as they always did.
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

use super::checkpoint::{self, Cut};
use super::holdings::Object;
use super::index::{Index, StreamState};
use super::record::{self, Record, Scan};
use super::retired::{Place, Retired, RetiredStreams};
use super::segment;
use super::segment::MAGIC;
use super::segment::{Loc, SegmentNo};
use super::summary::{Summary, SummaryHead};
use crate::id::{IdMap, SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
use crate::store::{Result, SessionRecord, StoreError, StreamMeta, TaskRecord};

pub struct Recovered {
    pub index: Index,
    pub files: HashMap<SegmentNo, Arc<File>>,
    /// The highest segment number in use (0 for an empty journal).
    pub last: SegmentNo,
    /// Bytes of records replayed: those after the checkpoint's cut, or
    /// every segment's without one.
    pub replayed: u64,
    /// The size of the checkpoint it started from (0: none).
    pub checkpoint_bytes: u64,
    /// How long reading that checkpoint took.
    pub checkpoint_us: u64,
}

/// Sessions, tasks and streams as the metadata records replayed so far
/// leave them.
#[derive(Default)]
pub struct Metadata {
    pub sessions: IdMap<SessionId, SessionRecord>,
    pub streams: IdMap<StreamId, StreamMeta>,
    pub tasks: IdMap<TaskId, TaskRecord>,
    /// The segment each object's full record was last written to.
    pub records: IdMap<Object, SegmentNo>,
    /// Retired streams, kept as the index will (the rest of each is read
    /// from its newest summary when the stream is): built in place, so
    /// recovering a million of them allocates nothing per stream beyond
    /// what the index keeps.
    pub retired: RetiredStreams,
    /// When each retired stream was created, while recovery runs: the
    /// newest stream answering a reused request id wins.
    retired_created: IdMap<StreamId, u64>,
    /// When the checkpoint recovery started from was taken (0: none): what
    /// its retired streams count as created at (see [`Cut::at_ms`]).
    cut_ms: u64,
}

impl Metadata {
    fn apply(&mut self, record: Record, no: SegmentNo) {
        match record {
            Record::Session(s) => {
                self.records.insert(Object::Session(s.id), no);
                self.sessions.insert(s.id, *s);
            }
            Record::SessionGone(id) => {
                self.records.remove(&Object::Session(id));
                self.sessions.remove(&id);
            }
            Record::Stream(meta) => {
                self.forget_retired(meta.id);
                self.records.insert(Object::Stream(meta.id), no);
                self.streams.insert(meta.id, *meta);
            }
            Record::Status { stream, end } => {
                if let Some(meta) = self.streams.get_mut(&stream) {
                    meta.finish(&end);
                }
            }
            Record::Change { stream, change } => {
                if let Some(meta) = self.streams.get_mut(&stream) {
                    meta.apply(&change);
                }
            }
            Record::Upstream { stream, mark } => {
                if let Some(meta) = self.streams.get_mut(&stream) {
                    meta.upstream = Some(mark);
                }
            }
            Record::StreamGone(id) => {
                self.records.remove(&Object::Stream(id));
                self.streams.remove(&id);
                self.forget_retired(id);
            }
            Record::Task(task) => {
                self.records.insert(Object::Task(task.id), no);
                self.tasks.insert(task.id, *task);
            }
            Record::TaskGone(id) => {
                self.records.remove(&Object::Task(id));
                self.tasks.remove(&id);
            }
            Record::SnapshotEnd => self.keep_snapshot(no),
            // Placed by `scan_segment`, which knows where they are.
            Record::Entries { .. } | Record::Retired(_) | Record::Thawed(_) => {}
        }
    }

    /// A stream's summary at `at` (segment, offset, length; `bytes` are the
    /// record): it replaces whatever was known of the stream.
    fn retire(
        &mut self,
        head: SummaryHead,
        at: (SegmentNo, usize, usize),
        bytes: &[u8],
        entries: &mut Slots,
    ) {
        let id = head.stream;
        self.streams.remove(&id);
        self.records.remove(&Object::Stream(id));
        entries.remove(&id);
        let (no, offset, len) = at;
        self.forget_retired(id);
        match Place::new(no, offset as u64, len) {
            Some(place) => self.add_retired(&head, place),
            // Beyond what a retired stream can point at: kept whole.
            None => {
                if let Some(summary) = record::read_summary(bytes) {
                    self.thaw(summary, no, entries);
                }
            }
        }
    }

    /// A stream written whole with its entries' locations.
    fn thaw(&mut self, summary: Summary, no: SegmentNo, entries: &mut Slots) {
        let id = summary.meta.id;
        self.forget_retired(id);
        self.records.insert(Object::Stream(id), no);
        entries.insert(id, summary.locs);
        self.streams.insert(id, summary.meta);
    }

    fn add_retired(&mut self, head: &SummaryHead, place: Place) {
        let (retired, created) = (&self.retired, &self.retired_created);
        let newer = |request: &&RequestId| match retired.answering(head.session, request) {
            Some(other) => created.get(&other).copied().unwrap_or(self.cut_ms) <= head.created_ms,
            None => true,
        };
        let requests: Vec<&RequestId> = head.request_ids.iter().filter(newer).collect();
        let stream = Retired::of_head(head, place);
        self.retired
            .insert(head.stream, stream, &requests, head.abandon_at_ms);
        self.retired_created.insert(head.stream, head.created_ms);
    }

    fn forget_retired(&mut self, id: StreamId) {
        if self.retired.remove(&id).is_some() {
            self.retired_created.remove(&id);
        }
    }

    /// A snapshot (written by journals before replay-all recovery) held
    /// every object there was: what the segment did not record is gone.
    /// Nothing but the snapshot precedes its end in a segment.
    fn keep_snapshot(&mut self, no: SegmentNo) {
        self.records.retain(|_, at| *at == no);
        let records = &self.records;
        self.sessions
            .retain(|id, _| records.contains_key(&Object::Session(*id)));
        self.streams
            .retain(|id, _| records.contains_key(&Object::Stream(*id)));
        self.tasks
            .retain(|id, _| records.contains_key(&Object::Task(*id)));
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

const MAGIC_LEN: usize = MAGIC.len();

pub fn recover(dir: &Path) -> Result<Recovered> {
    let numbers = segment::list(dir).map_err(io)?;
    checkpoint::remove_leftover(dir).map_err(io)?;
    let started = std::time::Instant::now();
    let from_checkpoint = from_checkpoint(dir, &numbers);
    let checkpoint_us = started.elapsed().as_micros() as u64;
    let (mut metadata, mut entries, cut, checkpoint_bytes) = match from_checkpoint {
        Some((metadata, entries, cut, bytes)) => (metadata, entries, Some(cut), bytes),
        None => (Metadata::default(), Slots::default(), None, 0),
    };
    let mut files = HashMap::new();
    let mut last = 0;
    let mut replayed = 0;
    let mut bytes = Vec::new();
    for (i, &no) in numbers.iter().enumerate() {
        let is_last = i + 1 == numbers.len();
        let from = match cut {
            // Its records are in the checkpoint: only its entries are read,
            // when a stream is.
            Some(cut) if no < cut.segment => {
                files.insert(no, segment::open_read(dir, no).map_err(io)?);
                last = no;
                continue;
            }
            Some(cut) if no == cut.segment => cut.offset as usize,
            _ => MAGIC.len(),
        };
        let read = match from {
            MAGIC_LEN => segment::read_all(dir, no, &mut bytes),
            from => segment::read_from(dir, no, from, &mut bytes),
        };
        if !read.map_err(io)? {
            if is_last {
                // Created, then the crash: it holds nothing.
                std::fs::remove_file(segment::path(dir, no)).map_err(io)?;
                continue;
            }
            return Err(corrupt(dir, no, 0, "segment shorter than its header"));
        }
        let scanned = scan_segment(&bytes, no, from, &mut entries, &mut metadata);
        replayed += scanned.end.saturating_sub(from) as u64;
        if let Some(why) = &scanned.torn {
            let at = scanned.end;
            if !(is_last && only_zeros_after(&bytes[at..])) {
                return Err(corrupt(dir, no, at, why));
            }
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
        }
        files.insert(no, segment::open_read(dir, no).map_err(io)?);
        last = no;
    }

    let mut index = Index::with_capacity(metadata.streams.len());
    let records = std::mem::take(&mut metadata.records);
    let record_of = |object| records.get(&object).copied().unwrap_or(last);
    for session in metadata.sessions.into_values() {
        let at = record_of(Object::Session(session.id));
        index.put_session(session, at);
    }
    for task in metadata.tasks.into_values() {
        let at = record_of(Object::Task(task.id));
        index.put_task(task, at);
    }
    for (meta, locs) in streams(metadata.streams, entries) {
        let at = record_of(Object::Stream(meta.id));
        index.add_stream(StreamState::new(meta, locs), at);
    }
    drop(metadata.retired_created);
    index.adopt_retired(metadata.retired);
    Ok(Recovered {
        index,
        files,
        last,
        replayed,
        checkpoint_bytes,
        checkpoint_us,
    })
}

/// The metadata and entries the checkpoint in `dir` holds, its cut and its
/// size;
/// `None` (every segment is replayed) when there is none, or one that
/// cannot be used: damaged, or not of these segments.
fn from_checkpoint(dir: &Path, numbers: &[SegmentNo]) -> Option<(Metadata, Slots, Cut, u64)> {
    let unusable = |why: &str| {
        tracing::warn!(why, "journal checkpoint ignored; replaying every segment");
    };
    let checkpoint = match checkpoint::read(dir) {
        Ok(found) => found?,
        Err(why) => {
            unusable(&why);
            return None;
        }
    };
    let cut = checkpoint.cut;
    if numbers.last().is_none_or(|&last| last < cut.segment) {
        unusable("its cut is past the last segment");
        return None;
    }
    if numbers.contains(&cut.segment) {
        let len = std::fs::metadata(segment::path(dir, cut.segment)).map(|m| m.len());
        if len.map_or(true, |len| len < cut.offset) {
            unusable("its cut is past the end of its segment");
            return None;
        }
    }
    let mut metadata = Metadata {
        retired: RetiredStreams::with_key(checkpoint.key),
        cut_ms: cut.at_ms,
        ..Metadata::default()
    };
    let mut entries = Slots::default();
    for whole in checkpoint.wholes() {
        match whole {
            Ok((home, Record::Thawed(summary))) => metadata.thaw(*summary, home, &mut entries),
            Ok((home, record)) => metadata.apply(record, home),
            Err(why) => {
                unusable(&why);
                return None;
            }
        }
    }
    let len = checkpoint.len() as u64;
    metadata.retired = RetiredStreams::with_base(checkpoint.key, checkpoint.into_frozen());
    Some((metadata, entries, cut, len))
}

/// Entry locations by seq (`slots[seq - 1]`), per stream, as the segments
/// placed them so far ([`Loc::MISSING`] where none did yet).
pub type Slots = IdMap<StreamId, Vec<Loc>>;

/// How reading one segment went.
pub struct SegmentScan {
    /// Where reading stopped: the end of the records, or a bad record.
    pub end: usize,
    /// Why the record at `end` is not one (torn, or damage); what that
    /// means — cut it off, fail, or merely stop — is the caller's call.
    pub torn: Option<String>,
}

/// Reads the records of segment `no` (all of it, `MAGIC` included) from
/// offset `from` (a record's start: `MAGIC.len()` for the whole segment),
/// placing its entries in `entries` and replaying its metadata records onto
/// `metadata`. Shared by recovery and the read-only [`super::inspect`], so
/// both read the log the same way.
pub fn scan_segment(
    bytes: &[u8],
    no: SegmentNo,
    from: usize,
    entries: &mut Slots,
    metadata: &mut Metadata,
) -> SegmentScan {
    let mut scanned = SegmentScan {
        end: from,
        torn: None,
    };
    let Some(mut rest) = bytes.get(from..) else {
        return scanned;
    };
    loop {
        match record::decode(rest) {
            Scan::End => break,
            Scan::Torn(why) => {
                scanned.torn = Some(why);
                break;
            }
            Scan::Record(record, used) => {
                match record {
                    Record::Entries {
                        stream,
                        first,
                        messages,
                    } => {
                        let locs = entries.entry(stream).or_default();
                        place(locs, first, &messages, no, scanned.end as u64);
                    }
                    Record::Retired(head) => {
                        let at = (no, scanned.end, used);
                        metadata.retire(*head, at, &rest[..used], entries);
                    }
                    Record::Thawed(summary) => metadata.thaw(*summary, no, entries),
                    other => metadata.apply(other, no),
                }
                scanned.end += used;
                rest = &rest[used..];
            }
        }
    }
    scanned
}

/// Pairs each stream of the newest metadata with its entries' locations, up
/// to the first missing seq (streams that no longer exist lose theirs).
pub fn streams(
    metadata: IdMap<StreamId, StreamMeta>,
    mut entries: Slots,
) -> impl Iterator<Item = (StreamMeta, Vec<Loc>)> {
    metadata.into_iter().map(move |(id, meta)| {
        let mut locs = entries.remove(&id).unwrap_or_default();
        if let Some(gap) = locs.iter().position(|l| *l == Loc::MISSING) {
            tracing::warn!(stream = %id, kept = gap, "journal entries after a gap ignored");
            locs.truncate(gap);
        }
        // Growth by doubling may have left up to half unused; a stream
        // retained for minutes should not carry that.
        if locs.capacity() > locs.len() + locs.len() / 4 {
            locs.shrink_to_fit();
        }
        (meta, locs)
    })
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
fn place(slots: &mut Vec<Loc>, first: u64, messages: &[(u64, u32)], no: SegmentNo, record_at: u64) {
    let start = (first - 1) as usize;
    if slots.len() < start + messages.len() {
        slots.resize(start + messages.len(), Loc::MISSING);
    }
    for (i, &(offset, len)) in messages.iter().enumerate() {
        slots[start + i] = Loc {
            segment: no,
            len,
            offset: record_at + offset,
        };
    }
}
