//! The live-stream set behind the `streams_live` gauge.

use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashSet;

use crate::id::StreamId;

/// The streams this process opened that have not left `Live` yet, for the
/// `streams_live` gauge. Streams leave when the log finishes or deletes
/// them; a stream deleted with its session bypasses the log, so the set is
/// also pruned against the store (whose watermark says "finished" for a
/// gone stream too) when scraped, and when it has doubled since the last
/// prune — bounded, and O(1) per open amortised, even if nobody scrapes.
#[derive(Default)]
pub struct LiveStreams {
    ids: DashSet<StreamId>,
    /// The set's size after the last prune.
    pruned_to: AtomicUsize,
}

/// Below this many, the set is never pruned on open.
const PRUNE_FLOOR: usize = 1024;

impl LiveStreams {
    pub fn opened(&self, id: StreamId, finished: impl Fn(StreamId) -> bool) {
        self.ids.insert(id);
        let limit = self
            .pruned_to
            .load(Ordering::Relaxed)
            .max(PRUNE_FLOOR / 2)
            .saturating_mul(2);
        if self.ids.len() > limit {
            self.prune(finished);
        }
    }

    pub fn ended(&self, id: StreamId) {
        self.ids.remove(&id);
    }

    /// The ids of those live, after dropping those the store says are not.
    pub fn ids(&self, finished: impl Fn(StreamId) -> bool) -> Vec<StreamId> {
        self.prune(finished);
        self.ids.iter().map(|id| *id).collect()
    }

    /// How many are live, after dropping those the store says are not.
    pub fn count(&self, finished: impl Fn(StreamId) -> bool) -> usize {
        self.prune(finished)
    }

    fn prune(&self, finished: impl Fn(StreamId) -> bool) -> usize {
        self.ids.retain(|id| !finished(*id));
        let left = self.ids.len();
        self.pruned_to.store(left, Ordering::Relaxed);
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_streams_forget_what_the_store_says_finished() {
        let live = LiveStreams::default();
        let (a, b) = (StreamId::random(), StreamId::random());
        live.opened(a, |_| false);
        live.opened(b, |_| false);
        live.ended(a);
        assert_eq!(live.count(|_| false), 1);
        assert_eq!(live.count(|id| id == b), 0);
    }

    #[test]
    fn live_streams_stay_bounded_when_nobody_scrapes() {
        let live = LiveStreams::default();
        for _ in 0..10 * PRUNE_FLOOR {
            live.opened(StreamId::random(), |_| true);
        }
        assert!(live.ids.len() <= PRUNE_FLOOR, "{}", live.ids.len());
    }
}
