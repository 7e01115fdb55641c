//! The group commit's behaviour, from writers' threads: shared flushes,
//! who flushes, one flush at a time, failures and shutdown.

use super::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[tokio::test]
async fn concurrent_writers_share_flushes() {
    let (commit, flushes) = counting_commit(Duration::from_millis(5));
    concurrent_writers(&commit, 50).await;
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

/// `n` writers waiting for durability at once, each a task of its own;
/// returns once all of them were told it is.
async fn concurrent_writers(commit: &Arc<GroupCommit>, n: usize) {
    let writers: Vec<_> = (0..n)
        .map(|_| {
            let c = commit.clone();
            tokio::spawn(async move { c.durable().await })
        })
        .collect();
    for w in writers {
        bounded(w).await.unwrap().unwrap();
    }
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

/// A commit whose flushes note the thread they ran on, each taking
/// `flush_time`; a flush on the thread named "held writer" also waits
/// (10 s at most) until `release` sends. Its disk counts as quick from
/// the start unless `flush_time` says otherwise, so that the first
/// write's choice of thread does not depend on how long this machine
/// took to flush: a test that needs the choice fixed writes once.
fn recording_commit(
    flush_time: Duration,
    release: std::sync::mpsc::Receiver<()>,
) -> (Arc<GroupCommit>, Arc<Mutex<Vec<std::thread::ThreadId>>>) {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let seen = threads.clone();
    let release = Mutex::new(release);
    let commit = GroupCommit::new(
        SyncMode::Batch,
        Arc::new(move || {
            let on = std::thread::current();
            seen.lock().unwrap().push(on.id());
            std::thread::sleep(flush_time);
            if on.name() == Some("held writer") {
                let _ = release
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(10));
            }
            Ok(())
        }),
    );
    (ready(commit, flush_time), threads)
}

/// `commit` once its syncer has parked, waiting for tickets (a writer
/// coming before then leaves its flush to the syncer), with its flushes
/// taking `flush_time` so far (100 µs at least: quick).
fn ready(commit: GroupCommit, flush_time: Duration) -> Arc<GroupCommit> {
    lock(&commit.shared.queue)
        .took
        .add(flush_time.max(Duration::from_micros(100)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lock(&commit.shared.queue).parked {
        assert!(Instant::now() < deadline, "the syncer never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
    Arc::new(commit)
}

/// Runs `work` on a thread named `name` whose scheduler (one thread's)
/// counts as a worker serving `clients`.
fn on_worker<T: Send + 'static>(
    name: &str,
    clients: usize,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            crate::workers::testing::serving_on_this_thread(Arc::new(
                std::sync::atomic::AtomicUsize::new(clients),
            ));
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(work)
        })
        .unwrap()
}

/// Runs `writes` durable waits, 10 ms apart (one call at a time), on a
/// thread whose scheduler serves `clients`; returns that thread's id.
fn writer_serving(
    clients: usize,
    commit: &Arc<GroupCommit>,
    writes: usize,
    name: &str,
) -> std::thread::JoinHandle<std::thread::ThreadId> {
    let commit = commit.clone();
    on_worker(name, clients, async move {
        for _ in 0..writes {
            bounded(commit.durable()).await.unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::current().id()
    })
}

/// Waits (10 s at most) until a flush began.
fn until_a_flush_began(threads: &Mutex<Vec<std::thread::ThreadId>>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while threads.lock().unwrap().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The threads the flushes of `writes` writes ran on, from a writer whose
/// worker serves `clients`, the disk taking `flush_time`; and the writer's.
fn flushes_of_one_writer(
    clients: usize,
    flush_time: Duration,
    writes: usize,
) -> (Vec<std::thread::ThreadId>, std::thread::ThreadId) {
    let (commit, threads) = recording_commit(flush_time, unheld());
    let writer = writer_serving(clients, &commit, writes, "writer")
        .join()
        .unwrap();
    let threads = threads.lock().unwrap().clone();
    (threads, writer)
}

fn unheld() -> std::sync::mpsc::Receiver<()> {
    std::sync::mpsc::channel().1
}

#[test]
fn a_lone_writer_whose_thread_serves_one_client_flushes_there() {
    let (threads, writer) = flushes_of_one_writer(1, Duration::ZERO, 1);
    assert_eq!(threads, [writer]);
}

#[test]
fn a_store_dropped_during_a_flush_on_a_writers_thread_waits_for_it() {
    let (release, held) = std::sync::mpsc::channel();
    let (commit, threads) = recording_commit(Duration::ZERO, held);
    // A wait that outlives its store's owner, as a `Later` does.
    let writer = on_worker("held writer", 1, commit.later().durable());
    until_a_flush_began(&threads);
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dropper = std::thread::spawn({
        let ended = ended.clone();
        move || {
            drop(Arc::into_inner(commit).expect("the only handle"));
            ended.store(true, Ordering::SeqCst);
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    let ended_while_held = ended.load(Ordering::SeqCst);
    release.send(()).unwrap();
    writer.join().unwrap().unwrap();
    dropper.join().unwrap();
    assert!(!ended_while_held, "the store closed under a running flush");
    assert!(ended.load(Ordering::SeqCst));
}

#[test]
fn a_writer_whose_thread_serves_several_clients_leaves_the_flush_to_the_syncer() {
    let (threads, writer) = flushes_of_one_writer(2, Duration::ZERO, 3);
    assert_eq!(threads.len(), 3);
    assert!(!threads.contains(&writer));
}

#[test]
fn a_slow_disk_leaves_even_a_lone_writers_flush_to_the_syncer() {
    let (threads, writer) = flushes_of_one_writer(1, here::QUICK * 2, 3);
    assert_eq!(threads.len(), 3);
    assert!(!threads.contains(&writer));
}

#[test]
fn a_writer_coming_during_a_flush_on_a_writers_thread_is_flushed_after_it() {
    let (release, held) = std::sync::mpsc::channel();
    let (commit, threads) = recording_commit(Duration::ZERO, held);
    let held = writer_serving(1, &commit, 1, "held writer");
    until_a_flush_began(&threads);
    // A writer on a worker serving others: it wakes the syncer, which
    // must not flush beside the held flush (one flush at a time).
    let busy = writer_serving(2, &commit, 1, "busy writer");
    std::thread::sleep(Duration::from_millis(50));
    let during = threads.lock().unwrap().len();
    release.send(()).unwrap();
    let (held, busy) = (held.join().unwrap(), busy.join().unwrap());
    let threads = threads.lock().unwrap();
    assert_eq!(during, 1, "a second flush ran beside the held one");
    assert_eq!(threads.len(), 2);
    assert_eq!(threads[0], held);
    assert_ne!(threads[1], busy);
}

#[test]
fn a_panicking_flush_on_a_writers_thread_does_not_stop_the_syncer() {
    let flushes = Arc::new(AtomicU64::new(0));
    let counter = flushes.clone();
    let commit = GroupCommit::new(
        SyncMode::Batch,
        Arc::new(move || {
            let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
            if first && std::thread::current().name() == Some("writer") {
                panic!("flush panicked");
            }
            Ok(())
        }),
    );
    let commit = ready(commit, Duration::ZERO);
    assert!(writer_serving(1, &commit, 1, "writer").join().is_err());
    let writer = writer_serving(2, &commit, 1, "busy writer");
    assert!(writer.join().is_ok(), "the syncer never flushed again");
    assert_eq!(flushes.load(Ordering::SeqCst), 2);
}

#[test]
fn flushes_finishing_out_of_order_never_move_done_back() {
    let mut done = Done::default();
    done.finish(11, true);
    done.finish(10, true);
    assert_eq!((done.attempted, done.covered), (11, 11));
    done.finish(12, false);
    done.finish(9, true);
    assert_eq!((done.attempted, done.covered), (12, 11));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_mode_flushes_run_one_at_a_time() {
    let (running, most) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (r, m) = (running.clone(), most.clone());
    let commit = Arc::new(GroupCommit::new(
        SyncMode::Always,
        Arc::new(move || {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            r.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }),
    ));
    concurrent_writers(&commit, 8).await;
    assert_eq!(most.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn never_mode_does_not_flush() {
    let commit = GroupCommit::new(SyncMode::Never, Arc::new(|| panic!("flushed")));
    commit.durable().await.unwrap();
}

/// A flush that fails its first `failures` calls, then succeeds; counts
/// every call.
fn failing_at_first(failures: usize) -> (Arc<FlushFn>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let flush = Arc::new(move || {
        if counted.fetch_add(1, Ordering::SeqCst) < failures {
            Err(std::io::Error::other("write-back error"))
        } else {
            Ok(())
        }
    });
    (flush, calls)
}

#[tokio::test]
async fn after_a_failed_flush_no_writer_is_told_durable_and_no_flush_runs() {
    for mode in [SyncMode::Batch, SyncMode::Always] {
        let (flush, calls) = failing_at_first(1);
        let commit = GroupCommit::new(mode, flush);
        assert!(commit.durable().await.is_err(), "{mode:?}");
        assert!(commit.failed());
        for _ in 0..3 {
            assert!(commit.durable().await.is_err(), "{mode:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{mode:?}");
    }
}

#[tokio::test]
async fn a_failed_sync_outside_the_group_commit_stops_it_too() {
    let (flush, calls) = failing_at_first(0);
    let commit = GroupCommit::new(SyncMode::Batch, flush);
    let outside = commit.flush_with(|| Err(std::io::Error::other("write-back error")));
    assert!(outside.is_err());
    assert!(commit.failed());
    assert!(commit.durable().await.is_err());
    assert!(commit.flush_with(|| Ok(())).is_err(), "refused, not run");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[test]
fn a_success_counted_after_a_failure_covers_nothing() {
    let mut done = Done::default();
    done.finish(3, true);
    done.finish(5, false);
    done.finish(7, true);
    assert_eq!((done.attempted, done.covered), (7, 3));
}

#[tokio::test]
async fn a_failed_flush_is_reported_to_its_writers() {
    let commit = GroupCommit::new(
        SyncMode::Batch,
        Arc::new(|| Err(std::io::Error::other("disk full"))),
    );
    assert!(commit.durable().await.is_err());
}

#[tokio::test]
async fn health_names_the_error_of_the_flush_that_stopped_the_log() {
    let (flush, _) = failing_at_first(1);
    let commit = GroupCommit::new(SyncMode::Batch, flush);
    assert_eq!(commit.health(), Ok(()));
    assert!(commit.durable().await.is_err());
    assert_eq!(
        commit.health(),
        Err("log not writable: write-back error".to_owned())
    );
}
