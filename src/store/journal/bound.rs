//! The bound on retained streams (`[limits] max_retained_streams`): its
//! value, and the count and the once-a-minute log line of what it released
//! early. Which streams it releases, and when, is `retire.rs`'s.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often releases past the bound are logged while they go on.
const SAY_EVERY: Duration = Duration::from_secs(60);

/// The bound on retained streams and what it released.
pub struct Bound {
    max: AtomicUsize,
    released: AtomicU64,
    /// Released since the last log line, and when that was.
    said: Mutex<(u64, Option<Instant>)>,
}

impl Default for Bound {
    fn default() -> Self {
        Self {
            max: AtomicUsize::new(usize::MAX),
            released: AtomicU64::new(0),
            said: Mutex::new((0, None)),
        }
    }
}

impl Bound {
    pub fn set(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    pub fn released(&self) -> u64 {
        self.released.load(Ordering::Relaxed)
    }

    /// Counts `n` streams released early; logs once a minute while it
    /// happens (the first time at once).
    pub fn count(&self, n: usize) {
        self.released.fetch_add(n as u64, Ordering::Relaxed);
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        said.0 += n as u64;
        if said.1.is_none_or(|at| at.elapsed() >= SAY_EVERY) {
            tracing::warn!(
                released = said.0,
                max_retained_streams = self.max.load(Ordering::Relaxed),
                "finished streams released before their retention ran out: \
                 the bound on retained streams was reached"
            );
            *said = (0, Some(Instant::now()));
        }
    }
}
