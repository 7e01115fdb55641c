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
//! from the first segment without one. A finished stream does not stay whole
//! in memory: once its finish is durable it retires (`retire.rs`) to a
//! summary record on disk (`summary.rs`) and a small entry in the retired
//! tier (`retired/`: a layer of recent changes over sorted tables that a
//! checkpoint writes as they are and start-up uses in place), so that
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
//! This module owns the journal's state, its lock and its opening. A change
//! reaches the log through `writing.rs` (the write and what follows it under
//! the same lock), a stream's entries through `entries.rs` (which must not
//! move a watermark before the entries below it are durable), and the
//! [`Store`](super::Store) contract is the composition of both in
//! `store.rs`; `bound.rs` holds `max_retained_streams`.

mod bound;
mod checkpoint;
mod codes;
mod compact;
mod cursor;
mod entries;
mod holdings;
mod index;
pub mod inspect;
mod recent;
mod record;
mod recover;
mod retire;
mod retired;
mod segment;
mod store;
mod summary;
mod writing;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use self::index::Index;
use self::segment::{SegmentNo, Writer};
use super::commit::{GroupCommit, SyncMode};
use super::{OrphansOnce, Result, StoreError};

/// Size at which the active segment is sealed and a new one started.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Entries of one batch are split into records of at most this many bytes.
const RECORD_TARGET: usize = 16 * 1024 * 1024;

/// Log written since the last checkpoint before the next is taken, at the
/// least; more once checkpoints are large (twice the last one's size), so
/// that checkpoints never write more than half what the log does. Start-up
/// replays at most this much of the log beyond the checkpoint.
const CHECKPOINT_EVERY: u64 = 16 * 1024 * 1024;

/// A log that wrote nothing for this long gets a checkpoint, if enough was
/// written since the last one ([`quiet_checkpoint_bytes`]): a crash after
/// a quiet moment then replays (next to) nothing at the next start, where
/// the size rule alone could leave [`CHECKPOINT_EVERY`] or more to replay.
const QUIET_AFTER: Duration = Duration::from_secs(1);

/// Log written since the last checkpoint that makes a quiet log take one:
/// an eighth of the last checkpoint's size (at least 256 KiB), so that a
/// trickle of calls writes checkpoints at most eight times as fast as it
/// writes the log, and a large tier is not rewritten for a few calls.
fn quiet_checkpoint_bytes(last_checkpoint: u64) -> u64 {
    (last_checkpoint / 8).max(256 * 1024)
}

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

/// A frozen tier a checkpoint merged, and the checkpoint's size (0: it was
/// not written).
type Merged = (Arc<retired::Frozen>, u64);

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
    bound: bound::Bound,
    /// Set while a checkpoint is being merged and published (one at a
    /// time).
    checkpointing: Arc<AtomicBool>,
    /// The frozen tier the last checkpoint merged, and the checkpoint's
    /// size (0: not written), until the writer installs it.
    merged: Arc<Mutex<Option<Merged>>>,
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
            checkpoint_us = recovered.checkpoint_us,
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
                checkpoint_bytes: recovered.checkpoint_bytes,
            }),
            active,
            commit,
            segment_bytes,
            _lock: dir_lock,
            orphans: OrphansOnce::default(),
            sync_file,
            bound: bound::Bound::default(),
            checkpointing: Arc::default(),
            merged: Arc::default(),
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
        spawn_quiet_checkpoints(Arc::downgrade(&journal));
        let stopped = Arc::downgrade(&journal);
        journal.commit.when_stopped(move || {
            if let Some(journal) = stopped.upgrade() {
                journal.wake_every_reader();
            }
        });
        Ok(journal)
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
}

#[cfg(test)]
impl Journal {
    /// Takes a checkpoint now, published before this returns.
    fn checkpoint_now(&self) {
        let mut inner = self.lock();
        if let Some(publish) = self.checkpoint(&mut inner) {
            publish();
            self.install_merged(&mut inner);
        }
    }

    /// From now on, a checkpoint after every change.
    fn checkpoint_eagerly(&self) {
        self.eager_checkpoints
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn checkpoint_every(&self, bytes: u64) {
        self.checkpoint_every
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
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

/// Looks at the log every [`QUIET_AFTER`], and checkpoints it when it
/// wrote nothing since the last look ([`Journal::checkpoint_if_quiet`]).
/// Stops when the journal is dropped.
fn spawn_quiet_checkpoints(journal: Weak<Journal>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        let mut tick = tokio::time::interval(QUIET_AFTER);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_seen = None;
        loop {
            tick.tick().await;
            let Some(journal) = journal.upgrade() else {
                return;
            };
            let Some(publish) = journal.checkpoint_if_quiet(&mut last_seen) else {
                continue;
            };
            drop(journal);
            // The merge and the write are long: off the runtime's threads,
            // as a checkpoint the size rule takes runs on a thread of its own.
            if let Err(e) = tokio::task::spawn_blocking(publish).await {
                tracing::warn!(error = %e, "journal checkpoint did not run");
            }
        }
    });
}

#[cfg(test)]
mod tests;
