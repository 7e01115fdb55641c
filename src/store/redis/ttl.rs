//! How long Redis keeps what the proxy no longer needs, should no instance be
//! left to delete it: TTLs that mirror the proxy's own lifetimes (retention
//! of finished streams, expiry of idle sessions, a task's own expiry) plus
//! slack. A backstop only: while any instance runs, its sweeper deletes
//! first, indexes and all.

use std::time::Duration;

/// The TTLs that mirror the proxy's lifetimes.
#[derive(Clone, Copy, Debug)]
pub struct Lifetimes {
    /// A finished stream's keys: its retention, plus slack.
    pub finished_stream: Duration,
    /// A session's keys from its last write: idle expiry plus retention,
    /// plus slack.
    pub session: Duration,
}

/// What a TTL adds to the deadline it mirrors.
const TTL_SLACK: Duration = Duration::from_secs(3600);

impl Lifetimes {
    pub fn mirror(retention: Duration, session_idle: Duration) -> Self {
        Self {
            finished_stream: retention + TTL_SLACK,
            session: session_idle + retention + TTL_SLACK,
        }
    }
}

impl Default for Lifetimes {
    /// The proxy's default retention (15 min) and session idle time (24 h).
    fn default() -> Self {
        Self::mirror(Duration::from_secs(900), Duration::from_secs(86_400))
    }
}

/// The TTL of a task's keys (its record and its legs'), written at `now_ms`:
/// until the task's expiry, plus slack. Never less than the slack, so a
/// task written after its expiry still lives until a sweeper deletes it.
pub fn task(expires_ms: u64, now_ms: u64) -> Duration {
    Duration::from_millis(expires_ms.saturating_sub(now_ms)) + TTL_SLACK
}
