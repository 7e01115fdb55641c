//! Prometheus metrics: the one [`Metrics`] registry of a process, the
//! counters, gauges and the histogram in it, and their OpenMetrics text
//! rendering for `GET /metrics`. README.md "Metrics" lists every series.
//!
//! The registry belongs to the [`Log`](crate::stream::Log), built once at
//! start-up — no global state, so every test proxy has its own. Counters
//! move at existing choke points (appends in `Log`, flushes in the group
//! commit, the dialects' resume paths, the places upstream failures are
//! mapped); the two gauges are read when scraped, so they cannot drift.
//!
//! This module must not decide anything: recording is a few atomic adds,
//! never I/O, never a lock held across an await, and nothing here changes
//! what the proxy answers. Labels come from closed enums or the
//! configuration (routes, tools, replicas; `replicas.rs` for the one set
//! that follows a resolver), never from client or upstream input, so a
//! client cannot grow the series count.

mod labels;
mod live;
mod replicas;
pub mod requests;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use self::labels::{
    AfterLabel, BoundLabel, DialectLabel, ExpiryLabel, KindLabel, ModeLabel, ReasonLabel,
    RefusalLabels, Reload, ReloadLabel, StatusLabel,
};
pub use self::labels::{
    Dropped, Replayed, ResumedAfter, SessionBound, SessionExpiry, TaskEnd, UpstreamFailure,
};
pub use self::live::LiveStreams;
use self::replicas::ReplicaFamilies;
pub use self::replicas::{ReplicaMeter, ReplicaSeries};
use self::requests::Requests;
use crate::auth::{Caller, PrincipalMode, Refusal, RefusalReason};
use crate::session::Full;
use crate::store::commit::FlushObserver;

/// What `GET /metrics` answers with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prefix of every series.
const PREFIX: &str = "mcp_proxy";

/// Every series of the process.
pub struct Metrics {
    registry: Registry,
    ready: Gauge,
    store_writable: Gauge,
    log_size: Gauge,
    log_quota: Gauge,
    sessions_open: Gauge,
    streams_live: Gauge,
    streams_retained: Gauge,
    streams_released_early: Counter,
    /// The store's running total last added to `streams_released_early`.
    released_seen: AtomicU64,
    entries_appended: Counter,
    bytes_appended: Counter,
    replays: Family<DialectLabel, Counter>,
    flush_seconds: Histogram,
    upstream_errors: Family<KindLabel, Counter>,
    recovered: Counter,
    upstream_resumes: Family<AfterLabel, Counter>,
    upstream_dropped: Family<ReasonLabel, Counter>,
    tasks_created: Counter,
    tasks_ended: Family<StatusLabel, Counter>,
    auth_refusals: Family<RefusalLabels, Counter>,
    auth_unavailable: Family<ModeLabel, Counter>,
    sessions_refused: Family<BoundLabel, Counter>,
    sessions_expired: Family<ExpiryLabel, Counter>,
    requests: Arc<Requests>,
    reloads: Family<ReloadLabel, Counter>,
    replicas: ReplicaFamilies,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 while GET /readyz answers 200; 0 while the proxy drains or its log cannot be written (a failed flush, Redis unreachable past the lease)",
            ready.clone(),
        );
        let store_writable = Gauge::default();
        registry.register(
            "store_writable",
            "1 while the log can be written; 0 once a flush failed (journal, sled) or Redis went unreachable past the lease",
            store_writable.clone(),
        );
        let log_size = Gauge::default();
        registry.register_with_unit(
            "log_size",
            "Bytes the log occupies on this machine's disk (0 with Redis): what limits.max_log_bytes is checked against",
            Unit::Bytes,
            log_size.clone(),
        );
        let log_quota = Gauge::default();
        registry.register_with_unit(
            "log_quota",
            "limits.max_log_bytes, past which new calls are refused (0: no quota)",
            Unit::Bytes,
            log_quota.clone(),
        );
        let sessions_open = Gauge::default();
        registry.register(
            "sessions_open",
            "Open legacy sessions this instance counts against limits.max_sessions: opened here, or (with a log of its own) found open in the log at start; ended, expired and closed ones leave",
            sessions_open.clone(),
        );
        let streams_live = Gauge::default();
        registry.register(
            "streams_live",
            "Streams this process opened that are still live (their upstream answer is not complete)",
            streams_live.clone(),
        );
        let streams_retained = Gauge::default();
        registry.register(
            "streams_retained",
            "Finished streams kept in this process's memory for retention (journal), each a compact record of its summary on disk",
            streams_retained.clone(),
        );
        let streams_released_early = Counter::default();
        registry.register(
            "streams_released_early",
            "Finished streams released before their retention ran out because [limits] max_retained_streams was reached",
            streams_released_early.clone(),
        );
        let entries_appended = Counter::default();
        registry.register(
            "entries_appended",
            "Entries appended to the log (upstream messages and the proxy's own)",
            entries_appended.clone(),
        );
        let bytes_appended = Counter::default();
        registry.register_with_unit(
            "appended",
            "Bytes of the messages appended to the log",
            Unit::Bytes,
            bytes_appended.clone(),
        );
        let replays = labelled(
            Replayed::ALL
                .iter()
                .map(|&dialect| DialectLabel { dialect }),
        );
        registry.register(
            "replays",
            "Streams served again from the log to a client that came back, by the dialect it came back with",
            replays.clone(),
        );
        // 0.1 ms (a write-cached VM disk) to about 3 s (a disk in trouble).
        let flush_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register_with_unit(
            "flush_duration",
            "How long one flush (fsync) of the log took; with sync = batch one flush covers many appends",
            Unit::Seconds,
            flush_seconds.clone(),
        );
        let upstream_errors = labelled(UpstreamFailure::ALL.iter().map(|&kind| KindLabel { kind }));
        registry.register(
            "upstream_errors",
            "Failures talking to upstreams, by kind",
            upstream_errors.clone(),
        );
        let recovered = Counter::default();
        registry.register(
            "recovered_streams",
            "Streams whose writer died (a previous run, or a dead instance sharing the log), resumed or finished by recovery",
            recovered.clone(),
        );
        let upstream_resumes =
            labelled(ResumedAfter::ALL.iter().map(|&after| AfterLabel { after }));
        registry.register(
            "upstream_resumes",
            "Upstream streams resumed with the upstream's own Last-Event-ID",
            upstream_resumes.clone(),
        );
        let upstream_dropped = labelled(Dropped::ALL.iter().map(|&reason| ReasonLabel { reason }));
        registry.register(
            "upstream_dropped",
            "Upstream messages kept out of the stream they arrived on and of every other, by reason",
            upstream_dropped.clone(),
        );
        let tasks_created = Counter::default();
        registry.register(
            "tasks_created",
            "Tasks the proxy made of modern tools/call requests (2026-07-28 tasks extension)",
            tasks_created.clone(),
        );
        let tasks_ended = labelled(TaskEnd::ALL.iter().map(|&status| StatusLabel { status }));
        registry.register(
            "tasks_ended",
            "Upstream requests of tasks that ended, by the status they left the task in",
            tasks_ended.clone(),
        );
        let (auth_refusals, auth_unavailable) = register_auth(&mut registry);
        let (sessions_refused, sessions_expired) = register_sessions(&mut registry);
        let requests = Arc::new(Requests::register(&mut registry));
        let reloads = labelled(Reload::ALL.iter().map(|&result| ReloadLabel { result }));
        registry.register(
            "config_reloads",
            "Configuration reloads (SIGHUP): applied, or refused (the file did not parse, validate or load, or changed what needs a restart) with the running configuration kept",
            reloads.clone(),
        );
        let replicas = ReplicaFamilies::register(&mut registry);
        Self {
            registry,
            ready,
            store_writable,
            log_size,
            log_quota,
            sessions_open,
            streams_live,
            streams_retained,
            streams_released_early,
            released_seen: AtomicU64::new(0),
            entries_appended,
            bytes_appended,
            replays,
            flush_seconds,
            upstream_errors,
            recovered,
            upstream_resumes,
            upstream_dropped,
            tasks_created,
            tasks_ended,
            auth_refusals,
            auth_unavailable,
            sessions_refused,
            sessions_expired,
            requests,
            reloads,
            replicas,
        }
    }

    /// What the replicas of the upstream mounted at `upstream` count on.
    pub fn replica_meter(&self, upstream: &str) -> ReplicaMeter {
        ReplicaMeter::new(&self.replicas, upstream)
    }

    /// A reload was applied (`true`) or refused.
    pub fn reloaded(&self, applied: bool) {
        let result = if applied {
            Reload::Applied
        } else {
            Reload::Refused
        };
        self.reloads.get_or_create(&ReloadLabel { result }).inc();
    }

    /// The request series (`server`'s, through `access`).
    pub fn requests(&self) -> &Arc<Requests> {
        &self.requests
    }

    /// Messages that were just appended (durably) to the log.
    pub fn appended(&self, messages: &[Bytes]) {
        let bytes: usize = messages.iter().map(Bytes::len).sum();
        self.entries_appended.inc_by(messages.len() as u64);
        self.bytes_appended.inc_by(bytes as u64);
    }

    /// A client came back and is being served a stream from the log.
    pub fn replayed(&self, dialect: Replayed) {
        self.replays.get_or_create(&DialectLabel { dialect }).inc();
    }

    /// What the group commit reports each flush's duration to.
    pub fn flush_observer(&self) -> FlushObserver {
        let histogram = self.flush_seconds.clone();
        std::sync::Arc::new(move |took: Duration| histogram.observe(took.as_secs_f64()))
    }

    pub fn upstream_failed(&self, kind: UpstreamFailure) {
        self.upstream_errors
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// An upstream failure, by kind (upstream errors say theirs).
    pub fn upstream_error(&self, kind: impl Into<UpstreamFailure>) {
        self.upstream_failed(kind.into());
    }

    /// An upstream's answer to a request the proxy sent: a transport error,
    /// or an HTTP error status, counts as a failure.
    pub fn upstream_answer<'e, B, E>(&self, sent: &'e Result<http::Response<B>, E>)
    where
        &'e E: Into<UpstreamFailure>,
    {
        match sent {
            Err(e) => self.upstream_error(e),
            Ok(res) => self.upstream_status(res.status()),
        }
    }

    /// An upstream's HTTP status: an error status counts as a failure.
    pub fn upstream_status(&self, status: http::StatusCode) {
        if status.is_client_error() || status.is_server_error() {
            self.upstream_failed(UpstreamFailure::Status);
        }
    }

    /// Streams recovery resumed or finished (at start-up, or taken over
    /// from a dead instance).
    pub fn recovered(&self, streams: usize) {
        self.recovered.inc_by(streams as u64);
    }

    /// An upstream message dropped before the log, and why.
    pub fn upstream_dropped(&self, reason: Dropped) {
        self.upstream_dropped
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn task_created(&self) {
        self.tasks_created.inc();
    }

    pub fn task_ended(&self, status: TaskEnd) {
        self.tasks_ended
            .get_or_create(&StatusLabel { status })
            .inc();
    }

    /// A credential refused by the principal mode `mode`.
    /// Counts what the authenticator made of a request: nothing for a
    /// caller, a refusal by its reason, or an unreachable verifier.
    pub fn auth_outcome(&self, mode: PrincipalMode, outcome: &Result<Caller, Refusal>) {
        match outcome {
            Ok(_) => {}
            Err(Refusal::Unauthenticated(reason)) => self.auth_refused(mode, *reason),
            Err(Refusal::Unavailable(_)) => self.auth_unavailable(mode),
        }
    }

    pub fn auth_refused(&self, mode: PrincipalMode, reason: RefusalReason) {
        self.auth_refusals
            .get_or_create(&RefusalLabels { mode, reason })
            .inc();
    }

    /// A request the verifier of `mode` could not decide (unreachable).
    pub fn auth_unavailable(&self, mode: PrincipalMode) {
        self.auth_unavailable
            .get_or_create(&ModeLabel { mode })
            .inc();
    }

    /// An `initialize` refused for want of a place.
    pub fn session_refused(&self, full: Full) {
        let reason = full.into();
        self.sessions_refused
            .get_or_create(&BoundLabel { reason })
            .inc();
    }

    /// Sessions the sweeper ended, and why.
    pub fn sessions_expired(&self, reason: SessionExpiry, n: usize) {
        self.sessions_expired
            .get_or_create(&ExpiryLabel { reason })
            .inc_by(n as u64);
    }

    pub fn upstream_resumed(&self, after: ResumedAfter) {
        self.upstream_resumes
            .get_or_create(&AfterLabel { after })
            .inc();
    }

    /// Takes the store's retention figures in before a render: how many
    /// finished streams it keeps (left unset by a store that keeps no
    /// count), and its running total of early releases.
    pub fn observe_retention(&self, retained: Option<usize>, released_total: u64) {
        if let Some(retained) = retained {
            self.streams_retained.set(retained as i64);
        }
        let seen = self.released_seen.swap(released_total, Ordering::Relaxed);
        self.streams_released_early
            .inc_by(released_total.saturating_sub(seen));
    }

    /// Takes in the store's state before a render: whether it can be
    /// written, its size on disk and the quota on it.
    pub fn observe_store(&self, writable: bool, size: u64, quota: Option<u64>) {
        self.store_writable.set(i64::from(writable));
        self.log_size.set(i64::try_from(size).unwrap_or(i64::MAX));
        let quota = quota.map_or(0, |q| i64::try_from(q).unwrap_or(i64::MAX));
        self.log_quota.set(quota);
    }

    /// Takes in whether `/readyz` would answer 200 now, before a render.
    pub fn observe_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// The OpenMetrics text exposition, ending with `# EOF`, with the
    /// gauges set to what the caller counted just now.
    pub fn render(&self, sessions_open: usize, streams_live: usize) -> String {
        self.sessions_open.set(sessions_open as i64);
        self.streams_live.set(streams_live as i64);
        let mut out = String::new();
        // Writing to a String cannot fail; an encoder error would be a bug
        // in a label encoder, and a partial page is still better than none.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// The two families of issue 35's authentication, every mode and reason
/// present from the start.
fn register_auth(
    registry: &mut Registry,
) -> (Family<RefusalLabels, Counter>, Family<ModeLabel, Counter>) {
    let refusals = labelled(PrincipalMode::ALL.iter().flat_map(|&mode| {
        RefusalReason::ALL
            .iter()
            .map(move |&reason| RefusalLabels { mode, reason })
    }));
    registry.register(
        "auth_refusals",
        "Requests whose credential was refused (missing, malformed, not verifying), by principal mode and reason",
        refusals.clone(),
    );
    let unavailable = labelled(PrincipalMode::ALL.iter().map(|&mode| ModeLabel { mode }));
    registry.register(
        "auth_unavailable",
        "Requests whose credential could not be checked because the verifier (key set, introspection endpoint) was unreachable",
        unavailable.clone(),
    );
    (refusals, unavailable)
}

/// The two families of issue 36's bounds on sessions.
fn register_sessions(
    registry: &mut Registry,
) -> (Family<BoundLabel, Counter>, Family<ExpiryLabel, Counter>) {
    let refused = labelled(
        SessionBound::ALL
            .iter()
            .map(|&reason| BoundLabel { reason }),
    );
    registry.register(
        "sessions_refused",
        "initialize requests refused because a bound on open sessions was reached, by bound: principal (429) or total (503)",
        refused.clone(),
    );
    let expired = labelled(
        SessionExpiry::ALL
            .iter()
            .map(|&reason| ExpiryLabel { reason }),
    );
    registry.register(
        "sessions_expired",
        "Sessions the sweeper ended: idle (no request for session_idle_secs, or closed past retention) or unused (no request since initialize for unused_session_secs)",
        expired.clone(),
    );
    (refused, expired)
}

/// A counter family with every label value present from the start, so a
/// series reads 0 rather than being absent until its first event (absent
/// series break `rate()` and alerts on "increase > 0").
fn labelled<S>(labels: impl Iterator<Item = S>) -> Family<S, Counter>
where
    S: Clone + std::hash::Hash + Eq + fmt::Debug + EncodeLabelSet + Send + Sync + 'static,
{
    let family = Family::default();
    for label in labels {
        // Created for its side effect; the guard it returns is not needed.
        drop(family.get_or_create(&label));
    }
    family
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_registry_renders_every_series_at_zero_and_ends_with_eof() {
        let text = Metrics::new().render(0, 0);
        assert!(text.ends_with("# EOF\n"), "{text}");
        for line in [
            "# TYPE mcp_proxy_ready gauge",
            "mcp_proxy_ready 0",
            "# TYPE mcp_proxy_sessions_open gauge",
            "# TYPE mcp_proxy_streams_live gauge",
            "# TYPE mcp_proxy_entries_appended counter",
            "# TYPE mcp_proxy_appended_bytes counter",
            "# TYPE mcp_proxy_replays counter",
            "# TYPE mcp_proxy_flush_duration_seconds histogram",
            "# TYPE mcp_proxy_upstream_errors counter",
            "# TYPE mcp_proxy_recovered_streams counter",
            "# TYPE mcp_proxy_upstream_resumes counter",
            "mcp_proxy_replays_total{dialect=\"resume_tokens\"} 0",
            "mcp_proxy_upstream_errors_total{kind=\"too_large\"} 0",
            "mcp_proxy_upstream_resumes_total{after=\"restart\"} 0",
            "mcp_proxy_auth_refusals_total{mode=\"jwt\",reason=\"unknown_key\"} 0",
            "mcp_proxy_auth_unavailable_total{mode=\"introspection\"} 0",
            "mcp_proxy_sessions_refused_total{reason=\"total\"} 0",
            "mcp_proxy_sessions_expired_total{reason=\"unused\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn recording_moves_the_series_it_names() {
        let metrics = Metrics::new();
        metrics.appended(&[Bytes::from_static(b"abc"), Bytes::from_static(b"de")]);
        metrics.replayed(Replayed::Streams);
        metrics.upstream_error(UpstreamFailure::Connect);
        metrics.upstream_answer(&Ok::<_, UpstreamFailure>(
            http::Response::builder().status(503).body(()).unwrap(),
        ));
        metrics.upstream_answer(&Ok::<_, UpstreamFailure>(http::Response::new(())));
        metrics.recovered(2);
        metrics.upstream_resumed(ResumedAfter::Cut);
        metrics.auth_refused(PrincipalMode::Jwt, RefusalReason::Signature);
        metrics.auth_unavailable(PrincipalMode::Jwt);
        metrics.session_refused(Full::Principal(2));
        metrics.sessions_expired(SessionExpiry::Unused, 3);
        (metrics.flush_observer())(Duration::from_millis(3));
        let text = metrics.render(1, 4);
        for line in [
            "mcp_proxy_sessions_open 1",
            "mcp_proxy_streams_live 4",
            "mcp_proxy_entries_appended_total 2",
            "mcp_proxy_appended_bytes_total 5",
            "mcp_proxy_replays_total{dialect=\"streams\"} 1",
            "mcp_proxy_replays_total{dialect=\"last_event_id\"} 0",
            "mcp_proxy_upstream_errors_total{kind=\"connect\"} 1",
            "mcp_proxy_upstream_errors_total{kind=\"status\"} 1",
            "mcp_proxy_recovered_streams_total 2",
            "mcp_proxy_upstream_resumes_total{after=\"cut\"} 1",
            "mcp_proxy_flush_duration_seconds_count 1",
            "mcp_proxy_auth_refusals_total{mode=\"jwt\",reason=\"signature\"} 1",
            "mcp_proxy_auth_refusals_total{mode=\"jwt\",reason=\"expired\"} 0",
            "mcp_proxy_auth_unavailable_total{mode=\"jwt\"} 1",
            "mcp_proxy_sessions_refused_total{reason=\"principal\"} 1",
            "mcp_proxy_sessions_refused_total{reason=\"total\"} 0",
            "mcp_proxy_sessions_expired_total{reason=\"unused\"} 3",
            "mcp_proxy_sessions_expired_total{reason=\"idle\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
