//! `DemoUpstream`: a small but real legacy MCP Streamable HTTP server
//! (revisions 2025-03-26, 2025-06-18 and 2025-11-25, optionally also stateless
//! 2026-07-28 requests) on raw hyper. It owns its listener, its sessions and
//! their in-memory event logs, and four tools (`echo`, `slow`, `ask`,
//! `notify`) chosen to exercise everything a resuming proxy has to get right:
//! progress, server-to-client requests, the standalone GET stream,
//! cancellation, batches, JSON responses and SEP-1699 stream cuts; for
//! 2026-07-28 requests also `confirm`, multi-round-trip input. The proxy's
//! `demo` command runs it for newcomers and the integration tests run it
//! in-process, so it speaks the wire format exactly. This file is the HTTP
//! side (routing, status codes, headers, which response shape a request
//! gets); `responses` builds the answers, `session` runs the methods and
//! tools, `mrtr` seals and checks the MRTR `requestState`, `stream_log` keeps
//! the resumable SSE logs, and `session_wide_replay` answers resumptions the
//! way server-everything does when that option is on.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use http::header;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::mrtr::StateSeal;
use super::responses::{
    json_response, plain, response, rpc_error_response, sse_response, with_session, NoSession,
    SESSION_HEADER,
};
use super::session::{
    is_notification, is_request, is_response, lock, on_notification, on_response, Call, Session,
    Sink,
};
use super::session_wide_replay::{self, Journal};
pub use super::stats::DemoStats;
use super::stats::MODERN_VERSION;
use super::stream_log::{pump, PumpOptions};
use crate::reply::{self, Body};

const LEGACY_VERSIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];
const LATEST_LEGACY: &str = "2025-11-25";
/// The first revision whose POST streams open with a priming event.
const PRIMING_SINCE: &str = "2025-11-25";
const MAX_BODY: usize = 4 << 20;
/// Reconnection delay advertised in priming events when streams get cut on
/// purpose, so that clients come back quickly.
const POLL_RETRY_MS: u64 = 500;

#[derive(Clone, Debug, Default)]
pub struct DemoOptions {
    /// Answer requests with `application/json` (Content-Length) instead of SSE.
    pub json_response: bool,
    /// SSE, but the whole body computed first and sent with Content-Length.
    pub buffered_sse: bool,
    /// Also serve stateless 2026-07-28 requests.
    pub modern: bool,
    /// End SSE POST responses after this many events (SEP-1699 polling); the
    /// call keeps running and the client resumes with GET + `Last-Event-ID`.
    pub close_after_events: Option<usize>,
    /// SSE without event ids: a server that does not support resumption.
    pub no_event_ids: bool,
    /// Resume as `@modelcontextprotocol/server-everything` does: event ids
    /// are random UUIDs in one journal per session, and GET +
    /// `Last-Event-ID` replays every event of every stream of the session
    /// after that id (priming events as `{}`), then stays open and silent
    /// for good while the tools run on; asking again with the newest id gets
    /// what was logged since. No 409 for concurrent resumptions.
    pub session_wide_replay: bool,
    /// Declare 2025-11-25 `capabilities.tasks` in `initialize`, like a
    /// server with tasks of its own (it serves none).
    pub declares_tasks: bool,
}

/// A running demo server; shut down explicitly or when dropped.
#[derive(Debug)]
pub struct DemoUpstream {
    pub addr: SocketAddr,
    pub stats: Arc<DemoStats>,
    shutdown: watch::Sender<bool>,
}

impl DemoUpstream {
    pub async fn spawn(listen: SocketAddr, opts: DemoOptions) -> std::io::Result<DemoUpstream> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(DemoStats::default());
        let (shutdown, stop) = watch::channel(false);
        let random = SystemRandom::new();
        let seal = StateSeal::generate(&random)
            .ok_or_else(|| std::io::Error::other("no randomness for the requestState key"))?;
        let server = Arc::new(Server {
            opts,
            stats: stats.clone(),
            sessions: DashMap::new(),
            random,
            seal: Arc::new(seal),
        });
        tokio::spawn(accept_loop(listener, server, stop));
        Ok(DemoUpstream {
            addr,
            stats,
            shutdown,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Stops accepting and drops every connection (open streams end abruptly,
    /// which is what a crashed or restarted upstream looks like).
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }
}

impl Drop for DemoUpstream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    // An error means the DemoUpstream is gone, which is a shutdown too.
    let _ = stop.wait_for(|s| *s).await;
}

async fn accept_loop(listener: TcpListener, server: Arc<Server>, stop: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            () = stopped(stop.clone()) => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Usually EMFILE; pausing avoids spinning on it.
                    tracing::debug!(error = %e, "demo upstream accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let server = server.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(server.handle(req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                res = conn => if let Err(e) = res {
                    tracing::debug!(error = %e, "demo upstream connection ended with an error");
                },
                // Dropping the connection future closes the socket.
                () = stopped(stop) => {}
            }
        });
    }
}

struct Server {
    opts: DemoOptions,
    stats: Arc<DemoStats>,
    sessions: DashMap<String, Arc<Session>>,
    random: SystemRandom,
    /// This server's `requestState` key: a restarted server opens no state
    /// an earlier one sealed, as with the Python SDK's default key.
    seal: Arc<StateSeal>,
}

impl Server {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        // Health checks are not MCP requests: kept out of the request log.
        if req.uri().path() == "/healthz" {
            return match self.stats.unhealthy.load(Ordering::Relaxed) {
                true => plain(StatusCode::SERVICE_UNAVAILABLE, "unhealthy"),
                false => plain(StatusCode::OK, "ok"),
            };
        }
        lock(&self.stats.requests).push(req.headers().clone());
        if req.uri().path() != "/mcp" {
            return plain(StatusCode::NOT_FOUND, "not found");
        }
        match *req.method() {
            Method::POST => self.post(req).await,
            Method::GET => self.get(req.headers()),
            Method::DELETE => self.delete(req.headers()),
            _ => {
                let mut resp = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
                resp.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
                resp
            }
        }
    }

    async fn post(&self, req: Request<Incoming>) -> Response<Body> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !is_json {
            return plain(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Content-Type must be application/json",
            );
        }
        let (parts, body) = req.into_parts();
        let bytes = match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => return plain(StatusCode::BAD_REQUEST, "unreadable or oversized body"),
        };
        let Ok(body) = serde_json::from_slice::<Value>(&bytes) else {
            return rpc_error_response(StatusCode::BAD_REQUEST, -32700, "Parse error");
        };
        let (batch, messages) = match body {
            Value::Array(items) => (true, items),
            other => (false, vec![other]),
        };
        let valid = |m: &Value| is_request(m) || is_notification(m) || is_response(m);
        if messages.is_empty() || !messages.iter().all(valid) {
            return rpc_error_response(StatusCode::BAD_REQUEST, -32600, "Invalid Request");
        }

        let modern = self.opts.modern
            && parts
                .headers
                .get("mcp-protocol-version")
                .is_some_and(|v| v.as_bytes() == MODERN_VERSION.as_bytes());
        if modern {
            return match messages.into_iter().next() {
                Some(message) if !batch => self.post_modern(message).await,
                _ => rpc_error_response(
                    StatusCode::BAD_REQUEST,
                    -32600,
                    "Invalid Request: 2026-07-28 has no batches",
                ),
            };
        }

        let http11 = parts.version == Version::HTTP_11;
        let requests: Vec<Value> = messages.iter().filter(|m| is_request(m)).cloned().collect();
        if let Some(init) = requests.iter().find(|m| m["method"] == "initialize") {
            if batch {
                return rpc_error_response(
                    StatusCode::BAD_REQUEST,
                    -32600,
                    "Invalid Request: initialize must not be part of a batch",
                );
            }
            if parts.headers.contains_key(SESSION_HEADER) {
                return rpc_error_response(
                    StatusCode::BAD_REQUEST,
                    -32600,
                    "Invalid Request: Server already initialized",
                );
            }
            let Some(session) = self.create_session(init) else {
                return plain(StatusCode::INTERNAL_SERVER_ERROR, "no randomness");
            };
            return self.respond(session, requests, false, http11).await;
        }

        let session = match self.session_for(&parts.headers) {
            Ok(session) => session,
            Err(no_session) => return no_session.response(),
        };
        for message in &messages {
            if is_notification(message) {
                on_notification(&session, message);
            } else if is_response(message) {
                on_response(&session, message);
            }
        }
        if requests.is_empty() {
            return with_session(
                response(StatusCode::ACCEPTED, None, reply::empty()),
                &session.id,
            );
        }
        self.respond(session, requests, batch, http11).await
    }

    fn create_session(&self, init: &Value) -> Option<Arc<Session>> {
        let mut raw = [0u8; 16];
        self.random.fill(&mut raw).ok()?;
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let journal = self
            .opts
            .session_wide_replay
            .then(|| Arc::new(Journal::new()));
        let mut session = Session::new(id.clone(), negotiate(init).to_owned(), journal);
        session.declares_tasks = self.opts.declares_tasks;
        let session = Arc::new(session);
        self.sessions.insert(id, session.clone());
        DemoStats::bump(&self.stats.sessions_created);
        Some(session)
    }

    /// The session a request names, or the response SDK servers give when
    /// the header is missing (400) or names no live session (404).
    fn session_for(&self, headers: &HeaderMap) -> Result<Arc<Session>, NoSession> {
        let id = headers.get(SESSION_HEADER).ok_or(NoSession::Missing)?;
        id.to_str()
            .ok()
            .and_then(|id| self.sessions.get(id).map(|s| s.clone()))
            .ok_or(NoSession::Unknown)
    }

    fn start_call(&self, session: Option<Arc<Session>>, sink: Sink, request: &Value) -> Call {
        let stateless = session.is_none();
        let call = Call::start(self.stats.clone(), session, sink, request);
        match stateless {
            true => call.with_seal(self.seal.clone()),
            false => call,
        }
    }

    /// Answers the requests of one legacy POST.
    async fn respond(
        &self,
        session: Arc<Session>,
        requests: Vec<Value>,
        batch: bool,
        http11: bool,
    ) -> Response<Body> {
        if self.opts.json_response {
            return self.respond_json(Some(session), requests, batch).await;
        }
        let log = session.open_stream(requests.len());
        if session.version.as_str() >= PRIMING_SINCE {
            log.push_priming();
        }
        // With a buffered body the client sees nothing before the end, so a
        // server-to-client request could never be answered.
        let interactive = !self.opts.buffered_sse;
        for request in requests {
            let sink = Sink::Log {
                log: log.clone(),
                interactive,
            };
            let call = self.start_call(Some(session.clone()), sink, &request);
            let log = log.clone();
            tokio::spawn(async move {
                if let Some(answer) = call.answer(&request).await {
                    log.push(&answer);
                }
                drop(call);
                log.finish_one();
            });
        }

        let limit = self.opts.close_after_events;
        let retry = limit.map(|_| POLL_RETRY_MS);
        let sse = |body| with_session(sse_response(body), &session.id);
        let opts = PumpOptions {
            limit,
            keep_alive: false,
            retry,
            ids: !self.opts.no_event_ids,
        };
        if self.opts.buffered_sse {
            return sse(reply::full(log.encode_when_done(&opts).await));
        }
        let (tx, body) = reply::streamed(16);
        tokio::spawn(async move { pump(&log, 0, tx, opts, |_| {}).await });
        let mut resp = sse(body);
        if limit.is_some() && http11 {
            // A cut stream also closes the connection, as a polling server's
            // load balancer would; HTTP/2 has no such header.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }

    /// JSON response mode: everything computed first, progress not sent.
    async fn respond_json(
        &self,
        session: Option<Arc<Session>>,
        requests: Vec<Value>,
        batch: bool,
    ) -> Response<Body> {
        let calls = requests.iter().map(|request| {
            let call = self.start_call(session.clone(), Sink::Discard, request);
            async move { call.answer(request).await }
        });
        let mut answers: Vec<Value> = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect();
        let body = match (batch, answers.len()) {
            (_, 0) => None,
            (true, _) => Some(Value::Array(answers)),
            (false, _) => answers.pop(),
        };
        let resp = match body {
            Some(body) => json_response(StatusCode::OK, &body),
            // Every request was cancelled: nothing to answer.
            None => response(StatusCode::ACCEPTED, None, reply::empty()),
        };
        match &session {
            Some(session) => with_session(resp, &session.id),
            None => resp,
        }
    }

    /// A stateless 2026-07-28 request: no session; `tools/call` streams (no
    /// ids, no priming), the rest is plain JSON.
    async fn post_modern(&self, message: Value) -> Response<Body> {
        if !is_request(&message) {
            return response(StatusCode::ACCEPTED, None, reply::empty());
        }
        if let Some(refusal) = self.seal.refusal(&message) {
            return refusal;
        }
        if message["method"] != "tools/call" || self.opts.json_response {
            return self.respond_json(None, vec![message], false).await;
        }
        let (tx, body) = reply::streamed(16);
        let call = self.start_call(None, Sink::Channel(tx), &message);
        tokio::spawn(async move {
            if let Some(answer) = call.answer(&message).await {
                call.deliver(&answer).await;
            }
        });
        sse_response(body)
    }

    fn get(&self, headers: &HeaderMap) -> Response<Body> {
        let session = match self.session_for(headers) {
            Ok(session) => session,
            Err(no_session) => return no_session.response(),
        };
        let accepts_sse = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("text/event-stream"));
        if !accepts_sse {
            return plain(
                StatusCode::NOT_ACCEPTABLE,
                "Not Acceptable: Accept must include text/event-stream",
            );
        }
        let Some(last) = headers.get("last-event-id") else {
            return self.open_standalone(session, None);
        };
        if let Some(journal) = &session.journal {
            // Whatever the id, even an unknown one: 200 and a replay.
            DemoStats::bump(&self.stats.resumed_gets);
            let last = String::from_utf8_lossy(last.as_bytes());
            let body = session_wide_replay::replay(journal.clone(), &last);
            return with_session(sse_response(body), &session.id);
        }
        // Our ids are `{stream_key}-{index}`; anything else is not ours.
        let found = last.to_str().ok().and_then(|last| {
            let (key, index) = last.rsplit_once('-')?;
            let index: usize = index.parse().ok()?;
            let log = match key {
                "g" => None,
                key => Some(session.lock().streams.get(key)?.clone()),
            };
            let len = log
                .as_ref()
                .map_or_else(|| session.standalone.len(), |l| l.len());
            (index < len).then_some((log, index + 1))
        });
        match found {
            None => rpc_error_response(
                StatusCode::BAD_REQUEST,
                -32000,
                "Bad Request: unknown Last-Event-ID",
            ),
            Some((None, from)) => self.open_standalone(session, Some(from)),
            Some((Some(log), from)) => {
                DemoStats::bump(&self.stats.resumed_gets);
                let (tx, body) = reply::streamed(16);
                let opts = PumpOptions {
                    limit: None,
                    keep_alive: false,
                    retry: None,
                    ids: true,
                };
                tokio::spawn(async move { pump(&log, from, tx, opts, |_| {}).await });
                with_session(sse_response(body), &session.id)
            }
        }
    }

    /// The session's standalone GET stream, from where the last one stopped
    /// (or from `from` when resumed). At most one per session.
    fn open_standalone(&self, session: Arc<Session>, from: Option<usize>) -> Response<Body> {
        let cursor = {
            let mut state = session.lock();
            if state.get_open {
                return rpc_error_response(
                    StatusCode::CONFLICT,
                    -32000,
                    "Conflict: Only one SSE stream is allowed per session",
                );
            }
            state.get_open = true;
            from.unwrap_or(state.standalone_cursor)
        };
        if from.is_some() {
            DemoStats::bump(&self.stats.resumed_gets);
        }
        let (tx, body) = reply::streamed(16);
        let resp = with_session(sse_response(body), &session.id);
        tokio::spawn(async move {
            let opts = PumpOptions {
                limit: None,
                keep_alive: true,
                retry: None,
                ids: true,
            };
            let delivered = |c: usize| {
                let mut state = session.lock();
                state.standalone_cursor = state.standalone_cursor.max(c);
            };
            pump(&session.standalone, cursor, tx, opts, delivered).await;
            session.lock().get_open = false;
        });
        resp
    }

    fn delete(&self, headers: &HeaderMap) -> Response<Body> {
        let session = match self.session_for(headers) {
            Ok(session) => session,
            Err(no_session) => return no_session.response(),
        };
        if self.sessions.remove(&session.id).is_some() {
            DemoStats::bump(&self.stats.sessions_deleted);
        }
        session.standalone.close();
        if let Some(journal) = &session.journal {
            journal.close();
        }
        response(StatusCode::OK, None, reply::empty())
    }
}

/// The revision an `initialize` request gets: the one it asks for when
/// supported, else the latest.
pub(super) fn negotiate(init: &Value) -> &'static str {
    let requested = init
        .pointer("/params/protocolVersion")
        .and_then(Value::as_str);
    LEGACY_VERSIONS
        .into_iter()
        .find(|v| requested == Some(*v))
        .unwrap_or(LATEST_LEGACY)
}
