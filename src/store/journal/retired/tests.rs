//! The retired tier answers as one set however its streams are spread over
//! the frozen tier and the layers above it.

use std::collections::HashMap;

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

/// Seals the fresh layer and merges it into the base, as a checkpoint does;
/// checks the merge against building the tier from scratch.
fn checkpoint(tier: &mut RetiredStreams) {
    let (base, sealed) = tier.seal().expect("nothing sealed yet");
    let merged = merge(&base, &sealed);
    same_tier(&merged, &rebuilt(&base, &sealed));
    tier.install(Arc::new(merged));
}

/// The next tier as [`Frozen::build`] makes it, every stream sorted anew:
/// what the merge must give.
fn rebuilt(base: &Frozen, sealed: &Overlay) -> Frozen {
    let mut kept = Vec::new();
    for k in base.ordered_kept() {
        if sealed.hides(&k.id) {
            continue;
        }
        kept.push(match sealed.streams.get(&k.id) {
            Some(slot) => Kept {
                id: k.id,
                retired: slot.retired,
                abandon_at: slot.abandon_at,
            },
            None => k,
        });
    }
    for (id, place) in &sealed.order {
        if let Some(slot) = sealed.streams.get(id).filter(|s| s.placed == *place) {
            kept.push(Kept {
                id: *id,
                retired: slot.retired,
                abandon_at: slot.abandon_at,
            });
        }
    }
    let below = base.requests().filter(|(hash, _)| {
        !sealed.unindexed.contains(hash) && !sealed.requests.contains_key(hash)
    });
    let requests = below.chain(sealed.requests.iter().map(|(h, id)| (*h, *id)));
    Frozen::build(kept, requests.collect())
}

fn same_tier(merged: &Frozen, built: &Frozen) {
    assert_eq!(merged.counts(), built.counts());
    let all = |f: &Frozen| f.ordered_kept().collect::<Vec<_>>();
    assert_eq!(all(merged), all(built), "records, in order");
    assert_eq!(
        merged.ids().collect::<Vec<_>>(),
        built.ids().collect::<Vec<_>>()
    );
    let requests = |f: &Frozen| f.requests().collect::<Vec<_>>();
    assert_eq!(requests(merged), requests(built));
    let segments = |f: &Frozen| f.segments().collect::<Vec<_>>();
    assert_eq!(segments(merged), segments(built));
    let abandons = |f: &Frozen| f.abandons().collect::<Vec<_>>();
    assert_eq!(abandons(merged), abandons(built));
    let sessions: std::collections::HashSet<SessionId> =
        built.ordered_kept().map(|k| k.retired.session).collect();
    for session in sessions {
        let mut of = merged.of_session(session);
        let mut expected = built.of_session(session);
        of.sort();
        expected.sort();
        assert_eq!(of, expected, "session's streams");
    }
}

#[test]
fn a_retired_stream_costs_at_most_48_bytes_of_map_value() {
    assert!(std::mem::size_of::<Retired>() <= 48);
    assert_eq!(retired(SessionId::random(), 1 << 40).finished_ms(), 1 << 40);
}

#[test]
fn a_request_finds_its_stream_only_in_its_own_session() {
    for frozen in [false, true] {
        let mut tier = RetiredStreams::default();
        let (mine, other) = (SessionId::random(), SessionId::random());
        let id = StreamId::random();
        let request = RequestId("7".into());
        tier.insert(id, retired(mine, 1), &[&request], None);
        if frozen {
            checkpoint(&mut tier);
        }
        assert_eq!(tier.answering(mine, &request), Some(id));
        assert_eq!(tier.answering(other, &request), None);
        tier.remove(&id);
        assert_eq!(tier.answering(mine, &request), None, "removed");
    }
}

#[test]
fn the_oldest_finished_come_first_and_removed_ones_never() {
    let mut tier = RetiredStreams::default();
    let session = SessionId::random();
    let ids: Vec<StreamId> = (0..6).map(|_| StreamId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        tier.insert(*id, retired(session, 10_000 * i as u64), &[], None);
        if i == 2 {
            checkpoint(&mut tier);
        }
    }
    tier.remove(&ids[0]);
    tier.remove(&ids[3]);
    assert_eq!(tier.oldest(3), vec![ids[1], ids[2], ids[4]]);
    assert_eq!(tier.finished_by(40_000), vec![ids[1], ids[2], ids[4]]);
}

#[test]
fn a_stream_removed_and_retired_again_comes_once_in_its_new_place() {
    let mut tier = RetiredStreams::default();
    let session = SessionId::random();
    let (a, b) = (StreamId::random(), StreamId::random());
    tier.insert(a, retired(session, 1), &[], None);
    tier.insert(b, retired(session, 2), &[], None);
    tier.remove(&a);
    tier.insert(a, retired(session, 3), &[], None);
    assert_eq!(tier.oldest(5), vec![b, a]);
    checkpoint(&mut tier);
    assert_eq!(tier.oldest(5), vec![b, a]);
    assert_eq!(tier.len(), 2);
    assert_eq!(tier.ids().len(), 2);
}

#[test]
fn stale_request_entries_are_pruned_once_they_pile_up() {
    let mut tier = RetiredStreams::default();
    let session = SessionId::random();
    for i in 0..5000 {
        let id = StreamId::random();
        let request = RequestId(i.to_string().into());
        tier.insert(id, retired(session, i as u64), &[&request], Some(1));
        tier.remove(&id);
    }
    assert!(
        tier.fresh.requests.len() <= 1025,
        "{}",
        tier.fresh.requests.len()
    );
    assert!(tier.fresh.order.len() <= 1025, "{}", tier.fresh.order.len());
    assert!(tier.fresh.streams.is_empty());
}

#[test]
fn a_frozen_request_entry_naming_a_stream_not_kept_is_dropped() {
    let session = SessionId::random();
    let (kept, gone) = (StreamId::random(), StreamId::random());
    let one = Kept {
        id: kept,
        retired: retired(session, 1),
        abandon_at: None,
    };
    let frozen = Frozen::build(vec![one], vec![(1, kept), (2, gone)]);
    assert_eq!(frozen.requests().collect::<Vec<_>>(), vec![(1, kept)]);
}

/// The tier as a plain model: what it must answer, whatever its layers.
#[derive(Default)]
struct Model {
    streams: HashMap<StreamId, (Retired, Option<u64>)>,
    order: Vec<StreamId>,
    requests: HashMap<(SessionId, String), StreamId>,
}

/// A small deterministic generator (xorshift), so that a failure repeats.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn the_layers_answer_as_one_set_through_changes_seals_and_merges() {
    let mut dice = Dice(0x9e37_79b9_7f4a_7c15);
    let sessions: Vec<SessionId> = (0..3).map(|_| SessionId::random()).collect();
    let mut tier = RetiredStreams::default();
    let mut model = Model::default();
    let mut known: Vec<StreamId> = Vec::new();
    let mut asked: HashMap<StreamId, (SessionId, String)> = HashMap::new();
    let mut sealed: Option<(Arc<Frozen>, Arc<Overlay>)> = None;
    for step in 0..4000u64 {
        match dice.roll(10) {
            0..=3 => {
                // Retire a new stream, or one removed before (thawed).
                let id = match (dice.roll(4), known.is_empty()) {
                    (0, false) => known[dice.roll(known.len() as u64) as usize],
                    _ => StreamId::random(),
                };
                if model.streams.contains_key(&id) {
                    continue;
                }
                // A stream's session and request never change.
                let fresh = (sessions[dice.roll(3) as usize], dice.roll(50).to_string());
                let (session, request) = asked.entry(id).or_insert(fresh).clone();
                let abandon = (dice.roll(5) == 0).then_some(step);
                let r = retired(session, step);
                tier.insert(id, r, &[&RequestId(request.as_str().into())], abandon);
                let mut r = r;
                r.requests = 1;
                model.streams.insert(id, (r, abandon));
                model.order.push(id);
                model.requests.insert((session, request), id);
                known.push(id);
            }
            4..=5 if !known.is_empty() => {
                let id = known[dice.roll(known.len() as u64) as usize];
                let removed = tier.remove(&id);
                assert_eq!(removed, model.streams.remove(&id), "step {step}");
                model.order.retain(|o| *o != id);
                model.requests.retain(|_, answering| *answering != id);
            }
            6 if !known.is_empty() => {
                let id = known[dice.roll(known.len() as u64) as usize];
                let before = tier.update(id, |r, abandon| {
                    r.entries += 1;
                    *abandon = Some(step);
                });
                assert_eq!(before, model.streams.get(&id).copied(), "step {step}");
                if let Some((r, abandon)) = model.streams.get_mut(&id) {
                    r.entries += 1;
                    *abandon = Some(step);
                }
            }
            7 => {
                let session = sessions[dice.roll(3) as usize];
                let request = dice.roll(50).to_string();
                tier.unindex(session, &RequestId(request.as_str().into()));
                model.requests.remove(&(session, request));
            }
            8 if sealed.is_none() => sealed = tier.seal(),
            _ => {
                if let Some((base, overlay)) = sealed.take() {
                    let merged = merge(&base, &overlay);
                    same_tier(&merged, &rebuilt(&base, &overlay));
                    tier.install(Arc::new(merged));
                }
            }
        }
        if step % 97 == 0 || step > 3900 {
            agree(&mut tier, &model, &known, &sessions, step);
        }
    }
}

fn agree(
    tier: &mut RetiredStreams,
    model: &Model,
    known: &[StreamId],
    sessions: &[SessionId],
    step: u64,
) {
    assert_eq!(tier.len(), model.streams.len(), "len at step {step}");
    for id in known {
        let got = tier.lookup(id).map(|s| (s.retired, s.abandon_at));
        assert_eq!(got, model.streams.get(id).copied(), "{id} at step {step}");
    }
    let mut ids = tier.ids();
    ids.sort();
    let mut expected: Vec<StreamId> = model.streams.keys().copied().collect();
    expected.sort();
    assert_eq!(ids, expected, "ids at step {step}");
    assert_eq!(tier.oldest(usize::MAX), model.order, "order at step {step}");
    for session in sessions {
        let mut of = tier.of_session(*session);
        of.sort();
        let mut expected: Vec<StreamId> = model
            .streams
            .iter()
            .filter(|(_, (r, _))| r.session == *session)
            .map(|(id, _)| *id)
            .collect();
        expected.sort();
        assert_eq!(of, expected, "session's streams at step {step}");
        for n in 0..50 {
            let request = RequestId(n.to_string().into());
            let expected = model
                .requests
                .get(&(*session, n.to_string()))
                .filter(|id| model.streams.contains_key(id))
                .copied();
            assert_eq!(
                tier.answering(*session, &request),
                expected,
                "request {n} at step {step}"
            );
        }
    }
}

#[test]
fn a_frozen_tier_finds_every_stream_and_request_it_holds_and_nothing_else() {
    let session = SessionId::random();
    // Even ids, and ids bunched at one end (a table that is not even).
    let mut ids: Vec<StreamId> = (0..3000).map(|_| StreamId::random()).collect();
    ids.extend((0..300u16).map(|i| {
        let mut id = [0xff; 16];
        id[14..].copy_from_slice(&i.to_be_bytes());
        StreamId(id)
    }));
    let kept = ids.iter().map(|id| Kept {
        id: *id,
        retired: retired(session, 1),
        abandon_at: None,
    });
    let requests = ids.iter().enumerate().map(|(i, id)| (i as u64 * 7919, *id));
    let frozen = Frozen::build(kept.collect(), requests.collect());
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(frozen.get(id).map(|k| k.id), Some(*id));
        assert_eq!(frozen.request(i as u64 * 7919), Some(*id));
        assert_eq!(frozen.request(i as u64 * 7919 + 1), None);
    }
    for _ in 0..1000 {
        assert!(frozen.get(&StreamId::random()).is_none());
    }
    assert_eq!(frozen.request(u64::MAX), None);
}
