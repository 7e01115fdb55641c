//! The request series of `GET /metrics`: every request by route, MCP
//! method and outcome, its latency to the first byte and to the end, tool
//! calls by the tools an operator listed, and the time a client was away
//! before it came back.

mod common;

use std::time::Duration;

use common::scrape::{sample, scrape};
use common::*;
use http::StatusCode;
use serde_json::json;

fn requests(route: &str, method: &str, outcome: &str) -> String {
    format!(
        "mcp_proxy_requests_total{{route=\"{route}\",method=\"{method}\",outcome=\"{outcome}\"}}"
    )
}

fn timed(series: &str, method: &str) -> String {
    format!("mcp_proxy_{series}_seconds_count{{route=\"/mcp\",method=\"{method}\"}}")
}

/// The page once the series `series` reads `want` (a request's series move
/// when its answer's body ends, just after its client read the end).
async fn once(client: &McpClient, series: &str, want: f64) -> String {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let text = scrape(client).await;
        if sample(&text, series) == want || tokio::time::Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_request_series_reads_zero_before_any_request() {
    let rig = Rig::start().await;
    let text = scrape(&rig.client).await;
    for series in [
        requests("/mcp", "tools/call", "result"),
        requests("/mcp", "get_stream", "unfinished"),
        requests("/healthz", "none", "ok"),
        timed("request_duration", "tools/call"),
        timed("request_first_byte", "initialize"),
        "mcp_proxy_tool_calls_total{route=\"/mcp\",tool=\"other\",outcome=\"error\"}".into(),
        "mcp_proxy_resume_away_seconds_count{dialect=\"last_event_id\"}".into(),
    ] {
        assert_eq!(sample(&text, &series), 0.0, "{series}");
    }
}

#[tokio::test]
async fn a_tool_call_counts_under_its_route_method_and_outcome_with_its_latency() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let res = rig
        .client
        .send(Call::post(&slow_call(2, 2, 1)).session(&sid))
        .await;
    read_all(res).await;
    let series = requests("/mcp", "tools/call", "result");
    let text = once(&rig.client, &series, 1.0).await;
    assert_eq!(sample(&text, &series), 1.0);
    assert_eq!(
        sample(&text, &requests("/mcp", "initialize", "result")),
        1.0
    );
    assert_eq!(sample(&text, &timed("request_duration", "tools/call")), 1.0);
    assert_eq!(
        sample(&text, &timed("request_first_byte", "tools/call")),
        1.0
    );
    assert_eq!(sample(&text, &requests("/mcp", "tools/call", "error")), 0.0);
}

#[tokio::test]
async fn a_json_rpc_error_from_the_upstream_counts_as_an_error() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let unknown = json!({"jsonrpc": "2.0", "id": 4, "method": "nope/never"});
    let res = rig.client.send(Call::post(&unknown).session(&sid)).await;
    assert_eq!(res.status(), StatusCode::OK);
    read_all(res).await;
    let series = requests("/mcp", "other", "error");
    assert_eq!(sample(&once(&rig.client, &series, 1.0).await, &series), 1.0);
}

#[tokio::test]
async fn a_refused_request_counts_as_a_client_error() {
    let rig = Rig::start().await;
    let call = Call::post(&tool_call(1, "echo", json!({"text": "x"})));
    let res = rig.client.send(call).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    body_bytes(res).await;
    let series = requests("/mcp", "tools/call", "client_error");
    assert_eq!(sample(&once(&rig.client, &series, 1.0).await, &series), 1.0);
}

#[tokio::test]
async fn a_cut_answer_is_unfinished_and_its_resume_tells_the_time_away() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let res = rig
        .client
        .send(Call::post(&slow_call(2, 6, 100)).session(&sid))
        .await;
    let mut reader = SseReader::new(res);
    let (first, _) = reader.next_message().await.expect("a first message");
    drop(reader);
    let cut = requests("/mcp", "tools/call", "unfinished");
    assert_eq!(sample(&once(&rig.client, &cut, 1.0).await, &cut), 1.0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = first.expect("events carry ids");
    let resume = Call::get().session(&sid).header("last-event-id", &first);
    let res = rig.client.send(resume).await;
    assert_eq!(res.status(), StatusCode::OK);
    read_all(res).await;
    let away = "mcp_proxy_resume_away_seconds_count{dialect=\"last_event_id\"}";
    let text = once(&rig.client, away, 1.0).await;
    assert_eq!(sample(&text, away), 1.0);
    let sum = sample(
        &text,
        "mcp_proxy_resume_away_seconds_sum{dialect=\"last_event_id\"}",
    );
    assert!(sum >= 0.1, "away {sum} s");
    assert_eq!(
        sample(&text, &requests("/mcp", "get_stream", "result")),
        1.0
    );
}

#[tokio::test]
async fn listed_tools_count_under_their_names_and_the_rest_as_other() {
    let rig = Rig::with(Default::default(), |c| {
        c.metrics_tools = vec!["echo".into()];
    })
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    let echo = tool_call(2, "echo", json!({"text": "x"}));
    read_all(rig.client.send(Call::post(&echo).session(&sid)).await).await;
    let slow = slow_call(3, 1, 1);
    read_all(rig.client.send(Call::post(&slow).session(&sid)).await).await;
    let other = "mcp_proxy_tool_calls_total{route=\"/mcp\",tool=\"other\",outcome=\"result\"}";
    let text = once(&rig.client, other, 1.0).await;
    let echo = "mcp_proxy_tool_calls_total{route=\"/mcp\",tool=\"echo\",outcome=\"result\"}";
    assert_eq!(sample(&text, echo), 1.0);
    assert_eq!(sample(&text, other), 1.0);
}

#[tokio::test]
async fn the_metrics_page_counts_under_its_own_route() {
    let rig = Rig::start().await;
    scrape(&rig.client).await;
    let series = requests("/metrics", "none", "ok");
    assert_eq!(sample(&once(&rig.client, &series, 1.0).await, &series), 1.0);
}
