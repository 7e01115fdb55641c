//! Redis Cluster (`[store] redis_cluster`): a proxy whose log is on a
//! private cluster of three primaries with a replica each
//! (`common::redis_cluster`). The primary serving the log's slot is killed
//! with `kill -9` while a call runs; the cluster promotes its replica; the
//! call ends as it does across a Sentinel failover (`redis_sentinel.rs`):
//! with its result, each step once, and the log on the new primary holds
//! what the client got.

mod common;

use std::time::{Duration, Instant};

use common::redis_cluster::RedisCluster;
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::{Backend, Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::store::redis::RedisStore;
use mcp_resume_proxy::store::{Store, StreamKind};
use mcp_resume_proxy::Server;

const PREFIX: &str = "cluster-test";
/// How long the cluster may take to promote a replica.
const FAILOVER: Duration = Duration::from_secs(20);

/// A proxy configuration on `cluster`, its data dir `dir` (with the token
/// key), its writes waiting for `min` replicas.
fn proxy_config(cluster: &RedisCluster, dir: &std::path::Path, min: u32) -> Config {
    let key = dir.join("token.key");
    std::fs::write(&key, [7u8; 32]).expect("key file");
    let mut config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.to_path_buf(),
        shutdown_grace_secs: 1,
        upstream: vec![UpstreamConfig::new("http://127.0.0.1:9/mcp")],
        ..Config::default()
    };
    config.store.backend = Backend::Redis;
    config.store.redis_cluster = cluster.urls();
    config.store.key_prefix = PREFIX.into();
    config.store.min_replicas = min;
    config.store.replica_wait_ms = (min > 0).then_some(10_000);
    config.tokens.key_file = Some(key);
    config
}

/// The progress counts and the final answer of a `slow` call's messages.
fn progress_and_answer(messages: &[serde_json::Value]) -> (Vec<u64>, &serde_json::Value) {
    let progress = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["params"]["progress"].as_u64().expect("a count"))
        .collect();
    (progress, messages.last().expect("an answer"))
}

/// Kills the primary serving the log's slot, waits until a replica took
/// it over, and starts the killed node again (it rejoins as a replica, so
/// that the promoted primary's writes find one to wait for).
fn fail_over_the_logs_primary(cluster: &mut RedisCluster) {
    let slot_key = format!("{{{PREFIX}}}");
    let port = cluster
        .primary_of(&slot_key)
        .expect("a primary serves the log");
    let node = cluster
        .nodes
        .iter_mut()
        .find(|n| n.port == port)
        .expect("one of ours");
    node.kill9();
    let deadline = Instant::now() + FAILOVER;
    while cluster.primary_of(&slot_key).is_none_or(|p| p == port) {
        assert!(Instant::now() < deadline, "no replica took the slot over");
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(node) = cluster.nodes.iter_mut().find(|n| n.port == port) {
        node.restart();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_survives_the_logs_primary_killed_with_min_replicas() {
    let mut cluster = RedisCluster::start(3, 1).unwrap_or_else(|why| panic!("{why}"));
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = proxy_config(&cluster, dir.path(), 1);
    config.upstream = vec![UpstreamConfig::new(upstream.url())];
    config.validate().expect("a valid configuration");
    let server = Server::start(config).await.expect("the proxy starts");
    let url = format!("http://{}/mcp", server.addr);
    let sid = McpClient::new(url.clone()).initialize(V_LATEST).await;
    let steps = 40;
    let call = {
        let client = McpClient::new(url);
        tokio::spawn(async move {
            let res = client
                .send(Call::post(&slow_call(2, steps, 100)).session(&sid))
                .await;
            (res.status(), messages(res).await)
        })
    };
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let cluster = tokio::task::spawn_blocking(move || {
        fail_over_the_logs_primary(&mut cluster);
        cluster
    })
    .await
    .expect("the failover");
    let (status, answer) = tokio::time::timeout(Duration::from_secs(40), call)
        .await
        .expect("the call ends")
        .expect("the task");
    assert_eq!(status, StatusCode::OK);
    let (progress, last) = progress_and_answer(&answer);
    assert_eq!(last["id"], 2, "{last}");
    assert!(
        last.get("result").is_some(),
        "the call ends with its result: {last}"
    );
    assert_eq!(
        progress,
        (1..=steps).collect::<Vec<_>>(),
        "each step once, in order"
    );
    // Every entry the client was sent is on the new primary, once.
    let held =
        RedisStore::clustered(&cluster.urls(), PREFIX, Duration::from_secs(10)).expect("a store");
    let streams = held.list_streams().await.expect("listed");
    let call_stream = streams
        .iter()
        .find(|s| s.kind == StreamKind::Request && s.entries > 1)
        .expect("the call's stream");
    let entries = held
        .read_after(call_stream.id, 0, 1_000)
        .await
        .expect("read");
    assert_eq!(
        entries.len(),
        answer.len(),
        "the log holds what the client got"
    );
    server.shutdown().await;
}
