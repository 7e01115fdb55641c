//! Upstreams: the MCP servers behind the proxy. Today Streamable HTTP
//! (`http.rs`); stdio children come next and must yield the same thing — a
//! sequence of upstream messages, as raw bytes, for the relay to log.
//!
//! Upstream code sends and decodes; it never touches the log.

pub mod http;

/// Why talking to an upstream failed. The message is safe to show clients.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unreachable: {0}")]
    Connect(String),
    #[error("upstream stream broke: {0}")]
    Broken(String),
    #[error("upstream message larger than {0} bytes")]
    TooLarge(usize),
}
