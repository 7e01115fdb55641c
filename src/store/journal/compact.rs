//! Copying forward: emptying the oldest segments once they are mostly dead.
//!
//! Segments are deleted oldest first, once nothing in them is needed (see
//! `holdings.rs`). Retention empties a request stream's segment within
//! minutes, but a long-lived stream (a session's GET stream, an hours-long
//! call) or a long-lived session or task record would keep the oldest
//! segment, and with it every younger one, forever. So at each rollover the
//! oldest sealed segments that are mostly dead have what is still needed in
//! them written again into the active segment — entries, and the full
//! records of sessions, streams and tasks — and the files can go. Recovery
//! lets the later copy win. Only the leading run of such segments is
//! copied: a younger one cannot be deleted before the older ones anyway,
//! and retention is likely to empty it meanwhile. This module only moves
//! what is needed; deleting files stays with `mod.rs`.

use bytes::Bytes;

use super::entries::{encode_entries, locate, read_locs};
use super::holdings::Object;
use super::segment::SegmentNo;
use super::{io, record, Inner, Journal};
use crate::id::{Seq, StreamId};
use crate::store::Result;

/// A sealed segment whose still-needed contents fill less than 1/SPARSE of
/// a segment is emptied (copied forward) at the next rollover.
const SPARSE: u64 = 4;

/// What a full record is counted as when judging how full a segment is
/// (records are a few hundred bytes; their exact sizes are not kept).
const RECORD_WEIGHT: u64 = 512;

impl Journal {
    /// Copies what is still needed out of the oldest sealed segments that
    /// are mostly dead into the active one, so those files can go. Durable
    /// before it returns: the caller deletes the emptied segments next.
    pub(super) fn copy_forward(&self, inner: &mut Inner) -> Result<()> {
        self.commit.writable()?;
        let sparse = self.oldest_sparse(inner);
        let mut streams: Vec<StreamId> = Vec::new();
        let mut records: Vec<Object> = Vec::new();
        for no in &sparse {
            if let Some(held) = inner.index.holding(*no) {
                streams.extend(held.streams.iter().copied());
                records.extend(held.records.iter().copied());
            }
        }
        if streams.is_empty() && records.is_empty() {
            return Ok(());
        }
        streams.sort_unstable();
        streams.dedup();
        let mut copied = 0usize;
        for id in streams {
            copied += self.copy_entries(inner, id, &sparse)?;
        }
        self.rewrite_records(inner, &records)?;
        self.sync(&inner.writer.file).map_err(io)?;
        tracing::debug!(
            segments = ?sparse,
            entries = copied,
            records = records.len(),
            "journal segments copied forward"
        );
        Ok(())
    }

    /// The oldest sealed segments, up to the first that is not mostly dead.
    fn oldest_sparse(&self, inner: &Inner) -> Vec<SegmentNo> {
        let active = inner.writer.no;
        let mut numbers: Vec<SegmentNo> = inner
            .files
            .keys()
            .copied()
            .filter(|&no| no != active)
            .collect();
        numbers.sort_unstable();
        numbers
            .into_iter()
            .take_while(|&no| {
                let Some(held) = inner.index.holding(no) else {
                    return true;
                };
                // Retired streams are not copied: retention (or the bound)
                // frees what they hold soon enough.
                let live = held.bytes + held.records.len() as u64 * RECORD_WEIGHT;
                held.retired == 0 && live.saturating_mul(SPARSE) < self.segment_bytes
            })
            .collect()
    }

    /// Writes `stream`'s entries that sit in `sparse` segments again, each
    /// run of them as one record; returns how many it copied.
    fn copy_entries(&self, inner: &mut Inner, id: StreamId, sparse: &[SegmentNo]) -> Result<usize> {
        let Some(locs) = inner.index.streams.get(&id).map(|s| s.locs.clone()) else {
            return Ok(0);
        };
        let active = inner.writer.no;
        let mut copied = 0;
        let mut i = 0;
        while i < locs.len() {
            if !sparse.contains(&locs[i].segment) {
                i += 1;
                continue;
            }
            let start = i;
            while i < locs.len() && sparse.contains(&locs[i].segment) {
                i += 1;
            }
            let messages: Vec<Bytes> = read_locs(
                |no| inner.files.get(&no).cloned(),
                start as Seq + 1,
                &locs[start..i],
            )?
            .into_iter()
            .map(|e| e.message)
            .collect();
            let placed = encode_entries(&mut inner.buf, id, start as Seq + 1, &messages);
            let written = inner.writer.append(&inner.buf);
            inner.buf.clear();
            let moved = locate(placed, active, written.map_err(io)?);
            inner.index.move_locs(id, start, &moved);
            copied += moved.len();
        }
        Ok(copied)
    }

    /// Writes the full records of `objects` again, as they stand now.
    fn rewrite_records(&self, inner: &mut Inner, objects: &[Object]) -> Result<()> {
        for object in objects {
            match object {
                Object::Session(id) => {
                    if let Some(session) = inner.index.sessions.get(id) {
                        record::session(&mut inner.buf, session);
                    }
                }
                Object::Stream(id) => {
                    if let Some(state) = inner.index.streams.get(id) {
                        record::stream(&mut inner.buf, &state.meta);
                    }
                }
                Object::Task(id) => {
                    if let Some(task) = inner.index.tasks.get(id) {
                        record::task(&mut inner.buf, task);
                    }
                }
            }
        }
        let (no, _) = self.write(inner)?;
        for object in objects {
            inner.index.rewrote(*object, no);
        }
        Ok(())
    }
}
