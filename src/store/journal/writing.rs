//! How a change reaches the log: the one `write` of its encoded records,
//! and what follows every change under the same lock — retiring what
//! finished, rolling over a full segment, deleting the segments nothing
//! needs, taking a checkpoint once enough log was written — and the syncs
//! that make it durable.
//!
//! It owns the order of those steps; what a change writes is the caller's
//! (`entries.rs`, `store.rs`), what the index keeps `index.rs`'s.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::segment::{SegmentNo, Writer};
use super::{checkpoint, io, lock, retired, segment, Inner, Journal};
use crate::id::StreamId;
use crate::store::Result;

impl Journal {
    /// A sync of the active segment as one of the group commit's flushes,
    /// for a blocking task that must not keep the journal alive.
    pub(super) fn active_sync(&self) -> impl FnOnce() -> std::io::Result<()> + Send + 'static {
        let file = lock(&self.active).clone();
        let (flusher, sync_file) = (self.commit.flusher(), self.sync_file.clone());
        move || flusher.flush_with(|| sync_file(&file))
    }

    /// Makes `file` (the active segment) durable outside the group commit,
    /// as one of its flushes ([`GroupCommit::flush_with`]).
    pub(super) fn sync(&self, file: &File) -> std::io::Result<()> {
        self.commit.flush_with(|| (self.sync_file)(file))
    }

    pub(super) async fn durable(&self) -> Result<()> {
        self.commit.durable().await.map_err(io)
    }

    /// Appends the encoded records in `inner.buf` to the active segment;
    /// returns the segment and offset they start at. Rolls over afterwards
    /// when the segment is full. Refused once a flush failed
    /// ([`GroupCommit::writable`]).
    pub(super) fn write(&self, inner: &mut Inner) -> Result<(SegmentNo, u64)> {
        if let Err(stopped) = self.commit.writable() {
            inner.buf.clear();
            return Err(stopped.into());
        }
        let written = inner.writer.append(&inner.buf);
        inner.since_checkpoint += inner.buf.len() as u64;
        // Cleared either way: records whose write failed were never
        // acknowledged, and must not ride along with the next write.
        inner.buf.clear();
        let at = written.map_err(io)?;
        Ok((inner.writer.no, at))
    }

    /// Retires the finished streams whose finish is durable now
    /// (`retire.rs`), then rolls over once the active segment is full.
    /// Called at the end of a change, after the index knows what was
    /// written (the change's own stream is never retired under it): a
    /// rollover deletes the segments the index says nobody needs. A failed
    /// rollover leaves the active segment in place and is tried again at the
    /// next change.
    pub(super) fn wrote(&self, inner: &mut Inner) {
        self.retire_finished(inner);
        if inner.writer.len >= self.segment_bytes {
            if let Err(e) = self.roll_over(inner) {
                tracing::error!(error = %e, "journal rollover failed; retrying at the next write");
            }
        }
        #[cfg(test)]
        if self.eager_checkpoints.load(Ordering::Relaxed) {
            if let Some(publish) = self.checkpoint(inner) {
                publish();
                self.install_merged(inner);
            }
            return;
        }
        self.checkpoint_if_due(inner);
    }

    /// Takes a checkpoint once the log written since the last one (or
    /// replayed at start-up) reaches [`CHECKPOINT_EVERY`], or twice the last
    /// checkpoint's size; merges and publishes it on a thread of its own.
    ///
    /// [`CHECKPOINT_EVERY`]: super::CHECKPOINT_EVERY
    pub(super) fn checkpoint_if_due(&self, inner: &mut Inner) {
        self.install_merged(inner);
        let every = self.checkpoint_every.load(Ordering::Relaxed);
        if inner.since_checkpoint < every.max(2 * inner.checkpoint_bytes) {
            return;
        }
        let Some(publish) = self.checkpoint(inner) else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("journal-checkpoint".into())
            .spawn(publish);
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "journal checkpoint not started");
            inner.index.retired.merge_sealed();
            self.checkpointing.store(false, Ordering::Release);
        }
    }

    /// A checkpoint when the log is where `last_seen` saw it a tick ago
    /// (nothing written since) and [`quiet_checkpoint_bytes`] or more were
    /// written since the last checkpoint; `last_seen` becomes where it is
    /// now. What it gives back merges and publishes the checkpoint, for the
    /// caller to run off the lock.
    ///
    /// [`quiet_checkpoint_bytes`]: super::quiet_checkpoint_bytes
    pub(super) fn checkpoint_if_quiet(
        &self,
        last_seen: &mut Option<(SegmentNo, u64)>,
    ) -> Option<impl FnOnce() + Send + 'static> {
        let mut inner = self.lock();
        self.install_merged(&mut inner);
        let now = (inner.writer.no, inner.writer.len);
        let quiet = last_seen.replace(now) == Some(now);
        let due = super::quiet_checkpoint_bytes(inner.checkpoint_bytes);
        if !quiet || inner.since_checkpoint < due {
            return None;
        }
        tracing::debug!(
            since = inner.since_checkpoint,
            "journal quiet; taking a checkpoint"
        );
        self.checkpoint(&mut inner)
    }

    /// Takes a checkpoint of the index as every record written so far left
    /// it (`checkpoint.rs`), where the index and the log agree (every
    /// change updates the index in the lock hold that wrote its record).
    /// Under the lock only the whole objects are encoded and the retired
    /// streams' changes sealed; what it gives back merges those into the
    /// next frozen tier, publishes the checkpoint once the log up to the
    /// cut is durable, and leaves the tier for [`Journal::install_merged`].
    /// One at a time; none once the log stopped.
    pub(super) fn checkpoint(&self, inner: &mut Inner) -> Option<impl FnOnce() + Send + 'static> {
        if !inner.buf.is_empty()
            || self.commit.writable().is_err()
            || self.checkpointing.swap(true, Ordering::AcqRel)
        {
            return None;
        }
        let cut = checkpoint::Cut {
            segment: inner.writer.no,
            offset: inner.writer.len,
            at_ms: crate::store::now_ms(),
        };
        let started = std::time::Instant::now();
        let Some((base, sealed)) = inner.index.retired.seal() else {
            self.checkpointing.store(false, Ordering::Release);
            return None;
        };
        let taken = checkpoint::take(&inner.index, cut);
        tracing::debug!(
            bytes = taken.wholes_len(),
            retired = inner.index.retired.len(),
            whole = inner.index.streams.len(),
            held_us = started.elapsed().as_micros() as u64,
            "journal checkpoint taken"
        );
        inner.since_checkpoint = 0;
        let (dir, file) = (self.dir.clone(), inner.writer.file.clone());
        let (sync_file, busy) = (self.sync_file.clone(), self.checkpointing.clone());
        let merged_slot = self.merged.clone();
        // The log up to the cut is made durable as one of the group
        // commit's flushes (shared with the writers waiting, and failing as
        // theirs would), not by a sync of its own beside them.
        let flusher = self.commit.flusher();
        Some(move || {
            let started = std::time::Instant::now();
            let merged = Arc::new(retired::merge(&base, &sealed));
            drop((base, sealed));
            let published = flusher
                .flush_with(|| sync_file(&file))
                .and_then(|()| taken.publish(&dir, &merged));
            let bytes = match published {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(error = %e, "journal checkpoint not written; start-up replays more of the log");
                    0
                }
            };
            tracing::debug!(
                bytes,
                retired = merged.len(),
                ms = started.elapsed().as_millis() as u64,
                "journal checkpoint written"
            );
            *lock(&merged_slot) = Some((merged, bytes));
            busy.store(false, Ordering::Release);
        })
    }

    /// Takes a checkpoint at the end of the log and waits until it is
    /// published (after one under way, if any): a graceful stop's last
    /// act, so that the next start replays nothing. Nothing when nothing
    /// was written since the last one.
    pub(super) async fn final_checkpoint(&self) -> Result<()> {
        while self.checkpointing.load(Ordering::Acquire) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let publish = {
            let mut inner = self.lock();
            self.install_merged(&mut inner);
            if inner.since_checkpoint == 0 {
                return Ok(());
            }
            self.checkpoint(&mut inner)
        };
        if let Some(publish) = publish {
            tokio::task::spawn_blocking(publish)
                .await
                .map_err(|e| crate::store::StoreError::Backend(e.to_string()))?;
            self.install_merged(&mut self.lock());
        }
        Ok(())
    }

    /// Makes the frozen tier the last checkpoint merged the retired
    /// streams' base, once it is ready.
    pub(super) fn install_merged(&self, inner: &mut Inner) {
        if !inner.index.retired.is_sealed() || self.checkpointing.load(Ordering::Acquire) {
            return;
        }
        let Some((merged, bytes)) = lock(&self.merged).take() else {
            return;
        };
        inner.index.retired.install(merged);
        if bytes > 0 {
            inner.checkpoint_bytes = bytes;
        }
    }

    /// Starts the next segment and seals the active one, then copies
    /// forward and deletes segments nothing needs any more. Costs the same
    /// however many streams the log retains: no record is written again
    /// except those in the oldest, mostly dead segments (`compact.rs`).
    pub(super) fn roll_over(&self, inner: &mut Inner) -> Result<()> {
        let next = Writer::create(&self.dir, inner.writer.no + 1).map_err(io)?;
        let sealed = inner
            .writer
            .seal(|file| self.sync(file))
            .and_then(|()| segment::sync_dir(&self.dir));
        if let Err(e) = sealed {
            let _ = std::fs::remove_file(segment::path(&self.dir, next.no));
            return Err(io(e));
        }
        inner.files.insert(next.no, next.file.clone());
        *lock(&self.active) = next.file.clone();
        inner.writer = next;
        self.copy_forward(inner)?;
        self.drop_unused_segments(inner)
    }

    /// Deletes the oldest sealed segments while nothing in them is needed
    /// (no entries of an existing stream, no full record of an existing
    /// object), stopping at the first that is: recovery replays every
    /// segment in order, so a segment must never outlive one older than it
    /// (a tombstone or status in it would be lost while the record it
    /// changes stays). Only called when what made them unused is durable (a
    /// copy forward, or a sync just done).
    pub(super) fn drop_unused_segments(&self, inner: &mut Inner) -> Result<()> {
        let active = inner.writer.no;
        let mut numbers: Vec<SegmentNo> = inner.files.keys().copied().collect();
        numbers.sort_unstable();
        let unused: Vec<SegmentNo> = numbers
            .into_iter()
            .take_while(|&no| no != active && !inner.index.in_use(no))
            .collect();
        if unused.is_empty() {
            return Ok(());
        }
        for no in &unused {
            inner.files.remove(no);
            match std::fs::remove_file(segment::path(&self.dir, *no)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(e)),
            }
        }
        tracing::debug!(segments = ?unused, "journal segments deleted");
        segment::sync_dir(&self.dir).map_err(io)
    }

    /// Removes streams from the index after their tombstones were written;
    /// gives back the segments that leaves unused.
    pub(super) fn forget_streams(&self, inner: &mut Inner, ids: &[StreamId]) -> Result<()> {
        let active = inner.writer.no;
        let mut freed = false;
        for id in ids {
            freed |= inner
                .index
                .remove_stream(*id)
                .into_iter()
                .any(|no| no != active);
        }
        if freed {
            // The tombstones must outlive the entries they make unneeded.
            self.sync(&inner.writer.file).map_err(io)?;
            self.drop_unused_segments(inner)?;
        }
        Ok(())
    }
}
