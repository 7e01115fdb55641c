//! The HTTP front: the accept loop (HTTP/1.1 and HTTP/2, plain or TLS; each
//! connection is then served by [`crate::front_door`]), the routes
//! (`/healthz` and one mount per upstream), the `Origin` check every MCP
//! server must make against DNS rebinding, and graceful shutdown.
//!
//! Start-up order matters and lives here: open the log, recover what a
//! previous process left live, and only then accept connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Backend, Config};
use crate::front_door::{FrontDoor, Handler};
use crate::lifetime::{Recovered, Resumer};
use crate::proxy::{Rejection, Route, Shared};
use crate::reply::{self, Body};
use crate::session::Sessions;
use crate::store::journal::Journal;
use crate::store::redis::{Lifetimes, RedisStore};
use crate::store::sled::SledStore;
use crate::store::{SharedStore, StreamMeta};
use crate::stream::Log;
use crate::token::Keyring;
use crate::upstream::http::HttpUpstream;
use crate::upstream::stdio::StdioUpstream;
use crate::upstream::Upstream;
use crate::workers::Workers;

/// Everything a request needs, built once at start-up.
pub struct App {
    routes: Vec<Route>,
    shared: Arc<Shared>,
}

impl App {
    /// Opens the log under the data dir and recovers orphaned streams.
    pub async fn open(config: Config) -> anyhow::Result<Arc<App>> {
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            anyhow::anyhow!("cannot create data_dir {}: {e}", config.data_dir.display())
        })?;
        let tokens = &config.tokens;
        let previous = tokens.previous_key_file.as_deref().map(|file| {
            let window = tokens.previous_key_window_secs.saturating_mul(1000);
            (file, crate::store::now_ms().saturating_add(window))
        });
        let keyring = Keyring::load(&config.data_dir, tokens.key_file.as_deref(), previous)
            .map_err(|e| anyhow::anyhow!("cannot load the token key: {e}"))?;
        // Connections the workers keep for themselves: Redis and upstream.
        let workers = config.workers();
        let store: SharedStore = match config.store.backend {
            Backend::Journal => Journal::open(&config.data_dir, config.store.sync)?,
            Backend::Sled => Arc::new(SledStore::open(&config.data_dir, config.store.sync)?),
            Backend::Redis => {
                let store = &config.store;
                let lease = Duration::from_millis(store.lease_ms);
                let lifetimes = Lifetimes::mirror(
                    Duration::from_secs(store.retention_secs),
                    Duration::from_secs(store.session_idle_secs),
                );
                let opened = RedisStore::open(&store.redis_url, &store.key_prefix, lease).await?;
                Arc::new(opened.with_lifetimes(lifetimes).with_workers(workers))
            }
        };
        let log = Log::new(store);
        let sessions = Sessions::new(log.store().clone());
        let shared = Arc::new(Shared {
            config,
            log,
            sessions,
            keyring,
            draining: CancellationToken::new(),
        });
        let routes = shared
            .config
            .upstream
            .iter()
            .map(|up| {
                let upstream = match up.command {
                    Some(_) => {
                        Upstream::Stdio(Arc::new(StdioUpstream::new(up, &shared.config.limits)))
                    }
                    None => Upstream::Http(Arc::new(
                        HttpUpstream::new(up, workers).map_err(anyhow::Error::msg)?,
                    )),
                };
                let mut dialects = shared.config.dialects.clone();
                dialects.resume_tokens = up.resume_tokens.clone();
                dialects.tasks = up.tasks.clone();
                Ok(Route {
                    path: up.path.trim_end_matches('/').to_owned(),
                    upstream,
                    dialects,
                    tasks: Default::default(),
                    shared: shared.clone(),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        // A stdio child cannot outlive the process that ran it: sessions of
        // stdio routes from a previous run are closed (404, re-initialize).
        let stdio_paths: Vec<&str> = routes
            .iter()
            .filter(|r| matches!(r.upstream, Upstream::Stdio(_)))
            .map(|r| r.path.as_str())
            .collect();
        for record in shared.log.store().list_sessions().await? {
            if record.closed_ms.is_none() && stdio_paths.contains(&record.route.as_str()) {
                shared.sessions.close(record.id).await?;
            }
        }
        let app = Arc::new(App { routes, shared });
        let recovered = crate::lifetime::recover(&app.shared.log, app.as_ref()).await?;
        if recovered != Recovered::default() {
            tracing::warn!(
                resumed = recovered.resumed,
                finished = recovered.finished,
                "streams a previous run left live"
            );
        }
        app.shared
            .log
            .metrics()
            .recovered(recovered.resumed + recovered.finished);
        Ok(app)
    }

    fn route_of(&self, path: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.path == path)
    }

    /// Stops what runs on behalf of clients: stdio children.
    pub async fn stop_upstreams(&self) {
        for route in &self.routes {
            if let Upstream::Stdio(stdio) = &route.upstream {
                stdio.shutdown().await;
            }
        }
    }

    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path();
        if path == "/healthz" {
            return self.health();
        }
        if path == "/metrics" && self.shared.config.metrics {
            return self.metrics_page();
        }
        if !self.host_allowed(req.headers()) {
            return Rejection::forbidden("Host").into_response();
        }
        if let Some(origin) = req.headers().get(http::header::ORIGIN) {
            let allowed = origin
                .to_str()
                .is_ok_and(|o| origin_allowed(o, &self.shared.config.allowed_origins));
            if !allowed {
                return Rejection::forbidden("Origin").into_response();
            }
        }
        let path = path.trim_end_matches('/');
        match self.route_of(path) {
            Some(route) => route.handle(req).await,
            None => Rejection::not_found().into_response(),
        }
    }
}

impl App {
    /// `GET /healthz`: 503 once the log stopped after a failed flush, so
    /// that an orchestrator restarts the proxy (which recovers from what
    /// the disk holds) and a load balancer sends new calls elsewhere.
    fn health(&self) -> Response<Body> {
        if self.shared.log.store().flush_failed() {
            return reply::json(
                StatusCode::SERVICE_UNAVAILABLE,
                &b"{\"status\":\"failing\",\"reason\":\"a log flush failed; restart the proxy\"}"[..],
            );
        }
        reply::json(StatusCode::OK, &b"{\"status\":\"ok\"}"[..])
    }

    /// `GET /metrics`: the exposition, with the gauges counted now.
    fn metrics_page(&self) -> Response<Body> {
        let log = &self.shared.log;
        let text = log
            .metrics()
            .render(self.shared.sessions.open(), log.live_streams());
        let mut res = Response::new(reply::full(text));
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        );
        res
    }
}

/// The front door hands every request to the app.
#[async_trait::async_trait]
impl Handler for App {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        App::handle(self, req).await
    }
}

/// Abandoned requests are cancelled by the route that forwarded them.
#[async_trait::async_trait]
impl crate::lifetime::Canceller for App {
    async fn cancel(&self, stream: &StreamMeta, why: &str) {
        let Ok(Some(session)) = self.shared.log.store().get_session(stream.session).await else {
            return;
        };
        if let Some(route) = self.route_of(&session.route) {
            route.cancel(stream, why).await;
        }
    }
}

/// Streams left live by a previous process are resumed by the route that
/// forwarded them.
#[async_trait::async_trait]
impl Resumer for App {
    async fn resume(&self, stream: &StreamMeta) -> bool {
        let Ok(Some(session)) = self.shared.log.store().get_session(stream.session).await else {
            return false;
        };
        match self.route_of(&session.route) {
            Some(route) => route.resume_after_restart(stream).await,
            None => false,
        }
    }
}

impl App {
    /// DNS-rebinding protection: on a loopback listener only localhost
    /// names reach the upstreams, unless more are configured.
    fn host_allowed(&self, headers: &http::HeaderMap) -> bool {
        let config = &self.shared.config;
        if config.allowed_hosts.is_empty() && !config.listen.ip().is_loopback() {
            return true;
        }
        let Some(host) = headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
        else {
            // HTTP/2 carries the authority in the URI, not a Host header.
            return true;
        };
        host_allowed(host, &config.allowed_hosts)
    }
}

/// Localhost hosts (any port) are always allowed; others only when listed,
/// as `host` (any port) or `host:port`.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    // A slice of `host` but for a bracket left open (read as if closed).
    let name: std::borrow::Cow<'_, str> = match host.strip_prefix('[') {
        Some(v6) => match v6.find(']') {
            Some(end) => host[..end + 2].into(),
            None => format!("[{v6}]").into(),
        },
        None => host.split(':').next().unwrap_or_default().into(),
    };
    matches!(name.as_ref(), "localhost" | "127.0.0.1" | "[::1]")
        || allowed
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(&name))
}

/// Localhost origins are always allowed; others only when configured.
pub fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    if allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Ok(uri) = origin.parse::<http::Uri>() else {
        return false;
    };
    matches!(uri.scheme_str(), Some("http" | "https"))
        && matches!(
            uri.host(),
            Some("localhost" | "127.0.0.1" | "[::1]" | "::1")
        )
}

/// A running proxy.
pub struct Server {
    pub addr: SocketAddr,
    app: Arc<App>,
    stop: CancellationToken,
    workers: Arc<Workers>,
    done: tokio::task::JoinHandle<()>,
}

impl Server {
    /// The log this server writes (for tests and embedding).
    pub fn store(&self) -> &SharedStore {
        self.app.shared.log.store()
    }

    /// Binds, loads the TLS files, opens the log, and serves on the worker
    /// threads; what runs on no connection's behalf (the sweeper, takeover,
    /// streams recovered at start-up) stays on the caller's runtime.
    pub async fn start(config: Config) -> anyhow::Result<Server> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr()?;
        let grace = Duration::from_secs(config.shutdown_grace_secs);
        let store_config = config.store.clone();
        let store_lease_ms = config.store.lease_ms;
        let tls = config.tls.as_ref().map(crate::tls::acceptor).transpose()?;
        let limits = config.limits.clone();
        let workers = config.workers();
        let app = App::open(config).await?;
        let stop = CancellationToken::new();
        let sweeper = crate::lifetime::spawn_sweeper(
            app.shared.log.clone(),
            app.shared.sessions.clone(),
            store_config,
            app.clone(),
            stop.clone(),
        );
        if app.shared.log.store().shared() {
            // Other instances may die while this one serves: look for their
            // streams twice per lease, and at least every second (an
            // instance that stops gracefully gives its lease up at once).
            let every = Duration::from_millis(store_lease_ms / 2).min(Duration::from_secs(1));
            crate::lifetime::spawn_takeover(
                app.shared.log.clone(),
                app.clone(),
                every,
                stop.clone(),
            );
        }
        let front_door = Arc::new(FrontDoor::new(app.clone(), tls, &limits));
        let workers = Arc::new(Workers::start(workers)?);
        let done = tokio::spawn(accept_loop(
            listener,
            front_door,
            workers.clone(),
            stop.clone(),
            grace,
            sweeper,
        ));
        Ok(Server {
            addr,
            app,
            stop,
            workers,
            done,
        })
    }

    /// Shuts down gracefully: open SSE answers end with a `retry:` so their
    /// clients reconnect, no new connection is accepted, connections get
    /// the grace period to finish, stdio children are stopped, the log
    /// is flushed whatever its `sync` mode, and (for a shared log) the calls
    /// still running here are handed to the other instances.
    pub async fn shutdown(self) {
        self.app.shared.draining.cancel();
        self.stop.cancel();
        let _ = self.done.await;
        self.app.stop_upstreams().await;
        let store = self.app.shared.log.store();
        if let Err(e) = store.flush().await {
            tracing::error!(error = %e, "cannot flush the log at shutdown");
        }
        if let Err(e) = store.retire().await {
            tracing::error!(error = %e, "cannot hand this instance's calls over");
        }
        // The accept loop held the other reference; it is done.
        if let Some(workers) = Arc::into_inner(self.workers) {
            workers.finish().await;
        }
    }

    /// Serves until `signal` resolves, then shuts down.
    pub async fn run_until(self, signal: impl std::future::Future<Output = ()>) {
        signal.await;
        tracing::info!("shutting down");
        self.shutdown().await;
    }
}

/// Accepts until `stop` and hands each connection to a worker; returns
/// once the connections have ended or run out of grace.
async fn accept_loop(
    listener: TcpListener,
    front_door: Arc<FrontDoor>,
    workers: Arc<Workers>,
    stop: CancellationToken,
    grace: Duration,
    sweeper: tokio::task::JoinHandle<()>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let _ = socket.set_nodelay(true);
        // The handshake and everything after it happen in the connection's
        // task, on its worker: the loop only accepts.
        let socket = match socket.into_std() {
            Ok(socket) => socket,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "cannot hand a connection over");
                continue;
            }
        };
        let (front_door, watcher) = (front_door.clone(), graceful.watcher());
        workers.serve(async move {
            match tokio::net::TcpStream::from_std(socket) {
                Ok(socket) => front_door.serve(socket, peer, watcher).await,
                Err(e) => tracing::debug!(%peer, error = %e, "cannot serve a connection"),
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("grace period over; closing remaining connections");
    }
    sweeper.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_origins_are_allowed_by_default() {
        for o in [
            "http://localhost",
            "http://localhost:3000",
            "https://127.0.0.1:8443",
            "http://[::1]:8080",
        ] {
            assert!(origin_allowed(o, &[]), "{o}");
        }
    }

    #[test]
    fn only_localhost_hosts_pass_unless_configured() {
        for h in ["localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080"] {
            assert!(host_allowed(h, &[]), "{h}");
        }
        assert!(!host_allowed("evil.example", &[]));
        assert!(!host_allowed("evil.example:8080", &[]));
        let allowed = vec!["mcp.example.com".to_owned()];
        assert!(host_allowed("mcp.example.com:443", &allowed));
        assert!(host_allowed("anything", &["*".to_owned()]));
    }

    #[test]
    fn an_ipv6_host_is_named_by_its_brackets_even_left_open() {
        assert!(host_allowed("[::1]", &[]));
        assert!(host_allowed("[::1", &[]));
        assert!(!host_allowed("[::2]:80", &[]));
        assert!(host_allowed("[fe80::1]:80", &["[fe80::1]".to_owned()]));
    }

    #[test]
    fn foreign_origins_need_configuration() {
        assert!(!origin_allowed("https://evil.example", &[]));
        assert!(!origin_allowed("null", &[]));
        assert!(!origin_allowed("http://localhost.evil.example", &[]));
        let allowed = vec!["https://app.example.com".to_owned()];
        assert!(origin_allowed("https://app.example.com", &allowed));
        assert!(origin_allowed("https://evil.example", &["*".to_owned()]));
    }
}
