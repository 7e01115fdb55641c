//! Modern (2026-07-28) requests and the tasks extension, as the tests send
//! them: the per-request `_meta` declaration, the routing headers, answers
//! in either framing, and polling a task until it settles.

use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};

use super::{body_json, messages, Call, McpClient, LIMIT};

pub const MODERN: &str = "2026-07-28";

/// `_meta` of a modern request; `tasks` declares the extension.
pub fn meta(tasks: bool) -> Value {
    let extensions = if tasks {
        json!({"io.modelcontextprotocol/tasks": {}})
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
    })
}

pub fn request(id: u64, method: &str, mut params: Value, tasks: bool) -> Value {
    params["_meta"] = meta(tasks);
    json!({"jsonrpc":"2.0","id":id,"method":method,"params":params})
}

pub fn modern(body: &Value) -> Call {
    let method = body["method"].as_str().unwrap_or_default();
    Call::post(body)
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", method)
}

pub fn slow(id: u64, steps: u64, interval_ms: u64, tasks: bool) -> Value {
    request(
        id,
        "tools/call",
        json!({"name":"slow","arguments":{"steps":steps,"interval_ms":interval_ms}}),
        tasks,
    )
}

/// The messages of an answer, JSON or SSE.
pub async fn said(res: http::Response<hyper::body::Incoming>) -> Vec<Value> {
    let json = res
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if json {
        vec![body_json(res).await]
    } else {
        messages(res).await
    }
}

pub fn tasks_call(id: u64, method: &str, task: &str) -> Call {
    modern(&request(id, method, json!({"taskId": task}), true))
}

pub async fn answer_from(client: &McpClient, call: Call) -> (StatusCode, Value) {
    let res = client.send(call).await;
    let status = res.status();
    let mut all = said(res).await;
    (status, all.pop().expect("one message"))
}

pub async fn settled_on(client: &McpClient, task: &str) -> Value {
    until_settled(|| async {
        let (status, got) = answer_from(client, tasks_call(91, "tasks/get", task)).await;
        assert_eq!(status, StatusCode::OK, "{got}");
        got
    })
    .await
}

/// Asks `get` (a `tasks/get`, of either revision) until the task's status is
/// not `working`; its `result`.
pub async fn until_settled<F, Fut>(mut get: F) -> Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let got = get().await;
        if got["result"]["status"] != "working" {
            return got["result"].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task never settled: {got}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}
