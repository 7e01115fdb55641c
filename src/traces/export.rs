//! The HTTP client spans are exported with: the proxy's own hyper client
//! and rustls connector (webpki roots, as for an https upstream), so no
//! second HTTP stack comes along with OpenTelemetry.
//!
//! The SDK's batch span processor runs on a thread of its own and polls an
//! export with a plain executor (`block_on`), where hyper — whose
//! connections are tokio tasks — cannot run. So each request is handed to
//! the runtime the proxy started on, and only its answer is awaited on the
//! batch thread: no export runs on a request's path or a worker's thread.
//! It must not retry or interpret an answer: the OTLP exporter does.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client as Pool;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};
use tokio::runtime::Handle;

use crate::tls::outbound::{self, Connector};

/// Largest collector answer read (an `ExportTraceServiceResponse` is a
/// few bytes; the OTLP exporter's own clients stop at 4 MiB).
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// Longest wait for a connection to the collector.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An `opentelemetry_http::HttpClient` on the proxy's hyper client.
pub struct Client {
    runtime: Handle,
    pool: Pool<Connector, Full<Bytes>>,
    /// The whole exchange, answer included.
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client whose requests run on `runtime`, each given `timeout`.
    pub fn new(runtime: Handle, timeout: Duration) -> Result<Self, String> {
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
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (pool, timeout) = (self.pool.clone(), self.timeout);
        let exchange = async move {
            let res = pool.request(request.map(Full::new)).await?;
            let (head, body) = res.into_parts();
            let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(head, body))
        };
        // The timer too is the runtime's: made on the batch thread, it
        // would find none.
        let timed = async move { tokio::time::timeout(timeout, exchange).await };
        match self.runtime.spawn(timed).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(format!("no answer within {:?}", self.timeout).into()),
            Err(e) => Err(format!("the export did not run: {e}").into()),
        }
    }
}
