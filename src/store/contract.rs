//! The `Store` contract as tests every backend must pass: each backend's
//! module instantiates them with `contract_tests!(opener)`, so a behaviour is
//! specified once and a new backend (Redis) inherits the whole suite.
//!
//! Only what the trait promises is checked here; what is particular to a
//! backend (segment files, sled's space reclamation) is tested beside it.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::commit::SyncMode;
use super::{
    now_ms, Along, Caps, Change, Finish, Outcome, PendingInput, Prior, SessionRecord, SharedStore,
    Store, StoreError, StreamKind, StreamMeta, StreamStatus, TaskRecord, UpstreamMark,
};
use crate::id::{SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;

pub type Opener = fn(&Path, SyncMode) -> SharedStore;

pub fn meta(session: SessionId) -> StreamMeta {
    StreamMeta::new(
        StreamId::random_beside(session.as_bytes()),
        session,
        StreamKind::Request,
        vec![],
        Some("tools/call".into()),
        now_ms(),
    )
}

fn finish(status: StreamStatus, outcome: Option<Outcome>, at_ms: u64) -> Finish {
    Finish {
        status,
        outcome,
        at_ms,
    }
}

pub fn session(id: SessionId) -> SessionRecord {
    SessionRecord {
        upstream_session: Some("up-1".into()),
        upstream_replica: Some("http://replica-b/mcp".into()),
        protocol_version: Some("2025-11-25".into()),
        dialects: vec!["streams".into()],
        ..SessionRecord::new(id, "/mcp", "p", now_ms())
    }
}

/// A task created at `created_ms`, kept `ttl_ms`, with no legs yet.
pub fn task(id: TaskId, created_ms: u64, ttl_ms: u64) -> TaskRecord {
    TaskRecord {
        id,
        route: "/mcp".into(),
        principal: "p".into(),
        session: None,
        created_ms,
        updated_ms: created_ms,
        ttl_ms,
        poll_interval_ms: 1_000,
        request: r#"{"name":"slow","arguments":{"n":1}}"#.into(),
        headers: Vec::new(),
        legs: Vec::new(),
        input: None,
        cancelled_ms: None,
        version: 1,
    }
}

/// A leg of `task`: an ordinary request stream of the tasks' session, in
/// its task's partition.
pub fn leg(task: TaskId) -> StreamMeta {
    StreamMeta {
        id: StreamId::random_beside(task.as_bytes()),
        task: Some(task),
        ..meta(SessionId::TASKS)
    }
}

/// Short calls coming and going as retention sees them: each step creates a
/// stream, gives it two messages, and deletes the oldest once more than
/// `keep` are alive. Backends' own tests use it to check that the log stays
/// bounded.
pub struct Churn {
    session: SessionId,
    kept: VecDeque<StreamId>,
    keep: usize,
}

impl Churn {
    pub fn new(keep: usize) -> Self {
        Self {
            session: SessionId::random(),
            kept: VecDeque::new(),
            keep,
        }
    }

    pub async fn step(&mut self, store: &dyn Store, message: Bytes) {
        let m = meta(self.session);
        store.create_stream(&m).await.unwrap();
        store
            .append(m.id, &[message.clone(), message])
            .await
            .unwrap();
        self.kept.push_back(m.id);
        if self.kept.len() > self.keep {
            let oldest = self.kept.pop_front().unwrap();
            store.delete_stream(oldest).await.unwrap();
        }
    }
}

fn bytes(texts: &[&str]) -> Vec<Bytes> {
    texts.iter().map(|t| Bytes::from(t.to_string())).collect()
}

async fn messages(store: &SharedStore, stream: StreamId, after: u64) -> Vec<Bytes> {
    store
        .read_after(stream, after, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect()
}

pub async fn appended_entries_read_back_in_order_after_any_cursor(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let m = meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    let all: Vec<Bytes> = (1..=10).map(|i| Bytes::from(format!("m{i}"))).collect();
    assert_eq!(store.append(m.id, &all[..4]).await.unwrap(), 4);
    assert_eq!(store.append(m.id, &all[4..]).await.unwrap(), 10);
    for cut in 0..=10u64 {
        let got = store.read_after(m.id, cut, 100).await.unwrap();
        assert_eq!(
            got.iter().map(|e| e.message.clone()).collect::<Vec<_>>(),
            all[cut as usize..].to_vec()
        );
        assert!(got.iter().zip(cut + 1..).all(|(e, s)| e.seq == s));
    }
    let limited = store.read_after(m.id, 2, 3).await.unwrap();
    assert_eq!(
        limited.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
}

pub async fn opening_entries_are_the_streams_first_and_survive_reopen(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let m = meta(SessionId::random());
    {
        let store = open(dir.path(), SyncMode::Batch);
        store.create_with(&m, &bytes(&["p", "q"])).await.unwrap();
        assert_eq!(store.append(m.id, &bytes(&["r"])).await.unwrap(), 3);
        assert_eq!(messages(&store, m.id, 0).await, bytes(&["p", "q", "r"]));
    }
    let store = open(dir.path(), SyncMode::Batch);
    let reopened = store.stream_meta(m.id).await.unwrap().unwrap();
    assert_eq!((reopened.entries, reopened.bytes), (3, 3));
    assert_eq!(messages(&store, m.id, 0).await, bytes(&["p", "q", "r"]));
}

pub async fn entries_statuses_and_sessions_survive_reopen(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let s = session(SessionId::random());
    let (live, done) = (meta(s.id), meta(s.id));
    {
        let store = open(dir.path(), SyncMode::Batch);
        store.put_session(&s).await.unwrap();
        for m in [&live, &done] {
            store.create_stream(m).await.unwrap();
        }
        store.append(live.id, &bytes(&["a", "b"])).await.unwrap();
        store
            .append_final(
                done.id,
                &bytes(&["r"]),
                finish(StreamStatus::Completed, Some(Outcome::Result), 7),
            )
            .await
            .unwrap();
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.get_session(s.id).await.unwrap(), Some(s.clone()));
    let reopened = store.stream_meta(live.id).await.unwrap().unwrap();
    assert_eq!((reopened.entries, reopened.bytes), (2, 2));
    assert_eq!(
        StreamMeta {
            entries: 0,
            bytes: 0,
            ..reopened
        },
        live
    );
    let finished = store.stream_meta(done.id).await.unwrap().unwrap();
    assert_eq!(
        (finished.status, finished.finished_ms),
        (StreamStatus::Completed, Some(7))
    );
    assert!(store.subscribe(done.id).await.borrow().finished);
    assert_eq!(messages(&store, live.id, 0).await, bytes(&["a", "b"]));
    // The new writer carries the stream on once it is handed over.
    let orphans = orphans_of_a_dead_writer(&store).await;
    assert_eq!(
        orphans.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![live.id]
    );
    assert_eq!(store.append(live.id, &bytes(&["c"])).await.unwrap(), 3);
    assert_eq!(store.streams_of_session(s.id).await.unwrap().len(), 2);
}

pub async fn deleting_a_session_removes_its_streams_only(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Never);
    let (a, b) = (session(SessionId::random()), session(SessionId::random()));
    let (ma, mb) = (meta(a.id), meta(b.id));
    for (s, m) in [(&a, &ma), (&b, &mb)] {
        store.put_session(s).await.unwrap();
        store.create_stream(m).await.unwrap();
        store.append(m.id, &bytes(&["x"])).await.unwrap();
    }
    store.delete_session(a.id).await.unwrap();
    assert_eq!(store.get_session(a.id).await.unwrap(), None);
    assert_eq!(store.stream_meta(ma.id).await.unwrap(), None);
    assert!(messages(&store, ma.id, 0).await.is_empty());
    assert_eq!(messages(&store, mb.id, 0).await.len(), 1);
    assert_eq!(store.list_sessions().await.unwrap(), vec![b.clone()]);
    drop(store);
    let store = open(dir.path(), SyncMode::Never);
    assert_eq!(store.stream_meta(ma.id).await.unwrap(), None);
    assert_eq!(messages(&store, mb.id, 0).await.len(), 1);
}

/// A new session last seen at `last_seen_ms`, closed at `closed_ms`.
pub fn session_seen_at(last_seen_ms: u64, closed_ms: Option<u64>) -> SessionRecord {
    SessionRecord {
        last_seen_ms,
        closed_ms,
        ..session(SessionId::random())
    }
}

/// The sessions a sweep at 500 ms (closed by 300 ms) finds idle, sorted.
pub async fn idle_at_500(store: &SharedStore) -> Vec<SessionId> {
    let mut ids: Vec<SessionId> = store
        .sessions_idle_by(500, 300)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    ids.sort();
    ids
}

pub async fn idle_sessions_are_found_by_last_seen_or_close_and_survive_reopen(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Never);
    let at = session_seen_at;
    let (old, recent, closed, touched) = (
        at(100, None),
        at(900, None),
        at(900, Some(200)),
        at(100, None),
    );
    for s in [&old, &recent, &closed, &touched] {
        store.put_session(s).await.unwrap();
    }
    // Seen again since: its record moved out of the idle range.
    let touched = SessionRecord {
        last_seen_ms: 950,
        ..touched
    };
    store.put_session(&touched).await.unwrap();
    let gone = at(50, None);
    store.put_session(&gone).await.unwrap();
    store.delete_session(gone.id).await.unwrap();
    let mut want = vec![old.id, closed.id];
    want.sort();
    assert_eq!(idle_at_500(&store).await, want);
    drop(store);
    assert_eq!(idle_at_500(&open(dir.path(), SyncMode::Never)).await, want);
}

pub async fn a_write_past_the_caps_is_refused_whole_and_one_within_them_goes_in(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Never);
    let m = meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    store.append(m.id, &bytes(&["aaaa", "bbbb"])).await.unwrap();
    let capped = |entries, bytes| Along {
        caps: Some(Caps { entries, bytes }),
        ..Along::default()
    };
    // Three entries would make 5 > 4; 8 + 5 bytes would pass 12.
    for along in [capped(4, 100), capped(100, 12)] {
        let refused = store.write(m.id, &bytes(&["c", "d", "eeeee"]), along).await;
        assert!(matches!(refused, Err(StoreError::OverCaps(id)) if id == m.id));
    }
    assert_eq!(
        messages(&store, m.id, 0).await.len(),
        2,
        "nothing of it written"
    );
    let counts = store.stream_meta(m.id).await.unwrap().unwrap();
    assert_eq!((counts.entries, counts.bytes), (2, 8));
    // Exactly at the caps fits.
    assert_eq!(
        store
            .write(m.id, &bytes(&["cccc"]), capped(3, 12))
            .await
            .unwrap(),
        3
    );
}

pub async fn a_deleted_stream_is_gone_and_its_readers_are_told(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let m = meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    store.append(m.id, &bytes(&["x"])).await.unwrap();
    let sub = store.subscribe(m.id).await;
    store.delete_stream(m.id).await.unwrap();
    assert!(sub.borrow().finished);
    assert_eq!(store.stream_meta(m.id).await.unwrap(), None);
    assert!(messages(&store, m.id, 0).await.is_empty());
    assert!(matches!(
        store.append(m.id, &bytes(&["y"])).await,
        Err(StoreError::NoSuchStream(_))
    ));
    drop(store);
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.stream_meta(m.id).await.unwrap(), None);
}

pub async fn subscribers_wake_on_append_and_on_status(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let m = meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    let mut sub = store.subscribe(m.id).await;
    store.append(m.id, &bytes(&["x"])).await.unwrap();
    assert!(sub.has_changed().unwrap());
    assert_eq!(sub.borrow_and_update().seq, 1);
    store
        .set_status(m.id, finish(StreamStatus::Completed, None, now_ms()))
        .await
        .unwrap();
    assert!(sub.has_changed().unwrap());
    assert!(sub.borrow().finished);
}

pub async fn an_unknown_stream_reads_empty_and_refuses_appends(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let id = StreamId::random();
    assert!(messages(&store, id, 0).await.is_empty());
    assert!(store.subscribe(id).await.borrow().finished);
    assert!(matches!(
        store.append(id, &bytes(&["x"])).await,
        Err(StoreError::NoSuchStream(_))
    ));
    assert!(matches!(
        store
            .set_status(id, finish(StreamStatus::Failed, None, 1))
            .await,
        Err(StoreError::NoSuchStream(_))
    ));
    assert!(matches!(
        store.update_stream(id, Change::Ack(1)).await,
        Err(StoreError::NoSuchStream(_))
    ));
}

pub async fn the_acknowledged_cursor_only_moves_forward_and_survives_reopen(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let m = meta(SessionId::random());
    {
        let store = open(dir.path(), SyncMode::Batch);
        store.create_stream(&m).await.unwrap();
        store.append(m.id, &bytes(&["a", "b", "c"])).await.unwrap();
        store.update_stream(m.id, Change::Ack(2)).await.unwrap();
        store.update_stream(m.id, Change::Ack(1)).await.unwrap();
        assert_eq!(store.stream_meta(m.id).await.unwrap().unwrap().acked, 2);
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.stream_meta(m.id).await.unwrap().unwrap().acked, 2);
}

pub async fn marks_and_outcomes_are_kept_with_the_stream(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let mut m = meta(SessionId::random());
    m.params_digest = Some("d1".into());
    {
        let store = open(dir.path(), SyncMode::Batch);
        store.create_stream(&m).await.unwrap();
        store.append(m.id, &bytes(&["p", "q"])).await.unwrap();
        store.update_stream(m.id, Change::Request(2)).await.unwrap();
        store.update_stream(m.id, Change::Coalesced).await.unwrap();
        store
            .append_final(
                m.id,
                &bytes(&["err"]),
                finish(StreamStatus::Completed, Some(Outcome::Error), 5),
            )
            .await
            .unwrap();
    }
    let store = open(dir.path(), SyncMode::Batch);
    let got = store.stream_meta(m.id).await.unwrap().unwrap();
    assert_eq!(got.params_digest.as_deref(), Some("d1"));
    assert_eq!((got.last_request, got.coalesced), (2, true));
    assert_eq!(
        (got.status, got.outcome, got.finished_ms),
        (StreamStatus::Completed, Some(Outcome::Error), Some(5))
    );
    assert_eq!((got.entries, got.bytes), (3, 5));
}

pub async fn a_request_id_finds_its_newest_stream_in_its_session_after_reopen(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (SessionId::random(), SessionId::random());
    let one = RequestId("1".into());
    let with_id = |session| StreamMeta {
        origin_ids: vec![one.clone()],
        ..meta(session)
    };
    let (first, mut reused, other) = (with_id(a), with_id(a), with_id(b));
    reused.created_ms = first.created_ms + 1;
    {
        let store = open(dir.path(), SyncMode::Batch);
        for m in [&first, &reused, &other] {
            store.create_stream(m).await.unwrap();
            store.append(m.id, &bytes(&["x"])).await.unwrap();
        }
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(
        store.stream_of_request(a, &one).await.unwrap(),
        Some(reused.id)
    );
    assert_eq!(
        store.stream_of_request(b, &one).await.unwrap(),
        Some(other.id)
    );
    let two = RequestId("\"1\"".into());
    assert_eq!(store.stream_of_request(a, &two).await.unwrap(), None);
    store.delete_stream(other.id).await.unwrap();
    assert_eq!(store.stream_of_request(b, &one).await.unwrap(), None);
}

/// A call of session `session` under request id `id` with params digest
/// `digest`.
pub fn call(session: SessionId, id: &str, digest: Option<&str>) -> StreamMeta {
    StreamMeta {
        origin_ids: vec![RequestId(id.into())],
        params_digest: digest.map(Arc::from),
        ..meta(session)
    }
}

pub async fn a_call_re_sent_finds_its_prior_and_creates_nothing(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let session = SessionId::random();
    let first = call(session, "1", Some("d1"));
    assert_eq!(store.create_call(&first, &[]).await.unwrap(), None);
    let again = call(session, "1", Some("d1"));
    assert_eq!(
        store
            .create_call(&again, &bytes(&["opening"]))
            .await
            .unwrap(),
        Some(Prior::Same(first.id))
    );
    assert_eq!(store.stream_meta(again.id).await.unwrap(), None);
    assert_eq!(
        store.append(first.id, &bytes(&["answer"])).await.unwrap(),
        1,
        "the re-sent call's opening entries were written nowhere"
    );
    assert_eq!(
        store
            .stream_of_request(session, &RequestId("1".into()))
            .await
            .unwrap(),
        Some(first.id)
    );
}

pub async fn another_call_under_a_prior_id_is_refused_and_creates_nothing(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let session = SessionId::random();
    store
        .create_call(&call(session, "1", Some("d1")), &[])
        .await
        .unwrap();
    for other in [Some("d2"), None] {
        let other = call(session, "1", other);
        assert_eq!(
            store.create_call(&other, &[]).await.unwrap(),
            Some(Prior::Other)
        );
        assert_eq!(store.stream_meta(other.id).await.unwrap(), None);
    }
}

pub async fn a_call_has_no_prior_in_another_session_under_another_id_or_without_a_digest(
    open: Opener,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let (a, b) = (SessionId::random(), SessionId::random());
    store
        .create_call(&call(a, "1", Some("d1")), &[])
        .await
        .unwrap();
    let without_digest = call(a, "2", None);
    store.create_call(&without_digest, &[]).await.unwrap();
    let mut new = [
        call(b, "1", Some("d1")),
        call(a, "\"1\"", Some("d1")),
        call(a, "2", Some("d1")),
    ];
    // Newer by its creation time (two in one millisecond are not ordered).
    new[2].created_ms = without_digest.created_ms + 1;
    for new in &new {
        assert_eq!(store.create_call(new, &[]).await.unwrap(), None);
        assert!(store.stream_meta(new.id).await.unwrap().is_some());
    }
    // The newest stream under an id is its prior from now on.
    assert_eq!(
        store
            .create_call(&call(a, "2", Some("d1")), &[])
            .await
            .unwrap(),
        Some(Prior::Same(new[2].id))
    );
}

pub async fn a_deleted_prior_is_no_prior(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let session = SessionId::random();
    let first = call(session, "1", Some("d1"));
    store.create_call(&first, &[]).await.unwrap();
    store.delete_stream(first.id).await.unwrap();
    let again = call(session, "1", Some("d1"));
    assert_eq!(store.create_call(&again, &[]).await.unwrap(), None);
    assert!(store.stream_meta(again.id).await.unwrap().is_some());
}

pub async fn the_upstream_mark_names_its_last_entry_and_survives_reopen(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let m = meta(SessionId::random());
    {
        let store = open(dir.path(), SyncMode::Batch);
        store.create_stream(&m).await.unwrap();
        assert_eq!(store.append(m.id, &bytes(&["a"])).await.unwrap(), 1);
        assert_eq!(
            store.stream_meta(m.id).await.unwrap().unwrap().upstream,
            None
        );
        let seq = store
            .write(m.id, &bytes(&["b", "c"]), Along::upstream("ev-2"))
            .await
            .unwrap();
        assert_eq!(seq, 3);
        // An event without a message moves the mark, not the seq.
        assert_eq!(
            store
                .write(m.id, &[], Along::upstream("ev-3"))
                .await
                .unwrap(),
            3
        );
    }
    let store = open(dir.path(), SyncMode::Batch);
    let got = store.stream_meta(m.id).await.unwrap().unwrap();
    assert_eq!(
        got.upstream,
        Some(UpstreamMark {
            event_id: "ev-3".into(),
            seq: 3
        })
    );
    assert_eq!(store.read_after(m.id, 0, 10).await.unwrap().len(), 3);
}

pub async fn deadline_queries_name_only_the_streams_that_are_due(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let session = SessionId::random();
    let mut watched = meta(session);
    watched.touched_ms = 1_000;
    watched.abandon_after_ms = Some(500);
    watched.abandon_at_ms = Some(1_500);
    let plain = meta(session);
    for m in [&watched, &plain] {
        store.create_stream(m).await.unwrap();
    }
    assert!(store.abandoned_by(1_499).await.unwrap().is_empty());
    assert_eq!(store.abandoned_by(1_500).await.unwrap(), vec![watched.id]);
    store
        .update_stream(watched.id, Change::Touch { at_ms: 2_000 })
        .await
        .unwrap();
    assert!(store.abandoned_by(2_499).await.unwrap().is_empty());
    let got = store.stream_meta(watched.id).await.unwrap().unwrap();
    assert_eq!((got.touched_ms, got.abandon_at_ms), (2_000, Some(2_500)));

    store
        .set_status(plain.id, finish(StreamStatus::Completed, None, 3_000))
        .await
        .unwrap();
    assert!(store.finished_by(2_999).await.unwrap().is_empty());
    assert_eq!(store.finished_by(3_000).await.unwrap(), vec![plain.id]);
    drop(store);
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.abandoned_by(2_500).await.unwrap(), vec![watched.id]);
    assert_eq!(store.finished_by(3_000).await.unwrap(), vec![plain.id]);
    store.delete_stream(watched.id).await.unwrap();
    assert!(store.abandoned_by(u64::MAX).await.unwrap().is_empty());
}

/// A task with legs and a pending MRTR round, as the tasks dialect leaves
/// one mid-way.
fn task_with_input(id: TaskId) -> TaskRecord {
    let mut t = task(id, now_ms(), 60_000);
    t.legs = vec![StreamId::random(), StreamId::random()];
    t.input = Some(PendingInput {
        request_state: Some(r#"{"opaque":[1,2]}"#.into()),
        asked: vec!["name".into(), "age".into()],
        answered: [("name".to_owned(), r#"{"action":"accept"}"#.to_owned())].into(),
    });
    t.cancelled_ms = Some(t.created_ms + 5);
    t
}

pub async fn a_task_record_reads_back_as_written_after_reopen(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let t = task_with_input(TaskId::random());
    {
        let store = open(dir.path(), SyncMode::Batch);
        assert_eq!(store.get_task(t.id).await.unwrap(), None);
        store.put_task(&t).await.unwrap();
        assert_eq!(store.get_task(t.id).await.unwrap(), Some(t.clone()));
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.get_task(t.id).await.unwrap(), Some(t.clone()));
    assert_eq!(store.get_task(TaskId::random()).await.unwrap(), None);
}

pub async fn a_task_update_with_the_next_version_replaces_it_durably(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let mut t = task(TaskId::random(), now_ms(), 60_000);
    {
        let store = open(dir.path(), SyncMode::Batch);
        store.put_task(&t).await.unwrap();
        t.legs.push(StreamId::random());
        t.updated_ms += 1;
        t.version += 1;
        assert!(store.update_task(&t).await.unwrap());
        assert_eq!(store.get_task(t.id).await.unwrap(), Some(t.clone()));
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.get_task(t.id).await.unwrap(), Some(t.clone()));
}

pub async fn a_task_update_with_a_stale_version_changes_nothing(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let mut stored = task(TaskId::random(), now_ms(), 60_000);
    stored.version = 3;
    store.put_task(&stored).await.unwrap();
    // Another writer came first (same version), or one skipped ahead: only
    // `stored.version + 1` replaces the record.
    for version in [0, 1, 3, 5, u64::MAX] {
        let late = TaskRecord {
            legs: vec![StreamId::random()],
            version,
            ..stored.clone()
        };
        assert!(
            !store.update_task(&late).await.unwrap(),
            "version {version}"
        );
        assert_eq!(
            store.get_task(stored.id).await.unwrap(),
            Some(stored.clone())
        );
    }
}

pub async fn a_deleted_task_is_not_brought_back_by_an_update(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let mut t = task(TaskId::random(), now_ms(), 60_000);
    store.put_task(&t).await.unwrap();
    store.delete_task(t.id).await.unwrap();
    t.version += 1;
    assert!(!store.update_task(&t).await.unwrap());
    assert_eq!(store.get_task(t.id).await.unwrap(), None);
    // Never written at all: the same.
    let never = TaskRecord {
        version: 2,
        ..task(TaskId::random(), now_ms(), 60_000)
    };
    assert!(!store.update_task(&never).await.unwrap());
    assert_eq!(store.get_task(never.id).await.unwrap(), None);
}

pub async fn deleting_a_task_deletes_its_legs(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let mut t = task(TaskId::random(), now_ms(), 60_000);
    let (first, current) = (leg(t.id), leg(t.id));
    let other = leg(TaskId::random());
    let plain = meta(SessionId::random());
    t.legs = vec![first.id, current.id];
    {
        let store = open(dir.path(), SyncMode::Batch);
        for m in [&first, &current, &other, &plain] {
            store.create_stream(m).await.unwrap();
            store.append(m.id, &bytes(&["x"])).await.unwrap();
        }
        store
            .set_status(
                first.id,
                finish(StreamStatus::Completed, Some(Outcome::Result), now_ms()),
            )
            .await
            .unwrap();
        store.put_task(&t).await.unwrap();
        let sub = store.subscribe(current.id).await;
        store.delete_task(t.id).await.unwrap();
        assert!(sub.borrow().finished, "the live leg's readers are told");
        assert_eq!(store.get_task(t.id).await.unwrap(), None);
        for leg in [first.id, current.id] {
            assert_eq!(store.stream_meta(leg).await.unwrap(), None);
            assert!(messages(&store, leg, 0).await.is_empty());
        }
        // Deleting it again finds nothing to do.
        store.delete_task(t.id).await.unwrap();
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.get_task(t.id).await.unwrap(), None);
    for gone in [first.id, current.id] {
        assert_eq!(store.stream_meta(gone).await.unwrap(), None);
        assert!(messages(&store, gone, 0).await.is_empty());
    }
    for kept in [other.id, plain.id] {
        assert_eq!(messages(&store, kept, 0).await, bytes(&["x"]));
    }
    let legs: Vec<StreamId> = store
        .streams_of_session(SessionId::TASKS)
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(legs, vec![other.id]);
}

pub async fn expired_tasks_are_found_by_their_deadline_only(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let now = now_ms();
    let soon = task(TaskId::random(), now, 1_000);
    let mut later = task(TaskId::random(), now, 2_000);
    let gone = task(TaskId::random(), now, 500);
    {
        let store = open(dir.path(), SyncMode::Batch);
        for t in [&soon, &later, &gone] {
            store.put_task(t).await.unwrap();
        }
        store.delete_task(gone.id).await.unwrap();
        assert!(store.tasks_expired_by(now + 999).await.unwrap().is_empty());
        assert_eq!(
            store.tasks_expired_by(now + 1_000).await.unwrap(),
            vec![soon.id]
        );
        // An update that changes the lifetime moves the deadline.
        later.ttl_ms = 3_000;
        later.version += 1;
        assert!(store.update_task(&later).await.unwrap());
        assert_eq!(
            store.tasks_expired_by(now + 2_999).await.unwrap(),
            vec![soon.id]
        );
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(
        store.tasks_expired_by(now + 2_999).await.unwrap(),
        vec![soon.id]
    );
    let mut all = store.tasks_expired_by(now + 3_000).await.unwrap();
    all.sort();
    let mut want = vec![soon.id, later.id];
    want.sort();
    assert_eq!(all, want);
}

pub async fn a_task_leg_outlives_retention(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let t = task(TaskId::random(), now_ms(), 60_000);
    let (leg, plain) = (leg(t.id), meta(SessionId::random()));
    {
        let store = open(dir.path(), SyncMode::Batch);
        store
            .put_task(&TaskRecord {
                legs: vec![leg.id],
                ..t.clone()
            })
            .await
            .unwrap();
        for m in [&leg, &plain] {
            store.create_stream(m).await.unwrap();
            store
                .append_final(
                    m.id,
                    &bytes(&["r"]),
                    finish(StreamStatus::Completed, Some(Outcome::Result), 3_000),
                )
                .await
                .unwrap();
        }
        assert_eq!(store.finished_by(u64::MAX).await.unwrap(), vec![plain.id]);
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.finished_by(u64::MAX).await.unwrap(), vec![plain.id]);
    let kept = store.stream_meta(leg.id).await.unwrap().unwrap();
    assert_eq!(
        (kept.task, kept.status, kept.finished_ms),
        (Some(t.id), StreamStatus::Completed, Some(3_000))
    );
}

pub async fn the_legs_of_many_tasks_share_the_tasks_session_without_meeting(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Never);
    let one = RequestId("1".into());
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let mut t = task(TaskId::random(), now_ms(), 60_000);
        // Every task's first call is a client's request 1.
        let m = StreamMeta {
            origin_ids: vec![one.clone()],
            ..leg(t.id)
        };
        store.create_stream(&m).await.unwrap();
        store.append(m.id, &bytes(&["x"])).await.unwrap();
        t.legs.push(m.id);
        store.put_task(&t).await.unwrap();
        tasks.push(t);
    }
    let legs = store.streams_of_session(SessionId::TASKS).await.unwrap();
    assert_eq!(legs.len(), 50);
    assert!(legs.iter().all(|m| m.task.is_some()));
    for t in tasks.iter().step_by(2) {
        store.delete_task(t.id).await.unwrap();
    }
    let mut left: Vec<StreamId> = store
        .streams_of_session(SessionId::TASKS)
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    left.sort();
    let mut want: Vec<StreamId> = tasks.iter().skip(1).step_by(2).map(|t| t.legs[0]).collect();
    want.sort();
    assert_eq!(left, want);
    for t in tasks.iter().skip(1).step_by(2) {
        assert_eq!(messages(&store, t.legs[0], 0).await, bytes(&["x"]));
    }
}

/// The orphans a store is handed once their writer is gone: at once for a
/// log one process opens, after the dead writer's lease for a shared one.
async fn orphans_of_a_dead_writer(store: &SharedStore) -> Vec<StreamMeta> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let found = store.orphans().await.unwrap();
        if !found.is_empty() || tokio::time::Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A stream left live by a writer that went away (no goodbye: a crash) is
/// handed to the next one once — for a shared log, once the writer's lease
/// ran out; a finished stream never is.
pub async fn a_live_stream_whose_writer_died_is_handed_out_once(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let (live, done) = {
        let store = open(dir.path(), SyncMode::Batch);
        let (live, done) = (meta(SessionId::random()), meta(SessionId::random()));
        for m in [&live, &done] {
            store.create_stream(m).await.unwrap();
        }
        store
            .append_final(
                done.id,
                &bytes(&["r"]),
                finish(StreamStatus::Completed, None, now_ms()),
            )
            .await
            .unwrap();
        (live.id, done.id)
    };
    let store = open(dir.path(), SyncMode::Batch);
    let orphans = orphans_of_a_dead_writer(&store).await;
    let ids: Vec<StreamId> = orphans.iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![live], "finished {done} is no orphan");
    assert!(store.orphans().await.unwrap().is_empty(), "handed out once");
}

/// What a backend without test fixtures to clean up guards its tests with.
#[derive(Default)]
pub struct NoCleanup;

/// Instantiates every contract test for one backend; `$open` builds the
/// backend's store in a directory with a sync mode. With `guard = $make`,
/// each test first calls `$make()` and holds what it returns until the test
/// ends (passed or failed): a backend whose data outlives the test directory
/// (Redis) cleans up in its `Drop`.
macro_rules! contract_tests {
    ($open:expr) => {
        $crate::store::contract::contract_tests!(
            $open,
            guard = $crate::store::contract::NoCleanup::default
        );
    };
    ($open:expr, guard = $guard:expr) => {
        mod contract {
            use super::*;
            use crate::store::contract as c;

            fn open(
                dir: &std::path::Path,
                sync: crate::store::commit::SyncMode,
            ) -> crate::store::SharedStore {
                ($open)(dir, sync)
            }

            #[tokio::test]
            async fn appended_entries_read_back_in_order_after_any_cursor() {
                let _guard = ($guard)();
                c::appended_entries_read_back_in_order_after_any_cursor(open).await
            }

            #[tokio::test]
            async fn a_write_past_the_caps_is_refused_whole_and_one_within_them_goes_in() {
                let _guard = ($guard)();
                c::a_write_past_the_caps_is_refused_whole_and_one_within_them_goes_in(open).await
            }

            #[tokio::test]
            async fn idle_sessions_are_found_by_last_seen_or_close_and_survive_reopen() {
                let _guard = ($guard)();
                c::idle_sessions_are_found_by_last_seen_or_close_and_survive_reopen(open).await
            }

            #[tokio::test]
            async fn opening_entries_are_the_streams_first_and_survive_reopen() {
                let _guard = ($guard)();
                c::opening_entries_are_the_streams_first_and_survive_reopen(open).await
            }

            #[tokio::test]
            async fn entries_statuses_and_sessions_survive_reopen() {
                let _guard = ($guard)();
                c::entries_statuses_and_sessions_survive_reopen(open).await
            }

            #[tokio::test]
            async fn deleting_a_session_removes_its_streams_only() {
                let _guard = ($guard)();
                c::deleting_a_session_removes_its_streams_only(open).await
            }

            #[tokio::test]
            async fn a_deleted_stream_is_gone_and_its_readers_are_told() {
                let _guard = ($guard)();
                c::a_deleted_stream_is_gone_and_its_readers_are_told(open).await
            }

            #[tokio::test]
            async fn subscribers_wake_on_append_and_on_status() {
                let _guard = ($guard)();
                c::subscribers_wake_on_append_and_on_status(open).await
            }

            #[tokio::test]
            async fn an_unknown_stream_reads_empty_and_refuses_appends() {
                let _guard = ($guard)();
                c::an_unknown_stream_reads_empty_and_refuses_appends(open).await
            }

            #[tokio::test]
            async fn the_acknowledged_cursor_only_moves_forward_and_survives_reopen() {
                let _guard = ($guard)();
                c::the_acknowledged_cursor_only_moves_forward_and_survives_reopen(open).await
            }

            #[tokio::test]
            async fn marks_and_outcomes_are_kept_with_the_stream() {
                let _guard = ($guard)();
                c::marks_and_outcomes_are_kept_with_the_stream(open).await
            }

            #[tokio::test]
            async fn a_request_id_finds_its_newest_stream_in_its_session_after_reopen() {
                let _guard = ($guard)();
                c::a_request_id_finds_its_newest_stream_in_its_session_after_reopen(open).await
            }

            #[tokio::test]
            async fn a_call_re_sent_finds_its_prior_and_creates_nothing() {
                let _guard = ($guard)();
                c::a_call_re_sent_finds_its_prior_and_creates_nothing(open).await
            }

            #[tokio::test]
            async fn another_call_under_a_prior_id_is_refused_and_creates_nothing() {
                let _guard = ($guard)();
                c::another_call_under_a_prior_id_is_refused_and_creates_nothing(open).await
            }

            #[tokio::test]
            async fn a_call_has_no_prior_in_another_session_under_another_id_or_without_a_digest() {
                let _guard = ($guard)();
                c::a_call_has_no_prior_in_another_session_under_another_id_or_without_a_digest(open)
                    .await
            }

            #[tokio::test]
            async fn a_deleted_prior_is_no_prior() {
                let _guard = ($guard)();
                c::a_deleted_prior_is_no_prior(open).await
            }

            #[tokio::test]
            async fn the_upstream_mark_names_its_last_entry_and_survives_reopen() {
                let _guard = ($guard)();
                c::the_upstream_mark_names_its_last_entry_and_survives_reopen(open).await
            }

            #[tokio::test]
            async fn a_live_stream_whose_writer_died_is_handed_out_once() {
                let _guard = ($guard)();
                c::a_live_stream_whose_writer_died_is_handed_out_once(open).await
            }

            #[tokio::test]
            async fn deadline_queries_name_only_the_streams_that_are_due() {
                let _guard = ($guard)();
                c::deadline_queries_name_only_the_streams_that_are_due(open).await
            }

            #[tokio::test]
            async fn a_task_record_reads_back_as_written_after_reopen() {
                let _guard = ($guard)();
                c::a_task_record_reads_back_as_written_after_reopen(open).await
            }

            #[tokio::test]
            async fn a_task_update_with_the_next_version_replaces_it_durably() {
                let _guard = ($guard)();
                c::a_task_update_with_the_next_version_replaces_it_durably(open).await
            }

            #[tokio::test]
            async fn a_task_update_with_a_stale_version_changes_nothing() {
                let _guard = ($guard)();
                c::a_task_update_with_a_stale_version_changes_nothing(open).await
            }

            #[tokio::test]
            async fn a_deleted_task_is_not_brought_back_by_an_update() {
                let _guard = ($guard)();
                c::a_deleted_task_is_not_brought_back_by_an_update(open).await
            }

            #[tokio::test]
            async fn deleting_a_task_deletes_its_legs() {
                let _guard = ($guard)();
                c::deleting_a_task_deletes_its_legs(open).await
            }

            #[tokio::test]
            async fn expired_tasks_are_found_by_their_deadline_only() {
                let _guard = ($guard)();
                c::expired_tasks_are_found_by_their_deadline_only(open).await
            }

            #[tokio::test]
            async fn a_task_leg_outlives_retention() {
                let _guard = ($guard)();
                c::a_task_leg_outlives_retention(open).await
            }

            #[tokio::test]
            async fn the_legs_of_many_tasks_share_the_tasks_session_without_meeting() {
                let _guard = ($guard)();
                c::the_legs_of_many_tasks_share_the_tasks_session_without_meeting(open).await
            }
        }
    };
}
pub(crate) use contract_tests;
