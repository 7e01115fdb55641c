//! The modern era (2026-07-28): stateless forwarding with every header, no
//! session minted, and a client that closes its stream cancels upstream.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::json;

const MODERN: &str = "2026-07-28";

fn modern_call(call: Call) -> Call {
    call.header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/call")
        .header("mcp-name", "slow")
        .header("mcp-param-region", "=?base64?ZXUtd2VzdA==?=")
}

#[tokio::test]
async fn modern_requests_are_forwarded_with_their_headers_and_no_session() {
    let rig = Rig::with(
        DemoOptions {
            modern: true,
            ..Default::default()
        },
        |_| {},
    )
    .await;
    let res = rig
        .client
        .send(modern_call(Call::post(&slow_call(1, 2, 1))))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(session_id(res.headers()).is_none(), "no session minted");
    let messages = messages(res).await;
    assert_eq!(messages.last().unwrap()["id"], 1);
    let seen = rig.upstream.stats.last_headers().unwrap();
    assert_eq!(seen["mcp-protocol-version"], MODERN);
    assert_eq!(seen["mcp-method"], "tools/call");
    assert_eq!(seen["mcp-name"], "slow");
    assert_eq!(seen["mcp-param-region"], "=?base64?ZXUtd2VzdA==?=");
    assert!(seen.get("mcp-session-id").is_none());
}

#[tokio::test]
async fn closing_a_modern_stream_cancels_the_upstream_request() {
    let rig = Rig::with(
        DemoOptions {
            modern: true,
            ..Default::default()
        },
        |_| {},
    )
    .await;
    let res = rig
        .client
        .send(modern_call(Call::post(&slow_call(1, 50, 50))))
        .await;
    let mut reader = SseReader::new(res);
    reader.next_message().await.unwrap();
    drop(reader);
    let stats = rig.upstream.stats.clone();
    eventually("upstream saw the cancellation", || {
        stats.calls_cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(stats.calls_completed.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_modern_discovery_probe_gets_the_legacy_upstreams_400_unchanged() {
    let rig = Rig::start().await;
    let probe = json!({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}});
    let direct = McpClient::new(rig.upstream.url());
    let call = || {
        Call::post(&probe)
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "server/discover")
    };
    let expected = direct.send(call()).await;
    let (status, body) = (expected.status(), body_bytes(expected).await);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let res = rig.client.send(call()).await;
    assert_eq!(res.status(), status);
    assert_eq!(body_bytes(res).await, body);
}
