//! Support for dialect tests: a proxy in front of the demo server over HTTP
//! *or* stdio (so one scenario runs against both), `initialize` with
//! declared capabilities, and the dialects' wire messages.

use http::StatusCode;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::Server;
use serde_json::{json, Value};

use super::*;

const BIN: &str = env!("CARGO_BIN_EXE_mcp-resume-proxy");

/// Which kind of upstream the demo server runs as.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Http,
    Stdio,
}

/// A proxy in front of the demo server.
pub struct Front {
    pub proxy: Option<Server>,
    pub client: McpClient,
    /// The HTTP demo server (its counters), when it is one.
    pub upstream: Option<DemoUpstream>,
    pub dir: tempfile::TempDir,
    /// What the proxy was started with, to start it again.
    config: Config,
}

impl Front {
    pub async fn start(kind: Kind) -> Front {
        Self::with(kind, |_| {}).await
    }

    pub async fn with(kind: Kind, tweak: impl FnOnce(&mut Config)) -> Front {
        let dir = tempfile::tempdir().expect("temp dir");
        let (upstream, up) = match kind {
            Kind::Http => {
                let demo = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
                    .await
                    .expect("demo upstream starts");
                let config = UpstreamConfig::new(demo.url());
                (Some(demo), config)
            }
            Kind::Stdio => {
                let mut config =
                    UpstreamConfig::command(vec![BIN.into(), "demo-stdio-server".into()]);
                config.kill_grace_secs = 1;
                (None, config)
            }
        };
        let mut config = Config {
            listen: ([127, 0, 0, 1], 0).into(),
            data_dir: dir.path().to_path_buf(),
            upstream: vec![up],
            shutdown_grace_secs: 1,
            ..Config::default()
        };
        tweak(&mut config);
        let proxy = Server::start(config.clone()).await.expect("proxy starts");
        let client = McpClient::new(format!("http://{}/mcp", proxy.addr));
        Front {
            proxy: Some(proxy),
            client,
            upstream,
            dir,
            config,
        }
    }

    /// Stops the proxy and starts it again on the same data dir.
    pub async fn restart(&mut self) {
        if let Some(proxy) = self.proxy.take() {
            proxy.shutdown().await;
        }
        let proxy = Server::start(self.config.clone())
            .await
            .expect("proxy restarts");
        self.client = McpClient::new(format!("http://{}/mcp", proxy.addr));
        self.proxy = Some(proxy);
    }

    /// A session that declared `capabilities` (e.g. `{"streams":{}}`);
    /// returns its id and the relayed `initialize` result.
    pub async fn session(&self, capabilities: Value) -> (String, Value) {
        initialize_declaring(&self.client, capabilities).await
    }
}

/// Both dialects, declared at the top level.
pub fn both() -> Value {
    json!({"resumableRequests": {}, "streams": {}})
}

pub async fn initialize_declaring(client: &McpClient, capabilities: Value) -> (String, Value) {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion": V_LATEST, "capabilities": capabilities,
        "clientInfo": {"name": "test", "version": "1"}}});
    let res = client.send(Call::post(&init)).await;
    assert_eq!(res.status(), StatusCode::OK);
    let session = session_id(res.headers()).expect("session id");
    let result = messages(res)
        .await
        .into_iter()
        .find(|m| m.get("result").is_some())
        .expect("initialize result");
    let res = client
        .send(
            Call::post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
                .session(&session),
        )
        .await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    (session, result)
}

/// Every message of a slow call of `steps` steps, run to its end.
pub async fn whole_call(
    front: &Front,
    session: &str,
    id: u64,
    steps: u64,
) -> Vec<(Option<String>, Value)> {
    let call = Call::post(&slow_call(id, steps, 5)).session(session);
    read_to_end(front.client.send(call).await).await
}

pub fn request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":method,"params":params})
}

/// Sends a request the proxy answers with one JSON body; returns it.
pub async fn ask(client: &McpClient, session: &str, message: &Value) -> Value {
    let res = client
        .send(
            Call::post(message)
                .session(session)
                .header("accept", "application/json, text/event-stream"),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK, "asking {message}");
    body_json(res).await
}

/// The (event id, message) pairs of an SSE answer up to `n` messages, then
/// drops the connection (a cut).
pub async fn read_then_cut(
    res: http::Response<hyper::body::Incoming>,
    n: usize,
) -> Vec<(Option<String>, Value)> {
    let mut reader = SseReader::new(res);
    let mut got = Vec::new();
    while got.len() < n {
        match reader.next_message().await {
            Some(m) => got.push(m),
            None => break,
        }
    }
    got
}

/// Every (event id, message) of an SSE answer.
pub async fn read_to_end(
    res: http::Response<hyper::body::Incoming>,
) -> Vec<(Option<String>, Value)> {
    let mut reader = SseReader::new(res);
    let mut got = Vec::new();
    while let Some(m) = reader.next_message().await {
        got.push(m);
    }
    got
}

pub fn method(m: &Value) -> &str {
    m["method"].as_str().unwrap_or_default()
}

/// The resume token of a stream's policy entry.
pub fn resume_token(messages: &[(Option<String>, Value)]) -> String {
    messages
        .iter()
        .find(|(_, m)| method(m) == "notifications/requests/resumePolicy")
        .and_then(|(_, m)| m["params"]["resumeToken"].as_str())
        .expect("a resume policy")
        .to_owned()
}

/// The stream handle of a stream's `stream/create` entry.
pub fn stream_handle(messages: &[(Option<String>, Value)]) -> String {
    messages
        .iter()
        .find(|(_, m)| method(m) == "notifications/stream/create")
        .and_then(|(_, m)| m["params"]["stream"]["streamId"].as_str())
        .expect("a stream/create")
        .to_owned()
}

/// `requests/resume` for the request `id`.
pub async fn resume_request(
    client: &McpClient,
    session: &str,
    id: u64,
    token: &str,
) -> http::Response<hyper::body::Incoming> {
    let body = request(json!(id), "requests/resume", json!({"resumeToken": token}));
    client.send(Call::post(&body).session(session)).await
}

/// `requests/resume` for the request `id`, after the entry `last_event_id`
/// names.
pub async fn resume_request_after(
    client: &McpClient,
    session: &str,
    id: u64,
    token: &str,
    last_event_id: &str,
) -> http::Response<hyper::body::Incoming> {
    let body = request(json!(id), "requests/resume", json!({"resumeToken": token}));
    let post = Call::post(&body)
        .session(session)
        .header("last-event-id", last_event_id);
    client.send(post).await
}

/// `stream/resume` as request `id`, after the entry `last_event_id` names.
pub async fn resume_stream_after(
    client: &McpClient,
    session: &str,
    id: u64,
    handle: &str,
    last_event_id: &str,
) -> http::Response<hyper::body::Incoming> {
    let body = request(json!(id), "stream/resume", json!({"streamId": handle}));
    let post = Call::post(&body)
        .session(session)
        .header("last-event-id", last_event_id);
    client.send(post).await
}

/// `stream/resume` as request `id`.
pub async fn resume_stream(
    client: &McpClient,
    session: &str,
    id: u64,
    handle: &str,
) -> http::Response<hyper::body::Incoming> {
    let body = request(json!(id), "stream/resume", json!({"streamId": handle}));
    client.send(Call::post(&body).session(session)).await
}

/// Runs each named scenario (an `async fn(Kind)`) against the demo server as
/// an HTTP upstream and as a stdio child.
#[allow(unused_macros)]
macro_rules! both_upstreams {
    ($($name:ident),* $(,)?) => {
        mod http_upstream {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::dialects::Kind::Http).await
                }
            )*
        }
        mod stdio_upstream {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::dialects::Kind::Stdio).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both_upstreams;
