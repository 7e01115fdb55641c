//! The access log: one JSON line per request from the real binary
//! (`log_format = "json"`), with who, what and how it ended, and nothing of
//! a message's content or a credential.

mod common;

use std::time::Duration;

use common::process::OnAFile;
use common::*;
use http::StatusCode;
use serde_json::{json, Value};

/// A proxy process in front of a demo upstream, writing its log to a file.
struct Logged {
    on: OnAFile,
    log: std::path::PathBuf,
}

impl Logged {
    async fn start(extra_toml: &str) -> Self {
        let toml = format!("log_format = \"json\"\n{extra_toml}");
        let env = [("RUST_LOG", "warn,access=info")];
        let on = OnAFile::start(&toml, &env, true).await;
        let log = on.dir.path().join("proxy.log");
        Self { on, log }
    }

    /// The access lines written so far, as JSON.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .expect("log file")
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["target"] == "access")
            .collect()
    }

    /// The access line whose fields have `key` = `value`, once written
    /// (a line is written when its answer's body ends, just after the
    /// client read it).
    async fn line(&self, key: &str, value: &str) -> Value {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            if let Some(line) = self.lines().into_iter().find(|l| l["fields"][key] == value) {
                return line["fields"].clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no access line with {key} = {value:?} in\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_tool_call_is_one_line_naming_its_method_tool_session_and_outcome() {
    let logged = Logged::start("").await;
    let client = logged.on.proxy.client();
    let sid = client.initialize(V_LATEST).await;
    let call = tool_call(7, "echo", json!({"text": "a secret the log must not hold"}));
    let res = client.send(Call::post(&call).session(&sid)).await;
    assert_eq!(res.status(), StatusCode::OK);
    read_all(res).await;
    let line = logged.line("mcp_method", "tools/call").await;
    assert_eq!(line["message"], "request");
    assert_eq!(line["http_method"], "POST");
    assert_eq!(line["path"], "/mcp");
    assert_eq!(line["status"], 200);
    assert_eq!(line["tool"], "echo");
    assert_eq!(line["request_id"], "7");
    assert_eq!(line["outcome"], "result");
    assert_eq!(line["session"], sid[..8]);
    assert!(
        line["stream"].as_str().is_some_and(|s| s.len() == 32),
        "{line}"
    );
    assert!(
        line["duration_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{line}"
    );
    assert!(line["first_byte_ms"].as_f64().is_some(), "{line}");
    assert_eq!(
        line["bytes_in"].as_u64(),
        Some(call.to_string().len() as u64)
    );
    assert!(line["bytes_out"].as_u64().is_some_and(|b| b > 0), "{line}");
    let text = std::fs::read_to_string(&logged.log).expect("log");
    assert!(!text.contains("a secret the log must not hold"), "{text}");
}

#[tokio::test]
async fn the_principal_is_written_hashed_and_tells_principals_apart() {
    let logged = Logged::start("[auth]\nprincipal = \"header\"\nheader = \"x-user\"").await;
    let client = logged.on.proxy.client();
    for user in ["alice", "bob"] {
        let init = Call::post(&initialize(V_LATEST)).header("x-user", user);
        let res = client.send(init).await;
        assert_eq!(res.status(), StatusCode::OK);
        read_all(res).await;
    }
    let deadline = tokio::time::Instant::now() + LIMIT;
    let principals = loop {
        let mut lines = logged.lines();
        lines.retain(|l| l["fields"]["mcp_method"] == "initialize");
        if lines.len() >= 2 || tokio::time::Instant::now() > deadline {
            break lines
                .iter()
                .map(|l| {
                    l["fields"]["principal"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect::<Vec<_>>();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(principals.len(), 2, "{principals:?}");
    for p in &principals {
        assert!(
            p.len() == 16 && p.bytes().all(|b| b.is_ascii_hexdigit()),
            "{p:?}"
        );
    }
    assert_ne!(principals[0], principals[1]);
    let text = std::fs::read_to_string(&logged.log).expect("log");
    assert!(!text.contains("alice") && !text.contains("bob"), "{text}");
}

#[tokio::test]
async fn a_refused_request_is_logged_with_its_status_and_json_rpc_code() {
    let logged = Logged::start("").await;
    let client = logged.on.proxy.client();
    let call = Call::post(&tool_call(3, "echo", json!({"text": "x"})))
        .session(&"0".repeat(32))
        .header("authorization", "Bearer s3cret");
    let res = client.send(call).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    body_bytes(res).await;
    let line = logged.line("mcp_method", "tools/call").await;
    assert_eq!(line["status"], 404);
    assert_eq!(line["outcome"], "client_error");
    assert!(line["rpc_code"].as_i64().is_some(), "{line}");
    let text = std::fs::read_to_string(&logged.log).expect("log");
    assert!(!text.contains("s3cret"), "{text}");
}

#[tokio::test]
async fn the_query_string_is_never_written() {
    let logged = Logged::start("").await;
    let url = format!("http://{}/healthz?token=hunter2", logged.on.proxy.addr);
    let res = McpClient::new(url).send(Call::get()).await;
    assert_eq!(res.status(), StatusCode::OK);
    body_bytes(res).await;
    let line = logged.line("path", "/healthz").await;
    assert_eq!(line["mcp_method"], "none");
    assert_eq!(line["outcome"], "ok");
    let text = std::fs::read_to_string(&logged.log).expect("log");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn access_log_false_writes_no_line() {
    let logged = Logged::start("access_log = false").await;
    let client = logged.on.proxy.client();
    let sid = client.initialize(V_LATEST).await;
    let res = client
        .send(Call::post(&tool_call(2, "echo", json!({"text": "x"}))).session(&sid))
        .await;
    read_all(res).await;
    // The metrics page is served after the call's line would have been.
    let url = format!("http://{}/metrics", logged.on.proxy.addr);
    body_bytes(McpClient::new(url).send(Call::get()).await).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(logged.lines().is_empty(), "{:?}", logged.lines());
}
