//! The HTTP front: the accept loop (HTTP/1.1 and HTTP/2, plain or TLS; each
//! connection is then served by [`front_door`]), the routes
//! (the probes of [`probes`], `/healthz` and one mount per upstream), the
//! `Origin` check every MCP server must make against DNS rebinding, and the
//! drain and graceful shutdown.
//!
//! Start-up order matters and lives here: bind and accept (the probes
//! answer from then on: live, not ready), open the log, recover what a
//! previous process left live, and only then serve requests.
//!
//! It answers no MCP message itself: a request for a mount goes to that
//! mount's [`Route`] (the proxy), unless the edge passes it to the
//! upstream's origin as plain HTTP.

mod configured;
pub mod front_door;
mod probes;
mod reload;

pub use self::reload::Refused;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use self::configured::{Configured, Lasting};
use self::front_door::FrontDoor;
use self::probes::Gate;
use crate::access::{self, Metered};
use crate::config::{Backend, Config};
use crate::edge;
use crate::edge::discovery::Passage;
use crate::edge::origin::{Arrival, Peer};
use crate::lifetime::{Recovered, Resumer};
use crate::metrics::requests::Destination;
use crate::proxy::{Rejection, Route};
use crate::reply::{self, Body};
use crate::session::Sessions;
use crate::store::journal::Journal;
use crate::store::redis::{Lifetimes, RedisStore};
use crate::store::sled::SledStore;
use crate::store::{SharedStore, StoreError, StreamKind, StreamMeta};
use crate::stream::Log;
use crate::traces::Tracer;
use crate::upstream::Upstream;
use crate::workers::Workers;

/// Everything a request needs: what the running configuration makes of
/// the proxy (swapped whole by a reload), and what outlives it.
pub struct App {
    configured: ArcSwap<Configured>,
    lasting: Lasting,
    /// A stop was asked for: `/readyz` answers 503 "draining" while
    /// everything else is served as before (`Lasting::draining` is the
    /// later step, when open answers end with a `retry:`).
    unready: AtomicBool,
}

impl App {
    /// Opens the log under the data dir (or takes `store`, opened by the
    /// caller) and recovers orphaned streams.
    pub async fn open(config: Config, store: Option<SharedStore>) -> anyhow::Result<Arc<App>> {
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            anyhow::anyhow!("cannot create data_dir {}: {e}", config.data_dir.display())
        })?;
        // Connections the workers keep for themselves: Redis and upstream.
        let workers = config.workers();
        let (dir, sync) = (config.data_dir.clone(), config.store.sync);
        let store: SharedStore = match (store, config.store.backend) {
            (Some(store), _) => store,
            (None, Backend::Journal) => blocking(move || Journal::open(&dir, sync)).await?,
            (None, Backend::Sled) => {
                let cache = config.store.sled_cache_bytes;
                Arc::new(blocking(move || SledStore::open_with_cache(&dir, sync, cache)).await?)
            }
            (None, Backend::Redis) => {
                let store = &config.store;
                let lifetimes = Lifetimes::mirror(
                    Duration::from_secs(store.retention_secs),
                    Duration::from_secs(store.session_idle_secs),
                );
                let lease = Duration::from_millis(store.lease_ms);
                let at = store.redis_endpoint();
                let opened = RedisStore::open_at(&at, &store.key_prefix, lease).await?;
                Arc::new(opened.with_lifetimes(lifetimes).with_workers(workers))
            }
        };
        store.set_retained_bound(config.limits.max_retained_streams);
        let log = Log::new(store);
        let sessions = Sessions::with_limits(log.store().clone(), &config.limits);
        let lasting = Lasting {
            log,
            sessions,
            draining: CancellationToken::new(),
            tracer: Tracer::start(&config.tracing)?,
        };
        let configured = Configured::build(config, &lasting, None)?;
        settle_sessions(&lasting, &configured.routes).await?;
        let app = Arc::new(App {
            configured: ArcSwap::from_pointee(configured),
            lasting,
            unready: AtomicBool::new(false),
        });
        let recovered = crate::lifetime::recover(&app.lasting.log, app.as_ref()).await?;
        if recovered != Recovered::default() {
            tracing::warn!(
                resumed = recovered.resumed,
                finished = recovered.finished,
                "streams a previous run left live"
            );
        }
        app.lasting
            .log
            .metrics()
            .recovered(recovered.resumed + recovered.finished);
        Ok(app)
    }

    /// What `/readyz` answers once the app is open: `Err` says why new
    /// requests should go elsewhere.
    fn readiness(&self) -> Result<(), String> {
        if self.unready.load(Ordering::Relaxed) {
            return Err("draining".into());
        }
        self.lasting.log.store().health()
    }

    /// What the running configuration makes of the proxy.
    fn now(&self) -> Arc<Configured> {
        self.configured.load_full()
    }

    /// Waits, until `deadline` at the latest, for the calls this process
    /// forwards that a next start (or another instance) could not pick up
    /// again: those whose upstream has not yet given an event id to resume
    /// from (or never will: a stdio child). Stopped before that, their
    /// upstream's answer would be lost and the call failed as of unknown
    /// outcome, though the upstream finished it.
    async fn settle_calls(&self, deadline: tokio::time::Instant) {
        let mut told = false;
        loop {
            let waiting = self.unresumable_calls().await;
            if waiting == 0 {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(calls = waiting, "grace period over; calls the upstream has not answered resumably will fail at the next start");
                return;
            }
            if !told {
                told = true;
                tracing::info!(
                    calls = waiting,
                    "waiting for calls to reach a point they can be resumed from"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many live calls of this process have no upstream event id to
    /// resume from.
    async fn unresumable_calls(&self) -> usize {
        let log = &self.lasting.log;
        let mut waiting = 0;
        for id in log.live_ids() {
            match log.meta(id).await {
                Ok(Some(meta))
                    if meta.kind == StreamKind::Request
                        && meta.status.is_live()
                        && meta.upstream.is_none() =>
                {
                    waiting += 1
                }
                _ => {}
            }
        }
        waiting
    }

    /// Stops what runs on behalf of clients: stdio children.
    pub async fn stop_upstreams(&self) {
        for route in &self.now().routes {
            if let Upstream::Stdio(stdio) = &route.upstream {
                stdio.shutdown().await;
            }
        }
    }

    /// One request, a visit from its arrival to the end of its answer's
    /// body (see [`crate::access`]).
    pub async fn handle(&self, req: Request<Incoming>, peer: Peer) -> Response<Metered> {
        let now = self.now();
        let visit = now.access.arrived(&req);
        let http1 = req.version() < http::Version::HTTP_2;
        let mut res = visit.scope(self.answer(&now, req, peer)).await;
        if http1 && self.unready.load(Ordering::Relaxed) {
            // Draining: the client's next request opens a new connection,
            // which the balancer gives to an instance that stays. (HTTP/2
            // connections get a GOAWAY when the shutdown starts.)
            let close = http::HeaderValue::from_static("close");
            res.headers_mut().insert(http::header::CONNECTION, close);
        }
        let status = res.status();
        res.map(|body| Metered::watched(body, visit, status))
    }

    /// One request through the edge: the paths that are not MCP (health,
    /// metrics), the checks of where it came from, then a discovery
    /// passage, a preflight or a route; its answer carries the public URL
    /// and CORS out.
    async fn answer(&self, now: &Configured, req: Request<Incoming>, peer: Peer) -> Response<Body> {
        let path = req.uri().path();
        if path == "/healthz" {
            access::note(|facts| facts.route = Destination::Health);
            return self.health();
        }
        if path == "/metrics" && now.shared.config.metrics {
            access::note(|facts| facts.route = Destination::Metrics);
            return self.metrics_page(now);
        }
        let (parts, body) = req.into_parts();
        let edge = &now.edge;
        let arrival = edge.origins.arrival(&parts, peer);
        if !edge.host_allowed(&arrival, now.shared.config.listen.ip().is_loopback()) {
            return Rejection::forbidden("Host").into_response();
        }
        let origin = parts.headers.get(http::header::ORIGIN).cloned();
        if origin.as_ref().is_some_and(|o| !edge.origin_allowed(o)) {
            return Rejection::forbidden("Origin").into_response();
        }
        let (route, mut res) = Self::dispatch(now, parts, body, &arrival).await;
        if let Some(i) = route {
            access::note(|facts| facts.route = Destination::Mount(i));
        }
        let reached = route.map(|i| (&edge.mounts[i], now.routes[i].http()));
        edge.outgoing(&mut res, reached, &arrival, origin.as_ref())
            .await;
        res
    }

    /// The answer, and the route (by index) that gave it.
    async fn dispatch(
        now: &Configured,
        parts: http::request::Parts,
        body: Incoming,
        arrival: &Arrival,
    ) -> (Option<usize>, Response<Body>) {
        let preflight = edge::cors::is_preflight(&parts.method, &parts.headers);
        if let (true, Some(cors), Some(origin)) = (
            preflight,
            &now.edge.cors,
            parts.headers.get(http::header::ORIGIN),
        ) {
            let origin = origin.to_str().unwrap_or_default();
            return (None, edge::cors::preflight(cors, origin, &parts.headers));
        }
        let path = parts.uri.path().trim_end_matches('/');
        let route = now.routes.iter().position(|r| r.path == path);
        let passage = match route {
            // A browser's preflight of an MCP endpoint is the upstream's to
            // answer when no `[cors]` says otherwise.
            Some(i) if preflight => now.edge.mounts[i].urls.as_ref().map(|urls| Passage {
                route: i,
                path: urls.upstream_path().to_owned(),
                fallback: None,
                metadata: false,
            }),
            Some(_) => None,
            None => now.edge.passage(parts.uri.path()),
        };
        let passage = passage.map(|p| now.edge.mounts[p.route].metadata_passage(p));
        let reached = passage.as_ref().map(|p| p.route).or(route);
        let answer = match (passage, route) {
            (Some(passage), _) => Self::pass(now, &passage, parts, body, arrival).await,
            (None, Some(i)) => Ok(now.routes[i].handle(Request::from_parts(parts, body)).await),
            (None, None) => Err(Rejection::not_found()),
        };
        (reached, answer.unwrap_or_else(Rejection::into_response))
    }

    /// A discovery, authorization or preflight request, forwarded to the
    /// upstream's origin as plain HTTP.
    async fn pass(
        now: &Configured,
        passage: &Passage,
        parts: http::request::Parts,
        body: Incoming,
        arrival: &Arrival,
    ) -> Result<Response<Body>, Rejection> {
        let mount = &now.edge.mounts[passage.route];
        let (Some(upstream), Some(urls)) = (now.routes[passage.route].http(), &mount.urls) else {
            return Err(Rejection::not_found());
        };
        let body = crate::proxy::read_body(body, &now.shared.config).await?;
        let origin = arrival.origin();
        let forward = edge::passage::Forward {
            upstream,
            urls,
            origin: &origin,
        };
        let query = parts.uri.query();
        let res = forward
            .send(passage, parts.method.clone(), query, &parts.headers, body)
            .await?;
        if let Some(origin) = parts.headers.get(http::header::ORIGIN) {
            if edge::cors::is_preflight(&parts.method, &parts.headers) {
                mount.learn(origin, res.headers());
            }
        }
        Ok(res)
    }
}

impl App {
    /// `GET /healthz`: 503 once the log stopped after a failed flush, so
    /// that an orchestrator restarts the proxy (which recovers from what
    /// the disk holds) and a load balancer sends new calls elsewhere.
    fn health(&self) -> Response<Body> {
        if self.lasting.log.store().flush_failed() {
            return reply::json(
                StatusCode::SERVICE_UNAVAILABLE,
                &b"{\"status\":\"failing\",\"reason\":\"a log flush failed; restart the proxy\"}"[..],
            );
        }
        reply::json(StatusCode::OK, &b"{\"status\":\"ok\"}"[..])
    }

    /// `GET /metrics`: the exposition, with the gauges counted now.
    fn metrics_page(&self, now: &Configured) -> Response<Body> {
        let log = &self.lasting.log;
        let store = log.store();
        log.metrics()
            .observe_retention(store.retained_count(), store.released_early());
        log.metrics().observe_ready(self.readiness().is_ok());
        let quota = now.shared.config.limits.max_log_bytes;
        log.metrics()
            .observe_store(store.health().is_ok(), store.size_on_disk(), quota);
        let text = log
            .metrics()
            .render(self.lasting.sessions.open(), log.live_streams());
        let mut res = Response::new(reply::full(text));
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        );
        res
    }
}

/// Runs a store's open on the blocking pool (a journal's recovery reads
/// the log, and may take seconds): the runtime's threads go on accepting
/// and answering the probes meanwhile.
async fn blocking<T: Send + 'static>(
    open: impl FnOnce() -> crate::store::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let opened = tokio::task::spawn_blocking(open)
        .await
        .map_err(|e| StoreError::Backend(format!("opening the log: {e}")))?;
    Ok(opened?)
}

/// What the sessions a previous run left become: a stdio child cannot
/// outlive the process that ran it, so sessions of stdio routes are closed
/// (404, re-initialize); the open ones of HTTP routes count against
/// `[limits]` as if opened now, and unused ones may still expire early.
/// Sessions of a path no longer mounted can never be used again: they
/// count for nothing and wait for idle expiry.
async fn settle_sessions(lasting: &Lasting, routes: &[Route]) -> anyhow::Result<()> {
    for record in lasting.log.store().list_sessions().await? {
        if record.closed_ms.is_some() {
            continue;
        }
        let route = routes.iter().find(|r| r.path == record.route);
        match route.map(|r| &r.upstream) {
            Some(Upstream::Stdio(_)) => lasting.sessions.close(record.id).await?,
            Some(Upstream::Http(_)) => lasting.sessions.recovered(&record),
            None => {}
        }
    }
    Ok(())
}

/// Abandoned requests are cancelled by the route that forwarded them.
#[async_trait::async_trait]
impl crate::lifetime::Canceller for App {
    async fn cancel(&self, stream: &StreamMeta, why: &str) {
        let Ok(Some(session)) = self.lasting.log.store().get_session(stream.session).await else {
            return;
        };
        if let Some(route) = self.now().route_of(&session.route) {
            route.cancel(stream, why).await;
        }
    }

    async fn end_session(&self, session: &crate::store::SessionRecord) {
        if let Some(route) = self.now().route_of(&session.route) {
            route.end_upstream_session(session).await;
        }
    }
}

/// Streams left live by a previous process are resumed by the route that
/// forwarded them.
#[async_trait::async_trait]
impl Resumer for App {
    async fn resume(&self, stream: &StreamMeta) -> bool {
        let Ok(Some(session)) = self.lasting.log.store().get_session(stream.session).await else {
            return false;
        };
        match self.now().route_of(&session.route) {
            Some(route) => route.resume_after_restart(stream).await,
            None => false,
        }
    }
}

/// A running proxy.
pub struct Server {
    pub addr: SocketAddr,
    app: Arc<App>,
    /// The handler of every connection, kept for the front door a reload
    /// builds.
    gate: Arc<Gate>,
    /// How each new connection is served; swapped by a reload.
    front_door: Arc<ArcSwap<FrontDoor>>,
    stop: CancellationToken,
    workers: Arc<Workers>,
    done: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
    /// `drain_delay_secs`, as the last reload left it.
    drain_delay: AtomicU64,
}

impl Server {
    /// The log this server writes (for tests and embedding).
    pub fn store(&self) -> &SharedStore {
        self.app.lasting.log.store()
    }

    /// Binds, loads the TLS files, starts serving on the worker threads
    /// (the probes answer at once; other requests wait), opens the log, and
    /// returns once requests are served; what runs on no connection's
    /// behalf (the sweeper, takeover, streams recovered at start-up) stays
    /// on the caller's runtime.
    pub async fn start(config: Config) -> anyhow::Result<Server> {
        Self::start_with(config, None).await
    }

    /// As [`Server::start`], on a log the caller opened (an embedding's
    /// own backend, a test's): `[store] backend` is not looked at.
    pub async fn start_on(config: Config, store: SharedStore) -> anyhow::Result<Server> {
        Self::start_with(config, Some(store)).await
    }

    async fn start_with(config: Config, store: Option<SharedStore>) -> anyhow::Result<Server> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr()?;
        let drain_delay = AtomicU64::new(config.drain_delay_secs);
        let store_config = config.store.clone();
        let store_lease_ms = config.store.lease_ms;
        let gate = Arc::new(Gate::default());
        let front_door =
            reload::front_door(&config, gate.clone()).map_err(|e| anyhow::anyhow!(e.0))?;
        let front_door = Arc::new(ArcSwap::from_pointee(front_door));
        let workers = Arc::new(Workers::start(config.workers())?);
        let stop = CancellationToken::new();
        let done = tokio::spawn(accept_loop(
            listener,
            front_door.clone(),
            workers.clone(),
            stop.clone(),
        ));
        let app = match App::open(config, store).await {
            Ok(app) => app,
            Err(e) => {
                gate.failed();
                done.abort();
                let _ = done.await;
                if let Some(workers) = Arc::into_inner(workers) {
                    workers.finish().await;
                }
                return Err(e);
            }
        };
        gate.open(app.clone());
        let sweeper = crate::lifetime::spawn_sweeper(
            app.lasting.log.clone(),
            app.lasting.sessions.clone(),
            store_config,
            app.clone(),
            stop.clone(),
        );
        if app.lasting.log.store().shared() {
            // Other instances may die while this one serves: look for their
            // streams twice per lease, and at least every second (an
            // instance that stops gracefully gives its lease up at once).
            let every = Duration::from_millis(store_lease_ms / 2).min(Duration::from_secs(1));
            crate::lifetime::spawn_takeover(
                app.lasting.log.clone(),
                app.clone(),
                every,
                stop.clone(),
            );
        }
        Ok(Server {
            addr,
            app,
            gate,
            front_door,
            stop,
            workers,
            done,
            sweeper,
            drain_delay,
        })
    }

    /// Applies `config` (a reload: see `reload.rs`), or says why not and
    /// keeps the running configuration.
    pub fn reload(&self, config: Config) -> Result<Vec<String>, Refused> {
        let metrics = self.app.lasting.log.metrics();
        let was = self.app.now();
        let prepared = reload::front_door(&config, self.gate.clone())
            .and_then(|door| Ok((door, self.app.prepare(config.clone())?)));
        let (door, prepared) = match prepared {
            Ok(both) => both,
            Err(refused) => {
                metrics.reloaded(false);
                return Err(refused);
            }
        };
        let changed = reload::changed(&was.shared.config, &config);
        self.drain_delay
            .store(config.drain_delay_secs, Ordering::Relaxed);
        self.front_door.store(Arc::new(door));
        self.app.install(prepared);
        metrics.reloaded(true);
        Ok(changed)
    }

    /// Counts a reload refused before it reached [`Server::reload`] (the
    /// file did not parse or validate).
    pub fn refused_reload(&self) {
        self.app.lasting.log.metrics().reloaded(false);
    }

    /// Stops being ready: `/readyz` answers 503 "draining" from now on,
    /// while every request is served as before.
    pub fn drain(&self) {
        self.app.unready.store(true, Ordering::Relaxed);
    }

    /// What a SIGTERM starts: not ready at once ([`Server::drain`]), then
    /// `drain_delay_secs` of normal service so that load balancers see
    /// `/readyz` fail and send new requests elsewhere (cut short when
    /// `hurry` resolves: a second signal), then [`Server::shutdown`].
    pub async fn drain_then_shutdown(self, hurry: impl std::future::Future<Output = ()>) {
        self.drain();
        let delay = Duration::from_secs(self.drain_delay.load(Ordering::Relaxed));
        if !delay.is_zero() {
            tracing::info!(
                secs = delay.as_secs(),
                "draining: /readyz answers 503 while requests are served as before"
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = hurry => tracing::info!("drain cut short"),
            }
        }
        tracing::info!("shutting down");
        self.shutdown().await;
    }

    /// Shuts down gracefully: open SSE answers end with a `retry:` so their
    /// clients reconnect, no new connection is accepted, connections get
    /// the grace period to finish, stdio children are stopped, the log
    /// is flushed whatever its `sync` mode, (for a shared log) the calls
    /// still running here are handed to the other instances, and the spans
    /// not yet exported are.
    pub async fn shutdown(self) {
        let grace_ends = tokio::time::Instant::now() + self.front_door.load().grace;
        self.drain();
        self.app.lasting.draining.cancel();
        self.stop.cancel();
        let _ = self.done.await;
        self.app.settle_calls(grace_ends).await;
        self.sweeper.abort();
        self.app.stop_upstreams().await;
        let store = self.app.lasting.log.store();
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
        // Last: the spans of the answers that just ended go out too.
        if let Some(tracer) = &self.app.lasting.tracer {
            tracer.shutdown().await;
        }
    }

    /// Serves until `signal` resolves, then drains and shuts down
    /// ([`Server::drain_then_shutdown`]).
    pub async fn run_until(self, signal: impl std::future::Future<Output = ()>) {
        signal.await;
        self.drain_then_shutdown(std::future::pending()).await;
    }
}

/// Accepts until `stop` and hands each connection to a worker; returns
/// once the connections have ended or run out of grace.
async fn accept_loop(
    listener: TcpListener,
    front_door: Arc<ArcSwap<FrontDoor>>,
    workers: Arc<Workers>,
    stop: CancellationToken,
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
        let (front_door, watcher) = (front_door.load_full(), graceful.watcher());
        workers.serve(async move {
            match tokio::net::TcpStream::from_std(socket) {
                Ok(socket) => front_door.serve(socket, peer, watcher).await,
                Err(e) => tracing::debug!(%peer, error = %e, "cannot serve a connection"),
            }
        });
    }
    drop(listener);
    let grace = front_door.load().grace;
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("grace period over; closing remaining connections");
    }
}
