//! The label values of the process's series: closed enums, one per
//! dimension, each with every value listed (`ALL`) so that a family can be
//! created with every series at zero, and written as its `as_str`.
//!
//! Nothing here comes from client or upstream input: a label a client could
//! choose would let it grow the series count without bound.

use std::fmt;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::auth::{PrincipalMode, RefusalReason};
use crate::session::Full;

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
/// How a reload ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reload {
    /// The new configuration serves.
    Applied,
    /// It did not parse, validate or load, or changed what needs a
    /// restart: the running one stays.
    Refused,
}

impl Reload {
    pub const ALL: &'static [Self] = &[Reload::Applied, Reload::Refused];
    pub fn as_str(self) -> &'static str {
        match self {
            Reload::Applied => "applied",
            Reload::Refused => "refused",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReloadLabel {
    pub(super) result: Reload,
}

pub(super) use label_value;

label_value!(Replayed, UpstreamFailure, ResumedAfter, Dropped, TaskEnd);
label_value!(
    PrincipalMode,
    RefusalReason,
    SessionBound,
    SessionExpiry,
    Reload
);

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct DialectLabel {
    pub(super) dialect: Replayed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct KindLabel {
    pub(super) kind: UpstreamFailure,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct AfterLabel {
    pub(super) after: ResumedAfter,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: Dropped,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct StatusLabel {
    pub(super) status: TaskEnd,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RefusalLabels {
    pub(super) mode: PrincipalMode,
    pub(super) reason: RefusalReason,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ModeLabel {
    pub(super) mode: PrincipalMode,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct BoundLabel {
    pub(super) reason: SessionBound,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ExpiryLabel {
    pub(super) reason: SessionExpiry,
}
