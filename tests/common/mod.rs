//! Test support: a proxy in front of the demo upstream, on loopback, with a
//! fresh data dir; and a small MCP client that speaks the real wire format
//! (raw HTTP + SSE) so tests can cut and resume streams wherever they like.
#![allow(dead_code)]

pub mod chaos;
pub mod cluster;
pub mod dialects;
pub mod failover;
pub mod guard;
pub mod process;
pub mod redis_cluster;
pub mod redis_server;
pub mod replicas;
pub mod scrape;
pub mod tasks;
pub mod tls;
pub mod unwritable;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::reply::sse::{Decoder, Event};
use mcp_resume_proxy::Server;
use serde_json::{json, Value};

/// Every network wait in the tests is bounded by this.
pub const LIMIT: Duration = Duration::from_secs(20);

pub const V_LATEST: &str = "2025-11-25";

pub struct Rig {
    pub upstream: DemoUpstream,
    pub proxy: Option<Server>,
    pub client: McpClient,
    pub dir: tempfile::TempDir,
}

impl Rig {
    pub async fn start() -> Rig {
        Self::with(DemoOptions::default(), |_| {}).await
    }

    pub async fn with(options: DemoOptions, tweak: impl FnOnce(&mut Config)) -> Rig {
        let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), options)
            .await
            .expect("demo upstream starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config {
            listen: ([127, 0, 0, 1], 0).into(),
            data_dir: dir.path().to_path_buf(),
            upstream: vec![UpstreamConfig::new(upstream.url())],
            shutdown_grace_secs: 1,
            ..Config::default()
        };
        tweak(&mut config);
        let proxy = Server::start(config).await.expect("proxy starts");
        let client = McpClient::new(format!("http://{}/mcp", proxy.addr));
        Rig {
            upstream,
            proxy: Some(proxy),
            client,
            dir,
        }
    }
}

impl Rig {
    /// Stops the demo upstream and starts a new one on the same address: an
    /// upstream restart, which forgets every upstream session.
    pub async fn restart_upstream(&mut self, options: DemoOptions) {
        let addr = self.upstream.addr;
        self.upstream.shutdown();
        let deadline = tokio::time::Instant::now() + LIMIT;
        self.upstream = loop {
            // The old listener closes as its accept loop sees the shutdown.
            match DemoUpstream::spawn(addr, options.clone()).await {
                Ok(upstream) => break upstream,
                Err(e) => {
                    assert!(tokio::time::Instant::now() < deadline, "rebind {addr}: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
    }
}

pub struct McpClient {
    pub url: String,
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// A request under construction.
pub struct Call {
    pub method: Method,
    /// Values as bytes: a test may send one that is not text.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Bytes,
}

impl Call {
    pub fn post(body: &Value) -> Call {
        Call {
            method: Method::POST,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                (
                    "accept".into(),
                    "application/json, text/event-stream".into(),
                ),
            ],
            body: Bytes::from(body.to_string()),
        }
    }

    pub fn raw_post(body: impl Into<Bytes>) -> Call {
        Call {
            body: body.into(),
            ..Call::post(&Value::Null)
        }
    }

    pub fn get() -> Call {
        Call {
            method: Method::GET,
            headers: vec![("accept".into(), "text/event-stream".into())],
            body: Bytes::new(),
        }
    }

    pub fn delete() -> Call {
        Call {
            method: Method::DELETE,
            headers: vec![],
            body: Bytes::new(),
        }
    }

    pub fn header(self, name: &str, value: &str) -> Call {
        self.header_bytes(name, value.as_bytes())
    }

    /// A header whose value need not be text (HTTP allows bytes 0x80–0xFF).
    pub fn header_bytes(mut self, name: &str, value: &[u8]) -> Call {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.into(), value.to_vec()));
        self
    }

    pub fn session(self, id: &str) -> Call {
        self.header("mcp-session-id", id)
            .header("mcp-protocol-version", V_LATEST)
    }
}

impl McpClient {
    /// A client for an `http://` URL.
    pub fn new(url: String) -> Self {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        Self::with_tls(url, tls)
    }

    /// A client for an `https://` URL with the given trust and identity
    /// (HTTP/2 or HTTP/1.1, as ALPN decides).
    pub fn with_tls(url: String, tls: rustls::ClientConfig) -> Self {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_all_versions()
            .build();
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Self { url, http }
    }

    /// A client for an `http://` URL that opens a new connection for every
    /// request (no pool), so a relay can cut one request's connection.
    pub fn unpooled(url: String) -> Self {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .expect("protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            )
            .https_or_http()
            .enable_http1()
            .build();
        let http = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        Self { url, http }
    }

    /// As [`McpClient::with_tls`], offering HTTP/1.1 only.
    pub fn with_tls_http1(url: String, tls: rustls::ClientConfig) -> Self {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Self { url, http }
    }

    pub async fn send(&self, call: Call) -> Response<Incoming> {
        self.try_send(call).await.expect("request sent")
    }

    /// Sends `call`; a connection the server refused is an `Err`.
    pub async fn try_send(
        &self,
        call: Call,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        let mut req = Request::builder().method(call.method).uri(&self.url);
        for (k, v) in &call.headers {
            let value = http::HeaderValue::from_bytes(v).expect("a header value");
            req = req.header(k.as_str(), value);
        }
        let req = req.body(Full::new(call.body)).expect("request");
        tokio::time::timeout(LIMIT, self.http.request(req))
            .await
            .expect("response head in time")
    }

    /// `initialize` + `notifications/initialized`; returns the session id.
    pub async fn initialize(&self, version: &str) -> String {
        let res = self.send(Call::post(&initialize(version))).await;
        assert_eq!(res.status(), StatusCode::OK);
        let session = session_id(res.headers()).expect("session id");
        let events = read_all(res).await;
        let result = events.iter().find_map(message).expect("initialize result");
        assert!(result["result"]["protocolVersion"].is_string(), "{result}");
        let res = self
            .send(
                Call::post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
                    .session(&session),
            )
            .await;
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        session
    }
}

/// The demo `ask` tool's elicitation round trip: the server's request must
/// reach the client on the call's stream, the client's answer (a separate
/// POST, 202) must reach the upstream, and the result must carry it.
pub async fn elicitation_round_trip(client: &McpClient, session: &str, id: u64) {
    let call = Call::post(&tool_call(id, "ask", json!({"kind":"elicitation"}))).session(session);
    let mut reader = SseReader::new(client.send(call).await);
    let (_, request) = reader.next_message().await.expect("the server's request");
    assert_eq!(request["method"], "elicitation/create");
    let colour = format!("colour-{id}");
    let answer = json!({"jsonrpc":"2.0","id":request["id"],
        "result":{"action":"accept","content":{"colour":colour}}});
    let res = client.send(Call::post(&answer).session(session)).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let (_, result) = reader.next_message().await.expect("the tool result");
    assert_eq!(result["id"], id);
    let text = result["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains(&colour), "{result}");
}

pub fn initialize(version: &str) -> Value {
    json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}})
}

pub fn slow_call(id: u64, steps: u64, interval_ms: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name":"slow","arguments":{"steps":steps,"interval_ms":interval_ms},
        "_meta":{"progressToken": format!("p{id}")}}})
}

pub fn tool_call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":arguments}})
}

pub fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The JSON message an event carries, if any (priming events carry none).
pub fn message(event: &Event) -> Option<Value> {
    if event.data.is_empty() {
        None
    } else {
        Some(serde_json::from_slice(&event.data).expect("event data is JSON"))
    }
}

/// Reads SSE events from a response body, one at a time.
pub struct SseReader {
    body: Incoming,
    decoder: Decoder,
}

impl SseReader {
    pub fn new(res: Response<Incoming>) -> Self {
        let ct = res
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
        Self {
            body: res.into_body(),
            decoder: Decoder::new(),
        }
    }

    /// The next event, or `None` when the body ended.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.decoder.next_event() {
                return Some(event);
            }
            let frame = tokio::time::timeout(LIMIT, self.body.frame())
                .await
                .expect("SSE event in time")?;
            let frame = frame.ok()?;
            if let Ok(data) = frame.into_data() {
                self.decoder.push(&data);
            }
        }
    }

    /// The next event that carries a message.
    pub async fn next_message(&mut self) -> Option<(Option<String>, Value)> {
        loop {
            let event = self.next().await?;
            if let Some(m) = message(&event) {
                return Some((event.id, m));
            }
        }
    }
}

/// A session with one short call read to its end: the session id, and the
/// id of the call's first event (what a client that comes back names).
pub async fn a_session_with_a_finished_call(client: &McpClient) -> (String, String) {
    let sid = client.initialize(V_LATEST).await;
    let res = client
        .send(Call::post(&slow_call(2, 3, 10)).session(&sid))
        .await;
    let events = read_all(res).await;
    let first = events
        .iter()
        .find_map(|e| e.id.clone())
        .expect("an event id");
    (sid, first)
}

pub async fn read_all(res: Response<Incoming>) -> Vec<Event> {
    let mut reader = SseReader::new(res);
    let mut events = Vec::new();
    while let Some(e) = reader.next().await {
        events.push(e);
    }
    events
}

/// Every message of an SSE answer, in order (priming events carry none).
pub async fn messages(res: Response<Incoming>) -> Vec<Value> {
    read_all(res).await.iter().filter_map(message).collect()
}

pub async fn body_json(res: Response<Incoming>) -> Value {
    let bytes = body_bytes(res).await;
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("not JSON ({e}): {bytes:?}"))
}

pub async fn body_bytes(res: Response<Incoming>) -> Bytes {
    tokio::time::timeout(LIMIT, res.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes()
}

/// The `progress` of each progress notification among `messages`, in order.
pub fn progress_values(messages: &[Value]) -> Vec<u64> {
    messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["params"]["progress"].as_u64().unwrap_or_default())
        .collect()
}

/// Polls `check` until it holds or the limit passes.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A new live `tools/call` stream of a new session, for tests that write
/// to a store directly.
pub fn call_meta() -> mcp_resume_proxy::store::StreamMeta {
    use mcp_resume_proxy::id::{SessionId, StreamId};
    use mcp_resume_proxy::store::{now_ms, StreamKind, StreamMeta};
    StreamMeta::new(
        StreamId::random(),
        SessionId::random(),
        StreamKind::Request,
        Vec::new(),
        Some("tools/call".into()),
        now_ms(),
    )
}
