//! # mcp-resume-proxy
//!
//! A reverse proxy that sits in front of unmodified Model Context Protocol
//! servers and makes their long-running requests resumable. Every message an
//! upstream sends toward a client is appended to a durable log *before* it is
//! forwarded, so the proxy itself can answer a client that comes back — after
//! a dropped connection, a load balancer's idle timeout, or a `kill -9` of the
//! proxy — with every message it missed, exactly once, in order.
//!
//! One log, many dialects: the log knows streams of opaque entries; the
//! dialects (`Last-Event-ID`, resume tokens, resumable requests, streams,
//! tasks) are thin adapters over append / read-after-cursor / status.
//!
//! # Layout
//!
//! One line per module of `src/`, from the top of the import graph down: a
//! module's code imports only modules listed below it (one of the journal's
//! tests reads through `stream`). The two commands beside the proxy come
//! first. Each module's own doc says what it owns and what it must not do.
//!
//! - [`demo`]: the demo MCP server (HTTP and stdio) the tests also use, and the `demo` command.
//! - [`inspect`]: the `streams list|show` command, a read-only look at a data directory's log.
//! - [`pid_file`]: where `mcp-resume-proxy reload` finds the running proxy to send SIGHUP to.
//! - [`server`]: start-up (bind, open the log, recover, serve), probes, accept loop, front door, routes, drain.
//! - [`edge`]: public URL, `Host` and `Origin` checks, CORS, OAuth paths passed to upstreams.
//! - [`proxy`]: a route's requests: the legacy session path, modern pass-through, modern tasks.
//! - [`relay`]: the write path: an upstream answer into its stream, ended with the truth.
//! - [`upstream`]: MCP servers over HTTP or stdio, the replica a session sticks to (of `urls`, or the
//!   addresses a host resolves to), health checks, the headers that cross, ingest before the log.
//! - [`dialect`]: how clients come back (`Last-Event-ID`, resume tokens, streams, …), one seam.
//! - [`task`]: what a durable task is, and how each protocol revision shows it.
//! - [`lifetime`]: crash recovery and takeover; abandonment, retention, expiry.
//! - [`stream`]: the log as the proxy sees it: readers that replay then follow, cursors, status.
//! - [`access`]: what each request was, noted along its path: the request series, the access log, its spans.
//! - [`logging`]: the process's log lines, buffered and written to stderr by a thread of their own;
//!   the access line appended ready-spelled.
//! - [`traces`]: OpenTelemetry: a running proxy's tracer, server and client spans, W3C trace context, OTLP export.
//! - [`metrics`]: the Prometheus registry, owned by the log, rendered for `GET /metrics`.
//! - [`session`]: proxy ↔ upstream sessions, their places, strays handed to their own stream.
//! - [`auth`]: who a request speaks for: credential digest, identity header, JWT, introspection.
//! - [`tls`]: the rustls configurations, a client certificate's principal, the HTTPS client.
//! - [`config`]: the TOML file and CLI overrides, validated with messages that name the key.
//! - [`token`]: sealed handles (event ids, resume tokens, stream handles, poll cursors).
//! - [`reply`]: the bodies and responses the proxy writes, and SSE framing.
//! - [`store`]: the durable log's contract; journal (default), sled, Redis (one server, the
//!   primary Redis Sentinel names, followed across a failover, or a Redis Cluster, whose
//!   failovers its commands wait out: `store/redis/cluster.rs`, `store/redis/outage.rs`, its
//!   test rig `tests/common/redis_cluster.rs`, plain or TLS; the log spread over a cluster's
//!   primaries in partitions, each a log in one slot: `store/redis/spread.rs`; its live feed in
//!   shards, each
//!   read only by the instances following a call there: `store/redis/shards.rs`); the group
//!   commit.
//! - [`jsonrpc`]: JSON-RPC envelope classification over raw bytes, and a call's digest.
//! - [`workers`]: the threads that serve connections, a single-threaded scheduler each.
//! - [`id`]: session, stream and task ids (a stream's minted beside its session's), and the
//!   hasher for maps keyed by them.
//!
//! # Memory per open stream
//!
//! A tokio task keeps room for the largest state its future can reach, for
//! as long as it lives — for the tasks of an open stream (its connection,
//! its relay, its SSE body), the whole call. So on those paths a rare, large
//! state (a TLS handshake, resuming or cancelling upstream, failing a stream)
//! is boxed, and what a future is handed is boxed before the future is made
//! (an async fn keeps its arguments and what it passes on in two places).
//! And the queues of an open stream (its strays, its relay's feed) allocate
//! nothing until something comes: most open streams are a long call waiting
//! in silence.

pub mod access;
pub mod auth;
pub mod config;
pub mod demo;
pub mod dialect;
pub mod edge;
pub mod id;
pub mod inspect;
pub mod jsonrpc;
pub mod lifetime;
pub mod logging;
pub mod metrics;
pub mod pid_file;
pub mod proxy;
pub mod relay;
pub mod reply;
pub mod server;
pub mod session;
pub mod store;
pub mod stream;
pub mod task;
pub mod tls;
pub mod token;
pub mod traces;
pub mod upstream;
pub mod workers;

pub use config::Config;
pub use server::Server;

/// Runs the proxy until SIGTERM or SIGINT. SIGTERM (an orchestrator's
/// stop) drains first ([`Server::drain_then_shutdown`]; a second signal
/// cuts the drain short); SIGINT (Ctrl-C at a terminal) shuts down at once.
/// SIGHUP reloads: `reread` makes the configuration again (the file and the
/// flags), and [`Server::reload`] applies it or keeps the running one; the
/// log says which, and why.
pub async fn run(
    config: Config,
    reread: impl Fn() -> Result<Config, String>,
) -> anyhow::Result<()> {
    // Listened to before the port is bound: a signal that comes as soon as
    // the proxy answers is never the default action (a stop without the
    // log flushed, or a SIGHUP that kills).
    let mut signals = StopSignals::new();
    let mut hangups = Hangups::new();
    let data_dir = config.data_dir.clone();
    let server = Server::start(config).await?;
    tracing::info!(addr = %server.addr, "mcp-resume-proxy listening");
    let _pid = pid_file::write(&data_dir)
        .inspect_err(|e| tracing::warn!(error = %e, "cannot write the pid file; `reload` will not find this process (SIGHUP still works)"))
        .ok();
    let stop = loop {
        tokio::select! {
            stop = signals.next() => break stop,
            () = hangups.next() => reload(&server, &reread),
        }
    };
    match stop {
        StopSignal::Terminate => {
            server
                .drain_then_shutdown(async move {
                    signals.next().await;
                })
                .await
        }
        StopSignal::Interrupt => {
            tracing::info!("shutting down");
            server.shutdown().await
        }
    }
    Ok(())
}

/// One reload, said in the log.
fn reload(server: &Server, reread: &impl Fn() -> Result<Config, String>) {
    let applied = match reread() {
        Ok(config) => server.reload(config).map_err(|refused| refused.0),
        Err(why) => {
            server.refused_reload();
            Err(why)
        }
    };
    match applied {
        Ok(changed) => tracing::info!(changed = ?changed, "configuration reloaded"),
        Err(why) => tracing::error!(%why, "configuration not reloaded; the running one stays"),
    }
}

/// SIGHUP, listened to from creation on (never, where it cannot be).
struct Hangups {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn new() -> Self {
        Self {
            #[cfg(unix)]
            hup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(hup) = &mut self.hup {
            if hup.recv().await.is_some() {
                return;
            }
        }
        std::future::pending::<()>().await;
    }
}

/// The signal that asked the process to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT: Ctrl-C.
    Interrupt,
    /// SIGTERM: an orchestrator, a service manager, `kill`.
    Terminate,
}

/// SIGINT and SIGTERM, listened to from creation on.
pub struct StopSignals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Default for StopSignals {
    fn default() -> Self {
        Self::new()
    }
}

impl StopSignals {
    pub fn new() -> Self {
        #[cfg(unix)]
        use tokio::signal::unix::{signal, SignalKind};
        Self {
            #[cfg(unix)]
            term: signal(SignalKind::terminate()).ok(),
            #[cfg(unix)]
            int: signal(SignalKind::interrupt()).ok(),
        }
    }

    /// Resolves on the next SIGINT or SIGTERM (at once, as a SIGINT, if
    /// SIGINT cannot be listened to).
    pub async fn next(&mut self) -> StopSignal {
        #[cfg(unix)]
        if let (Some(term), Some(int)) = (&mut self.term, &mut self.int) {
            return tokio::select! {
                _ = int.recv() => StopSignal::Interrupt,
                _ = term.recv() => StopSignal::Terminate,
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        StopSignal::Interrupt
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    StopSignals::new().next().await;
}
