//! The harness's child processes and what it reads about processes from
//! `/proc`. Every child runs under a [`Proc`] guard, so a failing or panicking
//! scenario never leaves an upstream or a proxy behind; the `/proc` readings
//! (CPU, RSS, disk writes, fds, load average) are what the scenarios turn into
//! per-message and per-stream figures. A proxy's `[store]` section comes
//! from `redis_modes.rs`.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use tokio::net::TcpStream;

use crate::client::Target;
/// In the figures the soak test shares, which cannot reach this module.
pub use crate::soak_figures::dir_bytes;

/// Where peers (other proxies, nginx) are installed: outside the
/// repository, reused across runs.
pub const PEERS_DIR: &str = "/tmp/mcp-resume-proxy-peers";

/// A child process that is killed and reaped when dropped.
pub struct Proc {
    name: String,
    child: std::process::Child,
    _dir: Option<tempfile::TempDir>,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn spawn(name: &str, mut cmd: Command, dir: Option<tempfile::TempDir>) -> Result<Self> {
        // SAFETY: the closure only calls async-signal-safe functions (prctl,
        // getrlimit, setrlimit) between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                raise_nofile();
                Ok(())
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {name}"))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            _dir: dir,
        })
    }

    /// Spawns a server told to listen on `127.0.0.1:port` and returns once it
    /// accepts connections, so no scenario measures a server still starting.
    pub async fn spawn_listening(
        name: &str,
        cmd: Command,
        dir: Option<tempfile::TempDir>,
        port: u16,
        limit: Duration,
    ) -> Result<(Self, SocketAddr)> {
        let mut p = Self::spawn(name, cmd, dir)?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        p.wait_listening(addr, limit).await?;
        Ok((p, addr))
    }

    fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("{} exited early: {status}", self.name),
            None => Ok(()),
        }
    }

    async fn wait_listening(&mut self, addr: SocketAddr, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("{} did not listen on {addr} within {limit:?}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Proc {
    /// Kills the process with SIGKILL and hands back its directory, which
    /// would otherwise go with it: a restart on the same data.
    pub fn kill_keeping_dir(mut self) -> Option<tempfile::TempDir> {
        self._dir.take()
    }

    /// Stops the process as an operator's rollout does (SIGTERM, then its
    /// graceful shutdown, at most `limit`) and hands back its directory.
    pub async fn stop_keeping_dir(mut self, limit: Duration) -> Result<tempfile::TempDir> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("{} did not stop within {limit:?} of SIGTERM", self.name);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self._dir.take().context("the process has no directory")
    }
}

/// Has the proxy log what its journal does at `debug` (checkpoints taken,
/// segments deleted: a few lines a minute), the rest at `info`, unless the
/// harness was given `RUST_LOG` itself: `scale` reads its recovery and
/// checkpoint figures from there.
fn journal_logs(cmd: &mut Command) {
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info,mcp_resume_proxy::store::journal=debug");
    }
}

/// The numbers `key=` takes in the lines of `log` that contain `event`
/// (the proxy's text log: `key=value` fields).
pub fn logged_numbers(log: &Path, event: &str, key: &str) -> Vec<u64> {
    let text = strip_colours(&std::fs::read_to_string(log).unwrap_or_default());
    // A space before: `ms=` must not match the end of `streams=`.
    let field = format!(" {key}=");
    text.lines()
        .filter(|line| line.contains(event))
        .filter_map(|line| {
            let at = line.find(&field)? + field.len();
            let digits: String = line[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

/// `text` without ANSI escape sequences (a proxy that colours its log).
fn strip_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Starts the proxy again on the directory a killed one left (see
/// [`start_proxy_with`]'s layout), on the same port; returns it and how
/// long it took from spawn to answering `GET /healthz`: the recovery time.
/// (The proxy binds its port before it opens the log, so a connection is
/// accepted by the kernel long before the recovery ends.)
pub async fn restart_proxy(
    bin: &Path,
    dir: tempfile::TempDir,
    addr: SocketAddr,
) -> Result<(Proc, Duration)> {
    let log = std::fs::File::create(dir.path().join("proxy-restarted.log"))?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(dir.path().join("proxy.toml"))
        .stdout(Stdio::null())
        .stderr(log);
    journal_logs(&mut cmd);
    let t0 = Instant::now();
    let (p, _) = Proc::spawn_listening(
        "proxy (restarted)",
        cmd,
        Some(dir),
        addr.port(),
        Duration::from_secs(120),
    )
    .await?;
    healthz(addr).await?;
    let recovery = t0.elapsed();
    // The proxy writes its log lines out every 100 ms: wait for those of
    // its start-up (the journal's recovery figures) to be on disk before a
    // caller reads them, or kills it (SIGKILL loses what is buffered).
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok((p, recovery))
}

/// Waits for the answer to one `GET /healthz`: the proxy serves it only
/// once its log is open and recovered.
async fn healthz(addr: SocketAddr) -> Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = TcpStream::connect(addr).await?;
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    let read = conn.read_to_end(&mut answer);
    tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .context("the restarted proxy did not answer /healthz")??;
    if !answer.starts_with(b"HTTP/1.1 200") {
        bail!(
            "the restarted proxy answered /healthz with {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(60)])
        );
    }
    Ok(())
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` for at most `limit`, its output into `log`; kills it when over.
/// Returns whether it finished successfully in time.
pub fn run_bounded(mut cmd: Command, limit: Duration, log: &Path) -> Result<bool> {
    let file = std::fs::File::create(log)?;
    let mut p = Proc::spawn(
        "installer",
        {
            cmd.stdout(file.try_clone()?).stderr(file);
            cmd
        },
        None,
    )?;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = p.child.try_wait()? {
            return Ok(status.success());
        }
        if Instant::now() > deadline {
            return Ok(false); // the guard kills it
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cargo that runs this harness (`$CARGO`), or the one on `PATH`.
pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Raises this process's soft fd limit to its hard limit (10,000 idle
/// streams need two sockets each in the proxy). Async-signal-safe, so it is
/// also used between fork and exec.
pub fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

pub fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc call on a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    }
}

pub fn free_port() -> Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Which fast upstream the scenarios run behind (`--upstream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// `benches/support/fast_upstream.rs`: raw hyper, so the proxy is what
    /// the figures measure.
    Rust,
    /// `benches/support/fast_upstream.mjs` under `node`: the same wire from
    /// the kind of server users deploy, so the figures read as theirs would.
    Node,
}

impl Upstream {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "rust" => Ok(Self::Rust),
            "node" => Ok(Self::Node),
            other => bail!("unknown upstream {other:?} (rust or node)"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Rust => "rust",
            Self::Node => "node",
        }
    }
}

/// The fast upstream, in its own process: this binary re-executed as
/// `load upstream --port P`, or the Node script.
pub async fn start_upstream(kind: Upstream) -> Result<(Proc, SocketAddr)> {
    let port = free_port()?;
    let mut cmd = match kind {
        Upstream::Rust => {
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.arg("upstream");
            cmd
        }
        Upstream::Node => {
            let mut cmd = Command::new("node");
            cmd.arg(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/support/fast_upstream.mjs"),
            );
            cmd
        }
    };
    cmd.args(["--port", &port.to_string()])
        .stdout(Stdio::null());
    let name = format!("fast upstream ({})", kind.name());
    Proc::spawn_listening(&name, cmd, None, port, Duration::from_secs(10)).await
}

/// The floor proxy (`benches/support/floor_proxy.rs`) in front of
/// `upstream`, in its own process.
pub async fn start_floor(upstream: SocketAddr) -> Result<(Proc, Target)> {
    let port = free_port()?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([
        "floor",
        "--port",
        &port.to_string(),
        "--upstream",
        &upstream.to_string(),
    ])
    .stdout(Stdio::null());
    let (p, addr) =
        Proc::spawn_listening("floor proxy", cmd, None, port, Duration::from_secs(10)).await?;
    let target = Target::new("floor", addr, "/mcp", "echo", Some(p.pid()));
    Ok((p, target))
}

/// The release proxy binary: `MCP_RESUME_PROXY_BIN`, else
/// `release/mcp-resume-proxy` under the target directory (`CARGO_TARGET_DIR`
/// or `target/`), built when missing.
pub fn proxy_bin() -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|dir| root.join(dir))
        .unwrap_or_else(|| root.join("target"));
    let bin = std::env::var_os("MCP_RESUME_PROXY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("release/mcp-resume-proxy"));
    // `cargo bench` builds the package's binary with the harness (as it
    // does for any bench or test), so it is the checkout's already: a
    // `cargo build --release` here, without the dev-dependencies'
    // features, would only replace it with another build (four minutes
    // here) of the same sources.
    if !bin.exists() {
        eprintln!(
            "load: {} is missing; running cargo build --release",
            bin.display()
        );
        let status = cargo()
            .args(["build", "--release", "--bin", "mcp-resume-proxy"])
            .current_dir(root)
            .status()?;
        if !status.success() || !bin.exists() {
            bail!("cargo build --release failed ({status})");
        }
    }
    Ok(bin)
}

/// One proxy process in front of `upstream`, with its own data directory;
/// `sync` is a journal sync mode, or `redis` (`redis-tls`) for the Redis
/// backend (over TLS). Every client of the harness is one principal (no
/// credentials), so the per-principal cap is raised past what `idle` opens
/// (10,000 streams, where the default 1,000 refused the rest with 429).
pub async fn start_proxy(bin: &Path, upstream: SocketAddr, sync: &str) -> Result<(Proc, Target)> {
    start_proxy_with(bin, upstream, sync, "").await
}

/// [`start_proxy`], with `tables` added at the end of its configuration,
/// after its `[[upstream]]`: tables of that upstream (`[upstream.tasks]`)
/// or top-level ones (`[auth]`). Its bound on retained streams is far above
/// the default, so that a scenario measures a log holding everything it
/// wrote (`scale` fills a million).
pub async fn start_proxy_with(
    bin: &Path,
    upstream: SocketAddr,
    sync: &str,
    tables: &str,
) -> Result<(Proc, Target)> {
    start_proxy_keyed(bin, upstream, sync, "", tables).await
}

/// [`start_proxy_with`], with `keys` among its top-level keys (before any
/// table: `access_log = false`).
pub async fn start_proxy_keyed(
    bin: &Path,
    upstream: SocketAddr,
    sync: &str,
    keys: &str,
    tables: &str,
) -> Result<(Proc, Target)> {
    let dir = proxy_dir()?;
    let port = free_port()?;
    let config = format!(
        "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n{keys}\n{}\n\
         [limits]\nstreams_per_principal = 1000000\nmax_retained_streams = 4000000\n\n\
         [[upstream]]\npath = \"/mcp\"\nurl = \"http://{upstream}/mcp\"\n{tables}",
        dir.path().join("data").display(),
        crate::redis_modes::store_section(sync, dir.path())?,
    );
    spawn_proxy(bin, &format!("proxy {sync}"), dir, port, &config).await
}

/// A fresh temporary directory for one proxy: its configuration, log and
/// `data/`.
pub fn proxy_dir() -> Result<tempfile::TempDir> {
    Ok(tempfile::Builder::new()
        .prefix("mcp-resume-proxy-load-")
        .tempdir()?)
}

/// Runs the proxy on `config` (a whole `proxy.toml`, listening on
/// 127.0.0.1:`port`) in `dir`, which goes with the process; its stderr in
/// `dir/proxy.log`, whose end a failed start reports (the proxy says there
/// why it refused its configuration).
pub async fn spawn_proxy(
    bin: &Path,
    name: &str,
    dir: tempfile::TempDir,
    port: u16,
    config: &str,
) -> Result<(Proc, Target)> {
    use std::os::unix::fs::FileExt as _;
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, config)?;
    let log = std::fs::File::create(dir.path().join("proxy.log"))?;
    // A handle of its own (the child's is write-only): the log is still
    // readable once a failed start took the directory with it.
    let log_reader = std::fs::File::open(dir.path().join("proxy.log"))?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(log);
    journal_logs(&mut cmd);
    let listening =
        Proc::spawn_listening(name, cmd, Some(dir), port, Duration::from_secs(20)).await;
    let (p, addr) = listening.map_err(|e| {
        let len = log_reader.metadata().map_or(0, |m| m.len());
        let mut text = vec![0; 4096];
        let n = log_reader
            .read_at(&mut text, len.saturating_sub(4096))
            .unwrap_or(0);
        let text = String::from_utf8_lossy(&text[..n]);
        anyhow!("{e:#}; its log ends:\n{}", text.trim_end())
    })?;
    let target = Target::new(name, addr, "/mcp", "echo", Some(p.pid()));
    Ok((p, target))
}

/// A fast upstream and one proxy per `[store] sync` mode in front of it.
/// Fields drop in order: the proxies go before the upstream they talk to.
pub struct Stand {
    /// `direct` first, then one per proxy, in the order of the modes.
    pub targets: Vec<Target>,
    /// The proxies' processes (`peers` adds its own).
    pub proxies: Vec<Proc>,
    pub upstream: Proc,
}

pub async fn start_stand(bin: &Path, sync_modes: &[String], kind: Upstream) -> Result<Stand> {
    let (upstream, up_addr) = start_upstream(kind).await?;
    let mut proxies = Vec::new();
    let mut targets = vec![Target::direct(up_addr)];
    for sync in sync_modes {
        let (p, t) = start_proxy(bin, up_addr, sync).await?;
        proxies.push(p);
        targets.push(t);
    }
    Ok(Stand {
        targets,
        proxies,
        upstream,
    })
}

/// Each target's CPU seconds so far (0 for one without a process of ours).
pub fn cpu_of(targets: &[crate::client::Target]) -> Result<Vec<f64>> {
    targets
        .iter()
        .map(|t| t.pid.map_or(Ok(0.0), cpu_seconds))
        .collect()
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at `state`.
    let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow!("bad stat"))? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields[11].parse()?;
    let stime: u64 = fields[12].parse()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((utime + stime) as f64 / hz)
}

/// The number after `key:` in `/proc/<pid>/<file>` (both `status` and `io`
/// are `key: value [unit]` lines).
fn proc_number(pid: u32, file: &str, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}"))?;
    let line = text
        .lines()
        .find(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')))
        .ok_or_else(|| anyhow!("no {key}"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow!("bad {key}"))?
        .parse()?)
}

/// Resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    proc_number(pid, "status", "VmRSS")
}

/// Bytes a process caused to be sent to storage (`write_bytes` in
/// `/proc/<pid>/io`): the log's write amplification.
pub fn disk_write_bytes(pid: u32) -> Result<u64> {
    proc_number(pid, "io", "write_bytes")
}

/// Bytes written to the block device that holds `path`, by every process
/// (sectors written, from `/sys/dev/block/<major>:<minor>/stat`): what
/// reached the disk. `write_bytes` counts a page each time a process dirties
/// it, whether or not it reaches the disk dirty again; the two differ for a
/// log that writes zeroes ahead of its records. `None` where `path` is on no
/// block device (tmpfs, overlay).
pub fn device_written_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let stat = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?;
    let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
    Some(sectors * 512)
}

pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let three: Vec<&str> = text.split_whitespace().take(3).collect();
    format!("load average {}", three.join(" "))
}
