//! Whether a writer may flush on its own thread.
//!
//! A flush handed to the syncer costs two wake-ups across cores: the writer
//! wakes the syncer, and the syncer wakes the writer's scheduler when the
//! flush is done. On this project's 2-core VM that was about 50 µs of a
//! lone call's latency with `batch`, more for a client that pauses between
//! calls (BENCHMARKS.md, session 16). A writer may skip both and flush where
//! it stands, blocking its thread, when that delays nobody: its thread is a
//! worker's that serves its client alone ([`workers::serving`]), the syncer
//! is parked and no other flush is owed, writers come as one call at a time
//! does, and the disk's flushes have been quick ([`QUICK`]). Flushes still
//! run one at a time: a writer that comes meanwhile wakes the syncer, which
//! waits for the writer's flush to end before starting its own. Off a
//! worker (the runtime that starts the server, a test's) writers never
//! flush for themselves.
//!
//! This file owns the inputs of that decision from outside the queue (what
//! the thread serves, how quick is quick); the queue decides with them (the
//! module's `batched`).

use std::time::Duration;

use crate::workers;

/// The longest a flush may take (smoothed) for a writer to run it on its
/// own thread. While it runs, its scheduler runs nothing else: a new
/// connection handed to that worker, or a relay of a call its client left,
/// waits that long. A disk slower than this is left to the syncer, which
/// keeps the workers free. What has been quick can still stall once: that
/// one flush then holds its worker for as long as the disk takes, as it
/// holds every writer waiting on it either way.
pub const QUICK: Duration = Duration::from_millis(1);

/// Whether the scheduler on this thread is a worker's that serves one
/// client at most.
pub(super) fn alone_here() -> bool {
    workers::serving().is_some_and(|clients| clients <= 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::testing::serving_on_this_thread;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_thread_that_is_not_a_workers_is_never_alone() {
        let alone = std::thread::spawn(alone_here).join().unwrap();
        assert!(!alone);
    }

    #[test]
    fn a_thread_serving_one_client_is_alone_and_one_serving_two_is_not() {
        let count = Arc::new(AtomicUsize::new(1));
        let seen = count.clone();
        let (one, two) = std::thread::spawn(move || {
            serving_on_this_thread(seen.clone());
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
