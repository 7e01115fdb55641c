//! The running proxy ([`Server`]): started (bind, serve the probes, open
//! the app, start the sweeper and takeover), reloaded, drained and shut
//! down; and the accept loop that hands each connection to a worker. What
//! a request meets is the app's (`mod.rs`); this file owns only the
//! process's lifecycle around it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::front_door::FrontDoor;
use super::probes::Gate;
use super::reload::{self, Refused};
use super::App;
use crate::config::Config;
use crate::store::SharedStore;
use crate::workers::Workers;

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
