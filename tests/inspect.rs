//! `streams list|show` with the real binary over a real proxy's data
//! directory: while the proxy runs (it never takes the proxy's lock), after
//! a `kill -9`, and the errors an operator can meet.

mod common;

use std::path::Path;
use std::process::Output;

use common::process::{free_addr, Crashable, ProxyProcess};
use common::*;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use serde_json::Value;

/// Runs `mcp-resume-proxy streams ARGS --data-dir DIR`, bounded.
async fn streams(dir: &Path, args: &[&str]) -> Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
        .arg("streams")
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(LIMIT, run)
        .await
        .expect("streams command finishes in time")
        .expect("streams command runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `streams list --json`, one value per stream.
async fn list_json(dir: &Path, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["list", "--json"];
    args.extend_from_slice(extra);
    stdout(&streams(dir, &args).await)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The one `tools/call` stream of `lines`.
fn call_stream(lines: &[Value]) -> &Value {
    let calls: Vec<_> = lines
        .iter()
        .filter(|l| l["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1, "{lines:?}");
    calls[0]
}

struct Running {
    rig: Crashable,
    /// What the client received from the completed call.
    messages: Vec<Value>,
}

/// A proxy in front of the demo upstream, with one completed slow call.
async fn after_a_completed_call() -> Running {
    let rig = Crashable::start(DemoOptions::default()).await;
    let client = rig.client();
    let sid = client.initialize(V_LATEST).await;
    let messages = messages(
        client
            .send(Call::post(&slow_call(2, 5, 1)).session(&sid))
            .await,
    )
    .await;
    assert_eq!(messages.last().unwrap()["id"], 2);
    Running { rig, messages }
}

#[tokio::test]
async fn list_shows_a_completed_call_with_its_entries_while_the_proxy_runs() {
    let run = after_a_completed_call().await;
    let table = stdout(&streams(run.rig.dir.path(), &["list"]).await);
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("STREAM"), "{table}");
    let row: Vec<&str> = lines
        .find(|l| l.contains("tools/call"))
        .unwrap_or_else(|| panic!("no tools/call row: {table}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[2..7], ["request", "completed", "tools/call", "2", "6"]);
    assert_eq!(run.messages.len(), 6, "5 progress + the result");
    // The proxy was not disturbed: it still serves.
    let client = run.rig.client();
    let sid = client.initialize(V_LATEST).await;
    assert!(!sid.is_empty());
}

#[tokio::test]
async fn list_json_is_one_parseable_line_per_stream_while_the_proxy_runs() {
    let run = after_a_completed_call().await;
    let lines = list_json(run.rig.dir.path(), &[]).await;
    let call = call_stream(&lines);
    assert_eq!(call["status"], "completed");
    assert_eq!(call["outcome"], "result");
    assert_eq!(call["entries"], run.messages.len());
    assert_eq!(call["origin_ids"], serde_json::json!([2]));
    assert!(call["created"].as_str().unwrap().ends_with('Z'), "{call}");
    assert!(call["bytes"].as_u64().unwrap() > 0);
    // --live leaves the finished call out.
    let live = list_json(run.rig.dir.path(), &["--live"]).await;
    assert!(live.iter().all(|l| l["status"] == "live"), "{live:?}");
}

#[tokio::test]
async fn show_prints_a_streams_last_entries_while_the_proxy_runs() {
    let run = after_a_completed_call().await;
    let lines = list_json(run.rig.dir.path(), &[]).await;
    let id = call_stream(&lines)["stream"].as_str().unwrap().to_owned();

    let shown: Value = serde_json::from_str(&stdout(
        &streams(
            run.rig.dir.path(),
            &["show", &id, "--entries", "2", "--json"],
        )
        .await,
    ))
    .unwrap();
    assert_eq!(shown["stream"]["stream"], id.as_str());
    let last = shown["last_entries"].as_array().unwrap();
    let seqs: Vec<u64> = last.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [5, 6]);
    assert_eq!(last[1]["message"], run.messages[5]);

    let text = stdout(&streams(run.rig.dir.path(), &["show", &id[..8]]).await);
    assert!(text.contains("completed (result)"), "{text}");
    assert!(text.contains("last 6 of 6 entries:"), "{text}");
    assert!(text.contains("slow done after 5 steps"), "{text}");
}

#[tokio::test]
async fn a_live_stream_left_by_kill9_is_listed_and_shown() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let client = rig.client();
    let sid = client.initialize(V_LATEST).await;
    let mut live = SseReader::new(
        client
            .send(Call::post(&slow_call(2, 400, 50)).session(&sid))
            .await,
    );
    for _ in 0..3 {
        live.next_message().await.expect("progress");
    }
    rig.proxy.kill9();
    drop(live);
    let dir = &rig.dir;

    let lines = list_json(dir.path(), &["--live", "--session", &sid[..6]]).await;
    let call = call_stream(&lines);
    assert_eq!(call["status"], "live");
    let entries = call["entries"].as_u64().unwrap();
    assert!(entries >= 3, "{call}");
    let id = call["stream"].as_str().unwrap();
    let text = stdout(&streams(dir.path(), &["show", id, "--entries", "1"]).await);
    assert!(text.contains("status        live"), "{text}");
    assert!(
        text.contains(&format!("last 1 of {entries} entries:")),
        "{text}"
    );
    assert!(text.contains("notifications/progress"), "{text}");
}

#[tokio::test]
async fn an_unknown_stream_id_exits_1_naming_it() {
    let run = after_a_completed_call().await;
    let unknown = "0123456789abcdef0123456789abcdef";
    let out = streams(run.rig.dir.path(), &["show", unknown]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("no stream {unknown}")), "{err}");
}

#[tokio::test]
async fn a_directory_without_a_log_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = streams(dir.path(), &["list"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no log in"), "{err}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing created"
    );
}

/// A proxy on the sled backend (named by a config file) with one completed
/// call; returns the config file too.
async fn sled_proxy(dir: &Path) -> (DemoUpstream, ProxyProcess, std::path::PathBuf) {
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let file = dir.join("proxy.toml");
    std::fs::write(&file, "[store]\nbackend = \"sled\"\n").unwrap();
    let config = file.to_str().unwrap();
    let proxy = ProxyProcess::start(
        &["--config", config, "--upstream", &upstream.url()],
        &dir.join("data"),
        free_addr(),
        &[],
    )
    .await;
    let client = proxy.client();
    let sid = client.initialize(V_LATEST).await;
    messages(
        client
            .send(Call::post(&slow_call(2, 3, 1)).session(&sid))
            .await,
    )
    .await;
    (upstream, proxy, file)
}

async fn with_config(config: &Path, dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--config", config.to_str().unwrap()];
    all.extend_from_slice(args);
    streams(dir, &all).await
}

#[tokio::test]
async fn the_sled_backend_is_refused_while_the_proxy_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, _proxy, config) = sled_proxy(dir.path()).await;
    let out = with_config(&config, &dir.path().join("data"), &["list"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the sled backend cannot be inspected while the proxy runs"),
        "{err}"
    );
}

#[tokio::test]
async fn the_sled_backend_is_listed_once_the_proxy_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, mut proxy, config) = sled_proxy(dir.path()).await;
    proxy.kill9();
    let out = with_config(&config, &dir.path().join("data"), &["list", "--json"]).await;
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let call = call_stream(&lines);
    assert_eq!(
        (call["status"].as_str(), call["entries"].as_u64()),
        (Some("completed"), Some(4))
    );
}
