//! Configuration: the TOML file, command-line overrides, defaults, and
//! validation with messages that name the offending key.
//!
//! Everything here is plain data; nothing is started. `proxy.toml.example`
//! documents every key with its default and must change with this file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::store::commit::SyncMode;

pub mod auth;
pub mod edge;
mod redis_keys;
pub mod traces;
mod upstream;

pub use traces::TracingConfig;
pub use upstream::{Lookup, Resolve};

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the proxy listens on.
    pub listen: SocketAddr,
    /// Where the log and the token key live.
    pub data_dir: PathBuf,
    pub log_format: LogFormat,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// Origins allowed besides localhost ones; `"*"` allows any.
    pub allowed_origins: Vec<String>,
    /// Host header values (host or host:port) allowed besides localhost ones.
    /// Empty means: only localhost when listening on loopback, any otherwise.
    pub allowed_hosts: Vec<String>,
    /// Request header that identifies the client principal.
    pub principal_header: String,
    /// The origin clients reach the proxy at (`https://mcp.example.com`),
    /// when an ingress in front changes it; it is what the proxy writes
    /// where an upstream wrote its own URL, and an allowed `Host`. Unset:
    /// a trusted ingress's forwarding headers, else the request's own.
    pub public_url: Option<String>,
    /// Peers (addresses or networks) whose `Forwarded` and
    /// `X-Forwarded-Proto` / `X-Forwarded-Host` are believed.
    pub trusted_proxies: Vec<String>,
    /// CORS for browsers (`[cors]`); unset: as the upstream answers it.
    pub cors: Option<edge::CorsConfig>,
    /// Seconds of normal service after SIGTERM, with `/readyz` answering
    /// 503 "draining", before the shutdown starts: the time a load
    /// balancer takes to notice.
    pub drain_delay_secs: u64,
    /// Seconds to wait for connections to finish on shutdown.
    pub shutdown_grace_secs: u64,
    /// Serve Prometheus metrics at `GET /metrics` (OpenMetrics text).
    pub metrics: bool,
    /// Tool names `tools/call` requests are counted under in
    /// `mcp_proxy_tool_calls_total` (at most 32); every other tool counts
    /// as `other`. Empty: every call counts as `other`.
    pub metrics_tools: Vec<String>,
    /// One `info` line per request, target `access`, when its answer ends
    /// (README "Access log").
    pub access_log: bool,
    /// Threads serving connections, each with its own scheduler (a
    /// connection and the calls it makes stay on one thread). Unset: one
    /// per available core.
    pub workers: Option<usize>,
    pub sse: SseConfig,
    pub store: StoreConfig,
    pub limits: LimitsConfig,
    pub dialects: DialectsConfig,
    pub tokens: TokensConfig,
    /// Serve https instead of plain HTTP (`[tls]`); unset: plain HTTP.
    pub tls: Option<TlsConfig>,
    /// How the principal of a request is found (`[auth]`).
    pub auth: auth::AuthConfig,
    /// OpenTelemetry traces over OTLP/HTTP (`[tracing]`); off until an
    /// endpoint is known.
    pub tracing: TracingConfig,
    pub upstream: Vec<UpstreamConfig>,
}

/// The listener's certificate and, for mutual TLS, the CA that client
/// certificates must chain to (`[tls]`). Files are PEM; they are read when
/// the proxy starts, and a problem stops the start naming the key.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The server certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates client certificates must chain to. Set: every
    /// client must present a certificate, and its certificate (not the
    /// `principal_header`) is the principal its sessions belong to.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// The key every handle the proxy gives out is sealed with.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TokensConfig {
    /// A file holding the key (at least 32 bytes). Instances that serve one
    /// client population must share it. Unset: `data_dir/token.key`,
    /// generated on first start.
    pub key_file: Option<PathBuf>,
    /// The key used before a rotation: handles sealed with it still open for
    /// `previous_key_window_secs` after the proxy starts.
    pub previous_key_file: Option<PathBuf>,
    pub previous_key_window_secs: u64,
}

impl Default for TokensConfig {
    fn default() -> Self {
        Self {
            key_file: None,
            previous_key_file: None,
            previous_key_window_secs: 86_400,
        }
    }
}

/// Caps that keep one stream from taking the log over, and one client from
/// holding a connection or request open at the front door.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Most entries one stream keeps. Past it, progress of one token is
    /// coalesced to its latest; a stream that still overflows ends with a
    /// JSON-RPC error entry and its upstream request is cancelled.
    pub stream_max_entries: u64,
    /// Most bytes of messages one stream keeps (same rule).
    pub stream_max_bytes: u64,
    /// Largest request head (request line and headers) a client may send;
    /// a larger one gets 431 (HTTP/1 closes the connection, HTTP/2 refuses
    /// only that stream).
    pub max_header_bytes: usize,
    /// How long a new connection has for its TLS handshake and first request
    /// head, and an HTTP/1 connection for each later head: a client that
    /// trickles its head (slowloris) is disconnected.
    pub header_read_timeout_ms: u64,
    /// How long a client has to send a whole request body; a stalled one is
    /// answered with 408.
    pub body_read_timeout_ms: u64,
    /// Most request streams one session may have live at once; a request
    /// past it gets 429 with a JSON-RPC error.
    pub streams_per_session: usize,
    /// Most request streams one principal may have live at once, across
    /// its sessions (429 past it).
    pub streams_per_principal: usize,
    /// Largest the log may grow on disk, in bytes: past it, new requests
    /// get 503 while the streams already open run to their end (and
    /// retention frees space). Unlimited when unset.
    pub max_log_bytes: Option<u64>,
    /// Most finished streams the journal keeps for retention: past it the
    /// oldest are released before `retention_secs` would have (a replay of
    /// one answers as an expired stream does), a live stream never. Each
    /// costs about 200 bytes of memory, so the default holds this process's
    /// retained calls under ~100 MiB whatever the load. Redis keeps them in
    /// Redis (bounded by retention), sled in its own cache.
    pub max_retained_streams: usize,
    /// Most legacy sessions open at once on this instance (opened here, or
    /// found open in the log at start); an `initialize` past it gets 503
    /// with `Retry-After`, and nothing is opened upstream. Default 4,096:
    /// an idle session costs the proxy about 6 KiB (BENCHMARKS.md, session
    /// 20), 24 MiB at the bound, and the upstream a session of its own,
    /// which costs it more (an SDK server keeps a transport and a server
    /// object per session): both fit a machine of 1 GiB, and no single
    /// deployment of the kind this proxy fronts serves that many clients
    /// at once by accident.
    pub max_sessions: usize,
    /// Most sessions one principal may hold open at once on this instance;
    /// its next `initialize` gets 429 with `Retry-After`. Default 256: an
    /// agent or IDE that restarts and never sends DELETE leaves a session
    /// behind each time, and 256 allows that for a day at several restarts
    /// an hour, while one client alone fills a sixteenth of
    /// `max_sessions`. Requests without a credential (no `[auth]`, no
    /// `principal_header`) share no principal worth the name: their
    /// sessions count only against `max_sessions`.
    pub max_sessions_per_principal: usize,
    /// Seconds a session may stay unused — no request since its
    /// `initialize`, no GET stream — before it is ended, as idle expiry
    /// ends it (the sweeper runs every `store.sweep_secs`). Default 300:
    /// a client asks for tools or opens its stream within seconds of
    /// `initialize`, and one that waits longer gets 404 and initializes
    /// again, as the protocol says it must.
    pub unused_session_secs: u64,
}

impl LimitsConfig {
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }
}

/// hyper's HTTP/1 read buffer cannot be smaller than this.
const MIN_HEADER_BYTES: usize = 8192;

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

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            stream_max_entries: 100_000,
            stream_max_bytes: 256 * 1024 * 1024,
            max_header_bytes: 64 * 1024,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            streams_per_session: 100,
            streams_per_principal: 1_000,
            max_log_bytes: None,
            max_retained_streams: 500_000,
            max_sessions: 4_096,
            max_sessions_per_principal: 256,
            unused_session_secs: 300,
        }
    }
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

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SseConfig {
    /// The `retry:` (milliseconds) sent to clients with each new SSE stream.
    pub retry_ms: u64,
    /// Seconds of upstream silence after which a keep-alive comment is sent.
    pub keepalive_secs: u64,
}

/// Where the log lives (`[store] backend`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Append-only segment files under `data_dir/journal` (the default).
    #[default]
    Journal,
    /// sled trees under `data_dir/log`: the first backend, kept for
    /// comparison and for data directories written by it.
    Sled,
    /// Redis at `redis_url`, keys under `key_prefix`: several instances
    /// share the log and serve every session (HTTP upstreams only).
    Redis,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub backend: Backend,
    pub sync: SyncMode,
    /// Seconds a finished stream stays replayable.
    pub retention_secs: u64,
    /// Seconds without any request after which a session is ended.
    pub session_idle_secs: u64,
    /// Seconds between sweeps for expired streams and sessions.
    pub sweep_secs: u64,
    /// The Redis server of `backend = "redis"` (`url` is accepted too):
    /// `redis://` or, over TLS, `rediss://`. Never a password in it.
    #[serde(alias = "url")]
    pub redis_url: String,
    /// The ACL user Redis is reached as (`AUTH user password`); unset:
    /// the URL's user, else `default`.
    pub redis_username: Option<String>,
    /// A file holding the password (its first line); else the environment
    /// variable `MCP_RESUME_PROXY_REDIS_PASSWORD`; else none.
    pub redis_password_file: Option<PathBuf>,
    /// CA certificates (PEM) a `rediss://` server must chain to; unset: the
    /// system's roots.
    pub redis_ca_file: Option<PathBuf>,
    /// A client certificate (PEM) for Redis' `tls-auth-clients`, with its
    /// key in `redis_client_key`.
    pub redis_client_cert: Option<PathBuf>,
    pub redis_client_key: Option<PathBuf>,
    /// Redis Sentinel: the sentinels (`redis://host:26379`, or all
    /// `rediss://`) asked for the primary named `redis_sentinel_master`, in
    /// place of `redis_url`'s server; asked again whenever the primary
    /// fails or turns replica. The user, password and TLS keys above apply
    /// to the data nodes (TLS with `rediss://` sentinels).
    pub redis_sentinels: Vec<String>,
    pub redis_sentinel_master: Option<String>,
    /// The sentinels' own password (`requirepass`), if they have one: its
    /// first line.
    pub redis_sentinel_password_file: Option<PathBuf>,
    /// Redis Cluster: some of its nodes (`redis://host:7000`, or all
    /// `rediss://`), in place of `redis_url` and of sentinels; the client
    /// learns the rest, and follows resharding and failovers. The user,
    /// password and TLS keys above apply to every node.
    pub redis_cluster: Vec<String>,
    /// The start of every key `backend = "redis"` writes, so that several
    /// deployments can share one Redis.
    pub key_prefix: String,
    /// How long an instance sharing a Redis log stays the owner of its
    /// calls without renewing its lease; after that, another instance takes
    /// them over (so also the longest a call of a dead instance waits).
    pub lease_ms: u64,
    /// With `backend = "redis"`: how many replicas must hold a write before
    /// the proxy counts it written (Redis `WAIT` after each), so that a
    /// failover loses nothing a client was told; 0 (the default): the
    /// primary's answer is enough, as Redis replicates asynchronously.
    pub min_replicas: u32,
    /// How long a write waits for `min_replicas` replicas before it fails
    /// (milliseconds; unset: [`DEFAULT_REPLICA_WAIT_MS`]).
    pub replica_wait_ms: Option<u64>,
    /// Bytes of sled's page cache (`backend = "sled"`): what the sled log
    /// may keep in memory however much it retains (sled's own default is 1
    /// GiB).
    pub sled_cache_bytes: u64,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Path the upstream is mounted at on the proxy.
    #[serde(default = "default_mount")]
    pub path: String,
    /// The upstream's Streamable HTTP endpoint. Exactly one of `url`,
    /// `urls` and `command` is given.
    #[serde(default)]
    pub url: Option<String>,
    /// Replicas of one Streamable HTTP server (pods behind a Service): each
    /// upstream session stays on the replica that created it.
    #[serde(default)]
    pub urls: Option<Vec<String>>,
    /// Consecutive failures (no connection, HTTP 502 to 504, a timeout, a
    /// stream silent past `idle_timeout_ms`, a failed health check)
    /// after which a replica of `urls` takes no new sessions and its
    /// sessions move to another.
    #[serde(default = "default_eject_after")]
    pub eject_after: u32,
    /// Milliseconds a replica stays out after it failed `eject_after`
    /// times; doubled each time it fails again right after (up to 32
    /// times as long), reset by a success.
    #[serde(default = "default_eject_ms")]
    pub eject_ms: u64,
    /// `"each"`: every address the host of `url` resolves to is a replica
    /// (a Kubernetes headless Service), looked up again every
    /// `resolve_every_ms`. `"one"` (default): the host is one server.
    #[serde(default)]
    pub resolve: Resolve,
    /// Milliseconds between two look-ups of a `resolve = "each"` host.
    #[serde(default = "default_resolve_every")]
    pub resolve_every_ms: u64,
    /// An active health check: a GET of this path on each replica every
    /// `health_every_ms`; a non-2xx answer, or none within the interval,
    /// counts as a failure toward `eject_after`, and a 2xx brings an
    /// ejected replica back. Off when unset.
    #[serde(default)]
    pub health_path: Option<String>,
    /// Milliseconds between two health checks of a replica.
    #[serde(default = "default_health_every")]
    pub health_every_ms: u64,
    /// Where the host of a `resolve = "each"` upstream is looked up: the
    /// system's resolver, unless the program embedding the proxy gives a
    /// table of its own (never from the file).
    #[serde(skip)]
    pub lookup: Lookup,
    /// A stdio MCP server: program and arguments. One child per session.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Extra environment variables for the child.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Working directory of the child.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Seconds between SIGTERM and SIGKILL when a child is stopped.
    #[serde(default = "default_kill_grace")]
    pub kill_grace_secs: u64,
    /// Most children (sessions) a stdio upstream runs at once; further
    /// `initialize` requests get 503 until a session ends.
    #[serde(default = "default_max_children")]
    pub max_children: usize,
    /// Milliseconds to wait for the upstream's response head before the
    /// client is answered with an SSE stream regardless.
    #[serde(default = "default_answer_wait")]
    pub answer_wait_ms: u64,
    /// Seconds to wait for a TCP (and TLS) connection to the upstream.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_secs: u64,
    /// How often the proxy reconnects (with `Last-Event-ID`) to an upstream
    /// stream that was cut before its response.
    #[serde(default = "default_resume_attempts")]
    pub resume_attempts: u32,
    /// Milliseconds a resumed upstream stream may stay silent, its request
    /// unanswered, before the proxy asks again with `Last-Event-ID`: many
    /// servers replay on a resume and never re-attach the stream live.
    /// Doubles while the stream stays silent, up to `resume_poll_max_ms`.
    #[serde(default = "default_resume_poll")]
    pub resume_poll_ms: u64,
    /// The longest pause between two such asks.
    #[serde(default = "default_resume_poll_max")]
    pub resume_poll_max_ms: u64,
    /// Milliseconds an upstream request may go without a byte from the
    /// upstream (head or stream) before it fails with a JSON-RPC error and
    /// is cancelled upstream. Off by default: long, quiet tools are the point.
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Milliseconds an upstream request may take in all, from the client's
    /// POST to its last response. Off by default.
    #[serde(default)]
    pub request_timeout_ms: Option<u64>,
    /// Resume tokens (seeds 000/001) for this upstream's tool calls.
    #[serde(default)]
    pub resume_tokens: ResumeTokensConfig,
    /// Tasks for modern (2026-07-28) clients.
    #[serde(default)]
    pub tasks: TasksConfig,
    /// PEM CA certificates trusted for an https `url`, in addition to the
    /// built-in (webpki) roots: for upstreams with a private CA.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The URL clients use for this upstream's endpoint
    /// (`https://mcp.example.com/mcp`), when it differs from the proxy's
    /// origin and mount path.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Paths of the upstream's origin forwarded as they are (an upstream
    /// that is its own authorization server: `/authorize`, `/token`,
    /// `/register`). Only these exact paths open.
    #[serde(default)]
    pub passthrough: Vec<String>,
}

fn default_mount() -> String {
    "/mcp".into()
}
fn default_answer_wait() -> u64 {
    5_000
}
fn default_connect_timeout() -> u64 {
    10
}
fn default_resume_attempts() -> u32 {
    3
}
fn default_resume_poll() -> u64 {
    1_000
}
fn default_resume_poll_max() -> u64 {
    30_000
}
fn default_kill_grace() -> u64 {
    5
}
fn default_eject_after() -> u32 {
    3
}
fn default_eject_ms() -> u64 {
    10_000
}
fn default_resolve_every() -> u64 {
    5_000
}
fn default_health_every() -> u64 {
    5_000
}
fn default_max_children() -> usize {
    64
}

/// The most tool names `metrics_tools` may list.
pub const MAX_METRICS_TOOLS: usize = 32;

/// How long a write waits for its replicas when `replica_wait_ms` is unset.
pub const DEFAULT_REPLICA_WAIT_MS: u64 = 1_000;

/// The longest `replica_wait_ms`: a write holds its client's call (and the
/// commands behind it on its connection) for as long.
pub const MAX_REPLICA_WAIT_MS: u64 = 60_000;

impl StoreConfig {
    /// How to reach the Redis log these keys describe.
    pub fn redis_endpoint(&self) -> crate::store::redis::endpoint::Endpoint {
        crate::store::redis::endpoint::Endpoint {
            url: self.redis_url.clone(),
            username: self.redis_username.clone(),
            password_file: self.redis_password_file.clone(),
            ca_file: self.redis_ca_file.clone(),
            client_cert: self.redis_client_cert.clone(),
            client_key: self.redis_client_key.clone(),
            sentinels: self.redis_sentinels.clone(),
            sentinel_master: self.redis_sentinel_master.clone(),
            sentinel_password_file: self.redis_sentinel_password_file.clone(),
            cluster: self.redis_cluster.clone(),
        }
    }

    /// How many replicas a write waits for, and how long.
    pub fn replicas(&self) -> crate::store::redis::Replicas {
        let wait_ms = self.replica_wait_ms.unwrap_or(DEFAULT_REPLICA_WAIT_MS);
        crate::store::redis::Replicas {
            min: self.min_replicas,
            wait: std::time::Duration::from_millis(wait_ms),
        }
    }

    /// `min_replicas` and `replica_wait_ms`: Redis only (the other logs
    /// are on this machine, with no replica to wait for), and a wait that
    /// ends (`WAIT` with 0 would wait forever).
    fn check_replicas(&self) -> Result<(), String> {
        let wait_ms = self.replica_wait_ms;
        if self.backend != Backend::Redis {
            if self.min_replicas > 0 {
                return Err(format!(
                    "store.min_replicas = {} needs backend = \"redis\": the journal and sled \
                     logs are on this machine, with no replica to wait for",
                    self.min_replicas
                ));
            }
            if wait_ms.is_some() {
                return Err(
                    "store.replica_wait_ms is for backend = \"redis\" (with store.min_replicas)"
                        .into(),
                );
            }
            return Ok(());
        }
        match wait_ms {
            Some(0) if self.min_replicas > 0 => Err(
                "store.replica_wait_ms = 0 would let a write wait for its replicas forever \
                 (Redis WAIT 0): give it at least 1"
                    .into(),
            ),
            Some(ms) if ms > MAX_REPLICA_WAIT_MS => Err(format!(
                "store.replica_wait_ms = {ms} is more than {MAX_REPLICA_WAIT_MS}: a write holds \
                 its client's call while it waits"
            )),
            _ => Ok(()),
        }
    }

    /// The Redis keys that must agree with one another: no password in the
    /// URL (it would sit in the file and in every error message), TLS files
    /// only for `rediss://`, a client certificate with its key.
    fn check_redis(&self) -> Result<(), String> {
        let url = &self.redis_url;
        redis_keys::check_redis_url("store.redis_url", url)?;
        let mut scheme = url.split_once("://").map_or("", |(s, _)| s);
        if let Some(nodes) = self.check_cluster()? {
            scheme = nodes;
        }
        if let Some(sentinels) = self.check_sentinels()? {
            scheme = sentinels;
        }
        let tls_files = [
            ("redis_ca_file", &self.redis_ca_file),
            ("redis_client_cert", &self.redis_client_cert),
            ("redis_client_key", &self.redis_client_key),
        ];
        if let Some((key, _)) = tls_files.iter().find(|(_, f)| f.is_some()) {
            if scheme != "rediss" {
                return Err(format!(
                    "store.{key} is for TLS: store.redis_url (or store.redis_sentinels, \
                     store.redis_cluster) must start with rediss://"
                ));
            }
        }
        if self.redis_client_cert.is_some() != self.redis_client_key.is_some() {
            return Err("store.redis_client_cert and store.redis_client_key go together".into());
        }
        Ok(())
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("./mcp-resume-proxy-data"),
            log_format: LogFormat::Text,
            max_body: 4 * 1024 * 1024,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            principal_header: "authorization".into(),
            public_url: None,
            trusted_proxies: Vec::new(),
            cors: None,
            drain_delay_secs: 0,
            shutdown_grace_secs: 5,
            metrics: true,
            metrics_tools: Vec::new(),
            access_log: true,
            workers: None,
            sse: SseConfig::default(),
            store: StoreConfig::default(),
            limits: LimitsConfig::default(),
            dialects: DialectsConfig::default(),
            tokens: TokensConfig::default(),
            tls: None,
            auth: auth::AuthConfig::default(),
            tracing: TracingConfig::default(),
            upstream: Vec::new(),
        }
    }
}

impl Default for SseConfig {
    fn default() -> Self {
        Self {
            retry_ms: 1_000,
            keepalive_secs: 15,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Journal,
            sync: SyncMode::Batch,
            retention_secs: 900,
            session_idle_secs: 86_400,
            sweep_secs: 30,
            redis_url: "redis://127.0.0.1:6379/0".into(),
            redis_username: None,
            redis_password_file: None,
            redis_ca_file: None,
            redis_client_cert: None,
            redis_client_key: None,
            redis_sentinels: Vec::new(),
            redis_sentinel_master: None,
            redis_sentinel_password_file: None,
            redis_cluster: Vec::new(),
            key_prefix: "mcp-resume-proxy".into(),
            lease_ms: 10_000,
            min_replicas: 0,
            replica_wait_ms: None,
            sled_cache_bytes: crate::store::sled::DEFAULT_CACHE_BYTES,
        }
    }
}

impl UpstreamConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            ..Self::command(Vec::new())
        }
    }

    pub fn command(argv: Vec<String>) -> Self {
        Self {
            path: default_mount(),
            url: None,
            urls: None,
            eject_after: default_eject_after(),
            eject_ms: default_eject_ms(),
            resolve: Resolve::default(),
            resolve_every_ms: default_resolve_every(),
            health_path: None,
            health_every_ms: default_health_every(),
            lookup: Lookup::default(),
            command: (!argv.is_empty()).then_some(argv),
            env: Default::default(),
            cwd: None,
            kill_grace_secs: default_kill_grace(),
            max_children: default_max_children(),
            answer_wait_ms: default_answer_wait(),
            connect_timeout_secs: default_connect_timeout(),
            resume_attempts: default_resume_attempts(),
            resume_poll_ms: default_resume_poll(),
            resume_poll_max_ms: default_resume_poll_max(),
            idle_timeout_ms: None,
            request_timeout_ms: None,
            resume_tokens: ResumeTokensConfig::default(),
            tasks: TasksConfig::default(),
            ca_file: None,
            public_url: None,
            passthrough: Vec::new(),
        }
    }
}

/// The longest `drain_delay_secs`: ten minutes is past any balancer's
/// health checks; more is a value meant as milliseconds.
pub const MAX_DRAIN_DELAY_SECS: u64 = 600;

/// The paths the proxy answers itself, before any check, so that no
/// upstream can be mounted there.
pub const PROBES: [&str; 3] = ["/healthz", "/livez", "/readyz"];

/// A configuration problem, worded for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    /// How many worker threads serve connections.
    pub fn workers(&self) -> usize {
        self.workers
            .unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            })
            .max(1)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |msg: String| Err(ConfigError(msg));
        if self.upstream.is_empty() {
            return fail(
                "no upstream: give --upstream URL, --upstream-command CMD, or at least one \
                 [[upstream]] table with `url` or `command`"
                    .into(),
            );
        }
        if self.workers == Some(0) {
            return fail("workers = 0: at least one thread must serve connections".into());
        }
        if self.drain_delay_secs > MAX_DRAIN_DELAY_SECS {
            return fail(format!(
                "drain_delay_secs = {} is more than {MAX_DRAIN_DELAY_SECS}: it counts seconds, \
                 the time a load balancer takes to see /readyz fail",
                self.drain_delay_secs
            ));
        }
        let tools = &self.metrics_tools;
        let max_tools = MAX_METRICS_TOOLS;
        if tools.len() > max_tools {
            return fail(format!(
                "metrics_tools lists {} tools; at most {max_tools} get a series of their own \
                 (each multiplies the series of every route)",
                tools.len()
            ));
        }
        if let Some(bad) = tools.iter().find(|t| t.is_empty() || t.len() > 128) {
            return fail(format!(
                "metrics_tools: {bad:?} is not a tool name (1 to 128 characters)"
            ));
        }
        if self.max_body < 1024 {
            return fail(format!(
                "max_body = {} is too small (minimum 1024)",
                self.max_body
            ));
        }
        let prefix = &self.store.key_prefix;
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            // Braces would break the hash tags that keep a stream's keys in
            // one Redis Cluster slot.
            return fail(format!(
                "store.key_prefix = {prefix:?} must be non-empty and without braces"
            ));
        }
        self.store.check_redis().map_err(ConfigError)?;
        self.store.check_replicas().map_err(ConfigError)?;
        if self.store.lease_ms < 300 {
            return fail(format!(
                "store.lease_ms = {} is too short (minimum 300: it is renewed every third)",
                self.store.lease_ms
            ));
        }
        if self.store.backend == Backend::Redis && self.tokens.key_file.is_none() {
            return fail(
                "backend = \"redis\" needs tokens.key_file: every instance must seal resume \
                 tokens and event ids with the same key (a key generated into each data_dir \
                 would make one instance's handles unknown to the others)"
                    .into(),
            );
        }
        if self.store.backend == Backend::Redis {
            if let Some(up) = self.upstream.iter().find(|u| u.command.is_some()) {
                return fail(format!(
                    "upstream {:?} is a stdio command, and a stdio child belongs to one proxy \
                     process: it cannot be shared through backend = \"redis\" (use the journal, \
                     or put the server behind Streamable HTTP)",
                    up.path
                ));
            }
        }
        for (key, value) in [
            ("store.retention_secs", self.store.retention_secs),
            ("store.session_idle_secs", self.store.session_idle_secs),
            ("store.sweep_secs", self.store.sweep_secs),
            ("sse.keepalive_secs", self.sse.keepalive_secs),
        ] {
            if value == 0 {
                return fail(format!("{key} must be greater than 0"));
            }
        }
        for (key, value) in [
            ("limits.stream_max_entries", self.limits.stream_max_entries),
            (
                "limits.streams_per_session",
                self.limits.streams_per_session as u64,
            ),
            (
                "limits.streams_per_principal",
                self.limits.streams_per_principal as u64,
            ),
            ("limits.stream_max_bytes", self.limits.stream_max_bytes),
            ("limits.max_sessions", self.limits.max_sessions as u64),
            (
                "limits.max_sessions_per_principal",
                self.limits.max_sessions_per_principal as u64,
            ),
            (
                "limits.unused_session_secs",
                self.limits.unused_session_secs,
            ),
        ] {
            if value == 0 {
                return fail(format!("{key} must be greater than 0"));
            }
        }
        if self.limits.max_header_bytes < MIN_HEADER_BYTES
            || u32::try_from(self.limits.max_header_bytes).is_err()
        {
            return fail(format!(
                "limits.max_header_bytes = {} must be between {MIN_HEADER_BYTES} and {}",
                self.limits.max_header_bytes,
                u32::MAX
            ));
        }
        for (key, value) in [
            (
                "limits.header_read_timeout_ms",
                self.limits.header_read_timeout_ms,
            ),
            (
                "limits.body_read_timeout_ms",
                self.limits.body_read_timeout_ms,
            ),
        ] {
            if value == 0 {
                return fail(format!("{key} must be greater than 0"));
            }
        }
        for up in &self.upstream {
            if up.resume_poll_ms == 0 || up.resume_poll_max_ms < up.resume_poll_ms {
                return fail(format!(
                    "upstream {:?}: resume_poll_ms = {} must be greater than 0 and not above \
                     resume_poll_max_ms = {}",
                    up.path, up.resume_poll_ms, up.resume_poll_max_ms
                ));
            }
            let tasks = &up.tasks;
            if tasks.ttl_ms == 0 || tasks.poll_interval_ms == 0 {
                return fail(format!(
                    "upstream {:?}: tasks.ttl_ms and tasks.poll_interval_ms must be greater than 0",
                    up.path
                ));
            }
            if tasks.legacy && tasks.result_waiters == 0 {
                return fail(format!(
                    "upstream {:?}: tasks.result_waiters must be greater than 0 with tasks.legacy",
                    up.path
                ));
            }
        }
        let rr = &self.dialects.resumable_requests;
        if rr.max_wait_ms < 1_000 || rr.min_wait_ms > rr.max_wait_ms {
            return fail(format!(
                "dialects.resumable_requests: max_wait_ms = {} must be at least 1000 and not \
                 below min_wait_ms = {}",
                rr.max_wait_ms, rr.min_wait_ms
            ));
        }
        let st = &self.dialects.streams;
        if st.max_ms < 1_000 || st.min_ms > st.max_ms {
            return fail(format!(
                "dialects.streams: max_ms = {} must be at least 1000 and not below min_ms = {}",
                st.max_ms, st.min_ms
            ));
        }
        if http::HeaderName::from_bytes(self.principal_header.as_bytes()).is_err() {
            return fail(format!(
                "principal_header = {:?} is not a valid header name",
                self.principal_header
            ));
        }
        edge::validate(self).map_err(ConfigError)?;
        self.auth.validate()?;
        self.tracing.validate()?;
        let mut paths = std::collections::HashSet::new();
        for (i, up) in self.upstream.iter().enumerate() {
            let key = format!("upstream[{i}]");
            if !up.path.starts_with('/') || PROBES.contains(&up.path.trim_end_matches('/')) {
                return fail(format!(
                    "{key}.path = {:?} must start with '/' and must not be /healthz, /livez or \
                     /readyz",
                    up.path
                ));
            }
            if self.metrics && up.path.trim_end_matches('/') == "/metrics" {
                return fail(format!(
                    "{key}.path = \"/metrics\" is where metrics are served; set metrics = false to mount an upstream there"
                ));
            }
            if !paths.insert(up.path.trim_end_matches('/')) {
                return fail(format!("{key}.path = {:?} is mounted twice", up.path));
            }
            upstream::check_endpoint(&key, up).map_err(ConfigError)?;
            let rt = &up.resume_tokens;
            if rt.interim_after_ms == 0 || rt.idle_expiry_ms < rt.interim_after_ms {
                return fail(format!(
                    "{key}.resume_tokens: interim_after_ms must be greater than 0 and not above \
                     idle_expiry_ms"
                ));
            }
            if up.ca_file.is_some() && up.command.is_some() {
                return fail(format!(
                    "{key}.ca_file applies to an https `url`, not to a `command`"
                ));
            }
            if up.connect_timeout_secs == 0 {
                return fail(format!("{key}.connect_timeout_secs must be greater than 0"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_file_gets_every_default() {
        let c = Config::from_toml("[[upstream]]\nurl = \"http://127.0.0.1:3000/mcp\"\n").unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.upstream[0].path, "/mcp");
        assert_eq!(c.store.sync, SyncMode::Batch);
        assert_eq!(c.max_body, 4 * 1024 * 1024);
    }

    #[test]
    fn workers_are_taken_as_given_and_zero_is_refused() {
        let c = Config::from_toml("workers = 3\n[[upstream]]\nurl = \"http://a/\"\n").unwrap();
        assert_eq!(c.workers(), 3);
        let unset = Config::from_toml("[[upstream]]\nurl = \"http://a/\"\n").unwrap();
        assert!(unset.workers() >= 1);
        let err = Config::from_toml("workers = 0\n[[upstream]]\nurl = \"http://a/\"\n");
        assert!(err.unwrap_err().0.contains("workers = 0"));
    }

    #[test]
    fn the_example_file_is_valid() {
        let text = include_str!("../../proxy.toml.example");
        Config::from_toml(text).unwrap();
    }

    #[test]
    fn the_redis_url_may_be_given_as_url() {
        let c = Config::from_toml(
            "[store]\nbackend = \"redis\"\nurl = \"redis://r:1/0\"\n\
             [tokens]\nkey_file = \"k\"\n[[upstream]]\nurl = \"http://a/\"\n",
        )
        .unwrap();
        assert_eq!(c.store.redis_url, "redis://r:1/0");
    }

    #[test]
    fn the_redis_backend_refuses_a_stdio_upstream_and_a_key_of_its_own() {
        let stdio = "[store]\nbackend = \"redis\"\n[tokens]\nkey_file = \"k\"\n\
                     [[upstream]]\ncommand = [\"server\"]\n";
        let err = Config::from_toml(stdio).unwrap_err();
        assert!(err.0.contains("stdio") && err.0.contains("redis"), "{err}");
        let no_key = "[store]\nbackend = \"redis\"\n[[upstream]]\nurl = \"http://a/\"\n";
        let err = Config::from_toml(no_key).unwrap_err();
        assert!(err.0.contains("tokens.key_file"), "{err}");
    }

    #[test]
    fn sleds_page_cache_is_bounded_by_default_and_set_by_its_key() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        let c = Config::from_toml(up).unwrap();
        assert_eq!(c.store.sled_cache_bytes, 128 * 1024 * 1024);
        let set = "[store]\nbackend = \"sled\"\nsled_cache_bytes = 33554432\n";
        let c = Config::from_toml(&format!("{set}{up}")).unwrap();
        assert_eq!(c.store.sled_cache_bytes, 32 * 1024 * 1024);
    }

    #[test]
    fn the_journal_is_the_default_backend_and_sled_or_redis_can_be_chosen() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        let c = Config::from_toml(up).unwrap();
        assert_eq!(c.store.backend, Backend::Journal);
        let c = Config::from_toml(&format!("[store]\nbackend = \"sled\"\n{up}")).unwrap();
        assert_eq!(c.store.backend, Backend::Sled);
        let key = "[tokens]\nkey_file = \"/etc/proxy/token.key\"\n";
        let c = Config::from_toml(&format!(
            "[store]\nbackend = \"redis\"\nredis_url = \"redis://r:6380/2\"\nkey_prefix = \"p\"\n{key}{up}"
        ))
        .unwrap();
        assert_eq!(c.store.backend, Backend::Redis);
        assert_eq!(
            (c.store.redis_url.as_str(), c.store.key_prefix.as_str()),
            ("redis://r:6380/2", "p")
        );
        let c = Config::from_toml(&format!("[store]\nbackend = \"redis\"\n{key}{up}")).unwrap();
        assert_eq!(c.store.redis_url, "redis://127.0.0.1:6379/0");
        assert_eq!(c.store.key_prefix, "mcp-resume-proxy");
        let err = Config::from_toml(&format!("[store]\nkey_prefix = \"a{{b\"\n{up}")).unwrap_err();
        assert!(err.0.contains("key_prefix"), "{err}");
        let err = Config::from_toml(&format!("[store]\nbackend = \"postgres\"\n{up}")).unwrap_err();
        assert!(err.0.contains("backend"), "{err}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = Config::from_toml("[store]\nsinc = \"batch\"\n").unwrap_err();
        assert!(err.0.contains("sinc"), "{err}");
    }

    #[test]
    fn wrong_values_name_their_key() {
        let err = Config::from_toml("[store]\nsync = \"sometimes\"\n").unwrap_err();
        assert!(err.0.contains("sync"), "{err}");
        let err = Config::from_toml("[[upstream]]\nurl = \"ftp://x\"\n").unwrap_err();
        assert!(err.0.contains("upstream[0].url"), "{err}");
        let err = Config::from_toml(
            "[[upstream]]\nurl = \"http://a/\"\n[[upstream]]\nurl = \"http://b/\"\n",
        )
        .unwrap_err();
        assert!(err.0.contains("upstream[1].path"), "{err}");
    }

    #[test]
    fn a_stdio_upstream_takes_a_command_and_not_a_url() {
        let c = Config::from_toml("[[upstream]]\ncommand = [\"node\", \"server.js\"]\n").unwrap();
        assert_eq!(c.upstream[0].command.as_deref().unwrap().len(), 2);
        let err = Config::from_toml("[[upstream]]\nurl = \"http://a/\"\ncommand = [\"x\"]\n")
            .unwrap_err();
        assert!(err.0.contains("not both"), "{err}");
        let err = Config::from_toml("[[upstream]]\ncommand = []\n").unwrap_err();
        assert!(err.0.contains("upstream[0].command"), "{err}");
    }

    #[test]
    fn front_door_limits_have_defaults_and_bounds() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        let c = Config::from_toml(up).unwrap();
        assert_eq!(c.limits.max_header_bytes, 64 * 1024);
        assert_eq!(c.limits.header_read_timeout(), Duration::from_secs(10));
        assert_eq!(c.limits.body_read_timeout(), Duration::from_secs(30));
        assert_eq!(c.tls, None);
        let err =
            Config::from_toml(&format!("[limits]\nmax_header_bytes = 100\n{up}")).unwrap_err();
        assert!(err.0.contains("limits.max_header_bytes"), "{err}");
        let err =
            Config::from_toml(&format!("[limits]\nbody_read_timeout_ms = 0\n{up}")).unwrap_err();
        assert!(err.0.contains("limits.body_read_timeout_ms"), "{err}");
    }

    #[test]
    fn session_bounds_have_defaults_and_zero_is_refused() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        let c = Config::from_toml(up).unwrap();
        assert_eq!(
            (
                c.limits.max_sessions,
                c.limits.max_sessions_per_principal,
                c.limits.unused_session_secs
            ),
            (4_096, 256, 300)
        );
        for key in [
            "max_sessions",
            "max_sessions_per_principal",
            "unused_session_secs",
        ] {
            let err = Config::from_toml(&format!("[limits]\n{key} = 0\n{up}")).unwrap_err();
            assert!(err.0.contains(&format!("limits.{key}")), "{err}");
        }
    }

    #[test]
    fn tls_takes_cert_key_and_an_optional_client_ca() {
        let up = "[[upstream]]\nurl = \"https://a/\"\nca_file = \"up.pem\"\n";
        let c =
            Config::from_toml(&format!("[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n{up}")).unwrap();
        let tls = c.tls.unwrap();
        assert_eq!(tls.cert, PathBuf::from("c.pem"));
        assert_eq!(tls.client_ca, None);
        assert_eq!(c.upstream[0].ca_file, Some(PathBuf::from("up.pem")));
        let err = Config::from_toml(&format!("[tls]\ncert = \"c.pem\"\n{up}")).unwrap_err();
        assert!(err.0.contains("key"), "{err}");
        let err = Config::from_toml("[[upstream]]\ncommand = [\"x\"]\nca_file = \"a.pem\"\n")
            .unwrap_err();
        assert!(err.0.contains("upstream[0].ca_file"), "{err}");
    }

    #[test]
    fn the_drain_delay_is_off_by_default_and_bounded() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        let c = Config::from_toml(up).unwrap();
        assert_eq!(c.drain_delay_secs, 0);
        let c = Config::from_toml(&format!("drain_delay_secs = 15\n{up}")).unwrap();
        assert_eq!(c.drain_delay_secs, 15);
        let err = Config::from_toml(&format!("drain_delay_secs = 5000\n{up}")).unwrap_err();
        assert!(err.0.contains("drain_delay_secs = 5000"), "{err}");
    }

    #[test]
    fn the_access_log_is_on_and_no_tool_is_a_label_by_default() {
        let c = Config::from_toml("[[upstream]]\nurl = \"http://a/\"\n").unwrap();
        assert!(c.access_log);
        assert!(c.metrics_tools.is_empty());
    }

    #[test]
    fn a_password_in_the_redis_url_is_refused() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        for url in ["redis://:pw@r:6379/0", "rediss://user:pw@r:6380/0"] {
            let toml = format!("[store]\nredis_url = \"{url}\"\n{up}");
            let err = Config::from_toml(&toml).unwrap_err();
            assert!(err.0.contains("store.redis_url holds a password"), "{err}");
            assert!(!err.0.contains("pw"), "{err}");
        }
        let user_only = format!("[store]\nredis_url = \"rediss://user@r:6380/0\"\n{up}");
        assert!(Config::from_toml(&user_only).is_ok());
    }

    #[test]
    fn redis_tls_files_need_a_rediss_url_and_a_certificate_its_key() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        let plain =
            format!("[store]\nredis_url = \"redis://r/0\"\nredis_ca_file = \"/ca.pem\"\n{up}");
        let err = Config::from_toml(&plain).unwrap_err();
        assert!(err.0.contains("store.redis_ca_file is for TLS"), "{err}");
        let half =
            format!("[store]\nredis_url = \"rediss://r/0\"\nredis_client_cert = \"/c.pem\"\n{up}");
        let err = Config::from_toml(&half).unwrap_err();
        assert!(err.0.contains("go together"), "{err}");
    }

    #[test]
    fn a_write_waits_for_no_replica_by_default_and_for_a_second_when_asked() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        let c = Config::from_toml(up).unwrap();
        assert_eq!(c.store.replicas().min, 0);
        let redis = "[store]\nbackend = \"redis\"\nmin_replicas = 2\n";
        let key = "[tokens]\nkey_file = \"k\"\n";
        let c = Config::from_toml(&format!("{redis}{key}{up}")).unwrap();
        let replicas = c.store.replicas();
        assert_eq!(replicas.min, 2);
        assert_eq!(replicas.wait, std::time::Duration::from_millis(1_000));
        let c = Config::from_toml(&format!("{redis}replica_wait_ms = 250\n{key}{up}")).unwrap();
        assert_eq!(c.store.replicas().wait.as_millis(), 250);
    }

    #[test]
    fn min_replicas_and_replica_wait_ms_are_refused_off_redis() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        for backend in ["journal", "sled"] {
            let toml = format!("[store]\nbackend = \"{backend}\"\nmin_replicas = 1\n{up}");
            let err = Config::from_toml(&toml).unwrap_err();
            assert!(
                err.0
                    .contains("store.min_replicas = 1 needs backend = \"redis\""),
                "{err}"
            );
            let toml = format!("[store]\nbackend = \"{backend}\"\nreplica_wait_ms = 500\n{up}");
            let err = Config::from_toml(&toml).unwrap_err();
            assert!(
                err.0.contains("store.replica_wait_ms is for backend"),
                "{err}"
            );
        }
        let off = format!("[store]\nmin_replicas = 0\n{up}");
        assert!(Config::from_toml(&off).is_ok(), "0 is the default");
    }

    #[test]
    fn a_replica_wait_of_zero_or_of_more_than_a_minute_is_refused() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n[tokens]\nkey_file = \"k\"\n";
        let redis = "[store]\nbackend = \"redis\"\nmin_replicas = 1\n";
        let err = Config::from_toml(&format!("{redis}replica_wait_ms = 0\n{up}")).unwrap_err();
        assert!(err.0.contains("store.replica_wait_ms = 0"), "{err}");
        let err = Config::from_toml(&format!("{redis}replica_wait_ms = 60001\n{up}")).unwrap_err();
        assert!(err.0.contains("store.replica_wait_ms = 60001"), "{err}");
        assert!(Config::from_toml(&format!("{redis}replica_wait_ms = 60000\n{up}")).is_ok());
    }

    #[test]
    fn metrics_tools_are_bounded_and_named() {
        let up = "[[upstream]]\nurl = \"http://a/\"\n";
        let many: Vec<String> = (0..=MAX_METRICS_TOOLS)
            .map(|i| format!("\"t{i}\""))
            .collect();
        let toml = format!("metrics_tools = [{}]\n{up}", many.join(","));
        let err = Config::from_toml(&toml).unwrap_err();
        assert!(err.0.contains("metrics_tools lists 33 tools"), "{err}");
        let err = Config::from_toml(&format!("metrics_tools = [\"\"]\n{up}")).unwrap_err();
        assert!(
            err.0.contains("metrics_tools: \"\" is not a tool name"),
            "{err}"
        );
    }

    #[test]
    fn no_upstream_is_mounted_where_the_probes_answer() {
        for path in ["/healthz", "/livez", "/readyz/"] {
            let err = Config::from_toml(&format!(
                "[[upstream]]\nurl = \"http://a/\"\npath = \"{path}\"\n"
            ))
            .unwrap_err();
            assert!(err.0.contains("upstream[0].path"), "{path}: {err}");
        }
    }

    #[test]
    fn a_config_without_upstream_is_rejected() {
        let err = Config::from_toml("").unwrap_err();
        assert!(err.0.contains("upstream"), "{err}");
    }
}
