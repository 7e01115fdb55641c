//! What the demo server counts for the tests that drive it, and the one
//! protocol revision it speaks statelessly. Shared by the HTTP and stdio
//! fronts and the MCP logic behind them; depends on none of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use http::HeaderMap;

/// The stateless revision the demo server also speaks.
pub(super) const MODERN_VERSION: &str = "2026-07-28";

/// Counters the tests read. `requests` holds the headers of every request.
#[derive(Default, Debug)]
pub struct DemoStats {
    pub sessions_created: AtomicU64,
    pub sessions_deleted: AtomicU64,
    pub calls_started: AtomicU64,
    pub calls_completed: AtomicU64,
    /// `notifications/cancelled` for an in-flight call, or (modern) the client
    /// closed the response stream.
    pub calls_cancelled: AtomicU64,
    /// GETs carrying `Last-Event-ID` that were served.
    pub resumed_gets: AtomicU64,
    pub requests: Mutex<Vec<HeaderMap>>,
    /// While set, `GET /healthz` answers 503 (an operator's health check
    /// sees the server as failing); MCP requests are served as ever.
    pub unhealthy: std::sync::atomic::AtomicBool,
}

impl DemoStats {
    pub fn last_headers(&self) -> Option<HeaderMap> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last()
            .cloned()
    }

    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
