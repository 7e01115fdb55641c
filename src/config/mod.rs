//! Configuration: the TOML file, command-line overrides, defaults, and
//! validation with messages that name the offending key.
//!
//! Everything here is plain data; nothing is started. `proxy.toml.example`
//! documents every key with its default and must change with this file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub mod auth;
mod dialects;
pub mod edge;
mod redis_keys;
mod store;
pub mod traces;
mod upstream;

pub use dialects::{
    DialectsConfig, Placement, ResumableRequestsConfig, ResumeTokensConfig, ResumeTokensMode,
    StreamsConfig, TasksConfig,
};
pub use store::{Backend, StoreConfig, DEFAULT_REPLICA_WAIT_MS, MAX_REPLICA_WAIT_MS};
pub use traces::TracingConfig;
pub use upstream::{Lookup, Resolve, UpstreamConfig};

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

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SseConfig {
    /// The `retry:` (milliseconds) sent to clients with each new SSE stream.
    pub retry_ms: u64,
    /// Seconds of upstream silence after which a keep-alive comment is sent.
    pub keepalive_secs: u64,
}

/// The most tool names `metrics_tools` may list.
pub const MAX_METRICS_TOOLS: usize = 32;

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
mod tests;
