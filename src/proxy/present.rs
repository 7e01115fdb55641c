//! Answering a client from the log: SSE for clients that accept it (framed by
//! the Last-Event-ID dialect, with what the session's dialects add through a
//! [`Presenter`]), one JSON body — after the stream finished — for clients
//! that only accept JSON; and upstream responses passed through unchanged.
//!
//! Every answer carries the proxy's own `Mcp-Session-Id`, never the
//! upstream's.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use hyper::body::Incoming;

use super::{Rejection, Route};
use crate::access;
use crate::dialect::last_event_id::{self, Presentation};
use crate::dialect::legacy_tasks::Fetched;
use crate::dialect::resume_token::Call;
use crate::dialect::{Context, Negotiated, Presenter};
use crate::id::SessionId;
use crate::jsonrpc::{self, Kind};
use crate::reply::{self, Body};
use crate::session::{self, Session};
use crate::store::StreamMeta;
use crate::stream::{Next, Reader};
use crate::upstream::headers::{self, SESSION_ID};

/// How long a JSON-only client's request may wait for its stream to finish.
const JSON_ANSWER_IDLE: Duration = Duration::from_secs(3600);

/// One stream to show a client.
pub struct Showing {
    pub reader: Reader,
    pub presenter: Presenter,
    /// A stream the client has not seen before: prime it (for clients
    /// that understand priming events).
    pub fresh: bool,
}

impl Route {
    /// The dialect context of a request in `session`.
    pub fn context<'a>(&'a self, session: &'a Session) -> Context<'a> {
        Context {
            log: &self.shared.log,
            keyring: &self.shared.keyring,
            session,
            config: &self.dialects,
            waiters: &self.tasks.waiters,
        }
    }

    /// How the session's dialects show `stream`.
    /// A task's leg being read as a `tasks/result` answer keeps being shown
    /// as one when the client resumes it.
    pub fn presenter(&self, session: &Session, stream: &StreamMeta) -> Presenter {
        let fetched = stream
            .task
            .and_then(|_| session.reading_as(stream.id))
            .map(|read_as| Fetched::resumed(stream, read_as, session.answered_by_client()));
        Presenter::new(&self.context(session), stream, Negotiated::of(session)).with_task(fetched)
    }

    /// Answers with `showing`: SSE when the client accepts it, else one JSON
    /// body once the stream finished.
    pub async fn show(
        &self,
        session: &Session,
        headers: &HeaderMap,
        showing: Showing,
    ) -> Result<Response<Body>, Rejection> {
        let stream = showing.reader.stream();
        access::note(|facts| facts.stream = Some(stream));
        let mut res = if headers::accepts(headers, "text/event-stream") {
            let version = headers::get_str(headers, &headers::PROTOCOL_VERSION)
                .map(str::to_owned)
                .or_else(|| session.protocol_version());
            let sse = &self.shared.config.sse;
            let how = Presentation {
                session: session.id,
                keyring: self.shared.keyring.clone(),
                priming: showing.fresh && session::wants_priming(version.as_deref()),
                retry_ms: Some(sse.retry_ms),
                keepalive: Duration::from_secs(sse.keepalive_secs),
                presenter: showing.presenter,
                draining: self.shared.draining.clone(),
                visit: access::current(),
            };
            reply::event_stream(last_event_id::serve(showing.reader, how))
        } else {
            json_answer(showing).await?
        };
        insert_session_header(res.headers_mut(), session.id);
        Ok(res)
    }

    /// Answers a POST from its (new) request stream; a tool call that gets
    /// resume tokens is answered until its deadline.
    pub async fn answer(
        &self,
        session: &Session,
        headers: &HeaderMap,
        stream: &StreamMeta,
        call: Option<Call>,
        reader: Reader,
    ) -> Result<Response<Body>, Rejection> {
        let showing = Showing {
            reader,
            presenter: self.presenter(session, stream).with_call(call),
            fresh: true,
        };
        self.show(session, headers, showing).await
    }
}

impl Route {
    /// Answers a re-sent request (same id, same call) from its stream, from
    /// the start, without taking the stream from another reader: a re-sent
    /// request can overtake the cut one it repeats, and that one's late
    /// attach must not end this answer. Both may then deliver the same
    /// entries, under the same event ids.
    pub async fn answer_again(
        &self,
        session: &Session,
        headers: &HeaderMap,
        stream: &StreamMeta,
    ) -> Result<Response<Body>, Rejection> {
        let reader = self.shared.log.watch(stream.id, 0);
        self.answer(session, headers, stream, None, reader).await
    }
}

/// Collects the responses of a finished stream (and those that close it)
/// into one JSON body.
async fn json_answer(showing: Showing) -> Result<Response<Body>, Rejection> {
    let Showing {
        mut reader,
        mut presenter,
        ..
    } = showing;
    let is_response = |m: &Bytes| {
        m.first() == Some(&b'[') || jsonrpc::classify(m).is_ok_and(|e| e.kind == Kind::Response)
    };
    let mut responses: Vec<Bytes> = Vec::new();
    loop {
        let wait = match presenter.deadline() {
            Some(deadline) => deadline.saturating_duration_since(std::time::Instant::now()),
            None => JSON_ANSWER_IDLE,
        };
        match reader.next(wait).await? {
            Next::Entries(entries) => {
                for entry in entries {
                    if let Some(message) = presenter.entry(entry.message) {
                        if is_response(&message) {
                            responses.push(message);
                        }
                    }
                }
            }
            Next::Idle => {
                if let Some(interim) = presenter.interim(reader.cursor()) {
                    responses.push(interim);
                    break;
                }
            }
            Next::End(_) => {
                reader.wrote_to_end();
                access::note_outcome(reader.outcome());
                responses.extend(presenter.closing().into_iter().filter(is_response));
                break;
            }
            Next::Gone | Next::Replaced => break,
        }
    }
    let body = match responses.len() {
        1 => responses.remove(0),
        _ => {
            let mut joined =
                Vec::with_capacity(responses.iter().map(|r| r.len() + 1).sum::<usize>() + 2);
            joined.push(b'[');
            for (i, r) in responses.iter().enumerate() {
                if i > 0 {
                    joined.push(b',');
                }
                joined.extend_from_slice(r);
            }
            joined.push(b']');
            Bytes::from(joined)
        }
    };
    Ok(reply::json(StatusCode::OK, body))
}

/// One whole JSON-RPC response the proxy wrote itself.
pub fn json(session: SessionId, body: Bytes) -> Response<Body> {
    access::note_response(&body);
    let mut res = reply::json(StatusCode::OK, body);
    insert_session_header(res.headers_mut(), session);
    res
}

/// 202 for messages that carry no request.
pub fn accepted(session: SessionId) -> Response<Body> {
    let mut res = Response::new(reply::empty());
    *res.status_mut() = StatusCode::ACCEPTED;
    insert_session_header(res.headers_mut(), session);
    res
}

/// An upstream response relayed unchanged, but for the session header.
pub fn pass_through(res: Response<Incoming>, session: Option<SessionId>) -> Response<Body> {
    let (head, body) = res.into_parts();
    let mut out = Response::new(reply::passthrough(body));
    *out.status_mut() = head.status;
    *out.headers_mut() = headers::to_client(&head.headers, None);
    if let Some(session) = session {
        insert_session_header(out.headers_mut(), session);
    }
    out
}

pub fn insert_session_header(headers: &mut HeaderMap, session: SessionId) {
    if let Ok(value) = http::HeaderValue::from_str(&session.to_string()) {
        headers.insert(SESSION_ID, value);
    }
}
