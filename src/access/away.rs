//! When clients went away from streams, for the time they were away when
//! they come back (`resume_away_seconds`).
//!
//! Only this instance's departures are known: a client that comes back on
//! another instance is counted as a replay there, without its time away.
//! Bounded: past [`KEPT`] departures, those older than [`FORGOTTEN_AFTER`]
//! are forgotten, and while it is still full new ones are not noted.

use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use crate::id::{IdHasher, StreamId};

/// The most departures remembered.
const KEPT: usize = 65_536;
/// A departure this old is forgotten when room is needed.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(3600);

#[derive(Default)]
pub struct Departures {
    left: DashMap<StreamId, Instant, std::hash::BuildHasherDefault<IdHasher>>,
}

impl Departures {
    /// The answer on `stream` ended before the stream did.
    pub fn left(&self, stream: StreamId) {
        let now = Instant::now();
        if self.left.len() >= KEPT {
            self.left
                .retain(|_, at| now.saturating_duration_since(*at) < FORGOTTEN_AFTER);
            if self.left.len() >= KEPT {
                return;
            }
        }
        self.left.insert(stream, now);
    }

    /// A client came back for `stream`: when it had left, if it left here.
    pub fn came_back(&self, stream: StreamId) -> Option<Instant> {
        self.left.remove(&stream).map(|(_, at)| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_departure_is_told_once() {
        let departures = Departures::default();
        let stream = StreamId::random();
        departures.left(stream);
        assert!(departures.came_back(stream).is_some());
        assert!(departures.came_back(stream).is_none());
    }

    #[test]
    fn departures_stay_bounded() {
        let departures = Departures::default();
        for _ in 0..KEPT + 10 {
            departures.left(StreamId::random());
        }
        assert_eq!(departures.left.len(), KEPT);
    }
}
