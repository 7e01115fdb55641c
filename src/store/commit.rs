//! Group commit: many concurrent writers share one flush.
//!
//! A writer that needs its inserts durable takes a ticket *after* inserting and
//! waits until a flush that started after its ticket has completed. At most
//! one flush runs at a time; every writer that arrived while it ran is covered
//! by the next one. Under load this turns N fsyncs into about one per flush
//! duration, while a lone writer pays exactly one flush.
//!
//! Under load the syncer *lingers* before a flush: when writers have been
//! arriving more often than once per two flushes (both smoothed), it waits
//! up to one flush's time (at most [`MAX_LINGER`]) for more of them, so a
//! flush covers more calls; when they crowd in, several per flush's time,
//! it waits up to [`CROWDED_LINGER`]. Either wait ends early once no writer
//! came between two looks [`QUIET`] apart: then everyone a flush could
//! gather is already waiting on it. A lone writer never waits: one call at a time arrives far
//! more slowly than that. What a writer is promised does not change: its
//! flush starts after its ticket.
//!
//! This module owns only the scheduling; what "flush" means is the backend's.
//! It times each flush for whoever asked ([`FlushObserver`]: the metrics),
//! without knowing who that is.

use std::sync::{Arc, Condvar, Mutex, OnceLock};
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
    /// The syncer waits on `work` for a ticket: only then does a writer
    /// wake it. (A condvar's notify is a system call even with nobody
    /// waiting, and under load the syncer is lingering or flushing when
    /// most tickets come: that was a `futex` per call.)
    parked: bool,
}

/// The longest a flush waits for more writers when they come a few per
/// flush.
pub const MAX_LINGER: Duration = Duration::from_micros(400);

/// Writers per flush's time from which the log counts as crowded.
const CROWD: u32 = 4;

/// The longest a flush waits for more writers when the log is crowded (a
/// thousand streams relaying progress, 32 clients calling at once). Each
/// flush rewrites the tail page of the segment and costs an `fdatasync`
/// whatever it covers, so under a crowd fewer, fuller flushes win: in the
/// `streaming` bench, 800 µs instead of one flush's time took a third less
/// disk and a fifth less CPU per message, and `small` at c=32 lost no p50
/// (BENCHMARKS.md, session 11). Longer (1.5 ms) began to cost c=32 latency.
pub const CROWDED_LINGER: Duration = Duration::from_micros(800);

/// How far apart a lingering syncer looks whether writers still come; it
/// stops at the first look that finds none came since the last (so after
/// one to two of these without a writer). Writers that
/// wait for their answer before writing again (32 clients, each calling
/// once its last call is answered) are then all parked on the coming
/// flush, and lingering on only leaves the cores idle: in `small` at c=32
/// a fixed 800 µs linger cost a fifth of the throughput (BENCHMARKS.md,
/// session 13). A crowd that keeps writing (a thousand streams relaying
/// progress) is never quiet this long and still gets the whole linger.
pub const QUIET: Duration = Duration::from_micros(100);

/// While the syncer lingers: when to look again whether writers still come,
/// and when to stop waiting for them.
struct Company {
    until: Instant,
    seen: u64,
}

impl Company {
    fn new(now: Instant, linger: Duration, issued: u64) -> Self {
        Self {
            until: now + linger,
            seen: issued,
        }
    }

    /// How long to sleep before looking again, given the tickets issued by
    /// `now`; `None` when the linger is over (time is up, or nobody came
    /// since the last look).
    fn next(&mut self, now: Instant, issued: u64) -> Option<Duration> {
        let came = issued != std::mem::replace(&mut self.seen, issued);
        let left = self.until.saturating_duration_since(now);
        (came && !left.is_zero()).then(|| QUIET.min(left))
    }
}

/// An exponentially smoothed duration (weight 1/4 for each new sample).
#[derive(Clone, Copy, Default)]
struct Smoothed(Option<Duration>);

impl Smoothed {
    fn add(&mut self, sample: Duration) {
        self.0 = Some(match self.0 {
            Some(old) => (old * 3 + sample) / 4,
            None => sample,
        });
    }
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

    /// The longest the next flush waits for more writers: [`CROWDED_LINGER`]
    /// when they have been coming more than [`CROWD`] per flush's time; one
    /// flush's time when more often than once per two flushes; else not at
    /// all.
    fn linger(&self, flush: Smoothed) -> Duration {
        match (self.gap.0, flush.0) {
            (Some(gap), Some(flush)) if gap * CROWD < flush => CROWDED_LINGER,
            (Some(gap), Some(flush)) if gap < flush * 2 => flush.min(MAX_LINGER),
            _ => Duration::ZERO,
        }
    }
}

/// The outcome of finished flushes: every ticket up to `attempted` has seen a
/// flush finish, and every ticket up to `covered` is durable.
#[derive(Clone, Copy, Default)]
struct Done {
    attempted: u64,
    covered: u64,
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
        match self.mode {
            SyncMode::Never => Ok(()),
            SyncMode::Always => {
                let shared = self.shared.clone();
                tokio::task::spawn_blocking(move || shared.timed_flush())
                    .await
                    .map_err(std::io::Error::other)?
            }
            SyncMode::Batch => self.batched().await,
        }
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

    /// Reports every later flush's duration to `observer`. A second
    /// observer is ignored: one process, one set of metrics.
    pub fn observe(&self, observer: FlushObserver) {
        let _ = self.shared.observer.set(observer);
    }

    async fn batched(&self) -> std::io::Result<()> {
        self.shared.batched().await
    }
}

/// See [`GroupCommit::later`].
pub struct Later {
    mode: SyncMode,
    shared: Arc<Shared>,
}

impl Later {
    pub async fn durable(self) -> std::io::Result<()> {
        match self.mode {
            SyncMode::Never => Ok(()),
            SyncMode::Always => tokio::task::spawn_blocking(move || self.shared.timed_flush())
                .await
                .map_err(std::io::Error::other)?,
            SyncMode::Batch => self.shared.batched().await,
        }
    }
}

impl Shared {
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
            // Woken once: the writers after this one find it awake. Woken
            // under the lock, so that a writer descheduled in between
            // cannot leave the others waiting on a syncer nobody woke.
            if std::mem::take(&mut q.parked) {
                self.work.notify_one();
            }
            q.issue()
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
    }
}

fn lock(m: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn timed_flush(&self) -> std::io::Result<()> {
        let started = Instant::now();
        let result = (self.flush)();
        if let Some(observe) = self.observer.get() {
            observe(started.elapsed());
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
        let mut flushed = 0;
        let mut took = Smoothed::default();
        loop {
            let linger = {
                let mut q = lock(&self.queue);
                while q.issued == flushed && !q.stop {
                    q.parked = true;
                    q = self.work.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                q.parked = false;
                if q.issued == flushed {
                    return;
                }
                q.linger(took)
            };
            if !linger.is_zero() {
                self.linger(linger);
            }
            let target = lock(&self.queue).issued;
            let started = Instant::now();
            let result = self.timed_flush();
            took.add(started.elapsed());
            if let Err(e) = &result {
                tracing::error!(error = %e, "log flush failed");
            }
            self.done.send_modify(|d| {
                d.attempted = target;
                if result.is_ok() {
                    d.covered = target;
                }
            });
            flushed = target;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[tokio::test]
    async fn concurrent_writers_share_flushes() {
        let (commit, flushes) = counting_commit(Duration::from_millis(5));
        let writers: Vec<_> = (0..50)
            .map(|_| {
                let c = commit.clone();
                tokio::spawn(async move { c.durable().await })
            })
            .collect();
        for w in writers {
            w.await.unwrap().unwrap();
        }
        let n = flushes.load(Ordering::SeqCst);
        assert!((1..50).contains(&n), "{n} flushes for 50 writers");
    }

    #[tokio::test]
    async fn a_later_wait_flushes_from_a_task_of_its_own() {
        let (commit, flushes) = counting_commit(Duration::ZERO);
        let later = commit.later();
        tokio::spawn(later.durable()).await.unwrap().unwrap();
        assert!(flushes.load(Ordering::SeqCst) >= 1);
    }

    fn counting_commit(flush_time: Duration) -> (Arc<GroupCommit>, Arc<AtomicU64>) {
        let flushes = Arc::new(AtomicU64::new(0));
        let counter = flushes.clone();
        let commit = GroupCommit::new(
            SyncMode::Batch,
            Arc::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(flush_time);
                Ok(())
            }),
        );
        (Arc::new(commit), flushes)
    }

    /// Bounds a hang (a writer nobody wakes the syncer for); asserts no time.
    async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("a writer was never flushed")
    }

    #[tokio::test]
    async fn a_writer_coming_after_the_syncer_went_idle_wakes_it() {
        let (commit, flushes) = counting_commit(Duration::ZERO);
        for _ in 0..5 {
            bounded(commit.durable()).await.unwrap();
            // Long enough for the syncer to park again between writers.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(flushes.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn writers_coming_during_a_flush_share_the_next_one() {
        let (commit, flushes) = counting_commit(Duration::from_millis(200));
        let first = tokio::spawn({
            let c = commit.clone();
            async move { c.durable().await }
        });
        while flushes.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The first flush is running: these find the syncer awake.
        let later: Vec<_> = (0..3)
            .map(|_| {
                let c = commit.clone();
                tokio::spawn(async move { c.durable().await })
            })
            .collect();
        bounded(first).await.unwrap().unwrap();
        for w in later {
            bounded(w).await.unwrap().unwrap();
        }
        assert_eq!(flushes.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_wait_that_outlives_its_store_fails_instead_of_hanging() {
        let (commit, _) = counting_commit(Duration::ZERO);
        let later = commit.later();
        drop(Arc::into_inner(commit));
        let outcome = bounded(later.durable()).await;
        assert!(outcome.is_err());
    }

    fn queue_with_gap(gap: Duration) -> Queue {
        let mut q = Queue::default();
        q.gap.add(gap);
        q
    }

    fn flushes_taking(took: Duration) -> Smoothed {
        let mut s = Smoothed::default();
        s.add(took);
        s
    }

    #[test]
    fn writers_coming_faster_than_two_flushes_make_it_linger_up_to_one_flush() {
        let q = queue_with_gap(Duration::from_micros(50));
        let linger = q.linger(flushes_taking(Duration::from_micros(150)));
        assert_eq!(linger, Duration::from_micros(150));
        let slow_disk = queue_with_gap(Duration::from_micros(200));
        let linger = slow_disk.linger(flushes_taking(Duration::from_micros(700)));
        assert_eq!(linger, MAX_LINGER);
    }

    #[test]
    fn a_crowd_of_writers_makes_it_linger_the_crowded_time() {
        let q = queue_with_gap(Duration::from_micros(20));
        let linger = q.linger(flushes_taking(Duration::from_micros(150)));
        assert_eq!(linger, CROWDED_LINGER);
        let slow_disk = q.linger(flushes_taking(Duration::from_millis(5)));
        assert_eq!(slow_disk, CROWDED_LINGER);
    }

    #[test]
    fn a_writer_alone_never_waits_for_company() {
        let q = queue_with_gap(Duration::from_micros(500));
        assert_eq!(
            q.linger(flushes_taking(Duration::from_micros(150))),
            Duration::ZERO
        );
        // Nothing known yet: no wait either.
        assert_eq!(Queue::default().linger(Smoothed::default()), Duration::ZERO);
    }

    #[test]
    fn a_linger_goes_on_while_writers_keep_coming() {
        let start = Instant::now();
        let mut company = Company::new(start, CROWDED_LINGER, 5);
        let looked = start + QUIET;
        assert_eq!(company.next(looked, 9), Some(QUIET));
        assert_eq!(company.next(looked + QUIET, 10), Some(QUIET));
    }

    #[test]
    fn a_linger_ends_once_nobody_came_since_the_last_look() {
        let start = Instant::now();
        let mut company = Company::new(start, CROWDED_LINGER, 5);
        assert_eq!(company.next(start + QUIET, 9), Some(QUIET));
        assert_eq!(company.next(start + QUIET * 2, 9), None);
    }

    #[test]
    fn a_linger_never_outlasts_its_time() {
        let start = Instant::now();
        let linger = QUIET * 3 / 2;
        let mut company = Company::new(start, linger, 0);
        assert_eq!(company.next(start + QUIET, 1), Some(linger - QUIET));
        assert_eq!(company.next(start + linger, 2), None);
    }

    #[tokio::test]
    async fn every_flush_is_timed_for_the_observer() {
        let commit = GroupCommit::new(SyncMode::Always, Arc::new(|| Ok(())));
        let seen = Arc::new(AtomicU64::new(0));
        let counter = seen.clone();
        commit.observe(Arc::new(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        commit.durable().await.unwrap();
        commit.durable().await.unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn never_mode_does_not_flush() {
        let commit = GroupCommit::new(SyncMode::Never, Arc::new(|| panic!("flushed")));
        commit.durable().await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_flush_is_reported_to_its_writers() {
        let commit = GroupCommit::new(
            SyncMode::Batch,
            Arc::new(|| Err(std::io::Error::other("disk full"))),
        );
        assert!(commit.durable().await.is_err());
    }
}
