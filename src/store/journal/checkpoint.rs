//! Checkpoints: the index as it stood at one point of the log (a *cut*),
//! kept in one file beside the segments, so that start-up reads it and the
//! records after the cut instead of every record of every segment.
//!
//! Replaying the whole log made start-up grow with what retention keeps:
//! 0.26 s for 100k retained streams, 3.1 s for a million (BENCHMARKS.md).
//! A checkpoint holds what that replay would have rebuilt from the records
//! before its cut — each session, task and whole stream as the record
//! recovery reads (with the segment its full record is in, for the
//! holdings), the retired streams as the frozen tier they were merged into
//! up to the cut (`retired/frozen.rs`, used in place after a restart), the
//! request hashes' key — and whatever changed after the cut is in the
//! records after it, which recovery replays as before. The result is the
//! one a full replay gives (the tests compare the two).
//!
//! Under the journal's lock a checkpoint only encodes the whole objects
//! (as many as are live or recently finished) and seals the retired
//! streams' changes; merging those into the next frozen tier and writing
//! the file happen on a thread of their own.
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
use super::retired::{Counts, Frozen, RequestKey};
use super::segment::{self, SegmentNo};

/// The checkpoint's file name in the journal's directory.
pub const FILE: &str = "checkpoint";
/// Where the next one is written before it is renamed into place.
const TEMP: &str = "checkpoint.tmp";

/// Version 2 of the layout below; a reader refuses any other bytes (a
/// version 1 checkpoint is ignored, and every segment replayed once).
const MAGIC: &[u8; 8] = b"MCPRC\x00\x00\x02";
/// Cut segment, cut offset, cut time, request key, the whole objects'
/// bytes, then the frozen tier's counts (records, requests, segments,
/// abandons).
const HEADER: usize = 4 + 8 + 8 + 16 + 8 + 4 * 8;
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

/// What a checkpoint takes under the journal's lock: its cut and the
/// whole objects as they stood there. The retired streams are added off
/// the lock, as the frozen tier merged up to the same cut.
pub struct Taken {
    pub cut: Cut,
    key: RequestKey,
    wholes: Vec<u8>,
}

/// Encodes the whole objects of `index` as they stand at `cut`: each
/// session, task and whole stream, after the segment its full record is in.
pub fn take(index: &Index, cut: Cut) -> Taken {
    let mut wholes = Vec::new();
    let home = |object| index.home_of(object).unwrap_or(cut.segment);
    for session in index.sessions.values() {
        put_u32(&mut wholes, home(Object::Session(session.id)));
        record::session(&mut wholes, session);
    }
    for task in index.tasks.values() {
        put_u32(&mut wholes, home(Object::Task(task.id)));
        record::task(&mut wholes, task);
    }
    for state in index.streams.values() {
        put_u32(&mut wholes, home(Object::Stream(state.meta.id)));
        record::summary(&mut wholes, &state.meta, &state.locs, true);
    }
    Taken {
        cut,
        key: index.retired.key(),
        wholes,
    }
}

impl Taken {
    /// The whole objects' bytes (what the lock paid for).
    pub fn wholes_len(&self) -> usize {
        self.wholes.len()
    }

    /// The file's first bytes: magic, header and whole objects, for a
    /// frozen tier of `counts`.
    fn head(&self, counts: Counts) -> Vec<u8> {
        let mut head = Vec::with_capacity(MAGIC.len() + HEADER + self.wholes.len());
        head.extend_from_slice(MAGIC);
        put_u32(&mut head, self.cut.segment);
        head.extend_from_slice(&self.cut.offset.to_le_bytes());
        head.extend_from_slice(&self.cut.at_ms.to_le_bytes());
        head.extend_from_slice(&self.key.0);
        let sizes = [
            self.wholes.len() as u64,
            counts.records,
            counts.requests,
            counts.segments,
            counts.abandons,
        ];
        for n in sizes {
            head.extend_from_slice(&n.to_le_bytes());
        }
        head.extend_from_slice(&self.wholes);
        head
    }

    /// Makes this, with `frozen` (the retired streams as of the same cut),
    /// the checkpoint in `dir`: written whole and synced under a temporary
    /// name, then renamed over the old one. The caller has made the log up
    /// to the cut durable first. Gives back the file's size.
    pub fn publish(&self, dir: &Path, frozen: &Frozen) -> io::Result<u64> {
        let head = self.head(frozen.counts());
        let sections = frozen.sections();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        crc.update(sections);
        let temp = dir.join(TEMP);
        let mut file = File::create(&temp)?;
        file.write_all(&head)?;
        file.write_all(sections)?;
        file.write_all(&crc.finalize().to_le_bytes())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, dir.join(FILE))?;
        segment::sync_dir(dir)?;
        Ok((head.len() + sections.len() + CRC) as u64)
    }
}

#[cfg(test)]
impl Taken {
    /// The file [`Taken::publish`] would write.
    pub fn to_bytes(&self, frozen: &Frozen) -> Vec<u8> {
        let mut bytes = self.head(frozen.counts());
        bytes.extend_from_slice(frozen.sections());
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }
}

fn put_u32(out: &mut Vec<u8>, n: u32) {
    out.extend_from_slice(&n.to_le_bytes());
}

/// A checkpoint read back and checked whole (its checksum and the sizes
/// its header gives): its whole objects decoded as they are walked, its
/// retired streams a frozen tier used in place.
pub struct Checkpoint {
    pub cut: Cut,
    pub key: RequestKey,
    len: usize,
    wholes: Range<usize>,
    frozen: Frozen,
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
    fn parse(mut bytes: Vec<u8>) -> Result<Self, String> {
        let len = bytes.len();
        let body = len.checked_sub(CRC).ok_or("too short")?;
        if body < MAGIC.len() + HEADER || &bytes[..MAGIC.len()] != MAGIC {
            return Err("not a checkpoint of this version".into());
        }
        let crc = u32::from_le_bytes(bytes[body..].try_into().map_err(|_| "too short")?);
        if crc32fast::hash(&bytes[..body]) != crc {
            return Err("checksum mismatch".into());
        }
        let mut head = Cursor::at(&bytes[..MAGIC.len() + HEADER], MAGIC.len());
        let read = |c: &mut Cursor| -> Option<(Cut, RequestKey, u64, Counts)> {
            let cut = Cut {
                segment: c.u32()?,
                offset: c.u64()?,
                at_ms: c.u64()?,
            };
            let key = RequestKey(c.id()?);
            let wholes = c.u64()?;
            let counts = Counts {
                records: c.u64()?,
                requests: c.u64()?,
                segments: c.u64()?,
                abandons: c.u64()?,
            };
            Some((cut, key, wholes, counts))
        };
        let (cut, key, wholes, counts) = read(&mut head).ok_or("header cut short")?;
        let start = MAGIC.len() + HEADER;
        let end = usize::try_from(wholes)
            .ok()
            .and_then(|n| start.checked_add(n))
            .filter(|&end| end <= body)
            .ok_or("whole objects past the end")?;
        bytes.truncate(body);
        let frozen = Frozen::from_bytes(bytes, end, counts)?;
        Ok(Self {
            cut,
            key,
            len,
            wholes: start..end,
            frozen,
        })
    }

    /// Each session, task and whole stream with the segment its full record
    /// is in; `Err` for bytes that are not one (damage a checksum missed,
    /// or a writer's bug: the checkpoint must not be used).
    pub fn wholes(&self) -> impl Iterator<Item = Result<(SegmentNo, Record), String>> + '_ {
        let mut rest = &self.frozen.buffer()[self.wholes.clone()];
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
        self.len
    }

    /// Its retired streams, as the frozen tier they are.
    pub fn into_frozen(self) -> Frozen {
        self.frozen
    }
}

/// Removes what a crash during [`Taken::publish`] left behind.
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
