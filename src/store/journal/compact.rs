//! Copying forward: emptying sealed segments that are mostly dead.
//!
//! A segment is deleted once no stream has entries in it, which retention
//! brings about for request streams within minutes. A long-lived stream (a
//! session's GET stream, an hours-long call) would otherwise keep every
//! segment it ever wrote to, and with it everyone else's deleted entries; so
//! at each rollover the entries still needed in sparse segments are written
//! again into the new segment and the old files can go. Recovery lets the
//! later copy of an entry win. This module only moves entries; deciding when
//! to delete a file stays with `mod.rs`.

use std::collections::HashMap;

use bytes::Bytes;

use super::index::SegmentNo;
use super::{encode_entries, io, locate, read_locs, Inner, Journal};
use crate::id::{Seq, StreamId};
use crate::store::Result;

/// A sealed segment whose still-needed entries fill less than 1/SPARSE of
/// a segment is emptied (entries copied forward) at the next rollover.
const SPARSE: u64 = 4;

impl Journal {
    /// Copies the entries still needed out of sealed segments that are
    /// mostly dead into the active one, so those files can go. Without this a
    /// long-lived stream (a session's GET stream, an hours-long call) would
    /// keep every segment it ever wrote to, and with it everyone else's
    /// deleted entries. Durable before it returns: the caller deletes the
    /// emptied segments next.
    pub(super) fn copy_forward(&self, inner: &mut Inner) -> Result<()> {
        let active = inner.writer.no;
        let mut live: HashMap<SegmentNo, u64> = HashMap::new();
        for state in inner.index.streams.values() {
            for loc in state.locs.iter().filter(|l| l.segment != active) {
                *live.entry(loc.segment).or_default() += loc.len as u64;
            }
        }
        let sparse: Vec<SegmentNo> = live
            .into_iter()
            .filter(|&(_, bytes)| bytes.saturating_mul(SPARSE) < self.segment_bytes)
            .map(|(no, _)| no)
            .collect();
        if sparse.is_empty() {
            return Ok(());
        }
        let streams: Vec<StreamId> = inner
            .index
            .streams
            .values()
            .filter(|s| s.segments.iter().any(|no| sparse.contains(no)))
            .map(|s| s.meta.id)
            .collect();
        let mut copied = 0usize;
        for id in streams {
            let Some(locs) = inner.index.streams.get(&id).map(|s| s.locs.clone()) else {
                continue;
            };
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
        }
        inner.writer.file.sync_data().map_err(io)?;
        tracing::debug!(segments = ?sparse, entries = copied, "journal entries copied forward");
        Ok(())
    }
}
