//! The `[dialects]` table and the per-upstream dialect tables
//! (`[upstream.resume_tokens]`, `[upstream.tasks]`): which resumability
//! dialects the proxy offers, and their timings. Plain data, with the
//! defaults the seeds and the README give; nothing here is validated
//! against other tables (`Config::validate` does that).

use serde::Deserialize;

/// The resumability dialects the proxy offers clients that ask for them.
#[derive(Clone, Debug, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DialectsConfig {
    pub resumable_requests: ResumableRequestsConfig,
    pub streams: StreamsConfig,
    /// Per upstream (`[upstream.resume_tokens]`): each route's copy of this
    /// table carries its upstream's settings.
    #[serde(skip)]
    pub resume_tokens: ResumeTokensConfig,
    /// Per upstream (`[upstream.tasks]`): the 2025-11-25 tasks are served
    /// on the session path as a dialect.
    #[serde(skip)]
    pub tasks: TasksConfig,
}

/// Seeds 000/001: `resumeTokens` — a long `tools/call` answers early with
/// a token and is continued by re-sending it with the token.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ResumeTokensConfig {
    pub mode: ResumeTokensMode,
    /// How long a call (or a continuation) may run before it is answered
    /// with an interim result and a token.
    pub interim_after_ms: u64,
    /// Where the token goes in the interim result.
    pub placement: Placement,
    /// Tools that answer with tokens. Empty: every tool, for clients that
    /// declared `resumeTokens`. Listed: these tools, for every client (the
    /// operator knows its clients understand tokens).
    pub tools: Vec<String>,
    /// A token not presented within this long is expired, and the call is
    /// cancelled upstream.
    pub idle_expiry_ms: u64,
    /// How long after the final answer its token still fetches it again.
    pub final_grace_ms: u64,
}

/// Tasks (`io.modelcontextprotocol/tasks`, the 2026-07-28 extension) made
/// by the proxy for an upstream that knows nothing of them: a long
/// `tools/call` of a client that declared the extension becomes a durable
/// task the proxy serves from its log.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    /// Offer tasks (and add the extension to `server/discover`) unless the
    /// upstream lists the extension itself.
    pub enabled: bool,
    /// How long a call may run before it becomes a task; 0: at once.
    pub task_after_ms: u64,
    /// How long a task is kept from its creation (`ttlMs`).
    pub ttl_ms: u64,
    /// How often clients should poll (`pollIntervalMs`).
    pub poll_interval_ms: u64,
    /// Tools that only run as tasks: a call from a client that did not
    /// declare the extension is refused with -32021, as a native server
    /// refuses a task-required tool.
    pub required_tools: Vec<String>,
    /// Also serve the 2025-11-25 experimental tasks (`params.task`,
    /// `tasks/get|result|list|cancel`) to sessions that negotiated that
    /// revision with an upstream not declaring `capabilities.tasks`.
    /// Opt-in: it rewrites `initialize` and `tools/list` results.
    pub legacy: bool,
    /// `tasks/result` requests that may wait for their task at once, on
    /// this instance; more are refused until one ends.
    pub result_waiters: usize,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            task_after_ms: 1_000,
            ttl_ms: 3_600_000,
            poll_interval_ms: 1_000,
            required_tools: Vec::new(),
            legacy: false,
            result_waiters: 1_024,
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ResumeTokensMode {
    /// The proxy issues and honours tokens over its log.
    #[default]
    Proxy,
    /// The upstream issues its own tokens: capability and tokens pass
    /// through untouched.
    Passthrough,
    /// No tokens: the capability is removed before `initialize` goes
    /// upstream, and nobody issues tokens.
    Off,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// `result._meta.nextResumeToken` (seed 000).
    #[default]
    Meta,
    /// `result.nextResumeToken` (seed 001).
    Root,
    Both,
}

impl Default for ResumeTokensConfig {
    fn default() -> Self {
        Self {
            mode: ResumeTokensMode::Proxy,
            interim_after_ms: 5_000,
            placement: Placement::Meta,
            tools: Vec::new(),
            idle_expiry_ms: 600_000,
            final_grace_ms: 60_000,
        }
    }
}

/// Seed 002: `resumableRequests`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ResumableRequestsConfig {
    pub enabled: bool,
    /// `minWait` advertised (sent in seconds).
    pub min_wait_ms: u64,
    /// `maxWait`: a request neither resumed nor asked about for this long is
    /// cancelled upstream and forgotten.
    pub max_wait_ms: u64,
}

/// Seed 003: `streams`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StreamsConfig {
    pub enabled: bool,
    /// `resumeInterval.min` (sent in seconds).
    pub min_ms: u64,
    /// `resumeInterval.max`: a stream neither resumed nor polled for this
    /// long is abandoned (cancelled upstream, deleted).
    pub max_ms: u64,
}

impl Default for ResumableRequestsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_wait_ms: 1_000,
            max_wait_ms: 600_000,
        }
    }
}

impl Default for StreamsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_ms: 1_000,
            max_ms: 3_600_000,
        }
    }
}
