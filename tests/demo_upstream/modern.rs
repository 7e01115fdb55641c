//! The `modern` mode: stateless 2026-07-28 requests as the Python SDK's
//! server answers them (the spec's `server/discover`, progress on a streamed
//! call, a closed response as cancellation, and multi-round-trip input with a
//! sealed `requestState`), which is what the proxy's tasks stand in front of.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::{Method, Response, StatusCode};
use hyper::body::Incoming;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::{json, Value};

use super::{bounded, call, progress_of, read_all, Events, Harness};

const MODERN: [(&str, &str); 1] = [("mcp-protocol-version", "2026-07-28")];

async fn modern(opts: DemoOptions) -> Harness {
    Harness::new(DemoOptions {
        modern: true,
        ..opts
    })
    .await
}

async fn post_modern(h: &Harness, body: &Value) -> Response<Incoming> {
    h.send(Method::POST, &MODERN, Some(body)).await
}

/// The one JSON-RPC message of a modern answer, streamed or JSON.
async fn answer(resp: Response<Incoming>) -> Value {
    if resp.headers()["content-type"] == "text/event-stream" {
        return Events::new(resp).rest().await.pop().expect("a message");
    }
    serde_json::from_slice(&read_all(resp).await).unwrap()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

/// A `confirm` call; `state` and `answer` make it the re-issue of round 2.
fn confirm(id: u64, arguments: Value, state: Option<&str>, answer: Option<Value>) -> Value {
    let mut body = call(id, "confirm", arguments, None);
    if let Some(answer) = answer {
        body["params"]["inputResponses"] = json!({"confirm": answer});
    }
    if let Some(state) = state {
        body["params"]["requestState"] = json!(state);
    }
    body
}

/// Round 1 of `confirm`: its `requestState`.
async fn round_one(h: &Harness, arguments: Value) -> String {
    let first = answer(post_modern(h, &confirm(1, arguments, None, None)).await).await;
    first["result"]["requestState"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn discover_answers_the_spec_shape_without_a_session() {
    bounded(async {
        let h = modern(DemoOptions::default()).await;
        let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover"});
        let resp = post_modern(&h, &discover).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get("mcp-session-id").is_none());
        let body: Value = serde_json::from_slice(&read_all(resp).await).unwrap();
        let result = &body["result"];
        assert_eq!(result["resultType"], "complete");
        assert_eq!(result["supportedVersions"], json!(["2026-07-28"]));
        assert_eq!(result["capabilities"], json!({"tools": {}}));
        assert_eq!(
            (&result["ttlMs"], &result["cacheScope"]),
            (&json!(0), &json!("private"))
        );
        let info = &result["_meta"]["io.modelcontextprotocol/serverInfo"];
        assert_eq!(info["name"], "demo-upstream");
        assert!(result.get("serverInfo").is_none(), "{result}");
    })
    .await;
}

#[tokio::test]
async fn a_slow_call_streams_progress_without_ids_then_its_result() {
    bounded(async {
        let h = modern(DemoOptions::default()).await;
        let slow = call(2, "slow", json!({"steps": 2, "interval_ms": 10}), Some("m"));
        let mut events = Events::new(post_modern(&h, &slow).await);
        let mut messages = Vec::new();
        while let Some(event) = events.next().await {
            assert!(event.id.is_none(), "modern streams carry no ids");
            messages.push(serde_json::from_slice::<Value>(&event.data).unwrap());
        }
        assert_eq!(messages.len(), 3);
        assert_eq!(
            (progress_of(&messages[0]), progress_of(&messages[1])),
            (1, 2)
        );
        assert_eq!(messages[2]["id"], 2);
        assert_eq!(messages[2]["result"]["resultType"], "complete");
    })
    .await;
}

#[tokio::test]
async fn closing_a_streamed_call_cancels_it_and_counts_it() {
    bounded(async {
        let h = modern(DemoOptions::default()).await;
        let slow = call(
            2,
            "slow",
            json!({"steps": 500, "interval_ms": 20}),
            Some("m"),
        );
        let mut events = Events::new(post_modern(&h, &slow).await);
        events.next().await.unwrap();
        drop(events);

        let stats = &h.upstream.stats;
        until("the call counted as cancelled", || {
            stats.calls_cancelled.load(Ordering::Relaxed) == 1
        })
        .await;
        assert_eq!(stats.calls_completed.load(Ordering::Relaxed), 0);
        assert_eq!(stats.sessions_created.load(Ordering::Relaxed), 0);
    })
    .await;
}

#[tokio::test]
async fn leaving_before_a_json_answer_cancels_the_call_and_counts_it() {
    bounded(async {
        let h = modern(DemoOptions {
            json_response: true,
            ..DemoOptions::default()
        })
        .await;
        let slow = call(2, "slow", json!({"steps": 500, "interval_ms": 20}), None);
        let left = tokio::time::timeout(Duration::from_millis(200), post_modern(&h, &slow)).await;
        assert!(left.is_err(), "the answer came before the client left");

        let stats = &h.upstream.stats;
        until("the call counted as cancelled", || {
            stats.calls_cancelled.load(Ordering::Relaxed) == 1
        })
        .await;
        assert_eq!(stats.calls_completed.load(Ordering::Relaxed), 0);
    })
    .await;
}

#[tokio::test]
async fn confirm_answers_input_required_with_one_elicitation_and_a_request_state() {
    bounded(async {
        let h = modern(DemoOptions::default()).await;
        let args = json!({"text": "Delete a.txt?"});
        let first = answer(post_modern(&h, &confirm(1, args, None, None)).await).await;
        let result = &first["result"];
        assert_eq!(result["resultType"], "input_required");
        let requests = result["inputRequests"].as_object().unwrap();
        assert_eq!(requests.keys().collect::<Vec<_>>(), ["confirm"]);
        assert_eq!(requests["confirm"]["method"], "elicitation/create");
        assert_eq!(requests["confirm"]["params"]["message"], "Delete a.txt?");
        assert!(result["requestState"]
            .as_str()
            .is_some_and(|s| !s.is_empty()));
    })
    .await;
}

#[tokio::test]
async fn confirm_reissued_with_the_answer_and_its_state_echoes_the_answer() {
    bounded(async {
        let h = modern(DemoOptions::default()).await;
        let args = json!({"text": "Delete a.txt?"});
        let state = round_one(&h, args.clone()).await;
        let reply = json!({"action": "accept", "content": {"confirm": true}});
        let reissue = confirm(2, args, Some(&state), Some(reply.clone()));
        let done = answer(post_modern(&h, &reissue).await).await;
        assert_eq!(done["id"], 2);
        assert_eq!(done["result"]["resultType"], "complete");
        let text = done["result"]["content"][0]["text"].as_str().unwrap();
        assert_eq!(text, format!("confirmed: {reply}"));
    })
    .await;
}

#[tokio::test]
async fn a_reissue_with_other_arguments_is_refused_as_an_invalid_request_state() {
    bounded(async {
        let h = modern(DemoOptions::default()).await;
        let state = round_one(&h, json!({"text": "Delete a.txt?"})).await;
        let reply = json!({"action": "accept", "content": {"confirm": true}});
        let other = confirm(
            2,
            json!({"text": "Delete b.txt?"}),
            Some(&state),
            Some(reply),
        );
        let resp = post_modern(&h, &other).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body: Value = serde_json::from_slice(&read_all(resp).await).unwrap();
        assert_eq!(
            body,
            json!({"jsonrpc": "2.0", "id": 2, "error": {
                "code": -32602,
                "message": "Invalid or expired requestState",
                "data": {"reason": "invalid_request_state"},
            }})
        );
        assert_eq!(h.upstream.stats.calls_started.load(Ordering::Relaxed), 1);
    })
    .await;
}

#[tokio::test]
async fn a_request_state_sealed_by_another_server_is_refused() {
    bounded(async {
        let args = json!({"text": "Delete a.txt?"});
        let earlier = modern(DemoOptions::default()).await;
        let state = round_one(&earlier, args.clone()).await;
        // A restarted upstream has a new key, as the Python SDK's default.
        let restarted = modern(DemoOptions::default()).await;
        let reply = json!({"action": "accept", "content": {"confirm": true}});
        let reissue = confirm(2, args, Some(&state), Some(reply));
        let resp = post_modern(&restarted, &reissue).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    })
    .await;
}

#[tokio::test]
async fn confirm_asks_only_after_ask_after_ms() {
    bounded(async {
        let h = modern(DemoOptions::default()).await;
        let started = Instant::now();
        let args = json!({"ask_after_ms": 300});
        let first = answer(post_modern(&h, &confirm(1, args, None, None)).await).await;
        assert_eq!(first["result"]["resultType"], "input_required");
        assert!(started.elapsed() >= Duration::from_millis(300));
    })
    .await;
}

#[tokio::test]
async fn confirm_in_a_legacy_session_is_a_tool_error() {
    bounded(async {
        let h = modern(DemoOptions::default()).await;
        let session = h.initialize("2025-11-25").await;
        let resp = h
            .post(Some(&session), &confirm(1, json!({}), None, None))
            .await;
        let done = Events::new(resp).rest().await.pop().unwrap();
        assert_eq!(done["result"]["isError"], true, "{done}");
    })
    .await;
}
