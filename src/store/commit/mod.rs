//! Group commit: many concurrent writers share one flush.
//!
//! A writer that needs its inserts durable takes a ticket *after* inserting and
//! waits until a flush that started after its ticket has completed. One
//! flush runs at a time, on the syncer thread; every writer that arrived
//! while it ran is covered by the next one. Under load this turns N fsyncs
//! into about one per flush duration, while a lone writer pays exactly one
//! flush. Under load the syncer lingers for company before a flush
//! (`linger.rs`); a lone writer may instead run its flush on its own
//! thread, saving the two wake-ups of a hand-over (`here.rs`). What a
//! writer is promised does not change either way: its flush starts after
//! its ticket.
//!
//! A failed flush stops the log for good (fail-stop): its writers are told,
//! and so is every writer after it, without another flush. After a failed
//! `fdatasync` the kernel may have marked the unwritten pages clean, so a
//! later flush would "succeed" without writing them, and the writers it
//! covers would be told entries are durable that a power loss takes. Only
//! a restart, which recovers from what the disk holds, starts anew.
//!
//! This module owns only the scheduling; what "flush" means is the backend's.
//! It times each flush for whoever asked ([`FlushObserver`]: the metrics),
//! without knowing who that is.

mod here;
mod linger;

pub use linger::{CROWDED_LINGER, MAX_LINGER, QUIET};

use linger::{Company, Smoothed};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::watch;

/// How hard `append` works before returning (`[store] sync`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Flush (fsync) once per append: the slowest, simplest guarantee.
    Always,
    /// Group commit: appends wait for a shared flush. Survives kill -9 and,
    /// as far as the disk honours fsync, power loss.
    #[default]
    Batch,
    /// Return at once; the backend flushes in the background. Entries of the
    /// last flush interval can be lost on kill -9.
    Never,
}

type FlushFn = dyn Fn() -> std::io::Result<()> + Send + Sync;

/// Told how long each flush took, failed ones included (a slow failing disk
/// is what an operator most needs to see).
pub type FlushObserver = Arc<dyn Fn(Duration) + Send + Sync>;

#[derive(Default)]
struct Queue {
    /// Tickets handed out so far.
    issued: u64,
    /// The owner is gone: the syncer thread exits.
    stop: bool,
    /// When the last ticket was handed out.
    last_issued: Option<Instant>,
    /// The time between tickets, smoothed.
    gap: Smoothed,
    /// The time a flush takes, smoothed.
    took: Smoothed,
    /// The last ticket a flush has started for: every ticket up to it is
    /// covered by a flush that runs or ran.
    started: u64,
    /// The syncer waits on `work` for a ticket: only then does a writer
    /// wake it. (A condvar's notify is a system call even with nobody
    /// waiting, and under load the syncer is lingering or flushing when
    /// most tickets come: that was a `futex` per call.)
    parked: bool,
    /// A writer is flushing on its own thread (see [`here`]).
    flushing_here: bool,
    /// The syncer waits on `work` for that flush to end: one flush at a
    /// time, so that a failure is always reported to the writers it fails
    /// (two `fdatasync`s of one file at once can see one write-back error
    /// reported to one of them only).
    behind_here: bool,
}

impl Queue {
    fn issue(&mut self) -> u64 {
        let now = Instant::now();
        if let Some(last) = self.last_issued.replace(now) {
            self.gap.add(now - last);
        }
        self.issued += 1;
        self.issued
    }

    /// Whether the writer holding `ticket`, just issued, may flush on its
    /// own thread: the syncer is parked (it neither flushes nor lingers),
    /// no flush is owed to an earlier ticket or runs on a writer's thread
    /// already, writers come one at a time, and the disk has been quick
    /// (see [`here`]).
    fn may_flush_here(&self, ticket: u64) -> bool {
        self.parked
            && self.started + 1 == ticket
            && !self.flushing_here
            && linger::alone(self.gap, self.took)
            && self.took.0.is_some_and(|took| took <= here::QUICK)
    }

    /// Starts a flush for every ticket issued so far; returns the last.
    fn start_flush(&mut self) -> u64 {
        self.started = self.issued;
        self.issued
    }
}

/// The outcome of finished flushes: every ticket up to `attempted` has seen a
/// flush finish, and every ticket up to `covered` is durable.
#[derive(Clone, Copy, Default)]
struct Done {
    attempted: u64,
    covered: u64,
    /// A flush failed: `covered` never moves again.
    failed: bool,
}

impl Done {
    /// Counts a flush for every ticket up to `target` as finished. Flushes
    /// run one at a time, but a writer's own flush is counted after it lets
    /// the syncer start the next one, which may be counted first: neither
    /// mark ever moves back. (A success covers every ticket before its own,
    /// whose inserts preceded the flush; a failure fails the tickets its
    /// flush was for that no finished flush covers.) After a failure
    /// nothing is covered any more: a success counted late may then fail
    /// writers whose entries did reach the disk, which errs on the safe
    /// side.
    fn finish(&mut self, target: u64, ok: bool) {
        self.attempted = self.attempted.max(target);
        self.failed |= !ok;
        if ok && !self.failed {
            self.covered = self.covered.max(target);
        }
    }
}

/// What the syncer thread and the writers share.
struct Shared {
    flush: Arc<FlushFn>,
    /// Set once, after the store is opened: the log that owns the metrics
    /// is built around an already open store.
    observer: OnceLock<FlushObserver>,
    queue: Mutex<Queue>,
    /// Wakes the syncer when a ticket is issued.
    work: Condvar,
    done: watch::Sender<Done>,
    /// Held by every flush of the log's files, the group commit's and the
    /// backend's own ([`GroupCommit::flush_with`]): see
    /// [`Shared::one_flush`].
    one: Mutex<()>,
    /// A flush failed: no flush runs again (see the module docs). Set as
    /// the failed flush returns, before the next one may start (flushes
    /// run one at a time, and each starts after the last one's end).
    failed: AtomicBool,
    /// Turns true with `failed`, for those who wait on it
    /// ([`GroupCommit::when_stopped`]).
    stopped: watch::Sender<bool>,
    /// The error of the flush that failed, set with `failed`, for
    /// [`GroupCommit::health`].
    failure: OnceLock<String>,
}

pub struct GroupCommit {
    mode: SyncMode,
    shared: Arc<Shared>,
    /// Joined on drop: the flush closure may own the backend's files (sled
    /// keeps its lock until the last handle goes), so a store that was
    /// dropped must be closed for good before the call returns.
    syncer: Option<std::thread::JoinHandle<()>>,
}

impl GroupCommit {
    /// In `batch` mode, starts the syncer: one thread per log that flushes
    /// for as long as tickets wait. A thread of its own rather than a task
    /// per flush: under load it flushes back to back, and each flush then
    /// costs one wake-up of the waiting writers instead of a round trip
    /// through the blocking pool as well.
    pub fn new(mode: SyncMode, flush: Arc<FlushFn>) -> Self {
        let shared = Arc::new(Shared {
            flush,
            observer: OnceLock::new(),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            done: watch::Sender::new(Done::default()),
            one: Mutex::new(()),
            failed: AtomicBool::new(false),
            stopped: watch::Sender::new(false),
            failure: OnceLock::new(),
        });
        let mut syncer = None;
        if mode == SyncMode::Batch {
            let state = shared.clone();
            match std::thread::Builder::new()
                .name("log-sync".into())
                .spawn(move || state.run())
            {
                Ok(handle) => syncer = Some(handle),
                // Writers then wait for a flush that never comes and fail
                // with "group commit stopped" once the sender is gone.
                Err(e) => tracing::error!(error = %e, "cannot start the log syncer thread"),
            }
        }
        Self {
            mode,
            shared,
            syncer,
        }
    }

    /// Returns once everything inserted before the call is durable per the
    /// mode.
    pub async fn durable(&self) -> std::io::Result<()> {
        self.shared.durable(self.mode).await
    }

    /// A handle that waits as [`GroupCommit::durable`] does, for a task
    /// that outlives the writer's borrow (it takes its ticket when it
    /// waits, so it covers what was written before then).
    pub fn later(&self) -> Later {
        Later {
            mode: self.mode,
            shared: self.shared.clone(),
        }
    }

    /// Runs `flush`, a sync of the log's files the backend makes outside
    /// the group commit (a rollover's seal, a copy forward, a deletion's
    /// tombstones), as one of its flushes: never beside another, refused
    /// once one failed, and stopping the log if it fails. A sync that
    /// consumed a write-back error unseen would let the next flush report
    /// success over lost pages.
    pub fn flush_with(&self, flush: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
        self.shared.one_flush(flush)
    }

    /// A handle that runs flushes as [`GroupCommit::flush_with`] does, for
    /// a blocking task.
    pub fn flusher(&self) -> Flusher {
        Flusher(self.shared.clone())
    }

    /// Runs `then` once, in a task of its own, if a flush fails: a backend
    /// wakes its streams' readers with it, so that they end instead of
    /// waiting for entries that will never come. A task, holding no lock
    /// when the failure comes (the flush that failed may run under the
    /// backend's lock). Nothing runs if the log closes first, or outside a
    /// runtime.
    pub fn when_stopped(&self, then: impl FnOnce() + Send + 'static) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut stopped = self.shared.stopped.subscribe();
        handle.spawn(async move {
            // An error: the group commit is gone, and its log with it.
            if stopped.wait_for(|stopped| *stopped).await.is_ok() {
                then();
            }
        });
    }

    /// Whether a flush failed: the log takes no more writes (see the module
    /// docs).
    pub fn failed(&self) -> bool {
        self.shared.failed()
    }

    /// Whether the log takes writes, as `/readyz` says it: `Err` with the
    /// failed flush's error once one failed.
    pub fn health(&self) -> Result<(), String> {
        if !self.failed() {
            return Ok(());
        }
        let why = self
            .shared
            .failure
            .get()
            .map_or("a flush failed", String::as_str);
        Err(format!("log not writable: {why}"))
    }

    /// Refuses a write once a flush failed: a record written after the
    /// pages a failed flush lost could reach the disk without them. Every
    /// backend's write path asks here first.
    pub fn writable(&self) -> Result<(), Stopped> {
        if self.failed() {
            return Err(Stopped);
        }
        Ok(())
    }

    /// Reports every later flush's duration to `observer`. A second
    /// observer is ignored: one process, one set of metrics.
    pub fn observe(&self, observer: FlushObserver) {
        let _ = self.shared.observer.set(observer);
    }
}

/// Marks a flush on a writer's thread as over when dropped, a panicking
/// flush included: the syncer may be waiting for it.
struct FlushingHere<'a>(&'a Shared);

impl Drop for FlushingHere<'_> {
    fn drop(&mut self) {
        let mut q = lock(&self.0.queue);
        q.flushing_here = false;
        if std::mem::take(&mut q.behind_here) {
            self.0.work.notify_one();
        }
    }
}

/// A write refused because a flush failed (see [`GroupCommit::writable`]).
#[derive(Debug)]
pub struct Stopped;

/// See [`GroupCommit::flusher`].
pub struct Flusher(Arc<Shared>);

impl Flusher {
    pub fn flush_with(&self, flush: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
        self.0.one_flush(flush)
    }
}

/// See [`GroupCommit::later`].
pub struct Later {
    mode: SyncMode,
    shared: Arc<Shared>,
}

impl Later {
    pub async fn durable(self) -> std::io::Result<()> {
        self.shared.durable(self.mode).await
    }
}

impl Shared {
    /// Returns once everything inserted before the call is durable per
    /// `mode` (for [`GroupCommit`] and [`Later`] alike).
    async fn durable(self: &Arc<Self>, mode: SyncMode) -> std::io::Result<()> {
        match mode {
            SyncMode::Never => Ok(()),
            SyncMode::Always => {
                let shared = self.clone();
                tokio::task::spawn_blocking(move || shared.timed_flush())
                    .await
                    .map_err(std::io::Error::other)?
            }
            SyncMode::Batch => self.batched().await,
        }
    }

    /// Takes a ticket and waits for a flush that covers it. Subscribed
    /// before the ticket is taken, so that no flush between the two is
    /// missed.
    async fn batched(&self) -> std::io::Result<()> {
        let mut done = self.done.subscribe();
        let ticket = {
            let mut q = lock(&self.queue);
            if q.stop {
                // The syncer is gone (the store was closed): nobody would
                // ever flush this ticket.
                return Err(std::io::Error::other("group commit stopped"));
            }
            if self.failed() {
                return Err(failed_earlier());
            }
            let ticket = q.issue();
            if q.may_flush_here(ticket) && here::alone_here() {
                q.flushing_here = true;
                let target = q.start_flush();
                drop(q);
                return self.flush_here(target);
            }
            // Woken once: the writers after this one find it awake. Woken
            // under the lock, so that a writer descheduled in between
            // cannot leave the others waiting on a syncer nobody woke.
            if std::mem::take(&mut q.parked) {
                self.work.notify_one();
            }
            ticket
        };
        let outcome = *done
            .wait_for(|d| d.attempted >= ticket)
            .await
            .map_err(|_| std::io::Error::other("group commit stopped"))?;
        if outcome.covered >= ticket {
            Ok(())
        } else {
            Err(std::io::Error::other("flush failed"))
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        lock(&self.shared.queue).stop = true;
        self.shared.work.notify_one();
        if let Some(syncer) = self.syncer.take() {
            let _ = syncer.join();
        }
        // A flush on a writer's thread (a `Later` outliving the store) may
        // still run: the store's files are not closed for good before it
        // ends. No new one starts: writers find `stop`.
        drop(self.shared.after_flush_here(lock(&self.shared.queue)));
    }
}

/// What a writer is told once the log has stopped (see the module docs).
fn failed_earlier() -> std::io::Error {
    std::io::Error::other(
        "an earlier log flush failed: the log takes no more writes until the proxy restarts",
    )
}

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Runs one flush of the log's files, never beside another: when two
    /// `fdatasync`s of one file overlap, Linux reports a write-back error
    /// to one of them only, and the other's writers would be told their
    /// entries are durable when they may not be. (The syncer and a
    /// writer's thread already take turns; `always` writers and the
    /// backend's own syncs wait here.) A failure stops every later flush
    /// (see [`Shared::failed`]).
    fn one_flush(&self, flush: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
        let _one = self.one.lock().unwrap_or_else(|p| p.into_inner());
        if self.failed() {
            return Err(failed_earlier());
        }
        let result = flush();
        if let Err(e) = &result {
            let _ = self.failure.set(e.to_string());
            self.failed.store(true, Ordering::SeqCst);
            self.stopped.send_replace(true);
            tracing::error!(
                error = %e,
                "log flush failed: the log takes no more writes until the proxy restarts"
            );
        }
        result
    }

    /// Flushes, timed for the observer and for the queue's smoothed flush
    /// time; refused, untimed, once a flush failed.
    fn timed_flush(&self) -> std::io::Result<()> {
        if self.failed() {
            return Err(failed_earlier());
        }
        let started = Instant::now();
        let result = self.one_flush(|| (self.flush)());
        let took = started.elapsed();
        lock(&self.queue).took.add(took);
        if let Some(observe) = self.observer.get() {
            observe(took);
        }
        result
    }

    /// Waits up to `most` for more writers, for as long as they keep
    /// coming (see [`QUIET`]).
    fn linger(&self, most: Duration) {
        let issued = || lock(&self.queue).issued;
        let mut company = Company::new(Instant::now(), most, issued());
        // The first look is one QUIET away: the writer that woke the syncer
        // is the one that counts as having just come.
        let mut nap = Some(QUIET.min(most));
        while let Some(d) = nap {
            std::thread::sleep(d);
            nap = company.next(Instant::now(), issued());
        }
    }

    /// The syncer: waits for tickets, lingers under load, flushes once for
    /// all of them, reports.
    fn run(&self) {
        // Sleep as long as asked: the default slack (50 µs) would stretch
        // each QUIET look by half. This thread only sleeps to linger.
        // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only
        // the calling thread.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
        loop {
            let linger = {
                let mut q = lock(&self.queue);
                while q.issued == q.started && !q.stop {
                    q.parked = true;
                    q = self.work.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                q.parked = false;
                if q.issued == q.started {
                    return;
                }
                linger::linger(q.gap, q.took)
            };
            if !linger.is_zero() {
                self.linger(linger);
            }
            let target = self.after_flush_here(lock(&self.queue)).start_flush();
            let result = self.timed_flush();
            self.done.send_modify(|d| d.finish(target, result.is_ok()));
        }
    }

    /// Waits, with the queue's lock `q`, until no flush runs on a writer's
    /// thread (its guard wakes this thread, the only other one waiting on
    /// `work`).
    fn after_flush_here<'a>(&self, mut q: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        while q.flushing_here {
            q.behind_here = true;
            q = self.work.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q.behind_here = false;
        q
    }

    /// A writer's flush on its own thread, for every ticket up to `target`
    /// (see [`here`]); the syncer stays parked, or, woken by a writer that
    /// came meanwhile, waits for it to end.
    fn flush_here(&self, target: u64) -> std::io::Result<()> {
        let result = {
            let _running = FlushingHere(self);
            self.timed_flush()
        };
        self.done.send_modify(|d| d.finish(target, result.is_ok()));
        result
    }
}

#[cfg(test)]
mod tests;
