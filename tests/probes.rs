//! `/livez`, `/readyz` and the drain: what an orchestrator and a load
//! balancer are told while the proxy starts, serves, drains after a
//! SIGTERM, and cannot write its log; and that `/healthz` keeps its meaning.
//! Real HTTP on loopback, against an in-process proxy or (for the signals)
//! the binary.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::process::{free_addr, OnAFile, ProxyProcess};
use common::redis_server::{Persistence, RedisServer};
use common::unwritable::{self, Unwritable};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::{Backend, Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::store::commit::SyncMode;
use mcp_resume_proxy::store::sled::SledStore;
use mcp_resume_proxy::Server;

/// Status and body of `GET path` on the proxy at `addr`.
async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    get_with(addr, path, Call::get()).await
}

async fn get_with(addr: SocketAddr, path: &str, call: Call) -> (StatusCode, String) {
    let res = McpClient::new(format!("http://{addr}{path}"))
        .send(call)
        .await;
    let status = res.status();
    let body = String::from_utf8(body_bytes(res).await.to_vec()).expect("UTF-8");
    (status, body)
}

fn answer(status: StatusCode, text: &str) -> (StatusCode, String) {
    (status, format!("{text}\n"))
}

fn addr_of(rig: &Rig) -> SocketAddr {
    rig.proxy.as_ref().expect("a proxy").addr
}

// ---------------------------------------------------------------------------
// Serving

#[tokio::test]
async fn livez_answers_200_live() {
    let rig = Rig::start().await;
    assert_eq!(
        get(addr_of(&rig), "/livez").await,
        answer(StatusCode::OK, "live")
    );
}

#[tokio::test]
async fn readyz_answers_200_ready_once_the_proxy_serves() {
    let rig = Rig::start().await;
    assert_eq!(
        get(addr_of(&rig), "/readyz").await,
        answer(StatusCode::OK, "ready")
    );
}

#[tokio::test]
async fn the_probes_skip_the_host_and_origin_checks() {
    let rig = Rig::start().await;
    let foreign = || {
        Call::get()
            .header("host", "evil.example")
            .header("origin", "http://evil.example")
    };
    let addr = addr_of(&rig);
    assert_eq!(
        get_with(addr, "/mcp", foreign()).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(get_with(addr, "/livez", foreign()).await.0, StatusCode::OK);
    assert_eq!(get_with(addr, "/readyz", foreign()).await.0, StatusCode::OK);
}

// ---------------------------------------------------------------------------
// Starting: a proxy whose sled log is held by another handle waits for it
// (up to two seconds) before it serves.

struct Starting {
    addr: SocketAddr,
    holder: Option<SledStore>,
    start: tokio::task::JoinHandle<anyhow::Result<Server>>,
    _upstream: DemoUpstream,
    _dir: tempfile::TempDir,
}

impl Starting {
    /// A proxy that has bound its port and waits to open its log.
    async fn begin() -> Starting {
        let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
            .await
            .expect("demo upstream starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let holder = SledStore::open(dir.path(), SyncMode::Batch).expect("sled opens");
        let addr = free_addr();
        let mut config = Config {
            listen: addr,
            data_dir: dir.path().to_path_buf(),
            upstream: vec![UpstreamConfig::new(upstream.url())],
            shutdown_grace_secs: 1,
            ..Config::default()
        };
        config.store.backend = Backend::Sled;
        let start = tokio::spawn(Server::start(config));
        let deadline = Instant::now() + LIMIT;
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "the proxy never bound {addr}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!start.is_finished(), "the proxy waits for its log");
        Starting {
            addr,
            holder: Some(holder),
            start,
            _upstream: upstream,
            _dir: dir,
        }
    }

    /// Lets the log go: the proxy opens it and serves.
    async fn finish(mut self) -> Server {
        drop(self.holder.take());
        let start = tokio::time::timeout(LIMIT, &mut self.start).await;
        start
            .expect("the proxy starts in time")
            .expect("the start task")
            .expect("the proxy starts")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_starting_while_the_log_is_opened() {
    let starting = Starting::begin().await;
    let during = get(starting.addr, "/readyz").await;
    let addr = starting.addr;
    let _server = starting.finish().await;
    assert_eq!(during, answer(StatusCode::SERVICE_UNAVAILABLE, "starting"));
    assert_eq!(get(addr, "/readyz").await, answer(StatusCode::OK, "ready"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livez_answers_while_the_log_is_opened() {
    let starting = Starting::begin().await;
    let during = get(starting.addr, "/livez").await;
    let _server = starting.finish().await;
    assert_eq!(during, answer(StatusCode::OK, "live"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_waits_for_the_log_to_be_open_as_before() {
    let starting = Starting::begin().await;
    let addr = starting.addr;
    let asked = tokio::spawn(async move { get(addr, "/healthz").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !asked.is_finished(),
        "/healthz answered before the log was open"
    );
    let _server = starting.finish().await;
    let (status, body) = asked.await.expect("the /healthz task");
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "{\"status\":\"ok\"}")
    );
}

// ---------------------------------------------------------------------------
// The log

#[tokio::test]
async fn readyz_names_a_log_that_cannot_be_written() {
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Unwritable::open(dir.path());
    let config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        upstream: vec![UpstreamConfig::new(upstream.url())],
        ..Config::default()
    };
    let server = Server::start_on(config, store.clone())
        .await
        .expect("proxy starts");
    assert_eq!(get(server.addr, "/readyz").await.0, StatusCode::OK);
    store.stop();
    assert_eq!(
        get(server.addr, "/readyz").await,
        answer(StatusCode::SERVICE_UNAVAILABLE, unwritable::WHY)
    );
    let (_, page) = get(server.addr, "/metrics").await;
    assert!(
        page.lines().any(|l| l == "mcp_proxy_store_writable 0"),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_redis_is_unreachable_once_the_lease_ran_out() {
    let mut redis = RedisServer::start(Persistence::None).unwrap_or_else(|why| panic!("{why}"));
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let key = dir.path().join("token.key");
    std::fs::write(&key, [7u8; 32]).expect("key file");
    let mut config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        upstream: vec![UpstreamConfig::new(upstream.url())],
        ..Config::default()
    };
    config.store.backend = Backend::Redis;
    config.store.redis_url = redis.url();
    config.store.lease_ms = 300;
    config.tokens.key_file = Some(key);
    let server = Server::start(config).await.expect("proxy starts");
    assert_eq!(get(server.addr, "/readyz").await.0, StatusCode::OK);
    redis.kill9();
    let deadline = Instant::now() + LIMIT;
    let (status, body) = loop {
        let (status, body) = get(server.addr, "/readyz").await;
        if status != StatusCode::OK {
            break (status, body);
        }
        assert!(Instant::now() < deadline, "still ready without Redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("redis unreachable for "), "{body}");
}

// ---------------------------------------------------------------------------
// Draining, in process

#[tokio::test]
async fn healthz_answers_as_before_while_the_proxy_drains() {
    let rig = Rig::start().await;
    rig.proxy.as_ref().expect("a proxy").drain();
    let (status, body) = get(addr_of(&rig), "/healthz").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "{\"status\":\"ok\"}")
    );
}

/// The head of the answer to an `initialize` POSTed over a connection of
/// its own, as the proxy wrote it (a client library may hide `Connection`).
async fn initialize_head(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = initialize(V_LATEST).to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket
        .write_all(request.as_bytes())
        .await
        .expect("request sent");
    let mut head = Vec::new();
    let mut buf = [0; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = tokio::time::timeout(LIMIT, socket.read(&mut buf)).await;
        let n = read.expect("an answer in time").expect("read");
        assert!(n > 0, "closed before the head");
        head.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&head).to_lowercase()
}

#[tokio::test]
async fn a_draining_proxy_closes_each_http1_connection_after_its_answer() {
    let rig = Rig::start().await;
    let head = initialize_head(addr_of(&rig)).await;
    assert!(!head.contains("connection: close"), "{head}");
    rig.proxy.as_ref().expect("a proxy").drain();
    let head = initialize_head(addr_of(&rig)).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
}

#[tokio::test]
async fn a_draining_proxy_counts_as_not_ready_in_the_metrics() {
    let rig = Rig::start().await;
    rig.proxy.as_ref().expect("a proxy").drain();
    let (status, text) = get(addr_of(&rig), "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.lines().any(|l| l == "mcp_proxy_ready 0"), "{text}");
}

// ---------------------------------------------------------------------------
// Draining after a signal: the binary

/// The binary with `drain_delay_secs = drain`.
async fn binary(drain: u64) -> OnAFile {
    let toml = format!("drain_delay_secs = {drain}\nshutdown_grace_secs = 1");
    OnAFile::start(&toml, &[], false).await
}

/// What `/readyz` answers once it stops saying "ready" after a signal.
async fn not_ready(addr: SocketAddr) -> (StatusCode, String) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let now = get(addr, "/readyz").await;
        if now != answer(StatusCode::OK, "ready") {
            return now;
        }
        assert!(Instant::now() < deadline, "still ready after the signal");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends SIGTERM and returns once `/readyz` says so.
async fn sigterm(proxy: &ProxyProcess) {
    proxy.signal(libc::SIGTERM);
    assert_eq!(
        not_ready(proxy.addr).await,
        answer(StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
}

#[tokio::test]
async fn readyz_says_draining_right_after_sigterm() {
    let rig = binary(30).await;
    rig.proxy.signal(libc::SIGTERM);
    assert_eq!(
        not_ready(rig.proxy.addr).await,
        answer(StatusCode::SERVICE_UNAVAILABLE, "draining")
    );
}

#[tokio::test]
async fn livez_stays_200_during_the_drain() {
    let rig = binary(30).await;
    sigterm(&rig.proxy).await;
    assert_eq!(
        get(rig.proxy.addr, "/livez").await,
        answer(StatusCode::OK, "live")
    );
}

#[tokio::test]
async fn new_connections_and_calls_are_served_as_before_during_the_drain() {
    let rig = binary(30).await;
    sigterm(&rig.proxy).await;
    let client = McpClient::unpooled(format!("http://{}/mcp", rig.proxy.addr));
    let sid = client.initialize(V_LATEST).await;
    let res = client
        .send(Call::post(&slow_call(2, 2, 10)).session(&sid))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let messages = messages(res).await;
    let result = messages.last().expect("an answer");
    assert_eq!(result["id"], 2);
    assert!(result.get("result").is_some(), "{result}");
}

#[tokio::test]
async fn the_shutdown_starts_once_the_drain_delay_is_over() {
    let mut rig = binary(2).await;
    let sent = Instant::now();
    let status = rig.proxy.terminate().await;
    let took = sent.elapsed();
    assert!(status.success(), "clean exit: {status}");
    assert!(took >= Duration::from_secs(2), "exited after {took:?}");
    // The drain, the grace of 1 s at most, and some slack.
    assert!(took < Duration::from_secs(10), "exited after {took:?}");
}

#[tokio::test]
async fn a_second_sigterm_cuts_the_drain_short() {
    let mut rig = binary(60).await;
    sigterm(&rig.proxy).await;
    let sent = Instant::now();
    let status = rig.proxy.terminate().await;
    assert!(status.success(), "clean exit: {status}");
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "{:?}",
        sent.elapsed()
    );
}

#[tokio::test]
async fn ctrl_c_shuts_down_without_the_drain_delay() {
    let mut rig = binary(60).await;
    let sent = Instant::now();
    rig.proxy.signal(libc::SIGINT);
    let status = rig.proxy.exited().await;
    assert!(status.success(), "clean exit: {status}");
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "{:?}",
        sent.elapsed()
    );
}
