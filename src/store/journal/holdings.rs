//! Holdings: what each segment file holds that is still needed, so that
//! files are deleted, and compacted, without walking every stream.
//!
//! A segment is needed while it holds entries of a stream that exists, or
//! the full record (the last one written whole) of a session, stream or
//! task that exists: recovery replays every segment's metadata in order, so
//! an object lives from its full record on. Records that change an object
//! (status, upstream mark, tombstones) are never counted: a segment is
//! deleted only after every older one (see `Journal::drop_unused_segments`),
//! so a change outlives the record it changes.
//!
//! This module only counts; it performs no I/O and decides nothing about
//! files.

use std::collections::BTreeMap;

use super::segment::{Loc, SegmentNo};
use crate::id::{IdMap, IdSet, SessionId, StreamId, TaskId};

/// Something the journal keeps a full record of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Object {
    Session(SessionId),
    Stream(StreamId),
    Task(TaskId),
}

/// What one segment holds that is still needed.
#[derive(Default, Debug)]
pub struct Holding {
    /// Streams with entries in it.
    pub streams: IdSet<StreamId>,
    /// The bytes of those entries.
    pub bytes: u64,
    /// Objects whose full record is in it.
    pub records: IdSet<Object>,
    /// Retired streams holding it: counted, not listed (`retired.rs`), so
    /// a segment they hold is not copied forward but waits for them to go
    /// (retention, or the bound on retained streams, sees to it).
    pub retired: u32,
}

impl Holding {
    fn is_empty(&self) -> bool {
        self.streams.is_empty() && self.records.is_empty() && self.retired == 0
    }
}

#[derive(Default)]
pub struct Holdings {
    by_segment: BTreeMap<SegmentNo, Holding>,
    /// Where each existing object's full record is.
    record_of: IdMap<Object, SegmentNo>,
}

impl Holdings {
    /// Notes that `object`'s full record was just written to `segment`.
    pub fn record(&mut self, object: Object, segment: SegmentNo) {
        if let Some(old) = self.record_of.insert(object, segment) {
            if old == segment {
                return;
            }
            self.edit(old, |h| {
                h.records.remove(&object);
            });
        }
        self.by_segment
            .entry(segment)
            .or_default()
            .records
            .insert(object);
    }

    /// The segment `object`'s full record is in.
    pub fn home_of(&self, object: Object) -> Option<SegmentNo> {
        self.record_of.get(&object).copied()
    }

    /// Forgets an object that no longer exists; returns the segment its
    /// record was in.
    pub fn forget(&mut self, object: Object) -> Option<SegmentNo> {
        let old = self.record_of.remove(&object)?;
        self.edit(old, |h| {
            h.records.remove(&object);
        });
        Some(old)
    }

    /// Counts entries of `stream` written at `locs`.
    pub fn add_entries(&mut self, stream: StreamId, locs: &[Loc]) {
        for loc in locs {
            let holding = self.by_segment.entry(loc.segment).or_default();
            holding.streams.insert(stream);
            holding.bytes += u64::from(loc.len);
        }
    }

    /// Stops counting entries of `stream` at `locs` (deleted, or copied
    /// elsewhere); `still` says which segments still hold others of its
    /// entries.
    pub fn drop_entries(&mut self, stream: StreamId, locs: &[Loc], still: &[SegmentNo]) {
        for loc in locs {
            self.edit(loc.segment, |h| {
                h.bytes = h.bytes.saturating_sub(u64::from(loc.len));
                if !still.contains(&loc.segment) {
                    h.streams.remove(&stream);
                }
            });
        }
    }

    /// Counts a retired stream in each of `segments`.
    pub fn hold(&mut self, segments: std::ops::RangeInclusive<SegmentNo>) {
        for no in segments {
            self.by_segment.entry(no).or_default().retired += 1;
        }
    }

    /// Counts `n` retired streams more in `segment`.
    pub fn hold_count(&mut self, segment: SegmentNo, n: u32) {
        self.by_segment.entry(segment).or_default().retired += n;
    }

    /// Stops counting a retired stream in `segments`; returns those left
    /// holding nothing.
    pub fn release(&mut self, segments: std::ops::RangeInclusive<SegmentNo>) -> Vec<SegmentNo> {
        let mut unused = Vec::new();
        for no in segments {
            self.edit(no, |h| h.retired = h.retired.saturating_sub(1));
            if !self.in_use(no) {
                unused.push(no);
            }
        }
        unused
    }

    /// Whether anything still needed is in `segment`.
    pub fn in_use(&self, segment: SegmentNo) -> bool {
        self.by_segment.contains_key(&segment)
    }

    pub fn of(&self, segment: SegmentNo) -> Option<&Holding> {
        self.by_segment.get(&segment)
    }

    fn edit(&mut self, segment: SegmentNo, change: impl FnOnce(&mut Holding)) {
        if let Some(holding) = self.by_segment.get_mut(&segment) {
            change(holding);
            if holding.is_empty() {
                self.by_segment.remove(&segment);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(segment: SegmentNo, len: u32) -> Loc {
        Loc {
            segment,
            len,
            offset: 0,
        }
    }

    #[test]
    fn a_segment_is_held_by_entries_and_by_full_records() {
        let mut h = Holdings::default();
        let stream = StreamId([1; 16]);
        h.record(Object::Stream(stream), 1);
        h.add_entries(stream, &[loc(2, 10)]);
        assert!(h.in_use(1) && h.in_use(2));
        h.record(Object::Stream(stream), 3);
        assert!(
            !h.in_use(1),
            "a newer full record frees the older one's segment"
        );
        h.drop_entries(stream, &[loc(2, 10)], &[]);
        assert!(!h.in_use(2));
        h.forget(Object::Stream(stream));
        assert!(!h.in_use(3));
    }

    #[test]
    fn live_bytes_follow_entries_in_and_out() {
        let mut h = Holdings::default();
        let (a, b) = (StreamId([1; 16]), StreamId([2; 16]));
        h.add_entries(a, &[loc(1, 10), loc(1, 5)]);
        h.add_entries(b, &[loc(1, 7)]);
        assert_eq!(h.of(1).map(|x| x.bytes), Some(22));
        h.drop_entries(a, &[loc(1, 10)], &[1]);
        let held = h.of(1).expect("still held");
        assert_eq!(held.bytes, 12);
        assert!(held.streams.contains(&a), "a still has an entry there");
    }
}
