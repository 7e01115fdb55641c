//! Legacy era (2025-03-26 … 2025-11-25): the proxy's sessions, logged request
//! streams, the standalone GET stream, replay with `Last-Event-ID`, DELETE.
//!
//! A POST carrying requests becomes an *exchange*: a detached task forwards it
//! upstream and relays the answer into a new stream, while the handler waits
//! (up to `answer_wait_ms`) for the upstream's response head. A head that
//! carries messages means the client gets the stream as SSE from the log; any
//! other status passes through unchanged (clients detect protocol eras from
//! 4xx bodies). A head that has not come by then means the client gets the
//! SSE stream anyway — so it holds an event id to resume with — and a late
//! refusal becomes a JSON-RPC error entry in the stream.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::oneshot;

use super::{bad_gateway, read_body, store_failure, Route};
use crate::dialect::last_event_id::{self, Presentation};
use crate::headers::{self, SESSION_ID};
use crate::id::SessionId;
use crate::jsonrpc::{self, code, Body as Message, Kind, ParseError};
use crate::relay::{end_unanswered, Relay};
use crate::reply::{self, Body};
use crate::session::{self, Session};
use crate::store::{StreamKind, StreamMeta, StreamStatus};
use crate::stream::{Next, Reader};
use crate::upstream::http::{carries_messages, Messages};
use crate::upstream::UpstreamError;

/// How long a JSON-only client's request may wait for its stream to finish.
const JSON_ANSWER_IDLE: Duration = Duration::from_secs(3600);

/// Largest upstream error body quoted into a JSON-RPC error entry.
const QUOTED_BODY: usize = 2048;

fn bad_request(message: &str) -> Response<Body> {
    reply::error(StatusCode::BAD_REQUEST, None, code::SERVER_ERROR, message)
}

fn session_not_found() -> Response<Body> {
    reply::error(
        StatusCode::NOT_FOUND,
        None,
        code::SESSION_NOT_FOUND,
        "Session not found",
    )
}

/// The caller's session, or the response that refuses the request: 400
/// without the header, 404 for an unknown, expired or foreign one.
async fn find_session(route: &Route, headers: &HeaderMap) -> Result<Arc<Session>, Response<Body>> {
    let Some(text) = headers::get_str(headers, &SESSION_ID) else {
        return Err(bad_request(
            "Bad Request: Mcp-Session-Id header is required",
        ));
    };
    let Ok(id) = text.parse::<SessionId>() else {
        return Err(session_not_found());
    };
    let principal = session::principal(headers, &route.shared.config.principal_header);
    match route.shared.sessions.get(id, &route.path, &principal).await {
        Ok(Some(session)) => Ok(session),
        Ok(None) => Err(session_not_found()),
        Err(e) => Err(store_failure(&e)),
    }
}

pub async fn post(route: &Route, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    if headers::media_type(&parts.headers) != "application/json" {
        return reply::error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            None,
            code::SERVER_ERROR,
            "Unsupported Media Type: Content-Type must be application/json",
        );
    }
    let bytes = match read_body(body, route.shared.config.max_body).await {
        Ok(b) => b,
        Err(res) => return res,
    };
    let message = match jsonrpc::parse_body(&bytes) {
        Ok(m) => m,
        Err(e @ ParseError::Json(_)) => {
            return reply::error(
                StatusCode::BAD_REQUEST,
                None,
                code::PARSE_ERROR,
                &format!("Parse error: {e}"),
            )
        }
        Err(e @ ParseError::Shape(_)) => {
            return reply::error(
                StatusCode::BAD_REQUEST,
                None,
                code::INVALID_REQUEST,
                &format!("Invalid Request: {e}"),
            )
        }
    };
    let opens_session =
        message.single_method() == Some("initialize") && !parts.headers.contains_key(SESSION_ID);
    let session = if opens_session {
        let principal = session::principal(&parts.headers, &route.shared.config.principal_header);
        route.shared.sessions.mint(&route.path, principal, &bytes)
    } else {
        match find_session(route, &parts.headers).await {
            Ok(s) => s,
            Err(res) => return res,
        }
    };
    if !message.has_requests() {
        return notify(route, &session, &parts.headers, bytes).await;
    }
    exchange(route, session, opens_session, parts.headers, bytes, message).await
}

/// Notifications and responses: forwarded, answered with the upstream's own
/// status (202 normally). A `notifications/cancelled` also marks its stream.
async fn notify(
    route: &Route,
    session: &Arc<Session>,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Response<Body> {
    let cancels = message_mentions(&bytes, "notifications/cancelled");
    if cancels {
        for id in jsonrpc::cancelled_request_ids(&bytes) {
            if let Some(stream) = session.stream_of(&id) {
                if let Err(e) = route
                    .shared
                    .log
                    .finish(stream, StreamStatus::Cancelled)
                    .await
                {
                    tracing::warn!(%stream, error = %e, "cannot mark stream cancelled");
                }
            }
        }
    }
    let upstream_session = session.upstream_session();
    match route
        .upstream
        .send(Method::POST, headers, bytes, upstream_session.as_deref())
        .await
    {
        Ok(res) => pass_through(res, Some(session.id)),
        Err(e) => bad_gateway(&e),
    }
}

fn message_mentions(bytes: &[u8], method: &str) -> bool {
    memchr::memmem::find(bytes, method.as_bytes()).is_some()
}

/// What the exchange task tells the waiting handler about the upstream's
/// response head.
enum Head {
    /// The upstream answers with messages; the stream is being relayed.
    Relaying,
    /// The upstream answered with something to pass through unchanged.
    Refused(Response<Incoming>),
    Unreachable(UpstreamError),
}

async fn exchange(
    route: &Route,
    session: Arc<Session>,
    opens_session: bool,
    headers: HeaderMap,
    bytes: Bytes,
    message: Message,
) -> Response<Body> {
    let shared = &route.shared;
    let origin_ids = message.request_ids();
    let method = message.single_method().map(str::to_owned);
    let stream = match shared
        .log
        .open(session.id, StreamKind::Request, origin_ids.clone(), method)
        .await
    {
        Ok(s) => s,
        Err(e) => return store_failure(&e),
    };
    for id in &origin_ids {
        session.track(id.clone(), stream.id);
    }
    let (head_tx, mut head_rx) = oneshot::channel();
    tokio::spawn(run_exchange(
        route.relay(session.clone(), stream.clone(), headers.clone()),
        opens_session,
        bytes,
        head_tx,
    ));

    let wait = Duration::from_millis(route.upstream.config.answer_wait_ms);
    let head = match tokio::time::timeout(wait, &mut head_rx).await {
        Ok(Ok(head)) => Some(head),
        Ok(Err(_)) => None, // the task died; its stream says why
        Err(_) => {
            head_rx.close();
            head_rx.try_recv().ok()
        }
    };
    match head {
        Some(Head::Refused(res)) => {
            forget(route, &session, opens_session, &stream).await;
            pass_through(res, (!opens_session).then_some(session.id))
        }
        Some(Head::Unreachable(e)) => {
            forget(route, &session, opens_session, &stream).await;
            bad_gateway(&e)
        }
        Some(Head::Relaying) | None => {
            if opens_session {
                // Idempotent with the task's update; ensures the session exists
                // before the client learns its id even if the head is late.
                if let Err(e) = shared.sessions.persist(&session).await {
                    return store_failure(&e);
                }
            }
            answer(route, &session, &headers, &stream).await
        }
    }
}

/// Removes what an exchange created when its upstream refused it.
async fn forget(route: &Route, session: &Session, opens_session: bool, stream: &StreamMeta) {
    session.untrack(&stream.origin_ids);
    if let Err(e) = route.shared.log.delete(stream.id).await {
        tracing::warn!(stream = %stream.id, error = %e, "cannot delete refused stream");
    }
    if opens_session {
        route.shared.sessions.discard(session.id);
    }
}

/// The detached half of an exchange: forwards upstream, reports the head,
/// relays the answer into the log.
async fn run_exchange(
    relay: Relay,
    opens_session: bool,
    bytes: Bytes,
    head_tx: oneshot::Sender<Head>,
) {
    let upstream_session = relay.session.upstream_session();
    let sent = relay
        .upstream
        .send(
            Method::POST,
            &relay.client_headers,
            bytes,
            upstream_session.as_deref(),
        )
        .await;
    let res = match sent {
        Ok(res) if carries_messages(&res) => res,
        Ok(res) => {
            if let Err(Head::Refused(res)) = head_tx.send(Head::Refused(res)) {
                // The client was already answered with the stream.
                let why = refusal_text(res).await;
                fail(&relay, &why).await;
            }
            return;
        }
        Err(e) => {
            if let Err(Head::Unreachable(e)) = head_tx.send(Head::Unreachable(e)) {
                fail(&relay, &e.to_string()).await;
            }
            return;
        }
    };
    if opens_session {
        let upstream_id = headers::get_str(res.headers(), &SESSION_ID).map(str::to_owned);
        let update = relay
            .sessions
            .update(&relay.session, |r| r.upstream_session = upstream_id);
        if let Err(e) = update.await {
            tracing::error!(session = %relay.session.id, error = %e, "cannot persist session");
        }
    }
    let _ = head_tx.send(Head::Relaying);
    relay.run(Messages::new(res)).await;
}

async fn refusal_text(res: Response<Incoming>) -> String {
    use http_body_util::BodyExt;
    let status = res.status();
    let body = http_body_util::Limited::new(res.into_body(), QUOTED_BODY)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    format!(
        "upstream answered HTTP {status}: {}",
        String::from_utf8_lossy(&body)
    )
}

async fn fail(relay: &Relay, why: &str) {
    end_unanswered(&relay.log, &relay.stream, &relay.stream.origin_ids, why).await;
    if let Err(e) = relay
        .log
        .finish(relay.stream.id, StreamStatus::Failed)
        .await
    {
        tracing::error!(stream = %relay.stream.id, error = %e, "cannot finish stream");
    }
    relay.session.untrack(&relay.stream.origin_ids);
}

/// Answers the client from the log: SSE for clients that accept it, one JSON
/// body (after the stream finished) for those that only accept JSON.
async fn answer(
    route: &Route,
    session: &Session,
    headers: &HeaderMap,
    stream: &StreamMeta,
) -> Response<Body> {
    let reader = route.shared.log.attach(stream.id, 0);
    let mut res = if headers::accepts(headers, "text/event-stream") {
        let version = headers::get_str(headers, &headers::PROTOCOL_VERSION)
            .map(str::to_owned)
            .or_else(|| session.protocol_version());
        reply::sse(last_event_id::serve(
            reader,
            route.presentation(session.id, version.as_deref(), true),
        ))
    } else {
        json_answer(reader).await
    };
    insert_session_header(res.headers_mut(), session.id);
    res
}

/// Collects the responses of a finished stream into one JSON body.
async fn json_answer(mut reader: Reader) -> Response<Body> {
    let mut responses: Vec<Bytes> = Vec::new();
    loop {
        match reader.next(JSON_ANSWER_IDLE).await {
            Ok(Next::Entries(entries)) => responses.extend(
                entries
                    .into_iter()
                    .filter(|e| {
                        e.message.first() == Some(&b'[')
                            || jsonrpc::classify(&e.message).is_ok_and(|m| m.kind == Kind::Response)
                    })
                    .map(|e| e.message),
            ),
            Ok(Next::Idle) => continue,
            Ok(_) => break,
            Err(e) => return store_failure(&e),
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
    reply::json(StatusCode::OK, body)
}

pub async fn get(route: &Route, req: Request<Incoming>) -> Response<Body> {
    let (parts, _) = req.into_parts();
    let session = match find_session(route, &parts.headers).await {
        Ok(s) => s,
        Err(res) => return res,
    };
    if !headers::accepts(&parts.headers, "text/event-stream") {
        return reply::error(
            StatusCode::NOT_ACCEPTABLE,
            None,
            code::SERVER_ERROR,
            "Not Acceptable: Accept must include text/event-stream",
        );
    }
    let log = &route.shared.log;
    let version = headers::get_str(&parts.headers, &headers::PROTOCOL_VERSION)
        .map(str::to_owned)
        .or_else(|| session.protocol_version());
    let mut res = if let Some(last) = headers::get_str(&parts.headers, &headers::LAST_EVENT_ID) {
        let unknown = || {
            reply::error(
                StatusCode::BAD_REQUEST,
                None,
                code::SERVER_ERROR,
                "Bad Request: unknown or expired Last-Event-ID",
            )
        };
        let Ok((stream, seq)) = last_event_id::open(&route.shared.keyring, session.id, last) else {
            return unknown();
        };
        match log.meta(stream).await {
            Ok(Some(meta)) if meta.session == session.id => {}
            Ok(_) => return unknown(),
            Err(e) => return store_failure(&e),
        }
        let reader = log.attach(stream, seq);
        reply::sse(last_event_id::serve(
            reader,
            route.presentation(session.id, version.as_deref(), false),
        ))
    } else {
        match standalone(route, &session, &parts.headers).await {
            Ok(reader) => reply::sse(last_event_id::serve(
                reader,
                route.presentation(session.id, version.as_deref(), true),
            )),
            Err(res) => return res,
        }
    };
    insert_session_header(res.headers_mut(), session.id);
    res
}

/// Attaches to the session's standalone stream, opening it upstream first
/// when none is being relayed.
async fn standalone(
    route: &Route,
    session: &Arc<Session>,
    headers: &HeaderMap,
) -> Result<Reader, Response<Body>> {
    let log = &route.shared.log;
    if let Some(stream) = session.standalone() {
        if let Ok(Some(meta)) = log.meta(stream).await {
            if meta.status.is_live() {
                // A client opening a fresh GET wants what comes next.
                return Ok(log.attach(stream, log.end(stream)));
            }
        }
    }
    let upstream_session = session.upstream_session();
    let res = route
        .upstream
        .send(
            Method::GET,
            headers,
            Bytes::new(),
            upstream_session.as_deref(),
        )
        .await
        .map_err(|e| bad_gateway(&e))?;
    if !carries_messages(&res) {
        return Err(pass_through(res, Some(session.id)));
    }
    let stream = log
        .open(session.id, StreamKind::Standalone, Vec::new(), None)
        .await
        .map_err(|e| store_failure(&e))?;
    session.set_standalone(Some(stream.id));
    let reader = log.attach(stream.id, 0);
    let relay = route.relay(session.clone(), stream, headers.clone());
    tokio::spawn(relay.run(Messages::new(res)));
    Ok(reader)
}

pub async fn delete(route: &Route, req: Request<Incoming>) -> Response<Body> {
    let (parts, _) = req.into_parts();
    let session = match find_session(route, &parts.headers).await {
        Ok(s) => s,
        Err(res) => return res,
    };
    let upstream_session = session.upstream_session();
    let upstream = route
        .upstream
        .send(
            Method::DELETE,
            &parts.headers,
            Bytes::new(),
            upstream_session.as_deref(),
        )
        .await;
    // The proxy's session ends whatever the upstream says: the client asked.
    if let Err(e) = route.shared.sessions.end(session.id).await {
        return store_failure(&e);
    }
    match upstream {
        Ok(res) => pass_through(res, None),
        Err(e) => {
            tracing::info!(session = %session.id, error = %e, "upstream unreachable for DELETE");
            reply::json(StatusCode::OK, Bytes::new())
        }
    }
}

/// An upstream response relayed unchanged, but for the session header.
fn pass_through(res: Response<Incoming>, session: Option<SessionId>) -> Response<Body> {
    let (head, body) = res.into_parts();
    let mut out = Response::new(reply::passthrough(body));
    *out.status_mut() = head.status;
    let session = session.map(|s| s.to_string());
    *out.headers_mut() = headers::to_client(&head.headers, session.as_deref());
    out
}

fn insert_session_header(headers: &mut HeaderMap, session: SessionId) {
    if let Ok(value) = http::HeaderValue::from_str(&session.to_string()) {
        headers.insert(SESSION_ID, value);
    }
}

impl Route {
    fn relay(&self, session: Arc<Session>, stream: StreamMeta, client_headers: HeaderMap) -> Relay {
        Relay {
            log: self.shared.log.clone(),
            sessions: self.shared.sessions.clone(),
            upstream: self.upstream.clone(),
            session,
            stream,
            client_headers,
        }
    }

    fn presentation(
        &self,
        session: SessionId,
        version: Option<&str>,
        new_stream: bool,
    ) -> Presentation {
        let sse = &self.shared.config.sse;
        Presentation {
            session,
            keyring: self.shared.keyring.clone(),
            priming: new_stream && session::wants_priming(version),
            retry_ms: Some(sse.retry_ms),
            keepalive: Duration::from_secs(sse.keepalive_secs),
        }
    }
}
