//! Two proxy processes sharing one Redis log (`backend = "redis"`), in front
//! of one demo upstream: the rig of every scale-out test. The log is on one
//! Redis server, or on a Redis Cluster (`redis_cluster.rs`). Each rig has
//! its own key prefix, deleted when the rig drops; the token key file is
//! shared by both instances, as the README tells operators to do.

use std::path::{Path, PathBuf};

use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};

use super::process::{free_addr, ProxyProcess};
use super::redis_cluster::RedisCluster;
use super::McpClient;

/// The Redis the tests share: `REDIS_URL`, else this process's private
/// `redis-server`; panics with one line naming what to install without one.
pub fn redis_url() -> String {
    super::redis_server::shared_url()
}

/// A connection to the Redis at `url` that answered PING; fails loudly
/// (never skips) without one.
pub fn require_redis(url: &str) -> redis::Connection {
    super::redis_server::connect(url)
        .unwrap_or_else(|e| panic!("the Redis at {url} did not answer PING: {e}"))
}

#[path = "../../benches/support/redis_keys.rs"]
mod redis_keys;
pub use redis_keys::delete_prefix;

/// One of the two instances: its process, its data dir and address.
pub struct Instance {
    pub proxy: ProxyProcess,
    pub dir: tempfile::TempDir,
    addr: std::net::SocketAddr,
}

impl Instance {
    pub fn client(&self) -> McpClient {
        self.proxy.client()
    }
}

pub struct Cluster {
    pub upstream: DemoUpstream,
    pub a: Instance,
    pub b: Instance,
    pub config: PathBuf,
    log: OwnedLog,
    prefix: String,
    _shared: tempfile::TempDir,
}

/// Where the instances' log is.
#[derive(Clone, Copy)]
pub enum Log<'a> {
    /// The Redis server at this URL.
    Server(&'a str),
    /// This cluster.
    Cluster(&'static RedisCluster),
}

/// The instances' lease: short, so that takeover tests wait about a second.
pub const LEASE_MS: u64 = 1_000;

/// [`Log`], kept by the rig to delete its keys.
enum OwnedLog {
    Server(String),
    Cluster(&'static RedisCluster),
}

impl Log<'_> {
    /// The `[store]` keys that name it.
    fn toml(self) -> String {
        match self {
            Log::Server(url) => format!("redis_url = \"{url}\""),
            Log::Cluster(cluster) => format!("redis_cluster = {:?}", cluster.urls()),
        }
    }

    fn owned(self) -> OwnedLog {
        match self {
            Log::Server(url) => OwnedLog::Server(url.to_owned()),
            Log::Cluster(cluster) => OwnedLog::Cluster(cluster),
        }
    }
}

impl Cluster {
    /// The demo upstream and two instances on the Redis at `url`.
    pub async fn start_on(url: &str, options: DemoOptions) -> Cluster {
        Self::build(Log::Server(url), options, LEASE_MS, "").await
    }

    /// The demo upstream and two instances on `log`.
    pub async fn start_on_log(log: Log<'_>, options: DemoOptions) -> Cluster {
        Self::build(log, options, LEASE_MS, "").await
    }

    /// Two instances whose leases last `lease_ms`.
    pub async fn with_lease(options: DemoOptions, lease_ms: u64) -> Cluster {
        Self::build(Log::Server(&redis_url()), options, lease_ms, "").await
    }

    /// Two instances whose `[[upstream]]` table ends with `upstream_toml`.
    pub async fn with_upstream_toml(options: DemoOptions, upstream_toml: &str) -> Cluster {
        Self::on_log_with_upstream_toml(Log::Server(&redis_url()), options, upstream_toml).await
    }

    /// The same, on `log`.
    pub async fn on_log_with_upstream_toml(
        log: Log<'_>,
        options: DemoOptions,
        upstream_toml: &str,
    ) -> Cluster {
        Self::build(log, options, LEASE_MS, upstream_toml).await
    }

    async fn build(
        log: Log<'_>,
        options: DemoOptions,
        lease_ms: u64,
        upstream_toml: &str,
    ) -> Cluster {
        if let Log::Server(url) = log {
            drop(require_redis(url));
        }
        let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), options)
            .await
            .expect("demo upstream starts");
        let shared = tempfile::tempdir().expect("temp dir");
        let prefix = format!(
            "mcp-resume-proxy-test:{}",
            mcp_resume_proxy::id::StreamId::random()
        );
        let key = shared.path().join("token.key");
        std::fs::write(&key, [7u8; 32]).expect("key file");
        let config = shared.path().join("proxy.toml");
        std::fs::write(
            &config,
            format!(
                "[store]\nbackend = \"redis\"\n{}\nkey_prefix = \"{prefix}\"\n\
                 lease_ms = {lease_ms}\n[tokens]\nkey_file = \"{}\"\n\
                 [[upstream]]\nurl = \"{}\"\n{upstream_toml}\n",
                log.toml(),
                key.display(),
                upstream.url()
            ),
        )
        .expect("config file");
        let a = Self::instance(&config).await;
        let b = Self::instance(&config).await;
        Cluster {
            upstream,
            a,
            b,
            config,
            log: log.owned(),
            prefix,
            _shared: shared,
        }
    }

    pub async fn start(options: DemoOptions) -> Cluster {
        Self::start_on(&redis_url(), options).await
    }

    async fn instance(config: &Path) -> Instance {
        let dir = tempfile::tempdir().expect("temp dir");
        let addr = free_addr();
        let proxy = Self::process(config, dir.path(), addr).await;
        Instance { proxy, dir, addr }
    }

    async fn process(config: &Path, dir: &Path, addr: std::net::SocketAddr) -> ProxyProcess {
        let config = config.display().to_string();
        ProxyProcess::start(&["--config", &config], dir, addr, &[]).await
    }

    /// Starts instance A again (after it was killed) on its dir and address.
    pub async fn restart_a(&mut self) {
        self.a.proxy = Self::process(&self.config, self.a.dir.path(), self.a.addr).await;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.a.proxy.stop();
        self.b.proxy.stop();
        match &self.log {
            OwnedLog::Server(url) => delete_prefix(url, &self.prefix),
            OwnedLog::Cluster(cluster) => {
                // The count's key, and every partition's.
                cluster.delete(&format!("{{{}}}:*", self.prefix));
                cluster.delete(&format!("{{{}:*", self.prefix));
            }
        }
    }
}
