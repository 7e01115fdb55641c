//! A call in flight across a Redis failover, the same whatever finds the
//! new primary (Sentinel, Cluster): a proxy runs a 40-step `slow` call, a
//! second in the failover runs, and the call must end with its result,
//! each progress step once and in order, with the new primary holding
//! exactly what the client got.

use std::future::Future;
use std::time::Duration;

use http::StatusCode;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::store::{Store, StreamKind};
use mcp_resume_proxy::Server;
use serde_json::Value;

use super::{messages, slow_call, Call, McpClient, V_LATEST};

/// Progress notifications the call sends before its result.
const STEPS: u64 = 40;

/// Runs the call through a proxy on `config` (its upstream is set here),
/// with `fail_over` (given the client's session id) a second in; checks that it ended with its result,
/// each step once, and returns the proxy and what the client got, with
/// what the failover gave back.
pub async fn call_across<T, F: Future<Output = T>>(
    mut config: Config,
    fail_over: impl FnOnce(String) -> F,
) -> (Survived, T) {
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    config.upstream = vec![UpstreamConfig::new(upstream.url())];
    config.validate().expect("a valid configuration");
    let server = Server::start(config).await.expect("the proxy starts");
    let url = format!("http://{}/mcp", server.addr);
    let sid = McpClient::new(url.clone()).initialize(V_LATEST).await;
    let session = sid.clone();
    let call = tokio::spawn(async move {
        let res = McpClient::new(url)
            .send(Call::post(&slow_call(2, STEPS, 100)).session(&sid))
            .await;
        (res.status(), messages(res).await)
    });
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let failed_over = fail_over(session).await;
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
        (1..=STEPS).collect::<Vec<_>>(),
        "each step once, in order"
    );
    let survived = Survived {
        server,
        answer,
        _upstream: upstream,
    };
    (survived, failed_over)
}

/// A call that came through a failover.
pub struct Survived {
    pub server: Server,
    /// Every message the client got.
    pub answer: Vec<Value>,
    _upstream: DemoUpstream,
}

impl Survived {
    /// Checks that `held` (a store on the new primary) holds what the
    /// client got, once; then stops the proxy.
    pub async fn held_by(self, held: &dyn Store) {
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
            self.answer.len(),
            "the log holds what the client got"
        );
        self.server.shutdown().await;
    }
}

/// A proxy on the Redis log `prefix`, its data dir `dir` (with the token
/// key), its writes waiting for `min` replicas; where the primary is found
/// (sentinels, cluster nodes) is the caller's to set.
pub fn redis_proxy_config(dir: &std::path::Path, prefix: &str, min: u32) -> Config {
    let key = dir.join("token.key");
    std::fs::write(&key, [7u8; 32]).expect("key file");
    let mut config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.to_path_buf(),
        shutdown_grace_secs: 1,
        upstream: vec![UpstreamConfig::new("http://127.0.0.1:9/mcp")],
        ..Config::default()
    };
    config.store.backend = mcp_resume_proxy::config::Backend::Redis;
    config.store.key_prefix = prefix.into();
    config.store.min_replicas = min;
    config.store.replica_wait_ms = (min > 0).then_some(10_000);
    config.tokens.key_file = Some(key);
    config
}

/// Two instances (each a `config_for` its own data dir) in front of one
/// demo upstream: a `slow` call begun on the first, its stream cut after
/// its first message, is resumed on the second with `Last-Event-ID` and
/// ends there with its result. Hands back the instances, still running.
pub async fn a_call_resumed_on_another_instance(
    config_for: impl Fn(&std::path::Path) -> Config,
) -> (Vec<Server>, DemoUpstream, [tempfile::TempDir; 2]) {
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    let dirs = [tempfile::tempdir(), tempfile::tempdir()].map(|d| d.expect("temp dir"));
    let mut servers = Vec::new();
    for dir in &dirs {
        let mut config = config_for(dir.path());
        config.upstream = vec![UpstreamConfig::new(upstream.url())];
        servers.push(Server::start(config).await.expect("an instance starts"));
    }
    let on = |server: &Server| McpClient::new(format!("http://{}/mcp", server.addr));
    let (a, b) = (on(&servers[0]), on(&servers[1]));
    let sid = a.initialize(V_LATEST).await;
    let res = a.send(Call::post(&slow_call(2, 4, 50)).session(&sid)).await;
    let mut reader = super::SseReader::new(res);
    let (first, _) = reader.next_message().await.expect("a first message");
    drop(reader);
    let first = first.expect("events carry ids");
    let resumed = b
        .send(Call::get().session(&sid).header("last-event-id", &first))
        .await;
    let rest = messages(resumed).await;
    let last = rest.last().expect("the rest of the call, on b");
    assert_eq!(last["id"], 2, "{last}");
    assert!(last.get("result").is_some(), "{last}");
    (servers, upstream, dirs)
}

/// The progress counts and the final answer of a `slow` call's messages.
pub fn progress_and_answer(messages: &[Value]) -> (Vec<u64>, &Value) {
    let progress = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["params"]["progress"].as_u64().expect("a count"))
        .collect();
    (progress, messages.last().expect("an answer"))
}
