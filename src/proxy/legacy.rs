//! Legacy era (2025-03-26 … 2025-11-25): the proxy's sessions, logged request
//! streams, the standalone GET stream, resumes, DELETE.
//!
//! A POST is a pipeline: parse → session → **router** (a negotiated dialect
//! may claim the message and answer it from the log) → **exchange**
//! (`exchange.rs`: open the stream, with the first entries the dialects
//! author, `opening.rs` → send it to the target, `send/` → **present**, the
//! client answered from the log, `present.rs`). Every step returns a [`Rejection`] on failure, mapped to a
//! response in one place.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use hyper::body::Incoming;

use super::exchange;
use super::post::Post;
use super::present::{self, Showing};
use super::send::Target;
use super::{read_body, rebind, Rejection, Route};
use crate::access;
use crate::dialect::{self, last_event_id, legacy_tasks, Answer, Command, Dialect, Negotiated};
use crate::id::SessionId;
use crate::jsonrpc::{self, Body as Message, Needle, RequestId};
use crate::metrics::requests::Method as MethodLabel;
use crate::reply::{self, Body};
use crate::session::{self, Lookup, Session};
use crate::store::StreamStatus;
use crate::upstream::headers::{self, SESSION_ID};
use crate::upstream::replicas::Binding;
use crate::upstream::Upstream;

static RESULT: Needle = Needle::new(b"\"result\"");
static ERROR: Needle = Needle::new(b"\"error\"");
static CANCELLED: Needle = Needle::new(b"notifications/cancelled");

pub async fn post(route: &Route, req: Request<Incoming>) -> Result<Response<Body>, Rejection> {
    let (parts, body) = req.into_parts();
    if !headers::has_media_type(&parts.headers, "application/json") {
        return Err(Rejection::unsupported_media_type());
    }
    let bytes = read_body(body, &route.shared.config).await?;
    let message = jsonrpc::parse_body(&bytes)?;
    access::note_message(&message, &bytes);
    if message.single_method() == Some("initialize") && !parts.headers.contains_key(SESSION_ID) {
        let principal = route.shared.caller(&parts).await?;
        return initialize(route, principal, parts.headers, bytes, message).await;
    }
    let session = find_session(route, &parts).await?;
    if message.has_requests() {
        note_use(route, &session).await?;
    }
    let negotiated = Negotiated::of(&session);
    let last = headers::last_event_id(&parts.headers);
    let command = Command::parse(
        &bytes,
        &message,
        &negotiated,
        &route.dialects,
        last.as_deref(),
    )?;
    if let Some(command) = command {
        return answer_command(route, &session, &parts.headers, command).await;
    }
    let target = Target::of(route, &session).ok_or_else(Rejection::session_not_found)?;
    if !message.has_requests() {
        return notify(route, &target, &session, &parts.headers, bytes).await;
    }
    let post = Post {
        session,
        opens_session: false,
        headers: Arc::new(parts.headers),
        bytes,
        message,
        leg: None,
    };
    exchange::run(route, target, post).await
}

/// An `initialize` without a session: mints one (with the dialects the client
/// negotiated, which the upstream does not see) if a place is free for it,
/// starts its stdio child if the upstream is a program, and exchanges the
/// request. A refused exchange takes the minted session with it.
async fn initialize(
    route: &Route,
    principal: String,
    headers: HeaderMap,
    bytes: Bytes,
    message: Message,
) -> Result<Response<Body>, Rejection> {
    let shared = &route.shared;
    let (mut negotiated, bytes) = match dialect::negotiate(&bytes, &route.dialects) {
        Some((negotiated, stripped)) => (negotiated, stripped),
        None => (Negotiated::default(), bytes),
    };
    if legacy_tasks::offered(&route.dialects.tasks, &bytes) {
        negotiated.add(Dialect::Tasks);
    }
    let minted = shared
        .sessions
        .mint(&route.path, principal, &bytes, negotiated.names());
    let session = match minted {
        Ok(session) => {
            access::note_session(&session);
            session
        }
        Err(full) => {
            shared.log.metrics().session_refused(full);
            let id = message.request_ids().into_iter().next();
            let retry_after = shared.config.store.sweep_secs;
            return Err(Rejection::no_session_place(id, full, retry_after));
        }
    };
    if shared.auth.mode() == crate::auth::PrincipalMode::Token {
        session.note_subject_hint(crate::auth::hint::subject_hint(&headers));
    }
    let id = session.id;
    let opened = open_upstream(route, session, headers, bytes, message).await;
    if opened.is_err() {
        // The client never learns the session's id: nothing may keep it.
        if let Err(e) = shared.sessions.unmint(id).await {
            tracing::warn!(session = %id, error = %e, "cannot forget a refused session");
        }
    }
    opened
}

/// The upstream side of a minted session: its stdio child started, and its
/// `initialize` exchanged.
async fn open_upstream(
    route: &Route,
    session: Arc<Session>,
    headers: HeaderMap,
    bytes: Bytes,
    message: Message,
) -> Result<Response<Body>, Rejection> {
    let shared = &route.shared;
    if let Upstream::Stdio(stdio) = &route.upstream {
        let spawned = stdio
            .spawn(
                session.clone(),
                shared.log.clone(),
                shared.sessions.clone(),
                dialect::kept_after_initialize,
            )
            .await;
        if let Err(e) = spawned {
            shared.log.metrics().upstream_error(&e);
            return Err(e.into());
        }
    }
    let target = Target::of(route, &session).ok_or_else(Rejection::session_not_found)?;
    let post = Post {
        session,
        opens_session: true,
        headers: Arc::new(headers),
        bytes,
        message,
        leg: None,
    };
    exchange::run(route, target, post).await
}

/// The caller's session: 400 without the header, 404 for an unknown,
/// expired or foreign one (another principal's).
async fn find_session(
    route: &Route,
    request: &http::request::Parts,
) -> Result<Arc<Session>, Rejection> {
    // Who asks comes first: a credential that does not verify is refused
    // the same way whatever session it names, so it learns nothing of one.
    let principal = route.shared.caller(request).await?;
    let text = headers::get_str(&request.headers, &SESSION_ID)
        .ok_or_else(|| Rejection::bad_request("Bad Request: Mcp-Session-Id header is required"))?;
    let id = text
        .parse::<SessionId>()
        .map_err(|()| Rejection::session_not_found())?;
    let lookup = route.shared.sessions.lookup(id, &route.path, &principal);
    let session = match lookup.await? {
        Lookup::Found(session) => session,
        // A client certificate or a verified principal is an identity, not
        // a credential to refresh.
        Lookup::OtherCredential(session) if rebindable(route, request) => {
            rebind::ask_upstream(route, session, &request.headers, &principal).await?
        }
        Lookup::OtherCredential(_) | Lookup::Absent => return Err(Rejection::session_not_found()),
    };
    // A relay waiting for a credential to resume upstream gets this one.
    session.remember_credential(&request.headers, &route.shared.config.principal_header);
    access::note_session(&session);
    Ok(session)
}

/// Notes a request or a GET stream of the session's client: the session is
/// in use, and no longer ends early as unused. One that just did is gone.
async fn note_use(route: &Route, session: &Session) -> Result<(), Rejection> {
    match route.shared.sessions.mark_used(session).await? {
        true => Ok(()),
        false => Err(Rejection::session_not_found()),
    }
}

/// Whether a session may answer to another credential once the upstream
/// accepts it: only where the principal is the credential itself.
fn rebindable(route: &Route, request: &http::request::Parts) -> bool {
    route.shared.auth.mode() == crate::auth::PrincipalMode::Token
        && session::certificate_principal(request).is_none()
}

/// A message a dialect claimed, answered from the log.
async fn answer_command(
    route: &Route,
    session: &Arc<Session>,
    headers: &HeaderMap,
    command: Command,
) -> Result<Response<Body>, Rejection> {
    match command.apply(&route.context(session)).await? {
        Answer::Response(bytes) => Ok(present::json(session.id, bytes)),
        Answer::Start(start) => start_task(route, session, headers, *start).await,
        Answer::Cancel(bytes, leg) => {
            if let Some(leg) = leg {
                route
                    .cancel(&leg, "the task was cancelled (tasks/cancel)")
                    .await;
            }
            Ok(present::json(session.id, bytes))
        }
        Answer::Replay(replay) => {
            if let Some(task) = &replay.task {
                session.read_as(replay.stream.id, task.read_as());
            }
            let showing = Showing {
                presenter: route
                    .presenter(session, &replay.stream)
                    .then(replay.closing)
                    .with_call(replay.call)
                    .with_task(replay.task),
                reader: replay.reader,
                fresh: true,
            };
            route.show(session, headers, showing).await
        }
    }
}

/// A 2025-11-25 task: its leg goes upstream as a request of the session,
/// then the client gets the `CreateTaskResult`. A leg that cannot start
/// takes its task with it.
async fn start_task(
    route: &Route,
    session: &Arc<Session>,
    headers: &HeaderMap,
    start: legacy_tasks::Start,
) -> Result<Response<Body>, Rejection> {
    let log = &route.shared.log;
    let started = match Target::of(route, session) {
        Some(target) => {
            let post = Post {
                session: session.clone(),
                opens_session: false,
                headers: Arc::new(headers.clone()),
                message: jsonrpc::parse_body(&start.upstream)?,
                bytes: start.upstream,
                leg: Some(start.leg),
            };
            exchange::start_leg(route, target, post).await
        }
        None => Err(Rejection::session_not_found()),
    };
    if let Err(refused) = started {
        if let Err(e) = log.store().delete_task(start.leg.task).await {
            tracing::warn!(task = %start.leg.task, error = %e, "cannot delete a task that did not start");
        }
        return Err(refused);
    }
    tokio::spawn(legacy_tasks::announce_end(
        log.clone(),
        route.shared.keyring.clone(),
        session.clone(),
        start.leg,
    ));
    Ok(present::json(session.id, start.answer))
}

/// Notifications and responses: forwarded, answered with the upstream's own
/// status (202 normally). A `notifications/cancelled` also marks its stream.
async fn notify(
    route: &Route,
    target: &Target<'_>,
    session: &Arc<Session>,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Response<Body>, Rejection> {
    // Only a body with a response can answer the upstream (most POSTs here
    // are notifications: no parse for them).
    let answers = RESULT.found_in(&bytes) || ERROR.found_in(&bytes);
    if answers {
        session.client_answered(jsonrpc::response_ids(&bytes));
    }
    if CANCELLED.found_in(&bytes) {
        for id in jsonrpc::cancelled_request_ids(&bytes) {
            cancelled(route, target, session, &id).await;
        }
    }
    target.notify(session, headers, bytes).await
}

/// Marks the stream of a request the client cancelled — found through the
/// log, so a cancellation after a proxy restart still reaches it.
async fn cancelled(route: &Route, target: &Target<'_>, session: &Session, id: &RequestId) {
    let log = &route.shared.log;
    let stream = match session.stream_of(id) {
        Some(stream) => Some(stream),
        None => log
            .store()
            .stream_of_request(session.id, id)
            .await
            .ok()
            .flatten(),
    };
    let Some(stream) = stream else { return };
    target.forget(stream);
    let live = matches!(log.meta(stream).await, Ok(Some(m)) if m.status.is_live());
    if live {
        if let Err(e) = log.finish(stream, StreamStatus::Cancelled).await {
            tracing::warn!(%stream, error = %e, "cannot mark stream cancelled");
        }
    }
}

pub async fn get(route: &Route, req: Request<Incoming>) -> Result<Response<Body>, Rejection> {
    access::note(|facts| facts.method = MethodLabel::GetStream);
    let (parts, _) = req.into_parts();
    let session = find_session(route, &parts).await?;
    note_use(route, &session).await?;
    if !headers::accepts(&parts.headers, "text/event-stream") {
        return Err(Rejection::not_acceptable());
    }
    let resumed = match headers::last_event_id(&parts.headers) {
        Some(last) => last_event_id::resume(&route.context(&session), &last).await?,
        None => None,
    };
    let showing = match resumed {
        Some((stream, seq)) => Showing {
            reader: route.shared.log.attach(stream.id, seq),
            presenter: route.presenter(&session, &stream),
            fresh: false,
        },
        None => {
            let target = Target::of(route, &session).ok_or_else(Rejection::session_not_found)?;
            let reader = match target.standalone(route, &session, &parts.headers).await {
                Ok(reader) => reader,
                Err(refused) => return Ok(*refused),
            };
            Showing {
                reader,
                presenter: dialect::Presenter::plain(),
                fresh: true,
            }
        }
    };
    route.show(&session, &parts.headers, showing).await
}

pub async fn delete(route: &Route, req: Request<Incoming>) -> Result<Response<Body>, Rejection> {
    access::note(|facts| facts.method = MethodLabel::DeleteSession);
    let (parts, _) = req.into_parts();
    let session = find_session(route, &parts).await?;
    let upstream = match &route.upstream {
        Upstream::Http(up) => {
            let to = Binding::of(&session);
            let headers = access::traced(&parts.headers, "DELETE");
            Some(up.send(Method::DELETE, &headers, Bytes::new(), &to).await)
        }
        // Ending the session stops its child (SIGTERM, then SIGKILL).
        Upstream::Stdio(_) => None,
    };
    // The proxy's session ends whatever the upstream says: the client asked.
    route.shared.sessions.end(session.id).await?;
    Ok(match upstream {
        Some(Ok(res)) => present::pass_through(res, None),
        Some(Err(e)) => {
            tracing::info!(session = %session.id, error = %e, "upstream unreachable for DELETE");
            Response::new(reply::empty())
        }
        None => Response::new(reply::empty()),
    })
}
