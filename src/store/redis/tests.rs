//! The Redis backend against a real server: the whole contract suite, plus
//! what is particular to Redis (the key layout, cleanup).
//!
//! Runs on `REDIS_URL`, else on a private `redis-server` this test process
//! starts (the rig the integration tests use too, included below), and on
//! a private Redis Cluster (`on_a_three_primary_cluster.rs`); with
//! neither, every test here fails with one line saying so. Each store
//! gets its own random key prefix, kept in a file of the test's directory so
//! that a "reopen" (a new store object on the same directory) finds the same
//! keys; each test deletes its keys when it ends, passed or failed.

use std::cell::RefCell;
use std::path::Path;

use super::follow::Tail;
use super::*;
use crate::store::commit::SyncMode;
use crate::store::contract::{idle_at_500, session_seen_at};
use crate::store::now_ms;
use crate::store::SharedStore;

/// Short, so that the contract's orphan test sees a dropped store's
/// lease run out quickly.
const TEST_LEASE: Duration = Duration::from_millis(600);

// The integration tests' file, not a module of the library: the library
// must not ship test scaffolding, and one copy serves both.
#[path = "../../../tests/common/redis_cluster.rs"]
mod redis_cluster;
#[path = "../../../tests/common/redis_server.rs"]
mod redis_server;

mod footprint;
mod instances;
mod legacy;
mod on_a_three_primary_cluster;
mod retention;
mod spread_over_three_primaries;

fn url() -> String {
    redis_server::shared_url()
}

fn connection() -> redis::Connection {
    redis_server::shared_connection()
}

thread_local! {
    /// Prefixes opened by the test running on this thread.
    static OPENED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Deletes the keys of every prefix the test opened, when dropped (also
/// when the test panics).
#[derive(Default)]
pub struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let prefixes = OPENED.with(|o| std::mem::take(&mut *o.borrow_mut()));
        if prefixes.is_empty() {
            return;
        }
        let conn = redis_server::shared().and_then(|url| redis_server::connect(&url));
        let mut conn = match conn {
            Ok(conn) => conn,
            // The test is failing already, saying why (no Redis, most
            // likely): a second panic here would abort the whole binary.
            Err(_) if std::thread::panicking() => return,
            Err(e) => panic!("cannot delete the test's Redis keys: {e}"),
        };
        for prefix in prefixes {
            assert_eq!(delete_keys(&mut conn, &prefix), 0);
        }
    }
}

fn keys_of(conn: &mut redis::Connection, prefix: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for pattern in [format!("{{{prefix}:*"), format!("{prefix}:*")] {
        let found: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).unwrap();
        keys.extend(found);
    }
    keys
}

/// Deletes the prefix's keys; returns how many are left (0).
fn delete_keys(conn: &mut redis::Connection, prefix: &str) -> usize {
    let keys = keys_of(conn, prefix);
    if !keys.is_empty() {
        redis::cmd("DEL").arg(&keys).query::<()>(conn).unwrap();
    }
    keys_of(conn, prefix).len()
}

/// The test directory's prefix: made once, then read back by reopens.
fn prefix_of(dir: &Path) -> String {
    let file = dir.join("redis-key-prefix");
    match std::fs::read_to_string(&file) {
        Ok(prefix) => prefix,
        Err(_) => {
            let prefix = format!("mcp-resume-proxy-test:{}", StreamId::random());
            std::fs::write(&file, &prefix).unwrap();
            prefix
        }
    }
}

fn open_store(dir: &Path, _sync: SyncMode) -> SharedStore {
    drop(connection());
    let prefix = prefix_of(dir);
    OPENED.with(|o| {
        let mut o = o.borrow_mut();
        if !o.contains(&prefix) {
            o.push(prefix.clone());
        }
    });
    Arc::new(RedisStore::new(&url(), &prefix, TEST_LEASE).unwrap())
}

crate::store::contract::contract_tests!(open_store, guard = Cleanup::default);

/// A store of its own and its key prefix (the directory holds the prefix
/// and must outlive the test).
fn one_store() -> (tempfile::TempDir, SharedStore, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path(), SyncMode::Batch);
    let prefix = prefix_of(dir.path());
    (dir, store, prefix)
}

/// A lookup then a create would let every copy through here (each waits a
/// round trip between the two); the create script decides and creates in
/// one step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_call_created_at_once_make_one_stream() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path(), SyncMode::Never);
    let session = SessionId::random();
    let copies: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            let copy = StreamMeta {
                origin_ids: vec![RequestId("1".into())],
                params_digest: Some("d1".into()),
                ..crate::store::contract::meta(session)
            };
            tokio::spawn(async move { store.create_call(&copy, &[]).await.unwrap() })
        })
        .collect();
    let mut created = 0;
    let mut attached = Vec::new();
    for copy in copies {
        match copy.await.unwrap() {
            None => created += 1,
            Some(Prior::Same(to)) => attached.push(to),
            Some(Prior::Other) => panic!("the same call is never another"),
        }
    }
    assert_eq!(created, 1, "one stream for the call");
    let first = store
        .stream_of_request(session, &RequestId("1".into()))
        .await
        .unwrap();
    assert!(attached.iter().all(|to| Some(*to) == first));
}

/// The keys of stream `id` under `prefix`.
fn keys_of_stream(conn: &mut redis::Connection, prefix: &str, id: StreamId) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}:{id}}}:*"))
        .query(conn)
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_short_stream_is_one_key_and_a_long_one_moves_its_entries_to_a_log_of_seq_ids() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let m = crate::store::contract::meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    let two = [Bytes::from_static(b"a"), Bytes::from_static(b"bc")];
    store.append(m.id, &two).await.unwrap();
    let mut conn = connection();
    let tag = format!("{{{prefix}:{}}}", m.id);
    assert_eq!(
        keys_of_stream(&mut conn, &prefix, m.id),
        vec![format!("{tag}:stream")]
    );
    let counts = store.stream_meta(m.id).await.unwrap().unwrap();
    assert_eq!((counts.entries, counts.bytes), (2, 3));
    // Past what its value keeps: every entry moves to the log, in order.
    let more: Vec<Bytes> = (3..=packed::INLINE_ENTRIES + 1)
        .map(|n| Bytes::from(n.to_string()))
        .collect();
    let last = store.append(m.id, &more).await.unwrap();
    assert_eq!(last, packed::INLINE_ENTRIES + 1);
    assert_eq!(
        keys_of_stream(&mut conn, &prefix, m.id),
        vec![format!("{tag}:log"), format!("{tag}:stream")]
    );
    let ids: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("{tag}:log"))
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    let want: Vec<String> = (1..=last).map(|n| format!("0-{n}")).collect();
    assert_eq!(
        ids.ids.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        want
    );
    let read = store.read_after(m.id, 1, 2).await.unwrap();
    assert_eq!(
        read.iter()
            .map(|e| (e.seq, e.message.clone()))
            .collect::<Vec<_>>(),
        vec![(2, two[1].clone()), (3, Bytes::from_static(b"3"))]
    );
}

#[tokio::test]
async fn opening_entries_too_many_for_the_value_are_written_to_the_log_with_the_stream() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let m = crate::store::contract::meta(SessionId::random());
    let opening: Vec<Bytes> = (1..=packed::INLINE_ENTRIES + 1)
        .map(|n| Bytes::from(n.to_string()))
        .collect();
    store.create_with(&m, &opening).await.unwrap();
    let tag = format!("{{{prefix}:{}}}", m.id);
    assert_eq!(
        keys_of_stream(&mut connection(), &prefix, m.id),
        vec![format!("{tag}:log"), format!("{tag}:stream")]
    );
    let next = store
        .append(m.id, &[Bytes::from_static(b"next")])
        .await
        .unwrap();
    assert_eq!(next, packed::INLINE_ENTRIES + 2);
    let read = store.read_after(m.id, 0, 100).await.unwrap();
    let seqs: Vec<u64> = read.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=next).collect::<Vec<_>>());
    assert_eq!(read[0].message, opening[0]);
}

#[tokio::test]
async fn a_tests_keys_are_gone_after_its_cleanup() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = {
        let _cleanup = Cleanup;
        let store = open_store(dir.path(), SyncMode::Batch);
        let s = crate::store::contract::session(SessionId::random());
        store.put_session(&s).await.unwrap();
        let m = crate::store::contract::meta(s.id);
        store.create_stream(&m).await.unwrap();
        store
            .append(m.id, &[Bytes::from_static(b"x")])
            .await
            .unwrap();
        let prefix = prefix_of(dir.path());
        assert!(!keys_of(&mut connection(), &prefix).is_empty());
        prefix
    };
    assert!(keys_of(&mut connection(), &prefix).is_empty());
}

#[tokio::test]
async fn open_names_the_server_that_does_not_answer() {
    // Port 9 (discard) has no Redis behind it.
    let err = match RedisStore::open("redis://127.0.0.1:9/0", "p", TEST_LEASE).await {
        Ok(_) => panic!("opened a store on a port with no Redis"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("127.0.0.1:9"), "{err}");
}

/// A proxy worker is a single-threaded runtime serving many connections:
/// a reader that first asks Redis where a stream stands must let the
/// others run while it waits.
#[tokio::test(flavor = "current_thread")]
async fn a_first_subscribe_waiting_on_redis_leaves_its_thread_to_the_other_tasks() {
    // A "Redis" that accepts and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/0", silent.local_addr().unwrap());
    let store = Arc::new(
        RedisStore::build(
            super::Route::fixed(redis::Client::open(url.as_str()).unwrap()),
            "silent",
            TEST_LEASE,
        )
        .unwrap(),
    );
    let asking = {
        let store = store.clone();
        tokio::spawn(async move { store.subscribe(StreamId::random()).await })
    };
    let other = tokio::spawn(async { "served" });
    assert_eq!(other.await.unwrap(), "served");
    assert!(!asking.is_finished(), "the subscribe has had no answer yet");
    asking.abort();
}

/// Each worker thread's commands go out on a connection of its own, and
/// code on no worker keeps the first: no command crosses threads to reach
/// Redis.
#[tokio::test]
async fn each_worker_talks_to_redis_on_a_connection_of_its_own() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    drop(open_store(dir.path(), SyncMode::Batch));
    let store = RedisStore::new(&url(), &prefix_of(dir.path()), TEST_LEASE)
        .unwrap()
        .with_workers(2);
    let store = Arc::new(store);
    let client_id = |store: Arc<RedisStore>| async move {
        redis::cmd("CLIENT")
            .arg("ID")
            .query_async::<i64>(&mut store.conn())
            .await
            .unwrap()
    };
    let workers = crate::workers::Workers::start(2).unwrap();
    let (on_workers, hold) = crate::workers::testing::on_workers(&workers, 2, || {
        let store = store.clone();
        async move { (client_id(store.clone()).await, client_id(store).await) }
    });
    drop(hold);
    let off_worker = client_id(store.clone()).await;
    assert_eq!([on_workers[0].0, on_workers[1].0], [1, 2]);
    for (worker, (first, again)) in &on_workers {
        assert_eq!(first, again, "worker {worker} keeps its connection");
    }
    let mut all = vec![on_workers[0].1 .0, on_workers[1].1 .0, off_worker];
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        3,
        "three connections: {on_workers:?}, {off_worker}"
    );
    workers.finish().await;
}

/// A subscribe whose task is dropped between making a stream's tail and
/// reading the stream once more leaves a tail that may have missed a
/// write: the next subscribe reads it again.
#[tokio::test]
async fn a_tail_left_unread_by_a_dropped_subscribe_is_read_by_the_next() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let a = open_store(dir.path(), SyncMode::Batch);
    // No feed listener: nothing but the subscribe may move B's tail.
    let b = RedisStore::build(
        super::Route::fixed(redis::Client::open(url()).unwrap()),
        &prefix_of(dir.path()),
        TEST_LEASE,
    )
    .unwrap();
    let m = crate::store::contract::meta(SessionId::random());
    a.create_stream(&m).await.unwrap();
    let two = [Bytes::from_static(b"x"), Bytes::from_static(b"y")];
    a.append(m.id, &two).await.unwrap();
    // What the dropped subscribe left: a tail read before the appends.
    let stale = Arc::new(Tail::new(Watermark::default()));
    b.follow.tails.insert(m.id, stale);
    assert_eq!(b.subscribe(m.id).await.borrow().seq, 2);
}

#[tokio::test]
async fn a_finished_streams_keys_expire_after_its_retention_and_a_sessions_after_its_idle_time() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let prefix = prefix_of(dir.path());
    OPENED.with(|o| o.borrow_mut().push(prefix.clone()));
    let lifetimes = Lifetimes {
        finished_stream: Duration::from_secs(100),
        session: Duration::from_secs(200),
    };
    let store = RedisStore::new(&url(), &prefix, TEST_LEASE)
        .unwrap()
        .with_lifetimes(lifetimes);
    let s = crate::store::contract::session(SessionId::random());
    store.put_session(&s).await.unwrap();
    // One stream whose entries are in its value, one whose are in its log.
    let (short, long) = (
        crate::store::contract::meta(s.id),
        crate::store::contract::meta(s.id),
    );
    for (m, n) in [(&short, 1), (&long, packed::INLINE_ENTRIES + 1)] {
        store.create_stream(m).await.unwrap();
        let messages = vec![Bytes::from_static(b"a"); n as usize];
        store.append(m.id, &messages).await.unwrap();
    }
    let mut conn = connection();
    let ttl = |conn: &mut redis::Connection, key: String| -> i64 {
        redis::cmd("PTTL").arg(key).query(conn).unwrap()
    };
    let key = |m: &StreamMeta, what: &str| format!("{{{prefix}:{}}}:{what}", m.id);
    let keys = [
        key(&short, "stream"),
        key(&long, "stream"),
        key(&long, "log"),
    ];
    for k in &keys {
        assert_eq!(ttl(&mut conn, k.clone()), -1, "a live stream never expires");
    }
    let session_ttl = ttl(&mut conn, format!("{{{prefix}:{}}}:session", s.id));
    assert!((190_000..=200_000).contains(&session_ttl), "{session_ttl}");
    for m in [&short, &long] {
        let end = Finish::new(crate::store::StreamStatus::Completed, None);
        store.set_status(m.id, end).await.unwrap();
    }
    for k in keys {
        let left = ttl(&mut conn, k.clone());
        assert!((90_000..=100_000).contains(&left), "{k}: {left}");
    }
}

#[tokio::test]
async fn a_tasks_keys_and_its_finished_legs_expire_after_the_tasks_deadline_not_retention() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let prefix = prefix_of(dir.path());
    OPENED.with(|o| o.borrow_mut().push(prefix.clone()));
    let lifetimes = Lifetimes {
        finished_stream: Duration::from_secs(100),
        session: Duration::from_secs(200),
    };
    let store = RedisStore::new(&url(), &prefix, TEST_LEASE)
        .unwrap()
        .with_lifetimes(lifetimes);
    // Expires in 10,000 s: its keys live that long plus the slack.
    let mut t = crate::store::contract::task(TaskId::random(), now_ms(), 10_000_000);
    let (first, second) = (
        crate::store::contract::leg(t.id),
        crate::store::contract::leg(t.id),
    );
    // The first leg is named once it exists, the second exists once named.
    store.create_stream(&first).await.unwrap();
    t.legs.push(first.id);
    store.put_task(&t).await.unwrap();
    t.legs.push(second.id);
    t.version += 1;
    assert!(store.update_task(&t).await.unwrap());
    store.create_stream(&second).await.unwrap();
    // Both outgrow their value: their logs are made after their TTLs were.
    for m in [&first, &second] {
        let many = vec![Bytes::from_static(b"p"); packed::INLINE_ENTRIES as usize];
        store.append(m.id, &many).await.unwrap();
        store
            .append_final(
                m.id,
                &[Bytes::from_static(b"r")],
                Finish::new(crate::store::StreamStatus::Completed, None),
            )
            .await
            .unwrap();
    }
    let mut conn = connection();
    let ttl = |conn: &mut redis::Connection, key: String| -> i64 {
        redis::cmd("PTTL").arg(&key).query(conn).unwrap()
    };
    let lifetime = 10_000_000 + ttl::task(0, 0).as_millis() as i64;
    let mut keys = vec![format!("{{{prefix}:{}}}:task", t.id)];
    for m in [&first, &second] {
        keys.push(format!("{{{prefix}:{}}}:stream", m.id));
        keys.push(format!("{{{prefix}:{}}}:log", m.id));
    }
    for key in keys {
        let left = ttl(&mut conn, key.clone());
        assert!(
            (lifetime - 10_000..=lifetime).contains(&left),
            "{key}: {left}"
        );
    }
    let version: String = redis::cmd("HGET")
        .arg(format!("{{{prefix}:{}}}:task", t.id))
        .arg("version")
        .query(&mut conn)
        .unwrap();
    assert_eq!(version, "2");
}

/// Writes a session the way a version without the idle-session index did:
/// its record and its place in `P:sessions`, nothing else.
fn put_unindexed_session(prefix: &str, session: &SessionRecord) {
    let mut conn = connection();
    let json = serde_json::to_vec(session).unwrap();
    redis::pipe()
        .cmd("SET")
        .arg(format!("{{{prefix}:{}}}:session", session.id))
        .arg(json)
        .cmd("SADD")
        .arg(format!("{prefix}:sessions"))
        .arg(session.id.to_string())
        .query::<()>(&mut conn)
        .unwrap();
}

#[tokio::test]
async fn after_the_first_sweep_idle_sessions_are_found_through_the_index_only() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let (idle, busy) = (session_seen_at(100, None), session_seen_at(900, None));
    for s in [&idle, &busy] {
        store.put_session(s).await.unwrap();
    }
    assert_eq!(
        idle_at_500(&store).await,
        vec![idle.id],
        "the first sweep lists"
    );
    // Not in the index: a sweep that listed every session would find it.
    put_unindexed_session(&prefix, &session_seen_at(100, None));
    let later = session_seen_at(200, None);
    store.put_session(&later).await.unwrap();
    let mut want = vec![idle.id, later.id];
    want.sort();
    assert_eq!(idle_at_500(&store).await, want);
    let seen_again = SessionRecord {
        last_seen_ms: 950,
        ..idle.clone()
    };
    store.put_session(&seen_again).await.unwrap();
    assert_eq!(
        idle_at_500(&store).await,
        vec![later.id],
        "seen again since"
    );
    // Expired by its TTL: not found, and out of the index.
    let mut conn = connection();
    redis::cmd("DEL")
        .arg(format!("{{{prefix}:{}}}:session", later.id))
        .query::<()>(&mut conn)
        .unwrap();
    assert_eq!(idle_at_500(&store).await, Vec::<SessionId>::new());
    let score: Option<u64> = redis::cmd("ZSCORE")
        .arg(format!("{prefix}:sessions:seen"))
        .arg(later.id.to_string())
        .query(&mut conn)
        .unwrap();
    assert_eq!(score, None);
}

#[tokio::test]
async fn a_session_written_without_the_index_is_found_and_indexed_by_the_first_sweep() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let old = session_seen_at(100, None);
    put_unindexed_session(&prefix, &old);
    assert_eq!(idle_at_500(&store).await, vec![old.id]);
    assert_eq!(idle_at_500(&store).await, vec![old.id], "indexed since");
    let score: Option<u64> = redis::cmd("ZSCORE")
        .arg(format!("{prefix}:sessions:seen"))
        .arg(old.id.to_string())
        .query(&mut connection())
        .unwrap();
    assert_eq!(score, Some(100));
}

/// Readiness: Redis counts as unreachable once the lease went unrenewed
/// for as long as it lasts, and as reachable again at the next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_redis_is_unreachable_once_the_lease_went_unrenewed_and_well_again_after() {
    let mut server = redis_server::RedisServer::start(redis_server::Persistence::None)
        .unwrap_or_else(|why| panic!("{why}"));
    let store = RedisStore::open(&server.url(), "health", TEST_LEASE)
        .await
        .unwrap();
    assert_eq!(store.health(), Ok(()));
    server.kill9();
    let killed = std::time::Instant::now();
    let why = health_once(&store, false).await.unwrap_err();
    assert!(
        killed.elapsed() >= TEST_LEASE,
        "not before the lease ran out"
    );
    assert!(why.starts_with("redis unreachable for "), "{why}");
    server.restart();
    assert_eq!(health_once(&store, true).await, Ok(()));
}

/// The store's health once it is (or is not) `well`, within a bound.
async fn health_once(store: &RedisStore, well: bool) -> std::result::Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let health = store.health();
        if health.is_ok() == well {
            return health;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {health:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
