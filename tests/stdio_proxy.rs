//! stdio upstreams: real child processes (the demo MCP server in stdio mode,
//! run from this crate's binary), one per session, with the resumability of
//! HTTP upstreams — and never an orphan left behind.

mod common;

use std::time::Duration;

use common::process::{free_addr, ProxyProcess};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::Server;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_mcp-resume-proxy");

/// A proxy in front of the stdio demo server; children carry `marker` in
/// their environment so a test can find exactly its own.
struct StdioRig {
    proxy: Option<Server>,
    client: McpClient,
    marker: String,
    _dir: tempfile::TempDir,
}

impl StdioRig {
    async fn start() -> Self {
        Self::with(|_| {}).await
    }

    async fn with(tweak: impl FnOnce(&mut UpstreamConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let marker = format!("{:x}", rand_u64());
        let mut upstream = UpstreamConfig::command(vec![BIN.into(), "demo-stdio-server".into()]);
        upstream
            .env
            .insert("MCP_RESUME_PROXY_TEST".into(), marker.clone());
        upstream.kill_grace_secs = 2;
        tweak(&mut upstream);
        let config = Config {
            listen: ([127, 0, 0, 1], 0).into(),
            data_dir: dir.path().to_path_buf(),
            upstream: vec![upstream],
            shutdown_grace_secs: 1,
            ..Config::default()
        };
        let proxy = Server::start(config).await.unwrap();
        let client = McpClient::new(format!("http://{}/mcp", proxy.addr));
        Self {
            proxy: Some(proxy),
            client,
            marker,
            _dir: dir,
        }
    }

    fn children(&self) -> Vec<u32> {
        pids_with_env("MCP_RESUME_PROXY_TEST", &self.marker)
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}

/// Live (not zombie) processes whose environment has `key=value`.
fn pids_with_env(key: &str, value: &str) -> Vec<u32> {
    let needle = format!("{key}={value}");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.split(") ")
                    .nth(1)
                    .is_some_and(|rest| rest.starts_with('Z'))
            })
            .unwrap_or(true);
        if !zombie && env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

async fn gone(what: &str, check: impl Fn() -> bool) {
    eventually(what, check).await;
}

#[tokio::test]
async fn a_stdio_server_gets_one_child_per_session() {
    let rig = StdioRig::start().await;
    let a = rig.client.initialize(V_LATEST).await;
    let _b = rig.client.initialize(V_LATEST).await;
    assert_eq!(rig.children().len(), 2);
    let call = Call::post(&tool_call(2, "echo", json!({"text":"hi"}))).session(&a);
    let messages = messages(rig.client.send(call).await).await;
    assert_eq!(messages[0]["result"]["content"][0]["text"], "hi");
}

#[tokio::test]
async fn a_dropped_stdio_call_resumes_with_every_progress_once() {
    let rig = StdioRig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let mut first = SseReader::new(
        rig.client
            .send(Call::post(&slow_call(2, 8, 30)).session(&sid))
            .await,
    );
    first.next().await.unwrap(); // priming
    let (last, m) = first.next_message().await.unwrap();
    assert_eq!(m["params"]["progress"], 1);
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resume = Call::get()
        .session(&sid)
        .header("last-event-id", &last.unwrap());
    let mut rest = SseReader::new(rig.client.send(resume).await);
    let mut progress = vec![1];
    let mut result = None;
    while let Some((_, m)) = rest.next_message().await {
        match m["params"]["progress"].as_u64() {
            Some(p) => progress.push(p),
            None => result = Some(m),
        }
    }
    assert_eq!(progress, (1..=8).collect::<Vec<_>>());
    assert_eq!(result.unwrap()["id"], 2);
}

#[tokio::test]
async fn server_requests_of_a_stdio_child_round_trip_through_the_proxy() {
    let rig = StdioRig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    elicitation_round_trip(&rig.client, &sid, 3).await;
}

#[tokio::test]
async fn messages_tied_to_no_request_reach_the_standalone_stream() {
    let rig = StdioRig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    // Two calls in flight make the notify's message ambiguous: it goes to
    // the standalone stream, where a GET opened later still finds it.
    let slow = rig
        .client
        .send(Call::post(&slow_call(4, 3, 50)).session(&sid))
        .await;
    let call = Call::post(&tool_call(5, "notify", json!({"text":"hello"}))).session(&sid);
    read_all(rig.client.send(call).await).await;
    read_all(slow).await;
    let mut get = SseReader::new(rig.client.send(Call::get().session(&sid)).await);
    let (_, m) = get.next_message().await.unwrap();
    assert_eq!(m["params"]["data"], "hello");
}

#[tokio::test]
async fn a_child_that_dies_ends_live_streams_with_an_error_and_the_session() {
    let rig = StdioRig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let mut reader = SseReader::new(
        rig.client
            .send(Call::post(&slow_call(2, 100, 50)).session(&sid))
            .await,
    );
    reader.next_message().await.unwrap();
    let children = rig.children();
    assert_eq!(children.len(), 1);
    // SAFETY: signalling a child process of this test.
    unsafe {
        libc::kill(children[0] as libc::pid_t, libc::SIGKILL);
    }
    let mut last = None;
    while let Some((_, m)) = reader.next_message().await {
        last = Some(m);
    }
    let error = last.unwrap();
    assert_eq!(error["id"], 2);
    assert_eq!(error["error"]["code"], -32603);
    let call = Call::post(&tool_call(3, "echo", json!({"text":"x"}))).session(&sid);
    assert_eq!(rig.client.send(call).await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn sessions_beyond_max_children_get_503_until_one_ends() {
    let rig = StdioRig::with(|u| u.max_children = 1).await;
    let first = rig.client.initialize(V_LATEST).await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(body_json(res).await["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_children"));
    rig.client.send(Call::delete().session(&first)).await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
        if res.status() == StatusCode::OK {
            break;
        }
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn delete_terminates_the_child() {
    let rig = StdioRig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    assert_eq!(rig.children().len(), 1);
    let res = rig.client.send(Call::delete().session(&sid)).await;
    assert!(res.status().is_success());
    gone("child terminated", || rig.children().is_empty()).await;
}

#[tokio::test]
async fn proxy_shutdown_terminates_every_child() {
    let mut rig = StdioRig::start().await;
    rig.client.initialize(V_LATEST).await;
    rig.client.initialize(V_LATEST).await;
    assert_eq!(rig.children().len(), 2);
    rig.proxy.take().unwrap().shutdown().await;
    gone("children terminated", || rig.children().is_empty()).await;
}

#[tokio::test]
async fn kill9_of_the_proxy_leaves_no_orphan_child() {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("k9-{:x}", rand_u64());
    let addr = free_addr();
    let command = format!("{BIN} demo-stdio-server");
    let upstream = ["--upstream-command", command.as_str()];
    let mut proxy = ProxyProcess::start(
        &upstream,
        dir.path(),
        addr,
        &[("MCP_RESUME_PROXY_TEST", marker.as_str())],
    )
    .await;
    let client = proxy.client();
    let sid = client.initialize(V_LATEST).await;
    // The proxy's environment is inherited by its children; exclude the proxy.
    let proxy_pid = proxy.pid();
    let children = || -> Vec<u32> {
        pids_with_env("MCP_RESUME_PROXY_TEST", &marker)
            .into_iter()
            .filter(|p| *p != proxy_pid)
            .collect()
    };
    assert_eq!(children().len(), 1);
    proxy.kill9();
    gone("child followed its parent", || children().is_empty()).await;

    // After a restart the stdio session is gone for good: 404, re-initialize.
    let _again = ProxyProcess::start(&upstream, dir.path(), addr, &[]).await;
    let call = Call::post(&tool_call(2, "echo", json!({"text":"x"}))).session(&sid);
    assert_eq!(client.send(call).await.status(), StatusCode::NOT_FOUND);
}
