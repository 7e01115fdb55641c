//! OpenTelemetry traces, as an OTLP/HTTP collector receives them: a server
//! span per request under the client's `traceparent`, a client span for the
//! upstream exchange whose `traceparent` the upstream receives (on its
//! resumes too), one trace id across a call cut on one instance and
//! resumed on another, and nothing at all with tracing off.

mod common;
mod traces {
    pub mod receiver;
}

use std::time::Duration;

use common::cluster::delete_prefix;
use common::dialects::{read_then_cut, read_to_end};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::traces::OTEL_EXPORTER_OTLP_HEADERS;
use mcp_resume_proxy::config::{Backend, Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::id::{SessionId, StreamId};
use mcp_resume_proxy::Server;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use traces::receiver::{Received, Receiver};

/// A client's own trace: the trace id it continues, and the span it sends
/// a request from.
struct ClientTrace {
    trace_id: String,
}

impl ClientTrace {
    fn new() -> Self {
        Self {
            trace_id: StreamId::random().to_string(),
        }
    }

    /// A new span of the client's, and the `traceparent` naming it.
    fn span(&self) -> (String, String) {
        let span_id = SessionId::random().to_string()[..16].to_owned();
        let header = format!("00-{}-{span_id}-01", self.trace_id);
        (span_id, header)
    }
}

/// Spans exported 50 ms after they end.
fn traced_to(receiver: &Receiver, service: &str) -> impl FnOnce(&mut Config) {
    let endpoint = receiver.endpoint();
    let service = service.to_owned();
    move |config| {
        config.tracing.otlp_endpoint = Some(endpoint);
        config.tracing.service_name = Some(service);
        config.tracing.export_delay_ms = Some(50);
    }
}

fn is_server(span: &Received) -> bool {
    span.span.kind == SpanKind::Server as i32
}

fn is_client(span: &Received) -> bool {
    span.span.kind == SpanKind::Client as i32
}

/// Initializes, then makes a short `slow` call sent from `traceparent`,
/// read to its end; returns the session id.
async fn call_from(client: &McpClient, traceparent: &str) -> String {
    let sid = client.initialize(V_LATEST).await;
    let call = Call::post(&slow_call(7, 2, 1))
        .session(&sid)
        .header("traceparent", traceparent);
    let res = client.send(call).await;
    assert_eq!(res.status(), StatusCode::OK);
    read_all(res).await;
    sid
}

/// The server span of the `tools/call` in trace `trace_id`.
async fn call_span(receiver: &Receiver, trace_id: &str) -> Received {
    receiver
        .span("the server span of the call", |s| {
            is_server(s)
                && s.trace_id() == trace_id
                && s.attr("mcp.method.name").as_deref() == Some("tools/call")
        })
        .await
}

#[tokio::test]
async fn each_request_is_a_server_span_under_the_client_s_traceparent() {
    let receiver = Receiver::start().await;
    let mut rig = Rig::with(DemoOptions::default(), traced_to(&receiver, "proxy")).await;
    let client = ClientTrace::new();
    let (client_span, traceparent) = client.span();
    let sid = call_from(&rig.client, &traceparent).await;

    let span = call_span(&receiver, &client.trace_id).await;
    assert_eq!(
        span.parent_id(),
        client_span,
        "the client's span is the parent"
    );
    assert_eq!(span.span.name, "POST /mcp");
    assert_eq!(span.service, "proxy");
    for (key, want) in [
        ("http.request.method", "POST"),
        ("url.path", "/mcp"),
        ("http.route", "/mcp"),
        ("http.response.status_code", "200"),
        ("gen_ai.tool.name", "slow"),
        ("mcp.session.id", &sid[..8]),
        ("mcp.proxy.outcome", "result"),
    ] {
        assert_eq!(span.attr(key).as_deref(), Some(want), "{key}");
    }
    let stream = span.attr("mcp.stream.id").expect("mcp.stream.id");
    assert_eq!(stream.len(), 32, "{stream}");
    rig.proxy.take().expect("a proxy").shutdown().await;
}

#[tokio::test]
async fn spans_a_busy_collector_refused_are_sent_again_after_its_retry_after() {
    let receiver = Receiver::start().await;
    receiver.refuse(2, StatusCode::SERVICE_UNAVAILABLE);
    let mut rig = Rig::with(DemoOptions::default(), traced_to(&receiver, "proxy")).await;
    let client = ClientTrace::new();
    call_from(&rig.client, &client.span().1).await;

    call_span(&receiver, &client.trace_id).await;
    let bodies = receiver.bodies();
    // Exports run one at a time: the first batch is refused twice and
    // taken at the third try, each time the same bytes.
    assert!(bodies.len() >= 3, "{} exports", bodies.len());
    assert!(bodies[1] == bodies[0] && bodies[2] == bodies[0]);
    rig.proxy.take().expect("a proxy").shutdown().await;
}

#[tokio::test]
async fn spans_a_collector_rejects_as_malformed_are_dropped_not_sent_again() {
    let receiver = Receiver::start().await;
    receiver.refuse(1, StatusCode::BAD_REQUEST);
    let mut rig = Rig::with(DemoOptions::default(), traced_to(&receiver, "proxy")).await;
    let client = ClientTrace::new();
    call_from(&rig.client, &client.span().1).await;
    // A later request's spans go out in an export of their own, after
    // any retry of the refused one would have.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = ClientTrace::new();
    call_from(&rig.client, &later.span().1).await;
    call_span(&receiver, &later.trace_id).await;

    let bodies = receiver.bodies();
    let refused = &bodies[0];
    assert_eq!(
        bodies.iter().filter(|b| *b == refused).count(),
        1,
        "a 400 is not retried"
    );
    rig.proxy.take().expect("a proxy").shutdown().await;
}

#[tokio::test]
async fn exports_carry_the_headers_otel_exporter_otlp_headers_names() {
    let receiver = Receiver::start().await;
    let traced = traced_to(&receiver, "proxy");
    let with_headers = move |config: &mut Config| {
        traced(config);
        config.tracing.env.headers = Some((
            "authorization=Bearer%20t0ken,x-tenant=blue".into(),
            OTEL_EXPORTER_OTLP_HEADERS,
        ));
    };
    let mut rig = Rig::with(DemoOptions::default(), with_headers).await;
    let client = ClientTrace::new();
    call_from(&rig.client, &client.span().1).await;

    call_span(&receiver, &client.trace_id).await;
    let headers = receiver.last_headers();
    assert_eq!(headers["authorization"], "Bearer t0ken");
    assert_eq!(headers["x-tenant"], "blue");
    rig.proxy.take().expect("a proxy").shutdown().await;
}

#[tokio::test]
async fn the_upstream_exchange_is_a_client_span_whose_traceparent_the_upstream_receives() {
    let receiver = Receiver::start().await;
    let mut rig = Rig::with(DemoOptions::default(), traced_to(&receiver, "proxy")).await;
    let client = ClientTrace::new();
    let (_, traceparent) = client.span();
    call_from(&rig.client, &traceparent).await;

    let server = call_span(&receiver, &client.trace_id).await;
    let exchange = receiver
        .span("the client span of the exchange", |s| {
            is_client(s) && s.parent_id() == server.span_id()
        })
        .await;
    assert_eq!(exchange.trace_id(), client.trace_id);
    assert_eq!(exchange.span.name, "POST");
    assert_eq!(
        exchange.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    let sent = format!("00-{}-{}-01", client.trace_id, exchange.span_id());
    let received = rig.upstream.stats.requests.lock().unwrap().clone();
    assert!(
        received
            .iter()
            .any(|h| h.get("traceparent").is_some_and(|v| v == &sent[..])),
        "the upstream got traceparent {sent}"
    );
    assert!(
        !received
            .iter()
            .any(|h| h.get("traceparent").is_some_and(|v| v == &traceparent[..])),
        "the client's own traceparent was replaced"
    );
    rig.proxy.take().expect("a proxy").shutdown().await;
}

#[tokio::test]
async fn an_upstream_stream_the_proxy_resumes_is_an_event_of_the_exchange_under_its_traceparent() {
    let receiver = Receiver::start().await;
    let options = DemoOptions {
        close_after_events: Some(2),
        ..DemoOptions::default()
    };
    let mut rig = Rig::with(options, traced_to(&receiver, "proxy")).await;
    let client = ClientTrace::new();
    let (_, traceparent) = client.span();
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&slow_call(5, 4, 20)).session(&sid);
    let res = rig
        .client
        .send(call.header("traceparent", &traceparent))
        .await;
    read_all(res).await;

    let exchange = receiver
        .span("the exchange with a resume", |s| {
            is_client(s)
                && s.trace_id() == client.trace_id
                && s.has_event("mcp.proxy.upstream_resume")
        })
        .await;
    let resume = (exchange.span.events.iter())
        .find(|e| e.name == "mcp.proxy.upstream_resume")
        .expect("the event");
    let after = traces::receiver::attr(&resume.attributes, "mcp.proxy.resumed_after");
    assert_eq!(after.as_deref(), Some("cut"));
    // The resume (a GET with Last-Event-ID) is the same exchange.
    let sent = format!("00-{}-{}-01", client.trace_id, exchange.span_id());
    let received = rig.upstream.stats.requests.lock().unwrap().clone();
    let resumed = received
        .iter()
        .filter(|h| h.contains_key("last-event-id"))
        .collect::<Vec<_>>();
    assert!(!resumed.is_empty(), "the proxy resumed upstream");
    assert!(resumed.iter().all(|h| h["traceparent"] == sent[..]));
    rig.proxy.take().expect("a proxy").shutdown().await;
}

/// One proxy of two sharing the Redis log under `prefix`.
async fn instance(
    upstream: &DemoUpstream,
    key: &std::path::Path,
    prefix: &str,
    tracing: impl FnOnce(&mut Config),
) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        upstream: vec![UpstreamConfig::new(upstream.url())],
        shutdown_grace_secs: 1,
        ..Config::default()
    };
    config.store.backend = Backend::Redis;
    config.store.redis_url = common::cluster::redis_url();
    config.store.key_prefix = prefix.to_owned();
    config.tokens.key_file = Some(key.to_path_buf());
    tracing(&mut config);
    (Server::start(config).await.expect("proxy starts"), dir)
}

#[tokio::test]
async fn a_call_cut_on_one_instance_and_resumed_on_another_is_one_trace() {
    let receiver = Receiver::start().await;
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    let shared = tempfile::tempdir().expect("temp dir");
    let key = shared.path().join("token.key");
    std::fs::write(&key, [7u8; 32]).expect("key file");
    let prefix = format!("mcp-resume-proxy-test:{}", StreamId::random());
    let (a, _dir_a) = instance(&upstream, &key, &prefix, traced_to(&receiver, "proxy-a")).await;
    let (b, _dir_b) = instance(&upstream, &key, &prefix, traced_to(&receiver, "proxy-b")).await;
    let on_a = McpClient::new(format!("http://{}/mcp", a.addr));
    let on_b = McpClient::new(format!("http://{}/mcp", b.addr));

    // The client sends both requests from spans of one trace of its own.
    let client = ClientTrace::new();
    let sid = on_a.initialize(V_LATEST).await;
    let (first_span, first) = client.span();
    let call = Call::post(&slow_call(3, 10, 50)).session(&sid);
    let res = on_a.send(call.header("traceparent", &first)).await;
    let before = read_then_cut(res, 3).await;
    let last = before.last().and_then(|(id, _)| id.clone()).expect("an id");
    let (second_span, second) = client.span();
    let resume = Call::get()
        .session(&sid)
        .header("last-event-id", &last)
        .header("traceparent", &second);
    let res = on_b.send(resume).await;
    assert_eq!(res.status(), StatusCode::OK);
    let after = read_to_end(res).await;
    assert!(after.iter().any(|(_, m)| m["id"] == 3), "the call's result");

    let cut = call_span(&receiver, &client.trace_id).await;
    assert_eq!(
        (cut.service.as_str(), cut.parent_id()),
        ("proxy-a", first_span)
    );
    let resumed = receiver
        .span("the resume's server span", |s| {
            is_server(s) && s.service == "proxy-b" && s.has_event("mcp.proxy.replay")
        })
        .await;
    assert_eq!(resumed.trace_id(), client.trace_id, "one trace");
    assert_eq!(resumed.parent_id(), second_span);
    assert_eq!(resumed.attr("mcp.stream.id"), cut.attr("mcp.stream.id"));
    let exchange = receiver
        .span("the call's upstream exchange", |s| {
            is_client(s) && s.parent_id() == cut.span_id()
        })
        .await;
    assert_eq!(exchange.trace_id(), client.trace_id);
    a.shutdown().await;
    b.shutdown().await;
    delete_prefix(&common::cluster::redis_url(), &prefix);
}

#[tokio::test]
async fn with_tracing_off_nothing_is_exported_and_the_client_s_traceparent_passes_unchanged() {
    let receiver = Receiver::start().await;
    // The receiver listens, but no configuration names it.
    let mut rig = Rig::start().await;
    let (_, traceparent) = ClientTrace::new().span();
    call_from(&rig.client, &traceparent).await;

    let received = rig.upstream.stats.requests.lock().unwrap().clone();
    let forwarded = received
        .iter()
        .filter(|h| h.get("traceparent").is_some())
        .collect::<Vec<_>>();
    assert_eq!(forwarded.len(), 1, "only the call carried one");
    assert_eq!(forwarded[0]["traceparent"], &traceparent[..]);
    rig.proxy.take().expect("a proxy").shutdown().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(receiver.exports(), 0);
}
