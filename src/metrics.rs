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
//! what the proxy answers. Labels come from closed enums, never from client
//! or upstream input, so a client cannot grow the series count.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashSet;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::auth::{Caller, PrincipalMode, Refusal, RefusalReason};
use crate::id::StreamId;
use crate::session::Full;

use crate::store::commit::FlushObserver;

/// What `GET /metrics` answers with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prefix of every series.
const PREFIX: &str = "mcp_proxy";

/// Which dialect served a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Replayed {
    /// A GET with `Last-Event-ID`.
    LastEventId,
    /// `requests/resume` (seed 002).
    ResumableRequests,
    /// `stream/resume` (seed 003).
    Streams,
    /// A `tools/call` continued with its resume token (seeds 000/001).
    ResumeTokens,
    /// `tasks/result` (the 2025-11-25 tasks).
    Tasks,
}

impl Replayed {
    pub const ALL: &'static [Self] = &[
        Replayed::LastEventId,
        Replayed::ResumableRequests,
        Replayed::Streams,
        Replayed::ResumeTokens,
        Replayed::Tasks,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Replayed::LastEventId => "last_event_id",
            Replayed::ResumableRequests => "resumable_requests",
            Replayed::Streams => "streams",
            Replayed::ResumeTokens => "resume_tokens",
            Replayed::Tasks => "tasks",
        }
    }
}

/// How talking to an upstream failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpstreamFailure {
    /// Not reached at all (refused, DNS, TLS; a stdio program that does not
    /// start).
    Connect,
    /// A stream or pipe broke mid-answer.
    Broken,
    /// A message over the proxy's size limit.
    TooLarge,
    /// At capacity (stdio: too many children).
    Busy,
    /// Answered a request with an HTTP error status (4xx/5xx).
    Status,
    /// Went past its idle timeout or request deadline.
    Timeout,
}

impl From<&UpstreamFailure> for UpstreamFailure {
    fn from(kind: &UpstreamFailure) -> Self {
        *kind
    }
}

impl UpstreamFailure {
    pub const ALL: &'static [Self] = &[
        UpstreamFailure::Connect,
        UpstreamFailure::Broken,
        UpstreamFailure::TooLarge,
        UpstreamFailure::Busy,
        UpstreamFailure::Status,
        UpstreamFailure::Timeout,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamFailure::Connect => "connect",
            UpstreamFailure::Broken => "broken",
            UpstreamFailure::TooLarge => "too_large",
            UpstreamFailure::Busy => "busy",
            UpstreamFailure::Status => "status",
            UpstreamFailure::Timeout => "timeout",
        }
    }
}

/// What an upstream stream was resumed after (with its own Last-Event-ID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResumedAfter {
    /// The stream broke while its relay was reading it.
    Cut,
    /// A restarted proxy picked up a stream its previous run was relaying.
    Restart,
    /// A resumed stream stayed silent while its request was unanswered: the
    /// upstream is asked again (it may replay and never re-attach live).
    Silence,
}

impl ResumedAfter {
    pub const ALL: &'static [Self] = &[
        ResumedAfter::Cut,
        ResumedAfter::Restart,
        ResumedAfter::Silence,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            ResumedAfter::Cut => "cut",
            ResumedAfter::Restart => "restart",
            ResumedAfter::Silence => "silence",
        }
    }
}

/// Why an upstream message was kept out of the stream it arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// A response to a request that is no live request of the session.
    ForeignResponse,
    /// Progress whose token belongs to no live request of the session.
    ForeignProgress,
    /// An upstream event id already logged for the stream (replays overlap).
    DuplicateEvent,
    /// Progress no later than the latest logged for its token (a replay of
    /// another stream's events carrying what the stream already holds).
    StaleProgress,
    /// A JSON object that is no JSON-RPC message (a replayed priming event
    /// stored as `{}`).
    NotAMessage,
}

impl Dropped {
    pub const ALL: &'static [Self] = &[
        Dropped::ForeignResponse,
        Dropped::ForeignProgress,
        Dropped::DuplicateEvent,
        Dropped::StaleProgress,
        Dropped::NotAMessage,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::ForeignResponse => "foreign_response",
            Dropped::ForeignProgress => "foreign_progress",
            Dropped::DuplicateEvent => "duplicate_event",
            Dropped::StaleProgress => "stale_progress",
            Dropped::NotAMessage => "not_a_message",
        }
    }
}

/// How a task ended (or paused for input), as the metric labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskEnd {
    Completed,
    Failed,
    Cancelled,
    InputRequired,
}

impl TaskEnd {
    pub const ALL: &'static [Self] = &[
        TaskEnd::Completed,
        TaskEnd::Failed,
        TaskEnd::Cancelled,
        TaskEnd::InputRequired,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            TaskEnd::Completed => "completed",
            TaskEnd::Failed => "failed",
            TaskEnd::Cancelled => "cancelled",
            TaskEnd::InputRequired => "input_required",
        }
    }
}

/// Which bound on open sessions refused an `initialize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionBound {
    /// `max_sessions_per_principal` (429).
    Principal,
    /// `max_sessions` (503).
    Total,
}

impl SessionBound {
    pub const ALL: &'static [Self] = &[SessionBound::Principal, SessionBound::Total];
    pub fn as_str(self) -> &'static str {
        match self {
            SessionBound::Principal => "principal",
            SessionBound::Total => "total",
        }
    }
}

impl From<Full> for SessionBound {
    fn from(full: Full) -> Self {
        match full {
            Full::Principal(_) => SessionBound::Principal,
            Full::Total(_) => SessionBound::Total,
        }
    }
}

/// Why the sweeper ended a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionExpiry {
    /// No request for `session_idle_secs` (or closed, past retention).
    Idle,
    /// No request since `initialize` for `unused_session_secs`.
    Unused,
}

impl SessionExpiry {
    pub const ALL: &'static [Self] = &[SessionExpiry::Idle, SessionExpiry::Unused];
    pub fn as_str(self) -> &'static str {
        match self {
            SessionExpiry::Idle => "idle",
            SessionExpiry::Unused => "unused",
        }
    }
}

/// Label values are written as their `as_str`.
macro_rules! label_value {
    ($($t:ty),*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
                fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )*};
}
label_value!(Replayed, UpstreamFailure, ResumedAfter, Dropped, TaskEnd);
label_value!(PrincipalMode, RefusalReason, SessionBound, SessionExpiry);

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DialectLabel {
    dialect: Replayed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: UpstreamFailure,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AfterLabel {
    after: ResumedAfter,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: Dropped,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabel {
    status: TaskEnd,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusalLabels {
    mode: PrincipalMode,
    reason: RefusalReason,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModeLabel {
    mode: PrincipalMode,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BoundLabel {
    reason: SessionBound,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ExpiryLabel {
    reason: SessionExpiry,
}

/// Every series of the process.
pub struct Metrics {
    registry: Registry,
    ready: Gauge,
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
        Self {
            registry,
            ready,
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
        }
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

/// The streams this process opened that have not left `Live` yet, for the
/// `streams_live` gauge. Streams leave when the log finishes or deletes
/// them; a stream deleted with its session bypasses the log, so the set is
/// also pruned against the store (whose watermark says "finished" for a
/// gone stream too) when scraped, and when it has doubled since the last
/// prune — bounded, and O(1) per open amortised, even if nobody scrapes.
#[derive(Default)]
pub struct LiveStreams {
    ids: DashSet<StreamId>,
    /// The set's size after the last prune.
    pruned_to: AtomicUsize,
}

/// Below this many, the set is never pruned on open.
const PRUNE_FLOOR: usize = 1024;

impl LiveStreams {
    pub fn opened(&self, id: StreamId, finished: impl Fn(StreamId) -> bool) {
        self.ids.insert(id);
        let limit = self
            .pruned_to
            .load(Ordering::Relaxed)
            .max(PRUNE_FLOOR / 2)
            .saturating_mul(2);
        if self.ids.len() > limit {
            self.prune(finished);
        }
    }

    pub fn ended(&self, id: StreamId) {
        self.ids.remove(&id);
    }

    /// How many are live, after dropping those the store says are not.
    pub fn count(&self, finished: impl Fn(StreamId) -> bool) -> usize {
        self.prune(finished)
    }

    fn prune(&self, finished: impl Fn(StreamId) -> bool) -> usize {
        self.ids.retain(|id| !finished(*id));
        let left = self.ids.len();
        self.pruned_to.store(left, Ordering::Relaxed);
        left
    }
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

    #[test]
    fn live_streams_forget_what_the_store_says_finished() {
        let live = LiveStreams::default();
        let (a, b) = (StreamId::random(), StreamId::random());
        live.opened(a, |_| false);
        live.opened(b, |_| false);
        live.ended(a);
        assert_eq!(live.count(|_| false), 1);
        assert_eq!(live.count(|id| id == b), 0);
    }

    #[test]
    fn live_streams_stay_bounded_when_nobody_scrapes() {
        let live = LiveStreams::default();
        for _ in 0..10 * PRUNE_FLOOR {
            live.opened(StreamId::random(), |_| true);
        }
        assert!(live.ids.len() <= PRUNE_FLOOR, "{}", live.ids.len());
    }
}
