//! The bounds on open sessions (issue 36): per principal (429) and in all
//! (503), each with `Retry-After` and a JSON-RPC error answering the
//! `initialize`; nothing opened upstream for a refused one; places freed by
//! DELETE, expiry and an upstream that ends the session, and counted again
//! after a restart; and sessions that never made a request ended early.
//! Real HTTP over loopback, against the demo upstream.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::scrape::{sample as value, scrape};
use common::*;
use http::StatusCode;
use hyper::body::Incoming;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::DemoOptions;
use mcp_resume_proxy::Server;
use serde_json::{json, Value};

/// A demo rig whose `[limits]` and `[store]` `tweak` sets.
async fn rig(tweak: impl FnOnce(&mut Config)) -> Rig {
    Rig::with(DemoOptions::default(), tweak).await
}

/// Sweeps every second, and a session unused for a second is ended.
fn quick_expiry(c: &mut Config) {
    c.store.sweep_secs = 1;
    c.limits.unused_session_secs = 1;
}

/// A request of the client holding `token` (none: no credential).
fn as_client(call: Call, token: Option<&str>) -> Call {
    match token {
        Some(token) => call.header("authorization", &format!("Bearer {token}")),
        None => call,
    }
}

async fn try_initialize(client: &McpClient, token: Option<&str>) -> http::Response<Incoming> {
    client
        .send(as_client(Call::post(&initialize(V_LATEST)), token))
        .await
}

/// `initialize` and `notifications/initialized` as `token`: the session id.
async fn open(client: &McpClient, token: Option<&str>) -> String {
    let res = try_initialize(client, token).await;
    assert_eq!(res.status(), StatusCode::OK);
    let sid = session_id(res.headers()).expect("a session id");
    read_all(res).await;
    let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    let res = client
        .send(as_client(Call::post(&note).session(&sid), token))
        .await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    sid
}

/// The status of an `echo` call in session `sid` (200 answers it).
async fn echo(client: &McpClient, sid: &str, token: Option<&str>) -> StatusCode {
    let call = Call::post(&tool_call(7, "echo", json!({"text":"hi"}))).session(sid);
    let res = client.send(as_client(call, token)).await;
    let status = res.status();
    if status == StatusCode::OK {
        let answer = messages(res).await;
        assert_eq!(answer[0]["result"]["content"][0]["text"], "hi");
    }
    status
}

/// A refusal of an `initialize`: its status, `Retry-After` and body.
async fn refusal(res: http::Response<Incoming>) -> (StatusCode, u64, Value) {
    let status = res.status();
    let retry_after = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    let body = body_json(res).await;
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], 0, "it answers the initialize: {body}");
    (status, retry_after, body)
}

fn message_of(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

async fn metric(client: &McpClient, series: &str) -> f64 {
    value(&scrape(client).await, series)
}

const UNUSED: &str = "mcp_proxy_sessions_expired_total{reason=\"unused\"}";
const IDLE: &str = "mcp_proxy_sessions_expired_total{reason=\"idle\"}";
const OPEN: &str = "mcp_proxy_sessions_open";

/// Waits until `series` reads `want` (the sweeper runs in the background).
async fn until_metric(client: &McpClient, series: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let now = metric(client, series).await;
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} stayed {now}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops the rig's proxy and starts another on its data dir and upstream.
async fn restart(rig: &mut Rig, tweak: impl FnOnce(&mut Config)) {
    rig.proxy.take().expect("a proxy").shutdown().await;
    let mut config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: rig.dir.path().to_path_buf(),
        upstream: vec![UpstreamConfig::new(rig.upstream.url())],
        shutdown_grace_secs: 1,
        ..Config::default()
    };
    tweak(&mut config);
    let proxy = Server::start(config).await.expect("the proxy restarts");
    rig.client = McpClient::new(format!("http://{}/mcp", proxy.addr));
    rig.proxy = Some(proxy);
}

#[tokio::test]
async fn initialize_past_the_per_principal_bound_gets_429_with_retry_after() {
    let rig = rig(|c| c.limits.max_sessions_per_principal = 2).await;
    open(&rig.client, Some("a")).await;
    open(&rig.client, Some("a")).await;
    let (status, retry_after, body) = refusal(try_initialize(&rig.client, Some("a")).await).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after, 30, "the next sweep, at the default sweep_secs");
    assert!(
        message_of(&body).contains("this client has 2 sessions open"),
        "{body}"
    );
}

#[tokio::test]
async fn another_principal_opens_sessions_while_one_is_at_its_bound() {
    let rig = rig(|c| c.limits.max_sessions_per_principal = 1).await;
    open(&rig.client, Some("a")).await;
    let refused = try_initialize(&rig.client, Some("a")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let sid = open(&rig.client, Some("b")).await;
    assert_eq!(echo(&rig.client, &sid, Some("b")).await, StatusCode::OK);
}

#[tokio::test]
async fn initialize_past_the_total_bound_gets_503_with_retry_after() {
    let rig = rig(|c| {
        c.limits.max_sessions = 2;
        c.store.sweep_secs = 5;
    })
    .await;
    open(&rig.client, Some("a")).await;
    open(&rig.client, Some("b")).await;
    let (status, retry_after, body) = refusal(try_initialize(&rig.client, Some("c")).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after, 5, "the next sweep");
    assert!(
        message_of(&body).contains("the proxy has 2 sessions open"),
        "{body}"
    );
}

#[tokio::test]
async fn sessions_without_a_credential_meet_only_the_total_bound() {
    // Every client without a credential has the same principal: the
    // per-principal bound would be a smaller total bound in disguise.
    let rig = rig(|c| {
        c.limits.max_sessions = 3;
        c.limits.max_sessions_per_principal = 1;
    })
    .await;
    for _ in 0..3 {
        open(&rig.client, None).await;
    }
    let (status, _, _) = refusal(try_initialize(&rig.client, None).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn refused_initialize_opens_nothing_upstream() {
    let rig = rig(|c| {
        c.limits.max_sessions = 2;
        c.limits.max_sessions_per_principal = 1;
    })
    .await;
    open(&rig.client, Some("a")).await;
    open(&rig.client, Some("b")).await;
    let created = || rig.upstream.stats.sessions_created.load(Ordering::Relaxed);
    assert_eq!(created(), 2);
    // "a" is past its principal's bound, "c" past the total.
    for (token, refused) in [
        ("a", StatusCode::TOO_MANY_REQUESTS),
        ("c", StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let res = try_initialize(&rig.client, Some(token)).await;
        assert_eq!(res.status(), refused, "{token}");
        body_bytes(res).await;
    }
    assert_eq!(created(), 2, "neither refusal reached the upstream");
    assert_eq!(metric(&rig.client, OPEN).await, 2.0);
}

#[tokio::test]
async fn a_refused_initialize_leaves_the_open_sessions_serving() {
    let rig = rig(|c| c.limits.max_sessions = 1).await;
    let sid = open(&rig.client, Some("a")).await;
    let res = try_initialize(&rig.client, Some("b")).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(echo(&rig.client, &sid, Some("a")).await, StatusCode::OK);
}

#[tokio::test]
async fn deleting_a_session_frees_its_place() {
    let rig = rig(|c| c.limits.max_sessions_per_principal = 1).await;
    let sid = open(&rig.client, Some("a")).await;
    let res = try_initialize(&rig.client, Some("a")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let deleted = rig
        .client
        .send(as_client(Call::delete().session(&sid), Some("a")))
        .await;
    assert!(deleted.status().is_success());
    let again = open(&rig.client, Some("a")).await;
    assert_eq!(echo(&rig.client, &again, Some("a")).await, StatusCode::OK);
}

#[tokio::test]
async fn a_session_ended_as_idle_frees_its_place() {
    let rig = rig(|c| {
        c.store.sweep_secs = 1;
        c.store.session_idle_secs = 1;
        c.limits.max_sessions = 1;
    })
    .await;
    let sid = open(&rig.client, Some("a")).await;
    assert_eq!(echo(&rig.client, &sid, Some("a")).await, StatusCode::OK);
    until_metric(&rig.client, IDLE, 1.0).await;
    assert_eq!(metric(&rig.client, OPEN).await, 0.0);
    open(&rig.client, Some("b")).await;
}

#[tokio::test]
async fn a_session_that_never_made_a_request_expires_early() {
    let rig = rig(quick_expiry).await;
    let sid = open(&rig.client, Some("a")).await;
    until_metric(&rig.client, UNUSED, 1.0).await;
    assert_eq!(metric(&rig.client, OPEN).await, 0.0);
    assert_eq!(metric(&rig.client, IDLE).await, 0.0);
    let call = Call::post(&json!({"jsonrpc":"2.0","id":3,"method":"tools/list"})).session(&sid);
    let res = rig.client.send(as_client(call, Some("a"))).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "it is gone");
}

#[tokio::test]
async fn a_session_that_made_a_request_is_not_ended_as_unused() {
    let rig = rig(quick_expiry).await;
    let used = open(&rig.client, Some("a")).await;
    assert_eq!(echo(&rig.client, &used, Some("a")).await, StatusCode::OK);
    open(&rig.client, Some("a")).await;
    // The unused one, opened after it, expires: the used one was swept too.
    until_metric(&rig.client, UNUSED, 1.0).await;
    assert_eq!(echo(&rig.client, &used, Some("a")).await, StatusCode::OK);
    assert_eq!(metric(&rig.client, OPEN).await, 1.0);
}

#[tokio::test]
async fn a_session_listening_on_its_get_stream_is_in_use() {
    let rig = rig(quick_expiry).await;
    let listening = open(&rig.client, Some("a")).await;
    let get = rig
        .client
        .send(as_client(Call::get().session(&listening), Some("a")))
        .await;
    assert_eq!(get.status(), StatusCode::OK);
    drop(get);
    open(&rig.client, Some("a")).await;
    until_metric(&rig.client, UNUSED, 1.0).await;
    assert_eq!(
        echo(&rig.client, &listening, Some("a")).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn an_initialize_the_upstream_cannot_take_frees_its_place() {
    // A port that was just free: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let rig = rig(|c| {
        c.upstream = vec![UpstreamConfig::new(format!("http://{closed}/mcp"))];
        c.limits.max_sessions = 1;
    })
    .await;
    for _ in 0..2 {
        let res = try_initialize(&rig.client, Some("a")).await;
        assert_eq!(
            res.status(),
            StatusCode::BAD_GATEWAY,
            "not 503: no place is held"
        );
        body_bytes(res).await;
    }
    assert_eq!(metric(&rig.client, OPEN).await, 0.0);
}

#[tokio::test]
async fn an_initialize_refused_by_the_log_quota_takes_no_place() {
    let rig = rig(|c| {
        c.limits.max_log_bytes = Some(1);
        c.limits.max_sessions = 1;
    })
    .await;
    for _ in 0..2 {
        let res = try_initialize(&rig.client, Some("a")).await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = body_json(res).await;
        assert!(message_of(&body).contains("log is full"), "{body}");
    }
    assert_eq!(metric(&rig.client, OPEN).await, 0.0);
}

#[tokio::test]
async fn a_malformed_initialize_takes_no_place() {
    let rig = rig(|c| c.limits.max_sessions = 1).await;
    let broken = Call::raw_post(&br#"{"jsonrpc":"2.0","id":0,"method":"initialize""#[..]);
    let res = rig.client.send(broken).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    body_bytes(res).await;
    let sid = open(&rig.client, None).await;
    assert_eq!(echo(&rig.client, &sid, None).await, StatusCode::OK);
}

#[tokio::test]
async fn sessions_found_in_the_log_at_restart_count_against_the_bounds() {
    let bounded = |c: &mut Config| c.limits.max_sessions_per_principal = 2;
    let mut rig = rig(bounded).await;
    let first = open(&rig.client, Some("a")).await;
    open(&rig.client, Some("a")).await;
    restart(&mut rig, bounded).await;
    assert_eq!(metric(&rig.client, OPEN).await, 2.0);
    let res = try_initialize(&rig.client, Some("a")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // A recovered session's DELETE frees its place, loaded or not.
    let deleted = rig
        .client
        .send(as_client(Call::delete().session(&first), Some("a")))
        .await;
    assert!(deleted.status().is_success());
    open(&rig.client, Some("a")).await;
}

#[tokio::test]
async fn an_unused_session_found_in_the_log_at_restart_still_expires_early() {
    let mut rig = rig(|_| {}).await;
    let unused = open(&rig.client, Some("a")).await;
    let used = open(&rig.client, Some("a")).await;
    assert_eq!(echo(&rig.client, &used, Some("a")).await, StatusCode::OK);
    restart(&mut rig, quick_expiry).await;
    until_metric(&rig.client, UNUSED, 1.0).await;
    let call = Call::post(&json!({"jsonrpc":"2.0","id":3,"method":"ping"})).session(&unused);
    let res = rig.client.send(as_client(call, Some("a"))).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(echo(&rig.client, &used, Some("a")).await, StatusCode::OK);
}

#[tokio::test]
async fn the_metrics_count_refusals_by_bound() {
    let rig = rig(|c| {
        c.limits.max_sessions = 2;
        c.limits.max_sessions_per_principal = 1;
    })
    .await;
    open(&rig.client, Some("a")).await;
    try_initialize(&rig.client, Some("a")).await;
    open(&rig.client, Some("b")).await;
    try_initialize(&rig.client, Some("c")).await;
    try_initialize(&rig.client, Some("d")).await;
    let text = scrape(&rig.client).await;
    let refused = |bound: &str| {
        value(
            &text,
            &format!("mcp_proxy_sessions_refused_total{{reason=\"{bound}\"}}"),
        )
    };
    assert_eq!((refused("principal"), refused("total")), (1.0, 2.0));
    assert_eq!(value(&text, OPEN), 2.0);
}

/// Live processes whose environment holds `key=value` (the stdio children
/// of one test).
fn pids_with_env(key: &str, value: &str) -> Vec<libc::pid_t> {
    let needle = format!("{key}={value}");
    let entries = std::fs::read_dir("/proc").expect("/proc").flatten();
    entries
        .filter_map(|e| e.file_name().to_string_lossy().parse::<libc::pid_t>().ok())
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(") ")
                .is_none_or(|(_, s)| s.starts_with('Z'));
            !zombie && env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes())
        })
        .collect()
}

#[tokio::test]
async fn a_session_whose_stdio_upstream_exited_frees_its_place() {
    const BIN: &str = env!("CARGO_BIN_EXE_mcp-resume-proxy");
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = format!("session-limits-{}", std::process::id());
    let mut upstream = UpstreamConfig::command(vec![BIN.into(), "demo-stdio-server".into()]);
    upstream
        .env
        .insert("MCP_RESUME_PROXY_TEST".into(), marker.clone());
    let mut config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        upstream: vec![upstream],
        shutdown_grace_secs: 1,
        ..Config::default()
    };
    config.limits.max_sessions = 1;
    let proxy = Server::start(config).await.expect("proxy starts");
    let client = McpClient::new(format!("http://{}/mcp", proxy.addr));
    open(&client, None).await;
    let res = try_initialize(&client, None).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let children = pids_with_env("MCP_RESUME_PROXY_TEST", &marker);
    assert_eq!(children.len(), 1);
    // SAFETY: signalling the stdio child this test's proxy started.
    unsafe { libc::kill(children[0], libc::SIGKILL) };
    until_metric(&client, OPEN, 0.0).await;
    open(&client, None).await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_unused_session_that_expires_is_ended_upstream_too() {
    let rig = rig(quick_expiry).await;
    open(&rig.client, Some("a")).await;
    until_metric(&rig.client, UNUSED, 1.0).await;
    let deleted = &rig.upstream.stats.sessions_deleted;
    eventually("the upstream gets the session's DELETE", || {
        deleted.load(std::sync::atomic::Ordering::SeqCst) > 0
    })
    .await;
}
