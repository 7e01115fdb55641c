//! The threads that serve connections. Each worker is one OS thread running
//! a single-threaded tokio scheduler: the worker a connection is handed to
//! runs that connection's requests, the relays they start and (through
//! [`PerWorker`]) the upstream and Redis connections they use, so the steps of one
//! call wake each other on one thread. Under tokio's work-stealing scheduler
//! every wake-up could land on the other thread, or wake it to steal: one
//! call at a time cost 7 `futex` calls and 11 context switches instead of 2
//! and 7, and an interactive client's calls came back 70–110 µs later
//! (BENCHMARKS.md, session 12).
//!
//! A connection goes to the worker serving the fewest: one accept loop
//! hands them out, because workers accepting for themselves from one socket
//! let the first one awake take a whole burst of connections, and
//! `SO_REUSEPORT` would let a second process share the port unnoticed.
//!
//! This module owns the threads, their lifetime and which worker the code
//! runs on; it knows nothing of HTTP. What runs on no connection's behalf
//! (start-up, the accept loop, the sweeper, recovery) stays on the runtime
//! that started the server.

use std::cell::{Cell, OnceCell};
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

thread_local! {
    /// 1..=n on a worker thread; 0 anywhere else.
    static WORKER: Cell<usize> = const { Cell::new(0) };
    /// How many connections the worker on this thread serves.
    static SERVING: OnceCell<Arc<AtomicUsize>> = const { OnceCell::new() };
}

/// How long a worker's leftover tasks (streams still relaying when the
/// server stopped) get to notice their runtime is going away.
const LEFTOVERS: Duration = Duration::from_secs(1);

/// The worker threads of one server.
pub struct Workers {
    workers: Vec<Worker>,
    /// Lets the workers drop their runtimes, which the server allows only
    /// once the log is flushed: until then their relays may still append.
    release: CancellationToken,
    threads: Vec<JoinHandle<()>>,
}

struct Worker {
    handle: Handle,
    /// Connections this worker serves now.
    serving: Arc<AtomicUsize>,
}

impl Workers {
    /// Starts `count` worker threads, idle until connections are handed to
    /// them.
    pub fn start(count: usize) -> io::Result<Workers> {
        let release = CancellationToken::new();
        let mut workers = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        for index in 1..=count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let serving = Arc::<AtomicUsize>::default();
            workers.push(Worker {
                handle: runtime.handle().clone(),
                serving: serving.clone(),
            });
            let release = release.clone();
            let thread = std::thread::Builder::new()
                .name(format!("worker-{index}"))
                .spawn(move || {
                    WORKER.with(|w| w.set(index));
                    count_here(serving);
                    runtime.block_on(release.cancelled());
                    runtime.shutdown_timeout(LEFTOVERS);
                })?;
            threads.push(thread);
        }
        Ok(Workers {
            workers,
            release,
            threads,
        })
    }

    /// Runs `connection` on the worker serving the fewest connections. It
    /// is first polled there, so whatever it registers (its socket) belongs
    /// to that worker.
    pub fn serve(&self, connection: impl Future<Output = ()> + Send + 'static) {
        let Some(worker) = self
            .workers
            .iter()
            .min_by_key(|w| w.serving.load(Ordering::Relaxed))
        else {
            return;
        };
        let serving = Serving::new(worker.serving.clone());
        // `map`, not an `async` block awaiting it: a block keeps the future
        // it captured and the one it awaits in two places, which doubled the
        // size of every connection's task (6 KiB per open stream).
        worker.handle.spawn(connection.map(move |()| drop(serving)));
    }

    /// Lets the workers go (what still runs on them is dropped) and waits
    /// for their threads to end.
    pub async fn finish(mut self) {
        self.release.cancel();
        let threads = std::mem::take(&mut self.threads);
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

/// A server dropped without a shutdown (an embedding that just lets go)
/// must not leave threads behind.
impl Drop for Workers {
    fn drop(&mut self) {
        self.release.cancel();
    }
}

/// Counts a connection as served by its worker for as long as it lives.
struct Serving(Arc<AtomicUsize>);

impl Serving {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The worker this code runs on: 1..=n on a worker, 0 elsewhere.
pub fn current() -> usize {
    WORKER.with(Cell::get)
}

/// How many connections the worker this code runs on serves now; `None`
/// off a worker. (The log's group commit asks: a call on a worker serving
/// only its own client may flush there instead of waking another thread.)
pub fn serving() -> Option<usize> {
    SERVING.with(|count| count.get().map(|n| n.load(Ordering::Relaxed)))
}

/// Counts this thread's connections with `count` (a worker's thread, as it
/// starts; later calls are ignored).
fn count_here(count: Arc<AtomicUsize>) {
    SERVING.with(|serving| {
        let _ = serving.set(count);
    });
}

/// One value per worker (and one for code on no worker), so that what a
/// worker uses — an upstream connection pool — is its own.
pub struct PerWorker<T> {
    values: Vec<T>,
}

impl<T> PerWorker<T> {
    /// `make` runs once for each of `workers` workers and once for the rest.
    pub fn new(workers: usize, make: impl FnMut(usize) -> T) -> Self {
        Self {
            values: (0..=workers).map(make).collect(),
        }
    }

    /// This worker's value; code on no worker (or on a worker of another
    /// server with more of them) shares the first.
    pub fn get(&self) -> &T {
        let index = current();
        self.values.get(index).unwrap_or(&self.values[0])
    }
}

/// Test scaffolding shared by the tests of what workers keep for
/// themselves (here, and the Redis store's connections).
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Lets this thread count as a worker serving `count` connections.
    pub fn serving_on_this_thread(count: Arc<AtomicUsize>) {
        count_here(count);
    }

    /// Serves `count` connections that each run what `task` makes, report
    /// the worker they ran on with its output, and then stay open until the
    /// returned sender is dropped (so each counts as served while the next
    /// is handed out). The reports come sorted by worker; a connection that
    /// panics fails the call instead of hanging it.
    pub fn on_workers<T, Fut>(
        workers: &Workers,
        count: usize,
        task: impl Fn() -> Fut,
    ) -> (Vec<(usize, T)>, tokio::sync::watch::Sender<()>)
    where
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (hold, held) = tokio::sync::watch::channel(());
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..count {
            let (tx, mut held, task) = (tx.clone(), held.clone(), task());
            workers.serve(async move {
                let value = task.await;
                let _ = tx.send((current(), value));
                let _ = held.changed().await;
            });
        }
        drop(tx);
        let mut on: Vec<(usize, T)> = (0..count)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)))
            .collect::<Result<_, _>>()
            .expect("every connection reports its worker");
        on.sort_by_key(|(worker, _)| *worker);
        (on, hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Runs `count` connections that report their worker and then wait
    /// until `hold` is dropped.
    fn park(workers: &Workers, count: usize) -> (Vec<usize>, tokio::sync::watch::Sender<()>) {
        let (on, hold) = testing::on_workers(workers, count, || async {});
        (on.into_iter().map(|(worker, ())| worker).collect(), hold)
    }

    #[tokio::test]
    async fn connections_go_to_the_worker_serving_the_fewest() {
        let workers = Workers::start(2).unwrap();
        let (mut on, _hold) = park(&workers, 4);
        on.sort_unstable();
        assert_eq!(on, [1, 1, 2, 2]);
        workers.finish().await;
    }

    #[tokio::test]
    async fn a_connection_that_ended_no_longer_counts() {
        let workers = Workers::start(2).unwrap();
        let (first, hold) = park(&workers, 1);
        drop(hold);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while workers.workers[first[0] - 1]
            .serving
            .load(Ordering::Relaxed)
            > 0
        {
            assert!(std::time::Instant::now() < deadline, "still counted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (again, _hold) = park(&workers, 1);
        assert_eq!(again, [1], "both idle: the first worker takes it");
        workers.finish().await;
    }

    #[tokio::test]
    async fn code_on_a_worker_knows_how_many_connections_it_serves() {
        let workers = Workers::start(1).unwrap();
        assert_eq!(serving(), None, "off a worker");
        let (first, _hold) = testing::on_workers(&workers, 1, || async { serving() });
        let (second, _hold) = testing::on_workers(&workers, 1, || async { serving() });
        assert_eq!(first, [(1, Some(1))]);
        assert_eq!(second, [(1, Some(2))], "the first still open");
        workers.finish().await;
    }

    #[tokio::test]
    async fn each_worker_has_its_own_value_and_other_threads_the_first() {
        let workers = Workers::start(2).unwrap();
        let values = Arc::new(PerWorker::new(2, |i| i * 10));
        assert_eq!(*values.get(), 0);
        let (seen, _hold) = testing::on_workers(&workers, 2, || {
            let values = values.clone();
            async move { *values.get() }
        });
        assert_eq!(seen, [(1, 10), (2, 20)]);
        workers.finish().await;
    }

    #[tokio::test]
    async fn finishing_drops_what_still_runs_and_ends_the_threads() {
        struct Dropped(mpsc::Sender<()>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let workers = Workers::start(2).unwrap();
        let (tx, rx) = mpsc::channel();
        let guard = Dropped(tx);
        workers.serve(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        workers.finish().await;
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
    }
}
