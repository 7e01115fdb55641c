//! The `modern` mode: stateless 2026-07-28 requests as the Python SDK's
//! server answers them (the spec's `server/discover`, progress on a streamed
//! call, a closed response as cancellation), which is what the proxy's tasks
//! stand in front of.

use std::sync::atomic::Ordering;
use std::time::Duration;

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

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
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
