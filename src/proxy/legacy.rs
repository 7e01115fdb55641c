//! Legacy era (2025-03-26 … 2025-11-25): the proxy's sessions, logged request
//! streams, the standalone GET stream, replay with `Last-Event-ID`, DELETE.
//!
//! This module checks and routes; a POST carrying requests becomes an
//! exchange (`exchange.rs`), and whatever the upstream kind, the client is
//! answered from the log by the Last-Event-ID dialect.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{bad_gateway, exchange, read_body, store_failure, Route};
use crate::dialect::last_event_id::{self, Presentation};
use crate::headers::{self, SESSION_ID};
use crate::id::SessionId;
use crate::jsonrpc::{self, code, Kind, ParseError};
use crate::reply::{self, Body};
use crate::session::{self, Session};
use crate::store::{StreamKind, StreamMeta, StreamStatus};
use crate::stream::{Next, Reader};
use crate::upstream::stdio::Child;
use crate::upstream::Upstream;

/// How long a JSON-only client's request may wait for its stream to finish.
const JSON_ANSWER_IDLE: Duration = Duration::from_secs(3600);

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
        let session = route.shared.sessions.mint(&route.path, principal, &bytes);
        if let Upstream::Stdio(stdio) = &route.upstream {
            let shared = &route.shared;
            let spawned = stdio
                .spawn(session.clone(), shared.log.clone(), shared.sessions.clone())
                .await;
            if let Err(e) = spawned {
                shared.sessions.discard(session.id);
                return bad_gateway(&e);
            }
        }
        session
    } else {
        match find_session(route, &parts.headers).await {
            Ok(s) => s,
            Err(res) => return res,
        }
    };
    let Some(target) = target(route, &session) else {
        return session_not_found();
    };
    if !message.has_requests() {
        return notify(route, &target, &session, &parts.headers, bytes).await;
    }
    let post = exchange::Post {
        session,
        opens_session,
        headers: parts.headers,
        bytes,
        message,
    };
    match target {
        Target::Http(up) => exchange::http(route, up, post).await,
        Target::Stdio(child) => exchange::stdio(route, &child, post).await,
    }
}

/// The upstream side of a session.
enum Target<'a> {
    Http(&'a Arc<crate::upstream::http::HttpUpstream>),
    Stdio(Arc<Child>),
}

/// A stdio session whose child is gone is gone too (404).
fn target<'a>(route: &'a Route, session: &Session) -> Option<Target<'a>> {
    match &route.upstream {
        Upstream::Http(up) => Some(Target::Http(up)),
        Upstream::Stdio(stdio) => stdio.child(session.id).map(Target::Stdio),
    }
}

/// Notifications and responses: forwarded, answered with the upstream's own
/// status (202 normally). A `notifications/cancelled` also marks its stream.
async fn notify(
    route: &Route,
    target: &Target<'_>,
    session: &Arc<Session>,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Response<Body> {
    let cancels = message_mentions(&bytes, "notifications/cancelled");
    if cancels {
        for id in jsonrpc::cancelled_request_ids(&bytes) {
            if let Some(stream) = session.stream_of(&id) {
                if let Target::Stdio(child) = target {
                    child.forget(stream);
                }
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
    match target {
        Target::Http(up) => {
            let upstream_session = session.upstream_session();
            match up
                .send(Method::POST, headers, bytes, upstream_session.as_deref())
                .await
            {
                Ok(res) => pass_through(res, Some(session.id)),
                Err(e) => bad_gateway(&e),
            }
        }
        Target::Stdio(child) => match child.write(&bytes).await {
            Ok(()) => {
                let mut res = Response::new(reply::empty());
                *res.status_mut() = StatusCode::ACCEPTED;
                insert_session_header(res.headers_mut(), session.id);
                res
            }
            Err(e) => bad_gateway(&e),
        },
    }
}

fn message_mentions(bytes: &[u8], method: &str) -> bool {
    memchr::memmem::find(bytes, method.as_bytes()).is_some()
}

/// Answers the client from the log: SSE for clients that accept it, one JSON
/// body (after the stream finished) for those that only accept JSON.
pub async fn answer(
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
    let resume = match headers::get_str(&parts.headers, &headers::LAST_EVENT_ID) {
        Some(last) => match resume_point(route, &session, last).await {
            Ok(point) => point,
            Err(res) => return res,
        },
        None => None,
    };
    let mut res = if let Some((stream, seq)) = resume {
        reply::sse(last_event_id::serve(
            log.attach(stream, seq),
            route.presentation(session.id, version.as_deref(), false),
        ))
    } else {
        let attached = match target(route, &session) {
            Some(Target::Http(up)) => {
                exchange::http_standalone(route, up, &session, &parts.headers).await
            }
            Some(Target::Stdio(child)) => {
                // The child's standalone stream exists from its start; the
                // first GET gets everything it said before anyone listened.
                let after = if child.first_standalone_attach() {
                    0
                } else {
                    log.end(child.standalone)
                };
                Ok(log.attach(child.standalone, after))
            }
            None => Err(session_not_found()),
        };
        match attached {
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

/// Where a `Last-Event-ID` resumes: its stream and cursor, or `None` when it
/// names the end of a standalone stream that is over (its upstream GET
/// ended) — the client then continues on the session's current one instead
/// of reconnecting forever to a stream that will never say more.
async fn resume_point(
    route: &Route,
    session: &Session,
    last_event_id: &str,
) -> Result<Option<(crate::id::StreamId, u64)>, Response<Body>> {
    let unknown = || {
        reply::error(
            StatusCode::BAD_REQUEST,
            None,
            code::SERVER_ERROR,
            "Bad Request: unknown or expired Last-Event-ID",
        )
    };
    let (stream, seq) = last_event_id::open(&route.shared.keyring, session.id, last_event_id)
        .map_err(|_| unknown())?;
    let log = &route.shared.log;
    match log.meta(stream).await {
        Ok(Some(meta)) if meta.session == session.id => {
            let exhausted = meta.kind == StreamKind::Standalone
                && !meta.status.is_live()
                && seq >= log.end(stream);
            Ok((!exhausted).then_some((stream, seq)))
        }
        Ok(_) => Err(unknown()),
        Err(e) => Err(store_failure(&e)),
    }
}

pub async fn delete(route: &Route, req: Request<Incoming>) -> Response<Body> {
    let (parts, _) = req.into_parts();
    let session = match find_session(route, &parts.headers).await {
        Ok(s) => s,
        Err(res) => return res,
    };
    let upstream = match &route.upstream {
        Upstream::Http(up) => {
            let upstream_session = session.upstream_session();
            Some(
                up.send(
                    Method::DELETE,
                    &parts.headers,
                    Bytes::new(),
                    upstream_session.as_deref(),
                )
                .await,
            )
        }
        // Ending the session stops its child (SIGTERM, then SIGKILL).
        Upstream::Stdio(_) => None,
    };
    // The proxy's session ends whatever the upstream says: the client asked.
    if let Err(e) = route.shared.sessions.end(session.id).await {
        return store_failure(&e);
    }
    match upstream {
        Some(Ok(res)) => pass_through(res, None),
        Some(Err(e)) => {
            tracing::info!(session = %session.id, error = %e, "upstream unreachable for DELETE");
            Response::new(reply::empty())
        }
        None => Response::new(reply::empty()),
    }
}

/// An upstream response relayed unchanged, but for the session header.
pub fn pass_through(res: Response<Incoming>, session: Option<SessionId>) -> Response<Body> {
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
