//! Checkpoints: the index as it stood at one point of the log (a *cut*),
//! kept in one file beside the segments, so that start-up reads it and the
//! records after the cut instead of every record of every segment.
//!
//! Replaying the whole log made start-up grow with what retention keeps:
//! 0.26 s for 100k retained streams, 3.1 s for a million (BENCHMARKS.md).
//! A checkpoint holds what that replay would have rebuilt from the records
//! before its cut — each session, task and whole stream as the record
//! recovery reads (with the segment its full record is in, for the
//! holdings), each retired stream in 72 fixed bytes, the request index's
//! hashes with their key — and whatever changed after the cut is in the
//! records after it, which recovery replays as before. The result is the
//! one a full replay gives (the tests compare the two).
//!
//! A checkpoint only saves time: the segments stay the truth. One that is
//! missing, damaged, or does not fit the segments present is ignored and
//! every segment replayed. One is published only once the log up to its
//! cut is durable, by writing a new file and renaming it over the old, so
//! a crash leaves the old one or the new one, whole.
//!
//! This module knows the file's bytes and its publication; when one is
//! taken is `mod.rs`'s call, what it means to recovery `recover.rs`'s.

use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::path::Path;

use super::cursor::Cursor;
use super::holdings::Object;
use super::index::Index;
use super::record::{self, Record, Scan};
use super::retired::{Place, RequestKey, Retired};
use super::segment::{self, SegmentNo};
use crate::id::{SessionId, StreamId};

/// The checkpoint's file name in the journal's directory.
pub const FILE: &str = "checkpoint";
/// Where the next one is written before it is renamed into place.
const TEMP: &str = "checkpoint.tmp";

/// Version 1 of the layout below; a reader refuses any other bytes.
const MAGIC: &[u8; 8] = b"MCPRC\x00\x00\x01";
/// Cut segment, cut offset, cut time, request key, then the three
/// sections' sizes: whole objects' bytes, retired and request counts.
const HEADER: usize = 4 + 8 + 8 + 16 + 8 + 8 + 8;
/// Stream, session, summary place (3 × 4), first segment, entries,
/// finished (2 × 4), requests, coalesced, has-abandon, abandon-at.
const RETIRED: usize = 16 + 16 + 12 + 4 + 4 + 8 + 2 + 1 + 1 + 8;
/// Hash, stream.
const REQUEST: usize = 8 + 16;
const CRC: usize = 4;

/// A point of the log: every record before `offset` in segment `segment`
/// (and in every segment before it) is in the checkpoint, none after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub segment: SegmentNo,
    pub offset: u64,
    /// When it was taken (ms since the epoch): a retired stream kept in the
    /// checkpoint counts as created then, when a stream replayed after the
    /// cut answers the same request (the later one created wins).
    pub at_ms: u64,
}

/// Encodes `index` as it stands at `cut` into `out` (cleared first).
pub fn encode(index: &Index, cut: Cut, out: &mut Vec<u8>) {
    out.clear();
    // Sized once: a checkpoint of a million retired streams is ~100 MB,
    // and doubling its way there copied most of it under the lock.
    let (retired, requests) = (index.retired.len(), index.retired.requests_len());
    out.reserve(MAGIC.len() + HEADER + retired * RETIRED + requests * REQUEST + 64 * 1024);
    out.extend_from_slice(MAGIC);
    let header = out.len();
    out.resize(header + HEADER, 0);
    let home = |object| index.home_of(object).unwrap_or(cut.segment);
    let wholes = out.len();
    for session in index.sessions.values() {
        put_u32(out, home(Object::Session(session.id)));
        record::session(out, session);
    }
    for task in index.tasks.values() {
        put_u32(out, home(Object::Task(task.id)));
        record::task(out, task);
    }
    for state in index.streams.values() {
        put_u32(out, home(Object::Stream(state.meta.id)));
        record::summary(out, &state.meta, &state.locs, true);
    }
    let wholes = out.len() - wholes;
    let mut retired = 0u64;
    // In the map's own order (one pass over its memory, not a lookup per
    // stream in the retirement order): recovery sorts them by finish.
    for (id, stream, abandon_at) in index.retired.iter() {
        put_retired(out, id, stream, abandon_at);
        retired += 1;
    }
    // Stale ones included (those of streams removed since): telling them
    // apart is a lookup per entry, which recovery does, not the lock.
    let mut requests = 0u64;
    for (hash, id) in index.retired.request_hashes() {
        let mut entry = [0u8; REQUEST];
        entry[..8].copy_from_slice(&hash.to_le_bytes());
        entry[8..].copy_from_slice(&id.0);
        out.extend_from_slice(&entry);
        requests += 1;
    }
    let mut head = Vec::with_capacity(HEADER);
    put_u32(&mut head, cut.segment);
    head.extend_from_slice(&cut.offset.to_le_bytes());
    head.extend_from_slice(&cut.at_ms.to_le_bytes());
    head.extend_from_slice(&index.retired.key().0);
    for n in [wholes as u64, retired, requests] {
        head.extend_from_slice(&n.to_le_bytes());
    }
    out[header..header + HEADER].copy_from_slice(&head);
    let crc = crc32fast::hash(out);
    out.extend_from_slice(&crc.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, n: u32) {
    out.extend_from_slice(&n.to_le_bytes());
}

/// One retired stream's fixed bytes, assembled on the stack and appended
/// at once (a million of them are encoded under the journal's lock).
fn put_retired(out: &mut Vec<u8>, id: &StreamId, r: &Retired, abandon_at: Option<u64>) {
    let mut entry = [0u8; RETIRED];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        entry[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&id.0);
    put(&r.session.0);
    for n in [
        r.summary.segment,
        r.summary.offset,
        r.summary.len,
        r.first_segment,
        r.entries,
        r.finished_ms[0],
        r.finished_ms[1],
    ] {
        put(&n.to_le_bytes());
    }
    put(&r.requests.to_le_bytes());
    put(&[u8::from(r.coalesced), u8::from(abandon_at.is_some())]);
    put(&abandon_at.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&entry);
}

/// A checkpoint read back and checked whole (its checksum and the sizes
/// its header gives); its sections are decoded as they are walked.
pub struct Checkpoint {
    bytes: Vec<u8>,
    pub cut: Cut,
    pub key: RequestKey,
    wholes: Range<usize>,
    retired: Range<usize>,
    requests: Range<usize>,
}

/// Reads the checkpoint in `dir`: `Ok(None)` when there is none,
/// `Err(why)` when there is one that cannot be used.
pub fn read(dir: &Path) -> Result<Option<Checkpoint>, String> {
    let bytes = match std::fs::read(dir.join(FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    Checkpoint::parse(bytes).map(Some)
}

impl Checkpoint {
    fn parse(bytes: Vec<u8>) -> Result<Self, String> {
        let body = bytes.len().checked_sub(CRC).ok_or("too short")?;
        if body < MAGIC.len() + HEADER || &bytes[..MAGIC.len()] != MAGIC {
            return Err("not a checkpoint of this version".into());
        }
        let crc = u32::from_le_bytes(bytes[body..].try_into().map_err(|_| "too short")?);
        if crc32fast::hash(&bytes[..body]) != crc {
            return Err("checksum mismatch".into());
        }
        let mut head = Cursor::at(&bytes[..MAGIC.len() + HEADER], MAGIC.len());
        let read = |c: &mut Cursor| -> Option<(Cut, RequestKey, [u64; 3])> {
            let cut = Cut {
                segment: c.u32()?,
                offset: c.u64()?,
                at_ms: c.u64()?,
            };
            let key = RequestKey(c.id()?);
            Some((cut, key, [c.u64()?, c.u64()?, c.u64()?]))
        };
        let (cut, key, sizes) = read(&mut head).ok_or("header cut short")?;
        let start = MAGIC.len() + HEADER;
        let section = |at: usize, len: u64, each: usize| -> Result<Range<usize>, String> {
            let len = usize::try_from(len)
                .ok()
                .and_then(|n| n.checked_mul(each))
                .ok_or("section size out of range")?;
            let end = at.checked_add(len).filter(|&end| end <= body);
            Ok(at..end.ok_or("section past the end")?)
        };
        let wholes = section(start, sizes[0], 1)?;
        let retired = section(wholes.end, sizes[1], RETIRED)?;
        let requests = section(retired.end, sizes[2], REQUEST)?;
        if requests.end != body {
            return Err("bytes after the last section".into());
        }
        Ok(Self {
            bytes,
            cut,
            key,
            wholes,
            retired,
            requests,
        })
    }

    /// Each session, task and whole stream with the segment its full record
    /// is in; `Err` for bytes that are not one (damage a checksum missed,
    /// or a writer's bug: the checkpoint must not be used).
    pub fn wholes(&self) -> impl Iterator<Item = Result<(SegmentNo, Record), String>> + '_ {
        let mut rest = &self.bytes[self.wholes.clone()];
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let Some((home, after)) = rest.split_first_chunk::<4>() else {
                rest = &[];
                return Some(Err("a whole object cut short".into()));
            };
            match record::decode(after) {
                Scan::Record(record, used) => {
                    rest = &after[used..];
                    Some(Ok((u32::from_le_bytes(*home), record)))
                }
                Scan::End | Scan::Torn(_) => {
                    rest = &[];
                    Some(Err("a whole object does not decode".into()))
                }
            }
        })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// How many retired streams it holds.
    pub fn retired_count(&self) -> usize {
        self.retired.len() / RETIRED
    }

    /// Each retired stream, with its abandonment deadline (in no order).
    pub fn retired(&self) -> impl Iterator<Item = (StreamId, Retired, Option<u64>)> + '_ {
        self.bytes[self.retired.clone()]
            .chunks_exact(RETIRED)
            .filter_map(retired_entry)
    }

    /// The request index's entries: (hash, stream).
    pub fn requests(&self) -> impl Iterator<Item = (u64, StreamId)> + '_ {
        self.bytes[self.requests.clone()]
            .chunks_exact(REQUEST)
            .filter_map(|chunk| {
                let mut c = Cursor::at(chunk, 0);
                Some((c.u64()?, StreamId(c.id()?)))
            })
    }
}

/// One retired stream's fixed bytes (see [`put_retired`]): a chunk of
/// exactly [`RETIRED`] bytes always decodes.
fn retired_entry(chunk: &[u8]) -> Option<(StreamId, Retired, Option<u64>)> {
    let mut c = Cursor::at(chunk, 0);
    let id = StreamId(c.id()?);
    let session = SessionId(c.id()?);
    let summary = Place {
        segment: c.u32()?,
        offset: c.u32()?,
        len: c.u32()?,
    };
    let retired = Retired {
        session,
        summary,
        first_segment: c.u32()?,
        entries: c.u32()?,
        finished_ms: [c.u32()?, c.u32()?],
        requests: c.u16()?,
        coalesced: c.byte()? != 0,
    };
    let has_abandon = c.byte()? != 0;
    let abandon_at = c.u64()?;
    Some((id, retired, has_abandon.then_some(abandon_at)))
}

/// Makes `bytes` the checkpoint in `dir`: written whole and synced under a
/// temporary name, then renamed over the old one. The caller has made the
/// log up to its cut durable first.
pub fn publish(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = dir.join(TEMP);
    let mut file = File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temp, dir.join(FILE))?;
    segment::sync_dir(dir)
}

/// Removes what a crash during [`publish`] left behind.
pub fn remove_leftover(dir: &Path) -> io::Result<()> {
    remove_if_there(&dir.join(TEMP))
}

/// Removes the checkpoint (recovery then replays every segment).
#[cfg(test)]
pub fn remove(dir: &Path) -> io::Result<()> {
    remove_if_there(&dir.join(FILE))
}

fn remove_if_there(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
