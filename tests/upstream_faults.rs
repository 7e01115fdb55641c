//! What the upstream does wrong, absorbed: it restarts and forgets the
//! session, it hangs, it goes quiet mid-stream. Each ends in an answer or a
//! JSON-RPC error for the client, never a hang and never a 404 for a session
//! the client still holds.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::json;

#[tokio::test]
async fn an_upstream_that_forgot_the_session_is_reinitialized_and_the_call_goes_through() {
    let mut rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    rig.restart_upstream(DemoOptions::default()).await;

    let call = Call::post(&tool_call(2, "echo", json!({"text":"after"}))).session(&sid);
    let res = rig.client.send(call).await;
    assert_eq!(res.status(), StatusCode::OK);
    let answer = messages(res).await;
    assert_eq!(answer[0]["result"]["content"][0]["text"], "after");
    assert_eq!(
        rig.upstream.stats.sessions_created.load(Ordering::Relaxed),
        1,
        "one new upstream session"
    );
}

#[tokio::test]
async fn concurrent_requests_that_meet_the_lost_session_renew_it_once() {
    let mut rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    rig.restart_upstream(DemoOptions::default()).await;

    let calls = (0..4).map(|i| {
        let call = Call::post(&tool_call(10 + i, "echo", json!({"text": i}))).session(&sid);
        rig.client.send(call)
    });
    for res in futures_util::future::join_all(calls).await {
        assert_eq!(res.status(), StatusCode::OK);
        let answer = messages(res).await;
        assert!(answer[0].get("result").is_some(), "{answer:?}");
    }
    assert_eq!(
        rig.upstream.stats.sessions_created.load(Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn the_standalone_stream_opens_on_a_renewed_session() {
    let mut rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    rig.restart_upstream(DemoOptions::default()).await;
    let res = rig.client.send(Call::get().session(&sid)).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        rig.upstream.stats.sessions_created.load(Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn a_call_in_flight_when_the_upstream_lost_the_session_ends_with_a_clear_error() {
    let mut rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let res = rig
        .client
        .send(Call::post(&slow_call(2, 100, 50)).session(&sid))
        .await;
    let mut reader = SseReader::new(res);
    reader.next_message().await.expect("first progress");
    rig.restart_upstream(DemoOptions::default()).await;

    let mut last = None;
    while let Some((_, m)) = reader.next_message().await {
        last = Some(m);
    }
    let last = last.expect("an answer");
    assert_eq!(last["id"], 2);
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("lost the session"), "{last}");
}

#[tokio::test]
async fn an_upstream_silent_past_its_idle_timeout_ends_the_call_with_an_error() {
    let rig = Rig::with(DemoOptions::default(), |c| {
        c.upstream[0].idle_timeout_ms = Some(300);
    })
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    // Progress every 2 s: the upstream says nothing for longer than allowed.
    let res = rig
        .client
        .send(Call::post(&slow_call(2, 3, 2_000)).session(&sid))
        .await;
    let answer = messages(res).await;
    let last = answer.last().expect("an answer");
    assert_eq!(last["id"], 2);
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("idle"), "{last}");
    eventually("the timed-out call was cancelled upstream", || {
        rig.upstream.stats.calls_cancelled.load(Ordering::Relaxed) == 1
    })
    .await;
}

#[tokio::test]
async fn a_call_past_its_request_deadline_ends_with_an_error() {
    let rig = Rig::with(DemoOptions::default(), |c| {
        c.upstream[0].request_timeout_ms = Some(500);
    })
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    // Busy (progress every 100 ms) but never done in time.
    let res = rig
        .client
        .send(Call::post(&slow_call(2, 100, 100)).session(&sid))
        .await;
    let answer = messages(res).await;
    let last = answer.last().expect("an answer");
    assert_eq!(last["id"], 2);
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("deadline"), "{last}");
    assert!(answer.len() < 20, "stopped at the deadline");
}

#[tokio::test]
async fn an_upstream_that_never_answers_the_head_times_out_with_a_json_rpc_error() {
    // A listener that accepts and never answers: a hung upstream.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", hung.local_addr().unwrap());
    let keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hung.accept().await {
            held.push(socket);
        }
    });
    let rig = Rig::with(DemoOptions::default(), |c| {
        c.upstream[0].url = Some(url);
        c.upstream[0].idle_timeout_ms = Some(300);
    })
    .await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    let body = body_json(res).await;
    assert_eq!(body["jsonrpc"], "2.0");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("timed out"),
        "{body}"
    );
    keep.abort();
}

/// A loopback server that answers every request with `answer` (raw HTTP/1.1)
/// and closes: an upstream that speaks garbage.
async fn garbage_upstream(answer: &'static [u8]) -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(answer).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (url, task)
}

#[tokio::test]
async fn an_upstream_answering_with_garbage_sse_ends_the_request_with_a_json_rpc_error() {
    let (url, task) = garbage_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
          data: this is not json\n\nretry: x\nid\0: \n\n:::\n",
    )
    .await;
    let rig = Rig::with(DemoOptions::default(), |c| {
        c.upstream[0].url = Some(url);
    })
    .await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::OK);
    let events = read_all(res).await;
    let last = events.iter().rev().find_map(message).expect("an answer");
    assert_eq!(last["id"], 0);
    assert_eq!(last["error"]["code"], -32603, "{last}");
    task.abort();
}
