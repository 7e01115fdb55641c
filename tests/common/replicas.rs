//! What the tests of a replicated upstream share: a proxy started in front
//! of one `[[upstream]]`, sessions opened on it, and an `echo` call that
//! must be answered with the client's session kept whichever replica
//! serves it.

use http::StatusCode;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::Server;
use serde_json::json;

use super::{messages, session_id, tool_call, Call, McpClient, V_LATEST};

/// A proxy in front of `upstream` alone, on a data dir of its own (kept
/// as long as the dir is).
pub async fn proxy_before(upstream: UpstreamConfig) -> (Server, McpClient, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        upstream: vec![upstream],
        shutdown_grace_secs: 1,
        ..Config::default()
    };
    config.validate().expect("a valid configuration");
    let proxy = Server::start(config).await.expect("proxy starts");
    let client = McpClient::new(format!("http://{}/mcp", proxy.addr));
    (proxy, client, dir)
}

/// An `echo` call on session `sid`, answered with its text, the session
/// the client holds unchanged.
pub async fn echo(client: &McpClient, sid: &str, id: u64) {
    let text = format!("call {id}");
    let call = Call::post(&tool_call(id, "echo", json!({ "text": text }))).session(sid);
    let res = client.send(call).await;
    assert_eq!(res.status(), StatusCode::OK);
    if let Some(held) = session_id(res.headers()) {
        assert_eq!(held, sid, "the client keeps its session");
    }
    let answer = messages(res).await;
    assert_eq!(
        answer[0]["result"]["content"][0]["text"], text,
        "{answer:?}"
    );
}

/// `n` sessions opened on `client`.
pub async fn sessions(client: &McpClient, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(client.initialize(V_LATEST).await);
    }
    out
}
