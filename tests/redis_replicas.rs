//! Writes that survive a failover (`[store] min_replicas`): real
//! `redis-server` primaries with a replica each (`--replicaof`), the
//! replica stopped with `SIGSTOP` where a test needs it to acknowledge
//! nothing. What a write is answered with is checked against what the
//! replica holds, read from the replica itself, and against what the
//! primary counted (`INFO commandstats`: how many `WAIT`s it was sent).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::redis_server::{Persistence, RedisServer};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::UpstreamConfig;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::id::{SessionId, StreamId};
use mcp_resume_proxy::store::redis::endpoint::Endpoint;
use mcp_resume_proxy::store::redis::{RedisStore, Replicas};
use mcp_resume_proxy::store::{now_ms, Finish, SessionRecord, Store, StreamStatus};
use mcp_resume_proxy::Server;

const PREFIX: &str = "replicas-test";

/// A primary (no persistence) and its replica, linked.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start(Persistence::None).unwrap_or_else(|why| panic!("{why}"));
    let replica = RedisServer::start_replica_of(&primary).unwrap_or_else(|why| panic!("{why}"));
    (primary, replica)
}

/// A replica stopped (`SIGSTOP`) until this is dropped, also when the
/// test fails.
struct Stopped<'a>(&'a RedisServer);

impl<'a> Stopped<'a> {
    fn new(replica: &'a RedisServer) -> Self {
        replica.pause();
        Stopped(replica)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// A store on `primary` whose writes wait for `min` replicas for `wait`.
async fn store_on(primary: &RedisServer, min: u32, wait: Duration) -> RedisStore {
    let lease = Duration::from_secs(10);
    let store = RedisStore::open(&primary.url(), PREFIX, lease)
        .await
        .expect("the primary answers");
    store.with_replicas(Replicas { min, wait })
}

/// A store that only reads, on `replica`.
async fn reader_on(replica: &RedisServer) -> RedisStore {
    let at = Endpoint {
        url: replica.url(),
        ..Endpoint::default()
    };
    RedisStore::observer(&at, PREFIX)
        .await
        .expect("the replica answers")
}

fn session_record() -> SessionRecord {
    SessionRecord {
        protocol_version: Some(V_LATEST.into()),
        ..SessionRecord::new(SessionId::random(), "/mcp", "p", now_ms())
    }
}

fn message(text: &'static str) -> Bytes {
    Bytes::from_static(text.as_bytes())
}

/// The messages of `stream` as the replica holds them.
async fn on_replica(replica: &RedisServer, stream: StreamId) -> Vec<Bytes> {
    let reader = reader_on(replica).await;
    let entries = reader.read_after(stream, 0, 100).await.expect("read");
    entries.into_iter().map(|e| e.message).collect()
}

/// How many `WAIT`s `server` ran since it started.
fn waits_on(server: &RedisServer) -> u64 {
    let mut conn = redis_server::connect(&server.url()).expect("the server answers");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .expect("INFO commandstats");
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

/// The error a write waiting `ms` for one stopped replica fails with.
fn too_few(ms: u64) -> String {
    format!("acknowledged by only 0 of 1 replicas within {ms} ms")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_an_append_is_acknowledged_once_a_replica_has_it() {
    let (primary, replica) = primary_and_replica();
    let store = Arc::new(store_on(&primary, 1, Duration::from_secs(5)).await);
    let meta = call_meta();
    store.create_stream(&meta).await.expect("created");
    let stopped = Stopped::new(&replica);
    let appending = {
        let store = store.clone();
        tokio::spawn(async move { store.append(meta.id, &[message("one")]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !appending.is_finished(),
        "the append is answered while its replica is stopped"
    );
    drop(stopped);
    let seq = tokio::time::timeout(LIMIT, appending)
        .await
        .expect("the append is answered once the replica is back")
        .expect("the task")
        .expect("the append succeeds");
    assert_eq!(seq, 1);
    assert_eq!(on_replica(&replica, meta.id).await, [message("one")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_stopped_a_write_fails_with_the_replicas_named_and_nothing_is_acknowledged(
) {
    let (primary, replica) = primary_and_replica();
    let store = store_on(&primary, 1, Duration::from_millis(300)).await;
    let meta = call_meta();
    store.create_stream(&meta).await.expect("created");
    let stopped = Stopped::new(&replica);
    let started = Instant::now();
    let err = store
        .append(meta.id, &[message("one")])
        .await
        .expect_err("no replica acknowledged the append");
    let took = started.elapsed();
    assert!(err.to_string().contains(&too_few(300)), "{err}");
    assert!(
        (Duration::from_millis(300)..Duration::from_secs(3)).contains(&took),
        "{took:?}"
    );
    let end = Finish::new(StreamStatus::Completed, None);
    let err = store
        .set_status(meta.id, end)
        .await
        .expect_err("no replica acknowledged the ending");
    assert!(err.to_string().contains(&too_few(300)), "{err}");
    drop(stopped);
}

/// The call's own instance tells its readers of an entry only once the
/// store answered its write, after the `WAIT`: it reads no feed for the
/// calls it writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_stopped_the_calls_own_readers_are_not_told_of_the_unacknowledged_entry() {
    let (primary, replica) = primary_and_replica();
    let store = store_on(&primary, 1, Duration::from_millis(300)).await;
    let meta = call_meta();
    store.create_stream(&meta).await.expect("created");
    let stopped = Stopped::new(&replica);
    let appended = store.append(meta.id, &[message("one")]).await;
    assert!(appended.is_err(), "no replica acknowledged the append");
    let mark = store.peek(meta.id).expect("the creator's tail");
    assert_eq!(
        mark.seq, 0,
        "this instance's readers were told of the entry"
    );
    drop(stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_a_session_record_waits_for_the_replica_too() {
    let (primary, replica) = primary_and_replica();
    let store = store_on(&primary, 1, Duration::from_millis(300)).await;
    let session = session_record();
    let stopped = Stopped::new(&replica);
    let err = store
        .put_session(&session)
        .await
        .expect_err("no replica acknowledged the session");
    assert!(err.to_string().contains(&too_few(300)), "{err}");
    drop(stopped);
    store
        .put_session(&session)
        .await
        .expect("written, replica up");
    let reader = reader_on(&replica).await;
    let held = reader.get_session(session.id).await.expect("read");
    assert_eq!(held, Some(session));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_lost_its_scripts_is_sent_them_and_the_write_still_waits() {
    let (primary, replica) = primary_and_replica();
    let store = store_on(&primary, 1, Duration::from_millis(300)).await;
    let meta = call_meta();
    store.create_stream(&meta).await.expect("created");
    let flush = || {
        let mut conn = redis_server::connect(&primary.url()).expect("the primary");
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query::<()>(&mut conn)
            .expect("SCRIPT FLUSH");
    };
    flush();
    let stopped = Stopped::new(&replica);
    let err = store
        .append(meta.id, &[message("one")])
        .await
        .expect_err("no replica acknowledged the append");
    assert!(err.to_string().contains(&too_few(300)), "{err}");
    drop(stopped);
    flush();
    let seq = store.append(meta.id, &[message("two")]).await;
    assert_eq!(seq.expect("the script is loaded again"), 2);
    let held = on_replica(&replica, meta.id).await;
    assert_eq!(held, [message("one"), message("two")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_min_replicas_no_wait_is_sent() {
    let (primary, replica) = primary_and_replica();
    let store = store_on(&primary, 0, Duration::from_millis(300)).await;
    // Acknowledged at once, though the replica acknowledges nothing.
    let stopped = Stopped::new(&replica);
    let meta = call_meta();
    store.create_stream(&meta).await.expect("created");
    store
        .append(meta.id, &[message("one")])
        .await
        .expect("appended");
    store.put_session(&session_record()).await.expect("written");
    drop(stopped);
    assert_eq!(waits_on(&primary), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_each_acknowledged_write_sends_one_wait() {
    let (primary, _replica) = primary_and_replica();
    let store = store_on(&primary, 1, Duration::from_secs(5)).await;
    // The scripts' first runs load them (a NOSCRIPT, then the same again).
    let warm = call_meta();
    store.create_stream(&warm).await.expect("created");
    store
        .append(warm.id, &[message("one")])
        .await
        .expect("appended");
    let before = waits_on(&primary);
    let meta = call_meta();
    store.create_stream(&meta).await.expect("created");
    store
        .append(meta.id, &[message("one")])
        .await
        .expect("appended");
    let end = Finish::new(StreamStatus::Completed, None);
    store.set_status(meta.id, end).await.expect("finished");
    store.put_session(&session_record()).await.expect("written");
    assert_eq!(waits_on(&primary) - before, 4);
}

/// A proxy on a primary whose writes wait for its one replica for
/// `wait_ms`, in front of a demo upstream, and a client's session on it.
struct ProxyWithReplica {
    primary: RedisServer,
    replica: RedisServer,
    server: Server,
    client: McpClient,
    sid: String,
    _upstream: DemoUpstream,
    _dir: tempfile::TempDir,
}

impl ProxyWithReplica {
    async fn start(wait_ms: u64) -> Self {
        let (primary, replica) = primary_and_replica();
        let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
            .await
            .expect("demo upstream starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = failover::redis_proxy_config(dir.path(), PREFIX, 1);
        config.upstream = vec![UpstreamConfig::new(upstream.url())];
        config.store.redis_url = primary.url();
        config.store.replica_wait_ms = Some(wait_ms);
        config.validate().expect("a valid configuration");
        let server = Server::start(config).await.expect("the proxy starts");
        let client = McpClient::new(format!("http://{}/mcp", server.addr));
        let sid = client.initialize(V_LATEST).await;
        Self {
            primary,
            replica,
            server,
            client,
            sid,
            _upstream: upstream,
            _dir: dir,
        }
    }

    /// A `slow` call of this session with `id`, sending `steps` progress
    /// notifications.
    async fn call(&self, id: u64, steps: u64) -> http::Response<hyper::body::Incoming> {
        self.client
            .send(Call::post(&slow_call(id, steps, 10)).session(&self.sid))
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_proxy_a_call_is_answered_while_a_replica_acknowledges_its_writes() {
    let rig = ProxyWithReplica::start(1_000).await;
    let res = rig.call(2, 3).await;
    assert_eq!(res.status(), StatusCode::OK);
    let answer = messages(res).await;
    let last = answer.last().expect("the call's answer");
    assert_eq!(last["id"], 2, "{last}");
    assert!(last.get("result").is_some(), "{last}");
    assert!(
        waits_on(&rig.primary) > 0,
        "the writes waited for the replica"
    );
    rig.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_proxy_a_call_with_the_replica_stopped_is_refused_within_the_wait() {
    let rig = ProxyWithReplica::start(300).await;
    let stopped = Stopped::new(&rig.replica);
    let started = Instant::now();
    let res = rig.call(2, 3).await;
    let took = started.elapsed();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = body_json(res).await;
    assert_eq!(body["error"]["code"], -32603, "{body}");
    assert_eq!(
        body["error"]["message"], "the proxy's log is unavailable",
        "{body}"
    );
    assert!(
        (Duration::from_millis(300)..Duration::from_secs(5)).contains(&took),
        "{took:?}"
    );
    drop(stopped);
    let answer = messages(rig.call(3, 1).await).await;
    let last = answer.last().expect("an answer with the replica back");
    assert_eq!(last["id"], 3, "{last}");
    rig.server.shutdown().await;
}

/// A reader on another instance may be woken by the append script's feed
/// line before the `WAIT`, but what it reads is shown only once the
/// replicas hold it: its read waits for them as a write does, and fails
/// while they cannot say so, rather than show what a failover could lose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_stopped_a_reader_on_another_instance_is_shown_no_unacknowledged_entry() {
    let (primary, replica) = primary_and_replica();
    let writer = store_on(&primary, 1, Duration::from_millis(300)).await;
    let meta = call_meta();
    writer.create_stream(&meta).await.expect("created");
    writer
        .append(meta.id, &[message("one")])
        .await
        .expect("held");
    let elsewhere = store_on(&primary, 1, Duration::from_millis(300)).await;
    let stopped = Stopped::new(&replica);
    let appended = writer.append(meta.id, &[message("two")]).await;
    assert!(appended.is_err(), "no replica acknowledged the append");
    let err = elsewhere
        .read_after(meta.id, 0, 10)
        .await
        .expect_err("entries shown while the replica lacks one");
    assert!(err.to_string().contains(&too_few(300)), "{err}");
    assert!(err.to_string().contains("not shown"), "{err}");
    let err = elsewhere
        .stream_meta(meta.id)
        .await
        .expect_err("a count shown while the replica lacks an entry");
    assert!(err.to_string().contains(&too_few(300)), "{err}");
    drop(stopped);
    let read = elsewhere
        .read_after(meta.id, 0, 10)
        .await
        .expect("shown once the replica holds it");
    let read: Vec<Bytes> = read.into_iter().map(|e| e.message).collect();
    assert_eq!(read, [message("one"), message("two")]);
    assert_eq!(on_replica(&replica, meta.id).await, read);
}

/// Without `min_replicas` a read sends nothing but itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_min_replicas_a_read_sends_no_wait() {
    let (primary, _replica) = primary_and_replica();
    let writer = store_on(&primary, 0, Duration::from_millis(300)).await;
    let meta = call_meta();
    writer.create_stream(&meta).await.expect("created");
    writer
        .append(meta.id, &[message("one")])
        .await
        .expect("written");
    let before = waits_on(&primary);
    let elsewhere = store_on(&primary, 0, Duration::from_millis(300)).await;
    elsewhere.read_after(meta.id, 0, 10).await.expect("read");
    elsewhere.stream_meta(meta.id).await.expect("read");
    assert_eq!(waits_on(&primary), before);
}
