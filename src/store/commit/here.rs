//! Whether a writer may flush on its own thread.
//!
//! A flush handed to the syncer costs two wake-ups across cores: the writer
//! wakes the syncer, and the syncer wakes the writer's scheduler when the
//! flush is done. On this project's 2-core VM that was about 100 µs of a
//! lone call's latency with `batch` (BENCHMARKS.md, session 16). A writer
//! may skip both and flush where it stands, blocking its thread, when that
//! delays nobody: its thread's scheduler serves its client alone (a worker
//! says how many it serves through [`serving_here`]), the syncer is parked
//! and no other flush is owed, writers come as one call at a time does, and
//! the disk's flushes have been quick ([`QUICK`]). Flushes still run one at
//! a time: a writer that comes meanwhile wakes the syncer, which waits for
//! the writer's flush to end before starting its own. A thread that never said what it
//! serves (the runtime that starts the server, a test's) never flushes for
//! its writers.
//!
//! This file owns what the thread tells the group commit; the queue decides
//! with it (the module's `batched`).

use std::cell::OnceCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The longest a flush may take (smoothed) for a writer to run it on its
/// own thread. While it runs, its scheduler runs nothing else: a new
/// connection handed to that worker, or a relay of a call its client left,
/// waits that long. A disk slower than this is left to the syncer, which
/// keeps the workers free. What has been quick can still stall once: that
/// one flush then holds its worker for as long as the disk takes, as it
/// holds every writer waiting on it either way.
pub const QUICK: Duration = Duration::from_millis(1);

thread_local! {
    /// How many clients the scheduler on this thread serves, where its
    /// worker said so.
    static SERVING: OnceCell<Arc<AtomicUsize>> = const { OnceCell::new() };
}

/// Tells the group commit how many clients the scheduler on this thread
/// serves (a worker, as its thread starts; later calls are ignored). A
/// writer on a thread that serves one client at most may flush there.
pub fn serving_here(count: Arc<AtomicUsize>) {
    SERVING.with(|serving| {
        let _ = serving.set(count);
    });
}

/// Whether this thread's scheduler serves one client at most, by its own
/// account.
pub(super) fn alone_here() -> bool {
    SERVING.with(|serving| {
        serving
            .get()
            .is_some_and(|count| count.load(Ordering::Relaxed) <= 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_never_said_what_it_serves_is_never_alone() {
        let alone = std::thread::spawn(alone_here).join().unwrap();
        assert!(!alone);
    }

    #[test]
    fn a_thread_serving_one_client_is_alone_and_one_serving_two_is_not() {
        let count = Arc::new(AtomicUsize::new(1));
        let seen = count.clone();
        let (one, two) = std::thread::spawn(move || {
            serving_here(seen.clone());
            let one = alone_here();
            seen.store(2, Ordering::Relaxed);
            (one, alone_here())
        })
        .join()
        .unwrap();
        assert!(one);
        assert!(!two);
    }
}
