//! SIGTERM: open SSE answers end with a `retry:` so clients reconnect, the
//! log is flushed, the process exits within its grace, and a restarted proxy
//! serves what the clients did not see yet, then carries their calls on.

mod common;

use common::process::Crashable;
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;

#[tokio::test]
async fn sigterm_ends_open_streams_with_a_retry_and_a_restart_carries_the_call_on() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let client = rig.client();
    let sid = client.initialize(V_LATEST).await;
    let mut live = SseReader::new(
        client
            .send(Call::post(&slow_call(2, 30, 50)).session(&sid))
            .await,
    );
    let mut last_id = live.next().await.unwrap().id.unwrap();
    let mut progress = Vec::new();
    while progress.len() < 3 {
        let (id, m) = live.next_message().await.unwrap();
        last_id = id.unwrap();
        progress.push(m["params"]["progress"].as_u64().unwrap());
    }

    let status = rig.proxy.terminate().await;
    assert!(status.success(), "clean exit: {status}");
    let mut told_to_retry = false;
    while let Some(event) = live.next().await {
        if let Some(id) = event.id {
            last_id = id;
        }
        if let Some(m) = message_of(&event.data) {
            progress.push(m["params"]["progress"].as_u64().unwrap());
        }
        told_to_retry |= event.retry.is_some();
    }
    assert!(told_to_retry, "the answer ended with a retry: hint");

    rig.restart().await;
    let res = rig
        .client()
        .send(Call::get().session(&sid).header("last-event-id", &last_id))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let tail = messages(res).await;
    let (result, rest) = tail.split_last().expect("the result");
    for m in rest {
        progress.push(m["params"]["progress"].as_u64().unwrap());
    }
    assert_eq!(
        progress,
        (1..=30).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    assert_eq!(result["id"], 2);
    assert!(result.get("result").is_some(), "{result}");
}

fn message_of(data: &[u8]) -> Option<serde_json::Value> {
    (!data.is_empty()).then(|| serde_json::from_slice(data).unwrap())
}
