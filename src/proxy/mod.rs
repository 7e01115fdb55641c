//! Request handling for one mounted upstream: picks the protocol era of each
//! request and hands it to the legacy (sessions, logged streams, dialects) or
//! modern (stateless pass-through) handler. Also owns what both need: the
//! shared state, reading a bounded request body, and the request path's one
//! error type ([`Rejection`]), turned into a response here and nowhere else.
//!
//! [`legacy`] is the session path: parse → session → dialect router →
//! exchange (`exchange.rs`), a pipeline of its own — open the stream
//! (`opening.rs`: admitted under the session, principal and disk caps by
//! `quota.rs`, no double execution, logged with its opening entries) → send
//! it to the target, an HTTP upstream or a stdio child (`send/`) → present
//! the answer from the log (`present.rs`); `post.rs` is the POST the steps
//! read, `rebind.rs` a session's refreshed token. [`modern`] passes requests
//! through statelessly, and [`tasks`] makes durable tasks for modern clients
//! of task-unaware upstreams (the call that becomes a task, the `tasks/*`
//! methods).

mod exchange;
pub mod legacy;
pub mod modern;
mod opening;
mod post;
mod present;
mod quota;
mod rebind;
mod rejection;
mod send;
pub mod tasks;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

pub use self::rejection::{OwnChallenge, Rejection};
use crate::config::{Config, DialectsConfig};
use crate::reply::Body;
use crate::session::{Era, Sessions};
use crate::store::StreamMeta;
use crate::stream::Log;
use crate::token::Keyring;
use crate::upstream::replicas::Binding;
use crate::upstream::Upstream;
use tokio_util::sync::CancellationToken;

/// State shared by every route.
pub struct Shared {
    pub config: Config,
    pub log: Arc<Log>,
    pub sessions: Arc<Sessions>,
    pub keyring: Keyring,
    /// Who a request speaks for (`[auth]`).
    pub auth: crate::auth::Authenticator,
    /// Cancelled when the proxy starts shutting down: open SSE answers end
    /// with a `retry:` so their clients reconnect (here after a restart, or
    /// to another instance).
    pub draining: CancellationToken,
    /// Where spans go; `None` with tracing off.
    pub tracer: Option<Arc<crate::traces::Tracer>>,
}

impl Shared {
    /// The principal a request speaks for: its client certificate (mutual
    /// TLS), else what `[auth]` makes of its headers. A credential that
    /// does not verify is a 401 (before any session is looked at, so it
    /// tells nothing of them); a verifier that cannot be reached is a 503
    /// that ends nothing.
    pub async fn caller(&self, request: &http::request::Parts) -> Result<String, Rejection> {
        if let Some(certificate) = crate::session::certificate_principal(request) {
            return Ok(certificate.to_owned());
        }
        let identified = self.auth.identify(&request.headers).await;
        self.log
            .metrics()
            .auth_outcome(self.auth.mode(), &identified);
        identified
            .map(|caller| caller.principal)
            .map_err(Rejection::from)
    }
}

/// One upstream, mounted at `path`.
pub struct Route {
    pub path: String,
    pub upstream: Upstream,
    /// The dialects offered on this route: the global settings with this
    /// upstream's resume-token table.
    pub dialects: DialectsConfig,
    /// Tasks made for modern clients, and what the upstream knows of them.
    pub tasks: Arc<tasks::Tasks>,
    pub shared: Arc<Shared>,
}

impl Route {
    /// The route's HTTP upstream; `None` for a stdio one.
    pub fn http(&self) -> Option<&crate::upstream::http::HttpUpstream> {
        match &self.upstream {
            Upstream::Http(http) => Some(http),
            Upstream::Stdio(_) => None,
        }
    }

    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let answered = match (Era::of(req.headers()), req.method()) {
            (Era::Modern, _) => match &self.upstream {
                Upstream::Http(http) => modern::forward(self, http, req).await,
                // A stdio server speaks one revision, with a handshake; answer
                // the way legacy HTTP servers do, so dual-era clients fall back.
                Upstream::Stdio(_) => Err(Rejection::bad_request(
                    "Bad Request: this server needs an initialize handshake (protocol revisions up to 2025-11-25)",
                )),
            },
            (Era::Legacy, &Method::POST) => legacy::post(self, req).await,
            (Era::Legacy, &Method::GET) => legacy::get(self, req).await,
            (Era::Legacy, &Method::DELETE) => legacy::delete(self, req).await,
            _ => Err(Rejection::method_not_allowed()),
        };
        answered.unwrap_or_else(Rejection::into_response)
    }

    /// Sends an HTTP upstream the DELETE of a session the proxy ended on
    /// its own (idle or unused), with the headers its client last sent when
    /// this process still has them. A stdio child is stopped with the
    /// session already.
    pub async fn end_upstream_session(&self, record: &crate::store::SessionRecord) {
        let (Upstream::Http(up), Some(_)) = (&self.upstream, &record.upstream_session) else {
            return;
        };
        let headers = self
            .shared
            .sessions
            .cached(record.id)
            .map(|s| s.remembered_headers())
            .unwrap_or_default();
        let sent = up
            .send(
                Method::DELETE,
                &headers,
                Bytes::new(),
                &Binding::of_record(record),
            )
            .await;
        match sent {
            Ok(res) => {
                tracing::debug!(session = %record.id, status = %res.status(), "upstream session ended")
            }
            Err(e) => {
                tracing::info!(session = %record.id, error = %e, "upstream unreachable for a session's end")
            }
        }
    }

    /// Tells the upstream to stop working on the requests of `stream` (the
    /// proxy gave up on them: abandonment).
    pub async fn cancel(&self, stream: &StreamMeta, why: &str) {
        let Some(session) = self.shared.sessions.cached(stream.session) else {
            // Not served by this process since it started: no upstream
            // session of ours is working on it.
            return;
        };
        match &self.upstream {
            Upstream::Http(up) => {
                let headers = session.remembered_headers();
                let to = Binding::of(&session);
                for id in &stream.origin_ids {
                    up.cancel(&headers, &to, id, why).await;
                }
            }
            Upstream::Stdio(stdio) => {
                if let Some(child) = stdio.child(session.id) {
                    child.abandon(stream, why).await;
                }
            }
        }
        session.release(stream);
    }
}

impl Route {
    /// Takes over a stream a previous process was relaying when it died:
    /// a relay re-attaches to the upstream after the last event logged.
    /// `false` when this route cannot: a stdio child died with that process,
    /// and an upstream that gave no event ids cannot be resumed.
    pub async fn resume_after_restart(&self, stream: &StreamMeta) -> bool {
        let (Upstream::Http(upstream), Some(mark)) = (&self.upstream, &stream.upstream) else {
            return false;
        };
        let session = match self.shared.sessions.restore(stream.session).await {
            Ok(Some(session)) => session,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(stream = %stream.id, error = %e, "cannot load the session of a stream to resume");
                return false;
            }
        };
        session.track(stream);
        // The client's headers died with the previous process (they are never
        // logged): an upstream that wants credentials on every request
        // refuses the resume, and the stream fails with an error entry.
        let mut headers = HeaderMap::new();
        // The context the stream was started under is not in the log: the
        // takeover is a trace of its own.
        let trace =
            (self.shared.tracer.as_ref()).map(|t| Box::new(t.takeover(stream.id, stream.session)));
        if let Some(trace) = &trace {
            trace.stamp(&mut headers);
        }
        let stream = Arc::new(stream.clone());
        let headers = Arc::new(headers);
        let relay = send::http::relay(self, upstream, session, stream, headers).traced(trace);
        tokio::spawn(relay.resume_after_restart(mark.clone()));
        true
    }
}

/// Reads a request body of at most `max_body` bytes within
/// `limits.body_read_timeout_ms`: a larger one is refused with 413 before it
/// is read whole, and one that stalls (or trickles) with 408, so a client
/// cannot hold a request open by never finishing its body.
pub async fn read_body(body: Incoming, config: &Config) -> Result<Bytes, Rejection> {
    let limit = config.max_body;
    let within = config.limits.body_read_timeout();
    let read = tokio::time::timeout(within, Limited::new(body, limit).collect());
    match read.await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(Rejection::payload_too_large(limit))
        }
        Ok(Err(e)) => Err(Rejection::unreadable_body(e)),
        Err(_) => Err(Rejection::body_timeout(within)),
    }
}
