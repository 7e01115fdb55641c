//! kill -9 of the proxy process: everything it logged is served after a
//! restart, sessions still map to their upstream sessions, and a stream whose
//! upstream request died with the proxy ends with a JSON-RPC error entry.

mod common;

use std::time::Duration;

use common::process::{free_addr, ProxyProcess};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use serde_json::json;

#[tokio::test]
async fn resume_after_kill9_replays_every_logged_entry_then_an_error() {
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let mut proxy =
        ProxyProcess::start(&["--upstream", &upstream.url()], dir.path(), addr, &[]).await;
    let client = proxy.client();
    let sid = client.initialize(V_LATEST).await;

    let mut live = SseReader::new(
        client
            .send(Call::post(&slow_call(2, 40, 50)).session(&sid))
            .await,
    );
    let mut last_id = live.next().await.unwrap().id.unwrap();
    let mut progress = Vec::new();
    while progress.len() < 3 {
        let (id, m) = live.next_message().await.unwrap();
        last_id = id.unwrap();
        progress.push(m["params"]["progress"].as_u64().unwrap());
    }
    // Let more entries reach the log than the client has seen, then crash.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.kill9();
    drop(live);

    let proxy = ProxyProcess::start(&["--upstream", &upstream.url()], dir.path(), addr, &[]).await;
    let client = proxy.client();
    let res = client
        .send(Call::get().session(&sid).header("last-event-id", &last_id))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut reader = SseReader::new(res);
    let mut tail = Vec::new();
    while let Some((_, m)) = reader.next_message().await {
        tail.push(m);
    }
    let (error, replayed) = tail.split_last().expect("at least the error entry");
    for m in replayed {
        progress.push(m["params"]["progress"].as_u64().unwrap());
    }
    assert!(
        progress.len() > 3,
        "entries logged before the crash were replayed"
    );
    assert_eq!(
        progress,
        (1..=progress.len() as u64).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    assert_eq!(error["id"], 2);
    assert_eq!(error["error"]["code"], -32603);

    // The session still maps to the same upstream session.
    let call = Call::post(&tool_call(3, "echo", json!({"text":"still here"}))).session(&sid);
    let messages = messages(client.send(call).await).await;
    assert_eq!(messages[0]["result"]["content"][0]["text"], "still here");
}

#[tokio::test]
async fn a_completed_call_is_fully_replayable_after_kill9() {
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let mut proxy =
        ProxyProcess::start(&["--upstream", &upstream.url()], dir.path(), addr, &[]).await;
    let client = proxy.client();
    let sid = client.initialize(V_LATEST).await;
    let events = read_all(
        client
            .send(Call::post(&slow_call(2, 5, 1)).session(&sid))
            .await,
    )
    .await;
    let before: Vec<_> = events.iter().filter_map(message).collect();
    proxy.kill9();

    let proxy = ProxyProcess::start(&["--upstream", &upstream.url()], dir.path(), addr, &[]).await;
    let priming = events[0].id.clone().unwrap();
    let res = proxy
        .client()
        .send(Call::get().session(&sid).header("last-event-id", &priming))
        .await;
    let after = messages(res).await;
    assert_eq!(after, before);
}
