//! An `[[upstream]]`: its keys and their defaults, and what it is reached
//! at: one `url`, several `urls` (the replicas of one server), one `url`
//! whose host's every address is a replica (`resolve = "each"`) or a stdio
//! `command`; its optional health check; and the checks that refuse a bad
//! one at start with the key it is under. Plain data: nothing here connects anywhere, looks a name up or
//! knows how replicas are chosen (`upstream::replicas`, `upstream::resolve`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use std::path::PathBuf;

use super::{ResumeTokensConfig, TasksConfig};

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

/// What the host of an upstream's `url` stands for.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Resolve {
    /// One server, wherever the system's resolver says it is at connect
    /// time.
    #[default]
    One,
    /// Every address it resolves to is a replica of the server.
    Each,
}

/// Where the host of a `resolve = "each"` upstream is looked up.
#[derive(Clone, Default)]
pub enum Lookup {
    /// The system's resolver (`getaddrinfo`: `/etc/hosts`, DNS).
    #[default]
    System,
    /// A table of host names to addresses that the program embedding the
    /// proxy keeps, and may change while it runs: what it holds for a
    /// name is what the system's resolver would answer. Tests use it to
    /// stand for a headless Service whose pods come and go, which they
    /// cannot make of the machine's resolver.
    Table(Arc<Mutex<BTreeMap<String, Vec<IpAddr>>>>),
}

impl PartialEq for Lookup {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Lookup::System, Lookup::System) => true,
            (Lookup::Table(a), Lookup::Table(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lookup::System => f.write_str("System"),
            Lookup::Table(_) => f.write_str("Table"),
        }
    }
}

impl UpstreamConfig {
    /// The Streamable HTTP endpoints of this upstream, as configured: its
    /// `url`, or each of its `urls`; none for a stdio `command`.
    pub fn endpoints(&self) -> Vec<&str> {
        match (&self.url, &self.urls) {
            (Some(url), _) => vec![url.as_str()],
            (None, Some(urls)) => urls.iter().map(String::as_str).collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// Checks that `up` names exactly one way to reach its server, and that
/// every URL of it is usable. `key` is the table's key (`upstream[0]`).
pub(super) fn check_endpoint(key: &str, up: &UpstreamConfig) -> Result<(), String> {
    check_health(key, up)?;
    if up.resolve == Resolve::Each {
        return check_resolved(key, up);
    }
    match (&up.url, &up.urls, &up.command) {
        (Some(url), None, None) => check_url(&format!("{key}.url"), url).map(|_| ()),
        (None, Some(urls), None) => {
            check_urls(key, urls)?;
            check_ejection(key, up)
        }
        (None, None, Some(argv)) if argv.first().is_some_and(|p| !p.is_empty()) => Ok(()),
        (None, None, Some(_)) => Err(format!("{key}.command must name a program")),
        (None, None, None) => Err(format!("{key}: `url` or `command` is required")),
        (Some(_), None, Some(_)) => Err(format!("{key}: give either `url` or `command`, not both")),
        _ => Err(format!(
            "{key}: give one of `url`, `urls` and `command`, not several"
        )),
    }
}

/// The replicas' URLs: at least one, each usable, none twice.
fn check_urls(key: &str, urls: &[String]) -> Result<(), String> {
    if urls.is_empty() {
        return Err(format!("{key}.urls is empty: list at least one replica"));
    }
    let mut seen = Vec::with_capacity(urls.len());
    for (i, url) in urls.iter().enumerate() {
        let same = check_url(&format!("{key}.urls[{i}]"), url)?;
        if let Some(j) = seen.iter().position(|s| *s == same) {
            return Err(format!(
                "{key}.urls[{i}] = {url:?} is the same replica as {key}.urls[{j}] = {:?}: \
                 each replica is listed once",
                urls[j]
            ));
        }
        seen.push(same);
    }
    Ok(())
}

/// `resolve = "each"`: one usable `url`, looked up again now and then.
fn check_resolved(key: &str, up: &UpstreamConfig) -> Result<(), String> {
    let Some(url) = up
        .url
        .as_deref()
        .filter(|_| up.urls.is_none() && up.command.is_none())
    else {
        return Err(format!(
            "{key}.resolve = \"each\" needs `url` alone (one host, each of whose addresses \
             is a replica), not `urls` or `command`"
        ));
    };
    check_url(&format!("{key}.url"), url)?;
    if up.resolve_every_ms == 0 {
        return Err(format!("{key}.resolve_every_ms must be greater than 0"));
    }
    check_ejection(key, up)
}

/// An active health check: a path of the upstream's origin, checked now
/// and then, on an HTTP upstream.
fn check_health(key: &str, up: &UpstreamConfig) -> Result<(), String> {
    let Some(path) = up.health_path.as_deref() else {
        return Ok(());
    };
    if up.command.is_some() {
        return Err(format!(
            "{key}.health_path is for HTTP upstreams (`url`, `urls`), not `command`"
        ));
    }
    let usable = path.starts_with('/') && path.parse::<http::uri::PathAndQuery>().is_ok();
    if !usable {
        return Err(format!(
            "{key}.health_path = {path:?} is not a path (it begins with `/`)"
        ));
    }
    if up.health_every_ms == 0 {
        return Err(format!("{key}.health_every_ms must be greater than 0"));
    }
    check_ejection(key, up)
}

/// A replica is taken out after at least one failure, for some time.
fn check_ejection(key: &str, up: &UpstreamConfig) -> Result<(), String> {
    if up.eject_after == 0 {
        return Err(format!("{key}.eject_after must be greater than 0"));
    }
    if up.eject_ms == 0 {
        return Err(format!("{key}.eject_ms must be greater than 0"));
    }
    Ok(())
}

/// Checks one endpoint URL and returns what makes it the same replica as
/// another (scheme, host, port, path and query), whatever its spelling.
fn check_url(key: &str, url: &str) -> Result<(String, String, u16, String), String> {
    let bad = || format!("{key} = {url:?} is not an http:// or https:// URL");
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    let scheme = uri
        .scheme_str()
        .map(str::to_ascii_lowercase)
        .ok_or_else(bad)?;
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return Err(bad()),
    };
    let authority = uri.authority().ok_or_else(bad)?;
    let host = authority.host().to_ascii_lowercase();
    let port = authority.port_u16().unwrap_or(default_port);
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    Ok((scheme, host, port, path))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn refused(upstream: &str) -> String {
        let toml = format!("[[upstream]]\n{upstream}");
        match Config::from_toml(&toml) {
            Ok(_) => panic!("accepted: {upstream}"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn replicas_are_listed_under_urls() {
        let toml = "[[upstream]]\nurls = [\"http://a/mcp\", \"http://b:8080/mcp\"]\n";
        let c = Config::from_toml(toml).unwrap();
        assert_eq!(
            c.upstream[0].endpoints(),
            ["http://a/mcp", "http://b:8080/mcp"]
        );
        assert_eq!(
            (c.upstream[0].eject_after, c.upstream[0].eject_ms),
            (3, 10_000)
        );
        let one = Config::from_toml("[[upstream]]\nurl = \"http://a/mcp\"\n").unwrap();
        assert_eq!(one.upstream[0].endpoints(), ["http://a/mcp"]);
    }

    #[test]
    fn an_empty_replica_list_is_refused() {
        let err = refused("urls = []\n");
        assert!(err.contains("upstream[0].urls is empty"), "{err}");
    }

    #[test]
    fn a_replica_listed_twice_is_refused_however_spelled() {
        for urls in [
            r#"["http://a/mcp", "http://b/mcp", "http://a/mcp"]"#,
            r#"["http://A:80/mcp", "http://b/mcp", "http://a/mcp"]"#,
        ] {
            let err = refused(&format!("urls = {urls}\n"));
            assert!(err.contains("upstream[0].urls[2]"), "{err}");
            assert!(err.contains("upstream[0].urls[0]"), "{err}");
        }
        let other_path = r#"urls = ["http://a/mcp", "http://a/other"]"#;
        Config::from_toml(&format!("[[upstream]]\n{other_path}\n")).unwrap();
    }

    #[test]
    fn a_bad_replica_url_is_refused_by_its_index() {
        for bad in ["ftp://c/mcp", "not a url", "/mcp", ""] {
            let err = refused(&format!("urls = [\"http://a/mcp\", {bad:?}]\n"));
            assert!(err.contains("upstream[0].urls[1]"), "{bad}: {err}");
        }
    }

    #[test]
    fn urls_mixed_with_url_or_command_is_refused() {
        for mixed in [
            "url = \"http://a/mcp\"\nurls = [\"http://b/mcp\"]\n",
            "urls = [\"http://b/mcp\"]\ncommand = [\"x\"]\n",
            "url = \"http://a/mcp\"\nurls = [\"http://b/mcp\"]\ncommand = [\"x\"]\n",
        ] {
            let err = refused(mixed);
            assert!(err.contains("one of `url`, `urls` and `command`"), "{err}");
        }
    }

    #[test]
    fn ejection_needs_a_failure_and_a_time() {
        let urls = "urls = [\"http://a/mcp\", \"http://b/mcp\"]\n";
        let err = refused(&format!("{urls}eject_after = 0\n"));
        assert!(err.contains("upstream[0].eject_after"), "{err}");
        let err = refused(&format!("{urls}eject_ms = 0\n"));
        assert!(err.contains("upstream[0].eject_ms"), "{err}");
    }

    #[test]
    fn each_address_of_a_host_is_a_replica_with_resolve_each() {
        let toml = "[[upstream]]\nurl = \"http://mcp.default.svc:8080/mcp\"\nresolve = \"each\"\n";
        let c = Config::from_toml(toml).unwrap();
        assert_eq!(c.upstream[0].resolve, super::Resolve::Each);
        assert_eq!(c.upstream[0].resolve_every_ms, 5_000);
        let plain = Config::from_toml("[[upstream]]\nurl = \"http://a/mcp\"\n").unwrap();
        assert_eq!(plain.upstream[0].resolve, super::Resolve::One);
    }

    #[test]
    fn resolve_each_needs_url_alone() {
        for other in [
            "urls = [\"http://a/mcp\", \"http://b/mcp\"]\n",
            "command = [\"x\"]\n",
        ] {
            let err = refused(&format!("{other}resolve = \"each\"\n"));
            assert!(err.contains("upstream[0].resolve"), "{err}");
        }
    }

    #[test]
    fn an_unknown_resolve_mode_is_refused() {
        let err = refused("url = \"http://a/mcp\"\nresolve = \"all\"\n");
        assert!(err.contains("resolve"), "{err}");
    }

    #[test]
    fn a_resolve_interval_of_zero_is_refused() {
        let err = refused("url = \"http://a/mcp\"\nresolve = \"each\"\nresolve_every_ms = 0\n");
        assert!(err.contains("upstream[0].resolve_every_ms"), "{err}");
    }

    #[test]
    fn a_health_check_is_off_unless_its_path_is_given() {
        let c = Config::from_toml("[[upstream]]\nurl = \"http://a/mcp\"\n").unwrap();
        assert_eq!(c.upstream[0].health_path, None);
        let toml = "[[upstream]]\nurls = [\"http://a/mcp\", \"http://b/mcp\"]\n\
                    health_path = \"/healthz\"\nhealth_every_ms = 2000\n";
        let c = Config::from_toml(toml).unwrap();
        assert_eq!(c.upstream[0].health_path.as_deref(), Some("/healthz"));
        assert_eq!(c.upstream[0].health_every_ms, 2_000);
    }

    #[test]
    fn a_health_interval_of_zero_is_refused() {
        let err = refused("url = \"http://a/mcp\"\nhealth_path = \"/h\"\nhealth_every_ms = 0\n");
        assert!(err.contains("upstream[0].health_every_ms"), "{err}");
    }

    #[test]
    fn a_health_path_that_is_no_path_is_refused() {
        for bad in ["healthz", "http://a/healthz", "/a b"] {
            let err = refused(&format!("url = \"http://a/mcp\"\nhealth_path = {bad:?}\n"));
            assert!(err.contains("upstream[0].health_path"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_health_check_of_a_stdio_upstream_is_refused() {
        let err = refused("command = [\"x\"]\nhealth_path = \"/healthz\"\n");
        assert!(err.contains("upstream[0].health_path"), "{err}");
    }
}
