//! The journal's in-memory index: every session, stream and task record, and
//! where each entry's bytes sit on disk.
//!
//! The index is the journal's source of truth for *metadata* (recovery
//! rebuilds it by replaying every segment's records), while entries stay on
//! disk and are found through a [`Loc`] per entry. It also keeps the
//! accounting that decides when a segment file may be deleted or compacted
//! ([`Holdings`]). It performs no I/O.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use tokio::sync::watch;

use super::holdings::{Holding, Holdings, Object};
use super::retired::{Adopt, Place, Retired, RetiredStreams};
use super::segment::{Loc, SegmentNo};
use super::summary::Summary;

use crate::id::{IdMap, IdSet, Seq, SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
use crate::store::{
    Change, Finish, SessionRecord, StreamMeta, TaskRecord, UpstreamMark, Watermark,
};

pub struct StreamState {
    pub meta: StreamMeta,
    /// Entry `seq` is at `locs[seq - 1]`.
    pub locs: Vec<Loc>,
    /// Moved only once the entries below it are durable (see `Store`).
    pub watermark: Arc<watch::Sender<Watermark>>,
    /// Segments holding this stream's entries (each once).
    pub segments: Vec<SegmentNo>,
}

impl StreamState {
    /// The metadata readers see (see [`StreamMeta::as_of`]).
    pub fn visible(&self) -> StreamMeta {
        self.meta.clone().as_of(&self.watermark.borrow())
    }

    pub fn new(mut meta: StreamMeta, locs: Vec<Loc>) -> Self {
        // Counts are the locations' (a snapshot's copy may be older).
        meta.entries = locs.len() as Seq;
        meta.bytes = locs.iter().map(|l| l.len as u64).sum();
        let watermark = Arc::new(watch::Sender::new(meta.watermark()));
        Self {
            meta,
            locs,
            watermark,
            segments: Vec::new(),
        }
    }
}

#[derive(Default)]
pub struct Index {
    pub sessions: IdMap<SessionId, SessionRecord>,
    pub streams: IdMap<StreamId, StreamState>,
    pub tasks: IdMap<TaskId, TaskRecord>,
    /// Whole streams per session, for `streams_of_session` and session
    /// deletion (the retired tier lists its own).
    /// A set: every task leg has the one session [`SessionId::TASKS`], and
    /// removing one of thousands must not walk them all.
    by_session: IdMap<SessionId, IdSet<StreamId>>,
    /// What each segment holds that is still needed.
    holdings: Holdings,
    /// (session, request id) → the newest stream answering it.
    by_request: HashMap<(SessionId, RequestId), StreamId>,
    /// Abandonment deadlines, soonest first.
    abandon_at: BTreeSet<(u64, StreamId)>,
    /// When finished streams finished, oldest first (retention). Task legs
    /// are not in it: they are deleted with their task.
    finished_at: BTreeSet<(u64, StreamId)>,
    /// Finished streams kept compact, their rest on disk (`retired.rs`).
    pub retired: RetiredStreams,
    /// Streams that left `Live`, not retired yet, oldest first: retired
    /// once their finish is durable. May name streams since retired or
    /// gone.
    finishing: VecDeque<StreamId>,
    /// When tasks expire (`expires_ms`), soonest first.
    task_expiry: BTreeSet<(u64, TaskId)>,
    /// Sessions by the `last_seen_ms` of their record, and the closed ones
    /// by `closed_ms`, oldest first: the sweeper asks for the idle ones
    /// every `sweep_secs` and must not read them all.
    seen_at: BTreeSet<(u64, SessionId)>,
    closed_at: BTreeSet<(u64, SessionId)>,
}

impl Index {
    /// An index with room for `streams` streams, as recovery knows it will
    /// hold: its largest tables are allocated once at their final size
    /// instead of doubled and copied while they fill, page faults included.
    pub fn with_capacity(streams: usize) -> Self {
        Self {
            streams: IdMap::with_capacity_and_hasher(streams, Default::default()),
            by_request: HashMap::with_capacity(streams),
            ..Self::default()
        }
    }

    /// Adds a stream whose full record is in segment `record`.
    pub fn add_stream(&mut self, state: StreamState, record: SegmentNo) {
        let id = state.meta.id;
        self.by_session
            .entry(state.meta.session)
            .or_default()
            .insert(id);
        self.holdings.record(Object::Stream(id), record);
        self.holdings.add_entries(id, &state.locs);
        let mut state = state;
        state.segments = distinct_segments(&state.locs);
        let meta = &state.meta;
        for request in &meta.origin_ids {
            // Recovery adds streams in no particular order: the newest one
            // answering a reused id wins by creation time.
            let key = (meta.session, request.clone());
            let newer = match self.by_request.get(&key).and_then(|s| self.streams.get(s)) {
                Some(known) => known.meta.created_ms <= meta.created_ms,
                None => true,
            };
            if newer {
                if self.retired.len() > 0 {
                    self.retired.unindex(meta.session, request);
                }
                self.by_request.insert(key, id);
            }
        }
        self.index_deadlines(id, Deadlines::default(), Deadlines::of(meta));
        if Deadlines::of(meta).finished.is_some() {
            self.finishing.push_back(id);
        }
        self.streams.insert(id, state);
    }

    /// Keeps the deadline sets in step with a stream's deadlines.
    fn index_deadlines(&mut self, id: StreamId, before: Deadlines, after: Deadlines) {
        if before == after {
            return;
        }
        if let Some(at) = before.abandon_at {
            self.abandon_at.remove(&(at, id));
        }
        if let Some(at) = before.finished {
            self.finished_at.remove(&(at, id));
        }
        if let Some(at) = after.abandon_at {
            self.abandon_at.insert((at, id));
        }
        if let Some(at) = after.finished {
            self.finished_at.insert((at, id));
        }
    }

    /// Changes one stream's metadata and re-indexes its deadlines. (Under
    /// the journal's lock: only the two deadlines are compared, nothing of
    /// the metadata is copied.)
    fn edit(&mut self, stream: StreamId, edit: impl FnOnce(&mut StreamMeta)) {
        let Some(state) = self.streams.get_mut(&stream) else {
            return;
        };
        let before = Deadlines::of(&state.meta);
        edit(&mut state.meta);
        let after = Deadlines::of(&state.meta);
        self.index_deadlines(stream, before, after);
    }

    pub fn apply(&mut self, stream: StreamId, change: &Change) {
        self.edit(stream, |meta| meta.apply(change));
    }

    pub fn stream_of_request(&self, session: SessionId, id: &RequestId) -> Option<StreamId> {
        let whole = self.by_request.get(&(session, id.clone())).copied();
        whole.or_else(|| self.retired.answering(session, id))
    }

    /// The segment `object`'s full record is in.
    pub fn home_of(&self, object: Object) -> Option<SegmentNo> {
        self.holdings.home_of(object)
    }

    /// Whether the stream exists, whole or retired.
    pub fn has_stream(&self, id: &StreamId) -> bool {
        self.streams.contains_key(id) || self.retired.contains(id)
    }

    pub fn abandoned_by(&self, now_ms: u64) -> Vec<StreamId> {
        self.abandon_at
            .range(..=(now_ms, StreamId([0xff; 16])))
            .map(|(_, id)| *id)
            .collect()
    }

    pub fn finished_by(&mut self, at_ms: u64) -> Vec<StreamId> {
        let mut due: Vec<StreamId> = self
            .finished_at
            .range(..=(at_ms, StreamId([0xff; 16])))
            .map(|(_, id)| *id)
            .collect();
        due.extend(self.retired.finished_by(at_ms));
        due
    }

    /// Records that `locs` were appended to `stream` (already written).
    pub fn push_locs(&mut self, stream: StreamId, locs: &[Loc]) {
        let Some(state) = self.streams.get_mut(&stream) else {
            return;
        };
        for loc in locs {
            if !state.segments.contains(&loc.segment) {
                state.segments.push(loc.segment);
            }
            state.meta.bytes += loc.len as u64;
        }
        self.holdings.add_entries(stream, locs);
        state.locs.extend_from_slice(locs);
        state.meta.entries = state.locs.len() as Seq;
    }

    /// Points entries `start + 1 ..` of `stream` at new locations (copies
    /// written elsewhere). Segments left holding nothing are found by
    /// `in_use` when the journal next drops unused files.
    pub fn move_locs(&mut self, stream: StreamId, start: usize, locs: &[Loc]) {
        let Some(state) = self.streams.get_mut(&stream) else {
            return;
        };
        let Some(slots) = state.locs.get_mut(start..start + locs.len()) else {
            return;
        };
        let old: Vec<Loc> = slots.to_vec();
        slots.copy_from_slice(locs);
        state.segments = distinct_segments(&state.locs);
        self.holdings.add_entries(stream, locs);
        self.holdings.drop_entries(stream, &old, &state.segments);
    }

    /// Notes that an object's full record was written again, to `segment`.
    pub fn rewrote(&mut self, object: Object, segment: SegmentNo) {
        let exists = match object {
            Object::Session(id) => self.sessions.contains_key(&id),
            Object::Stream(id) => self.streams.contains_key(&id),
            Object::Task(id) => self.tasks.contains_key(&id),
        };
        if exists {
            self.holdings.record(object, segment);
        }
    }

    pub fn set_upstream(&mut self, stream: StreamId, mark: UpstreamMark) {
        if let Some(state) = self.streams.get_mut(&stream) {
            state.meta.upstream = Some(mark);
        }
    }

    pub fn set_status(&mut self, stream: StreamId, end: &Finish) {
        self.edit(stream, |meta| meta.finish(end));
        // Retention's deadline is set: it may retire (a task leg never).
        let due = self.streams.get(&stream).map(|s| Deadlines::of(&s.meta));
        if due.is_some_and(|due| due.finished.is_some()) {
            self.finishing.push_back(stream);
        }
    }

    /// Forgets a stream; its readers learn it is over. Returns the segments
    /// it left holding nothing (candidates for deletion).
    pub fn remove_stream(&mut self, id: StreamId) -> Vec<SegmentNo> {
        if let Some((retired, abandon_at)) = self.retired.remove(&id) {
            if let Some(at) = abandon_at {
                self.abandon_at.remove(&(at, id));
            }
            self.unlist_stream(retired.session, id);
            return self.holdings.release(retired.segments());
        }
        let Some(state) = self.streams.remove(&id) else {
            return Vec::new();
        };
        state.watermark.send_modify(|w| w.finished = true);
        let meta = &state.meta;
        for request in &meta.origin_ids {
            let key = (meta.session, request.clone());
            if self.by_request.get(&key) == Some(&id) {
                self.by_request.remove(&key);
            }
        }
        self.index_deadlines(id, Deadlines::of(meta), Deadlines::default());
        self.unlist_stream(meta.session, id);
        self.holdings.drop_entries(id, &state.locs, &[]);
        let mut unused = state.segments;
        unused.extend(self.holdings.forget(Object::Stream(id)));
        unused.retain(|&s| !self.holdings.in_use(s));
        unused
    }

    fn unlist_stream(&mut self, session: SessionId, id: StreamId) {
        if let Some(list) = self.by_session.get_mut(&session) {
            list.remove(&id);
            if list.is_empty() {
                self.by_session.remove(&session);
            }
        }
    }

    /// Creates or replaces a session record, written whole to `segment`.
    pub fn put_session(&mut self, session: SessionRecord, segment: SegmentNo) {
        self.holdings.record(Object::Session(session.id), segment);
        self.seen_at.insert((session.last_seen_ms, session.id));
        if let Some(at) = session.closed_ms {
            self.closed_at.insert((at, session.id));
        }
        if let Some(old) = self.sessions.insert(session.id, session) {
            self.unlist_session(&old);
        }
    }

    pub fn remove_session(&mut self, id: SessionId) {
        self.holdings.forget(Object::Session(id));
        if let Some(old) = self.sessions.remove(&id) {
            self.unlist_session(&old);
        }
    }

    /// Takes a replaced or removed record out of the ordered sets, unless
    /// the record now in place is listed under the same time.
    fn unlist_session(&mut self, old: &SessionRecord) {
        let now = self.sessions.get(&old.id);
        if now.map(|s| s.last_seen_ms) != Some(old.last_seen_ms) {
            self.seen_at.remove(&(old.last_seen_ms, old.id));
        }
        if let Some(at) = old.closed_ms {
            if now.and_then(|s| s.closed_ms) != Some(at) {
                self.closed_at.remove(&(at, old.id));
            }
        }
    }

    /// Sessions last seen at or before `seen_by_ms` or closed at or before
    /// `closed_by_ms`, each once.
    pub fn sessions_idle_by(&self, seen_by_ms: u64, closed_by_ms: u64) -> Vec<SessionRecord> {
        let seen = self.seen_at.range(..=(seen_by_ms, SessionId([0xff; 16])));
        let closed = self
            .closed_at
            .range(..=(closed_by_ms, SessionId([0xff; 16])));
        let ids: IdSet<SessionId> = seen.chain(closed).map(|&(_, id)| id).collect();
        ids.into_iter()
            .filter_map(|id| self.sessions.get(&id).cloned())
            .collect()
    }

    /// The session's streams, in no particular order.
    pub fn streams_of(&self, session: SessionId) -> Vec<StreamId> {
        let mut ids = self.retired.of_session(session);
        if let Some(set) = self.by_session.get(&session) {
            ids.extend(set.iter().copied());
        }
        ids
    }

    /// Creates or replaces a task record, written whole to `segment`,
    /// moving its expiry.
    pub fn put_task(&mut self, task: TaskRecord, segment: SegmentNo) {
        self.holdings.record(Object::Task(task.id), segment);
        if let Some(old) = self.tasks.get(&task.id) {
            self.task_expiry.remove(&(old.expires_ms(), old.id));
        }
        self.task_expiry.insert((task.expires_ms(), task.id));
        self.tasks.insert(task.id, task);
    }

    /// Forgets a task record (its legs are the caller's to remove).
    pub fn remove_task(&mut self, id: TaskId) -> Option<TaskRecord> {
        let task = self.tasks.remove(&id)?;
        self.holdings.forget(Object::Task(id));
        self.task_expiry.remove(&(task.expires_ms(), id));
        Some(task)
    }

    pub fn tasks_expired_by(&self, now_ms: u64) -> Vec<TaskId> {
        self.task_expiry
            .range(..=(now_ms, TaskId([0xff; 16])))
            .map(|(_, id)| *id)
            .collect()
    }

    /// Whether `segment` still holds entries or a full record of something
    /// that exists.
    pub fn in_use(&self, segment: SegmentNo) -> bool {
        self.holdings.in_use(segment)
    }

    /// What `segment` still holds (`None`: nothing).
    pub fn holding(&self, segment: SegmentNo) -> Option<&Holding> {
        self.holdings.of(segment)
    }
}

/// Retirement: finished streams leave the index whole for the compact
/// tier once their finish is durable, and come back whole if they change
/// in a way only a whole stream can (appended to, made live again).
impl Index {
    /// Up to `limit` streams waiting to retire whose finish is durable (the
    /// watermark says so: a reader shown a retired stream must never be
    /// shown more than a crash would leave) and that nobody is subscribed
    /// to. The others wait for a later call; task legs and live streams
    /// drop out.
    pub fn ready_to_retire(&mut self, limit: usize) -> Vec<StreamId> {
        let mut ready = Vec::new();
        for _ in 0..limit.min(self.finishing.len()) {
            let Some(id) = self.finishing.pop_front() else {
                break;
            };
            let Some(state) = self.streams.get(&id) else {
                continue;
            };
            let meta = &state.meta;
            if meta.status.is_live() || meta.task.is_some() || state.locs.len() > u32::MAX as usize
            {
                continue;
            }
            let shown = *state.watermark.borrow();
            // A stream someone is waiting on stays whole until they are done:
            // its channel is what wakes them.
            let awaited = state.watermark.receiver_count() > 0;
            if shown.finished && shown.seq as usize >= state.locs.len() && !awaited {
                ready.push(id);
            } else {
                self.finishing.push_back(id);
            }
        }
        ready
    }

    /// Streams finished and not retired yet, to be tried again (a summary
    /// that could not be written).
    pub fn retry_retiring(&mut self, ids: &[StreamId]) {
        self.finishing.extend(ids.iter().copied());
    }

    /// Moves a whole stream to the retired tier, its summary written at
    /// `place`. Segments it no longer holds are found by `in_use` when the
    /// journal next drops unused files (after a sync: the summary must be
    /// durable before the records it replaces may go).
    pub fn retire(&mut self, id: StreamId, place: Place) {
        let Some(state) = self.streams.remove(&id) else {
            return;
        };
        let meta = &state.meta;
        let mut answers = Vec::new();
        for request in &meta.origin_ids {
            let key = (meta.session, request.clone());
            if self.by_request.get(&key) == Some(&id) {
                self.by_request.remove(&key);
                answers.push(request);
            }
        }
        if let Some(at) = Deadlines::of(meta).finished {
            self.finished_at.remove(&(at, id));
        }
        // Its abandonment deadline stays indexed: retired streams are
        // abandoned as whole ones are.
        self.holdings.drop_entries(id, &state.locs, &[]);
        self.holdings.forget(Object::Stream(id));
        let retired = Retired::of_whole(meta, &state.locs, place);
        self.holdings.hold(retired.segments());
        // The retired tier lists its streams by session itself.
        self.unlist_stream(meta.session, id);
        self.retired
            .insert(id, retired, &answers, meta.abandon_at_ms);
    }

    /// Takes in the retired streams recovery found: the segments they
    /// hold, their deadlines (their sessions' lists are their own).
    pub fn adopt_retired(&mut self, retired: RetiredStreams) {
        retired.adopt(|adopt| match adopt {
            Adopt::Hold(segment, n) => self.holdings.hold_count(segment, n),
            Adopt::Release(old) => {
                self.holdings.release(old.segments());
            }
            Adopt::Abandon(id, at) => {
                self.abandon_at.insert((at, id));
            }
        });
        self.retired = retired;
    }

    /// A retired stream's summary was written again, at `place`, for the
    /// metadata `meta` (a change applied to it).
    pub fn resummarized(&mut self, id: StreamId, place: Place, meta: &StreamMeta) {
        let changed = self.retired.update(id, |retired, abandon_at| {
            retired.summary = place;
            if let Some(ms) = meta.finished_ms {
                retired.set_finished_ms(ms);
            }
            retired.coalesced = meta.coalesced;
            *abandon_at = meta.abandon_at_ms;
        });
        let Some((old, before)) = changed else {
            return;
        };
        let Some(new) = self.retired.get(&id) else {
            return;
        };
        if before != meta.abandon_at_ms {
            if let Some(at) = before {
                self.abandon_at.remove(&(at, id));
            }
            if let Some(at) = meta.abandon_at_ms {
                self.abandon_at.insert((at, id));
            }
        }
        // Held anew before released: segments both hold never look empty.
        self.holdings.hold(new.segments());
        self.holdings.release(old.segments());
    }

    /// Takes a retired stream back whole, from its summary, written again
    /// (thawed) to `record`.
    pub fn thaw(&mut self, summary: Summary, record: SegmentNo) {
        let id = summary.meta.id;
        let Some((retired, abandon_at)) = self.retired.remove(&id) else {
            return;
        };
        if let Some(at) = abandon_at {
            self.abandon_at.remove(&(at, id));
        }
        self.holdings.hold(record..=record);
        self.holdings.release(retired.segments());
        self.add_stream(StreamState::new(summary.meta, summary.locs), record);
        self.holdings.release(record..=record);
    }
}

/// The times a stream is due at: abandonment, and retention (counted from
/// when it finished; never for a task leg, which its task's expiry deletes).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Deadlines {
    abandon_at: Option<u64>,
    finished: Option<u64>,
}

impl Deadlines {
    fn of(meta: &StreamMeta) -> Self {
        Self {
            abandon_at: meta.abandon_at_ms,
            finished: meta.finished_ms.filter(|_| meta.task.is_none()),
        }
    }
}

fn distinct_segments(locs: &[Loc]) -> Vec<SegmentNo> {
    let mut out: Vec<SegmentNo> = Vec::new();
    for loc in locs {
        if !out.contains(&loc.segment) {
            out.push(loc.segment);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::meta;

    fn state(session: SessionId) -> StreamState {
        StreamState::new(meta(session), Vec::new())
    }

    fn loc(segment: SegmentNo) -> Loc {
        Loc {
            segment,
            len: 1,
            offset: 0,
        }
    }

    #[test]
    fn a_segment_is_unused_once_every_stream_with_entries_in_it_is_gone() {
        let mut index = Index::default();
        let session = SessionId::random();
        let (a, b) = (state(session), state(session));
        let (ida, idb) = (a.meta.id, b.meta.id);
        // Their records are in segment 3, their entries in 1 and 2.
        index.add_stream(a, 3);
        index.add_stream(b, 3);
        index.push_locs(ida, &[loc(1), loc(1), loc(2)]);
        index.push_locs(idb, &[loc(2)]);
        assert_eq!(index.remove_stream(ida), vec![1]);
        assert!(index.in_use(2) && index.in_use(3));
        assert_eq!(index.remove_stream(idb), vec![2, 3], "records gone too");
        assert!(index.streams_of(session).is_empty());
    }
}
