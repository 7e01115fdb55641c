//! Retired streams: the finished streams retention keeps, each held in
//! memory as one small [`Retired`] while its metadata and its entries'
//! locations wait on disk in its summary record (`summary.rs`).
//!
//! A busy proxy retains hundreds of thousands of finished calls; kept whole
//! (metadata, a location per entry, a watch channel, a place in four
//! indexes) each cost ~1.8 KB, and memory grew with the load without a
//! bound. Retired, each costs its [`Retired`] in a map, a place in the
//! retirement order and one in the request index: 184–261 bytes all told
//! (see BENCHMARKS.md).
//!
//! This module keeps those three collections in step; it performs no I/O
//! and knows nothing of segments' accounting (`index.rs` does that).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault};

use siphasher::sip::SipHasher13;

use super::segment::{Loc, SegmentNo};
use super::summary::{self, SummaryHead};
use crate::id::{IdHasher, IdMap, SessionId, StreamId};
use crate::jsonrpc::RequestId;
use crate::store::StreamMeta;

/// Where a summary record is: what one positioned read of it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub segment: SegmentNo,
    pub offset: u32,
    pub len: u32,
}

impl Place {
    /// `None` past what 32 bits hold (a segment configured beyond 4 GiB):
    /// such a stream simply stays whole.
    pub fn new(segment: SegmentNo, offset: u64, len: usize) -> Option<Self> {
        Some(Self {
            segment,
            offset: u32::try_from(offset).ok()?,
            len: u32::try_from(len).ok()?,
        })
    }
}

/// One retired stream, as the index keeps it (48 bytes). Everything a hot
/// path asks without reading the disk: whose it is, its watermark, when
/// retention ends it, and the segments it holds (`first_segment ..=
/// summary.segment`). The rare abandonment deadline is kept beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retired {
    pub session: SessionId,
    pub summary: Place,
    pub first_segment: SegmentNo,
    pub entries: u32,
    /// When it finished, in ms since the epoch: as two halves, so that the
    /// struct needs no 8-byte alignment (and no padding to it).
    pub finished_ms: [u32; 2],
    /// Request ids indexed for it (to count what its removal leaves stale).
    pub requests: u16,
    pub coalesced: bool,
}

impl Retired {
    /// A whole stream retiring, its summary written at `place`.
    pub fn of_whole(meta: &StreamMeta, locs: &[Loc], place: Place) -> Self {
        Self {
            session: meta.session,
            summary: place,
            first_segment: summary::first_segment(locs),
            entries: locs.len() as u32,
            finished_ms: Self::split(meta.finished_ms.unwrap_or(0)),
            requests: 0,
            coalesced: meta.coalesced,
        }
    }

    /// A retired stream as its summary's head tells it, the summary at
    /// `place`.
    pub fn of_head(head: &SummaryHead, place: Place) -> Self {
        Self {
            session: head.session,
            summary: place,
            first_segment: head.first_segment,
            entries: head.entries,
            finished_ms: Self::split(head.finished_ms),
            requests: 0,
            coalesced: head.coalesced,
        }
    }

    pub fn split(ms: u64) -> [u32; 2] {
        [(ms >> 32) as u32, ms as u32]
    }

    pub fn finished_ms(&self) -> u64 {
        u64::from(self.finished_ms[0]) << 32 | u64::from(self.finished_ms[1])
    }

    pub fn set_finished_ms(&mut self, ms: u64) {
        self.finished_ms = Self::split(ms);
    }

    /// The segments it holds: its entries' and its summary's.
    pub fn segments(&self) -> std::ops::RangeInclusive<SegmentNo> {
        let first = match self.first_segment {
            0 => self.summary.segment,
            first => first.min(self.summary.segment),
        };
        first..=self.summary.segment
    }
}

/// The secret key of the request index's hash. Drawn at random for a new
/// index; a checkpoint (`checkpoint.rs`) keeps it with the hashes it made,
/// so that they still find their streams after a restart.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestKey(pub [u8; 16]);

impl Default for RequestKey {
    fn default() -> Self {
        Self(crate::id::random_key())
    }
}

impl BuildHasher for RequestKey {
    type Hasher = SipHasher13;

    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_key(&self.0)
    }
}

impl std::fmt::Debug for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestKey(..)")
    }
}

/// The retired streams, the order they retired in (finish order, within the
/// few milliseconds a finish takes to become durable), and which request
/// each answers.
#[derive(Default)]
pub struct RetiredStreams {
    streams: IdMap<StreamId, Retired>,
    /// Oldest first; ids removed since stay until they reach the front, or
    /// until they are most of it.
    order: VecDeque<StreamId>,
    /// Keyed hash of (session, request id) → stream. 16 bytes of key a
    /// request instead of the id's text; a match is confirmed by session,
    /// and the key is this process's secret, so a client cannot aim two
    /// ids at one slot. Entries of removed streams are pruned in bulk.
    requests: HashMap<u64, StreamId, BuildHasherDefault<IdHasher>>,
    /// Request entries (at most) left pointing at removed streams.
    stale: usize,
    key: RequestKey,
    /// The abandonment deadlines of those that have one (few: only the
    /// dialects that negotiate abandonment set them).
    abandons: IdMap<StreamId, u64>,
}

impl RetiredStreams {
    /// An empty tier hashing requests with `key` (a checkpoint's).
    pub fn with_key(key: RequestKey) -> Self {
        Self {
            key,
            ..Self::default()
        }
    }

    pub fn key(&self) -> RequestKey {
        self.key
    }

    pub fn get(&self, id: &StreamId) -> Option<&Retired> {
        self.streams.get(id)
    }

    pub fn get_mut(&mut self, id: &StreamId) -> Option<&mut Retired> {
        self.streams.get_mut(id)
    }

    pub fn contains(&self, id: &StreamId) -> bool {
        self.streams.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn ids(&self) -> impl Iterator<Item = &StreamId> {
        self.streams.keys()
    }

    fn request_key(&self, session: SessionId, request: &RequestId) -> u64 {
        self.key.hash_one((session, request.as_json()))
    }

    /// Adds a retired stream, answering `requests` (those it is the newest
    /// stream for), at the young end of the order.
    pub fn insert(
        &mut self,
        id: StreamId,
        mut retired: Retired,
        requests: &[&RequestId],
        abandon_at: Option<u64>,
    ) {
        if let Some(at) = abandon_at {
            self.abandons.insert(id, at);
        }
        for request in requests {
            let key = self.request_key(retired.session, request);
            self.requests.insert(key, id);
        }
        retired.requests = requests.len().min(u16::MAX as usize) as u16;
        self.order.push_back(id);
        self.streams.insert(id, retired);
    }

    /// Adds a retired stream as a checkpoint kept it, its `requests` count
    /// included; its request hashes come separately
    /// ([`RetiredStreams::index_hashed`]), its place in the order with
    /// [`RetiredStreams::sort_by_finish`].
    pub fn insert_kept(&mut self, id: StreamId, retired: Retired, abandon_at: Option<u64>) {
        if let Some(at) = abandon_at {
            self.abandons.insert(id, at);
        }
        self.streams.insert(id, retired);
    }

    /// Indexes a request hash a checkpoint kept (made with this tier's
    /// key), unless the stream it names is not here: the checkpoint keeps
    /// stale entries, and its streams are added first.
    pub fn index_hashed(&mut self, hash: u64, id: StreamId) {
        if self.streams.contains_key(&id) {
            self.requests.insert(hash, id);
        }
    }

    /// Room for `n` more streams, as a checkpoint says it holds.
    pub fn reserve(&mut self, n: usize) {
        self.streams.reserve(n);
        self.requests.reserve(n);
    }

    /// The request index's entries: (hash, stream), stale ones included.
    pub fn request_hashes(&self) -> impl Iterator<Item = (u64, StreamId)> + '_ {
        self.requests.iter().map(|(hash, id)| (*hash, *id))
    }

    /// How many entries the request index holds, stale ones included.
    pub fn requests_len(&self) -> usize {
        self.requests.len()
    }

    /// Removes a retired stream; gives it back with its abandonment
    /// deadline.
    pub fn remove(&mut self, id: &StreamId) -> Option<(Retired, Option<u64>)> {
        let retired = self.streams.remove(id)?;
        let abandon_at = self.abandons.remove(id);
        self.stale += retired.requests as usize;
        if self.stale > self.streams.len() / 2 + 1024 {
            let streams = &self.streams;
            self.requests.retain(|_, s| streams.contains_key(s));
            self.stale = 0;
        }
        if self.order.len() > 2 * self.streams.len() + 1024 {
            let streams = &self.streams;
            self.order.retain(|s| streams.contains_key(s));
        }
        Some((retired, abandon_at))
    }

    /// Sets (or clears) a retired stream's abandonment deadline; returns
    /// the one it replaces.
    pub fn set_abandon(&mut self, id: StreamId, at: Option<u64>) -> Option<u64> {
        match at {
            Some(at) => self.abandons.insert(id, at),
            None => self.abandons.remove(&id),
        }
    }

    /// The retired stream answering `request` of `session`, if one does.
    pub fn answering(&self, session: SessionId, request: &RequestId) -> Option<StreamId> {
        let id = *self.requests.get(&self.request_key(session, request))?;
        (self.streams.get(&id)?.session == session).then_some(id)
    }

    /// Forgets which stream answers `request` of `session` (a newer one
    /// does now, outside this tier).
    pub fn unindex(&mut self, session: SessionId, request: &RequestId) {
        let key = self.request_key(session, request);
        if self.requests.remove(&key).is_some() {
            self.stale = self.stale.saturating_sub(1);
        }
    }

    /// Retired streams finished at or before `at_ms`, oldest first (ids
    /// since removed are dropped from the front on the way).
    pub fn finished_by(&mut self, at_ms: u64) -> Vec<StreamId> {
        self.drop_removed_front();
        self.order
            .iter()
            .filter_map(|id| self.streams.get(id).map(|r| (id, r)))
            .take_while(|(_, r)| r.finished_ms() <= at_ms)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The `n` oldest retired streams.
    pub fn oldest(&mut self, n: usize) -> Vec<StreamId> {
        self.drop_removed_front();
        self.order
            .iter()
            .filter(|id| self.streams.contains_key(id))
            .take(n)
            .copied()
            .collect()
    }

    fn drop_removed_front(&mut self) {
        while let Some(id) = self.order.front() {
            if self.streams.contains_key(id) {
                break;
            }
            self.order.pop_front();
        }
    }

    /// Every retired stream with its abandonment deadline, if it has one.
    pub fn iter(&self) -> impl Iterator<Item = (&StreamId, &Retired, Option<u64>)> {
        self.streams
            .iter()
            .map(|(id, r)| (id, r, self.abandons.get(id).copied()))
    }

    /// Rebuilds the order, oldest finish first, after recovery added
    /// streams in no order: from the map itself, read in its own order and
    /// sorted by key, rather than a lookup per comparison (at a million
    /// streams, the lookups were most of the start-up).
    pub fn sort_by_finish(&mut self) {
        let mut order: Vec<(u64, StreamId)> = self
            .streams
            .iter()
            .map(|(id, r)| (r.finished_ms(), *id))
            .collect();
        order.sort_unstable();
        self.order = order.into_iter().map(|(_, id)| id).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retired(session: SessionId, finished_ms: u64) -> Retired {
        Retired {
            session,
            finished_ms: Retired::split(finished_ms),
            summary: Place {
                segment: 2,
                offset: 0,
                len: 1,
            },
            first_segment: 1,
            entries: 1,
            requests: 0,
            coalesced: false,
        }
    }

    #[test]
    fn a_retired_stream_costs_at_most_48_bytes_of_map_value() {
        assert!(std::mem::size_of::<Retired>() <= 48);
        assert_eq!(retired(SessionId::random(), 1 << 40).finished_ms(), 1 << 40);
    }

    #[test]
    fn a_request_finds_its_stream_only_in_its_own_session() {
        let mut tier = RetiredStreams::default();
        let (mine, other) = (SessionId::random(), SessionId::random());
        let id = StreamId::random();
        let request = RequestId("7".into());
        tier.insert(id, retired(mine, 1), &[&request], None);
        assert_eq!(tier.answering(mine, &request), Some(id));
        assert_eq!(tier.answering(other, &request), None);
        tier.remove(&id);
        assert_eq!(tier.answering(mine, &request), None, "removed");
    }

    #[test]
    fn the_oldest_finished_come_first_and_removed_ones_never() {
        let mut tier = RetiredStreams::default();
        let session = SessionId::random();
        let ids: Vec<StreamId> = (0..4).map(|_| StreamId::random()).collect();
        for (i, id) in ids.iter().enumerate() {
            tier.insert(*id, retired(session, 10_000 * i as u64), &[], None);
        }
        tier.remove(&ids[0]);
        assert_eq!(tier.oldest(2), vec![ids[1], ids[2]]);
        assert_eq!(tier.finished_by(20_000), vec![ids[1], ids[2]]);
    }

    #[test]
    fn stale_request_entries_are_pruned_once_they_pile_up() {
        let mut tier = RetiredStreams::default();
        let session = SessionId::random();
        for i in 0..5000 {
            let id = StreamId::random();
            let request = RequestId(i.to_string());
            tier.insert(id, retired(session, i as u64), &[&request], Some(1));
            tier.remove(&id);
        }
        assert!(tier.requests.len() <= 1025, "{}", tier.requests.len());
        assert!(tier.order.len() <= 1025, "{}", tier.order.len());
        assert!(tier.abandons.is_empty());
    }

    #[test]
    fn a_kept_request_entry_naming_a_stream_not_kept_is_dropped() {
        let mut tier = RetiredStreams::default();
        let session = SessionId::random();
        let (kept, gone) = (StreamId::random(), StreamId::random());
        tier.insert_kept(kept, retired(session, 1), None);
        tier.index_hashed(1, kept);
        tier.index_hashed(2, gone);
        assert_eq!(tier.requests_len(), 1);
    }
}
