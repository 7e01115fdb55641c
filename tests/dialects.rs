//! The dialect seam as a client and an upstream see it: negotiation, what is
//! stripped and advertised, every bad handle answered alike, batches,
//! spoofed upstream notifications, per-stream caps, `stream/poll/all`
//! paging, and what survives a `kill -9` of the proxy.

mod common;

use common::dialects::*;
use common::process::Crashable;
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::{json, Value};

fn capabilities_seen_upstream(result: &Value) -> String {
    result["result"]["instructions"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn declared_dialects_are_stripped_before_the_upstream_and_advertised_to_the_client() {
    let front = Front::start(Kind::Http).await;
    let (_, result) = front
        .session(
            json!({"resumableRequests": {}, "experimental": {"streams": {}, "x": {}}, "roots": {}}),
        )
        .await;
    let seen = capabilities_seen_upstream(&result);
    assert!(
        !seen.contains("resumableRequests") && !seen.contains("streams"),
        "{seen}"
    );
    assert!(
        seen.contains("\"roots\"") && seen.contains("\"x\""),
        "{seen}"
    );
    let experimental = &result["result"]["capabilities"]["experimental"];
    assert_eq!(
        experimental["resumableRequests"],
        json!({"minWait": 1, "maxWait": 600})
    );
    assert_eq!(
        experimental["streams"],
        json!({"resumeInterval": {"min": 1, "max": 3600}})
    );
    assert_eq!(result["result"]["capabilities"]["tools"], json!({}));
}

#[tokio::test]
async fn a_disabled_dialect_reaches_the_upstream_untouched() {
    let front = Front::with(Kind::Http, |c| c.dialects.streams.enabled = false).await;
    let (sid, result) = front.session(json!({"streams": {}})).await;
    assert!(capabilities_seen_upstream(&result).contains("streams"));
    assert!(result["result"]["capabilities"]["experimental"].is_null());
    let got = read_to_end(
        front
            .client
            .send(Call::post(&slow_call(1, 1, 1)).session(&sid))
            .await,
    )
    .await;
    assert!(got
        .iter()
        .all(|(_, m)| !method(m).starts_with("notifications/stream/")));
}

#[tokio::test]
async fn negotiated_dialects_survive_a_restart_of_the_proxy() {
    let mut front = Front::start(Kind::Http).await;
    let (sid, _) = front.session(json!({"streams": {}})).await;
    front.restart().await;
    let got = whole_call(&front, &sid, 1, 1).await;
    assert_eq!(method(&got[0].1), "notifications/stream/create");
}

/// Every handle that does not name one of the caller's own streams gets the
/// same answer, word for word.
#[tokio::test]
async fn unknown_tampered_foreign_and_wrong_kind_tokens_are_answered_alike() {
    let front = Front::start(Kind::Http).await;
    let (sid, _) = front.session(both()).await;
    let (other, _) = front.session(both()).await;
    let mine = whole_call(&front, &sid, 1, 2).await;
    let theirs = whole_call(&front, &other, 1, 2).await;
    let (token, handle) = (resume_token(&mine), stream_handle(&mine));
    let mut tampered = token.clone().into_bytes();
    tampered[10] = if tampered[10] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let status = |token: &str| {
        request(
            json!(9),
            "requests/getStatus",
            json!({"requestId": 1, "resumeToken": token}),
        )
    };
    let cases = [
        ("garbage", status("not-a-token")),
        ("tampered", status(&tampered)),
        ("another session's", status(&resume_token(&theirs))),
        ("a stream handle as a token", status(&handle)),
        (
            "a token as a stream handle",
            request(json!(9), "stream/poll", json!({"streamId": token})),
        ),
        (
            "another session's stream",
            request(
                json!(9),
                "stream/poll",
                json!({"streamId": stream_handle(&theirs)}),
            ),
        ),
        (
            "the right token for another request",
            request(
                json!(9),
                "requests/getStatus",
                json!({"requestId": 2, "resumeToken": token}),
            ),
        ),
    ];
    let mut messages = std::collections::BTreeSet::new();
    for (what, message) in cases {
        let answer = ask(&front.client, &sid, &message).await;
        assert_eq!(answer["id"], 9, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], -32602, "{what}: {answer}");
        messages.insert((
            method(&message).starts_with("stream/"),
            answer["error"]["message"].as_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(messages.len(), 2, "one message per dialect: {messages:?}");
}

#[tokio::test]
async fn another_principal_cannot_use_a_token_even_with_the_session_id() {
    let front = Front::start(Kind::Http).await;
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion": V_LATEST, "capabilities": {"resumableRequests": {}},
        "clientInfo": {"name": "t", "version": "1"}}});
    let res = front
        .client
        .send(Call::post(&init).header("authorization", "Bearer alice"))
        .await;
    let sid = session_id(res.headers()).unwrap();
    drop(res);
    let alice = |body: &Value| {
        Call::post(body)
            .session(&sid)
            .header("authorization", "Bearer alice")
    };
    let initialized = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    front.client.send(alice(&initialized)).await;
    // A real token of alice's, from a call of hers.
    let got = read_to_end(front.client.send(alice(&slow_call(1, 2, 5))).await).await;
    let token = resume_token(&got);
    let status = request(
        json!(3),
        "requests/getStatus",
        json!({"requestId": 1, "resumeToken": token}),
    );
    let res = front
        .client
        .send(
            Call::post(&status)
                .session(&sid)
                .header("authorization", "Bearer mallory"),
        )
        .await;
    assert_eq!(
        res.status(),
        StatusCode::NOT_FOUND,
        "the session is alice's"
    );
}

#[tokio::test]
async fn requests_resume_with_an_id_the_token_does_not_name_is_invalid_params() {
    let front = Front::start(Kind::Http).await;
    let (sid, _) = front.session(json!({"resumableRequests": {}})).await;
    let got = whole_call(&front, &sid, 4, 2).await;
    let res = resume_request(&front.client, &sid, 5, &resume_token(&got)).await;
    let answer = body_json(res).await;
    assert_eq!(answer["id"], 5);
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
}

#[tokio::test]
async fn malformed_dialect_params_are_invalid_params() {
    let front = Front::start(Kind::Http).await;
    let (sid, _) = front.session(both()).await;
    for message in [
        request(json!(1), "requests/getStatus", json!({"resumeToken": 5})),
        request(json!(2), "requests/getStatus", json!({"resumeToken": "t"})),
        request(json!(3), "stream/poll", json!({})),
        request(json!(4), "stream/poll/all", json!({"cursor": 7})),
        request(json!(5), "stream/poll/all", json!({"cursor": "forged"})),
    ] {
        let answer = ask(&front.client, &sid, &message).await;
        assert_eq!(answer["error"]["code"], -32602, "{message}: {answer}");
        assert_eq!(answer["id"], message["id"]);
    }
}

#[tokio::test]
async fn dialect_methods_inside_a_batch_are_an_invalid_request() {
    let front = Front::start(Kind::Http).await;
    let (sid, _) = front.session(both()).await;
    let batch = json!([
        request(json!(1), "tools/list", json!({})),
        request(json!(2), "stream/poll/all", json!({})),
    ]);
    let res = front.client.send(Call::post(&batch).session(&sid)).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body_json(res).await["error"]["code"], -32600);
}

#[tokio::test]
async fn upstream_messages_in_the_proxys_namespaces_never_reach_the_client() {
    for capabilities in [both(), json!({})] {
        let front = Front::start(Kind::Http).await;
        let (sid, _) = front.session(capabilities.clone()).await;
        let call = tool_call(2, "spoof", json!({}));
        let got = read_to_end(front.client.send(Call::post(&call).session(&sid)).await).await;
        assert!(
            got.iter()
                .all(|(_, m)| m["params"]["resumeToken"] != "forged"
                    && m["params"]["streamId"] != "forged"),
            "{capabilities}: {got:?}"
        );
        let (_, result) = got.iter().find(|(_, m)| m["id"] == 2).expect("the result");
        assert_eq!(result["result"]["content"][0]["text"], "spoofed");
    }
}

#[tokio::test]
async fn poll_all_lists_only_the_callers_streams_in_pages() {
    let front = Front::start(Kind::Http).await;
    let (sid, _) = front.session(json!({"streams": {}})).await;
    let (other, _) = front.session(json!({"streams": {}})).await;
    whole_call(&front, &other, 1, 2).await;
    let mut handles = Vec::new();
    for id in 1..=105 {
        let call = tool_call(id, "echo", json!({"text": "x"}));
        let got = read_to_end(front.client.send(Call::post(&call).session(&sid)).await).await;
        handles.push(stream_handle(&got));
    }
    let page = ask(
        &front.client,
        &sid,
        &request(json!(1000), "stream/poll/all", json!({})),
    )
    .await;
    let first = page["result"]["statuses"].as_array().unwrap().clone();
    assert_eq!(first.len(), 100);
    let cursor = page["result"]["nextCursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let page = ask(
        &front.client,
        &sid,
        &request(json!(1001), "stream/poll/all", json!({"cursor": cursor})),
    )
    .await;
    let second = page["result"]["statuses"].as_array().unwrap().clone();
    assert!(page["result"].get("nextCursor").is_none());
    let listed: std::collections::BTreeSet<String> = first
        .iter()
        .chain(&second)
        .map(|s| s["streamId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        listed,
        handles.into_iter().collect(),
        "exactly the caller's streams"
    );
    assert!(first
        .iter()
        .all(|s| s["status"] == "completed" && s["hasError"] == false));
}

#[tokio::test]
async fn a_stream_past_its_caps_ends_with_an_error_entry_and_its_neighbours_are_untouched() {
    let front = Front::with(Kind::Http, |c| c.limits.stream_max_entries = 4).await;
    let (sid, _) = front.session(json!({})).await;
    let overflowing = front
        .client
        .send(Call::post(&slow_call(1, 50, 10)).session(&sid))
        .await;
    let neighbour = read_to_end(
        front
            .client
            .send(Call::post(&tool_call(2, "echo", json!({"text": "fine"}))).session(&sid))
            .await,
    )
    .await;
    assert_eq!(neighbour[0].1["result"]["content"][0]["text"], "fine");
    let got = read_to_end(overflowing).await;
    assert!(got.len() <= 5, "{got:?}");
    let last = &got.last().unwrap().1;
    assert_eq!(last["id"], 1);
    assert_eq!(last["error"]["code"], -32603);
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limits"),
        "{last}"
    );
    let demo = front.upstream.as_ref().unwrap();
    eventually("the overflowing call was cancelled upstream", || {
        demo.stats
            .calls_cancelled
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    })
    .await;
}

#[tokio::test]
async fn after_kill9_a_resumable_request_carries_on_to_its_result() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let (sid, _) = initialize_declaring(&rig.client(), both()).await;
    let res = rig
        .client()
        .send(Call::post(&slow_call(2, 20, 50)).session(&sid))
        .await;
    let seen = read_then_cut(res, 3).await;
    let token = resume_token(&seen);
    rig.kill9_and_restart().await;

    let client = rig.client();
    let status = ask(
        &client,
        &sid,
        &request(
            json!(5),
            "requests/getStatus",
            json!({"requestId": 2, "resumeToken": token}),
        ),
    )
    .await;
    assert_ne!(status["result"]["status"], "failed", "{status}");
    let resumed = read_to_end(resume_request(&client, &sid, 2, &token).await).await;
    let (_, answer) = resumed.iter().rev().find(|(id, _)| id.is_some()).unwrap();
    assert_eq!(answer["id"], 2);
    assert!(answer.get("result").is_some(), "{answer}");
}

#[tokio::test]
async fn after_kill9_get_status_says_failed_and_resume_delivers_the_restart_error() {
    // An upstream without event ids cannot be resumed by a restarted proxy.
    let mut rig = Crashable::start(DemoOptions {
        no_event_ids: true,
        ..DemoOptions::default()
    })
    .await;
    let (sid, _) = initialize_declaring(&rig.client(), both()).await;
    let res = rig
        .client()
        .send(Call::post(&slow_call(2, 100, 50)).session(&sid))
        .await;
    let seen = read_then_cut(res, 3).await;
    let (token, handle) = (resume_token(&seen), stream_handle(&seen));
    rig.kill9_and_restart().await;

    let client = rig.client();
    let status = ask(
        &client,
        &sid,
        &request(
            json!(5),
            "requests/getStatus",
            json!({"requestId": 2, "resumeToken": token}),
        ),
    )
    .await;
    assert_eq!(status["result"]["status"], "failed", "{status}");
    let poll = ask(
        &client,
        &sid,
        &request(json!(6), "stream/poll", json!({"streamId": handle})),
    )
    .await;
    assert_eq!(poll["result"]["status"], "completed");
    assert_eq!(poll["result"]["hasError"], true);
    let resumed = read_to_end(resume_request(&client, &sid, 2, &token).await).await;
    let (_, error) = resumed.iter().rev().find(|(id, _)| id.is_some()).unwrap();
    assert_eq!(error["id"], 2);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("restarted"),
        "{error}"
    );
}
