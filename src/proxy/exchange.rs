//! Exchanges: how a client POST carrying requests reaches the upstream and
//! how its answer gets into the log, for each kind of upstream.
//!
//! Every exchange first opens the request's stream ([`opening`]), before
//! the request goes upstream.
//!
//! [`opening`]: super::opening
//!
//! HTTP: the handler itself forwards the POST and, for a JSON answer, logs it
//! — for up to `answer_wait_ms`; an SSE answer is relayed into the log by a
//! task of its own. A head that carries messages means the client gets the
//! stream as SSE from the log; any other status passes through unchanged
//! (clients detect protocol eras from 4xx bodies). An exchange not done by
//! then (or whose client left) continues in a task of its own, the client
//! gets the SSE stream anyway — so it holds an event id to resume with — and
//! a late refusal becomes a JSON-RPC error entry.
//!
//! stdio: the stream is registered with the child's demultiplexer, the
//! message written to its stdin, and the client answered from the log.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use hyper::body::Incoming;

use super::opening::{self, Opened, RequestStream};
use super::post::Post;
use super::{present, renew};
use super::{Rejection, Route};
use crate::headers::{self, SESSION_ID};
use crate::relay::Relay;
use crate::reply::Body;
use crate::session::Session;
use crate::store::StreamMeta;
use crate::stream::Reader;
use crate::upstream::http::{carries_messages, within, HttpUpstream, Messages};
use crate::upstream::stdio::Child;
use crate::upstream::{Upstream, UpstreamError};

/// Largest upstream error body quoted into a JSON-RPC error entry.
const QUOTED_BODY: usize = 2048;

/// The upstream side of a session.
pub enum Target<'a> {
    Http(&'a Arc<HttpUpstream>),
    Stdio(Arc<Child>),
}

impl<'a> Target<'a> {
    /// A stdio session whose child is gone is gone too.
    pub fn of(route: &'a Route, session: &Session) -> Option<Target<'a>> {
        match &route.upstream {
            Upstream::Http(up) => Some(Target::Http(up)),
            Upstream::Stdio(stdio) => stdio.child(session.id).map(Target::Stdio),
        }
    }
}

/// Exchanges a POST carrying requests with the session's upstream.
pub async fn run(
    route: &Route,
    target: Target<'_>,
    post: Post,
) -> Result<Response<Body>, Rejection> {
    match target {
        Target::Http(up) => http(route, up, post).await,
        Target::Stdio(child) => stdio(route, &child, post).await,
    }
}

/// Answers the client from `stream`, persisting a session the POST opened
/// first, so the session exists before the client learns its id.
async fn answer(
    route: &Route,
    post: &Post,
    opened: RequestStream,
) -> Result<Response<Body>, Rejection> {
    if post.opens_session {
        route.shared.sessions.persist(&post.session).await?;
    }
    route
        .answer(
            &post.session,
            &post.headers,
            &opened.meta,
            opened.call,
            opened.reader,
        )
        .await
}

/// Sends a POST to a stdio child and answers from the log.
async fn stdio(route: &Route, child: &Child, post: Post) -> Result<Response<Body>, Rejection> {
    let opened = match opening::open(route, &post).await? {
        Opened::New(opened) => opened,
        Opened::Repeat(prior) => {
            return route
                .answer_again(&post.session, &post.headers, &prior)
                .await
        }
    };
    write_to_child(route, child, &post, &opened.meta).await?;
    answer(route, &post, opened).await
}

/// Hands a request to a stdio child for `stream`; a child that cannot take
/// it ends the stream with an error entry.
async fn write_to_child(
    route: &Route,
    child: &Child,
    post: &Post,
    stream: &StreamMeta,
) -> Result<(), Rejection> {
    child.expect(stream, stream.progress.clone());
    if let Err(e) = child.write(&post.bytes).await {
        route.shared.log.metrics().upstream_error(&e);
        child.forget(stream.id);
        post.session.release(stream);
        route
            .shared
            .log
            .fail(stream, &stream.origin_ids, &e.to_string())
            .await?;
    }
    Ok(())
}

/// Starts a task's leg: its stream opened (durable, and named by its task
/// already) and its request on its way upstream, in an exchange nobody
/// waits for — the task answers the client, and a refusal becomes the
/// leg's error entry, which the task reports as its failure.
pub async fn start_leg(
    route: &Route,
    target: Target<'_>,
    post: Post,
) -> Result<StreamMeta, Rejection> {
    let stream = match opening::open(route, &post).await? {
        Opened::New(opened) => opened.meta,
        // Never: a leg's stream is the task's, not a call the client re-sends.
        Opened::Repeat(prior) => return Ok(prior),
    };
    match target {
        Target::Http(up) => {
            let relay = relay(
                route,
                up,
                post.session.clone(),
                stream.clone(),
                post.headers.clone(),
            );
            let orphaned = Arc::new(AtomicBool::new(true));
            tokio::spawn(exchange(relay, false, post.bytes, orphaned));
        }
        Target::Stdio(child) => write_to_child(route, &child, &post, &stream).await?,
    }
    Ok(Arc::unwrap_or_clone(stream))
}

/// How an exchange ended for the handler that drove it.
enum Outcome {
    /// The whole answer is in the log (a JSON answer read inline).
    Logged,
    /// The answer is an SSE stream, relayed into the log by its own task.
    Relaying,
    /// The upstream answered with something to pass through unchanged.
    Refused(Response<Incoming>),
    Unreachable(UpstreamError),
}

/// An exchange the handler polls itself — one task, no hand-offs, for the
/// common call that completes within `answer_wait_ms` — and that is handed
/// to a task of its own when the handler stops polling it (the wait ran out,
/// or the client went away: under the legacy protocols a disconnect is not
/// cancellation, so the exchange must run to its end either way).
struct Inline {
    exchange: Option<Pin<Box<dyn Future<Output = Outcome> + Send>>>,
    /// Tells the exchange nobody waits for its outcome, so it logs a late
    /// refusal as an error entry instead of returning it.
    orphaned: Arc<AtomicBool>,
}

impl Inline {
    async fn outcome(&mut self) -> Option<Outcome> {
        let outcome = self.exchange.as_mut()?.await;
        self.exchange = None;
        Some(outcome)
    }

    fn detach(&mut self) {
        if let Some(exchange) = self.exchange.take() {
            self.orphaned.store(true, Ordering::Release);
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(exchange);
                }
                Err(_) => tracing::error!("no runtime to finish a detached exchange"),
            }
        }
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        self.detach();
    }
}

async fn http(
    route: &Route,
    upstream: &Arc<HttpUpstream>,
    post: Post,
) -> Result<Response<Body>, Rejection> {
    let (session, opens_session) = (&post.session, post.opens_session);
    let opened = match opening::open(route, &post).await? {
        Opened::New(opened) => opened,
        Opened::Repeat(prior) => {
            return route
                .answer_again(&post.session, &post.headers, &prior)
                .await
        }
    };
    let orphaned = Arc::new(AtomicBool::new(false));
    let mut inline = Inline {
        exchange: Some(Box::pin(exchange(
            relay(
                route,
                upstream,
                session.clone(),
                opened.meta.clone(),
                post.headers.clone(),
            ),
            opens_session,
            post.bytes.clone(),
            orphaned.clone(),
        ))),
        orphaned,
    };
    // A call that gets resume tokens is answered by its deadline at the
    // latest: with its result, or with an interim.
    let mut wait = Duration::from_millis(upstream.config.answer_wait_ms);
    if let Some(call) = &opened.call {
        wait = wait.min(call.deadline().saturating_duration_since(Instant::now()));
    }
    let outcome = match tokio::time::timeout(wait, inline.outcome()).await {
        Ok(outcome) => outcome,
        Err(_) => {
            inline.detach();
            None
        }
    };
    match outcome {
        Some(Outcome::Refused(res)) => {
            forget(route, session, opens_session, &opened.meta).await;
            Ok(present::pass_through(
                res,
                (!opens_session).then_some(session.id),
            ))
        }
        Some(Outcome::Unreachable(e)) => {
            forget(route, session, opens_session, &opened.meta).await;
            Err(e.into())
        }
        // Persisting here is idempotent with the exchange's update and
        // covers a head that came late.
        Some(Outcome::Logged | Outcome::Relaying) | None => answer(route, &post, opened).await,
    }
}

/// Removes what an exchange created when its upstream refused it.
async fn forget(route: &Route, session: &Session, opens_session: bool, stream: &StreamMeta) {
    session.release(stream);
    if let Err(e) = route.shared.log.delete(stream.id).await {
        tracing::warn!(stream = %stream.id, error = %e, "cannot delete refused stream");
    }
    if opens_session {
        route.shared.sessions.discard(session.id);
    }
}

/// Forwards the POST, learns the upstream's session id, and relays the
/// answer into the log: inline for a JSON answer (one message, usually
/// already read with the head), in a task of its own for an SSE stream (the
/// client must be answered while it runs).
async fn exchange(
    relay: Relay,
    opens_session: bool,
    bytes: Bytes,
    orphaned: Arc<AtomicBool>,
) -> Outcome {
    let patience = relay
        .upstream
        .patience(relay.stream.created_ms, Duration::ZERO);
    let sending = renew::send(
        &relay.sessions,
        &relay.upstream,
        &relay.session,
        Method::POST,
        &relay.client_headers,
        bytes,
    );
    let sent = match within(patience, sending).await {
        Ok(sent) => sent,
        Err(why) => {
            // The upstream may be working on it: tell it to stop.
            relay.cancel_upstream(why).await;
            Err(UpstreamError::TimedOut(why))
        }
    };
    relay.log.metrics().upstream_answer(&sent);
    let res = match sent {
        Ok(res) if carries_messages(&res) => res,
        Ok(res) if orphaned.load(Ordering::Acquire) => {
            // The client was already answered with the stream.
            let why = refusal_text(res).await;
            fail(&relay, &why).await;
            return Outcome::Relaying;
        }
        Ok(res) => return Outcome::Refused(res),
        Err(e) if orphaned.load(Ordering::Acquire) => {
            fail(&relay, &e.to_string()).await;
            return Outcome::Relaying;
        }
        Err(e) => return Outcome::Unreachable(e),
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
    let messages = Messages::new(res);
    if messages.is_sse() {
        tokio::spawn(relay.run(messages));
        Outcome::Relaying
    } else {
        relay.run(messages).await;
        Outcome::Logged
    }
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
    let stream = &relay.stream;
    if let Err(e) = relay.log.fail(stream, &stream.origin_ids, why).await {
        tracing::error!(stream = %stream.id, error = %e, "cannot finish stream");
    }
    relay.session.release(&relay.stream);
}

/// Attaches to the session's standalone stream: for HTTP, opening it
/// upstream first when none is being relayed; an upstream refusal is
/// returned as the response to pass through.
pub async fn standalone(
    route: &Route,
    target: &Target<'_>,
    session: &Arc<Session>,
    headers: &HeaderMap,
) -> Result<Reader, Box<Response<Body>>> {
    let log = &route.shared.log;
    match target {
        Target::Http(up) => http_standalone(route, up, session, headers).await,
        Target::Stdio(child) => {
            // The child's standalone stream exists from its start; the
            // first GET gets everything it said before anyone listened.
            let stream = child.standalone.id;
            let after = if child.first_standalone_attach() {
                0
            } else {
                log.end(stream).await
            };
            Ok(log.attach(stream, after))
        }
    }
}

async fn http_standalone(
    route: &Route,
    upstream: &Arc<HttpUpstream>,
    session: &Arc<Session>,
    headers: &HeaderMap,
) -> Result<Reader, Box<Response<Body>>> {
    let refused = |r: Rejection| Box::new(r.into_response());
    let log = &route.shared.log;
    if let Some(stream) = session.standalone() {
        if let Ok(Some(meta)) = log.meta(stream).await {
            if meta.status.is_live() {
                // A client opening a fresh GET wants what comes next.
                return Ok(log.attach(stream, log.end(stream).await));
            }
        }
    }
    let sessions = &route.shared.sessions;
    let res = renew::send(
        sessions,
        upstream,
        session,
        Method::GET,
        headers,
        Bytes::new(),
    )
    .await
    .map_err(|e| {
        log.metrics().upstream_error(&e);
        refused(e.into())
    })?;
    if !carries_messages(&res) {
        return Err(Box::new(present::pass_through(res, Some(session.id))));
    }
    let stream = log
        .open(StreamMeta::standalone(session.id))
        .await
        .map_err(|e| refused(e.into()))?;
    session.set_standalone(Some(stream.id));
    let reader = log.attach(stream.id, 0);
    let relay = relay(
        route,
        upstream,
        session.clone(),
        Arc::new(stream),
        headers.clone(),
    );
    tokio::spawn(relay.run(Messages::new(res)));
    Ok(reader)
}

pub(super) fn relay(
    route: &Route,
    upstream: &Arc<HttpUpstream>,
    session: Arc<Session>,
    stream: Arc<StreamMeta>,
    client_headers: HeaderMap,
) -> Relay {
    Relay {
        log: route.shared.log.clone(),
        sessions: route.shared.sessions.clone(),
        upstream: upstream.clone(),
        session,
        stream,
        client_headers,
        limits: route.shared.config.limits.clone(),
    }
}
