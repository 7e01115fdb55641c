//! The front door: one accepted connection, from the TCP socket to hyper.
//! It runs the TLS handshake in the connection's own task (so a slow or
//! hostile handshake never holds up the accept loop), bounds the time to the
//! first request head, configures hyper's limits on request heads (size, and
//! the HTTP/1 read timeout for later heads), and sets the principal of a
//! verified client certificate on every request of its connection.
//!
//! It knows nothing of routes or sessions: requests go to a [`Handler`] (the
//! app, in `server/mod.rs`).
//! Bodies are bounded where they are read (`proxy::read_body`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::access::Metered;
use crate::config::Config;
use crate::edge::origin::Peer;
use crate::tls::CertificatePrincipal;

/// What serves the requests of every connection.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    async fn handle(&self, req: Request<Incoming>, peer: Peer) -> http::Response<Metered>;
}

/// hyper refuses an HTTP/1 read buffer smaller than this (it panics).
const HYPER_MIN_BUF: usize = 8192;

/// How every connection is served.
pub struct FrontDoor {
    app: Arc<dyn Handler>,
    tls: Option<TlsAcceptor>,
    http: auto::Builder<TokioExecutor>,
    /// From accept to the first request head: TLS handshake, protocol
    /// detection and the head itself.
    first_head_within: Duration,
    /// How long open connections get to finish at shutdown.
    pub grace: Duration,
}

impl FrontDoor {
    pub fn new(app: Arc<dyn Handler>, tls: Option<TlsAcceptor>, config: &Config) -> Self {
        let limits = &config.limits;
        let mut http = auto::Builder::new(TokioExecutor::new());
        http.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout())
            // The read buffer is where a head must fit: past it hyper
            // answers 431 and closes. Bodies stream through it.
            .max_buf_size(limits.max_header_bytes.max(HYPER_MIN_BUF));
        http.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
        Self {
            app,
            tls,
            http,
            first_head_within: limits.header_read_timeout(),
            grace: Duration::from_secs(config.shutdown_grace_secs),
        }
    }

    /// Serves one connection to its end. `watcher` lets graceful shutdown
    /// wait for it once it is serving HTTP.
    pub async fn serve(self: Arc<Self>, socket: TcpStream, peer: SocketAddr, watcher: Watcher) {
        let deadline = Instant::now() + self.first_head_within;
        match &self.tls {
            None => {
                self.serve_http(TokioIo::new(socket), None, deadline, peer, watcher)
                    .await
            }
            // Boxed (see "Memory per open stream" in the crate docs): inline,
            // TLS state would cost every plain connection 3.5 KiB.
            Some(tls) => Box::pin(self.serve_tls(tls, socket, deadline, peer, watcher)).await,
        }
    }

    async fn serve_tls(
        &self,
        tls: &TlsAcceptor,
        socket: TcpStream,
        deadline: Instant,
        peer: SocketAddr,
        watcher: Watcher,
    ) {
        let stream = match tokio::time::timeout_at(deadline, tls.accept(socket)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        };
        let principal = CertificatePrincipal::of(stream.get_ref().1);
        self.serve_http(TokioIo::new(stream), principal, deadline, peer, watcher)
            .await
    }

    async fn serve_http<I>(
        &self,
        io: I,
        principal: Option<CertificatePrincipal>,
        deadline: Instant,
        peer: SocketAddr,
        watcher: Watcher,
    ) where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let first_request = Arc::new(Notify::new());
        let from = Peer {
            addr: peer,
            tls: principal.is_some() || self.tls.is_some(),
        };
        let service = {
            let app = self.app.clone();
            let first_request = first_request.clone();
            hyper::service::service_fn(move |mut req: Request<Incoming>| {
                first_request.notify_one();
                if let Some(principal) = &principal {
                    req.extensions_mut().insert(principal.clone());
                }
                let app = app.clone();
                async move { Ok::<_, Infallible>(app.handle(req, from).await) }
            })
        };
        let conn = watcher.watch(self.http.serve_connection(io, service).into_owned());
        tokio::pin!(conn);
        tokio::select! {
            ended = &mut conn => {
                if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            }
            // hyper's own head timeout starts only after protocol detection,
            // which waits for bytes without a limit: this one covers both.
            () = no_request_by(deadline, &first_request) => {
                tracing::debug!(%peer, "no request head in time; connection closed");
            }
        }
    }
}

/// Resolves if `deadline` passes before the first request arrived; never
/// after it arrived.
async fn no_request_by(deadline: Instant, first_request: &Notify) {
    if tokio::time::timeout_at(deadline, first_request.notified())
        .await
        .is_ok()
    {
        std::future::pending::<()>().await;
    }
}
