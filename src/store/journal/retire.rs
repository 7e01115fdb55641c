//! Retiring finished streams, and answering for retired ones.
//!
//! Once a stream's finish is durable, its summary (`summary.rs`) is written
//! and the index keeps a [`Retired`] of it instead of the whole stream
//! (`retired/`). A retired stream is read from its summary; a change to it
//! writes the summary again; an append, or a return to `Live`, takes it back
//! whole (*thaws* it). Past the bound on retained streams the oldest retired
//! ones are released before retention would have: a replay of one answers
//! as an expired stream does.
//!
//! Summaries are written ahead, like a new stream's record: a crash that
//! loses one leaves the records it summarised, which every deletion of a
//! segment waits for a sync to make needless (see `drop_unused_segments`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::BytesMut;

use super::entries::read_locs;
use super::recent::Recent;
use super::retired::{Place, Retired};
use super::segment::SegmentNo;
use super::summary::Summary;
use super::{io, record, Inner, Journal};
use crate::id::{Seq, StreamId};
use crate::store::{Entry, Result, StoreError, StreamMeta};

/// Streams retired by one write at most: a burst of finishes is retired
/// over the next few writes rather than holding one up.
const RETIRE_BATCH: usize = 512;

/// Reads the summary record at `place` from `file`.
pub(super) fn read_summary(file: &File, place: Place) -> Result<Summary> {
    let mut buf = BytesMut::zeroed(place.len as usize);
    file.read_exact_at(&mut buf, u64::from(place.offset))
        .map_err(io)?;
    record::read_summary(&buf).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "segment {} at byte {}: not a stream summary",
            place.segment, place.offset
        ))
    })
}

/// What a read of a retired stream needs once the lock is let go: the
/// stream as the index keeps it, and the files it is in.
pub(super) struct RetiredRead {
    pub stream: StreamId,
    pub retired: Retired,
    pub files: Vec<(SegmentNo, Arc<File>)>,
}

impl RetiredRead {
    pub fn file(&self, no: SegmentNo) -> Option<Arc<File>> {
        self.files
            .iter()
            .find(|(n, _)| *n == no)
            .map(|(_, f)| f.clone())
    }

    /// Entries `after + 1 ..` (at most `limit`), read at the summary's
    /// locations: all of them are durable.
    pub fn entries(&self, after: Seq, limit: usize, recent: &Recent) -> Result<Vec<Entry>> {
        let entries = Seq::from(self.retired.entries);
        if after >= entries {
            return Ok(Vec::new());
        }
        let summary = self.summary(recent)?;
        let end = entries.min(after.saturating_add(limit as Seq)) as usize;
        let locs = summary.locs.get(after as usize..end).unwrap_or_default();
        read_locs(|no| self.file(no), after + 1, locs)
    }

    /// The summary (outside the lock: a file whose segment was deleted
    /// meanwhile still reads), from `recent` when a page of the same
    /// replay read it just before.
    pub fn summary(&self, recent: &Recent) -> Result<Arc<Summary>> {
        let place = self.retired.summary;
        let stream = self.stream;
        if let Some(summary) = recent.get(stream, place) {
            return Ok(summary);
        }
        let summary = Arc::new(self.read()?);
        recent.keep(stream, place, &summary);
        Ok(summary)
    }

    /// The stream's metadata: from `recent` if a replay keeps its summary,
    /// else read (and not kept: a listing of many streams must not push out
    /// the summaries replays are paging through).
    pub fn meta(&self, recent: &Recent) -> Result<StreamMeta> {
        match recent.get(self.stream, self.retired.summary) {
            Some(summary) => Ok(summary.meta.clone()),
            None => Ok(self.read()?.meta),
        }
    }

    fn read(&self) -> Result<Summary> {
        let place = self.retired.summary;
        let file = self
            .file(place.segment)
            .ok_or_else(|| StoreError::Corrupt(format!("segment {} is gone", place.segment)))?;
        read_summary(&file, place)
    }
}

impl Inner {
    /// A retired stream and its files, for a read after the lock.
    pub(super) fn retired_read(&self, id: &StreamId) -> Option<RetiredRead> {
        let retired = self.index.retired.get(id)?;
        let files = retired
            .segments()
            .filter_map(|no| self.files.get(&no).map(|f| (no, f.clone())))
            .collect();
        Some(RetiredRead {
            stream: *id,
            retired,
            files,
        })
    }

    /// A retired stream's summary, read under the lock (a change to it).
    pub(super) fn retired_summary(&self, id: &StreamId) -> Result<Option<Summary>> {
        let Some(retired) = self.index.retired.get(id) else {
            return Ok(None);
        };
        let place = retired.summary;
        let file = self
            .files
            .get(&place.segment)
            .ok_or_else(|| StoreError::Corrupt(format!("segment {} is gone", place.segment)))?;
        read_summary(file, place).map(Some)
    }
}

impl Journal {
    /// Retires the streams whose finish is durable, in one write after the
    /// change that called it; then releases what the bound says must go.
    /// A failed write leaves them whole, to be tried again.
    pub(super) fn retire_finished(&self, inner: &mut Inner) {
        let ready = inner.index.ready_to_retire(RETIRE_BATCH);
        if ready.is_empty() {
            return;
        }
        let mut placed = Vec::with_capacity(ready.len());
        for id in &ready {
            if let Some(state) = inner.index.streams.get(id) {
                let start = inner.buf.len();
                record::summary(&mut inner.buf, &state.meta, &state.locs, false);
                placed.push((*id, start, inner.buf.len() - start));
            }
        }
        let (no, at) = match self.write(inner) {
            Ok(written) => written,
            Err(e) => {
                tracing::warn!(error = %e, "stream summaries not written; retried later");
                inner.index.retry_retiring(&ready);
                return;
            }
        };
        for (id, start, len) in placed {
            if let Some(place) = Place::new(no, at + start as u64, len) {
                inner.index.retire(id, place);
            }
        }
        if let Err(e) = self.release_over_bound(inner) {
            tracing::warn!(error = %e, "retained streams past the bound not released");
        }
    }

    /// Releases the oldest retired streams past the bound.
    fn release_over_bound(&self, inner: &mut Inner) -> Result<()> {
        let max = self.bound.max();
        let over = inner.index.retired.len().saturating_sub(max);
        if over == 0 {
            return Ok(());
        }
        let oldest = inner.index.retired.oldest(over);
        for id in &oldest {
            record::stream_gone(&mut inner.buf, *id);
        }
        self.write(inner)?;
        self.forget_streams(inner, &oldest)?;
        self.bound.count(oldest.len());
        Ok(())
    }

    /// Applies `edit` to a retired stream by writing its summary again.
    pub(super) fn resummarize(
        &self,
        inner: &mut Inner,
        id: StreamId,
        edit: impl FnOnce(&mut StreamMeta),
    ) -> Result<()> {
        let Summary { mut meta, locs } = inner
            .retired_summary(&id)?
            .ok_or(StoreError::NoSuchStream(id))?;
        edit(&mut meta);
        record::summary(&mut inner.buf, &meta, &locs, false);
        let len = inner.buf.len();
        let (no, at) = self.write(inner)?;
        match Place::new(no, at, len) {
            Some(place) => inner.index.resummarized(id, place, &meta),
            None => inner.index.thaw(Summary { meta, locs }, no),
        }
        Ok(())
    }

    /// Takes a retired stream back whole; nothing for one that is not.
    pub(super) fn thaw(&self, inner: &mut Inner, id: StreamId) -> Result<()> {
        let Some(summary) = inner.retired_summary(&id)? else {
            return Ok(());
        };
        record::summary(&mut inner.buf, &summary.meta, &summary.locs, true);
        let (no, _) = self.write(inner)?;
        inner.index.thaw(summary, no);
        Ok(())
    }
}

#[cfg(test)]
impl Journal {
    /// Retires whatever is ready now.
    pub(super) fn retire_now(&self) {
        let mut inner = self.lock();
        self.retire_finished(&mut inner);
    }

    /// From now on, retires each stream as soon as its finish is durable.
    pub(super) fn retire_eagerly(&self) {
        self.eager.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn retire_if_eager(&self) {
        if self.eager.load(std::sync::atomic::Ordering::Relaxed) {
            self.retire_now();
        }
    }

    pub(super) fn is_retired(&self, id: StreamId) -> bool {
        self.lock().index.retired.contains(&id)
    }
}

#[cfg(test)]
mod tests;
