//! The demo upstream over real HTTP on 127.0.0.1: the wire behaviour the
//! proxy's integration tests rely on.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::reply::sse::{Decoder, Event};
use serde_json::{json, Value};

// A crate root looks for modules beside itself, so the path is spelt out.
#[path = "demo_upstream/modern.rs"]
mod modern;
#[path = "demo_upstream/session_wide_replay.rs"]
mod session_wide_replay;

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("test timed out")
}

struct Harness {
    upstream: DemoUpstream,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Harness {
    async fn new(opts: DemoOptions) -> Self {
        let upstream = DemoUpstream::spawn("127.0.0.1:0".parse().unwrap(), opts)
            .await
            .unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http();
        Harness { upstream, client }
    }

    async fn send(
        &self,
        method: Method,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Response<Incoming> {
        let mut req = Request::builder()
            .method(method)
            .uri(self.upstream.url())
            .header("accept", "application/json, text/event-stream");
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        self.client
            .request(req.body(Full::new(body)).unwrap())
            .await
            .unwrap()
    }

    async fn post(&self, session: Option<&str>, body: &Value) -> Response<Incoming> {
        let headers: Vec<(&str, &str)> =
            session.map(|s| ("mcp-session-id", s)).into_iter().collect();
        self.send(Method::POST, &headers, Some(body)).await
    }

    /// Initializes a session asking for `version`; returns its id.
    async fn initialize(&self, version: &str) -> String {
        let resp = self.post(None, &initialize(version)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let id = resp.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        read_all(resp).await;
        id
    }
}

fn initialize(version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    }})
}

fn call(id: u64, name: &str, arguments: Value, token: Option<&str>) -> Value {
    let mut params = json!({"name": name, "arguments": arguments});
    if let Some(token) = token {
        params["_meta"] = json!({"progressToken": token});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

async fn read_all(resp: Response<Incoming>) -> Bytes {
    resp.into_body().collect().await.unwrap().to_bytes()
}

/// SSE events of a response, read as they arrive.
struct Events {
    body: Incoming,
    decoder: Decoder,
}

impl Events {
    fn new(resp: Response<Incoming>) -> Self {
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Events {
            body: resp.into_body(),
            decoder: Decoder::new(),
        }
    }

    /// The next event, or None when the response ended.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.decoder.next_event() {
                return Some(event);
            }
            let frame = self.body.frame().await?.unwrap();
            if let Some(data) = frame.data_ref() {
                self.decoder.push(data);
            }
        }
    }

    /// The next event that carries a JSON message (skips priming events).
    async fn next_message(&mut self) -> Option<(Option<String>, Value)> {
        loop {
            let event = self.next().await?;
            if !event.data.is_empty() {
                return Some((event.id, serde_json::from_slice(&event.data).unwrap()));
            }
        }
    }

    async fn rest(mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some((_, message)) = self.next_message().await {
            out.push(message);
        }
        out
    }
}

fn progress_of(message: &Value) -> u64 {
    assert_eq!(message["method"], "notifications/progress", "{message}");
    message["params"]["progress"].as_u64().unwrap()
}

#[tokio::test]
async fn initialize_mints_session_and_negotiates_version() {
    bounded(async {
        let h = Harness::new(DemoOptions::default()).await;
        let resp = h.post(None, &initialize("2025-06-18")).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let id = resp.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        let mut events = Events::new(resp);
        // 2025-06-18 has no priming event: the response comes first.
        let first = events.next().await.unwrap();
        let message: Value = serde_json::from_slice(&first.data).unwrap();
        assert!(first.id.is_some());
        assert_eq!(message["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(message["result"]["serverInfo"]["name"], "demo-upstream");
        assert!(events.next().await.is_none());

        // An unknown version gets the latest legacy one, and a priming event.
        let resp = h.post(None, &initialize("1999-01-01")).await;
        let mut events = Events::new(resp);
        let priming = events.next().await.unwrap();
        assert!(priming.id.is_some() && priming.has_data && priming.data.is_empty());
        let (_, message) = events.next_message().await.unwrap();
        assert_eq!(message["result"]["protocolVersion"], "2025-11-25");
        assert_eq!(h.upstream.stats.sessions_created.load(Ordering::Relaxed), 2);
        let seen = h.upstream.stats.last_headers().unwrap();
        assert!(seen.get("mcp-session-id").is_none());
    })
    .await;
}

#[tokio::test]
async fn slow_call_streams_progress_then_result() {
    bounded(async {
        let h = Harness::new(DemoOptions::default()).await;
        let session = h.initialize("2025-11-25").await;
        let args = json!({"steps": 3, "interval_ms": 20});
        let resp = h
            .post(Some(&session), &call(7, "slow", args, Some("tok")))
            .await;
        assert_eq!(resp.headers()["cache-control"], "no-cache");
        let mut events = Events::new(resp);
        let priming = events.next().await.unwrap();
        assert!(priming.data.is_empty());
        let mut ids = vec![priming.id.unwrap()];
        for step in 1..=3 {
            let (id, message) = events.next_message().await.unwrap();
            assert_eq!(progress_of(&message), step);
            assert_eq!(message["params"]["progressToken"], "tok");
            assert_eq!(message["params"]["message"], format!("step {step} of 3"));
            ids.push(id.unwrap());
        }
        let (id, message) = events.next_message().await.unwrap();
        ids.push(id.unwrap());
        assert_eq!(message["id"], 7);
        assert_eq!(
            message["result"]["content"][0]["text"],
            "slow done after 3 steps"
        );
        assert!(events.next().await.is_none());
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "event ids repeat: {ids:?}");
        let stats = &h.upstream.stats;
        assert_eq!(stats.calls_started.load(Ordering::Relaxed), 1);
        assert_eq!(stats.calls_completed.load(Ordering::Relaxed), 1);
    })
    .await;
}

#[tokio::test]
async fn json_response_mode_answers_with_content_length() {
    bounded(async {
        let opts = DemoOptions {
            json_response: true,
            ..DemoOptions::default()
        };
        let h = Harness::new(opts).await;
        let resp = h.post(None, &initialize("2025-03-26")).await;
        assert_eq!(resp.headers()["content-type"], "application/json");
        assert!(resp.headers().contains_key("content-length"));
        let session = resp.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let body: Value = serde_json::from_slice(&read_all(resp).await).unwrap();
        assert_eq!(body["result"]["protocolVersion"], "2025-03-26");

        let args = json!({"steps": 2, "interval_ms": 10});
        let resp = h
            .post(Some(&session), &call(1, "slow", args, Some("t")))
            .await;
        assert!(resp.headers().contains_key("content-length"));
        let body: Value = serde_json::from_slice(&read_all(resp).await).unwrap();
        assert_eq!(
            body["result"]["content"][0]["text"],
            "slow done after 2 steps"
        );

        // ask needs a live stream, so JSON mode reports a tool error.
        let resp = h
            .post(Some(&session), &call(2, "ask", json!({}), None))
            .await;
        let body: Value = serde_json::from_slice(&read_all(resp).await).unwrap();
        assert_eq!(body["result"]["isError"], true);

        let batch = json!([
            call(3, "echo", json!({"text": "a"}), None),
            {"jsonrpc": "2.0", "id": 4, "method": "ping"},
        ]);
        let resp = h.post(Some(&session), &batch).await;
        let body: Value = serde_json::from_slice(&read_all(resp).await).unwrap();
        let answers = body.as_array().unwrap();
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0]["result"]["content"][0]["text"], "a");
        assert_eq!(answers[1]["result"], json!({}));
    })
    .await;
}

#[tokio::test]
async fn batch_answers_every_request_on_one_stream() {
    bounded(async {
        let h = Harness::new(DemoOptions::default()).await;
        let session = h.initialize("2025-03-26").await;
        let batch = json!([
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            call(1, "echo", json!({"text": "hello"}), None),
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 3, "method": "no/such/method"},
        ]);
        let resp = h.post(Some(&session), &batch).await;
        let mut answers = Events::new(resp).rest().await;
        answers.sort_by_key(|m| m["id"].as_u64());
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[0]["result"]["content"][0]["text"], "hello");
        assert_eq!(answers[1]["result"]["tools"].as_array().unwrap().len(), 6);
        assert_eq!(answers[2]["error"]["code"], -32601);

        // Notifications alone get 202 and an empty body.
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = h.post(Some(&session), &note).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        assert!(read_all(resp).await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn ask_round_trip_returns_the_client_answer() {
    bounded(async {
        let h = Harness::new(DemoOptions::default()).await;
        let session = h.initialize("2025-06-18").await;
        let args = json!({"kind": "elicitation"});
        let resp = h.post(Some(&session), &call(5, "ask", args, None)).await;
        let mut events = Events::new(resp);
        let (_, request) = events.next_message().await.unwrap();
        assert_eq!(request["method"], "elicitation/create");
        assert_eq!(request["params"]["message"], "Pick a colour");
        let ask_id = request["id"].as_str().unwrap().to_owned();

        let answer = json!({"jsonrpc": "2.0", "id": ask_id,
            "result": {"action": "accept", "content": {"colour": "blue"}}});
        let resp = h.post(Some(&session), &answer).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);

        let (_, result) = events.next_message().await.unwrap();
        assert_eq!(result["id"], 5);
        let text = result["result"]["content"][0]["text"].as_str().unwrap();
        let echoed: Value = serde_json::from_str(text).unwrap();
        assert_eq!(echoed["content"]["colour"], "blue");
        assert!(events.next().await.is_none());
    })
    .await;
}

#[tokio::test]
async fn cut_stream_resumes_with_last_event_id_to_the_end() {
    bounded(async {
        let opts = DemoOptions {
            close_after_events: Some(2),
            ..DemoOptions::default()
        };
        let h = Harness::new(opts).await;
        let session = h.initialize("2025-11-25").await;
        let args = json!({"steps": 4, "interval_ms": 30});
        let resp = h
            .post(Some(&session), &call(9, "slow", args, Some("p")))
            .await;
        assert_eq!(resp.headers()["connection"], "close");
        let mut events = Events::new(resp);
        let priming = events.next().await.unwrap();
        assert_eq!(priming.retry, Some(500));
        let (_, first) = events.next_message().await.unwrap();
        let (last_id, second) = events.next_message().await.unwrap();
        assert_eq!((progress_of(&first), progress_of(&second)), (1, 2));
        // Cut after two events although the call is still running.
        assert!(events.next().await.is_none());

        let last_id = last_id.unwrap();
        let headers = [
            ("mcp-session-id", session.as_str()),
            ("last-event-id", &last_id),
        ];
        let resp = h.send(Method::GET, &headers, None).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let rest = Events::new(resp).rest().await;
        assert_eq!(rest.len(), 3, "{rest:?}");
        assert_eq!((progress_of(&rest[0]), progress_of(&rest[1])), (3, 4));
        assert_eq!(
            rest[2]["result"]["content"][0]["text"],
            "slow done after 4 steps"
        );
        let stats = &h.upstream.stats;
        assert_eq!(stats.resumed_gets.load(Ordering::Relaxed), 1);
        assert_eq!(stats.calls_completed.load(Ordering::Relaxed), 1);

        let headers = [
            ("mcp-session-id", session.as_str()),
            ("last-event-id", "p99-0"),
        ];
        let resp = h.send(Method::GET, &headers, None).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    })
    .await;
}

#[tokio::test]
async fn missing_or_unknown_session_is_rejected_with_sdk_bodies() {
    bounded(async {
        let h = Harness::new(DemoOptions::default()).await;
        let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
        let resp = h.post(None, &ping).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            read_all(resp).await,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Mcp-Session-Id header is required"}}"#
        );
        let resp = h.post(Some("0123456789abcdef0123456789abcdef"), &ping).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            read_all(resp).await,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#
        );
        // Without `modern`, a 2026-07-28 probe is just a legacy POST.
        let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover"});
        let headers = [("mcp-protocol-version", "2026-07-28")];
        let resp = h.send(Method::POST, &headers, Some(&discover)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    })
    .await;
}

#[tokio::test]
async fn notify_reaches_the_single_standalone_get_stream() {
    bounded(async {
        let h = Harness::new(DemoOptions::default()).await;
        let session = h.initialize("2025-06-18").await;
        // Queued before any GET stream exists.
        let resp = h
            .post(
                Some(&session),
                &call(1, "notify", json!({"text": "one"}), None),
            )
            .await;
        let answers = Events::new(resp).rest().await;
        assert_eq!(answers[0]["result"]["content"][0]["text"], "queued");

        let headers = [("mcp-session-id", session.as_str())];
        let mut stream = Events::new(h.send(Method::GET, &headers, None).await);
        let (_, first) = stream.next_message().await.unwrap();
        assert_eq!(first["method"], "notifications/message");
        assert_eq!(first["params"]["data"], "one");

        let second = h.send(Method::GET, &headers, None).await;
        assert_eq!(second.status(), StatusCode::CONFLICT);

        h.post(
            Some(&session),
            &call(2, "notify", json!({"text": "two"}), None),
        )
        .await;
        let (_, live) = stream.next_message().await.unwrap();
        assert_eq!(live["params"]["data"], "two");

        let resp = h.send(Method::DELETE, &headers, None).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            stream.next().await.is_none(),
            "GET stream outlived its session"
        );
        assert_eq!(h.upstream.stats.sessions_deleted.load(Ordering::Relaxed), 1);
    })
    .await;
}

#[tokio::test]
async fn cancelled_notification_stops_the_call_without_a_response() {
    bounded(async {
        let h = Harness::new(DemoOptions::default()).await;
        let session = h.initialize("2025-06-18").await;
        let args = json!({"steps": 100, "interval_ms": 20});
        let resp = h
            .post(Some(&session), &call(11, "slow", args, Some("c")))
            .await;
        let mut events = Events::new(resp);
        let (_, first) = events.next_message().await.unwrap();
        assert_eq!(progress_of(&first), 1);
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 11, "reason": "test"}});
        let resp = h.post(Some(&session), &cancel).await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        // Only progress may still arrive, then the stream ends.
        for message in events.rest().await {
            progress_of(&message);
        }
        let stats = &h.upstream.stats;
        assert_eq!(stats.calls_cancelled.load(Ordering::Relaxed), 1);
        assert_eq!(stats.calls_completed.load(Ordering::Relaxed), 0);
    })
    .await;
}

#[tokio::test]
async fn buffered_sse_sends_the_whole_stream_with_content_length() {
    bounded(async {
        let opts = DemoOptions {
            buffered_sse: true,
            ..DemoOptions::default()
        };
        let h = Harness::new(opts).await;
        let session = h.initialize("2025-11-25").await;
        let args = json!({"steps": 2, "interval_ms": 10});
        let resp = h
            .post(Some(&session), &call(3, "slow", args, Some("b")))
            .await;
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert!(resp.headers().contains_key("content-length"));
        let messages = Events::new(resp).rest().await;
        assert_eq!(messages.len(), 3);
        assert_eq!(
            (progress_of(&messages[0]), progress_of(&messages[1])),
            (1, 2)
        );
        assert_eq!(messages[2]["id"], 3);
    })
    .await;
}
