//! The demo upstream's sessions and the requests run in them: per-session
//! state (stream logs, in-flight calls, pending server-to-client requests, the
//! standalone GET stream), routing of the client's notifications and
//! responses, and the MCP methods and tools themselves. HTTP framing stays in
//! `upstream` and line framing in `stdio`; a [`Call`] only ever appends to a
//! [`Sink`], which is what lets its HTTP response be cut, resumed or dropped
//! while it runs, and what lets the stdio mode reuse every tool unchanged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};

use super::mrtr::{self, StateSeal};
use super::responses::{text_result, tool_error};
use super::session_wide_replay::Journal;
use super::stats::{DemoStats, MODERN_VERSION};
use super::stream_log::StreamLog;
use crate::reply::sse;

/// How long `ask` waits for the client's answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(60);

/// Locks ignoring poisoning: every critical section here is a few map or
/// field updates that leave the state consistent even if a holder panicked.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) struct Session {
    pub(super) id: String,
    /// The negotiated protocol revision.
    pub(super) version: String,
    pub(super) next_stream: AtomicU64,
    pub(super) next_ask: AtomicU64,
    /// The standalone GET stream's log, key `g`; it never finishes by itself.
    pub(super) standalone: StreamLog,
    /// Every stream's events together, in the `session_wide_replay` mode.
    pub(super) journal: Option<Arc<Journal>>,
    /// Declare `capabilities.tasks` (2025-11-25) in `initialize`, as a
    /// server with tasks of its own would (the demo serves none: its
    /// `tasks/*` answers are "Method not found").
    pub(super) declares_tasks: bool,
    pub(super) state: Mutex<SessionState>,
}

#[derive(Default)]
pub(super) struct SessionState {
    /// POST streams by key, kept so that any of their ids can be resumed.
    pub(super) streams: HashMap<String, Arc<StreamLog>>,
    /// Cancellation switches of running requests, by JSON-encoded request id.
    pub(super) in_flight: HashMap<String, watch::Sender<bool>>,
    /// `ask` calls waiting for the client's response, by our request id.
    pub(super) asks: HashMap<String, oneshot::Sender<Value>>,
    /// First standalone event not yet handed to a GET response.
    pub(super) standalone_cursor: usize,
    pub(super) get_open: bool,
}

impl Session {
    pub(super) fn new(id: String, version: String, journal: Option<Arc<Journal>>) -> Self {
        Session {
            id,
            version,
            next_stream: AtomicU64::new(0),
            next_ask: AtomicU64::new(0),
            standalone: StreamLog::new("g".to_owned(), usize::MAX, journal.clone()),
            journal,
            declares_tasks: false,
            state: Mutex::new(SessionState::default()),
        }
    }

    /// A new POST stream's log (journaled when the session is), kept so
    /// that any of its ids can be resumed.
    pub(super) fn open_stream(&self, requests: usize) -> Arc<StreamLog> {
        let n = self.next_stream.fetch_add(1, Ordering::Relaxed) + 1;
        let log = Arc::new(StreamLog::new(
            format!("p{n}"),
            requests,
            self.journal.clone(),
        ));
        self.lock()
            .streams
            .insert(log.key().to_owned(), log.clone());
        log
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, SessionState> {
        lock(&self.state)
    }
}

pub(super) fn is_request(m: &Value) -> bool {
    m.get("method").is_some() && m.get("id").is_some()
}

pub(super) fn is_notification(m: &Value) -> bool {
    m.get("method").is_some() && m.get("id").is_none()
}

pub(super) fn is_response(m: &Value) -> bool {
    m.get("method").is_none()
        && m.get("id").is_some()
        && (m.get("result").is_some() || m.get("error").is_some())
}

pub(super) fn on_notification(session: &Session, message: &Value) {
    if message["method"] != "notifications/cancelled" {
        return; // initialized, roots/list_changed, ...: nothing to do
    }
    let Some(request_id) = message.pointer("/params/requestId") else {
        return;
    };
    if let Some(cancel) = session.lock().in_flight.get(&request_id.to_string()) {
        cancel.send_replace(true);
    }
}

pub(super) fn on_response(session: &Session, message: &Value) {
    let waiter = message["id"]
        .as_str()
        .and_then(|id| session.lock().asks.remove(id));
    match waiter {
        // The ask may have timed out meanwhile; then nobody listens.
        Some(waiter) => drop(waiter.send(message.clone())),
        None => tracing::debug!(id = %message["id"], "response to no pending request"),
    }
}

/// Where a call's messages go.
pub(super) enum Sink {
    /// A legacy SSE stream's log; `interactive` when the client sees events
    /// as they happen (not buffered), so server-to-client requests can work.
    Log {
        log: Arc<StreamLog>,
        interactive: bool,
    },
    /// A modern SSE response: written directly, nothing to resume.
    Channel(mpsc::Sender<Bytes>),
    /// JSON response mode: notifications are dropped.
    Discard,
    /// The stdio mode's single writer, shared by every call of the process:
    /// each message becomes one line on stdout. Interactive, and the place
    /// where `notify` writes too (stdio has no standalone stream).
    Stdio(mpsc::Sender<Value>),
}

/// One request being answered.
pub(super) struct Call {
    stats: Arc<DemoStats>,
    session: Option<Arc<Session>>,
    sink: Sink,
    cancel: watch::Receiver<bool>,
    /// Key in the session's `in_flight`, removed on drop.
    key: Option<String>,
    /// Seals the `requestState` of MRTR answers; only stateless (2026-07-28)
    /// calls have one.
    seal: Option<Arc<StateSeal>>,
}

impl Drop for Call {
    fn drop(&mut self) {
        if let (Some(session), Some(key)) = (&self.session, &self.key) {
            session.lock().in_flight.remove(key);
        }
    }
}

impl Call {
    /// Starts answering `request`, registered as in flight in its session
    /// (so that `notifications/cancelled` can reach it) until dropped.
    pub(super) fn start(
        stats: Arc<DemoStats>,
        session: Option<Arc<Session>>,
        sink: Sink,
        request: &Value,
    ) -> Call {
        let (cancel_tx, cancel) = watch::channel(false);
        let key = session.as_ref().and_then(|session| {
            let key = request.get("id")?.to_string();
            session.lock().in_flight.insert(key.clone(), cancel_tx);
            Some(key)
        });
        Call {
            stats,
            session,
            sink,
            cancel,
            key,
            seal: None,
        }
    }

    /// Lets the call answer MRTR (`input_required`) with states `seal` signs.
    pub(super) fn with_seal(mut self, seal: Arc<StateSeal>) -> Call {
        self.seal = Some(seal);
        self
    }

    /// The JSON-RPC response, or None when the request was cancelled.
    pub(super) async fn answer(&self, request: &Value) -> Option<Value> {
        let id = request["id"].clone();
        let params = &request["params"];
        let outcome = match (request["method"].as_str(), &self.session) {
            // The instructions repeat the client capabilities the server saw,
            // so a test can tell what a proxy passed on.
            (Some("initialize"), Some(session)) => {
                let mut capabilities = json!({"tools": {}, "logging": {}});
                if session.declares_tasks {
                    capabilities["tasks"] = json!({"requests": {"tools": {"call": {}}}});
                }
                Ok(json!({
                    "protocolVersion": session.version,
                    "capabilities": capabilities,
                    "serverInfo": server_info(),
                    "instructions": format!("client capabilities: {}", params["capabilities"]),
                }))
            }
            (Some("ping"), _) => Ok(json!({})),
            (Some("tools/list"), session) => Ok(tools_list(session.is_none())),
            (Some("tools/call"), _) => Ok(self.call_tool(params).await?),
            // The spec's DiscoverResult: server info under `_meta`, and a
            // cache hint (`ttlMs` 0: do not cache), as the SDK servers send.
            (Some("server/discover"), None) => Ok(json!({
                "supportedVersions": [MODERN_VERSION],
                "capabilities": {"tools": {}},
                "ttlMs": 0,
                "cacheScope": "private",
                "_meta": {"io.modelcontextprotocol/serverInfo": server_info()},
            })),
            _ => Err(json!({"code": -32601, "message": "Method not found"})),
        };
        Some(match outcome {
            Ok(mut result) => {
                if self.session.is_none() {
                    if let Some(result) = result.as_object_mut() {
                        // An MRTR answer carries its own (`input_required`).
                        result
                            .entry("resultType")
                            .or_insert_with(|| "complete".into());
                    }
                }
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            }
            Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
        })
    }

    /// Sends a message on the call's stream; false when the client is gone.
    pub(super) async fn deliver(&self, message: &Value) -> bool {
        match &self.sink {
            Sink::Log { log, .. } => {
                log.push(message);
                true
            }
            Sink::Channel(tx) => {
                let mut out = BytesMut::new();
                sse::encode_event(&mut out, None, message.to_string().as_bytes());
                tx.send(out.freeze()).await.is_ok()
            }
            Sink::Stdio(tx) => tx.send(message.clone()).await.is_ok(),
            Sink::Discard => true,
        }
    }

    /// Whether the client sees messages while the call runs, which is what a
    /// server-to-client request needs to get answered.
    fn interactive(&self) -> bool {
        match &self.sink {
            Sink::Log { interactive, .. } => *interactive,
            Sink::Stdio(_) => true,
            Sink::Channel(_) | Sink::Discard => false,
        }
    }

    /// Resolves when the client cancelled the call or (modern) went away.
    async fn cancelled(&self) {
        let mut cancel = self.cancel.clone();
        let requested = async {
            if cancel.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let gone = async {
            match &self.sink {
                Sink::Channel(tx) => tx.closed().await,
                // The writer ends only when stdout broke.
                Sink::Stdio(tx) => tx.closed().await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = requested => {}
            () = gone => {}
        }
    }

    /// Sleeps; false if cancelled meanwhile.
    pub(super) async fn pause(&self, duration: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(duration) => true,
            () = self.cancelled() => false,
        }
    }

    /// A tool result, or None when cancelled (counted here, and so is a
    /// call whose future is dropped before it ends: a JSON-mode response
    /// whose client went away).
    async fn call_tool(&self, params: &Value) -> Option<Value> {
        DemoStats::bump(&self.stats.calls_started);
        let mut tally = Tally {
            stats: &self.stats,
            completed: false,
        };
        let args = &params["arguments"];
        let result = match params["name"].as_str().unwrap_or_default() {
            "echo" => match args["text"].as_str() {
                Some(text) => Some(text_result(text)),
                None => Some(tool_error("echo needs a string argument `text`")),
            },
            "slow" => self.slow(params).await,
            "ask" => {
                self.ask(args["kind"].as_str().unwrap_or("elicitation"))
                    .await
            }
            "notify" => self.notify(&args["text"]).await,
            "confirm" => {
                let confirm = mrtr::confirm(self.seal.as_deref(), params);
                self.pause(confirm.pause).await.then_some(confirm.answer)
            }
            "spoof" => self.spoof().await,
            "paged" => Some(paged(params)),
            other => Some(tool_error(&format!("unknown tool: {other:?}"))),
        };
        tally.completed = result.is_some();
        result
    }

    async fn slow(&self, params: &Value) -> Option<Value> {
        let args = &params["arguments"];
        // Capped so that a typo cannot tie a demo up for hours.
        let steps = args["steps"].as_u64().unwrap_or(5).min(10_000);
        let interval = args["interval_ms"].as_u64().unwrap_or(200).min(60_000);
        let token = params.pointer("/_meta/progressToken");
        for i in 1..=steps {
            if !self.pause(Duration::from_millis(interval)).await {
                return None;
            }
            if let Some(token) = token {
                let progress = json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {
                        "progressToken": token,
                        "progress": i,
                        "total": steps,
                        "message": format!("step {i} of {steps}"),
                    },
                });
                if !self.deliver(&progress).await {
                    return None;
                }
            }
        }
        Some(text_result(&format!("slow done after {steps} steps")))
    }

    async fn ask(&self, kind: &str) -> Option<Value> {
        let (Some(session), true) = (&self.session, self.interactive()) else {
            return Some(tool_error(
                "ask needs a live SSE response stream (not JSON or buffered mode)",
            ));
        };
        let (method, params) = match kind {
            "elicitation" => (
                "elicitation/create",
                json!({
                    "message": "Pick a colour",
                    "requestedSchema": {
                        "type": "object",
                        "properties": {"colour": {"type": "string"}},
                    },
                }),
            ),
            "sampling" => (
                "sampling/createMessage",
                json!({
                    "messages": [{"role": "user", "content": {"type": "text", "text": "Say hi"}}],
                    "maxTokens": 10,
                }),
            ),
            other => return Some(tool_error(&format!("unknown ask kind: {other:?}"))),
        };
        let id = format!(
            "srv-{}",
            session.next_ask.fetch_add(1, Ordering::Relaxed) + 1
        );
        let (tx, rx) = oneshot::channel();
        session.lock().asks.insert(id.clone(), tx);
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if !self.deliver(&request).await {
            session.lock().asks.remove(&id);
            return None;
        }
        let answer = tokio::select! {
            answer = tokio::time::timeout(ASK_TIMEOUT, rx) => answer.ok().and_then(Result::ok),
            () = self.cancelled() => {
                session.lock().asks.remove(&id);
                return None;
            }
        };
        session.lock().asks.remove(&id);
        Some(match answer {
            Some(answer) => match answer.get("result") {
                Some(result) => text_result(&result.to_string()),
                None => tool_error(&format!(
                    "the client answered with an error: {}",
                    answer["error"]
                )),
            },
            None => tool_error("the client did not answer within 60 s"),
        })
    }

    /// Speaks in the namespaces resumability proxies author themselves (a
    /// misbehaving or malicious server): a proxy must not pass these on.
    async fn spoof(&self) -> Option<Value> {
        for (method, params) in [
            (
                "notifications/requests/resumePolicy",
                json!({"requestId": 1, "resumeToken": "forged", "maxWait": 1}),
            ),
            ("notifications/stream/end", json!({"streamId": "forged"})),
        ] {
            let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
            if !self.deliver(&message).await {
                return None;
            }
        }
        Some(text_result("spoofed"))
    }

    /// A log message: over HTTP queued on the standalone GET stream, over
    /// stdio written at once. None when the stdio client is gone.
    async fn notify(&self, text: &Value) -> Option<Value> {
        let Some(session) = &self.session else {
            return Some(tool_error(
                "notify needs a session (it uses the standalone GET stream)",
            ));
        };
        let Some(text) = text.as_str() else {
            return Some(tool_error("notify needs a string argument `text`"));
        };
        let message = json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "info", "data": text},
        });
        if let Sink::Stdio(_) = self.sink {
            return self.deliver(&message).await.then(|| text_result("sent"));
        }
        session.standalone.push(&message);
        Some(text_result("queued"))
    }
}

/// Counts how a tool call ended when it goes out of scope, so that a call
/// dropped mid-way (never `completed`) counts as cancelled too.
struct Tally<'a> {
    stats: &'a DemoStats,
    completed: bool,
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        let counter = if self.completed {
            &self.stats.calls_completed
        } else {
            &self.stats.calls_cancelled
        };
        DemoStats::bump(counter);
    }
}

/// A tool that issues its own resume tokens (seed 000): the first call
/// answers part 1 with `_meta.nextResumeToken`, the call re-sent with that
/// token answers the rest without one.
fn paged(params: &Value) -> Value {
    match params.pointer("/_meta/resumeToken").and_then(Value::as_str) {
        None => {
            let mut result = text_result("part 1");
            result["_meta"] = json!({"nextResumeToken": "demo-page-2"});
            result
        }
        Some("demo-page-2") => text_result("part 2, the end"),
        Some(_) => tool_error("unknown resume token"),
    }
}

fn server_info() -> Value {
    json!({"name": "demo-upstream", "version": "1.0.0"})
}

/// The tools; `confirm` only for stateless (2026-07-28) requests, the only
/// ones it can answer.
fn tools_list(stateless: bool) -> Value {
    let object = |properties: Value, required: &[&str]| json!({"type": "object", "properties": properties, "required": required});
    let mut tools = json!([
        {
            "name": "echo",
            "description": "Returns its text.",
            "inputSchema": object(json!({"text": {"type": "string"}}), &["text"]),
        },
        {
            "name": "slow",
            "description": "Takes `steps` steps `interval_ms` apart, reporting progress.",
            "inputSchema": object(json!({
                "steps": {"type": "integer", "minimum": 0, "default": 5},
                "interval_ms": {"type": "integer", "minimum": 0, "default": 200},
            }), &[]),
        },
        {
            "name": "ask",
            "description": "Asks the client (elicitation or sampling) and returns its answer.",
            "inputSchema": object(json!({
                "kind": {"type": "string", "enum": ["elicitation", "sampling"]},
            }), &[]),
        },
        {
            "name": "paged",
            "description": "Answers in two parts, issuing its own resume token (seed 000).",
            "inputSchema": object(json!({}), &[]),
        },
        {
            "name": "spoof",
            "description": "Sends notifications in the namespaces resumability proxies author.",
            "inputSchema": object(json!({}), &[]),
        },
        {
            "name": "notify",
            "description": "Sends a log message on the session's standalone GET stream.",
            "inputSchema": object(json!({"text": {"type": "string"}}), &["text"]),
        },
    ]);
    if stateless {
        if let Some(tools) = tools.as_array_mut() {
            tools.push(json!({
                "name": "confirm",
                "description": "Asks the client to confirm through MRTR: input_required with a requestState, then the re-issued call echoes the answer.",
                "inputSchema": object(json!({
                    "text": {"type": "string"},
                    "ask_after_ms": {"type": "integer", "minimum": 0, "default": 0},
                    "answer_after_ms": {"type": "integer", "minimum": 0, "default": 0},
                }), &[]),
            }));
        }
    }
    json!({"tools": tools})
}
