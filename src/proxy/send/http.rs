//! Sending to an HTTP upstream: the handler itself forwards the POST and,
//! for a JSON answer, logs it — for up to `answer_wait_ms`; an SSE answer is
//! relayed into the log by a task of its own. A head that carries messages
//! means the client gets the stream as SSE from the log; any other status
//! passes through unchanged. An exchange not done by then (or whose client
//! left) continues in a task of its own, the client gets the SSE stream
//! anyway — so it holds an event id to resume with — and a late refusal
//! becomes a JSON-RPC error entry. Owns the wait and who finishes the
//! exchange; it must not decide what the client is shown.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Response};
use hyper::body::Incoming;

use super::{Sent, Waiting};
use crate::access;
use crate::proxy::post::Post;
use crate::proxy::{present, Rejection, Route};
use crate::relay::Relay;
use crate::reply::Body;
use crate::session::Session;
use crate::store::StreamMeta;
use crate::stream::{Log, Reader};
use crate::upstream::headers::{self, SESSION_ID};
use crate::upstream::http::{carries_messages, served_by, within, HttpUpstream, Messages};
use crate::upstream::replicas::Binding;
use crate::upstream::{renew, UpstreamError};

/// Largest upstream error body quoted into a JSON-RPC error entry.
const QUOTED_BODY: usize = 2048;

type Exchange = Pin<Box<dyn Future<Output = Sent> + Send>>;

/// Sends a POST to the upstream and waits for its answer as long as
/// `waiting` says; what is not in by then is finished by a task of its own.
pub(super) async fn send(
    route: &Route,
    upstream: &Arc<HttpUpstream>,
    post: &Post,
    stream: &Arc<StreamMeta>,
    waiting: Waiting,
) -> Sent {
    let mut headers = post.headers.clone();
    let trace = access::exchange_shared(&mut headers, "POST");
    let relay = relay(
        route,
        upstream,
        post.session.clone(),
        stream.clone(),
        headers,
    )
    .traced(trace);
    let late = LateRefusal {
        log: relay.log.clone(),
        session: relay.session.clone(),
        stream: stream.clone(),
    };
    let exchange: Exchange = Box::pin(exchange(relay, post.opens_session, post.bytes.clone()));
    let deadline = match waiting {
        Waiting::Client { deadline } => deadline,
        Waiting::Nobody => {
            tokio::spawn(finish_alone(exchange, late));
            return Sent::Logged;
        }
    };
    let mut wait = Duration::from_millis(upstream.config.answer_wait_ms);
    if let Some(deadline) = deadline {
        wait = wait.min(deadline.saturating_duration_since(Instant::now()));
    }
    let mut inline = Inline {
        pending: Some((exchange, late)),
    };
    match tokio::time::timeout(wait, inline.outcome()).await {
        Ok(sent) => sent,
        Err(_) => {
            inline.detach();
            Sent::Logged
        }
    }
}

/// An exchange the handler polls itself — one task, no hand-offs, for the
/// common call that completes within `answer_wait_ms` — and that is handed
/// to a task of its own when the handler stops polling it: the wait ran
/// out, or the client went away and the handler was dropped mid-wait (under
/// the legacy protocols a disconnect is not cancellation, so the exchange
/// must run to its end either way, hence the detach on drop).
struct Inline {
    pending: Option<(Exchange, LateRefusal)>,
}

impl Inline {
    async fn outcome(&mut self) -> Sent {
        let Some((exchange, _)) = self.pending.as_mut() else {
            return Sent::Logged;
        };
        let sent = exchange.await;
        self.pending = None;
        sent
    }

    fn detach(&mut self) {
        if let Some((exchange, late)) = self.pending.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(finish_alone(exchange, late));
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

/// The stream a refusal ends when it comes after the client was answered
/// with that stream: nobody is left to pass it through to.
struct LateRefusal {
    log: Arc<Log>,
    session: Arc<Session>,
    stream: Arc<StreamMeta>,
}

/// Runs an exchange nobody waits for to its end; a refusal becomes the
/// stream's error entry.
async fn finish_alone(exchange: Exchange, late: LateRefusal) {
    let why = match exchange.await {
        Sent::Logged => return,
        Sent::Refused(res) => refusal_text(res).await,
        Sent::Unreachable(e) => e.to_string(),
    };
    let stream = &late.stream;
    if let Err(e) = late.log.fail(stream, &stream.origin_ids, &why).await {
        tracing::error!(stream = %stream.id, error = %e, "cannot finish stream");
    }
    late.session.release(stream);
}

/// Forwards the POST, learns the upstream's session id, and relays the
/// answer into the log: inline for a JSON answer (one message, usually
/// already read with the head), in a task of its own for an SSE stream (the
/// client must be answered while it runs).
async fn exchange(relay: Relay, opens_session: bool, bytes: Bytes) -> Sent {
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
            relay.upstream.timed_out(&Binding::of(&relay.session), why);
            // The upstream may be working on it: tell it to stop.
            relay.cancel_upstream(why).await;
            Err(UpstreamError::TimedOut(why))
        }
    };
    relay.log.metrics().upstream_answer(&sent);
    if let (Some(trace), Ok(res)) = (&relay.trace, &sent) {
        trace.answered(res.status().as_u16());
    }
    let res = match sent {
        Ok(res) if carries_messages(&res) => res,
        Ok(res) => return Sent::Refused(res),
        Err(e) => return Sent::Unreachable(e),
    };
    if opens_session {
        let upstream_id = headers::get_str(res.headers(), &SESSION_ID).map(str::to_owned);
        let replica = served_by(&res);
        let update = relay.sessions.update(&relay.session, |r| {
            r.upstream_session = upstream_id;
            r.upstream_replica = replica;
        });
        if let Err(e) = update.await {
            tracing::error!(session = %relay.session.id, error = %e, "cannot persist session");
        }
    }
    let messages = Messages::new(res);
    if messages.is_sse() {
        tokio::spawn(relay.run(messages));
    } else {
        relay.run(messages).await;
    }
    Sent::Logged
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

/// Attaches to the session's standalone stream, opening it upstream first
/// when none is being relayed.
pub(super) async fn standalone(
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
    let mut headers = headers.clone();
    let trace = access::exchange(&mut headers, "GET");
    let res = renew::send(
        sessions,
        upstream,
        session,
        Method::GET,
        &headers,
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
        Arc::new(headers),
    );
    tokio::spawn(relay.traced(trace).run(Messages::new(res)));
    Ok(reader)
}

/// The relay that logs what the upstream answers on `stream`.
pub fn relay(
    route: &Route,
    upstream: &Arc<HttpUpstream>,
    session: Arc<Session>,
    stream: Arc<StreamMeta>,
    client_headers: Arc<HeaderMap>,
) -> Relay {
    Relay {
        log: route.shared.log.clone(),
        sessions: route.shared.sessions.clone(),
        upstream: upstream.clone(),
        session,
        stream,
        client_headers,
        limits: route.shared.config.limits.clone(),
        trace: None,
    }
}
