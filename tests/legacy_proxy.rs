//! The legacy era (2025-03-26 … 2025-11-25) through the proxy: every message
//! kind, both upstream content types, sessions, and the standalone stream.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::json;

#[tokio::test]
async fn initialize_answers_with_the_proxys_own_session_id() {
    let rig = Rig::start().await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::OK);
    let ours = session_id(res.headers()).expect("session id");
    assert_eq!(ours.len(), 32, "128 random bits as hex");
    let events = read_all(res).await;
    assert!(
        events[0].id.is_some() && events[0].data.is_empty(),
        "priming first"
    );
    let result = events.iter().find_map(message).unwrap();
    assert_eq!(result["result"]["protocolVersion"], V_LATEST);

    let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    rig.client.send(Call::post(&note).session(&ours)).await;
    let seen = rig
        .upstream
        .stats
        .last_headers()
        .expect("upstream saw a request");
    let theirs = session_id(&seen).expect("upstream got its own session id");
    assert_ne!(theirs, ours);
}

#[tokio::test]
async fn tool_call_streams_progress_then_result_each_with_an_event_id() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let res = rig
        .client
        .send(Call::post(&slow_call(2, 5, 10)).session(&sid))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-accel-buffering"], "no");
    let events = read_all(res).await;
    assert!(
        events[0].data.is_empty() && events[0].id.is_some(),
        "priming event"
    );
    assert_eq!(events[0].retry, Some(1000));
    let messages: Vec<_> = events.iter().filter_map(message).collect();
    assert_eq!(messages.len(), 6);
    for (i, m) in messages[..5].iter().enumerate() {
        assert_eq!(m["method"], "notifications/progress");
        assert_eq!(m["params"]["progress"], i as u64 + 1);
    }
    assert_eq!(messages[5]["id"], 2);
    assert!(messages[5]["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("5 steps"));
    let ids: std::collections::HashSet<_> = events.iter().map(|e| e.id.clone().unwrap()).collect();
    assert_eq!(ids.len(), events.len(), "event ids are unique");
}

#[tokio::test]
async fn clients_before_2025_11_25_get_no_priming_event() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize("2025-06-18").await;
    let call = Call::post(&slow_call(2, 2, 1))
        .session(&sid)
        .header("mcp-protocol-version", "2025-06-18");
    let events = read_all(rig.client.send(call).await).await;
    assert!(
        events.iter().all(|e| !e.data.is_empty()),
        "no empty data events"
    );
    assert!(events.iter().all(|e| e.id.is_some()));
}

#[tokio::test]
async fn json_answers_of_the_upstream_become_sse_events_with_ids() {
    let rig = Rig::with(
        DemoOptions {
            json_response: true,
            ..Default::default()
        },
        |_| {},
    )
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&tool_call(3, "echo", json!({"text":"hi"}))).session(&sid);
    let mut reader = SseReader::new(rig.client.send(call).await);
    let (id, m) = reader.next_message().await.unwrap();
    assert!(id.is_some());
    assert_eq!(m["result"]["content"][0]["text"], "hi");
    assert!(
        reader.next().await.is_none(),
        "stream ends after the response"
    );
}

#[tokio::test]
async fn sse_upstream_answers_with_content_length_are_relayed() {
    let rig = Rig::with(
        DemoOptions {
            buffered_sse: true,
            ..Default::default()
        },
        |_| {},
    )
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    let events = read_all(
        rig.client
            .send(Call::post(&slow_call(4, 3, 1)).session(&sid))
            .await,
    )
    .await;
    let messages: Vec<_> = events.iter().filter_map(message).collect();
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[3]["id"], 4);
}

#[tokio::test]
async fn a_client_that_accepts_only_json_gets_json() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&slow_call(5, 2, 1))
        .session(&sid)
        .header("accept", "application/json");
    let res = rig.client.send(call).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "application/json");
    let body = body_json(res).await;
    assert_eq!(body["id"], 5);
    assert!(body["result"].is_object());
}

#[tokio::test]
async fn notifications_and_responses_are_accepted_with_202() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let note = json!({"jsonrpc":"2.0","method":"notifications/roots/list_changed"});
    let res = rig.client.send(Call::post(&note).session(&sid)).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert_eq!(session_id(res.headers()).as_deref(), Some(sid.as_str()));
}

#[tokio::test]
async fn a_batch_of_requests_is_answered_on_one_stream() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize("2025-03-26").await;
    let batch = json!([
        tool_call(10, "echo", json!({"text":"a"})),
        {"jsonrpc":"2.0","method":"notifications/roots/list_changed"},
        tool_call(11, "echo", json!({"text":"b"})),
    ]);
    let call = Call::post(&batch)
        .session(&sid)
        .header("mcp-protocol-version", "2025-03-26");
    let events = read_all(rig.client.send(call).await).await;
    let mut ids: Vec<u64> = Vec::new();
    for m in events.iter().filter_map(message) {
        match m.as_array() {
            Some(items) => ids.extend(items.iter().filter_map(|i| i["id"].as_u64())),
            None => ids.extend(m["id"].as_u64()),
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, vec![10, 11]);
}

#[tokio::test]
async fn server_to_client_requests_reach_the_client_and_its_answer_reaches_the_upstream() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    elicitation_round_trip(&rig.client, &sid, 6).await;
}

#[tokio::test]
async fn the_standalone_get_stream_delivers_server_messages() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let mut get = SseReader::new(rig.client.send(Call::get().session(&sid)).await);
    let call = Call::post(&tool_call(7, "notify", json!({"text":"hello"}))).session(&sid);
    read_all(rig.client.send(call).await).await;
    let (id, m) = get.next_message().await.unwrap();
    assert!(id.is_some());
    assert_eq!(m["method"], "notifications/message");
    assert_eq!(m["params"]["data"], "hello");
}

#[tokio::test]
async fn delete_ends_the_session_here_and_upstream() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let res = rig.client.send(Call::delete().session(&sid)).await;
    assert!(res.status().is_success(), "{}", res.status());
    assert_eq!(
        rig.upstream.stats.sessions_deleted.load(Ordering::SeqCst),
        1
    );
    let call = Call::post(&tool_call(8, "echo", json!({"text":"x"}))).session(&sid);
    let res = rig.client.send(call).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_slow_json_upstream_is_answered_with_a_resumable_stream_at_once() {
    let rig = Rig::with(
        DemoOptions {
            json_response: true,
            ..Default::default()
        },
        |c| c.upstream[0].answer_wait_ms = 50,
    )
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    let res = rig
        .client
        .send(Call::post(&slow_call(9, 5, 100)).session(&sid))
        .await;
    let mut reader = SseReader::new(res);
    let priming = reader.next().await.unwrap();
    assert!(priming.id.is_some() && priming.data.is_empty());
    let (_, m) = reader.next_message().await.unwrap();
    assert_eq!(m["id"], 9);
}

#[tokio::test]
async fn a_client_that_leaves_before_the_answer_does_not_cancel_the_call() {
    let rig = Rig::with(
        DemoOptions {
            json_response: true,
            ..Default::default()
        },
        |c| c.upstream[0].answer_wait_ms = 10_000,
    )
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    // The proxy is still waiting for the upstream's answer when the client
    // gives up and closes its connection.
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_millis(100),
        rig.client
            .send(Call::post(&slow_call(9, 3, 100)).session(&sid)),
    )
    .await;
    assert!(gave_up.is_err(), "the answer came before the client left");
    let store = rig.proxy.as_ref().unwrap().store().clone();
    let session: mcp_resume_proxy::id::SessionId = sid.parse().unwrap();
    let mut logged = Vec::new();
    for _ in 0..200 {
        let streams = store.streams_of_session(session).await.unwrap();
        let call = streams
            .iter()
            .find(|s| s.method.as_deref() == Some("tools/call") && !s.status.is_live());
        if let Some(s) = call {
            logged = store.read_after(s.id, 0, 10).await.unwrap();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let last: serde_json::Value =
        serde_json::from_slice(&logged.last().expect("call logged").message).unwrap();
    assert_eq!(last["id"], 9);
    assert!(last["result"].is_object(), "{last}");
}

#[tokio::test]
async fn an_upstream_that_cuts_its_stream_is_resumed_upstream_transparently() {
    let rig = Rig::with(
        DemoOptions {
            close_after_events: Some(2),
            ..Default::default()
        },
        |_| {},
    )
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    let events = read_all(
        rig.client
            .send(Call::post(&slow_call(12, 6, 20)).session(&sid))
            .await,
    )
    .await;
    let messages: Vec<_> = events.iter().filter_map(message).collect();
    let progress: Vec<u64> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["params"]["progress"].as_u64().unwrap())
        .collect();
    assert_eq!(progress, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(messages.last().unwrap()["id"], 12);
    assert!(rig.upstream.stats.resumed_gets.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn a_silent_upstream_gets_keep_alive_comments_to_the_client() {
    let rig = Rig::with(DemoOptions::default(), |c| c.sse.keepalive_secs = 1).await;
    let sid = rig.client.initialize(V_LATEST).await;
    let res = rig
        .client
        .send(Call::post(&slow_call(2, 1, 1500)).session(&sid))
        .await;
    let raw = body_bytes(res).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains(": keep-alive\n\n"), "{text}");
    assert!(
        text.contains("\"id\":2"),
        "the result still arrives: {text}"
    );
}

#[tokio::test]
async fn a_cancelled_request_reaches_the_upstream_and_ends_its_stream() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let mut reader = SseReader::new(
        rig.client
            .send(Call::post(&slow_call(2, 100, 50)).session(&sid))
            .await,
    );
    reader.next_message().await.unwrap();
    let cancel = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"user"}});
    let res = rig.client.send(Call::post(&cancel).session(&sid)).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    while let Some((_, m)) = reader.next_message().await {
        assert!(m.get("id").is_none(), "no response after cancellation: {m}");
    }
    let stats = rig.upstream.stats.clone();
    eventually("upstream cancelled the call", || {
        stats.calls_cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_with_a_json_rpc_body() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    rig.upstream.shutdown();
    let mut status = StatusCode::OK;
    // The pooled connection may still be open for one request.
    for id in 0..3 {
        let res = rig
            .client
            .send(Call::post(&tool_call(id, "echo", json!({"text":"x"}))).session(&sid))
            .await;
        status = res.status();
        if status == StatusCode::BAD_GATEWAY {
            assert!(body_json(res).await["error"]["message"].is_string());
            break;
        }
        body_bytes(res).await;
    }
    assert_eq!(status, StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn a_client_can_reconnect_before_answering_a_server_request() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&tool_call(6, "ask", json!({"kind":"sampling"}))).session(&sid);
    let mut first = SseReader::new(rig.client.send(call).await);
    let (last_id, request) = first.next_message().await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    drop(first);
    let resume = Call::get()
        .session(&sid)
        .header("last-event-id", &last_id.unwrap());
    let mut again = SseReader::new(rig.client.send(resume).await);
    let answer = json!({"jsonrpc":"2.0","id":request["id"],"result":{"role":"assistant","content":{"type":"text","text":"hi"},"model":"m"}});
    let res = rig.client.send(Call::post(&answer).session(&sid)).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let (_, result) = again.next_message().await.unwrap();
    assert_eq!(result["id"], 6);
}
