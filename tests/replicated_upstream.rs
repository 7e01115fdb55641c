//! One `[[upstream]]` with several replicas (`urls`): each upstream session
//! stays on the replica that created it — through a proxy restart and on
//! another instance sharing the log — new sessions go to the least busy
//! healthy replica, a replica that fails is taken out for a while, and the
//! sessions of a replica that died continue on another with the client's
//! session kept. The replicas are demo upstreams, whose own request logs
//! say which upstream sessions reached each of them.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::replicas::{echo, sessions};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A proxy in front of `n` demo replicas listed under one `urls`.
struct Replicated {
    replicas: Vec<DemoUpstream>,
    proxy: Option<Server>,
    client: McpClient,
    config: Config,
    _dir: tempfile::TempDir,
}

impl Replicated {
    async fn start(n: usize) -> Self {
        Self::with(n, |_| {}).await
    }

    async fn with(n: usize, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut replicas = Vec::new();
        for _ in 0..n {
            let up = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default());
            replicas.push(up.await.expect("a replica starts"));
        }
        let urls = replicas.iter().map(DemoUpstream::url).collect();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = replicated_config(dir.path(), urls);
        tweak(&mut config);
        config.validate().expect("a valid configuration");
        let proxy = Server::start(config.clone()).await.expect("proxy starts");
        let client = McpClient::new(format!("http://{}/mcp", proxy.addr));
        Self {
            replicas,
            proxy: Some(proxy),
            client,
            config,
            _dir: dir,
        }
    }

    /// Upstream sessions each replica created.
    fn created(&self) -> Vec<u64> {
        let count = |r: &DemoUpstream| r.stats.sessions_created.load(Ordering::Relaxed);
        self.replicas.iter().map(count).collect()
    }

    /// The upstream session ids that reached replica `i`, from its own log.
    fn seen_by(&self, i: usize) -> HashSet<String> {
        let requests = self.replicas[i].stats.requests.lock().unwrap();
        requests.iter().filter_map(session_id).collect()
    }

    /// Stops the proxy and starts it again on the same data dir.
    async fn restart_proxy(&mut self) {
        if let Some(proxy) = self.proxy.take() {
            proxy.shutdown().await;
        }
        let mut config = self.config.clone();
        config.listen = ([127, 0, 0, 1], 0).into();
        let proxy = Server::start(config).await.expect("proxy starts again");
        self.client = McpClient::new(format!("http://{}/mcp", proxy.addr));
        self.proxy = Some(proxy);
    }

    /// Kills replica `i` and waits until nothing answers at its address.
    async fn kill(&self, i: usize) {
        self.replicas[i].shutdown();
        let addr = self.replicas[i].addr;
        eventually_async("the replica stops accepting", || async move {
            tokio::net::TcpStream::connect(addr).await.is_err()
        })
        .await;
    }
}

fn replicated_config(dir: &std::path::Path, urls: Vec<String>) -> Config {
    let upstream = UpstreamConfig {
        url: None,
        urls: Some(urls),
        ..UpstreamConfig::new("")
    };
    Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.to_path_buf(),
        upstream: vec![upstream],
        shutdown_grace_secs: 1,
        ..Config::default()
    }
}

async fn eventually_async<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every round, each session calls once.
async fn calls(client: &McpClient, sids: &[String], rounds: u64, first_id: u64) {
    for round in 0..rounds {
        for (k, sid) in sids.iter().enumerate() {
            echo(client, sid, first_id + round * 100 + k as u64).await;
        }
    }
}

/// No upstream session reached two replicas.
fn disjoint(rig: &Replicated) {
    let seen: Vec<HashSet<String>> = (0..rig.replicas.len()).map(|i| rig.seen_by(i)).collect();
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            assert!(a.is_disjoint(b), "an upstream session on two replicas");
        }
    }
}

#[tokio::test]
async fn each_session_sticks_to_the_replica_that_created_it() {
    let rig = Replicated::start(3).await;
    let sids = sessions(&rig.client, 9).await;
    calls(&rig.client, &sids, 3, 10).await;
    assert_eq!(rig.created(), [3, 3, 3], "spread, and never re-initialized");
    disjoint(&rig);
    for i in 0..3 {
        assert_eq!(
            rig.seen_by(i).len(),
            3,
            "replica {i} served its own sessions"
        );
    }
}

#[tokio::test]
async fn new_sessions_go_to_the_least_busy_replica() {
    let rig = Replicated::start(2).await;
    let first = rig.client.initialize(V_LATEST).await;
    let busy = rig
        .created()
        .iter()
        .position(|&n| n == 1)
        .expect("one replica");
    let mut slow = Vec::new();
    for id in [2, 3] {
        let call = Call::post(&slow_call(id, 40, 100)).session(&first);
        let mut reader = SseReader::new(rig.client.send(call).await);
        reader.next_message().await.expect("the call runs");
        slow.push(reader);
    }
    sessions(&rig.client, 3).await;
    let mut expected = [3, 3];
    expected[busy] = 1;
    assert_eq!(rig.created(), expected, "the busy replica took none");
}

#[tokio::test]
async fn a_killed_replica_s_sessions_continue_on_another_with_the_client_session_kept() {
    let rig = Replicated::start(3).await;
    let sids = sessions(&rig.client, 6).await;
    calls(&rig.client, &sids, 1, 10).await;
    assert_eq!(rig.created(), [2, 2, 2]);
    rig.kill(1).await;

    calls(&rig.client, &sids, 2, 1_000).await;
    let created = rig.created();
    assert_eq!(created[1], 2);
    assert_eq!(created[0] + created[2], 6, "two sessions moved, once each");
    let moved = rig.seen_by(1);
    let now_on: HashSet<String> = rig.seen_by(0).union(&rig.seen_by(2)).cloned().collect();
    assert!(
        moved.is_disjoint(&now_on),
        "their old upstream sessions stayed"
    );

    let fresh = rig.client.initialize(V_LATEST).await;
    echo(&rig.client, &fresh, 5_000).await;
    assert_eq!(rig.created()[1], 2, "the dead replica took no new session");
}

#[tokio::test]
async fn a_session_stays_on_its_replica_across_a_proxy_restart() {
    let mut rig = Replicated::start(3).await;
    let sids = sessions(&rig.client, 6).await;
    calls(&rig.client, &sids, 1, 10).await;
    rig.restart_proxy().await;
    // Ties start over at the first replica: only the record can say where
    // each session lives.
    calls(&rig.client, &sids, 2, 1_000).await;
    assert_eq!(rig.created(), [2, 2, 2], "no session re-initialized");
    disjoint(&rig);
}

#[tokio::test]
async fn a_session_stays_on_its_replica_on_another_instance_sharing_the_log() {
    let url = common::cluster::redis_url();
    drop(common::cluster::require_redis(&url));
    let prefix = format!(
        "mcp-resume-proxy-test:{}",
        mcp_resume_proxy::id::StreamId::random()
    );
    let rig = Replicated::with(3, |c| shared_log(c, &url, &prefix)).await;
    let sids = sessions(&rig.client, 6).await;
    let b_dir = tempfile::tempdir().expect("temp dir");
    let mut other = rig.config.clone();
    other.listen = ([127, 0, 0, 1], 0).into();
    other.data_dir = b_dir.path().to_path_buf();
    let b = Server::start(other).await.expect("instance b starts");
    let on_b = McpClient::new(format!("http://{}/mcp", b.addr));
    calls(&on_b, &sids, 2, 10).await;
    assert_eq!(rig.created(), [2, 2, 2], "no session re-initialized");
    disjoint(&rig);
    b.shutdown().await;
    common::cluster::delete_prefix(&url, &prefix);
}

#[tokio::test]
async fn the_sessions_of_a_replica_dropped_from_urls_move_on_reload() {
    let rig = Replicated::start(3).await;
    let sids = sessions(&rig.client, 6).await;
    calls(&rig.client, &sids, 1, 10).await;
    let mut fewer = rig.config.clone();
    let kept = [rig.replicas[0].url(), rig.replicas[2].url()];
    fewer.upstream[0].urls = Some(kept.to_vec());
    let proxy = rig.proxy.as_ref().expect("running");
    proxy.reload(fewer).expect("the reload applies");
    let reached = rig.replicas[1].stats.requests.lock().unwrap().len();

    calls(&rig.client, &sids, 2, 1_000).await;
    let created = rig.created();
    assert_eq!(
        created[0] + created[2],
        6,
        "its two sessions moved, the others stayed"
    );
    let now = rig.replicas[1].stats.requests.lock().unwrap().len();
    assert_eq!(now, reached, "nothing more reached the dropped replica");
}

fn shared_log(config: &mut Config, url: &str, prefix: &str) {
    use mcp_resume_proxy::config::Backend;
    let key = config.data_dir.join("token.key");
    std::fs::write(&key, [7u8; 32]).expect("key file");
    config.store.backend = Backend::Redis;
    config.store.redis_url = url.to_owned();
    config.store.key_prefix = prefix.to_owned();
    config.tokens.key_file = Some(key);
}

/// A replica that answers every request with one error status (HTTP 502
/// unless said), counting them.
struct Failing {
    url: String,
    hits: Arc<AtomicU64>,
}

impl Failing {
    async fn start() -> Self {
        Self::answering("502 Bad Gateway").await
    }

    async fn answering(status: &'static str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let hits = Arc::new(AtomicU64::new(0));
        let counted = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    read_request(&mut conn).await;
                    counted.fetch_add(1, Ordering::Relaxed);
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                });
            }
        });
        Self { url, hits }
    }

    fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

/// Reads one request's head and its Content-Length body.
async fn read_request(conn: &mut tokio::net::TcpStream) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Ok(n) = conn.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length = text[..end]
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if got.len() >= end + 4 + length {
            return;
        }
    }
}

#[tokio::test]
async fn a_replica_failing_with_502_is_taken_out_then_tried_again_after_its_back_off() {
    let failing = Failing::start().await;
    let good = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = replicated_config(dir.path(), vec![good.url(), failing.url.clone()]);
    config.upstream[0].eject_after = 2;
    config.upstream[0].eject_ms = 1_000;
    let proxy = Server::start(config).await.unwrap();
    let client = McpClient::new(format!("http://{}/mcp", proxy.addr));

    let mut refused = 0;
    for _ in 0..6 {
        let res = client.send(Call::post(&initialize(V_LATEST))).await;
        refused += u64::from(res.status() == StatusCode::BAD_GATEWAY);
    }
    assert_eq!(failing.hits(), 2, "out after two failures in a row");
    assert_eq!(refused, 2, "passed through as they came");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for _ in 0..4 {
        client.send(Call::post(&initialize(V_LATEST))).await;
    }
    assert_eq!(failing.hits(), 3, "tried once on its return, out again");
    let created = good.stats.sessions_created.load(Ordering::Relaxed);
    assert_eq!(created, 7);
}

#[tokio::test]
async fn a_replica_answering_503_as_it_drains_takes_no_new_sessions() {
    let draining = Failing::answering("503 Service Unavailable").await;
    let good = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = replicated_config(dir.path(), vec![good.url(), draining.url.clone()]);
    config.upstream[0].eject_after = 2;
    config.upstream[0].eject_ms = 60_000;
    let proxy = Server::start(config).await.unwrap();
    let client = McpClient::new(format!("http://{}/mcp", proxy.addr));
    for _ in 0..8 {
        client.send(Call::post(&initialize(V_LATEST))).await;
    }
    assert_eq!(draining.hits(), 2, "out after two 503s in a row");
    proxy.shutdown().await;
}

/// The binary given `upstream` under `[[upstream]]`: its exit and stderr.
fn run_with_upstream(upstream: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    std::fs::write(&file, format!("[[upstream]]\n{upstream}\n")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--config")
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the proxy started with {upstream}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn refused_naming(upstream: &str, key: &str) {
    let out = run_with_upstream(upstream);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(key), "{err}");
}

#[test]
fn a_replica_list_with_duplicates_is_refused_at_start() {
    refused_naming(
        r#"urls = ["http://127.0.0.1:1/mcp", "http://127.0.0.1:2/mcp", "http://127.0.0.1:1/mcp"]"#,
        "upstream[0].urls[2]",
    );
}

#[test]
fn a_replica_list_with_one_bad_url_is_refused_at_start() {
    refused_naming(
        r#"urls = ["http://127.0.0.1:1/mcp", "ftp://127.0.0.1:2/mcp"]"#,
        "upstream[0].urls[1]",
    );
}

#[test]
fn an_empty_replica_list_is_refused_at_start() {
    refused_naming("urls = []", "upstream[0].urls");
}

#[test]
fn a_replica_list_beside_a_url_is_refused_at_start() {
    refused_naming(
        "url = \"http://127.0.0.1:1/mcp\"\nurls = [\"http://127.0.0.1:2/mcp\"]",
        "`urls`",
    );
}

#[test]
fn a_resolve_interval_of_zero_is_refused_at_start() {
    refused_naming(
        "url = \"http://localhost:1/mcp\"\nresolve = \"each\"\nresolve_every_ms = 0",
        "upstream[0].resolve_every_ms",
    );
}

#[test]
fn a_health_interval_of_zero_is_refused_at_start() {
    refused_naming(
        r#"urls = ["http://127.0.0.1:1/mcp", "http://127.0.0.1:2/mcp"]
health_path = "/healthz"
health_every_ms = 0"#,
        "upstream[0].health_every_ms",
    );
}

#[test]
fn a_resolved_host_with_no_address_is_refused_at_start_saying_why() {
    // `.invalid` never resolves (RFC 6761).
    let out = run_with_upstream("url = \"http://no-such-host.invalid/mcp\"\nresolve = \"each\"");
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-host.invalid"), "{err}");
    assert!(err.contains("resolves to no address"), "{err}");
}
