//! Retired streams: the finished streams retention keeps, each held as a
//! few dozen bytes while its metadata and its entries' locations wait on
//! disk in its summary record (`summary.rs`).
//!
//! A busy proxy retains hundreds of thousands of finished calls; kept whole
//! (metadata, a location per entry, a watch channel, a place in four
//! indexes) each cost ~1.8 KB, and memory grew with the load without a
//! bound. Retired, most of them sit in a frozen tier (`frozen.rs`: 104
//! bytes a stream, sorted tables searched in place) that a checkpoint
//! writes as it is and start-up reads back without building anything; what
//! changed since the last checkpoint is in a layer over it
//! (`overlay.rs`), merged into the next frozen tier off the journal's lock
//! when the next checkpoint is taken, so that no lock hold grows with what
//! retention keeps.
//!
//! This module answers for the layers as one set; it performs no I/O and
//! knows nothing of segments' accounting (`index.rs` does that).

use std::hash::BuildHasher;
use std::sync::Arc;

use siphasher::sip::SipHasher13;

use super::segment::{Loc, SegmentNo};
use super::summary::{self, SummaryHead};

mod frozen;
mod merge;
mod overlay;

use crate::id::{SessionId, StreamId};
use crate::jsonrpc::RequestId;
use crate::store::StreamMeta;
#[cfg(test)]
pub use frozen::Kept;
pub use frozen::{Counts, Frozen};
pub use merge::merge;
pub use overlay::Overlay;
use overlay::{Found, Slot};

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

/// The retired streams: a frozen tier, as the last checkpoint's cut left
/// them, under layers of what changed since (see `overlay.rs`); which
/// request each answers; the order they retired in (finish order, within
/// the few milliseconds a finish takes to become durable).
pub struct RetiredStreams {
    key: RequestKey,
    base: Arc<Frozen>,
    /// The changes up to the cut of the checkpoint being taken, while it
    /// merges them into the next frozen tier, off the journal's lock.
    sealed: Option<Arc<Overlay>>,
    fresh: Overlay,
    len: usize,
    /// Places in `base`'s order (and `sealed`'s) before these hold only
    /// streams since removed.
    base_front: usize,
    sealed_front: usize,
}

impl Default for RetiredStreams {
    fn default() -> Self {
        Self::with_key(RequestKey::default())
    }
}

/// What recovery's index takes over from a tier it did not build: the
/// segments held, the deadlines (see [`RetiredStreams::adopt`]).
pub enum Adopt {
    /// `n` retired streams hold `segment`.
    Hold(SegmentNo, u32),
    /// One no longer holds what it held (it changed or was removed).
    Release(Retired),
    Abandon(StreamId, u64),
}

impl RetiredStreams {
    /// An empty tier hashing requests with `key`.
    pub fn with_key(key: RequestKey) -> Self {
        Self::with_base(key, Frozen::default())
    }

    /// The tier a checkpoint kept (its hashes made with `key`).
    pub fn with_base(key: RequestKey, base: Frozen) -> Self {
        Self {
            key,
            len: base.len(),
            base: Arc::new(base),
            sealed: None,
            fresh: Overlay::default(),
            base_front: 0,
            sealed_front: 0,
        }
    }

    pub fn key(&self) -> RequestKey {
        self.key
    }

    fn lookup(&self, id: &StreamId) -> Option<Slot> {
        match self.fresh.find(id) {
            Found::Here(slot) => Some(slot),
            Found::Gone => None,
            Found::Below => self.below_fresh(id),
        }
    }

    /// What the layers under the fresh one say of `id`.
    fn below_fresh(&self, id: &StreamId) -> Option<Slot> {
        if let Some(sealed) = &self.sealed {
            match sealed.find(id) {
                Found::Here(slot) => return Some(slot),
                Found::Gone => return None,
                Found::Below => {}
            }
        }
        let kept = self.base.get(id)?;
        Some(Slot {
            retired: kept.retired,
            abandon_at: kept.abandon_at,
            placed: 0,
        })
    }

    pub fn get(&self, id: &StreamId) -> Option<Retired> {
        self.lookup(id).map(|slot| slot.retired)
    }

    pub fn contains(&self, id: &StreamId) -> bool {
        self.lookup(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the base's stream `id` is still here (in its place).
    fn alive_in_base(&self, id: &StreamId) -> bool {
        !self.fresh.hides(id) && !self.sealed.as_ref().is_some_and(|s| s.hides(id))
    }

    fn alive_in_sealed(&self, sealed: &Overlay, id: &StreamId, place: u32) -> bool {
        sealed.stands(id, place) && !self.fresh.hides(id)
    }

    /// Every retired stream's id, each once.
    pub fn ids(&self) -> Vec<StreamId> {
        let mut ids: Vec<StreamId> = self
            .base
            .ids()
            .filter(|id| self.alive_in_base(id))
            .collect();
        if let Some(sealed) = &self.sealed {
            let placed = sealed.streams.iter().filter(|(_, s)| s.placed != 0);
            ids.extend(placed.map(|(id, _)| *id).filter(|id| !self.fresh.hides(id)));
        }
        let placed = self.fresh.streams.iter().filter(|(_, s)| s.placed != 0);
        ids.extend(placed.map(|(id, _)| *id));
        ids
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
        // Never twice: a stream retired again was taken back whole (or
        // forgotten, in recovery) first, so no lookup is spent on it here.
        debug_assert!(!self.contains(&id), "{id} retired twice");
        for request in requests {
            let key = self.request_key(retired.session, request);
            self.fresh.requests.insert(key, id);
        }
        retired.requests = requests.len().min(u16::MAX as usize) as u16;
        let placed = self.fresh.place(id);
        let listed = self.fresh.by_session.entry(retired.session);
        listed.or_default().insert(id);
        let slot = Slot {
            retired,
            abandon_at,
            placed,
        };
        self.fresh.streams.insert(id, slot);
        self.len += 1;
    }

    /// Removes a retired stream; gives it back with its abandonment
    /// deadline.
    pub fn remove(&mut self, id: &StreamId) -> Option<(Retired, Option<u64>)> {
        let slot = self.lookup(id)?;
        if let Some(here) = self.fresh.streams.remove(id) {
            if here.placed != 0 {
                self.fresh.stale += here.retired.requests as usize;
                self.fresh.unlist(here.retired.session, id);
            }
        }
        if self.below_fresh(id).is_some() {
            self.fresh.hidden.insert(*id);
        }
        self.len -= 1;
        if self.fresh.stale > self.fresh.streams.len() / 2 + 1024 {
            self.prune_stale_requests();
        }
        if self.fresh.order.len() > 2 * self.fresh.streams.len() + 1024 {
            let fresh = &mut self.fresh;
            let streams = &fresh.streams;
            let stands = |id: &StreamId, place| streams.get(id).is_some_and(|s| s.placed == place);
            fresh.order.retain(|(id, place)| stands(id, *place));
        }
        Some((slot.retired, slot.abandon_at))
    }

    /// Drops the fresh request entries naming removed streams; where one
    /// hid an older entry below, that entry stays withdrawn (a request
    /// answered by a stream since removed is not answered by an older one).
    fn prune_stale_requests(&mut self) {
        let dead: Vec<u64> = self
            .fresh
            .requests
            .iter()
            .filter(|(_, id)| self.lookup(id).is_none())
            .map(|(hash, _)| *hash)
            .collect();
        for hash in dead {
            self.fresh.requests.remove(&hash);
            if self.below_request(hash).is_some() {
                self.fresh.unindexed.insert(hash);
            }
        }
        self.fresh.stale = 0;
    }

    /// Changes a retired stream (its value and abandonment deadline) where
    /// it stands in the order; gives back what it was.
    pub fn update(
        &mut self,
        id: StreamId,
        change: impl FnOnce(&mut Retired, &mut Option<u64>),
    ) -> Option<(Retired, Option<u64>)> {
        let old = self.lookup(&id)?;
        let mut new = old;
        change(&mut new.retired, &mut new.abandon_at);
        match self.fresh.streams.get_mut(&id) {
            Some(slot) => *slot = new,
            None => {
                new.placed = 0;
                self.fresh.streams.insert(id, new);
            }
        }
        Some((old.retired, old.abandon_at))
    }

    /// The entry for `hash` below the fresh layer.
    fn below_request(&self, hash: u64) -> Option<StreamId> {
        match self.sealed.as_ref().and_then(|s| s.request(hash)) {
            Some(found) => found,
            None => self.base.request(hash),
        }
    }

    /// The retired stream answering `request` of `session`, if one does.
    pub fn answering(&self, session: SessionId, request: &RequestId) -> Option<StreamId> {
        let hash = self.request_key(session, request);
        let id = match self.fresh.request(hash) {
            Some(found) => found?,
            None => self.below_request(hash)?,
        };
        (self.get(&id)?.session == session).then_some(id)
    }

    /// Forgets which stream answers `request` of `session` (a newer one
    /// does now, outside this tier).
    pub fn unindex(&mut self, session: SessionId, request: &RequestId) {
        let hash = self.request_key(session, request);
        if self.fresh.requests.remove(&hash).is_some() {
            self.fresh.stale = self.fresh.stale.saturating_sub(1);
        }
        if self.below_request(hash).is_some() {
            self.fresh.unindexed.insert(hash);
        }
    }

    /// Skips the places at the front of each layer's order whose streams
    /// were removed since.
    fn drop_removed_front(&mut self) {
        while let Some(id) = self.base.ordered_id(self.base_front) {
            if self.alive_in_base(&id) {
                break;
            }
            self.base_front += 1;
        }
        if let Some(sealed) = self.sealed.clone() {
            while let Some((id, place)) = sealed.order.get(self.sealed_front) {
                if self.alive_in_sealed(&sealed, id, *place) {
                    break;
                }
                self.sealed_front += 1;
            }
        }
        while let Some((id, place)) = self.fresh.order.front() {
            if self.fresh.stands(id, *place) {
                break;
            }
            self.fresh.order.pop_front();
        }
    }

    /// The retired streams, oldest first.
    fn in_order(&self) -> impl Iterator<Item = (StreamId, Retired)> + '_ {
        let base = self
            .base
            .ordered_from(self.base_front)
            .filter(|id| self.alive_in_base(id));
        let sealed = self.sealed.iter().flat_map(move |sealed| {
            let placed = sealed.order.iter().skip(self.sealed_front);
            let alive = placed.filter(|(id, place)| self.alive_in_sealed(sealed, id, *place));
            alive.map(|(id, _)| *id)
        });
        let fresh = self.fresh.order.iter();
        let fresh = fresh.filter(|(id, place)| self.fresh.stands(id, *place));
        let fresh = fresh.map(|(id, _)| *id);
        base.chain(sealed)
            .chain(fresh)
            .filter_map(|id| Some((id, self.get(&id)?)))
    }

    /// Retired streams finished at or before `at_ms`, oldest first.
    pub fn finished_by(&mut self, at_ms: u64) -> Vec<StreamId> {
        self.drop_removed_front();
        self.in_order()
            .take_while(|(_, r)| r.finished_ms() <= at_ms)
            .map(|(id, _)| id)
            .collect()
    }

    /// The `n` oldest retired streams.
    pub fn oldest(&mut self, n: usize) -> Vec<StreamId> {
        self.drop_removed_front();
        self.in_order().take(n).map(|(id, _)| id).collect()
    }

    /// The retired streams of `session`.
    pub fn of_session(&self, session: SessionId) -> Vec<StreamId> {
        let mut ids: Vec<StreamId> = self.base.of_session(session);
        ids.retain(|id| self.alive_in_base(id));
        if let Some(sealed) = &self.sealed {
            if let Some(set) = sealed.by_session.get(&session) {
                let alive = set.iter().filter(|id| !self.fresh.hides(id));
                ids.extend(alive.filter(|id| sealed.streams.contains_key(id)));
            }
        }
        if let Some(set) = self.fresh.by_session.get(&session) {
            ids.extend(set.iter().filter(|id| self.fresh.streams.contains_key(id)));
        }
        ids
    }

    /// Seals the changes made so far, for a checkpoint at this point of the
    /// log to merge into the next frozen tier ([`merge`]) off the lock;
    /// lookups see the sealed layer until [`RetiredStreams::install`]. `None`
    /// while an earlier one is sealed.
    pub fn seal(&mut self) -> Option<(Arc<Frozen>, Arc<Overlay>)> {
        if self.sealed.is_some() {
            return None;
        }
        let sealed = Arc::new(std::mem::take(&mut self.fresh));
        self.sealed = Some(sealed.clone());
        self.sealed_front = 0;
        Some((self.base.clone(), sealed))
    }

    /// Whether a layer is sealed: a checkpoint's merge is under way, its
    /// tier still to be installed.
    pub fn is_sealed(&self) -> bool {
        self.sealed.is_some()
    }

    /// Makes `merged` (the base and the sealed layer, merged) the base.
    pub fn install(&mut self, merged: Arc<Frozen>) {
        self.base = merged;
        self.sealed = None;
        self.base_front = 0;
        self.sealed_front = 0;
    }

    /// Merges a sealed layer into its base at once (when no thread could
    /// be started for it).
    pub fn merge_sealed(&mut self) {
        if let Some(sealed) = self.sealed.clone() {
            self.install(Arc::new(merge(&self.base, &sealed)));
        }
    }

    /// What an index taking over this tier (as recovery left it: a
    /// checkpoint's base, the changes replayed after its cut) must count:
    /// the base's segments, the changes' releases and holds, every
    /// abandonment deadline.
    pub fn adopt(&self, mut each: impl FnMut(Adopt)) {
        for (segment, n) in self.base.segments() {
            each(Adopt::Hold(segment, n));
        }
        for kept in self.base.abandons() {
            if let (Found::Below, Some(at)) = (self.fresh.find(&kept.id), kept.abandon_at) {
                each(Adopt::Abandon(kept.id, at));
            }
        }
        let changed = self.fresh.hidden.iter().chain(
            (self.fresh.streams.iter())
                .filter(|(_, slot)| slot.placed == 0)
                .map(|(id, _)| id),
        );
        for id in changed {
            if let Some(kept) = self.base.get(id) {
                each(Adopt::Release(kept.retired));
            }
        }
        for (id, slot) in &self.fresh.streams {
            for segment in slot.retired.segments() {
                each(Adopt::Hold(segment, 1));
            }
            if let Some(at) = slot.abandon_at {
                each(Adopt::Abandon(*id, at));
            }
        }
    }
}

#[cfg(test)]
mod tests;
