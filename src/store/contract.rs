//! The `Store` contract as tests every backend must pass: each backend's
//! module instantiates them with `contract_tests!(opener)`, so a behaviour is
//! specified once and a new backend (Redis) inherits the whole suite.
//!
//! Only what the trait promises is checked here; what is particular to a
//! backend (segment files, sled's space reclamation) is tested beside it.

use std::collections::VecDeque;
use std::path::Path;

use bytes::Bytes;

use super::commit::SyncMode;
use super::{
    now_ms, SessionRecord, SharedStore, Store, StoreError, StreamKind, StreamMeta, StreamStatus,
};
use crate::id::{SessionId, StreamId};

pub type Opener = fn(&Path, SyncMode) -> SharedStore;

pub fn meta(session: SessionId) -> StreamMeta {
    StreamMeta {
        id: StreamId::random(),
        session,
        kind: StreamKind::Request,
        origin_ids: vec![],
        method: Some("tools/call".into()),
        status: StreamStatus::Live,
        created_ms: now_ms(),
        finished_ms: None,
    }
}

pub fn session(id: SessionId) -> SessionRecord {
    SessionRecord {
        id,
        route: "/mcp".into(),
        upstream_session: Some("up-1".into()),
        protocol_version: Some("2025-11-25".into()),
        principal: "p".into(),
        initialize: None,
        created_ms: now_ms(),
        last_seen_ms: now_ms(),
        closed_ms: None,
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
            .append_final(done.id, &bytes(&["r"]), StreamStatus::Completed, 7)
            .await
            .unwrap();
    }
    let store = open(dir.path(), SyncMode::Batch);
    assert_eq!(store.get_session(s.id).await.unwrap(), Some(s.clone()));
    assert_eq!(
        store.stream_meta(live.id).await.unwrap(),
        Some(live.clone())
    );
    let finished = store.stream_meta(done.id).await.unwrap().unwrap();
    assert_eq!(
        (finished.status, finished.finished_ms),
        (StreamStatus::Completed, Some(7))
    );
    assert!(store.subscribe(done.id).borrow().finished);
    assert_eq!(messages(&store, live.id, 0).await, bytes(&["a", "b"]));
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

pub async fn a_deleted_stream_is_gone_and_its_readers_are_told(open: Opener) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SyncMode::Batch);
    let m = meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    store.append(m.id, &bytes(&["x"])).await.unwrap();
    let sub = store.subscribe(m.id);
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
    let mut sub = store.subscribe(m.id);
    store.append(m.id, &bytes(&["x"])).await.unwrap();
    assert!(sub.has_changed().unwrap());
    assert_eq!(sub.borrow_and_update().seq, 1);
    store
        .set_status(m.id, StreamStatus::Completed, now_ms())
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
    assert!(store.subscribe(id).borrow().finished);
    assert!(matches!(
        store.append(id, &bytes(&["x"])).await,
        Err(StoreError::NoSuchStream(_))
    ));
    assert!(matches!(
        store.set_status(id, StreamStatus::Failed, 1).await,
        Err(StoreError::NoSuchStream(_))
    ));
}

/// Instantiates every contract test for one backend; `$open` builds the
/// backend's store in a directory with a sync mode.
macro_rules! contract_tests {
    ($open:expr) => {
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
                c::appended_entries_read_back_in_order_after_any_cursor(open).await
            }

            #[tokio::test]
            async fn entries_statuses_and_sessions_survive_reopen() {
                c::entries_statuses_and_sessions_survive_reopen(open).await
            }

            #[tokio::test]
            async fn deleting_a_session_removes_its_streams_only() {
                c::deleting_a_session_removes_its_streams_only(open).await
            }

            #[tokio::test]
            async fn a_deleted_stream_is_gone_and_its_readers_are_told() {
                c::a_deleted_stream_is_gone_and_its_readers_are_told(open).await
            }

            #[tokio::test]
            async fn subscribers_wake_on_append_and_on_status() {
                c::subscribers_wake_on_append_and_on_status(open).await
            }

            #[tokio::test]
            async fn an_unknown_stream_reads_empty_and_refuses_appends() {
                c::an_unknown_stream_reads_empty_and_refuses_appends(open).await
            }
        }
    };
}
pub(crate) use contract_tests;
