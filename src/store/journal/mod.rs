//! The embedded default backend: an append-only journal of segment files
//! under `data_dir/journal`, with an in-memory index.
//!
//! Why not a general-purpose embedded database: the proxy's writes are
//! appends to streams that are read back in order and deleted whole, which is
//! exactly a log. Every change — a session record, a stream's creation, a
//! batch of entries, a status, a deletion — is one checksummed record
//! appended with one positioned `write`; durability is one `fdatasync` per
//! group commit (`commit.rs`), shared by every writer that wrote before it
//! started. The measured cost per call is a few microseconds plus the shared
//! sync, where sled spent hundreds (see BENCHMARKS.md).
//!
//! Metadata lives in memory (`index.rs`); on disk it is the records as they
//! were written, which recovery (`recover.rs`) replays in order — from the
//! newest checkpoint's cut (`checkpoint.rs`: the index as it stood at one
//! point of the log, taken once enough log was written since the last), or
//! from the first segment without one. A finished stream does not stay whole in memory: once its finish
//! is durable it retires (`retire.rs`) to a summary record on disk
//! (`summary.rs`) and a 48-byte entry in the index (`retired.rs`), so that
//! memory does not grow with what retention keeps; `[limits]
//! max_retained_streams` bounds how many are kept. A rollover therefore costs the same however many streams the log
//! retains. Segment files are deleted oldest first, as soon as nothing in
//! them is needed (`holdings.rs`: entries of an existing stream, the full
//! record of an existing object) — retention, session deletion and task
//! expiry therefore give disk space back; what long-lived streams, sessions
//! and tasks keep in the oldest, mostly dead segments is copied forward at
//! rollover (`compact.rs`). Entries are read with positioned reads straight from the files
//! (the page cache keeps recent ones hot); the index holds 16 bytes per
//! entry, never the messages.
//!
//! This module owns the locking and the order of operations; it must not
//! move a stream's watermark before the entries below it are durable.

mod checkpoint;
mod codes;
mod compact;
mod holdings;
mod index;
pub mod inspect;
mod recent;
mod record;
mod recover;
mod retire;
mod retired;
mod segment;
mod summary;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::watch;

use self::index::{Index, StreamState};
use self::segment::{Loc, SegmentNo, Writer};
use super::commit::{FlushObserver, GroupCommit, SyncMode};
use super::{
    Along, Change, Entry, Finish, OrphansOnce, Prior, Result, SessionRecord, Store, StoreError,
    StreamMeta, Subscription, TaskRecord, UpstreamMark, Watermark,
};
use crate::id::{Seq, SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;

/// Size at which the active segment is sealed and a new one started.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Entries of one batch are split into records of at most this many bytes.
const RECORD_TARGET: usize = 16 * 1024 * 1024;

/// Log written since the last checkpoint before the next is taken, at the
/// least; more once checkpoints are large (twice the last one's size), so
/// that checkpoints never write more than half what the log does. Start-up
/// replays at most this much of the log beyond the checkpoint.
const CHECKPOINT_EVERY: u64 = 16 * 1024 * 1024;

/// How often `sync = "never"` syncs in the background: what a power loss can
/// take (a `kill -9` takes nothing: written records are in the page cache).
const NEVER_SYNC_EVERY: Duration = Duration::from_millis(200);

/// Makes a segment file's data durable (`fdatasync`).
type SyncFile = dyn Fn(&File) -> std::io::Result<()> + Send + Sync;

fn io(e: std::io::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

struct Inner {
    writer: Writer,
    index: Index,
    /// Every segment still on disk, for reads (the active one included).
    files: HashMap<SegmentNo, Arc<File>>,
    /// Reused encoding buffer.
    buf: Vec<u8>,
    /// Log bytes written since the last checkpoint's cut.
    since_checkpoint: u64,
    /// The last checkpoint's size.
    checkpoint_bytes: u64,
}

pub struct Journal {
    dir: PathBuf,
    inner: Mutex<Inner>,
    /// The file the group commit syncs (swapped on rollover).
    active: Arc<Mutex<Arc<File>>>,
    commit: GroupCommit,
    segment_bytes: u64,
    /// Held for the journal's lifetime: one process per data directory.
    _lock: File,
    orphans: OrphansOnce,
    /// How a segment file is made durable (`fdatasync`; tests fail it).
    sync_file: Arc<SyncFile>,
    /// The bound on retained streams (`retire.rs`).
    bound: retire::Bound,
    /// Set while a checkpoint is being published (one at a time).
    checkpointing: Arc<AtomicBool>,
    /// [`CHECKPOINT_EVERY`]; tests take them sooner.
    checkpoint_every: AtomicU64,
    /// Log bytes replayed at start-up (those after the checkpoint's cut).
    #[cfg(test)]
    replayed: u64,
    /// Tests take a checkpoint after every change, published at once, so
    /// that the store contract's restarts start from one.
    #[cfg(test)]
    eager_checkpoints: AtomicBool,
    /// The summaries of the long retired streams read last (`recent.rs`).
    recent: recent::Recent,
    /// Tests retire every stream the moment its finish is durable, so that
    /// the store contract runs against retired streams too.
    #[cfg(test)]
    eager: std::sync::atomic::AtomicBool,
}

fn lock_dir(dir: &Path) -> Result<File> {
    let file = File::create(dir.join("LOCK")).map_err(io)?;
    // SAFETY: flock on a descriptor we own; no memory is shared.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(StoreError::InUse(dir.display().to_string()));
    }
    Ok(file)
}

impl Journal {
    /// Opens (or creates) the journal under `data_dir/journal`, recovering
    /// whatever a previous run (or crash) left.
    pub fn open(data_dir: &Path, sync: SyncMode) -> Result<Arc<Self>> {
        Self::open_with(data_dir, sync, DEFAULT_SEGMENT_BYTES)
    }

    pub fn open_with(data_dir: &Path, sync: SyncMode, segment_bytes: u64) -> Result<Arc<Self>> {
        Self::open_syncing(
            data_dir,
            sync,
            segment_bytes,
            Arc::new(|file| file.sync_data()),
        )
    }

    /// As [`Journal::open_with`], making the active segment durable with
    /// `sync_file` (tests make it fail, as a failing disk does).
    fn open_syncing(
        data_dir: &Path,
        sync: SyncMode,
        segment_bytes: u64,
        sync_file: Arc<SyncFile>,
    ) -> Result<Arc<Self>> {
        let dir = data_dir.join("journal");
        std::fs::create_dir_all(&dir).map_err(io)?;
        let dir_lock = lock_dir(&dir)?;
        let started = std::time::Instant::now();
        let recovered = recover::recover(&dir)?;
        tracing::info!(
            streams = recovered.index.streams.len(),
            retired = recovered.index.retired.len(),
            replayed_bytes = recovered.replayed,
            ms = started.elapsed().as_millis() as u64,
            "journal recovered"
        );
        // Every open starts a new segment: a torn tail stays behind in the
        // old one, and the new one is written from a known length.
        let writer = Writer::create(&dir, recovered.last + 1).map_err(io)?;
        let active = Arc::new(Mutex::new(writer.file.clone()));
        let flush_target = active.clone();
        let flush_file = sync_file.clone();
        let commit = GroupCommit::new(
            sync,
            Arc::new(move || {
                let file = lock(&flush_target).clone();
                flush_file(&file)
            }),
        );
        let mut files = recovered.files;
        files.insert(writer.no, writer.file.clone());
        let journal = Arc::new(Self {
            dir,
            inner: Mutex::new(Inner {
                writer,
                index: recovered.index,
                files,
                buf: Vec::new(),
                // What this start replayed is what the next one would.
                since_checkpoint: recovered.replayed,
                checkpoint_bytes: 0,
            }),
            active,
            commit,
            segment_bytes,
            _lock: dir_lock,
            orphans: OrphansOnce::default(),
            sync_file,
            bound: retire::Bound::default(),
            checkpointing: Arc::default(),
            checkpoint_every: AtomicU64::new(CHECKPOINT_EVERY),
            #[cfg(test)]
            replayed: recovered.replayed,
            #[cfg(test)]
            eager_checkpoints: Default::default(),
            recent: recent::Recent::default(),
            #[cfg(test)]
            eager: Default::default(),
        });
        {
            let mut inner = journal.lock();
            journal.copy_forward(&mut inner)?;
            journal.drop_unused_segments(&mut inner)?;
            // A long replay now is a long one at the next start too, even
            // if nothing is written before it.
            journal.checkpoint_if_due(&mut inner);
        }
        if sync == SyncMode::Never {
            spawn_background_sync(Arc::downgrade(&journal));
        }
        let stopped = Arc::downgrade(&journal);
        journal.commit.when_stopped(move || {
            if let Some(journal) = stopped.upgrade() {
                journal.wake_every_reader();
            }
        });
        Ok(journal)
    }

    /// Creates a stream, with its `opening` entries in the same record
    /// write, unless `prior`, asked under the same lock, finds the one it
    /// repeats. Not synced on its own: the first append's sync covers it
    /// (the journal is sequential), and a stream without entries that a
    /// crash loses was never shown to anyone. The opening entries are
    /// written ahead ([`Store::create_with`]): shown once a flush covers
    /// them.
    /// Encoded before the lock: every request creates a stream, and they
    /// all share the lock.
    fn create_unless(
        &self,
        meta: &StreamMeta,
        opening: &[Bytes],
        prior: impl FnOnce(&Inner) -> Result<Option<Prior>>,
    ) -> Result<Option<Prior>> {
        let mut encoded = Vec::with_capacity(512);
        record::stream(&mut encoded, meta);
        let placed = encode_entries(&mut encoded, meta.id, 1, opening);
        let state = StreamState::new(meta.clone(), Vec::new());
        let watermark = state.watermark.clone();
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            if let Some(prior) = prior(inner)? {
                return Ok(Some(prior));
            }
            inner.buf.extend_from_slice(&encoded);
            let (no, at) = self.write(inner)?;
            inner.index.add_stream(state, no);
            if !placed.is_empty() {
                inner.index.push_locs(meta.id, &locate(placed, no, at));
            }
            self.wrote(inner);
        }
        if !opening.is_empty() {
            self.show_when_durable(watermark, opening.len() as Seq);
        }
        Ok(None)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Wakes every stream's readers once the log stopped after a failed
    /// flush: they find it stopped ([`Store::flush_failed`]) and end their
    /// answers, so that clients reconnect (and learn it) instead of waiting
    /// on streams that will never move.
    fn wake_every_reader(&self) {
        let inner = self.lock();
        for state in inner.index.streams.values() {
            state.watermark.send_modify(|_| {});
        }
    }

    /// A sync of the active segment as one of the group commit's flushes,
    /// for a blocking task that must not keep the journal alive.
    fn active_sync(&self) -> impl FnOnce() -> std::io::Result<()> + Send + 'static {
        let file = lock(&self.active).clone();
        let (flusher, sync_file) = (self.commit.flusher(), self.sync_file.clone());
        move || flusher.flush_with(|| sync_file(&file))
    }

    /// Makes `file` (the active segment) durable outside the group commit,
    /// as one of its flushes ([`GroupCommit::flush_with`]).
    fn sync(&self, file: &File) -> std::io::Result<()> {
        self.commit.flush_with(|| (self.sync_file)(file))
    }

    async fn durable(&self) -> Result<()> {
        self.commit.durable().await.map_err(io)
    }

    /// Appends the encoded records in `inner.buf` to the active segment;
    /// returns the segment and offset they start at. Rolls over afterwards
    /// when the segment is full. Refused once a flush failed
    /// ([`GroupCommit::writable`]).
    fn write(&self, inner: &mut Inner) -> Result<(SegmentNo, u64)> {
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
    fn wrote(&self, inner: &mut Inner) {
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
            }
            return;
        }
        self.checkpoint_if_due(inner);
    }

    /// Takes a checkpoint once the log written since the last one (or
    /// replayed at start-up) reaches [`CHECKPOINT_EVERY`], or twice the last
    /// checkpoint's size; publishes it on a thread of its own.
    fn checkpoint_if_due(&self, inner: &mut Inner) {
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
            self.checkpointing.store(false, Ordering::Release);
        }
    }

    /// Takes a checkpoint of the index as every record written so far left
    /// it (`checkpoint.rs`): encoded here, under the lock, where the index
    /// and the log agree (every change updates the index in the lock hold
    /// that wrote its record). Gives back what publishes it once the log up
    /// to the cut is durable, to run outside the lock. One at a time; none
    /// once the log stopped.
    fn checkpoint(&self, inner: &mut Inner) -> Option<impl FnOnce() + Send + 'static> {
        if !inner.buf.is_empty()
            || self.commit.writable().is_err()
            || self.checkpointing.swap(true, Ordering::AcqRel)
        {
            return None;
        }
        let cut = checkpoint::Cut {
            segment: inner.writer.no,
            offset: inner.writer.len,
            at_ms: super::now_ms(),
        };
        let started = std::time::Instant::now();
        let mut bytes = Vec::with_capacity(inner.checkpoint_bytes as usize + 4096);
        checkpoint::encode(&inner.index, cut, &mut bytes);
        tracing::debug!(
            bytes = bytes.len(),
            retired = inner.index.retired.len(),
            whole = inner.index.streams.len(),
            held_us = started.elapsed().as_micros() as u64,
            "journal checkpoint taken"
        );
        inner.since_checkpoint = 0;
        inner.checkpoint_bytes = bytes.len() as u64;
        let (dir, file) = (self.dir.clone(), inner.writer.file.clone());
        let (sync_file, busy) = (self.sync_file.clone(), self.checkpointing.clone());
        Some(move || {
            let published = sync_file(&file).and_then(|()| checkpoint::publish(&dir, &bytes));
            if let Err(e) = published {
                tracing::warn!(error = %e, "journal checkpoint not written; start-up replays more of the log");
            }
            busy.store(false, Ordering::Release);
        })
    }

    /// Starts the next segment and seals the active one, then copies
    /// forward and deletes segments nothing needs any more. Costs the same
    /// however many streams the log retains: no record is written again
    /// except those in the oldest, mostly dead segments (`compact.rs`).
    fn roll_over(&self, inner: &mut Inner) -> Result<()> {
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
    fn drop_unused_segments(&self, inner: &mut Inner) -> Result<()> {
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
    fn forget_streams(&self, inner: &mut Inner, ids: &[StreamId]) -> Result<()> {
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

    /// Writes entries (and the final status) for one stream, waits once for
    /// durability, then moves the watermark readers follow.
    async fn append_inner(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        along: Along<'_>,
    ) -> Result<Seq> {
        let (finish, upstream) = (along.end, along.upstream_event);
        let (last, watermark) = {
            let mut guard = self.lock();
            let inner = &mut *guard;
            // A finished stream appended to (or made live) is whole again.
            self.thaw(inner, stream)?;
            let state = inner
                .index
                .streams
                .get(&stream)
                .ok_or(StoreError::NoSuchStream(stream))?;
            if let Some(caps) = along.caps {
                if !caps.admit(state.meta.entries, state.meta.bytes, messages) {
                    return Err(StoreError::OverCaps(stream));
                }
            }
            let watermark = state.watermark.clone();
            let first = state.locs.len() as Seq + 1;
            let last = first + messages.len() as Seq - 1;
            let placed = encode_entries(&mut inner.buf, stream, first, messages);
            // After the entries it covers, in the same write: a torn write
            // can lose the mark and keep entries (their replay is then
            // recognised), never the other way round.
            let mark = upstream.map(|event_id| UpstreamMark {
                event_id: event_id.to_owned(),
                seq: last,
            });
            if let Some(mark) = &mark {
                record::upstream(&mut inner.buf, stream, mark);
            }
            if let Some(end) = &finish {
                record::status(&mut inner.buf, stream, end);
            }
            let (no, at) = self.write(inner)?;
            inner.index.push_locs(stream, &locate(placed, no, at));
            if let Some(mark) = mark {
                inner.index.set_upstream(stream, mark);
            }
            if let Some(end) = &finish {
                inner.index.set_status(stream, end);
            }
            self.wrote(inner);
            (last, watermark)
        };
        self.durable().await?;
        advance(&watermark, last, finish);
        #[cfg(test)]
        self.retire_if_eager();
        Ok(last)
    }
}

impl Journal {
    /// Moves the watermark over entries written ahead (a new stream's
    /// opening entries, [`Store::create_with`]) once they are durable:
    /// after [`AHEAD_GRACE`], by a flush of their own unless one that
    /// covers them moved it meanwhile (a call answered within the grace
    /// pays one flush for its opening entries and its answer). A failed
    /// flush leaves them unseen: the stream's next append waits for a flush
    /// that covers them too.
    fn show_when_durable(&self, watermark: Arc<watch::Sender<Watermark>>, last: Seq) {
        let later = self.commit.later();
        tokio::spawn(async move {
            tokio::time::sleep(AHEAD_GRACE).await;
            if watermark.borrow().seq >= last {
                return;
            }
            if later.durable().await.is_ok() {
                advance(&watermark, last, None);
            }
        });
    }
}

/// How long entries written ahead wait for a flush someone else asks for:
/// a request's opening entries matter to a client whose call runs long,
/// and a fast call's answer is flushed within it anyway.
const AHEAD_GRACE: Duration = Duration::from_millis(5);

/// Moves a stream's watermark to `last` (and its end) once they are
/// durable. Concurrent appends to one stream were written in seq order, so
/// a flush covering this one covers every lower seq too.
fn advance(watermark: &watch::Sender<Watermark>, last: Seq, finish: Option<Finish>) {
    watermark.send_if_modified(|w| {
        let mut moved = false;
        if last > w.seq {
            w.seq = last;
            moved = true;
        }
        if let Some(end) = finish {
            let finished = !end.status.is_live();
            moved |= w.finished != finished;
            w.finished = finished;
        }
        moved
    });
}

impl Journal {
    /// The stream's watermark channel, or for a stream with none (retired,
    /// or one the log lacks) the watermark it ended at.
    fn watermark(
        &self,
        stream: StreamId,
    ) -> std::result::Result<Arc<watch::Sender<Watermark>>, Watermark> {
        let index = &self.lock().index;
        if let Some(state) = index.streams.get(&stream) {
            return Ok(state.watermark.clone());
        }
        Err(index
            .retired
            .get(&stream)
            .map_or(super::NO_SUCH_STREAM, |r| Watermark {
                seq: Seq::from(r.entries),
                finished: true,
                coalesced: r.coalesced,
            }))
    }

    /// The metadata of `ids` (whole, or read from their summaries after the
    /// lock); ids gone meanwhile are left out.
    fn metas_of(&self, ids: &[StreamId]) -> Result<Vec<StreamMeta>> {
        let mut metas = Vec::with_capacity(ids.len());
        let mut reads = Vec::new();
        {
            let inner = self.lock();
            for id in ids {
                match inner.index.streams.get(id) {
                    Some(state) => metas.push(state.visible()),
                    None => reads.extend(inner.retired_read(id)),
                }
            }
        }
        for read in reads {
            metas.push(read.meta(&self.recent)?);
        }
        Ok(metas)
    }

    /// Writes one metadata record of stream `id` (`encode`), applies it to
    /// the index (`apply`) and waits for durability; returns the stream's
    /// watermark, for the caller to move once readers may see the change.
    /// A retired stream has its summary written again with `edit` applied
    /// instead (and no watermark to move), unless `thaw` asks for it whole.
    async fn edit_stream(
        &self,
        id: StreamId,
        encode: impl FnOnce(&mut Vec<u8>),
        apply: impl FnOnce(&mut Index),
        edit: impl FnOnce(&mut StreamMeta),
        thaw: bool,
    ) -> Result<Option<Arc<watch::Sender<Watermark>>>> {
        let watermark = {
            let mut guard = self.lock();
            let inner = &mut *guard;
            if thaw {
                self.thaw(inner, id)?;
            }
            if inner.index.retired.contains(&id) {
                self.resummarize(inner, id, edit)?;
                self.wrote(inner);
                None
            } else {
                let state = inner.index.streams.get(&id);
                let watermark = state.ok_or(StoreError::NoSuchStream(id))?.watermark.clone();
                encode(&mut inner.buf);
                self.write(inner)?;
                apply(&mut inner.index);
                self.wrote(inner);
                Some(watermark)
            }
        };
        self.durable().await?;
        Ok(watermark)
    }
}

impl Journal {
    /// Writes a task record and puts it in the index, if `admit` accepts
    /// the record stored now (`None`: there is none); waits for durability
    /// only when it wrote. Returns whether it wrote.
    async fn write_task(
        &self,
        task: &TaskRecord,
        admit: impl FnOnce(Option<&TaskRecord>) -> bool,
    ) -> Result<bool> {
        {
            let mut inner = self.lock();
            // Decided under the lock that orders the journal's writes: two
            // updates of one version cannot both pass.
            if !admit(inner.index.tasks.get(&task.id)) {
                return Ok(false);
            }
            record::task(&mut inner.buf, task);
            let (no, _) = self.write(&mut inner)?;
            inner.index.put_task(task.clone(), no);
            self.wrote(&mut inner);
        }
        self.durable().await?;
        Ok(true)
    }
}

#[cfg(test)]
impl Journal {
    /// Takes a checkpoint now, published before this returns.
    fn checkpoint_now(&self) {
        let mut inner = self.lock();
        if let Some(publish) = self.checkpoint(&mut inner) {
            publish();
        }
    }

    /// From now on, a checkpoint after every change.
    fn checkpoint_eagerly(&self) {
        self.eager_checkpoints.store(true, Ordering::Relaxed);
    }

    fn checkpoint_every(&self, bytes: u64) {
        self.checkpoint_every.store(bytes, Ordering::Relaxed);
    }

    /// Log bytes replayed at start-up.
    fn replayed(&self) -> u64 {
        self.replayed
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state under these locks is updated only after the I/O it describes
    // succeeded, so a panic elsewhere leaves it consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Encodes `messages` as entries `first..` of `stream` (split into records
/// of a bounded size); returns where each message sits in `buf`.
fn encode_entries(
    buf: &mut Vec<u8>,
    stream: StreamId,
    first: Seq,
    messages: &[Bytes],
) -> Vec<(u64, u32)> {
    let mut placed = Vec::with_capacity(messages.len());
    let mut seq = first;
    for chunk in chunks(messages) {
        placed.extend(record::entries(buf, stream, seq, chunk));
        seq += chunk.len() as Seq;
    }
    placed
}

/// Turns positions in an encoded buffer into entry locations, once the
/// buffer was written to segment `no` at offset `at`.
fn locate(placed: Vec<(u64, u32)>, no: SegmentNo, at: u64) -> Vec<Loc> {
    placed
        .into_iter()
        .map(|(offset, len)| Loc {
            segment: no,
            len,
            offset: at + offset,
        })
        .collect()
}

/// Splits a batch into runs small enough for one record each.
fn chunks(messages: &[Bytes]) -> impl Iterator<Item = &[Bytes]> {
    let mut rest = messages;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut size = 0;
        let mut n = 0;
        while n < rest.len() && (n == 0 || size + rest[n].len() <= RECORD_TARGET) {
            size += rest[n].len() + 4;
            n += 1;
        }
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}

/// `sync = "never"` still syncs now and then, so a power loss costs at most
/// this interval. Stops when the journal is dropped.
fn spawn_background_sync(journal: Weak<Journal>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        let mut tick = tokio::time::interval(NEVER_SYNC_EVERY);
        loop {
            tick.tick().await;
            let Some(journal) = journal.upgrade() else {
                return;
            };
            let sync = journal.active_sync();
            drop(journal);
            // A failure stops the log, and is logged, there.
            if let Err(e) = tokio::task::spawn_blocking(sync).await {
                tracing::warn!(error = %e, "journal background sync did not run");
            }
        }
    });
}

/// Reads the message bytes at `locs`, one positioned read per run of
/// neighbouring entries (a batch's entries sit back to back, separated only
/// by their 4-byte length prefixes).
fn read_locs(
    file_of: impl Fn(SegmentNo) -> Option<Arc<File>>,
    first: Seq,
    locs: &[Loc],
) -> Result<Vec<Entry>> {
    const NEAR: u64 = 64;
    let mut out = Vec::with_capacity(locs.len());
    let mut i = 0;
    while i < locs.len() {
        let start = locs[i];
        let mut end = start.offset + start.len as u64;
        let mut j = i + 1;
        while j < locs.len()
            && locs[j].segment == start.segment
            && locs[j].offset >= end
            && locs[j].offset - end <= NEAR
        {
            end = locs[j].offset + locs[j].len as u64;
            j += 1;
        }
        let file = file_of(start.segment)
            .ok_or_else(|| StoreError::Corrupt(format!("segment {} is gone", start.segment)))?;
        let mut buf = BytesMut::zeroed((end - start.offset) as usize);
        file.read_exact_at(&mut buf, start.offset).map_err(io)?;
        let span = buf.freeze();
        for (k, loc) in locs[i..j].iter().enumerate() {
            let from = (loc.offset - start.offset) as usize;
            out.push(Entry {
                seq: first + (i + k) as Seq,
                message: span.slice(from..from + loc.len as usize),
            });
        }
        i = j;
    }
    Ok(out)
}

#[async_trait::async_trait]
impl Store for Journal {
    async fn put_session(&self, session: &SessionRecord) -> Result<()> {
        {
            let mut inner = self.lock();
            record::session(&mut inner.buf, session);
            let (no, _) = self.write(&mut inner)?;
            inner.index.put_session(session.clone(), no);
            self.wrote(&mut inner);
        }
        self.durable().await
    }

    async fn get_session(&self, id: SessionId) -> Result<Option<SessionRecord>> {
        Ok(self.lock().index.sessions.get(&id).cloned())
    }

    async fn list_sessions(&self) -> Result<Vec<SessionRecord>> {
        Ok(self.lock().index.sessions.values().cloned().collect())
    }

    async fn sessions_idle_by(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        Ok(self.lock().index.sessions_idle_by(seen_by_ms, closed_by_ms))
    }

    async fn delete_session(&self, id: SessionId) -> Result<()> {
        {
            let mut inner = self.lock();
            let streams = inner.index.streams_of(id);
            for stream in &streams {
                record::stream_gone(&mut inner.buf, *stream);
            }
            record::session_gone(&mut inner.buf, id);
            self.write(&mut inner)?;
            inner.index.remove_session(id);
            self.forget_streams(&mut inner, &streams)?;
            self.wrote(&mut inner);
        }
        self.durable().await
    }

    async fn create_with(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<()> {
        self.create_unless(meta, opening, |_| Ok(None)).map(|_| ())
    }

    async fn create_call(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<Option<Prior>> {
        self.create_unless(meta, opening, |inner| {
            let index = &inner.index;
            let Some(call) = meta.call_id() else {
                return Ok(None);
            };
            let Some(stream) = index.stream_of_request(meta.session, call) else {
                return Ok(None);
            };
            let digest = match index.streams.get(&stream) {
                Some(state) => state.meta.params_digest.clone(),
                None => inner
                    .retired_summary(&stream)?
                    .and_then(|s| s.meta.params_digest),
            };
            Ok(Prior::judge(meta, stream, digest.as_deref()))
        })
    }

    async fn stream_meta(&self, id: StreamId) -> Result<Option<StreamMeta>> {
        let read = {
            let inner = self.lock();
            if let Some(state) = inner.index.streams.get(&id) {
                return Ok(Some(state.visible()));
            }
            inner.retired_read(&id)
        };
        read.map(|r| r.meta(&self.recent)).transpose()
    }

    async fn list_streams(&self) -> Result<Vec<StreamMeta>> {
        let ids: Vec<StreamId> = {
            let inner = self.lock();
            let index = &inner.index;
            index
                .streams
                .keys()
                .chain(index.retired.ids())
                .copied()
                .collect()
        };
        self.metas_of(&ids)
    }

    async fn streams_of_session(&self, session: SessionId) -> Result<Vec<StreamMeta>> {
        let ids = self.lock().index.streams_of(session);
        self.metas_of(&ids)
    }

    async fn set_status(&self, id: StreamId, end: Finish) -> Result<()> {
        let watermark = self
            .edit_stream(
                id,
                |buf| record::status(buf, id, &end),
                |index| index.set_status(id, &end),
                |meta| meta.finish(&end),
                end.status.is_live(),
            )
            .await?;
        if let Some(watermark) = watermark {
            watermark.send_modify(|w| w.finished = !end.status.is_live());
        }
        #[cfg(test)]
        self.retire_if_eager();
        Ok(())
    }

    async fn update_stream(&self, id: StreamId, change: Change) -> Result<()> {
        let watermark = self
            .edit_stream(
                id,
                |buf| record::change(buf, id, &change),
                |index| index.apply(id, &change),
                |meta| meta.apply(&change),
                false,
            )
            .await?;
        if let (Some(watermark), Change::Coalesced) = (watermark, change) {
            watermark.send_modify(|w| w.coalesced = true);
        }
        Ok(())
    }

    async fn stream_of_request(
        &self,
        session: SessionId,
        id: &RequestId,
    ) -> Result<Option<StreamId>> {
        Ok(self.lock().index.stream_of_request(session, id))
    }

    async fn abandoned_by(&self, now_ms: u64) -> Result<Vec<StreamId>> {
        Ok(self.lock().index.abandoned_by(now_ms))
    }

    async fn finished_by(&self, at_ms: u64) -> Result<Vec<StreamId>> {
        Ok(self.lock().index.finished_by(at_ms))
    }

    async fn delete_stream(&self, id: StreamId) -> Result<()> {
        let mut inner = self.lock();
        if !inner.index.has_stream(&id) {
            return Ok(());
        }
        record::stream_gone(&mut inner.buf, id);
        self.write(&mut inner)?;
        self.forget_streams(&mut inner, &[id])?;
        self.wrote(&mut inner);
        Ok(())
    }

    async fn put_task(&self, task: &TaskRecord) -> Result<()> {
        self.write_task(task, |_| true).await.map(|_| ())
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        Ok(self.lock().index.tasks.get(&id).cloned())
    }

    async fn update_task(&self, task: &TaskRecord) -> Result<bool> {
        let follows = |stored: Option<&TaskRecord>| {
            stored.is_some_and(|s| Some(s.version) == task.version.checked_sub(1))
        };
        self.write_task(task, follows).await
    }

    async fn delete_task(&self, id: TaskId) -> Result<()> {
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            let Some(task) = inner.index.tasks.get(&id) else {
                return Ok(());
            };
            let legs: Vec<StreamId> = task
                .legs
                .iter()
                .copied()
                .filter(|leg| inner.index.streams.contains_key(leg))
                .collect();
            for leg in &legs {
                record::stream_gone(&mut inner.buf, *leg);
            }
            // After its legs' tombstones, in the same write: a torn write can
            // keep the task and lose tombstones (the next sweep deletes it
            // again), never keep legs whose task is gone — retention does
            // not delete legs, so nothing else would.
            record::task_gone(&mut inner.buf, id);
            self.write(inner)?;
            inner.index.remove_task(id);
            self.forget_streams(inner, &legs)?;
            self.wrote(inner);
        }
        self.durable().await
    }

    async fn tasks_expired_by(&self, now_ms: u64) -> Result<Vec<TaskId>> {
        Ok(self.lock().index.tasks_expired_by(now_ms))
    }

    fn size_on_disk(&self) -> u64 {
        let inner = self.lock();
        inner
            .files
            .values()
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    async fn orphans(&self) -> Result<Vec<StreamMeta>> {
        // Only the live ones are copied: at start the index may hold
        // hundreds of thousands of finished streams retention keeps.
        let live = async {
            Ok(self
                .lock()
                .index
                .streams
                .values()
                .filter(|s| s.meta.status.is_live())
                .map(StreamState::visible)
                .collect())
        };
        self.orphans.take(live).await
    }

    async fn flush(&self) -> Result<()> {
        tokio::task::spawn_blocking(self.active_sync())
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?
            .map_err(io)
    }

    async fn write(&self, stream: StreamId, messages: &[Bytes], along: Along<'_>) -> Result<Seq> {
        self.append_inner(stream, messages, along).await
    }

    async fn read_after(&self, stream: StreamId, after: Seq, limit: usize) -> Result<Vec<Entry>> {
        let (locs, files) = {
            let inner = self.lock();
            let Some(state) = inner.index.streams.get(&stream) else {
                let Some(read) = inner.retired_read(&stream) else {
                    return Ok(Vec::new());
                };
                drop(inner);
                return read.entries(after, limit, &self.recent);
            };
            let durable = state.watermark.borrow().seq;
            if after >= durable {
                return Ok(Vec::new());
            }
            let end = durable.min(after.saturating_add(limit as Seq)) as usize;
            let locs = state.locs[after as usize..end].to_vec();
            // A read usually spans one segment, rarely two: a short list,
            // not a map, per read.
            let mut files: Vec<(SegmentNo, Arc<File>)> = Vec::new();
            for loc in &locs {
                if !files.iter().any(|(no, _)| *no == loc.segment) {
                    if let Some(f) = inner.files.get(&loc.segment) {
                        files.push((loc.segment, f.clone()));
                    }
                }
            }
            (locs, files)
        };
        // Outside the lock: a read of a deleted segment still works on the
        // open file, and writers never wait for readers' I/O.
        let file_of = |segment| {
            files
                .iter()
                .find(|(no, _)| *no == segment)
                .map(|(_, f)| f.clone())
        };
        read_locs(file_of, after + 1, &locs)
    }

    async fn subscribe(&self, stream: StreamId) -> Subscription {
        match self.watermark(stream) {
            Ok(whole) => whole.subscribe(),
            // Nothing will move: a closed channel saying where it ended.
            Err(ended) => watch::Sender::new(ended).subscribe(),
        }
    }

    fn peek(&self, stream: StreamId) -> Option<Watermark> {
        Some(match self.watermark(stream) {
            Ok(whole) => *whole.borrow(),
            Err(ended) => ended,
        })
    }

    fn set_retained_bound(&self, max: usize) {
        self.bound.set(max);
    }

    fn released_early(&self) -> u64 {
        self.bound.released()
    }

    fn retained_count(&self) -> Option<usize> {
        Some(self.lock().index.retired.len())
    }

    fn observe_flushes(&self, observer: FlushObserver) {
        self.commit.observe(observer);
    }

    fn flush_failed(&self) -> bool {
        self.commit.failed()
    }
}

#[cfg(test)]
mod tests;
