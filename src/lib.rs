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
//! - [`config`]: the TOML file and CLI overrides, validated with messages that
//!   name the key.
//! - [`server`]: accept loop, routes, `Origin` check, graceful shutdown; the
//!   start-up order (open log, recover, serve); [`server::front_door`]: one
//!   connection from socket to hyper — TLS handshake, limits on request
//!   heads, the client certificate's principal.
//! - [`workers`]: the threads that serve connections, one single-threaded
//!   scheduler each, what each of them keeps for itself, and how many
//!   connections each serves.
//! - [`edge`]: what is settled before a route sees a request and what every
//!   answer carries out — the public URL the client used (configured, or
//!   from a trusted ingress), `Host` and `Origin` checks, CORS, the OAuth
//!   discovery and authorization paths passed to the upstream's origin, the
//!   upstream's own URL rewritten into the proxy's.
//! - [`tls`]: the rustls configurations (listener, mutual TLS, upstream
//!   roots) and the principal of a client certificate; [`tls::outbound`]:
//!   the HTTPS client (connector, one-line errors) that upstreams and
//!   authorization servers are reached with.
//! - [`proxy`]: per-route request handling; [`proxy::legacy`] (parse →
//!   session → dialect router → exchange), the exchange as a pipeline (open
//!   the stream: admitted under the session, principal and disk caps, no
//!   double execution, logged with its opening entries → send to the
//!   target, an HTTP upstream or a stdio child → present the answer from
//!   the log), the one error type [`proxy::Rejection`], [`proxy::modern`] (stateless pass-through) and
//!   [`proxy::tasks`] (durable tasks for modern clients of task-unaware
//!   upstreams: the call that becomes a task, the `tasks/*` methods).
//! - [`auth`]: who a request speaks for — the principal from a credential
//!   digest, a trusted identity header, a verified JWT (keys from the
//!   issuer's JWKS) or token introspection, each cached; refusals counted.
//! - [`session`]: proxy session ↔ upstream session, principals, protocol eras;
//!   the places open sessions hold (per principal and in all) and the early
//!   end of sessions never used after `initialize`; the hand-over of an
//!   upstream message that arrived on another stream of its session to its
//!   own stream's relay ([`session::stray`]), on the queue that also feeds a
//!   relay ([`session::queue`]: bounded, closable from either end,
//!   allocating nothing until used).
//! - [`relay`]: the write path — an upstream answer into its stream, ended
//!   with the truth; resumed upstream after a cut or a restart of the proxy,
//!   asked again while a resumed stream stays silent, and sorted so that only
//!   a stream's own messages enter it.
//! - [`stream`]: the log as the proxy sees it; readers that replay then follow
//!   (one exclusive reader per stream; watchers that never take over; what
//!   this process just appended handed to its reader without a read back),
//!   the acknowledged cursor, and the status every dialect maps its words
//!   from.
//! - [`store`]: the durable log's contract; [`store::journal`] (default:
//!   append-only segment files, in-memory index), [`store::sled`],
//!   [`store::redis`] (shared by instances: the feed they follow, leases and
//!   ownership), and the group commit in [`store::commit`] (a syncer
//!   thread; a lone writer flushes on its own worker).
//! - [`dialect`]: how clients come back, and the seam they plug into
//!   (negotiation, command router, presentation);
//!   [`dialect::last_event_id`], [`dialect::resume_token`] (seeds 000/001),
//!   [`dialect::resumable_request`] (seed 002), [`dialect::streams`]
//!   (seed 003), [`dialect::legacy_tasks`] (the 2025-11-25 experimental
//!   tasks, served on the session path).
//! - [`task`]: what a task is, for both revisions' tasks — its record (the
//!   store contract's), read with its current leg, changed by compare-and-set,
//!   cancelled — and how each revision shows it: one wire `Task`,
//!   [`task::modern`] (the 2026-07-28 tasks extension's wire shapes) and
//!   [`task::legacy`] (the 2025-11-25 experimental tasks').
//! - [`upstream`]: talking to MCP servers; [`upstream::http`] (Streamable
//!   HTTP; [`upstream::renew`] when it forgot a session),
//!   [`upstream::stdio`] (a child per session, demultiplexed);
//!   [`upstream::ingest`], what every upstream message passes before the log
//!   (relay and stdio alike): no spoofed dialect notifications, no orphan
//!   progress, per-stream caps, status marks; and [`upstream::headers`],
//!   which HTTP headers cross the proxy in each direction.
//! - [`metrics`]: the Prometheus registry (owned by the log) and its
//!   OpenMetrics text for `GET /metrics`.
//! - [`lifetime`]: crash recovery (resume upstream, or fail with an error
//!   entry) at start-up and, with a shared log, takeover of dead instances'
//!   calls; abandonment, retention, session expiry.
//! - [`jsonrpc`]: envelope classification over raw bytes.
//! - [`token`]: sealed handles — event ids, resume tokens, stream handles,
//!   poll cursors — each of its own kind, bound to session (and principal),
//!   and the HMAC-SHA256 they are sealed with (`token/mac.rs`).
//! - [`reply`]: response bodies and error responses; [`reply::sse`], the SSE
//!   encoder and incremental decoder.
//! - [`id`]: session, stream and task ids, and the hasher for maps keyed by them.
//! - [`inspect`]: the `streams list|show` command — a read-only look at a
//!   data directory's log, safe while the proxy runs.
//! - [`demo`]: the demo MCP server (HTTP and stdio) that also serves the
//!   tests, and the `demo` command.
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

pub mod auth;
pub mod config;
pub mod demo;
pub mod dialect;
pub mod edge;
pub mod id;
pub mod inspect;
pub mod jsonrpc;
pub mod lifetime;
pub mod metrics;
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
pub mod upstream;
pub mod workers;

pub use config::Config;
pub use server::Server;

/// Runs the proxy until SIGINT or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let server = Server::start(config).await?;
    tracing::info!(addr = %server.addr, "mcp-resume-proxy listening");
    server.run_until(shutdown_signal()).await;
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
