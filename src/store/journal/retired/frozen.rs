//! The frozen tier of retired streams: every retired stream as a
//! checkpoint's cut left it, in fixed-size records laid out so that each
//! question is a binary search — by stream id, by session, by request hash
//! — and the retirement order a list of positions.
//!
//! It is immutable. It is built once, off the journal's lock, by merging
//! the tier before it with the changes made up to a cut, and written into
//! the checkpoint as these very bytes; start-up reads them back and uses
//! them in place, so a restart builds no table for the streams retention
//! keeps (it used to insert every one into four maps: ~0.4 µs a stream).
//! What changed since the cut lives in an overlay (`overlay.rs`).
//!
//! This module knows the bytes; which record is alive is the overlay's
//! call, and none of this touches the disk.

use std::ops::Range;

use super::super::cursor::Cursor;
use super::super::segment::SegmentNo;
use super::{Place, Retired};
use crate::id::{SessionId, StreamId};

/// Stream, session, summary place (3 × 4), first segment, entries,
/// finished (2 × 4), requests, coalesced, has-abandon, abandon-at.
pub const RECORD: usize = 16 + 16 + 12 + 4 + 4 + 8 + 2 + 1 + 1 + 8;
/// A position (in the records) in the order or the session index.
pub const POSITION: usize = 4;
/// Hash, stream.
pub const REQUEST: usize = 8 + 16;
/// Segment, how many of the records hold it.
pub const SEGMENT: usize = 4 + 4;

/// How many of each a tier holds: what a checkpoint's header records, so
/// that its sections can be found again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub records: u64,
    pub requests: u64,
    pub segments: u64,
    pub abandons: u64,
}

/// One retired stream as a tier keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    pub id: StreamId,
    pub retired: Retired,
    pub abandon_at: Option<u64>,
}

/// The tier's bytes and where each section is in them.
pub struct Frozen {
    bytes: Vec<u8>,
    /// Sorted by stream id.
    records: Range<usize>,
    /// Positions, oldest finish first.
    order: Range<usize>,
    /// Positions, sorted by session.
    sessions: Range<usize>,
    /// Sorted by hash; at most one entry a hash.
    requests: Range<usize>,
    /// Each segment with how many records hold it.
    segments: Range<usize>,
    /// Positions of the records with an abandonment deadline.
    abandons: Range<usize>,
}

impl Default for Frozen {
    fn default() -> Self {
        Self::from_sections(Vec::new(), std::array::from_fn(|_| 0..0))
    }
}

impl Frozen {
    /// Builds a tier of `kept` (oldest finish first) and the request index's
    /// entries; those naming a stream not kept are dropped, and of two
    /// entries for one hash the later wins. Every table sorted anew: the
    /// reference the merge (`merge.rs`) is checked against.
    #[cfg(test)]
    pub fn build(kept: Vec<Kept>, requests: Vec<(u64, StreamId)>) -> Self {
        let mut by_id: Vec<(StreamId, u32)> = (0..kept.len() as u32)
            .map(|i| (kept[i as usize].id, i))
            .collect();
        by_id.sort_unstable();
        // Where each of `kept` lands among the sorted records.
        let mut position = vec![0u32; kept.len()];
        for (at, &(_, i)) in by_id.iter().enumerate() {
            position[i as usize] = at as u32;
        }
        let mut bytes = Vec::with_capacity(kept.len() * (RECORD + 2 * POSITION + REQUEST));
        let mut segments: crate::id::IdMap<SegmentNo, u32> = Default::default();
        let mut abandons = Vec::new();
        for (at, &(_, i)) in by_id.iter().enumerate() {
            let k = &kept[i as usize];
            put_record(&mut bytes, k);
            for no in k.retired.segments() {
                *segments.entry(no).or_default() += 1;
            }
            if k.abandon_at.is_some() {
                abandons.push(at as u32);
            }
        }
        let records = 0..bytes.len();
        for &at in &position {
            bytes.extend_from_slice(&at.to_le_bytes());
        }
        let order = records.end..bytes.len();
        let mut by_session: Vec<(SessionId, u32)> = by_id
            .iter()
            .enumerate()
            .map(|(at, &(_, i))| (kept[i as usize].retired.session, at as u32))
            .collect();
        by_session.sort_unstable();
        for (_, at) in by_session {
            bytes.extend_from_slice(&at.to_le_bytes());
        }
        let sessions = order.end..bytes.len();
        let mut requests: Vec<(u64, usize, StreamId)> = requests
            .into_iter()
            .enumerate()
            .filter(|(_, (_, id))| by_id.binary_search_by_key(id, |&(id, _)| id).is_ok())
            .map(|(n, (hash, id))| (hash, n, id))
            .collect();
        // The later of two entries for one hash is the one kept.
        requests.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        requests.dedup_by_key(|r| r.0);
        for (hash, _, id) in requests {
            bytes.extend_from_slice(&hash.to_le_bytes());
            bytes.extend_from_slice(&id.0);
        }
        let request_section = sessions.end..bytes.len();
        let mut segments: Vec<(SegmentNo, u32)> = segments.into_iter().collect();
        segments.sort_unstable();
        for (no, n) in segments {
            bytes.extend_from_slice(&no.to_le_bytes());
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        let segment_section = request_section.end..bytes.len();
        for at in abandons {
            bytes.extend_from_slice(&at.to_le_bytes());
        }
        let abandons = segment_section.end..bytes.len();
        let sections = [
            records,
            order,
            sessions,
            request_section,
            segment_section,
            abandons,
        ];
        Self::from_sections(bytes, sections)
    }

    /// A tier of sections laid out in `bytes` as [`Frozen::build`] and the
    /// merge write them, each range where it is.
    pub(super) fn from_sections(bytes: Vec<u8>, sections: [Range<usize>; 6]) -> Self {
        let [records, order, sessions, requests, segments, abandons] = sections;
        Self {
            bytes,
            records,
            order,
            sessions,
            requests,
            segments,
            abandons,
        }
    }

    /// A tier whose sections are `bytes[at..]` (the rest of a checkpoint
    /// read whole), of `counts`; `Err` when they do not fit exactly.
    pub fn from_bytes(bytes: Vec<u8>, at: usize, counts: Counts) -> Result<Self, String> {
        let mut next = at;
        let mut section = |n: u64, each: usize| -> Result<Range<usize>, String> {
            let len = usize::try_from(n)
                .ok()
                .and_then(|n| n.checked_mul(each))
                .ok_or("section size out of range")?;
            let end = next.checked_add(len).filter(|&end| end <= bytes.len());
            let range = next..end.ok_or("section past the end")?;
            next = range.end;
            Ok(range)
        };
        let records = section(counts.records, RECORD)?;
        let order = section(counts.records, POSITION)?;
        let sessions = section(counts.records, POSITION)?;
        let requests = section(counts.requests, REQUEST)?;
        let segments = section(counts.segments, SEGMENT)?;
        let abandons = section(counts.abandons, POSITION)?;
        if next != bytes.len() {
            return Err("bytes after the last section".into());
        }
        let sections = [records, order, sessions, requests, segments, abandons];
        Ok(Self::from_sections(bytes, sections))
    }

    /// Every byte it holds: its sections, and whatever came before them
    /// (a checkpoint's own, when it was read from one).
    pub fn buffer(&self) -> &[u8] {
        &self.bytes
    }

    /// The sections' bytes, as a checkpoint writes them after its own.
    pub fn sections(&self) -> &[u8] {
        &self.bytes[self.records.start..self.abandons.end]
    }

    pub fn counts(&self) -> Counts {
        let n = |r: &Range<usize>, each: usize| (r.len() / each) as u64;
        Counts {
            records: n(&self.records, RECORD),
            requests: n(&self.requests, REQUEST),
            segments: n(&self.segments, SEGMENT),
            abandons: n(&self.abandons, POSITION),
        }
    }

    /// How many retired streams it holds (removed ones included: what is
    /// alive is the overlay's to say).
    pub fn len(&self) -> usize {
        self.records.len() / RECORD
    }

    /// The bytes of the record at position `at`.
    pub(super) fn record(&self, at: usize) -> Option<&[u8]> {
        let start = self.records.start.checked_add(at.checked_mul(RECORD)?)?;
        let end = start + RECORD;
        (end <= self.records.end).then(|| &self.bytes[start..end])
    }

    fn id_at(&self, at: usize) -> Option<StreamId> {
        Some(StreamId(self.record(at)?[..16].try_into().ok()?))
    }

    /// The record at position `at` (in id order).
    pub fn at(&self, at: usize) -> Option<Kept> {
        decode_record(self.record(at)?)
    }

    /// The position of stream `id`'s record.
    pub fn position(&self, id: &StreamId) -> Option<usize> {
        position_in(&self.bytes[self.records.clone()], id)
    }

    pub fn get(&self, id: &StreamId) -> Option<Kept> {
        self.at(self.position(id)?)
    }

    fn position_in(&self, section: &Range<usize>, i: usize) -> Option<usize> {
        let start = section.start + i * POSITION;
        let bytes = self.bytes.get(start..start + POSITION)?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?) as usize)
    }

    /// The ids in retirement order (oldest finish first), from the `from`th.
    pub fn ordered_from(&self, from: usize) -> impl Iterator<Item = StreamId> + '_ {
        (from..self.len()).filter_map(|i| self.id_at(self.position_in(&self.order, i)?))
    }

    /// The record positions in retirement order.
    pub(super) fn order_positions(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter_map(|i| self.position_in(&self.order, i))
    }

    /// The record positions in session order.
    pub(super) fn session_positions(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter_map(|i| self.position_in(&self.sessions, i))
    }

    /// The id at place `i` of the retirement order.
    pub fn ordered_id(&self, i: usize) -> Option<StreamId> {
        (i < self.len()).then(|| self.id_at(self.position_in(&self.order, i)?))?
    }

    /// Every record, in retirement order.
    #[cfg(test)]
    pub fn ordered_kept(&self) -> impl Iterator<Item = Kept> + '_ {
        (0..self.len()).filter_map(|i| self.at(self.position_in(&self.order, i)?))
    }

    /// Every id, in id order.
    pub fn ids(&self) -> impl Iterator<Item = StreamId> + '_ {
        (0..self.len()).filter_map(|at| self.id_at(at))
    }

    /// The ids of `session`'s streams.
    pub fn of_session(&self, session: SessionId) -> Vec<StreamId> {
        let session_at = |i: usize| -> Option<SessionId> {
            let record = self.record(self.position_in(&self.sessions, i)?)?;
            Some(SessionId(record[16..32].try_into().ok()?))
        };
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let mid = low + (high - low) / 2;
            match session_at(mid) {
                Some(s) if s < session => low = mid + 1,
                _ => high = mid,
            }
        }
        (low..self.len())
            .map_while(|i| (session_at(i)? == session).then_some(i))
            .filter_map(|i| self.id_at(self.position_in(&self.sessions, i)?))
            .collect()
    }

    /// The stream the request index's entry for `hash` names.
    pub fn request(&self, hash: u64) -> Option<StreamId> {
        let entry = |i: usize| -> Option<(u64, StreamId)> {
            let start = self.requests.start + i * REQUEST;
            let mut c = Cursor::at(self.bytes.get(start..start + REQUEST)?, 0);
            Some((c.u64()?, StreamId(c.id()?)))
        };
        let hash_at = |i: usize| Some(entry(i)?.0);
        let order = |i: usize| Some(entry(i)?.0.cmp(&hash));
        let at = find(self.requests.len() / REQUEST, hash, hash_at, order)?;
        Some(entry(at)?.1)
    }

    /// The request index's entries.
    pub fn requests(&self) -> impl Iterator<Item = (u64, StreamId)> + '_ {
        self.bytes[self.requests.clone()]
            .chunks_exact(REQUEST)
            .filter_map(|chunk| {
                let mut c = Cursor::at(chunk, 0);
                Some((c.u64()?, StreamId(c.id()?)))
            })
    }

    /// Each segment its records hold, with how many hold it.
    pub fn segments(&self) -> impl Iterator<Item = (SegmentNo, u32)> + '_ {
        self.bytes[self.segments.clone()]
            .chunks_exact(SEGMENT)
            .filter_map(|chunk| {
                let mut c = Cursor::at(chunk, 0);
                Some((c.u32()?, c.u32()?))
            })
    }

    /// The records with an abandonment deadline.
    pub fn abandons(&self) -> impl Iterator<Item = Kept> + '_ {
        let n = self.abandons.len() / POSITION;
        (0..n).filter_map(|i| self.at(self.position_in(&self.abandons, i)?))
    }
}

/// The position of `id` among `records` (whole records, sorted by id).
pub(super) fn position_in(records: &[u8], id: &StreamId) -> Option<usize> {
    let id_at = |at: usize| records.get(at * RECORD..at * RECORD + 16);
    let key = |at: usize| Some(prefix(id_at(at)?));
    let order = |at: usize| Some(id_at(at)?.cmp(&id.0[..]));
    find(records.len() / RECORD, prefix(&id.0), key, order)
}

/// The first 8 bytes of an id as a number: ordered as the ids are.
pub(super) fn prefix(id: &[u8]) -> u64 {
    let mut head = [0u8; 8];
    head.copy_from_slice(&id[..8]);
    u64::from_be_bytes(head)
}

/// The place among `n` entries sorted by key whose key `order`s `Equal`.
/// The keys (random ids' prefixes, keyed hashes: `key`) are spread evenly
/// over `u64`, so each step guesses where `target` lies between the bounds
/// by interpolation: about two probes in a table of a million, where
/// halving takes twenty, each a cache miss (start-up's replay after a
/// checkpoint looks up every stream it meets). After a few guesses it
/// halves, so that a table that is not even costs at most a binary
/// search more.
pub(super) fn find(
    n: usize,
    target: u64,
    key: impl Fn(usize) -> Option<u64>,
    order: impl Fn(usize) -> Option<std::cmp::Ordering>,
) -> Option<usize> {
    // Every key in [low, high) lies within [low_key, high_key].
    let (mut low, mut high) = (0usize, n);
    let (mut low_key, mut high_key) = (0u64, u64::MAX);
    let mut guesses = 0;
    while low < high {
        let at = if guesses < 4 && high_key > low_key {
            guesses += 1;
            let span = (high - low - 1) as u128;
            let offset = u128::from(target.clamp(low_key, high_key) - low_key);
            low + (offset * span / u128::from(high_key - low_key)) as usize
        } else {
            low + (high - low) / 2
        };
        let found = key(at)?;
        match order(at)? {
            std::cmp::Ordering::Less => (low, low_key) = (at + 1, found),
            std::cmp::Ordering::Greater => (high, high_key) = (at, found),
            std::cmp::Ordering::Equal => return Some(at),
        }
    }
    None
}

/// One record's fixed bytes, assembled on the stack and appended at once.
pub(super) fn put_record(out: &mut Vec<u8>, k: &Kept) {
    let mut entry = [0u8; RECORD];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        entry[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    let r = &k.retired;
    put(&k.id.0);
    put(&r.session.0);
    for n in [
        r.summary.segment,
        r.summary.offset,
        r.summary.len,
        r.first_segment,
        r.entries,
        r.finished_ms[0],
        r.finished_ms[1],
    ] {
        put(&n.to_le_bytes());
    }
    put(&r.requests.to_le_bytes());
    put(&[u8::from(r.coalesced), u8::from(k.abandon_at.is_some())]);
    put(&k.abandon_at.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&entry);
}

/// A record's bytes (see [`put_record`]): exactly [`RECORD`] always decode.
pub(super) fn decode_record(chunk: &[u8]) -> Option<Kept> {
    let mut c = Cursor::at(chunk, 0);
    let id = StreamId(c.id()?);
    let session = SessionId(c.id()?);
    let summary = Place {
        segment: c.u32()?,
        offset: c.u32()?,
        len: c.u32()?,
    };
    let retired = Retired {
        session,
        summary,
        first_segment: c.u32()?,
        entries: c.u32()?,
        finished_ms: [c.u32()?, c.u32()?],
        requests: c.u16()?,
        coalesced: c.byte()? != 0,
    };
    let has_abandon = c.byte()? != 0;
    let abandon_at = c.u64()?;
    Some(Kept {
        id,
        retired,
        abandon_at: has_abandon.then_some(abandon_at),
    })
}
