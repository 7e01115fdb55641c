//! The span exporter: each batch the SDK's batch processor hands over is
//! encoded ([`super::encode`]) and POSTed to the collector's traces URL as
//! OTLP/HTTP protobuf, over the proxy's own hyper client and rustls
//! connector (webpki roots, as for an https upstream), so no second HTTP
//! stack comes along with OpenTelemetry.
//!
//! The batch processor runs on a thread of its own and polls an export
//! with a plain executor (`block_on`), where hyper — whose connections are
//! tokio tasks — cannot run, nor a tokio timer. So each export, its
//! retries included, is handed to the runtime the proxy started on, and
//! only its outcome is awaited on the batch thread: no export runs on a
//! request's path or a worker's thread.
//!
//! An answer the collector may take back later (429, 502, 503, 504, or no
//! answer at all) is retried as the OTLP specification says — after its
//! `Retry-After` when it gives one, else after an exponential back-off —
//! within the export's time limit; any other non-2xx answer drops the
//! batch, which the SDK logs. It decides nothing about which spans exist.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client as Pool;
use hyper_util::rt::TokioExecutor;
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::config::traces::ExportHeader;
use crate::tls::outbound::{self, Connector};

/// Largest collector answer read (an `ExportTraceServiceResponse` is a
/// few bytes; the OTLP exporter's own clients stop at 4 MiB).
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// Longest wait for a connection to the collector.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Tries after the first, and the back-off before the first of them
/// (doubled each time, at most [`LONGEST_BACKOFF`]).
const RETRIES: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const LONGEST_BACKOFF: Duration = Duration::from_millis(1600);

/// Exports batches of spans to one collector.
pub struct Exporter {
    runtime: Handle,
    pool: Pool<Connector, Full<Bytes>>,
    url: Uri,
    /// Sent with every export (`OTEL_EXPORTER_OTLP_HEADERS`).
    headers: Arc<[ExportHeader]>,
    /// The whole export, retries included.
    timeout: Duration,
    /// The resource every span comes from (the provider sets it).
    resource: Arc<[KeyValue]>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Exporter {
    /// An exporter to `url` (the traces URL, `/v1/traces` included) whose
    /// requests, carrying `headers`, run on `runtime`, each export given
    /// `timeout`.
    pub fn new(
        runtime: Handle,
        url: &str,
        headers: Vec<ExportHeader>,
        timeout: Duration,
    ) -> Result<Self, String> {
        let url: Uri = url.parse().map_err(|e| format!("{e}"))?;
        if !matches!(url.scheme_str(), Some("http" | "https")) || url.host().is_none() {
            return Err("not an http:// or https:// URL".into());
        }
        let tls = crate::tls::upstream_client("tracing.otlp_endpoint", None)
            .map_err(|e| e.to_string())?;
        let connector = outbound::connector(tls, CONNECT_TIMEOUT);
        // Built inside the runtime: the pool's idle-connection reaper is
        // one of its tasks.
        let _entered = runtime.enter();
        let pool = Pool::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(Self {
            runtime,
            pool,
            url,
            headers: headers.into(),
            timeout,
            resource: Arc::from([]),
        })
    }
}

impl SpanExporter for Exporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut body = Vec::with_capacity(batch.len() * 256 + 256);
        super::encode::request(&self.resource, &batch, &mut body);
        drop(batch);
        let send = Send {
            pool: self.pool.clone(),
            url: self.url.clone(),
            headers: self.headers.clone(),
            body: Bytes::from(body),
            deadline: Instant::now() + self.timeout,
        };
        match self.runtime.spawn(send.with_retries()).await {
            Ok(outcome) => outcome.map_err(OTelSdkError::InternalFailure),
            Err(e) => Err(OTelSdkError::InternalFailure(format!(
                "the export did not run: {e}"
            ))),
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
    }
}

/// One export's request, sent until it is taken or its time is up.
struct Send {
    pool: Pool<Connector, Full<Bytes>>,
    url: Uri,
    headers: Arc<[ExportHeader]>,
    body: Bytes,
    deadline: Instant,
}

/// Why one try failed, and whether another may succeed.
enum Failed {
    /// Try again, after the collector's `Retry-After` if it gave one.
    Retry(String, Option<Duration>),
    Final(String),
}

impl Send {
    async fn with_retries(self) -> Result<(), String> {
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 0;
        loop {
            let (why, after) = match tokio::time::timeout_at(self.deadline, self.once()).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(Failed::Final(why))) => return Err(why),
                Ok(Err(Failed::Retry(why, after))) => (why, after),
                Err(_) => return Err(format!("no answer from {} in time", self.url)),
            };
            let wait = after.unwrap_or(backoff);
            if tries == RETRIES || Instant::now() + wait >= self.deadline {
                return Err(why);
            }
            tries += 1;
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(LONGEST_BACKOFF);
        }
    }

    async fn once(&self) -> Result<(), Failed> {
        let mut request = Request::post(self.url.clone())
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-protobuf"),
            )
            .body(Full::new(self.body.clone()))
            .map_err(|e| Failed::Final(e.to_string()))?;
        for (name, value) in self.headers.iter() {
            request.headers_mut().append(name.clone(), value.clone());
        }
        let answer = match self.pool.request(request).await {
            Ok(answer) => answer,
            Err(e) => return Err(Failed::Retry(format!("{}: {e}", self.url), None)),
        };
        let status = answer.status();
        let after = retry_after(answer.headers());
        // Read to the end (bounded), so that the connection can be reused.
        let _ = Limited::new(answer.into_body(), MAX_ANSWER).collect().await;
        if status.is_success() {
            return Ok(());
        }
        let why = format!("{} answered {status}", self.url);
        match status {
            StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => Err(Failed::Retry(why, after)),
            _ => Err(Failed::Final(why)),
        }
    }
}

/// A `Retry-After` given in seconds (the form collectors send).
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let seconds = headers.get(header::RETRY_AFTER)?.to_str().ok()?;
    seconds.trim().parse().ok().map(Duration::from_secs)
}
