//! The MCP client the harness drives: a [`Target`] names an endpoint (the
//! fast upstream, a proxy or a peer), and the functions here open raw hyper
//! HTTP/1.1 connections to it, open sessions and make `tools/call` requests,
//! reading each answer (JSON or SSE) to the end. It is deliberately thin — no
//! MCP SDK, no connection pool — so the client's own cost stays small and the
//! same for every target.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use mcp_resume_proxy::reply::sse::Decoder;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// The protocol revision the harness speaks: legacy, without priming events,
/// so every SSE event it counts is an upstream message.
const PROTOCOL: &str = "2025-06-18";
/// The revision a client that speaks dialects or tasks asks for: the
/// proxy offers the 2025-11-25 tasks only to clients that ask for it.
const PROTOCOL_TASKS: &str = "2025-11-25";

/// What a target's client negotiates and how it calls a tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaks {
    /// Nothing beyond the base protocol: a plain `tools/call`.
    Plain,
    /// Every dialect the proxy offers (`resumableRequests`, `streams`,
    /// `resumeTokens`, and the 2025-11-25 tasks), calling tools plainly:
    /// what negotiation costs a call that uses none of it.
    Dialects,
    /// As `Dialects`, and every call made a 2025-11-25 task: `tools/call`
    /// with `params.task`, then `tasks/result` for its answer.
    Tasks,
}

impl Speaks {
    fn protocol(self) -> &'static str {
        match self {
            Self::Plain => PROTOCOL,
            Self::Dialects | Self::Tasks => PROTOCOL_TASKS,
        }
    }

    fn capabilities(self) -> &'static str {
        match self {
            Self::Plain => "{}",
            Self::Dialects | Self::Tasks => {
                r#"{"experimental":{"resumableRequests":{},"streams":{},"resumeTokens":{}}}"#
            }
        }
    }
}
/// Connections being opened at once: stays under the listen backlog, so no
/// SYN is dropped and retried a second later.
pub const CONNECT_PARALLELISM: usize = 128;

/// An MCP endpoint under test.
#[derive(Clone)]
pub struct Target {
    pub name: String,
    pub addr: SocketAddr,
    host: HeaderValue,
    path: String,
    tool: String,
    /// The process whose CPU and memory the figures are about (the proxy).
    pub pid: Option<u32>,
    pub speaks: Speaks,
    /// `Authorization` values the target's clients send, the `n`-th client
    /// the `n`-th (round robin); empty: no header. Every target of a table
    /// gets the same ones, so every row's client does the same work.
    credentials: Arc<[HeaderValue]>,
    /// Which client of the target this is (see [`Target::client`]).
    client: usize,
}

impl Target {
    pub fn new(name: &str, addr: SocketAddr, path: &str, tool: &str, pid: Option<u32>) -> Self {
        Self {
            name: name.to_owned(),
            addr,
            host: HeaderValue::from_str(&addr.to_string()).expect("socket address is ASCII"),
            path: path.to_owned(),
            tool: tool.to_owned(),
            pid,
            speaks: Speaks::Plain,
            credentials: Arc::new([]),
            client: 0,
        }
    }

    /// The same endpoint, its clients sending `credentials` in turn.
    pub fn with_credentials(mut self, credentials: Arc<[HeaderValue]>) -> Self {
        self.credentials = credentials;
        self
    }

    /// The target as its `n`-th client sees it: with the `n`-th credential
    /// (round robin), so each connection of a run keeps one token.
    pub fn client(&self, n: usize) -> Self {
        Self {
            client: n,
            ..self.clone()
        }
    }

    fn authorization(&self) -> Option<&HeaderValue> {
        match self.credentials.len() {
            0 => None,
            len => Some(&self.credentials[self.client % len]),
        }
    }

    /// The same endpoint, with a client that speaks `speaks`.
    pub fn speaking(mut self, name: &str, speaks: Speaks) -> Self {
        self.name = name.to_owned();
        self.speaks = speaks;
        self
    }

    /// The fast upstream reached directly: the yardstick row of every table.
    pub fn direct(upstream: SocketAddr) -> Self {
        Self::new("direct", upstream, "/mcp", "echo", None)
    }
}

pub type Sender = SendRequest<Full<Bytes>>;

/// One HTTP/1.1 connection; requests on it go one after another, as an MCP
/// client's would on a keep-alive connection.
pub async fn connect(addr: SocketAddr) -> Result<Sender> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// Opens `n` connections, at most [`CONNECT_PARALLELISM`] at a time.
pub async fn connect_many(addr: SocketAddr, n: usize) -> Result<Vec<Sender>> {
    let gate = Arc::new(Semaphore::new(CONNECT_PARALLELISM));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await?;
            connect(addr).await
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

pub fn request(
    t: &Target,
    method: Method,
    session: Option<&str>,
    last_event_id: Option<&str>,
    body: Bytes,
) -> Result<Request<Full<Bytes>>> {
    let mut req = Request::builder()
        .method(method.clone())
        .uri(t.path.as_str())
        .header(header::HOST, t.host.clone())
        .header("mcp-protocol-version", t.speaks.protocol());
    if method == Method::GET {
        req = req.header(header::ACCEPT, "text/event-stream");
    } else {
        req = req
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
    }
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    if let Some(credential) = t.authorization() {
        req = req.header(header::AUTHORIZATION, credential.clone());
    }
    Ok(req.body(Full::new(body))?)
}

pub async fn send(conn: &mut Sender, req: Request<Full<Bytes>>) -> Result<Response<Incoming>> {
    conn.ready().await?;
    Ok(conn.send_request(req).await?)
}

/// What came back for one request, its body read to the end.
#[derive(Default)]
pub struct Reply {
    /// Messages received (SSE events with data, or one JSON body).
    pub messages: u64,
    /// A JSON-RPC result (not an error) was among them.
    pub result: bool,
    pub first_id: Option<String>,
    pub first_message_at: Option<Instant>,
    /// The id of the task a `tools/call` made (`CreateTaskResult`).
    pub task: Option<String>,
}

pub async fn read_reply(res: Response<Incoming>) -> Result<Reply> {
    if res.status() != StatusCode::OK {
        let status = res.status();
        let body = res.into_body().collect().await?.to_bytes();
        bail!("status {status}: {}", String::from_utf8_lossy(&body));
    }
    let sse = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = res.into_body();
    let mut reply = Reply::default();
    if sse {
        let mut decoder = Decoder::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            decoder.push(&data);
            while let Some(event) = decoder.next_event() {
                if event.data.is_empty() {
                    continue;
                }
                reply.messages += 1;
                if reply.first_message_at.is_none() {
                    reply.first_message_at = Some(Instant::now());
                    reply.first_id = event.id;
                }
                note_result(&mut reply, &event.data);
            }
        }
    } else {
        let bytes = body.collect().await?.to_bytes();
        if !bytes.is_empty() {
            reply.messages = 1;
            reply.first_message_at = Some(Instant::now());
            note_result(&mut reply, &bytes);
        }
    }
    Ok(reply)
}

fn note_result(reply: &mut Reply, message: &[u8]) {
    // Progress notifications never carry these keys; the final answer does.
    if memchr::memmem::find(message, b"\"result\"").is_some()
        && memchr::memmem::find(message, b"\"error\"").is_none()
    {
        reply.result = true;
        if memchr::memmem::find(message, b"\"taskId\"").is_some() {
            reply.task = created_task(message);
        }
    }
}

/// `initialize` + `notifications/initialized`; returns the session id.
pub async fn open_session(conn: &mut Sender, t: &Target) -> Result<String> {
    let init = Bytes::from(format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"{}\",\
         \"capabilities\":{},\"clientInfo\":{{\"name\":\"load\",\"version\":\"1\"}}}}}}",
        t.speaks.protocol(),
        t.speaks.capabilities(),
    ));
    let res = send(conn, request(t, Method::POST, None, None, init)?).await?;
    let session = res
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("{}: initialize answered without Mcp-Session-Id", t.name))?;
    let reply = read_reply(res).await?;
    if !reply.result {
        bail!("{}: initialize failed", t.name);
    }
    let note =
        Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
    let res = send(conn, request(t, Method::POST, Some(&session), None, note)?).await?;
    let status = res.status();
    res.into_body().collect().await?;
    if !status.is_success() {
        bail!("{}: notifications/initialized got {status}", t.name);
    }
    Ok(session)
}

/// Enough sessions on `conn` for `calls` calls spread 100 to a session, as
/// many clients sharing a server would; the caller keeps `conn` open for the
/// run, so the connection count the figures see does not change midway.
pub async fn open_sessions(conn: &mut Sender, t: &Target, calls: usize) -> Result<Vec<String>> {
    let n = calls.div_ceil(100).max(1);
    let mut sessions = Vec::with_capacity(n);
    for _ in 0..n {
        sessions.push(open_session(conn, t).await?);
    }
    Ok(sessions)
}

/// A `tools/call` of the target's tool with a progress token, so the fast
/// upstream may send progress notifications before the result; made a
/// task (`params.task`) for a client that calls tools as tasks.
pub fn call_body(t: &Target, id: u64, args: &str) -> Bytes {
    let task = if t.speaks == Speaks::Tasks {
        ",\"task\":{}"
    } else {
        ""
    };
    Bytes::from(format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"{}\",\
         \"arguments\":{args}{task},\"_meta\":{{\"progressToken\":{id}}}}}}}",
        t.tool
    ))
}

/// One tool call, read to its answer: for a task, the `tools/call` that
/// creates it and the `tasks/result` that waits for its answer.
pub async fn call(
    conn: &mut Sender,
    t: &Target,
    session: &str,
    id: u64,
    args: &str,
) -> Result<Reply> {
    let req = request(t, Method::POST, Some(session), None, call_body(t, id, args))?;
    let mut reply = read_reply(send(conn, req).await?).await?;
    if t.speaks == Speaks::Tasks {
        let task = reply
            .task
            .take()
            .ok_or_else(|| anyhow!("{}: tools/call {id} made no task", t.name))?;
        let fetch = Bytes::from(format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tasks/result\",\"params\":{{\"taskId\":\"{task}\"}}}}"
        ));
        let req = request(t, Method::POST, Some(session), None, fetch)?;
        reply = read_reply(send(conn, req).await?).await?;
    }
    if !reply.result {
        bail!("{}: tools/call {id} ended without a result", t.name);
    }
    Ok(reply)
}

/// The `result.task.taskId` of a `CreateTaskResult`.
fn created_task(message: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(message).ok()?;
    Some(value["result"]["task"]["taskId"].as_str()?.to_owned())
}
