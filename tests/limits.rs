//! The caps on new work: live requests per session and per principal, and
//! the log's disk quota. A refused request gets a clear status and a
//! JSON-RPC error answering its id; what is already running is untouched.

mod common;

use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::{Config, LimitsConfig, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::DemoOptions;
use mcp_resume_proxy::Server;
use serde_json::{json, Value};

async fn refused(res: http::Response<hyper::body::Incoming>, status: StatusCode) -> Value {
    assert_eq!(res.status(), status);
    let body = body_json(res).await;
    assert_eq!(body["jsonrpc"], "2.0");
    body
}

/// The demo behind a proxy that lets a session run one request at a time.
async fn one_stream_per_session() -> Rig {
    Rig::with(DemoOptions::default(), |c| {
        c.limits.streams_per_session = 1;
    })
    .await
}

#[tokio::test]
async fn a_session_at_its_stream_cap_gets_429_and_its_running_call_finishes() {
    let rig = one_stream_per_session().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let running = rig
        .client
        .send(Call::post(&slow_call(2, 5, 50)).session(&sid))
        .await;

    let second = Call::post(&tool_call(3, "echo", json!({"text":"x"}))).session(&sid);
    let body = refused(rig.client.send(second).await, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(body["id"], 3);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("this session"));

    let answer = messages(running).await;
    assert!(answer.last().unwrap().get("result").is_some());
    // Finished: room again.
    let third = Call::post(&tool_call(4, "echo", json!({"text":"y"}))).session(&sid);
    let answer = messages(rig.client.send(third).await).await;
    assert_eq!(answer[0]["result"]["content"][0]["text"], "y");
}

#[tokio::test]
async fn a_call_re_sent_at_the_stream_cap_is_attached_to_its_stream_not_refused() {
    let rig = one_stream_per_session().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = slow_call(2, 3, 50);
    let running = rig.client.send(Call::post(&call).session(&sid)).await;
    let again = rig.client.send(Call::post(&call).session(&sid)).await;
    assert_eq!(
        again.status(),
        StatusCode::OK,
        "the same call takes no new stream"
    );
    let (first, second) = (messages(running).await, messages(again).await);
    assert_eq!(first, second, "both got the one stream");
    assert!(second.last().unwrap().get("result").is_some());
    assert_eq!(
        rig.upstream
            .stats
            .calls_started
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn a_principal_at_its_cap_is_refused_in_every_one_of_its_sessions() {
    let rig = Rig::with(DemoOptions::default(), |c| {
        c.limits.streams_per_principal = 1;
    })
    .await;
    let one = rig.client.initialize(V_LATEST).await;
    let two = rig.client.initialize(V_LATEST).await;
    let running = rig
        .client
        .send(Call::post(&slow_call(2, 5, 50)).session(&one))
        .await;
    let other = Call::post(&tool_call(3, "echo", json!({"text":"x"}))).session(&two);
    let body = refused(rig.client.send(other).await, StatusCode::TOO_MANY_REQUESTS).await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("this client"));
    messages(running).await;
}

#[tokio::test]
async fn another_principal_is_not_held_back_by_a_busy_one() {
    let rig = Rig::with(DemoOptions::default(), |c| {
        c.limits.streams_per_principal = 1;
    })
    .await;
    let busy = rig.client.initialize(V_LATEST).await;
    let running = rig
        .client
        .send(Call::post(&slow_call(2, 5, 50)).session(&busy))
        .await;
    let res = rig
        .client
        .send(Call::post(&initialize(V_LATEST)).header("authorization", "Bearer other"))
        .await;
    let other = session_id(res.headers()).unwrap();
    messages(res).await;
    let call = Call::post(&tool_call(3, "echo", json!({"text":"free"})))
        .session(&other)
        .header("authorization", "Bearer other");
    let answer = messages(rig.client.send(call).await).await;
    assert_eq!(answer[0]["result"]["content"][0]["text"], "free");
    messages(running).await;
}

#[tokio::test]
async fn a_full_log_refuses_new_requests_with_503_and_keeps_serving_what_it_holds() {
    let mut rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let events = read_all(
        rig.client
            .send(Call::post(&slow_call(2, 3, 10)).session(&sid))
            .await,
    )
    .await;
    let first_id = events[0].id.clone().unwrap();
    let logged: Vec<Value> = events.iter().filter_map(message).collect();

    // The same log, now over its quota (any log is over one byte).
    rig.proxy.take().unwrap().shutdown().await;
    let config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: rig.dir.path().to_path_buf(),
        upstream: vec![UpstreamConfig::new(rig.upstream.url())],
        limits: LimitsConfig {
            max_log_bytes: Some(1),
            ..LimitsConfig::default()
        },
        ..Config::default()
    };
    let proxy = Server::start(config).await.unwrap();
    let client = McpClient::new(format!("http://{}/mcp", proxy.addr));

    let call = Call::post(&tool_call(3, "echo", json!({"text":"x"}))).session(&sid);
    let body = refused(client.send(call).await, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(body["id"], 3);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("log is full"));
    let replay = client
        .send(Call::get().session(&sid).header("last-event-id", &first_id))
        .await;
    assert_eq!(messages(replay).await, logged, "what it holds is served");
    proxy.shutdown().await;
}
