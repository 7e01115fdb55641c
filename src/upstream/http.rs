//! Streamable HTTP upstreams: a pooled hyper client (HTTP/1.1 and HTTP/2,
//! rustls on ring for https, trusting the webpki roots and the upstream's
//! `ca_file`), and [`Messages`], which turns an upstream
//! response body — `text/event-stream` or `application/json`, chunked or with
//! a Content-Length — into upstream messages as they arrive, never waiting for
//! the whole body of a stream. Which replica a request goes to is
//! `replicas.rs`'s; how each is reached and kept, `reach.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{HeaderMap, Method, Request, Response, Uri};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio_util::sync::DropGuard;

use super::reach::{self, HttpReplica, Via};
use super::replicas::{Binding, InFlight, Replicas};
use super::{headers, UpstreamError};
use crate::config::UpstreamConfig;
use crate::metrics::ReplicaMeter;
use crate::reply::sse;
use crate::tls::outbound::error_chain;

/// Largest single upstream message the proxy will log (64 MiB).
pub const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// Most messages appended to the log in one batch.
const MAX_BATCH: usize = 512;

pub struct HttpUpstream {
    pub config: UpstreamConfig,
    /// Where requests go: the one `url`, the replicas of `urls`, or the
    /// addresses of a resolved host.
    replicas: Arc<Replicas<Via>>,
    /// Stops the look-ups and health checks when the upstream goes (a
    /// reload replaced it, the proxy stopped).
    _background: DropGuard,
}

/// What a response of an HTTP upstream carries in its extensions: the
/// replica that answered (for the session it opened), and its count in
/// flight, held while the body is read.
#[derive(Clone)]
struct Served {
    replica: Option<String>,
    _in_flight: InFlight,
}

/// The replica that answered `res`, for the record of a session that `res`
/// opened (none with a single replica).
pub fn served_by<B>(res: &Response<B>) -> Option<String> {
    res.extensions().get::<Served>()?.replica.clone()
}

impl HttpUpstream {
    /// The upstream `config` describes; its replicas' series are made with
    /// `meter`. A `resolve = "each"` host is looked up now, and must have
    /// an address; the look-ups that follow and the health checks run on
    /// the current runtime (none without one).
    pub fn new(
        config: &UpstreamConfig,
        workers: usize,
        meter: ReplicaMeter,
    ) -> Result<Self, String> {
        let (replicas, background) = reach::replicas(config, workers, meter)?;
        Ok(Self {
            config: config.clone(),
            replicas,
            _background: background,
        })
    }

    pub fn replicas(&self) -> &Replicas<Via> {
        &self.replicas
    }

    /// Sends one request upstream with the client's end-to-end headers and
    /// the upstream's own session id, to the replica holding that session.
    /// A request bound to no replica that cannot reach the one chosen goes
    /// to another: nothing was sent, and any replica will do for it.
    pub async fn send(
        &self,
        method: Method,
        client_headers: &HeaderMap,
        body: Bytes,
        to: &Binding,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let chosen = self.replicas.route(to);
        let session = to.session.as_deref();
        let sent = self
            .send_at(
                &chosen,
                method.clone(),
                client_headers,
                body.clone(),
                session,
            )
            .await;
        match sent {
            Err(UpstreamError::NoConnection(_)) if to.replica.is_none() && session.is_none() => {
                let other = self.replicas.least_busy(Some(&chosen.name));
                if Arc::ptr_eq(&other, &chosen) {
                    return sent;
                }
                self.send_at(&other, method, client_headers, body, session)
                    .await
            }
            sent => sent,
        }
    }

    /// Sends one request to replica `at`.
    pub async fn send_at(
        &self,
        at: &Arc<HttpReplica>,
        method: Method,
        client_headers: &HeaderMap,
        body: Bytes,
        upstream_session: Option<&str>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let headers = headers::to_upstream(client_headers, upstream_session);
        let url = at.url.clone();
        self.exchange(at, method, url, headers, body).await
    }

    /// One request to replica `at` on this upstream's pooled client; its
    /// outcome counts toward the replica's health.
    async fn exchange(
        &self,
        at: &Arc<HttpReplica>,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        *req.headers_mut() = headers;
        let in_flight = at.start();
        let sent = at.via.get().request(req).await;
        let mut res = match sent {
            Ok(res) => res,
            Err(e) => {
                let why = error_chain(&e);
                self.replicas.failed(at, &why);
                return Err(if e.is_connect() {
                    UpstreamError::NoConnection(why)
                } else {
                    UpstreamError::Connect(why)
                });
            }
        };
        match res.status().as_u16() {
            502..=504 => self.replicas.failed(at, res.status().as_str()),
            _ => self.replicas.succeeded(at),
        }
        res.extensions_mut().insert(Served {
            replica: self.replicas.name_of(at),
            _in_flight: in_flight,
        });
        Ok(res)
    }

    /// A request bound to `to` waited too long for its replica: a failure
    /// of that replica (a request of no replica yet blames none).
    pub fn timed_out(&self, to: &Binding, why: &str) {
        if let Some(at) = to.replica.as_deref().and_then(|n| self.replicas.named(n)) {
            self.replicas.failed(&at, why);
        }
    }

    /// A stream from `replica` (named as [`Messages::replica`] names it)
    /// stayed silent past the idle timeout: a failure of that replica, as
    /// a request waiting too long for its head is. A request that merely
    /// outlived its deadline blames no replica: it was a long call.
    pub fn went_silent(&self, replica: Option<&str>, why: &str) {
        if why != IDLE {
            return;
        }
        if let Some(at) = replica.and_then(|n| self.replicas.named(n)) {
            self.replicas.failed(&at, why);
        }
    }

    /// Sends a request to another path of the upstream's origin (OAuth
    /// discovery, the upstream's own authorization endpoints, a CORS
    /// preflight): the path and query are the caller's, the scheme and
    /// authority always the upstream's, so no request target reaches
    /// another server. No session id: these paths know none.
    pub async fn send_to(
        &self,
        method: Method,
        path_and_query: &str,
        client_headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let at = self.replicas.least_busy(None);
        let mut parts = at.url.clone().into_parts();
        parts.path_and_query = Some(
            path_and_query
                .parse()
                .map_err(|e| UpstreamError::Connect(format!("{path_and_query:?}: {e}")))?,
        );
        let uri = Uri::from_parts(parts).map_err(|e| UpstreamError::Connect(e.to_string()))?;
        let headers = headers::to_upstream(client_headers, None);
        self.exchange(&at, method, uri, headers, body).await
    }

    /// Asks the upstream whether it accepts these client headers (a new
    /// credential) on its session: a `ping`, answered with a result. Only
    /// the answer to this ping counts; anything the upstream sends before
    /// it on the same stream is not logged (a ping carries no work).
    pub async fn accepts(
        &self,
        client_headers: &HeaderMap,
        to: &Binding,
        protocol_version: Option<&str>,
    ) -> Result<bool, UpstreamError> {
        const PING: &[u8] = br#"{"jsonrpc":"2.0","id":"mcp-resume-proxy:rebind","method":"ping"}"#;
        let mut headers = proxy_post_headers(client_headers);
        if let Some(value) = protocol_version.and_then(|v| http::HeaderValue::from_str(v).ok()) {
            headers.insert(headers::PROTOCOL_VERSION, value);
        }
        let res = self
            .send(Method::POST, &headers, Bytes::from_static(PING), to)
            .await?;
        if !res.status().is_success() {
            return Ok(false);
        }
        let mut messages = Messages::new(res);
        while let Some(batch) = messages.next_batch().await {
            for event in batch? {
                let Ok(envelope) = crate::jsonrpc::classify(&event.message) else {
                    continue;
                };
                let ours = envelope.id.as_ref().map(|id| id.as_json())
                    == Some("\"mcp-resume-proxy:rebind\"");
                if envelope.kind == crate::jsonrpc::Kind::Response && ours {
                    return Ok(!envelope.error);
                }
            }
        }
        Ok(false)
    }

    /// Reconnects to an upstream SSE stream after `last_event_id` (the
    /// upstream's own id), for upstreams that close streams early.
    pub async fn resume(
        &self,
        client_headers: &HeaderMap,
        to: &Binding,
        last_event_id: &str,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut headers = client_headers.clone();
        headers.remove(http::header::CONTENT_TYPE);
        headers.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("text/event-stream"),
        );
        let value = http::HeaderValue::from_str(last_event_id)
            .map_err(|e| UpstreamError::Broken(e.to_string()))?;
        let mut headers = headers::to_upstream(&headers, to.session.as_deref());
        headers.insert(headers::LAST_EVENT_ID, value);
        let at = self.replicas.route(to);
        let url = at.url.clone();
        self.exchange(&at, Method::GET, url, headers, Bytes::new())
            .await
    }
}

/// Why a request's wait on its upstream ran out.
const IDLE: &str = "no message from the upstream within its idle timeout";
const DEADLINE: &str = "the request passed its deadline";

impl HttpUpstream {
    /// How long the next wait on the upstream may last for a request
    /// created at `created_ms`, and why it would end: the idle timeout or
    /// what is left of the request deadline, whichever is shorter. `None`
    /// when neither is configured.
    /// `quiet_for` is how long the upstream has already been silent (a
    /// silent stream asked again is no less silent for it).
    pub fn patience(
        &self,
        created_ms: u64,
        quiet_for: Duration,
    ) -> Option<(Duration, &'static str)> {
        let quiet_ms = u64::try_from(quiet_for.as_millis()).unwrap_or(u64::MAX);
        let idle = (self.config.idle_timeout_ms).map(|ms| (ms.saturating_sub(quiet_ms), IDLE));
        let left = self.config.request_timeout_ms.map(|ms| {
            let elapsed = crate::store::now_ms().saturating_sub(created_ms);
            (ms.saturating_sub(elapsed), DEADLINE)
        });
        [idle, left]
            .into_iter()
            .flatten()
            .min_by_key(|(ms, _)| *ms)
            .map(|(ms, why)| (Duration::from_millis(ms), why))
    }
}

/// Waits on `work` as long as `patience` allows.
pub async fn within<T>(
    patience: Option<(Duration, &'static str)>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, &'static str> {
    match patience {
        Some((limit, why)) => tokio::time::timeout(limit, work).await.map_err(|_| why),
        None => Ok(work.await),
    }
}

impl HttpUpstream {
    /// Tells the upstream to stop working on request `id` (a proxy-originated
    /// `notifications/cancelled`: abandonment, overflow). Best effort: the
    /// outcome is logged, not returned — the stream already ended.
    pub async fn cancel(
        &self,
        client_headers: &HeaderMap,
        to: &Binding,
        id: &crate::jsonrpc::RequestId,
        reason: &str,
    ) {
        let body = crate::jsonrpc::cancellation(id, reason);
        let headers = proxy_post_headers(client_headers);
        match self.send(Method::POST, &headers, body.into(), to).await {
            Ok(res) if res.status().is_success() => {
                tracing::debug!(request = id.as_json(), "upstream request cancelled")
            }
            Ok(res) => {
                tracing::info!(request = id.as_json(), status = %res.status(), "upstream refused a cancellation")
            }
            Err(e) => {
                tracing::info!(request = id.as_json(), error = %e, "cannot send a cancellation upstream")
            }
        }
    }
}

impl HttpUpstream {
    /// Opens a new upstream session on replica `at` with a client's logged
    /// `initialize` request, then sends `notifications/initialized`: the
    /// handshake the client made once, made again for an upstream that
    /// forgot it (it restarted) or a replica that stopped answering.
    /// Returns the new binding (no session id for an upstream without
    /// sessions).
    pub async fn initialize(
        &self,
        client_headers: &HeaderMap,
        initialize: Bytes,
        at: &Arc<HttpReplica>,
    ) -> Result<Binding, UpstreamError> {
        let headers = proxy_post_headers(client_headers);
        let res = self
            .send_at(at, Method::POST, &headers, initialize, None)
            .await?;
        if !carries_messages(&res) {
            return Err(UpstreamError::Refused(res.status().as_u16()));
        }
        let session = headers::get_str(res.headers(), &headers::SESSION_ID).map(str::to_owned);
        // The result itself is of no use (the client has the first one),
        // but the handshake is only done once it came.
        let mut messages = Messages::new(res);
        loop {
            match messages.next_batch().await {
                Some(Ok(batch)) => {
                    if batch
                        .iter()
                        .any(|e| !crate::jsonrpc::response_ids(&e.message).is_empty())
                    {
                        break;
                    }
                }
                Some(Err(e)) => return Err(e),
                None => return Err(UpstreamError::Broken("no initialize result".into())),
            }
        }
        let initialized =
            Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        let res = self
            .send_at(at, Method::POST, &headers, initialized, session.as_deref())
            .await?;
        if !res.status().is_success() {
            return Err(UpstreamError::Refused(res.status().as_u16()));
        }
        let replica = self.replicas.name_of(at);
        Ok(Binding { session, replica })
    }
}

/// The headers of a POST the proxy makes on its own (a cancellation, a
/// renewed handshake): the client's end-to-end headers — the upstream may
/// want its credentials — with the content negotiation a POST needs.
fn proxy_post_headers(client_headers: &HeaderMap) -> HeaderMap {
    let mut headers = client_headers.clone();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static("application/json, text/event-stream"),
    );
    headers
}

/// Whether a response carries messages the proxy can log (as opposed to a
/// status and body it must pass through unchanged).
pub fn carries_messages(res: &Response<Incoming>) -> bool {
    res.status().is_success()
        && (headers::has_media_type(res.headers(), "text/event-stream")
            || headers::has_media_type(res.headers(), "application/json"))
}

enum Framing {
    Sse(sse::Decoder),
    Json(BytesMut),
}

/// One upstream message, with the SSE event id it came with (none for a
/// JSON body, or an event without an `id` field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamEvent {
    pub id: Option<String>,
    pub message: Bytes,
}

impl UpstreamEvent {
    fn bare(message: Bytes) -> Self {
        Self { id: None, message }
    }
}

/// The upstream messages of one response body, in order.
pub struct Messages {
    body: Incoming,
    /// Counts the request in flight on its replica while its body is read.
    served: Option<Served>,
    framing: Framing,
    /// The id of the latest event that carried no message (a priming
    /// event); messages carry their own ids.
    pub priming_id: Option<String>,
    /// The upstream's `retry:` advice, in milliseconds.
    pub retry_ms: Option<u64>,
    /// Complete messages not yet handed out.
    ready: Vec<UpstreamEvent>,
    /// The body broke; reported once `ready` is drained.
    broken: Option<UpstreamError>,
    finished: bool,
    /// An event id arrived with no message (a priming event) since the last
    /// batch: worth a batch of its own, so that it is logged as the upstream
    /// mark and a restart right after can resume the upstream from it.
    id_alone: bool,
}

impl Messages {
    pub fn new(mut res: Response<Incoming>) -> Self {
        let served = res.extensions_mut().remove::<Served>();
        let framing = if headers::has_media_type(res.headers(), "text/event-stream") {
            Framing::Sse(sse::Decoder::new())
        } else {
            Framing::Json(BytesMut::new())
        };
        Self {
            body: res.into_body(),
            served,
            framing,
            priming_id: None,
            retry_ms: None,
            ready: Vec::new(),
            broken: None,
            finished: false,
            id_alone: false,
        }
    }

    /// The replica this body comes from, when records name replicas.
    pub fn replica(&self) -> Option<&str> {
        self.served.as_ref()?.replica.as_deref()
    }

    pub fn is_sse(&self) -> bool {
        matches!(self.framing, Framing::Sse(_))
    }

    /// The messages that arrived since the last call, at least one (waiting
    /// for it if need be) and everything else already received — so that
    /// while the log flushes one batch, the next one accumulates. Empty when
    /// only a new event id arrived (a priming event). `None` once
    /// the body ended cleanly; a broken body is reported after the messages
    /// that arrived before the break.
    pub async fn next_batch(&mut self) -> Option<Result<Vec<UpstreamEvent>, UpstreamError>> {
        while self.ready.is_empty() && !self.id_alone {
            if let Some(e) = self.broken.take() {
                return Some(Err(e));
            }
            if self.finished {
                return None;
            }
            let frame = self.body.frame().await;
            self.take_frame(frame);
        }
        while self.ready.len() < MAX_BATCH && !self.finished {
            match self.body.frame().now_or_never() {
                Some(frame) => self.take_frame(frame),
                None => break,
            }
        }
        self.id_alone = false;
        Some(Ok(std::mem::take(&mut self.ready)))
    }

    fn take_frame(&mut self, frame: Option<Result<Frame<Bytes>, hyper::Error>>) {
        match frame {
            None => {
                self.finished = true;
                if let Framing::Json(buf) = &mut self.framing {
                    if !buf.iter().all(u8::is_ascii_whitespace) {
                        let body = std::mem::take(buf).freeze();
                        self.ready.push(UpstreamEvent::bare(body));
                    }
                }
            }
            Some(Err(e)) => {
                self.finished = true;
                self.broken = Some(UpstreamError::Broken(error_chain(&e)));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    if let Err(e) = self.absorb(&data) {
                        self.finished = true;
                        self.broken = Some(e);
                    }
                }
            }
        }
    }

    /// Feeds body bytes to the framing; complete messages go to `ready`.
    fn absorb(&mut self, data: &[u8]) -> Result<(), UpstreamError> {
        match &mut self.framing {
            Framing::Json(buf) => {
                if buf.len() + data.len() > MAX_MESSAGE {
                    return Err(UpstreamError::TooLarge(MAX_MESSAGE));
                }
                buf.extend_from_slice(data);
            }
            Framing::Sse(decoder) => {
                decoder.push(data);
                while let Some(event) = decoder.next_event() {
                    if event.retry.is_some() {
                        self.retry_ms = event.retry;
                    }
                    // Priming events and empty data carry no message.
                    if !event.data.iter().all(u8::is_ascii_whitespace) {
                        self.ready.push(UpstreamEvent {
                            id: event.id,
                            message: event.data,
                        });
                    } else if event.id.is_some() {
                        self.priming_id = event.id;
                        self.id_alone = true;
                    }
                }
                if decoder.buffered() > MAX_MESSAGE {
                    return Err(UpstreamError::TooLarge(MAX_MESSAGE));
                }
            }
        }
        Ok(())
    }
}
