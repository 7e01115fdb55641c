//! Upstreams: the MCP servers behind the proxy — Streamable HTTP endpoints
//! (`http.rs`; `replicas.rs` for which replica of one a request goes to;
//! `reach.rs` for their pools, `resolve.rs` for the replicas of a host that
//! resolves to several addresses, `health.rs` for the active health check;
//! `renew.rs` for a session its replica forgot, or that must leave it) and
//! stdio programs (`stdio.rs`, one child per session). Both yield upstream
//! messages as the raw bytes the server wrote, and every one of them passes
//! `ingest.rs` before the log. `headers.rs` says which HTTP headers cross
//! the proxy, toward an upstream and back.
//!
//! HTTP upstream code sends and decodes and never touches the log (the relay
//! does, through [`ingest`]); a stdio child has a single output pipe for
//! every request, so its demultiplexer appends to the streams it routes to,
//! through the same [`ingest`].
//!
//! An upstream carries messages and must not know the dialects: what a
//! session keeps of them once the upstream answered `initialize` is decided
//! above (`dialect`) and handed down to a stdio child as a function. Nothing
//! here imports `dialect`: the notification namespaces the proxy authors
//! itself, which [`ingest`] keeps upstream messages out of, are named there.

pub mod headers;
pub mod health;
pub mod http;
pub mod ingest;
pub mod reach;
pub mod renew;
pub mod replicas;
pub mod resolve;
pub mod stdio;

use std::sync::Arc;

use crate::metrics::UpstreamFailure;

/// The server behind one route.
#[derive(Clone)]
pub enum Upstream {
    Http(Arc<http::HttpUpstream>),
    Stdio(Arc<stdio::StdioUpstream>),
}

/// Why talking to an upstream failed. The message is safe to show clients.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unreachable: {0}")]
    Connect(String),
    /// No connection could be made: nothing of the request was sent.
    #[error("upstream unreachable: {0}")]
    NoConnection(String),
    #[error("upstream stream broke: {0}")]
    Broken(String),
    #[error("upstream message larger than {0} bytes")]
    TooLarge(usize),
    #[error("upstream at capacity: {0}")]
    Busy(String),
    #[error("upstream refused with HTTP {0}")]
    Refused(u16),
    #[error("upstream timed out: {0}")]
    TimedOut(&'static str),
}

/// How metrics count an upstream error.
impl From<&UpstreamError> for UpstreamFailure {
    fn from(e: &UpstreamError) -> Self {
        match e {
            UpstreamError::Connect(_) | UpstreamError::NoConnection(_) => UpstreamFailure::Connect,
            UpstreamError::Broken(_) => UpstreamFailure::Broken,
            UpstreamError::TooLarge(_) => UpstreamFailure::TooLarge,
            UpstreamError::Busy(_) => UpstreamFailure::Busy,
            UpstreamError::Refused(_) => UpstreamFailure::Status,
            UpstreamError::TimedOut(_) => UpstreamFailure::Timeout,
        }
    }
}
