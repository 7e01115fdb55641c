//! What each request was: the facts the request path learns about one
//! request as it goes — where it went, its session and principal, its MCP
//! method and tool, the stream it read, whether it came back for one, how
//! it ended — gathered in one [`Visit`] and given out once, when the
//! answer's body ends or is dropped: to the request series
//! ([`crate::metrics::requests`]), as one access-log line ([`line`],
//! spelled by `spelling.rs`), and,
//! with tracing on, as the request's server span (`spans.rs`), which the
//! client spans of its upstream exchanges are children of.
//!
//! The request path notes a fact where it learns it, with [`note`], which
//! finds the request's visit in a task-local scope around the handler: no
//! parameter threads a visit through the pipeline, and code that runs
//! outside a request (sweepers, relays) notes nothing. What outlives the
//! handler, the body of an SSE answer, holds the visit itself
//! ([`current`]).
//!
//! Nothing here decides anything or changes an answer, and nothing of a
//! message's content or of a credential is kept: a principal is written
//! hashed, a request id cut short.

mod away;
mod body;
mod line;
mod spans;
mod spelling;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use self::away::Departures;
pub use self::body::Metered;
pub use self::spans::{
    exchange, exchange_shared, note_replayed, trace_into, traced, traced_message,
};
use crate::id::StreamId;
use crate::jsonrpc::{self, Body as Message};
use crate::metrics::requests::{Destination, Method, Outcome, Request, Table};
use crate::metrics::Replayed;
use crate::session::Session;
use crate::traces::{Ended, Tracer};
use spans::Spans;

tokio::task_local! {
    static VISIT: Visit;
}

/// What every visit of an app reports to: the request series, whether
/// access-log lines are written, and where spans go.
pub struct Access {
    requests: Arc<Table>,
    lines: bool,
    /// Whether `tools/call` requests carry their tool's name to the series.
    tool_labels: bool,
    /// `None` with tracing off: no visit makes a span.
    tracer: Option<Arc<Tracer>>,
    /// The mount paths, by route index (a server span's `http.route`).
    routes: Vec<Arc<str>>,
    /// Kept across reloads: a client away during one still comes back.
    departures: Arc<Departures>,
}

/// How one configuration reports its visits.
pub struct Reporting {
    pub requests: Arc<Table>,
    /// Access-log lines.
    pub lines: bool,
    pub tool_labels: bool,
    pub tracer: Option<Arc<Tracer>>,
    /// The mount paths, in route order.
    pub routes: Vec<Arc<str>>,
}

impl Access {
    pub fn new(reporting: Reporting) -> Arc<Self> {
        Self::with_departures(reporting, Arc::default())
    }

    /// The same, for a reloaded configuration: the departures carry over.
    pub fn reconfigured(&self, reporting: Reporting) -> Arc<Self> {
        Self::with_departures(reporting, self.departures.clone())
    }

    fn with_departures(reporting: Reporting, departures: Arc<Departures>) -> Arc<Self> {
        Arc::new(Self {
            requests: reporting.requests,
            lines: reporting.lines,
            tool_labels: reporting.tool_labels,
            tracer: reporting.tracer,
            routes: reporting.routes,
            departures,
        })
    }

    /// A request that just arrived (its server span started, with tracing
    /// on).
    pub fn arrived<B>(self: &Arc<Self>, request: &http::Request<B>) -> Visit {
        let (method, uri) = (request.method(), request.uri());
        let spans = (self.tracer.as_ref()).map(|t| Spans::start(t, method, uri, request.headers()));
        Visit(Arc::new(Inner {
            access: self.clone(),
            arrived: Instant::now(),
            http_method: method.clone(),
            // (Shares the request's bytes: no copy.)
            uri: uri.clone(),
            facts: Mutex::new(Facts {
                spans,
                ..Facts::default()
            }),
        }))
    }
}

/// One request, from its arrival to the end of its answer.
#[derive(Clone)]
pub struct Visit(Arc<Inner>);

struct Inner {
    access: Arc<Access>,
    arrived: Instant,
    http_method: http::Method,
    uri: http::Uri,
    facts: Mutex<Facts>,
}

/// What the request path learned of a request.
pub struct Facts {
    pub route: Destination,
    pub method: Method,
    /// The tool of a `tools/call` (kept only when something reads it).
    pub tool: Option<Box<str>>,
    /// The id of the request (of the first, in a batch), as JSON text.
    pub request_id: Option<Box<str>>,
    pub session: Option<Arc<Session>>,
    pub stream: Option<StreamId>,
    /// The dialect the client came back to a stream with.
    pub resumed: Option<Replayed>,
    pub rpc: Option<Rpc>,
    /// The answer showed `stream` to its end. One that read a stream and
    /// ended short of it (an interim, a drain, a reader that took its
    /// place) is unfinished: the client comes back for the rest.
    pub stream_ended: bool,
    pub bytes_in: usize,
    /// The request's spans, with tracing on.
    spans: Option<Box<Spans>>,
}

impl Default for Facts {
    fn default() -> Self {
        Self {
            route: Destination::Other,
            method: Method::None,
            tool: None,
            request_id: None,
            session: None,
            stream: None,
            resumed: None,
            rpc: None,
            stream_ended: false,
            bytes_in: 0,
            spans: None,
        }
    }
}

/// The JSON-RPC response an answer carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    Result,
    /// An error response, with its code when the proxy wrote it.
    Error(Option<i64>),
}

impl Visit {
    /// Runs `handler` with this visit in scope for [`note`].
    pub fn scope<F: Future>(&self, handler: F) -> impl Future<Output = F::Output> {
        VISIT.scope(self.clone(), handler)
    }

    /// Notes facts about this visit.
    pub fn note(&self, f: impl FnOnce(&mut Facts)) {
        f(&mut self.facts());
    }

    fn facts(&self) -> std::sync::MutexGuard<'_, Facts> {
        // Facts are plain fields: a panic while noting one leaves the rest
        // as good as they were.
        self.0.facts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn since_arrival(&self) -> Duration {
        self.0.arrived.elapsed()
    }

    fn access(&self) -> &Access {
        &self.0.access
    }

    /// The answer ended: `complete` when its body ran to its end, not when
    /// it was dropped before (the client went away).
    fn ended(&self, answer: &Answered) {
        let total = self.0.arrived.elapsed();
        let mut facts = self.facts();
        let outcome = outcome(&facts, answer);
        if let Some(spans) = facts.spans.take() {
            spans.end(&self.span_end(&facts, answer, outcome));
        }
        let access = self.access();
        access.requests.record(&Request {
            route: facts.route,
            method: facts.method,
            outcome,
            tool: facts.tool.as_deref(),
            first_byte: answer.first_byte,
            total,
        });
        if let Some(stream) = facts.stream {
            // Away from its departure to this visit's arrival; a client that
            // went away again leaves anew.
            if let Some(dialect) = facts.resumed {
                if let Some(left) = access.departures.came_back(stream) {
                    let away = self.0.arrived.saturating_duration_since(left);
                    access.requests.came_back(dialect, away);
                }
            }
            if outcome == Outcome::Unfinished {
                access.departures.left(stream);
            }
        }
        if access.lines {
            let path = self.0.uri.path();
            line::write(&self.0.http_method, path, &facts, answer, outcome, total);
        }
    }
}

impl Visit {
    /// What the server span says of the request when it ends.
    fn span_end<'a>(&'a self, facts: &'a Facts, answer: &Answered, outcome: Outcome) -> Ended<'a> {
        let route = match facts.route {
            Destination::Mount(i) => self.access().routes.get(i),
            _ => None,
        };
        let mcp_method = match facts.method {
            Method::None | Method::Other | Method::Batch | Method::GetStream => None,
            Method::DeleteSession | Method::Notification => None,
            method => Some(method.as_str()),
        };
        Ended {
            route,
            status: answer.status.as_u16(),
            mcp_method,
            tool: facts.tool.as_deref(),
            session: facts.session.as_ref().map(|s| s.id),
            stream: facts.stream,
            outcome: outcome.as_str(),
            rpc_code: match facts.rpc {
                Some(Rpc::Error(code)) => code,
                _ => None,
            },
        }
    }
}

/// How the answer went out, as the body saw it.
pub(crate) struct Answered {
    pub status: StatusCode,
    pub first_byte: Option<Duration>,
    pub bytes_out: u64,
    pub complete: bool,
}

fn outcome(facts: &Facts, answer: &Answered) -> Outcome {
    let short = facts.stream.is_some() && !facts.stream_ended;
    if !answer.complete || short {
        return Outcome::Unfinished;
    }
    match facts.rpc {
        _ if answer.status.is_server_error() => Outcome::ServerError,
        _ if answer.status.is_client_error() => Outcome::ClientError,
        Some(Rpc::Result) => Outcome::Result,
        Some(Rpc::Error(_)) => Outcome::Error,
        None => Outcome::Ok,
    }
}

/// Notes facts about the request being handled, if any.
pub fn note(f: impl FnOnce(&mut Facts)) {
    let _ = VISIT.try_with(|visit| visit.note(f));
}

/// The visit of the request being handled, for what outlives its handler.
pub fn current() -> Option<Visit> {
    VISIT.try_with(Visit::clone).ok()
}

/// Notes a POST's message: its method label, first request id, size and
/// (for a `tools/call`, when something reads it) its tool.
pub fn note_message(message: &Message, bytes: &[u8]) {
    let _ = VISIT.try_with(|visit| {
        let access = visit.access();
        let wants_tool = access.lines || access.tool_labels || access.tracer.is_some();
        visit.note(|facts| {
            facts.bytes_in = bytes.len();
            facts.method = match message {
                Message::Single(e) if e.is_request() => {
                    Method::of(e.method.as_deref().unwrap_or_default())
                }
                Message::Batch(_) if message.has_requests() => Method::Batch,
                _ => Method::Notification,
            };
            if visit.access().lines {
                let id = message.envelopes().iter().find_map(|e| e.id.as_ref());
                facts.request_id = id.map(|id| line::short(&id.0));
            }
            if wants_tool && facts.method == Method::ToolsCall {
                facts.tool = jsonrpc::tool_name(bytes).map(Box::from);
            }
        });
    });
}

/// Notes the session a request is in.
pub fn note_session(session: &Arc<Session>) {
    note(|facts| facts.session = Some(session.clone()));
}

/// Notes the JSON-RPC response the proxy wrote whole, as an answer.
pub fn note_response(body: &[u8]) {
    let _ = VISIT.try_with(|visit| {
        let Ok(envelope) = jsonrpc::classify(body) else {
            return;
        };
        if envelope.kind == jsonrpc::Kind::Response {
            let rpc = match envelope.error {
                true => Rpc::Error(None),
                false => Rpc::Result,
            };
            visit.note(|facts| facts.rpc = Some(rpc));
        }
    });
}

/// Notes that the answer was a JSON-RPC error the proxy wrote.
pub fn note_error(code: i64) {
    note(|facts| facts.rpc = Some(Rpc::Error(Some(code))));
}

/// Notes that the answer showed its stream to the end, and how the
/// stream's request ended.
pub fn note_outcome(outcome: Option<crate::store::Outcome>) {
    let _ = VISIT.try_with(|visit| visit.note_outcome(outcome));
}

impl Visit {
    /// The answer showed its stream to the end: how the stream's request
    /// ended.
    pub fn note_outcome(&self, outcome: Option<crate::store::Outcome>) {
        let rpc = match outcome {
            Some(crate::store::Outcome::Result) => Some(Rpc::Result),
            Some(crate::store::Outcome::Error) => Some(Rpc::Error(None)),
            None => None,
        };
        self.note(|facts| {
            facts.stream_ended = true;
            facts.rpc = rpc.or(facts.rpc);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, complete: bool) -> Answered {
        Answered {
            status: StatusCode::from_u16(status).expect("a status"),
            first_byte: None,
            bytes_out: 0,
            complete,
        }
    }

    #[test]
    fn a_body_dropped_before_its_end_is_unfinished() {
        let facts = Facts {
            rpc: Some(Rpc::Result),
            ..Facts::default()
        };
        assert_eq!(outcome(&facts, &answered(200, false)), Outcome::Unfinished);
    }

    #[test]
    fn an_answer_that_stopped_short_of_its_stream_s_end_is_unfinished() {
        let facts = Facts {
            stream: Some(StreamId::random()),
            ..Facts::default()
        };
        assert_eq!(outcome(&facts, &answered(200, true)), Outcome::Unfinished);
    }

    #[test]
    fn the_status_class_says_more_than_a_json_rpc_error_body() {
        let facts = Facts {
            rpc: Some(Rpc::Error(Some(-32600))),
            ..Facts::default()
        };
        assert_eq!(outcome(&facts, &answered(404, true)), Outcome::ClientError);
        assert_eq!(outcome(&facts, &answered(503, true)), Outcome::ServerError);
        assert_eq!(outcome(&facts, &answered(200, true)), Outcome::Error);
    }

    #[test]
    fn a_2xx_without_a_response_the_proxy_saw_is_ok() {
        assert_eq!(
            outcome(&Facts::default(), &answered(202, true)),
            Outcome::Ok
        );
    }

    #[test]
    fn noting_outside_a_request_does_nothing() {
        note(|facts| facts.bytes_in = 1);
        assert!(current().is_none());
    }
}
