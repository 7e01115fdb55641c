//! Merging a sealed layer into the frozen tier beneath it: the next frozen
//! tier, made off the journal's lock while a checkpoint is taken.
//!
//! Both sides are in order already — the tier's records by id, its session
//! list and request hashes sorted, its retirement order a list — so the
//! merge walks each of the tier's tables once, joins in the layer's few
//! entries (sorted on their own), and writes the new tier's sections
//! straight into its buffer. Beyond that buffer, only a map from old
//! positions to new (4 bytes a stream) is as large as the tier: sorting
//! the whole tier again took ~2 s and ~280 bytes a stream at a million
//! retired streams, beside the tier it replaces.

use std::ops::Range;

use super::super::segment::SegmentNo;
use super::frozen::{self, Frozen, RECORD};
use super::overlay::{Overlay, Slot};
use crate::id::{IdMap, SessionId, StreamId};

/// A base record the merge dropped.
const GONE: u32 = u32::MAX;

/// The next frozen tier: `base` with the `sealed` changes applied, in
/// retirement order (the base's streams first, then those retired in the
/// layer, in its order).
pub fn merge(base: &Frozen, sealed: &Overlay) -> Frozen {
    let mut added: Vec<(StreamId, Slot)> = (sealed.streams.iter())
        .filter(|(_, slot)| slot.placed != 0)
        .map(|(id, slot)| (*id, *slot))
        .collect();
    added.sort_unstable_by_key(|(id, _)| *id);
    let most = base.len() + added.len();
    let mut bytes = Vec::with_capacity(most * (RECORD + 2 * frozen::POSITION) + 4096);
    let (remap, added_at) = records(base, sealed, &added, &mut bytes);
    let records = 0..bytes.len();
    let order = section(&mut bytes, |out| {
        let kept = base.order_positions().filter_map(|old| remap.get(old));
        for &at in kept.filter(|&&at| at != GONE) {
            out.extend_from_slice(&at.to_le_bytes());
        }
        for (id, place) in &sealed.order {
            match added_at.get(id) {
                Some(at) if sealed.stands(id, *place) => out.extend_from_slice(&at.to_le_bytes()),
                _ => {}
            }
        }
    });
    let sessions = sessions(base, &remap, &added, &added_at, &mut bytes);
    let requests = requests(base, sealed, records.clone(), &mut bytes);
    let (segments, abandons) = counted(records.clone(), &mut bytes);
    Frozen::from_sections(
        bytes,
        [records, order, sessions, requests, segments, abandons],
    )
}

/// Appends what `write` writes to `bytes`; gives back where it went.
fn section(bytes: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) -> Range<usize> {
    let start = bytes.len();
    write(bytes);
    start..bytes.len()
}

/// Writes the records, by id: the base's (less those the layer removed,
/// with its changes) joined with those it `added`. Gives back each base
/// position's new one ([`GONE`] when dropped) and each added stream's.
fn records(
    base: &Frozen,
    sealed: &Overlay,
    added: &[(StreamId, Slot)],
    out: &mut Vec<u8>,
) -> (Vec<u32>, IdMap<StreamId, u32>) {
    let mut remap = vec![GONE; base.len()];
    let mut added_at = IdMap::with_capacity_and_hasher(added.len(), Default::default());
    let mut next = 0u32;
    let put = |out: &mut Vec<u8>, id: StreamId, slot: &Slot| {
        let kept = frozen::Kept {
            id,
            retired: slot.retired,
            abandon_at: slot.abandon_at,
        };
        frozen::put_record(out, &kept);
    };
    let mut new = added.iter().peekable();
    for (old, slot) in remap.iter_mut().enumerate() {
        let Some(record) = base.record(old) else {
            continue;
        };
        let Ok(raw) = <[u8; 16]>::try_from(&record[..16]) else {
            continue;
        };
        let id = StreamId(raw);
        while let Some((new_id, new_slot)) = new.next_if(|(new_id, _)| *new_id < id) {
            put(out, *new_id, new_slot);
            added_at.insert(*new_id, next);
            next += 1;
        }
        if sealed.hides(&id) {
            continue;
        }
        match sealed.streams.get(&id) {
            Some(change) if change.placed == 0 => put(out, id, change),
            // Retired again in the layer: written where it stands there.
            Some(_) => continue,
            None => out.extend_from_slice(record),
        }
        *slot = next;
        next += 1;
    }
    for (new_id, new_slot) in new {
        put(out, *new_id, new_slot);
        added_at.insert(*new_id, next);
        next += 1;
    }
    (remap, added_at)
}

/// Writes the session list: the base's, in its order, joined with the
/// added streams', by session.
fn sessions(
    base: &Frozen,
    remap: &[u32],
    added: &[(StreamId, Slot)],
    added_at: &IdMap<StreamId, u32>,
    bytes: &mut Vec<u8>,
) -> Range<usize> {
    let mut joined: Vec<(SessionId, u32)> = (added.iter())
        .filter_map(|(id, slot)| Some((slot.retired.session, *added_at.get(id)?)))
        .collect();
    joined.sort_unstable();
    let session_at = |bytes: &[u8], at: u32| -> Option<SessionId> {
        let start = at as usize * RECORD + 16;
        Some(SessionId(bytes.get(start..start + 16)?.try_into().ok()?))
    };
    let mut new = joined.into_iter().peekable();
    let start = bytes.len();
    for old in base.session_positions() {
        let Some(&at) = remap.get(old).filter(|&&at| at != GONE) else {
            continue;
        };
        let Some(session) = session_at(bytes, at) else {
            continue;
        };
        while let Some((_, new_at)) = new.next_if(|(s, _)| *s < session) {
            bytes.extend_from_slice(&new_at.to_le_bytes());
        }
        bytes.extend_from_slice(&at.to_le_bytes());
    }
    for (_, new_at) in new {
        bytes.extend_from_slice(&new_at.to_le_bytes());
    }
    start..bytes.len()
}

/// Writes the request index: the base's entries, less those the layer
/// withdrew, replaced, or whose stream it removed, joined with the layer's
/// own whose stream is in `records`, by hash.
fn requests(
    base: &Frozen,
    sealed: &Overlay,
    records: Range<usize>,
    bytes: &mut Vec<u8>,
) -> Range<usize> {
    let kept =
        |bytes: &[u8], id: &StreamId| frozen::position_in(&bytes[records.clone()], id).is_some();
    let mut joined: Vec<(u64, StreamId)> = (sealed.requests.iter())
        .filter(|(_, id)| kept(bytes, id))
        .map(|(hash, id)| (*hash, *id))
        .collect();
    joined.sort_unstable();
    let mut new = joined.into_iter().peekable();
    let start = bytes.len();
    let put = |bytes: &mut Vec<u8>, hash: u64, id: StreamId| {
        bytes.extend_from_slice(&hash.to_le_bytes());
        bytes.extend_from_slice(&id.0);
    };
    for (hash, id) in base.requests() {
        let replaced = sealed.unindexed.contains(&hash) || sealed.requests.contains_key(&hash);
        if replaced || sealed.hides(&id) {
            continue;
        }
        while let Some((new_hash, new_id)) = new.next_if(|(h, _)| *h < hash) {
            put(bytes, new_hash, new_id);
        }
        put(bytes, hash, id);
    }
    for (hash, id) in new {
        put(bytes, hash, id);
    }
    start..bytes.len()
}

/// Writes the segment counts and the abandonment list, read from the
/// merged records.
fn counted(records: Range<usize>, bytes: &mut Vec<u8>) -> (Range<usize>, Range<usize>) {
    let mut segments: IdMap<SegmentNo, u32> = IdMap::default();
    let mut abandons = Vec::new();
    for (at, record) in bytes[records].chunks_exact(RECORD).enumerate() {
        let Some(kept) = frozen::decode_record(record) else {
            continue;
        };
        for no in kept.retired.segments() {
            *segments.entry(no).or_default() += 1;
        }
        if kept.abandon_at.is_some() {
            abandons.push(at as u32);
        }
    }
    let mut segments: Vec<(SegmentNo, u32)> = segments.into_iter().collect();
    segments.sort_unstable();
    let segment_section = section(bytes, |out| {
        for (no, n) in segments {
            out.extend_from_slice(&no.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
    });
    let abandon_section = section(bytes, |out| {
        for at in abandons {
            out.extend_from_slice(&at.to_le_bytes());
        }
    });
    (segment_section, abandon_section)
}
