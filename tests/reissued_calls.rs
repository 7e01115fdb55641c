//! No double execution: a call re-sent under the id of a live or retained
//! stream of its session — a client retrying after a cut — is attached to
//! that stream instead of reaching the upstream again, for every client and
//! every dialect, also after a restart of the proxy.

mod common;

use std::sync::atomic::Ordering;

use common::dialects::*;
use common::*;
use serde_json::{json, Value};

/// Sends `call` and drops it after its priming event; returns that event's
/// id, which names the stream the call was answered from (a re-issued call
/// attached to the same stream gets the same one, over any upstream).
async fn stream_of(front: &Front, sid: &str, call: &Value) -> Option<String> {
    let res = front.client.send(Call::post(call).session(sid)).await;
    let priming = SseReader::new(res).next().await.expect("a priming event");
    assert!(priming.data.is_empty(), "priming first");
    priming.id
}

fn executions(front: &Front) -> Option<u64> {
    front
        .upstream
        .as_ref()
        .map(|demo| demo.stats.calls_started.load(Ordering::Relaxed))
}

async fn a_call_re_sent_with_its_id_after_a_cut_runs_once(kind: Kind) {
    let front = Front::start(kind).await;
    let sid = front.client.initialize(V_LATEST).await;
    let call = slow_call(5, 3, 50);
    // Cut after the priming event: no message yet, the client cannot know
    // whether the call started.
    let first = stream_of(&front, &sid, &call).await;
    let res = front.client.send(Call::post(&call).session(&sid)).await;
    let mut reader = SseReader::new(res);
    let priming = reader.next().await.expect("a priming event");
    assert_eq!(priming.id, first, "attached to the same stream");
    let mut again = Vec::new();
    while let Some((_, message)) = reader.next_message().await {
        again.push(message);
    }
    let result = again.last().expect("the result");
    assert_eq!(result["id"], 5);
    assert!(result["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("slow done"));
    let progress = again
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .count();
    assert_eq!(progress, 3, "replayed from the start: {again:?}");
    if let Some(n) = executions(&front) {
        assert_eq!(n, 1, "the upstream ran the call once");
    }
}

async fn the_same_id_with_other_params_is_an_invalid_request(kind: Kind) {
    let front = Front::start(kind).await;
    let sid = front.client.initialize(V_LATEST).await;
    messages(
        front
            .client
            .send(Call::post(&tool_call(3, "echo", json!({"text": "a"}))).session(&sid))
            .await,
    )
    .await;
    let res = front
        .client
        .send(Call::post(&tool_call(3, "echo", json!({"text": "b"}))).session(&sid))
        .await;
    assert_eq!(res.status(), http::StatusCode::OK);
    let answer = body_json(res).await;
    assert_eq!(answer["id"], 3);
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
}

async fn reordered_keys_and_another_progress_token_are_the_same_call(kind: Kind) {
    let front = Front::start(kind).await;
    let sid = front.client.initialize(V_LATEST).await;
    let first = json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{
        "name":"slow","arguments":{"steps":1,"interval_ms":1},"_meta":{"progressToken":"a"}}});
    let second = json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{
        "arguments":{"interval_ms":1,"steps":1},"name":"slow","_meta":{"progressToken":"b"}}});
    let stream = stream_of(&front, &sid, &first).await;
    assert_eq!(
        stream_of(&front, &sid, &second).await,
        stream,
        "the same stream"
    );
    let again = messages(front.client.send(Call::post(&second).session(&sid)).await).await;
    assert_eq!(again.last().unwrap()["id"], 4);
    assert!(again.last().unwrap().get("result").is_some());
    if let Some(n) = executions(&front) {
        assert_eq!(n, 1);
    }
}

async fn a_new_id_is_never_deduplicated(kind: Kind) {
    let front = Front::start(kind).await;
    let sid = front.client.initialize(V_LATEST).await;
    let mut streams = Vec::new();
    for id in [6, 7] {
        streams.push(stream_of(&front, &sid, &slow_call(id, 1, 1)).await);
        let got = messages(
            front
                .client
                .send(Call::post(&slow_call(id, 1, 1)).session(&sid))
                .await,
        )
        .await;
        assert_eq!(got.last().unwrap()["id"], id);
    }
    assert_ne!(streams[0], streams[1], "a new id gets a stream of its own");
    if let Some(n) = executions(&front) {
        assert_eq!(n, 2, "repeating a call under a new id is legitimate");
    }
}

both_upstreams!(
    a_call_re_sent_with_its_id_after_a_cut_runs_once,
    the_same_id_with_other_params_is_an_invalid_request,
    reordered_keys_and_another_progress_token_are_the_same_call,
    a_new_id_is_never_deduplicated,
);

#[tokio::test]
async fn a_re_sent_call_is_recognised_after_a_restart_of_the_proxy() {
    let mut front = Front::start(Kind::Http).await;
    let sid = front.client.initialize(V_LATEST).await;
    let call = tool_call(8, "echo", json!({"text": "once"}));
    messages(front.client.send(Call::post(&call).session(&sid)).await).await;
    front.restart().await;
    let again = messages(front.client.send(Call::post(&call).session(&sid)).await).await;
    assert_eq!(again[0]["result"]["content"][0]["text"], "once");
    assert_eq!(executions(&front), Some(1));
}
