//! The proxy as a real OS process, for tests that must `kill -9` it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::StatusCode;

use super::{Call, McpClient, LIMIT};

pub struct ProxyProcess {
    child: Child,
    pub addr: std::net::SocketAddr,
}

impl ProxyProcess {
    /// Starts the binary with `upstream_args` (e.g. `["--upstream", url]`)
    /// and extra environment, and waits until `/healthz` answers.
    pub async fn start(
        upstream_args: &[&str],
        data_dir: &std::path::Path,
        addr: std::net::SocketAddr,
        env: &[(&str, &str)],
    ) -> Self {
        let proxy = Self::spawn(upstream_args, data_dir, addr, env);
        proxy.up().await
    }

    /// Starts the binary as [`ProxyProcess::start`] does, with what it
    /// logs written to `log` instead of the test's own output.
    pub async fn start_logged(
        upstream_args: &[&str],
        data_dir: &std::path::Path,
        addr: std::net::SocketAddr,
        env: &[(&str, &str)],
        log: &std::path::Path,
    ) -> Self {
        let file = std::fs::File::create(log).expect("log file");
        let proxy = Self::spawn_to(upstream_args, data_dir, addr, env, file.into());
        proxy.up().await
    }

    /// Waits until `/healthz` answers. A connection refused or reset is
    /// "not yet" (a start under load can reset one), unless the process
    /// has ended, which says so at once.
    async fn up(mut self) -> Self {
        let addr = self.addr;
        let health = McpClient::new(format!("http://{addr}/healthz"));
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the proxy on {addr} ended on its way up: {status}");
            }
            let answered = health.try_send(Call::get()).await;
            if answered.is_ok_and(|res| res.status() == StatusCode::OK) {
                return self;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "proxy never came up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts the binary as [`ProxyProcess::start`] does, without waiting
    /// for it to come up (to kill it on its way up).
    pub fn spawn(
        upstream_args: &[&str],
        data_dir: &std::path::Path,
        addr: std::net::SocketAddr,
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_to(upstream_args, data_dir, addr, env, Stdio::inherit())
    }

    fn spawn_to(
        upstream_args: &[&str],
        data_dir: &std::path::Path,
        addr: std::net::SocketAddr,
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
            .args(upstream_args)
            .args(["--listen", &addr.to_string()])
            .arg("--data-dir")
            .arg(data_dir)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("proxy binary starts");
        Self { child, addr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL"); // Child::kill is SIGKILL on Unix
        self.child.wait().expect("reaped");
    }

    /// SIGKILL if it still runs; never fails (for teardown).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        self.exited().await
    }

    /// Sends `signal` (SIGTERM, SIGINT) and returns at once.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        assert_eq!(
            unsafe { libc::kill(pid, signal) },
            0,
            "signal {signal} sent"
        );
    }

    /// Waits (bounded) for the process to exit.
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the proxy did not exit after the signal"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn client(&self) -> McpClient {
        McpClient::new(format!("http://{}/mcp", self.addr))
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback address nothing listens on right now, for a proxy process to
/// bind a moment later. Not one the kernel picked: a port from its
/// ephemeral range (32768–60999 by default) can be given to an outgoing
/// connection of a test running alongside between this check and the
/// proxy's bind, and the proxy then fails to listen while the test talks to
/// whatever holds the port. Ports below that range, each offered once per
/// test process, and the range's start spread by process id.
pub fn free_addr() -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (offset + n) % SPAN) as u16;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr().expect("local addr");
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN);
}

/// A demo upstream that stays up, and the proxy binary in front of it on a
/// data dir and address that outlive the proxy process: the rig of every
/// kill -9 and restart test.
pub struct Crashable {
    pub upstream: mcp_resume_proxy::demo::upstream::DemoUpstream,
    pub proxy: ProxyProcess,
    pub dir: tempfile::TempDir,
    addr: std::net::SocketAddr,
    /// How the proxy is told its upstream: `--upstream URL`, or `--config`.
    upstream_args: Vec<String>,
}

impl Crashable {
    pub async fn start(options: mcp_resume_proxy::demo::upstream::DemoOptions) -> Self {
        Self::configured(options, None).await
    }

    /// The same, with the upstream in a configuration file whose
    /// `[[upstream]]` table ends with `upstream_toml` (its own subtables).
    pub async fn with_upstream_toml(
        options: mcp_resume_proxy::demo::upstream::DemoOptions,
        upstream_toml: &str,
    ) -> Self {
        Self::configured(options, Some(upstream_toml)).await
    }

    async fn configured(
        options: mcp_resume_proxy::demo::upstream::DemoOptions,
        upstream_toml: Option<&str>,
    ) -> Self {
        let upstream = mcp_resume_proxy::demo::upstream::DemoUpstream::spawn(
            ([127, 0, 0, 1], 0).into(),
            options,
        )
        .await
        .expect("demo upstream starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let addr = free_addr();
        let upstream_args = match upstream_toml {
            None => vec!["--upstream".to_owned(), upstream.url()],
            Some(toml) => {
                let file = dir.path().join("proxy.toml");
                let text = format!("[[upstream]]\nurl = \"{}\"\n{toml}\n", upstream.url());
                std::fs::write(&file, text).expect("config file");
                vec!["--config".to_owned(), file.display().to_string()]
            }
        };
        let args: Vec<&str> = upstream_args.iter().map(String::as_str).collect();
        let proxy = ProxyProcess::start(&args, dir.path(), addr, &[]).await;
        Self {
            upstream,
            proxy,
            dir,
            addr,
            upstream_args,
        }
    }

    pub fn client(&self) -> McpClient {
        self.proxy.client()
    }

    /// A new proxy process on the same data dir and address (after the old
    /// one was killed or terminated).
    pub async fn restart(&mut self) {
        let args: Vec<&str> = self.upstream_args.iter().map(String::as_str).collect();
        self.proxy = ProxyProcess::start(&args, self.dir.path(), self.addr, &[]).await;
    }

    /// kill -9, then a new proxy process on the same data dir.
    pub async fn kill9_and_restart(&mut self) {
        self.proxy.kill9();
        self.restart().await;
    }
}

/// The binary on a configuration file of its own in front of an in-process
/// demo upstream: `toml` (keys before the tables), then the `[[upstream]]`.
pub struct OnAFile {
    pub proxy: ProxyProcess,
    pub dir: tempfile::TempDir,
    _upstream: mcp_resume_proxy::demo::upstream::DemoUpstream,
}

impl OnAFile {
    /// Starts it with `env`; its log goes to `dir/proxy.log` when `logged`,
    /// else to the test's output.
    pub async fn start(toml: &str, env: &[(&str, &str)], logged: bool) -> Self {
        use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
        let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
            .await
            .expect("demo upstream starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("proxy.toml");
        let toml = format!("{toml}\n[[upstream]]\nurl = \"{}\"\n", upstream.url());
        std::fs::write(&file, toml).expect("config file");
        let file = file.display().to_string();
        let args = ["--config", file.as_str()];
        let proxy = match logged {
            true => {
                let log = dir.path().join("proxy.log");
                ProxyProcess::start_logged(&args, dir.path(), free_addr(), env, &log).await
            }
            false => ProxyProcess::start(&args, dir.path(), free_addr(), env).await,
        };
        Self {
            proxy,
            dir,
            _upstream: upstream,
        }
    }
}
