//! kill -9 of the proxy process: everything it logged is served after a
//! restart, sessions still map to their upstream sessions, a call whose
//! upstream stream can be resumed carries on to its result, and one that
//! cannot ends with a JSON-RPC error entry.

mod common;

use std::time::Duration;

use common::process::Crashable;
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::json;

/// Starts a slow call (`steps` progress notifications) and reads the first
/// few; returns the proxy's last event id and the progress seen.
async fn start_slow_call(client: &McpClient, sid: &str, steps: u64) -> (String, Vec<u64>) {
    let mut live = SseReader::new(
        client
            .send(Call::post(&slow_call(2, steps, 50)).session(sid))
            .await,
    );
    let mut last_id = live.next().await.unwrap().id.unwrap();
    let mut progress = Vec::new();
    while progress.len() < 3 {
        let (id, m) = live.next_message().await.unwrap();
        last_id = id.unwrap();
        progress.push(m["params"]["progress"].as_u64().unwrap());
    }
    // Let more entries reach the log than the client has seen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (last_id, progress)
}

/// Everything the proxy serves after `last_id` on a GET, to the stream's end.
async fn tail_after(client: &McpClient, sid: &str, last_id: &str) -> Vec<serde_json::Value> {
    let res = client
        .send(Call::get().session(sid).header("last-event-id", last_id))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut reader = SseReader::new(res);
    let mut tail = Vec::new();
    while let Some((_, m)) = reader.next_message().await {
        tail.push(m);
    }
    tail
}

#[tokio::test]
async fn a_call_survives_kill9_when_its_upstream_can_be_resumed() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let sid = rig.client().initialize(V_LATEST).await;
    let (last_id, mut progress) = start_slow_call(&rig.client(), &sid, 40).await;
    rig.kill9_and_restart().await;

    let client = rig.client();
    let tail = tail_after(&client, &sid, &last_id).await;
    let (result, replayed) = tail.split_last().expect("at least the result");
    for m in replayed {
        progress.push(m["params"]["progress"].as_u64().unwrap());
    }
    assert_eq!(
        progress,
        (1..=40).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    assert_eq!(result["id"], 2);
    assert!(result.get("result").is_some(), "{result}");
    let metrics = McpClient::new(format!("http://{}/metrics", rig.proxy.addr));
    let text = body_bytes(metrics.send(Call::get()).await).await;
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains("mcp_proxy_upstream_resumes_total{after=\"restart\"} 1"),
        "{text}"
    );

    // The session still maps to the same upstream session.
    let call = Call::post(&tool_call(3, "echo", json!({"text":"still here"}))).session(&sid);
    let messages = messages(client.send(call).await).await;
    assert_eq!(messages[0]["result"]["content"][0]["text"], "still here");
}

/// The upstream's priming event carries an id before any message: a kill
/// between it and the first progress must not cost the call.
#[tokio::test]
async fn a_call_killed_before_its_first_message_is_resumed_from_the_upstream_priming_event() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let sid = rig.client().initialize(V_LATEST).await;
    let mut live = SseReader::new(
        rig.client()
            .send(Call::post(&slow_call(2, 3, 1500)).session(&sid))
            .await,
    );
    let priming = live.next().await.unwrap().id.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.kill9_and_restart().await;
    drop(live);

    let tail = tail_after(&rig.client(), &sid, &priming).await;
    let (result, progress) = tail.split_last().expect("at least the result");
    let progress: Vec<_> = progress
        .iter()
        .map(|m| m["params"]["progress"].as_u64().unwrap())
        .collect();
    assert_eq!(progress, [1, 2, 3]);
    assert_eq!(result["id"], 2);
    assert!(result.get("result").is_some(), "{result}");
}

#[tokio::test]
async fn a_call_whose_upstream_gave_no_event_ids_ends_with_an_error_after_kill9() {
    let mut rig = Crashable::start(DemoOptions {
        no_event_ids: true,
        ..DemoOptions::default()
    })
    .await;
    let sid = rig.client().initialize(V_LATEST).await;
    let mut live = SseReader::new(
        rig.client()
            .send(Call::post(&slow_call(2, 40, 50)).session(&sid))
            .await,
    );
    let priming = live.next().await.unwrap().id.unwrap();
    live.next_message().await.expect("the first progress");
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.kill9_and_restart().await;
    drop(live);

    let tail = tail_after(&rig.client(), &sid, &priming).await;
    let error = tail.last().expect("the error entry");
    assert_eq!(error["id"], 2);
    assert_eq!(error["error"]["code"], -32603);
}

#[tokio::test]
async fn a_completed_call_is_fully_replayable_after_kill9() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let sid = rig.client().initialize(V_LATEST).await;
    let events = read_all(
        rig.client()
            .send(Call::post(&slow_call(2, 5, 1)).session(&sid))
            .await,
    )
    .await;
    let before: Vec<_> = events.iter().filter_map(message).collect();
    rig.kill9_and_restart().await;

    let priming = events[0].id.clone().unwrap();
    let res = rig
        .client()
        .send(Call::get().session(&sid).header("last-event-id", &priming))
        .await;
    let after = messages(res).await;
    assert_eq!(after, before);
}
