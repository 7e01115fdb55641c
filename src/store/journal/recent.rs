//! The summaries of the few long retired streams read last, kept decoded.
//!
//! A reader takes a stream a page at a time (`stream/reader.rs`), and a
//! retired stream's entry locations are in its summary on disk, so a replay
//! of a retired stream of 10,000 entries read and decoded its whole summary
//! (160 KB of locations) once per page of 256: 40 times, most of the
//! replay's time after the event ids (BENCHMARKS.md, "10k-entry replay").
//! Here the last few such summaries stay decoded, so a replay reads its
//! summary once.
//!
//! A summary record never changes where it lies (a change to a retired
//! stream writes a new one elsewhere, and the index then names the new
//! place), so a summary is cached under its stream and place, and a lookup
//! under the place the index names now can only find that record: nothing
//! here needs invalidating. The cache is bounded both in summaries and in
//! locations held, so what it costs is a constant, whatever the log retains;
//! a stream that fits one page is read once per replay anyway and is not
//! kept.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::lock;
use super::retired::Place;
use super::summary::Summary;
use crate::id::StreamId;

/// Summaries kept at most: a few replays of long streams at once share it.
const KEPT: usize = 4;

/// Locations kept at most, all summaries together (16 bytes each: 4 MiB).
/// A summary with more is read whole for each page, as without the cache.
const MAX_LOCS: usize = 256 * 1024;

/// Summaries with fewer locations than this are not kept: one page of a
/// reader (`READ_BATCH` in `stream/reader.rs`) takes them whole.
const MIN_LOCS: usize = 257;

/// The last long summaries read, newest last.
#[derive(Default)]
pub struct Recent {
    kept: Mutex<VecDeque<(StreamId, Place, Arc<Summary>)>>,
}

impl Recent {
    /// The summary of `stream` at `place`, if it was kept.
    pub fn get(&self, stream: StreamId, place: Place) -> Option<Arc<Summary>> {
        let kept = lock(&self.kept);
        kept.iter()
            .find(|(s, p, _)| *s == stream && *p == place)
            .map(|(_, _, summary)| summary.clone())
    }

    /// Keeps `summary` (of `stream`, read at `place`) if it is long enough
    /// to be read again by the next page and fits the bound, letting the
    /// oldest go.
    pub fn keep(&self, stream: StreamId, place: Place, summary: &Arc<Summary>) {
        let len = summary.locs.len();
        if !(MIN_LOCS..=MAX_LOCS).contains(&len) {
            return;
        }
        let mut kept = lock(&self.kept);
        if kept.iter().any(|(s, p, _)| *s == stream && *p == place) {
            return;
        }
        let mut held: usize = kept.iter().map(|(_, _, s)| s.locs.len()).sum();
        while kept.len() >= KEPT || (held + len > MAX_LOCS && !kept.is_empty()) {
            if let Some((_, _, gone)) = kept.pop_front() {
                held -= gone.locs.len();
            }
        }
        kept.push_back((stream, place, summary.clone()));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.kept).len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::segment::Loc;
    use super::*;
    use crate::store::StreamMeta;

    fn summary(entries: usize) -> Arc<Summary> {
        let loc = Loc {
            segment: 1,
            len: 10,
            offset: 0,
        };
        Arc::new(Summary {
            meta: StreamMeta::standalone(crate::id::SessionId::random()),
            locs: vec![loc; entries],
        })
    }

    fn place(offset: u32) -> Place {
        Place {
            segment: 1,
            offset,
            len: 100,
        }
    }

    #[test]
    fn a_long_summary_is_found_at_its_place_only() {
        let recent = Recent::default();
        let stream = StreamId::random();
        recent.keep(stream, place(0), &summary(1000));
        assert!(recent.get(stream, place(0)).is_some());
        // Written again elsewhere (a change): the old record is not it.
        assert!(recent.get(stream, place(64)).is_none());
        assert!(recent.get(StreamId::random(), place(0)).is_none());
    }

    #[test]
    fn a_summary_one_page_reads_whole_is_not_kept() {
        let recent = Recent::default();
        recent.keep(StreamId::random(), place(0), &summary(MIN_LOCS - 1));
        assert_eq!(recent.len(), 0);
    }

    #[test]
    fn the_oldest_summary_goes_past_the_bound() {
        let recent = Recent::default();
        let first = StreamId::random();
        recent.keep(first, place(0), &summary(1000));
        for _ in 0..KEPT {
            recent.keep(StreamId::random(), place(0), &summary(1000));
        }
        assert_eq!(recent.len(), KEPT);
        assert!(recent.get(first, place(0)).is_none());
    }

    #[test]
    fn locations_held_stay_within_the_bound() {
        let recent = Recent::default();
        let first = StreamId::random();
        recent.keep(first, place(0), &summary(MAX_LOCS / 2 + 1));
        recent.keep(StreamId::random(), place(0), &summary(MAX_LOCS / 2 + 1));
        assert_eq!(recent.len(), 1);
        assert!(recent.get(first, place(0)).is_none());
        recent.keep(StreamId::random(), place(0), &summary(MAX_LOCS + 1));
        assert_eq!(recent.len(), 1);
    }
}
