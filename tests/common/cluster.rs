//! Two proxy processes sharing one Redis log (`backend = "redis"`), in front
//! of one demo upstream: the rig of every scale-out test. Each rig has its
//! own key prefix, deleted when the rig drops; the token key file is shared
//! by both instances, as the README tells operators to do.

use std::path::{Path, PathBuf};

use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};

use super::process::{free_addr, ProxyProcess};
use super::McpClient;

/// The Redis the tests use: `MCP_RESUME_PROXY_TEST_REDIS`, else the local one.
pub fn redis_url() -> String {
    std::env::var("MCP_RESUME_PROXY_TEST_REDIS")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_owned())
}

/// Fails loudly (never skips) when no Redis answers at `url`.
pub fn require_redis(url: &str) -> redis::Connection {
    let answered = redis::Client::open(url).and_then(|c| {
        let mut conn = c.get_connection_with_timeout(std::time::Duration::from_secs(2))?;
        redis::cmd("PING").query::<String>(&mut conn)?;
        Ok(conn)
    });
    answered.unwrap_or_else(|e| {
        panic!(
            "the scale-out tests need a Redis server at {url} and none answered ({e}); \
             start one (`redis-server --save '' --appendonly no`) or set MCP_RESUME_PROXY_TEST_REDIS"
        )
    })
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
    url: String,
    prefix: String,
    _shared: tempfile::TempDir,
}

/// The instances' lease: short, so that takeover tests wait about a second.
pub const LEASE_MS: u64 = 1_000;

impl Cluster {
    /// The demo upstream and two instances on the Redis at `url`.
    pub async fn start_on(url: &str, options: DemoOptions) -> Cluster {
        Self::build(url, options, LEASE_MS).await
    }

    /// Two instances whose leases last `lease_ms`.
    pub async fn with_lease(options: DemoOptions, lease_ms: u64) -> Cluster {
        Self::build(&redis_url(), options, lease_ms).await
    }

    async fn build(url: &str, options: DemoOptions, lease_ms: u64) -> Cluster {
        drop(require_redis(url));
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
                "[store]\nbackend = \"redis\"\nredis_url = \"{url}\"\nkey_prefix = \"{prefix}\"\n\
                 lease_ms = {lease_ms}\n[tokens]\nkey_file = \"{}\"\n\
                 [[upstream]]\nurl = \"{}\"\n",
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
            url: url.to_owned(),
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
        delete_prefix(&self.url, &self.prefix);
    }
}

/// A Redis server of the test's own (so it can be killed and restarted), on
/// a free loopback port, its append-only file in a temp dir so that what it
/// acknowledged survives a kill -9. Killed when dropped.
pub struct RedisServer {
    child: Option<std::process::Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `redis-server`; fails loudly when it is not installed.
    pub async fn start() -> RedisServer {
        let port = free_addr().port();
        let mut server = RedisServer {
            child: None,
            port,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        server.run().await;
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn run(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("this test runs a Redis server of its own and `redis-server` did not start ({e}); install it (apt-get install redis-server)")
            });
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + super::LIMIT;
        while redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(std::time::Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server never answered"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// kill -9: Redis is gone at once, mid-whatever.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub async fn restart(&mut self) {
        self.kill9();
        self.run().await;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
    }
}
