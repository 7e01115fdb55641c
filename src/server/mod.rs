//! The HTTP front: the [`App`] every request meets — the routes (the
//! probes of [`probes`], `/healthz`, `/metrics` and one mount per upstream),
//! the `Origin` check every MCP server must make against DNS rebinding, and
//! each request's visit — and the files around it: [`front_door`] serves one
//! connection (HTTP/1.1 and HTTP/2, plain or TLS), `running.rs` is the
//! process's lifecycle (start, accept loop, reload, drain, shutdown),
//! `configured.rs` what a configuration makes of the proxy and `reload.rs`
//! how a new one replaces it.
//!
//! Start-up order matters and lives in `running.rs`: bind and accept (the
//! probes answer from then on: live, not ready), open the log, recover what
//! a previous process left live, and only then serve requests.
//!
//! It answers no MCP message itself: a request for a mount goes to that
//! mount's [`Route`] (the proxy), unless the edge passes it to the
//! upstream's origin as plain HTTP.

mod configured;
pub mod front_door;
mod probes;
mod reload;
mod running;

pub use self::reload::Refused;
pub use self::running::Server;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;

use self::configured::{Configured, Lasting};
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
use crate::store::redis::{open_log, Lifetimes, Tuning};
use crate::store::sled::SledStore;
use crate::store::{SharedStore, StoreError, StreamKind, StreamMeta};
use crate::stream::Log;
use crate::traces::Tracer;
use crate::upstream::Upstream;

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
                let tuning = Tuning {
                    lifetimes,
                    replicas: store.replicas(),
                    workers,
                };
                open_log(&at, &store.key_prefix, lease, tuning).await?
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
