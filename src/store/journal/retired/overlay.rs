//! A layer of changes over the frozen tier (`frozen.rs`): the streams
//! retired, changed or removed since its cut, and the request index's
//! entries made or withdrawn since.
//!
//! Layers stack: the one being written (`fresh`) over, while a checkpoint
//! merges it into the next frozen tier, the one sealed at its cut, over the
//! frozen tier. A layer answers for an id with its own value, with "gone"
//! (removed here: nothing below counts), or not at all (ask below). It
//! knows nothing of the layers around it; `mod.rs` walks them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;

use super::Retired;
use crate::id::{IdHasher, IdMap, IdSet, SessionId, StreamId};

/// Request hashes are keyed hashes already: their bits are used as they are.
pub type HashMapU64<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
pub type HashSetU64 = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// A stream's value in a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub retired: Retired,
    pub abandon_at: Option<u64>,
    /// Its place in this layer's order when it retired in this layer (a
    /// stream removed and retired again has a new one); 0 for a change to
    /// one retired below, which keeps its place there.
    pub placed: u32,
}

/// What a layer says of an id.
pub enum Found {
    Here(Slot),
    /// Removed in this layer: whatever is below is gone.
    Gone,
    /// Not touched here.
    Below,
}

#[derive(Default)]
pub struct Overlay {
    pub streams: IdMap<StreamId, Slot>,
    /// Ids whose value and place below are gone (removed here, and maybe
    /// retired here again since).
    pub hidden: IdSet<StreamId>,
    /// Retired here, oldest first, each with its place; may name ids
    /// since removed (or placed again later).
    pub order: VecDeque<(StreamId, u32)>,
    /// The last place given.
    pub places: u32,
    /// Streams retired here, per session (for session deletion).
    pub by_session: IdMap<SessionId, IdSet<StreamId>>,
    /// Keyed hash of (session, request id) → stream, made here.
    pub requests: HashMapU64<StreamId>,
    /// Hashes whose entries below no longer count.
    pub unindexed: HashSetU64,
    /// Entries of `requests` (at most) naming streams since removed.
    pub stale: usize,
}

impl Overlay {
    pub fn find(&self, id: &StreamId) -> Found {
        match self.streams.get(id) {
            Some(slot) => Found::Here(*slot),
            None if self.hidden.contains(id) => Found::Gone,
            None => Found::Below,
        }
    }

    /// Whether what is below about `id` (its value and place) is gone.
    pub fn hides(&self, id: &StreamId) -> bool {
        self.hidden.contains(id)
    }

    /// What this layer's request index says of `hash`: `Some(Some(id))` an
    /// entry, `Some(None)` withdrawn, `None` ask below.
    pub fn request(&self, hash: u64) -> Option<Option<StreamId>> {
        match self.requests.get(&hash) {
            Some(id) => Some(Some(*id)),
            None if self.unindexed.contains(&hash) => Some(None),
            None => None,
        }
    }

    /// Whether `id` still stands at `place` of this layer's order: not
    /// removed since, nor placed again.
    pub fn stands(&self, id: &StreamId, place: u32) -> bool {
        place != 0
            && self
                .streams
                .get(id)
                .is_some_and(|slot| slot.placed == place)
    }

    /// The next place at the young end of the order.
    pub fn place(&mut self, id: StreamId) -> u32 {
        self.places += 1;
        self.order.push_back((id, self.places));
        self.places
    }

    pub fn unlist(&mut self, session: SessionId, id: &StreamId) {
        if let Some(set) = self.by_session.get_mut(&session) {
            set.remove(id);
            if set.is_empty() {
                self.by_session.remove(&session);
            }
        }
    }
}
