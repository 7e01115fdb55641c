//! The load harness (`cargo bench --bench load -- [--smoke] [--scenario NAME]…`):
//! it owns the end-to-end figures of the proxy — throughput, latency, entries
//! per second, CPU per entry, replay speed and memory per idle stream — each
//! measured against the same fast upstream reached directly in the same run,
//! so every figure can be read as a ratio rather than as an absolute number
//! that depends on the machine.
//!
//! Three OS processes take part: this harness (client, its own tokio
//! runtime), the fast upstream (`benches/support/fast_upstream.rs`, run by
//! re-executing this binary as `load upstream --port P`, so upstream and
//! client never share a runtime) and the release proxy binary
//! (`MCP_RESUME_PROXY_BIN`, default `target/release/mcp-resume-proxy`, built
//! when missing), one per `[store] sync` mode under test, each with its own
//! temporary data directory. Everything listens on 127.0.0.1 only; every child
//! is killed by a guard on drop (also when a scenario panics) and by
//! `PR_SET_PDEATHSIG` when the harness itself dies; every scenario runs under
//! a timeout.
//!
//! Scenarios: `small`, `streaming`, `replay`, `idle` (default: all four) and
//! `peers` (only with `--peers`: the `small` load through the Rust
//! `mcp-proxy` crate and the PyPI `mcp-persist`, installed under
//! `/tmp/mcp-resume-proxy-peers`, never in the repository). `--smoke` runs
//! the four at tiny sizes in a few seconds and exits non-zero unless each of
//! them completed without errors and printed its figures.

#[path = "support/fast_upstream.rs"]
mod fast_upstream;

use std::fmt::Write as _;
use std::future::Future;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use mcp_resume_proxy::sse::Decoder;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// The protocol revision the harness speaks: legacy, without priming events,
/// so every SSE event it counts is an upstream message.
const PROTOCOL: &str = "2025-06-18";
/// Where peers are installed: outside the repository, reused across runs.
const PEERS_DIR: &str = "/tmp/mcp-resume-proxy-peers";
/// Connections being opened at once: stays under the listen backlog, so no
/// SYN is dropped and retried a second later.
const CONNECT_PARALLELISM: usize = 128;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("upstream") {
        run_upstream(&args[1..]);
        return;
    }
    let opts = match Opts::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("load: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Children are spawned from this (the main) thread only: PDEATHSIG fires
    // when the spawning *thread* exits, and this one lives as long as the
    // harness.
    let ok = rt.block_on(run(opts));
    rt.shutdown_timeout(Duration::from_secs(1));
    std::process::exit(if ok { 0 } else { 1 });
}

const USAGE: &str = "usage: cargo bench --bench load -- [--smoke] [--peers] [--scenario small|streaming|replay|idle|peers]...
       [--sync never,batch,always] [--rounds N] [--duration SECS] [--warmup SECS] [--concurrency 1,32]
       [--streaming-calls N] [--progress N] [--replay-entries N] [--idle-streams N] [--idle-hold SECS]";

/// The fast upstream's process: `load upstream --port P`.
fn run_upstream(args: &[String]) {
    let port: u16 = match args {
        [flag, port] if flag == "--port" => port.parse().expect("--port takes a number"),
        _ => panic!("usage: load upstream --port P"),
    };
    raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind upstream port");
        fast_upstream::serve(listener).await;
    });
}

// ---------------------------------------------------------------- options

#[derive(Clone, Debug)]
struct Opts {
    smoke: bool,
    peers: bool,
    scenarios: Vec<String>,
    rounds: usize,
    duration: Duration,
    warmup: Duration,
    concurrency: Vec<usize>,
    streaming_calls: usize,
    progress: u32,
    replay_entries: u32,
    idle_streams: usize,
    idle_hold: Duration,
    /// `[store] sync` modes under test in `small` and `streaming` (`None`:
    /// each scenario's own list).
    sync: Option<Vec<String>>,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Self> {
        let mut o = Opts {
            smoke: false,
            peers: false,
            scenarios: Vec::new(),
            rounds: 3,
            duration: Duration::from_secs(4),
            warmup: Duration::from_secs(1),
            concurrency: vec![1, 32],
            streaming_calls: 1000,
            progress: 100,
            replay_entries: 10_000,
            idle_streams: 10_000,
            idle_hold: Duration::from_secs(3),
            sync: None,
        };
        let mut explicit: Vec<&str> = Vec::new();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = || {
                it.next()
                    .map(String::as_str)
                    .ok_or_else(|| anyhow!("{arg} needs a value"))
            };
            match arg.as_str() {
                // cargo bench passes --bench to every bench binary.
                "--bench" => {}
                "--smoke" => o.smoke = true,
                "--peers" => o.peers = true,
                "--scenario" => o.scenarios.extend(value()?.split(',').map(str::to_owned)),
                "--rounds" => {
                    o.rounds = value()?.parse()?;
                    explicit.push("rounds");
                }
                "--duration" => {
                    o.duration = Duration::from_secs_f64(value()?.parse()?);
                    explicit.push("duration");
                }
                "--warmup" => {
                    o.warmup = Duration::from_secs_f64(value()?.parse()?);
                    explicit.push("warmup");
                }
                "--concurrency" => {
                    o.concurrency = value()?
                        .split(',')
                        .map(str::parse)
                        .collect::<Result<_, _>>()?;
                    explicit.push("concurrency");
                }
                "--streaming-calls" => {
                    o.streaming_calls = value()?.parse()?;
                    explicit.push("streaming-calls");
                }
                "--progress" => {
                    o.progress = value()?.parse()?;
                    explicit.push("progress");
                }
                "--replay-entries" => {
                    o.replay_entries = value()?.parse()?;
                    explicit.push("replay-entries");
                }
                "--idle-streams" => {
                    o.idle_streams = value()?.parse()?;
                    explicit.push("idle-streams");
                }
                "--idle-hold" => {
                    o.idle_hold = Duration::from_secs_f64(value()?.parse()?);
                    explicit.push("idle-hold");
                }
                "--sync" => {
                    let modes: Vec<String> = value()?.split(',').map(str::to_owned).collect();
                    if let Some(bad) = modes
                        .iter()
                        .find(|m| !["never", "batch", "always"].contains(&m.as_str()))
                    {
                        bail!("unknown sync mode {bad:?}");
                    }
                    o.sync = Some(modes);
                }
                other => bail!("unknown argument {other:?}"),
            }
        }
        if o.smoke {
            // Tiny sizes, unless a flag asked otherwise.
            let keep = |name: &str| explicit.contains(&name);
            if !keep("rounds") {
                o.rounds = 1;
            }
            if !keep("duration") {
                o.duration = Duration::from_millis(300);
            }
            if !keep("warmup") {
                o.warmup = Duration::from_millis(100);
            }
            if !keep("concurrency") {
                o.concurrency = vec![1, 4];
            }
            if !keep("streaming-calls") {
                o.streaming_calls = 20;
            }
            if !keep("progress") {
                o.progress = 10;
            }
            if !keep("replay-entries") {
                o.replay_entries = 200;
            }
            if !keep("idle-streams") {
                o.idle_streams = 50;
            }
            if !keep("idle-hold") {
                o.idle_hold = Duration::from_millis(200);
            }
        }
        if o.scenarios.is_empty() {
            o.scenarios = ["small", "streaming", "replay", "idle"]
                .map(str::to_owned)
                .to_vec();
        }
        if o.peers && !o.scenarios.iter().any(|s| s == "peers") {
            o.scenarios.push("peers".into());
        }
        for s in &o.scenarios {
            match s.as_str() {
                "small" | "streaming" | "replay" | "idle" => {}
                "peers" if o.peers => {}
                "peers" => bail!("the peers scenario runs only with --peers"),
                other => bail!("unknown scenario {other:?}"),
            }
        }
        if o.rounds == 0 {
            bail!("--rounds must be at least 1");
        }
        Ok(o)
    }
}

impl Opts {
    fn sync_modes(&self, default: &[&str]) -> Vec<String> {
        self.sync
            .clone()
            .unwrap_or_else(|| default.iter().map(|&m| m.to_owned()).collect())
    }
}

// ---------------------------------------------------------------- driver

async fn run(opts: Opts) -> bool {
    let started = Instant::now();
    println!("# mcp-resume-proxy load harness");
    println!(
        "command: cargo bench --bench load -- {}",
        // cargo appends --bench itself.
        std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("binary:  {}", std::env::args().next().unwrap_or_default());
    println!("machine: {} cpus, {}", cpus(), loadavg());
    let bin = match proxy_bin() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("load: cannot find or build the proxy binary: {e:#}");
            return false;
        }
    };
    println!("proxy:   {}", bin.display());
    println!(
        "options: rounds={} duration={:?} warmup={:?} concurrency={:?} streaming={}x{} replay={} idle={} hold={:?}",
        opts.rounds,
        opts.duration,
        opts.warmup,
        opts.concurrency,
        opts.streaming_calls,
        opts.progress,
        opts.replay_entries,
        opts.idle_streams,
        opts.idle_hold
    );
    let mut all_ok = true;
    for name in &opts.scenarios {
        println!();
        let limit = scenario_limit(name, &opts);
        let t0 = Instant::now();
        let outcome = match name.as_str() {
            "small" => bounded(limit, small(&opts, &bin)).await,
            "streaming" => bounded(limit, streaming(&opts, &bin)).await,
            "replay" => bounded(limit, replay(&opts, &bin)).await,
            "idle" => bounded(limit, idle(&opts, &bin)).await,
            "peers" => bounded(limit, peers(&opts, &bin)).await,
            _ => unreachable!("checked in Opts::parse"),
        };
        match outcome {
            Ok(table) => {
                print!("{table}");
                println!("({name}: {:.1} s)", t0.elapsed().as_secs_f64());
            }
            Err(e) => {
                all_ok = false;
                println!("## {name}: FAILED: {e:#}");
            }
        }
    }
    println!();
    println!(
        "total {:.1} s, {}; {}",
        started.elapsed().as_secs_f64(),
        loadavg(),
        if all_ok {
            "all scenarios completed"
        } else {
            "SOME SCENARIOS FAILED"
        }
    );
    all_ok
}

fn scenario_limit(name: &str, o: &Opts) -> Duration {
    let per_run = o.duration + o.warmup + Duration::from_secs(15);
    match name {
        "small" => per_run * (o.rounds * o.concurrency.len() * 4) as u32 + Duration::from_secs(30),
        "peers" => {
            per_run * (o.rounds * o.concurrency.len() * 4) as u32 + Duration::from_secs(1800)
        }
        "idle" => Duration::from_secs(120) + o.idle_hold * 2,
        _ => Duration::from_secs(60 + 30 * o.rounds as u64),
    }
}

async fn bounded<T>(limit: Duration, f: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| anyhow!("timed out after {limit:?}"))?
}

// ---------------------------------------------------------------- processes

/// A child process that is killed and reaped when dropped.
struct Proc {
    name: String,
    child: std::process::Child,
    _dir: Option<tempfile::TempDir>,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn spawn(name: &str, mut cmd: Command, dir: Option<tempfile::TempDir>) -> Result<Self> {
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

    fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("{} exited early: {status}", self.name),
            None => Ok(()),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Raises this process's soft fd limit to its hard limit (10,000 idle
/// streams need two sockets each in the proxy). Async-signal-safe, so it is
/// also used between fork and exec.
fn raise_nofile() {
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

fn nofile_limit() -> u64 {
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

fn free_port() -> Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn wait_listening(proc_: &mut Proc, addr: SocketAddr, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        proc_.check_alive()?;
        if Instant::now() > deadline {
            bail!("{} did not listen on {addr} within {limit:?}", proc_.name);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start_upstream() -> Result<(Proc, SocketAddr)> {
    let port = free_port()?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["upstream", "--port", &port.to_string()])
        .stdout(Stdio::null());
    let mut p = Proc::spawn("fast upstream", cmd, None)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_listening(&mut p, addr, Duration::from_secs(10)).await?;
    Ok((p, addr))
}

fn proxy_bin() -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = std::env::var_os("MCP_RESUME_PROXY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/mcp-resume-proxy"));
    if !bin.exists() {
        eprintln!(
            "load: {} is missing; running cargo build --release",
            bin.display()
        );
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "--bin", "mcp-resume-proxy"])
            .current_dir(root)
            .status()?;
        if !status.success() || !bin.exists() {
            bail!("cargo build --release failed ({status})");
        }
    }
    Ok(bin)
}

/// One proxy process in front of `upstream`, with its own data directory.
async fn start_proxy(bin: &Path, upstream: SocketAddr, sync: &str) -> Result<(Proc, Target)> {
    let dir = tempfile::Builder::new()
        .prefix("mcp-resume-proxy-load-")
        .tempdir()?;
    let port = free_port()?;
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n\n[store]\nsync = \"{sync}\"\n\n\
             [[upstream]]\npath = \"/mcp\"\nurl = \"http://{upstream}/mcp\"\n",
            dir.path().join("data").display()
        ),
    )?;
    let log = std::fs::File::create(dir.path().join("proxy.log"))?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(log);
    let mut p = Proc::spawn(&format!("proxy (sync={sync})"), cmd, Some(dir))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_listening(&mut p, addr, Duration::from_secs(20)).await?;
    let target = Target::new(
        &format!("proxy {sync}"),
        addr,
        "/mcp",
        "echo",
        Some(p.pid()),
    );
    Ok((p, target))
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
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

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| anyhow!("no VmRSS"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow!("bad VmRSS"))?
        .parse()?)
}

/// Bytes a process caused to be sent to storage (`write_bytes` in
/// `/proc/<pid>/io`): the log's write amplification.
fn disk_write_bytes(pid: u32) -> Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let line = io
        .lines()
        .find(|l| l.starts_with("write_bytes:"))
        .ok_or_else(|| anyhow!("no write_bytes"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow!("bad write_bytes"))?
        .parse()?)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let three: Vec<&str> = text.split_whitespace().take(3).collect();
    format!("load average {}", three.join(" "))
}

// ---------------------------------------------------------------- client

/// An MCP endpoint under test.
#[derive(Clone)]
struct Target {
    name: String,
    addr: SocketAddr,
    host: HeaderValue,
    path: String,
    tool: String,
    /// The process whose CPU and memory the figures are about (the proxy).
    pid: Option<u32>,
}

impl Target {
    fn new(name: &str, addr: SocketAddr, path: &str, tool: &str, pid: Option<u32>) -> Self {
        Self {
            name: name.to_owned(),
            addr,
            host: HeaderValue::from_str(&addr.to_string()).expect("socket address is ASCII"),
            path: path.to_owned(),
            tool: tool.to_owned(),
            pid,
        }
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// One HTTP/1.1 connection; requests on it go one after another, as an MCP
/// client's would on a keep-alive connection.
async fn connect(addr: SocketAddr) -> Result<Sender> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

fn request(
    t: &Target,
    method: Method,
    session: Option<&str>,
    last_event_id: Option<&str>,
    body: Bytes,
) -> Result<Request<Full<Bytes>>> {
    let mut req = Request::builder()
        .method(method.clone())
        .uri(t.path.as_str())
        .header(header::HOST, t.host.clone())
        .header("mcp-protocol-version", PROTOCOL);
    if method == Method::GET {
        req = req.header(header::ACCEPT, "text/event-stream");
    } else {
        req = req
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
    }
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    Ok(req.body(Full::new(body))?)
}

async fn send(conn: &mut Sender, req: Request<Full<Bytes>>) -> Result<Response<Incoming>> {
    conn.ready().await?;
    Ok(conn.send_request(req).await?)
}

/// What came back for one request, its body read to the end.
#[derive(Default)]
struct Reply {
    /// Messages received (SSE events with data, or one JSON body).
    messages: u64,
    /// A JSON-RPC result (not an error) was among them.
    result: bool,
    first_id: Option<String>,
    first_message_at: Option<Instant>,
}

async fn read_reply(res: Response<Incoming>) -> Result<Reply> {
    if res.status() != StatusCode::OK {
        let status = res.status();
        let body = res.into_body().collect().await?.to_bytes();
        bail!("status {status}: {}", String::from_utf8_lossy(&body));
    }
    let sse = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = res.into_body();
    let mut reply = Reply::default();
    if sse {
        let mut decoder = Decoder::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            decoder.push(&data);
            while let Some(event) = decoder.next_event() {
                if event.data.is_empty() {
                    continue;
                }
                reply.messages += 1;
                if reply.first_message_at.is_none() {
                    reply.first_message_at = Some(Instant::now());
                    reply.first_id = event.id;
                }
                note_result(&mut reply, &event.data);
            }
        }
    } else {
        let bytes = body.collect().await?.to_bytes();
        if !bytes.is_empty() {
            reply.messages = 1;
            reply.first_message_at = Some(Instant::now());
            note_result(&mut reply, &bytes);
        }
    }
    Ok(reply)
}

fn note_result(reply: &mut Reply, message: &[u8]) {
    // Progress notifications never carry these keys; the final answer does.
    if memchr::memmem::find(message, b"\"result\"").is_some()
        && memchr::memmem::find(message, b"\"error\"").is_none()
    {
        reply.result = true;
    }
}

/// `initialize` + `notifications/initialized`; returns the session id.
async fn open_session(conn: &mut Sender, t: &Target) -> Result<String> {
    let init = Bytes::from(format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"{PROTOCOL}\",\
         \"capabilities\":{{}},\"clientInfo\":{{\"name\":\"load\",\"version\":\"1\"}}}}}}"
    ));
    let res = send(conn, request(t, Method::POST, None, None, init)?).await?;
    let session = res
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("{}: initialize answered without Mcp-Session-Id", t.name))?;
    let reply = read_reply(res).await?;
    if !reply.result {
        bail!("{}: initialize failed", t.name);
    }
    let note =
        Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
    let res = send(conn, request(t, Method::POST, Some(&session), None, note)?).await?;
    let status = res.status();
    res.into_body().collect().await?;
    if !status.is_success() {
        bail!("{}: notifications/initialized got {status}", t.name);
    }
    Ok(session)
}

fn call_body(t: &Target, id: u64, args: &str) -> Bytes {
    Bytes::from(format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"{}\",\
         \"arguments\":{args},\"_meta\":{{\"progressToken\":{id}}}}}}}",
        t.tool
    ))
}

async fn call(conn: &mut Sender, t: &Target, session: &str, id: u64, args: &str) -> Result<Reply> {
    let req = request(t, Method::POST, Some(session), None, call_body(t, id, args))?;
    let reply = read_reply(send(conn, req).await?).await?;
    if !reply.result {
        bail!("{}: tools/call {id} ended without a result", t.name);
    }
    Ok(reply)
}

/// Opens `n` connections, at most [`CONNECT_PARALLELISM`] at a time.
async fn connect_many(addr: SocketAddr, n: usize) -> Result<Vec<Sender>> {
    let gate = Arc::new(Semaphore::new(CONNECT_PARALLELISM));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await?;
            connect(addr).await
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

// ---------------------------------------------------------------- histogram

/// A log-linear latency histogram in nanoseconds, HDR style: exact below 128,
/// then 64 sub-buckets per power of two (under 1.6 % relative error).
#[derive(Clone)]
struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Histogram {
    const SUB: u32 = 64;

    fn new() -> Self {
        Self {
            counts: vec![0; 128 + 58 * Self::SUB as usize],
            total: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < 128 {
            return v as usize;
        }
        let shift = 63 - v.leading_zeros() - 6; // v >> shift is in 64..128
        128 + ((shift - 1) * Self::SUB) as usize + ((v >> shift) - 64) as usize
    }

    fn value(i: usize) -> u64 {
        if i < 128 {
            return i as u64;
        }
        let shift = ((i - 128) / Self::SUB as usize) as u32 + 1;
        let m = ((i - 128) % Self::SUB as usize) as u64 + 64;
        // The middle of the bucket.
        (m << shift) + (1 << (shift - 1))
    }

    fn record(&mut self, d: Duration) {
        let last = self.counts.len() - 1;
        let i = Self::index(d.as_nanos().min(u64::MAX as u128) as u64);
        self.counts[i.min(last)] += 1;
        self.total += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    /// The value at quantile `q` (0..=1), in microseconds.
    fn quantile_us(&self, q: f64) -> f64 {
        if self.total == 0 {
            return f64::NAN;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i) as f64 / 1000.0;
            }
        }
        f64::NAN
    }
}

// ---------------------------------------------------------------- small

struct SmallRun {
    requests: u64,
    errors: u64,
    secs: f64,
    hist: Histogram,
}

impl SmallRun {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.secs
    }
}

/// `concurrency` sessions, each on its own connection, calling `tools/call`
/// back to back; only calls that start after the warm-up and end before the
/// deadline count.
async fn small_run(t: &Target, concurrency: usize, o: &Opts) -> Result<SmallRun> {
    let mut conns = connect_many(t.addr, concurrency).await?;
    let mut sessions = Vec::with_capacity(concurrency);
    for conn in &mut conns {
        sessions.push(open_session(conn, t).await?);
    }
    let start = Instant::now();
    let measure_from = start + o.warmup;
    let until = measure_from + o.duration;
    let mut tasks = Vec::new();
    for (mut conn, session) in conns.into_iter().zip(sessions) {
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::new();
            let (mut requests, mut errors) = (0u64, 0u64);
            let mut id = 1;
            loop {
                let t0 = Instant::now();
                if t0 >= until {
                    break;
                }
                let outcome = call(&mut conn, &t, &session, id, "{}").await;
                id += 1;
                let t1 = Instant::now();
                match outcome {
                    Ok(_) if t0 >= measure_from && t1 <= until => {
                        hist.record(t1 - t0);
                        requests += 1;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        errors += 1;
                        if errors == 1 {
                            eprintln!("load: {}: {e:#}", t.name);
                        }
                        // The connection may be gone; start over on a new one.
                        match connect(t.addr).await {
                            Ok(c) => conn = c,
                            Err(_) => break,
                        }
                    }
                }
            }
            (hist, requests, errors)
        }));
    }
    let mut run = SmallRun {
        requests: 0,
        errors: 0,
        secs: o.duration.as_secs_f64(),
        hist: Histogram::new(),
    };
    for task in tasks {
        let (hist, requests, errors) = task.await?;
        run.hist.merge(&hist);
        run.requests += requests;
        run.errors += errors;
    }
    Ok(run)
}

/// Rounds of every target in turn (direct, proxy, …, direct, proxy, …), so
/// drift in the machine's load hits all of them alike; one table per
/// concurrency with the median throughput, merged latency quantiles and both
/// against the direct row.
async fn small_table(title: &str, targets: &[Target], o: &Opts) -> Result<String> {
    let mut out = String::new();
    for &c in &o.concurrency {
        let mut runs: Vec<Vec<SmallRun>> = targets.iter().map(|_| Vec::new()).collect();
        for _ in 0..o.rounds {
            for (i, t) in targets.iter().enumerate() {
                runs[i].push(small_run(t, c, o).await?);
            }
        }
        writeln!(
            out,
            "## {title}: tools/call, JSON upstream answer, concurrency {c}, {} rounds x {:.1} s",
            o.rounds,
            o.duration.as_secs_f64()
        )?;
        writeln!(
            out,
            "{:<14} {:>26} {:>9} {:>7} {:>9} {:>9} {:>9} {:>10} {:>6}",
            "target",
            "req/s per round",
            "median",
            "x direct",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "+p50 us",
            "errors"
        )?;
        let mut direct: Option<(f64, f64)> = None;
        for (t, rs) in targets.iter().zip(&runs) {
            let mut rps: Vec<f64> = rs.iter().map(SmallRun::rps).collect();
            let per_round = rps
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(",");
            rps.sort_by(f64::total_cmp);
            let median = rps[rps.len() / 2];
            let mut hist = Histogram::new();
            for r in rs {
                hist.merge(&r.hist);
            }
            let errors: u64 = rs.iter().map(|r| r.errors).sum();
            let p50 = hist.quantile_us(0.5);
            let (base_rps, base_p50) = *direct.get_or_insert((median, p50));
            writeln!(
                out,
                "{:<14} {:>26} {:>9.0} {:>7.2}x {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>6}",
                t.name,
                per_round,
                median,
                median / base_rps,
                p50,
                hist.quantile_us(0.99),
                hist.quantile_us(0.999),
                p50 - base_p50,
                errors
            )?;
            if errors > 0 {
                bail!("{}: {errors} failed calls at concurrency {c}", t.name);
            }
            if hist.total == 0 {
                bail!("{}: no call completed at concurrency {c}", t.name);
            }
        }
        writeln!(out)?;
    }
    Ok(out)
}

async fn small(o: &Opts, bin: &Path) -> Result<String> {
    let (_up, up_addr) = start_upstream().await?;
    let mut procs = Vec::new();
    let mut targets = vec![Target::new("direct", up_addr, "/mcp", "echo", None)];
    for sync in o.sync_modes(&["never", "batch", "always"]) {
        let (p, t) = start_proxy(bin, up_addr, &sync).await?;
        procs.push(p);
        targets.push(t);
    }
    small_table("small", &targets, o).await
}

// ---------------------------------------------------------------- streaming

struct StreamRun {
    messages: u64,
    secs: f64,
    target_cpu: Option<f64>,
    target_disk: Option<u64>,
    upstream_cpu: f64,
}

/// `calls` concurrent calls, each answered with `progress` notifications and
/// a result, spread over sessions of 100 calls; counts every message that
/// reaches the client and the CPU the proxy and the upstream spent on them.
async fn streaming_run(t: &Target, upstream_pid: u32, o: &Opts) -> Result<StreamRun> {
    let sessions_n = o.streaming_calls.div_ceil(100).max(1);
    let mut sessions = Vec::with_capacity(sessions_n);
    let mut conn = connect(t.addr).await?;
    for _ in 0..sessions_n {
        sessions.push(open_session(&mut conn, t).await?);
    }
    let conns = connect_many(t.addr, o.streaming_calls).await?;
    let args = format!("{{\"delay_ms\":5,\"progress\":{}}}", o.progress);
    let cpu0 = t.pid.map(cpu_seconds).transpose()?;
    let disk0 = t.pid.map(disk_write_bytes).transpose()?;
    let up0 = cpu_seconds(upstream_pid)?;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(conns.len());
    for (i, mut conn) in conns.into_iter().enumerate() {
        let t = t.clone();
        let session = sessions[i % sessions_n].clone();
        let args = args.clone();
        tasks.push(tokio::spawn(async move {
            call(&mut conn, &t, &session, i as u64 + 1, &args).await
        }));
    }
    let mut messages = 0;
    for task in tasks {
        messages += task.await??.messages;
    }
    let secs = start.elapsed().as_secs_f64();
    // sled writes in the background: let its writer catch up so the bytes
    // and the CPU belong to this run.
    if t.pid.is_some() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Measured after the pause too: the background writes are part of
    // what the messages cost.
    let target_cpu = match (t.pid, cpu0) {
        (Some(pid), Some(c0)) => Some(cpu_seconds(pid)? - c0),
        _ => None,
    };
    let target_disk = match (t.pid, disk0) {
        (Some(pid), Some(d0)) => Some(disk_write_bytes(pid)? - d0),
        _ => None,
    };
    let expected = o.streaming_calls as u64 * (o.progress as u64 + 1);
    if messages != expected {
        bail!(
            "{}: {messages} messages delivered, expected {expected}",
            t.name
        );
    }
    Ok(StreamRun {
        messages,
        secs,
        target_cpu,
        target_disk,
        upstream_cpu: cpu_seconds(upstream_pid)? - up0,
    })
}

async fn streaming(o: &Opts, bin: &Path) -> Result<String> {
    let (up, up_addr) = start_upstream().await?;
    let mut procs = Vec::new();
    let mut targets = vec![Target::new("direct", up_addr, "/mcp", "echo", None)];
    for sync in o.sync_modes(&["batch", "never"]) {
        let (p, t) = start_proxy(bin, up_addr, &sync).await?;
        procs.push(p);
        targets.push(t);
    }
    let mut runs: Vec<Vec<StreamRun>> = targets.iter().map(|_| Vec::new()).collect();
    for _ in 0..o.rounds {
        for (i, t) in targets.iter().enumerate() {
            runs[i].push(streaming_run(t, up.pid(), o).await?);
        }
    }
    let mut out = String::new();
    writeln!(
        out,
        "## streaming: {} concurrent tools/call x {} progress + result (upstream delay 5 ms), {} rounds",
        o.streaming_calls, o.progress, o.rounds
    )?;
    writeln!(
        out,
        "{:<14} {:>10} {:>26} {:>10} {:>8} {:>16} {:>16} {:>15}",
        "target",
        "messages",
        "messages/s per round",
        "median",
        "x direct",
        "proxy CPU us/msg",
        "upstr CPU us/msg",
        "proxy disk B/msg"
    )?;
    let mut base = None;
    for (t, rs) in targets.iter().zip(&runs) {
        let mut rates: Vec<f64> = rs.iter().map(|r| r.messages as f64 / r.secs).collect();
        let per_round = rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(",");
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        let base = *base.get_or_insert(median);
        let msgs: u64 = rs.iter().map(|r| r.messages).sum();
        let proxy_cpu = rs
            .iter()
            .map(|r| r.target_cpu)
            .sum::<Option<f64>>()
            .map_or("-".to_owned(), |c| format!("{:.2}", c * 1e6 / msgs as f64));
        let up_cpu: f64 = rs.iter().map(|r| r.upstream_cpu).sum();
        let disk = rs
            .iter()
            .map(|r| r.target_disk)
            .sum::<Option<u64>>()
            .map_or("-".to_owned(), |d| format!("{:.0}", d as f64 / msgs as f64));
        writeln!(
            out,
            "{:<14} {:>10} {:>26} {:>10.0} {:>7.2}x {:>16} {:>16.2} {:>15}",
            t.name,
            rs[0].messages,
            per_round,
            median,
            median / base,
            proxy_cpu,
            up_cpu * 1e6 / msgs as f64,
            disk
        )?;
    }
    writeln!(
        out,
        "(CPU = utime+stime from /proc/<pid>/stat, disk = write_bytes from /proc/<pid>/io, over the \
         runs; CPU ticks are 10 ms: coarse at smoke sizes)"
    )?;
    Ok(out)
}

// ---------------------------------------------------------------- replay

async fn replay(o: &Opts, bin: &Path) -> Result<String> {
    let (_up, up_addr) = start_upstream().await?;
    let direct = Target::new("direct", up_addr, "/mcp", "echo", None);
    let (_proxy, proxied) = start_proxy(bin, up_addr, "batch").await?;
    let args = format!("{{\"delay_ms\":1,\"progress\":{}}}", o.replay_entries);
    let n = o.replay_entries as u64 + 1;
    let mut out = String::new();
    writeln!(
        out,
        "## replay: one call logging {} progress + result, then GET with Last-Event-ID = its first event id (sync=batch)",
        o.replay_entries
    )?;
    writeln!(
        out,
        "{:<34} {:>9} {:>14} {:>14} {:>12}",
        "run", "messages", "first msg ms", "last msg ms", "messages/s"
    )?;
    // Live delivery of the same call, direct and through the proxy, as the
    // yardstick for the replay.
    let mut first_id = None;
    let mut session_used = None;
    for t in [&direct, &proxied] {
        let mut conn = connect(t.addr).await?;
        let session = open_session(&mut conn, t).await?;
        let t0 = Instant::now();
        let reply = call(&mut conn, t, &session, 1, &args).await?;
        let total = t0.elapsed();
        if reply.messages != n {
            bail!("{}: {} messages, expected {n}", t.name, reply.messages);
        }
        row(
            &mut out,
            &format!("live call, {}", t.name),
            reply.messages,
            reply.first_message_at.map(|f| f - t0),
            total,
        )?;
        if t.pid.is_some() {
            first_id = reply.first_id;
            session_used = Some(session);
        }
    }
    let first_id = first_id.ok_or_else(|| anyhow!("the proxy sent no event id"))?;
    let session = session_used.expect("set with first_id");
    for round in 1..=o.rounds {
        let mut conn = connect(proxied.addr).await?;
        let req = request(
            &proxied,
            Method::GET,
            Some(&session),
            Some(&first_id),
            Bytes::new(),
        )?;
        let t0 = Instant::now();
        let reply = read_reply(send(&mut conn, req).await?).await?;
        let total = t0.elapsed();
        // Everything after the first entry: the rest of the progress and the
        // result.
        if reply.messages != n - 1 || !reply.result {
            bail!(
                "replay {round}: {} messages, expected {}",
                reply.messages,
                n - 1
            );
        }
        row(
            &mut out,
            &format!("replay {round} (Last-Event-ID = 1st)"),
            reply.messages,
            reply.first_message_at.map(|f| f - t0),
            total,
        )?;
    }
    Ok(out)
}

fn row(
    out: &mut String,
    name: &str,
    messages: u64,
    first: Option<Duration>,
    last: Duration,
) -> Result<()> {
    writeln!(
        out,
        "{:<34} {:>9} {:>14.3} {:>14.3} {:>12.0}",
        name,
        messages,
        first.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
        last.as_secs_f64() * 1e3,
        messages as f64 / last.as_secs_f64()
    )?;
    Ok(())
}

// ---------------------------------------------------------------- idle

struct IdleRun {
    streams: usize,
    open_secs: f64,
    rss_before: u64,
    rss_after: u64,
    fds_after: usize,
}

/// Opens `streams` long calls (each on its own connection, the answer's head
/// received, its body left open) and measures the resident memory of `pid`
/// before and after.
async fn idle_run(t: &Target, pid: u32, streams: usize, o: &Opts) -> Result<IdleRun> {
    let mut conn = connect(t.addr).await?;
    let sessions_n = streams.div_ceil(100).max(1);
    let mut sessions = Vec::with_capacity(sessions_n);
    for _ in 0..sessions_n {
        sessions.push(open_session(&mut conn, t).await?);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_before = rss_kib(pid)?;
    let gate = Arc::new(Semaphore::new(CONNECT_PARALLELISM));
    let failures = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(streams);
    // Long enough to outlive the measurement; the processes are killed after.
    let args = "{\"delay_ms\":600000,\"sse\":true}";
    for i in 0..streams {
        let gate = gate.clone();
        let t = t.clone();
        let session = sessions[i % sessions_n].clone();
        let failures = failures.clone();
        tasks.push(tokio::spawn(async move {
            let opened = async {
                let _permit = gate.acquire_owned().await?;
                let mut conn = connect(t.addr).await?;
                let req = request(
                    &t,
                    Method::POST,
                    Some(&session),
                    None,
                    call_body(&t, i as u64 + 1, args),
                )?;
                let res = send(&mut conn, req).await?;
                if res.status() != StatusCode::OK {
                    bail!("status {}", res.status());
                }
                anyhow::Ok((conn, res))
            }
            .await;
            match opened {
                Ok(held) => Some(held),
                Err(e) => {
                    if failures.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("load: idle stream via {}: {e:#}", t.name);
                    }
                    None
                }
            }
        }));
    }
    let mut held = Vec::with_capacity(streams);
    for task in tasks {
        if let Some(h) = task.await? {
            held.push(h);
        }
    }
    let open_secs = start.elapsed().as_secs_f64();
    let failed = failures.load(Ordering::Relaxed);
    if failed > 0 {
        bail!(
            "{}: {failed} of {streams} idle streams failed to open",
            t.name
        );
    }
    tokio::time::sleep(o.idle_hold).await;
    let run = IdleRun {
        streams: held.len(),
        open_secs,
        rss_before,
        rss_after: rss_kib(pid)?,
        fds_after: open_fds(pid),
    };
    drop(held);
    Ok(run)
}

async fn idle(o: &Opts, bin: &Path) -> Result<String> {
    // Each idle stream costs the proxy two sockets (client and upstream), and
    // the hard fd limit cannot be raised without CAP_SYS_RESOURCE.
    let limit = nofile_limit();
    let cap = (limit.saturating_sub(512) / 2) as usize;
    let streams = o.idle_streams.min(cap);
    let (up, up_addr) = start_upstream().await?;
    let direct = Target::new("direct", up_addr, "/mcp", "echo", None);
    let mut out = String::new();
    writeln!(
        out,
        "## idle: {streams} open SSE answers of long tools/call (upstream silent), held {:.1} s (sync=batch)",
        o.idle_hold.as_secs_f64()
    )?;
    if streams < o.idle_streams {
        writeln!(
            out,
            "(capped from {} by RLIMIT_NOFILE {limit}: the proxy holds 2 sockets per stream)",
            o.idle_streams
        )?;
    }
    writeln!(
        out,
        "{:<26} {:>8} {:>9} {:>13} {:>13} {:>12} {:>8}",
        "process measured",
        "streams",
        "open s",
        "RSS before MB",
        "RSS after MB",
        "KiB/stream",
        "fds"
    )?;
    let mut lines = Vec::new();
    let run = idle_run(&direct, up.pid(), streams, o).await?;
    lines.push(("upstream (direct)".to_owned(), run));
    // Fresh processes for the proxied run, so the upstream's memory from the
    // direct run does not matter and the proxy starts clean.
    drop(up);
    let (up, up_addr) = start_upstream().await?;
    let (proxy, proxied) = start_proxy(bin, up_addr, "batch").await?;
    let run = idle_run(&proxied, proxy.pid(), streams, o).await?;
    lines.push(("proxy (via proxy)".to_owned(), run));
    let up_rss = rss_kib(up.pid())?;
    for (name, r) in &lines {
        writeln!(
            out,
            "{:<26} {:>8} {:>9.2} {:>13.1} {:>13.1} {:>12.1} {:>8}",
            name,
            r.streams,
            r.open_secs,
            r.rss_before as f64 / 1024.0,
            r.rss_after as f64 / 1024.0,
            (r.rss_after as f64 - r.rss_before as f64) / r.streams as f64,
            r.fds_after
        )?;
    }
    writeln!(
        out,
        "(upstream RSS during the proxied run: {:.1} MB)",
        up_rss as f64 / 1024.0
    )?;
    Ok(out)
}

// ---------------------------------------------------------------- peers

/// Runs `cmd` for at most `limit`; kills it when over.
fn run_bounded(mut cmd: Command, limit: Duration, log: &Path) -> Result<bool> {
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

/// The Rust `mcp-proxy` 0.6.0 binary, installed with cargo when missing.
fn rmp_bin(limit: Duration) -> Result<PathBuf> {
    let dir = Path::new(PEERS_DIR);
    let bin = dir.join("rmp/bin/mcp-proxy");
    if bin.exists() {
        return Ok(bin);
    }
    std::fs::create_dir_all(dir)?;
    eprintln!("load: installing mcp-proxy 0.6.0 into {PEERS_DIR}/rmp (took ~10 min here before)");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["install", "mcp-proxy@0.6.0", "--locked", "--root"])
        .arg(dir.join("rmp"))
        .env("CARGO_TARGET_DIR", dir.join("target"));
    if !run_bounded(cmd, limit, &dir.join("install-rmp.log"))? || !bin.exists() {
        bail!("cargo install mcp-proxy did not finish within {limit:?}");
    }
    Ok(bin)
}

/// `mcp-persist-proxy` 2.2.0 in a venv, installed with pip when missing.
fn persist_bin(limit: Duration) -> Result<PathBuf> {
    let dir = Path::new(PEERS_DIR);
    let venv = dir.join("venv-persist");
    let bin = venv.join("bin/mcp-persist-proxy");
    if bin.exists() {
        return Ok(bin);
    }
    std::fs::create_dir_all(dir)?;
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "venv"]).arg(&venv);
    if !run_bounded(cmd, limit, &dir.join("venv.log"))? {
        bail!("python3 -m venv failed");
    }
    let mut cmd = Command::new(venv.join("bin/pip"));
    cmd.args(["install", "mcp-persist[sqlite]==2.2.0"]);
    if !run_bounded(cmd, limit, &dir.join("install-persist.log"))? || !bin.exists() {
        bail!("pip install mcp-persist did not finish within {limit:?}");
    }
    Ok(bin)
}

async fn peers(o: &Opts, bin: &Path) -> Result<String> {
    let (_up, up_addr) = start_upstream().await?;
    let mut procs = Vec::new();
    let mut targets = vec![Target::new("direct", up_addr, "/mcp", "echo", None)];
    let (p, mut t) = start_proxy(bin, up_addr, "batch").await?;
    t.name = "resume batch".into();
    procs.push(p);
    targets.push(t);
    let mut notes = String::new();
    let scratch = tempfile::Builder::new()
        .prefix("mcp-resume-proxy-peers-")
        .tempdir()?;
    match rmp_bin(Duration::from_secs(900)) {
        Ok(rmp) => {
            let port = free_port()?;
            let conf = scratch.path().join("rmp.toml");
            std::fs::write(
                &conf,
                format!(
                    "[proxy]\nname = \"rmp-load\"\nseparator = \"/\"\n\n[proxy.listen]\nhost = \"127.0.0.1\"\n\
                     port = {port}\n\n[[backends]]\nname = \"fast\"\ntransport = \"http\"\n\
                     url = \"http://{up_addr}/mcp\"\n\n[observability]\nlog_level = \"info\"\n"
                ),
            )?;
            let mut cmd = Command::new(rmp);
            cmd.arg("--config")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(scratch.path().join("rmp.log"))?);
            let mut p = Proc::spawn("mcp-proxy", cmd, None)?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            wait_listening(&mut p, addr, Duration::from_secs(30)).await?;
            targets.push(Target::new(
                "mcp-proxy",
                addr,
                "/",
                "fast/echo",
                Some(p.pid()),
            ));
            procs.push(p);
        }
        Err(e) => writeln!(notes, "mcp-proxy (Rust) skipped: {e:#}")?,
    }
    match persist_bin(Duration::from_secs(300)) {
        Ok(persist) => {
            let port = free_port()?;
            let mut cmd = Command::new(persist);
            cmd.arg("--upstream")
                .arg(format!("http://{up_addr}"))
                .args(["--backend", "sqlite", "--url"])
                .arg(scratch.path().join("persist.db"))
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(scratch.path().join("persist.log"))?);
            let mut p = Proc::spawn("mcp-persist", cmd, None)?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            wait_listening(&mut p, addr, Duration::from_secs(30)).await?;
            targets.push(Target::new(
                "mcp-persist",
                addr,
                "/mcp",
                "echo",
                Some(p.pid()),
            ));
            procs.push(p);
        }
        Err(e) => writeln!(notes, "mcp-persist skipped: {e:#}")?,
    }
    let mut out = small_table("peers", &targets, o).await?;
    out.push_str(&notes);
    Ok(out)
}
