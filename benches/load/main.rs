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
//! temporary data directory. `--sync` also takes three pseudo modes, the
//! Redis backend: `redis` (on `REDIS_URL`, else a private `redis-server`),
//! `redis-tls` (a private `redis-server` reached over TLS, `rediss://`, as an
//! ACL user whose password is in a file, trusting a throwaway CA: what
//! managed Redis asks for) and `redis-cluster` (a private Redis Cluster of
//! three primaries, `cluster`; never with `--smoke` or `--check`). Each
//! private Redis is started when a proxy first needs it, once per run; at
//! the end the keys the proxies wrote are deleted, the TLS server and the
//! cluster are stopped and the plain one goes with the harness.
//! `--scenario small --sync redis,redis-tls` puts both in one table, with a
//! column against `redis`, so what TLS costs reads as a ratio of the same
//! run. `--store-extra 'TOML lines'` adds those lines to the `[store]` of
//! every proxy the harness starts (`partitions = 1`). Everything listens on
//! 127.0.0.1 only; every child is killed by a guard on drop (also when a
//! scenario panics) and by `PR_SET_PDEATHSIG` when the harness itself dies;
//! every scenario runs under a timeout.
//!
//! Scenarios: `small`, `streaming`, `replay`, `idle`, `dialects`, `auth`,
//! `observed`, `scale` (default: all eight), `peers` (only with `--peers`: the `small` load through the Rust
//! `mcp-proxy` crate, the PyPI `mcp-persist` and nginx, installed under
//! `/tmp/mcp-resume-proxy-peers` or from Debian, never in the repository)
//! `instances` (only when named: one instance serving, 0, 1 and 3 more idle
//! on the same Redis log, what they cost it and what following the feed
//! costs them; `--sync redis-cluster` runs it on a Redis Cluster, with
//! each primary's share of the commands), and `soak` (only when named, and
//! alone: minutes of load on one proxy, its memory and pace per segment;
//! `--scenario soak --check` fails past its bounds).
//! `--smoke` runs the eight at tiny sizes in a few seconds and exits non-zero
//! unless each of them completed without errors and printed its figures.
//! `--upstream rust,node` runs the scenarios once per fast upstream: the Rust
//! one above (default) or `benches/support/fast_upstream.mjs` under node, the
//! kind of server users put behind a proxy. `--scenario small --check` is the
//! regression guard (`check`): proxy against floor, compared with the ratios
//! recorded in `benches/load/recorded.toml`; exits non-zero on a regression.
//!
//! This file owns the options, the order of the scenarios and their time
//! limits; each scenario is a module of its own (`small`, `streaming`,
//! `replay`, `idle`, `dialects`, `auth`, `observed`, `instances`, `scale`, `peers`, `soak`, and `check`), on top of the MCP client
//! (`client`), the child processes and `/proc` readings (`procs`), the
//! Redis Cluster (`cluster`), nginx (`nginx`) and the latency histogram
//! (`histogram`).

#[path = "../support/fast_upstream.rs"]
mod fast_upstream;

#[path = "../support/floor_proxy.rs"]
mod floor_proxy;

#[path = "../support/otlp_sink.rs"]
mod otlp_sink;

#[path = "../support/redis_keys.rs"]
mod redis_keys;

#[path = "../support/soak_figures.rs"]
mod soak_figures;

#[path = "../../tests/common/redis_server.rs"]
mod redis_server;

/// The tests' Redis Cluster rig, for the `redis-cluster` mode (`cluster.rs`).
#[path = "../../tests/common/redis_cluster.rs"]
mod redis_cluster;

/// The tests' throwaway PKI (`tests/common/tls.rs`): the CA and server
/// certificate of the `redis-tls` mode's Redis. The bench uses none of its
/// client-side half.
#[path = "../../tests/common/tls.rs"]
#[allow(dead_code)]
mod tls;

#[path = "../../tests/auth/server.rs"]
#[allow(dead_code)]
mod auth_server;
/// The tests' signing keys and authorization server (`tests/auth/`): the
/// `auth` scenario's tokens and JWKS. (The server names the keys' module
/// `super::keys`, hence its name here.)
#[path = "../../tests/auth/keys.rs"]
#[allow(dead_code)]
mod keys;

mod auth;
mod check;
mod client;
mod cluster;
mod dialects;
mod histogram;
mod idle;
mod instances;
mod nginx;
mod observed;
mod peers;
mod procs;
mod redis_modes;
mod replay;
mod scale;
mod small;
mod soak;
mod streaming;

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use crate::procs::{cpus, loadavg, proxy_bin, raise_nofile, Upstream};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("upstream") {
        run_upstream(&args[1..]);
        return;
    }
    if args.first().map(String::as_str) == Some("floor") {
        run_floor(&args[1..]);
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

const USAGE: &str = "usage: cargo bench --bench load -- [--smoke] [--peers] [--check] [--scenario small|streaming|replay|idle|dialects|auth|observed|instances|scale|peers]...
       [--upstream rust,node] [--sync never,batch,always,redis,redis-tls,redis-cluster] [--rounds N] [--duration SECS] [--warmup SECS] [--concurrency 1,32] [--pace MS]
       [--streaming-calls N] [--progress N] [--replay-entries N] [--idle-streams N] [--idle-hold SECS]
       [--retained 0,10000,100000] [--fill-progress N] [--store-extra 'TOML lines']
   instances on a cluster: cargo bench --bench load -- --scenario instances --sync redis-cluster
       (a private 3-primary Redis Cluster; Redis counts summed over its nodes, with each primary's share;
       --sync redis,redis-cluster puts one server and the cluster in one run)
   or: cargo bench --bench load -- --scenario soak [--check] [--concurrency 32] [--segments 8] [--segment-secs 30]
       [--backend journal|sled|redis] [--proxy-toml TOML]... [--max-retained-streams N]";

/// The fast upstream's process: `load upstream --port P`.
fn run_upstream(args: &[String]) {
    let port: u16 = match args {
        [flag, port] if flag == "--port" => port.parse().expect("--port takes a number"),
        _ => panic!("usage: load upstream --port P"),
    };
    serve_on(port, fast_upstream::serve);
}

/// The floor proxy's process: `load floor --port P --upstream ADDR`.
fn run_floor(args: &[String]) {
    let (port, upstream): (u16, std::net::SocketAddr) = match args {
        [p, port, u, addr] if p == "--port" && u == "--upstream" => (
            port.parse().expect("--port takes a number"),
            addr.parse().expect("--upstream takes host:port"),
        ),
        _ => panic!("usage: load floor --port P --upstream ADDR"),
    };
    serve_on(port, move |listener| floor_proxy::serve(listener, upstream));
}

/// Runs a server of this harness's own (upstream, floor) on 127.0.0.1:`port`
/// in its own runtime, until the process is killed.
fn serve_on<F, S>(port: u16, serve: S)
where
    S: FnOnce(tokio::net::TcpListener) -> F,
    F: Future<Output = ()>,
{
    raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind 127.0.0.1 port");
        serve(listener).await;
    });
}

#[derive(Clone, Debug)]
struct Opts {
    smoke: bool,
    peers: bool,
    /// The regression guard instead of the `small` table (`check`).
    check: bool,
    /// The fast upstreams to run every scenario behind, one pass each.
    upstreams: Vec<Upstream>,
    /// The one of them the current pass runs behind.
    upstream: Upstream,
    scenarios: Vec<String>,
    rounds: usize,
    duration: Duration,
    warmup: Duration,
    concurrency: Vec<usize>,
    /// Think time each `small` client takes between its calls (none by
    /// default): an interactive client, whose proxy goes idle between calls.
    pace: Duration,
    streaming_calls: usize,
    progress: u32,
    replay_entries: u32,
    idle_streams: usize,
    idle_hold: Duration,
    /// Retained streams the `scale` scenario fills the proxy with, one
    /// pass each.
    retained: Vec<usize>,
    /// Progress notifications in each of those calls' answers: how much
    /// log each retained stream holds.
    fill_progress: u32,
    /// `[store] sync` modes (or `redis`, the Redis backend, `redis-tls`,
    /// the same over TLS as an ACL user, and `redis-cluster`, on a Redis
    /// Cluster) under test in `small` and `streaming`, the first of them in
    /// `dialects`, `auth` and `observed`, the Redis ones in `instances`
    /// (`None`: each scenario's own list).
    sync: Option<Vec<String>>,
    /// TOML lines added to the `[store]` of every proxy, ending in a
    /// newline (or empty).
    store_extra: String,
    /// The soak's segments, each a row of its table.
    segments: usize,
    segment_secs: Duration,
    /// The soak proxy's `[store] backend`.
    backend: String,
    /// TOML documents merged, in turn, over the soak proxy's configuration.
    proxy_toml: Vec<String>,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Self> {
        let mut o = Opts {
            smoke: false,
            peers: false,
            check: false,
            upstreams: vec![Upstream::Rust],
            upstream: Upstream::Rust,
            scenarios: Vec::new(),
            rounds: 3,
            duration: Duration::from_secs(4),
            warmup: Duration::from_secs(1),
            concurrency: vec![1, 32],
            pace: Duration::ZERO,
            streaming_calls: 1000,
            progress: 100,
            replay_entries: 10_000,
            idle_streams: 10_000,
            idle_hold: Duration::from_secs(3),
            retained: vec![0, 10_000, 100_000],
            fill_progress: 0,
            sync: None,
            store_extra: String::new(),
            segments: 8,
            segment_secs: Duration::from_secs(30),
            backend: "journal".into(),
            proxy_toml: Vec::new(),
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
                "--check" => o.check = true,
                "--upstream" => {
                    o.upstreams = value()?
                        .split(',')
                        .map(Upstream::parse)
                        .collect::<Result<_>>()?;
                }
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
                "--pace" => {
                    o.pace = Duration::from_secs_f64(value()?.parse::<f64>()? / 1000.0);
                    explicit.push("pace");
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
                "--retained" => {
                    o.retained = value()?
                        .split(',')
                        .map(str::parse)
                        .collect::<Result<_, _>>()?;
                    explicit.push("retained");
                }
                "--fill-progress" => {
                    o.fill_progress = value()?.parse()?;
                    explicit.push("fill-progress");
                }
                "--idle-hold" => {
                    o.idle_hold = Duration::from_secs_f64(value()?.parse()?);
                    explicit.push("idle-hold");
                }
                "--segments" => {
                    o.segments = value()?.parse()?;
                    explicit.push("segments");
                }
                "--segment-secs" => {
                    o.segment_secs = Duration::from_secs_f64(value()?.parse()?);
                    explicit.push("segment-secs");
                }
                "--backend" => {
                    o.backend = value()?.to_owned();
                    if !["journal", "sled", "redis"].contains(&o.backend.as_str()) {
                        bail!("unknown backend {:?} (journal, sled or redis)", o.backend);
                    }
                    explicit.push("backend");
                }
                "--proxy-toml" => {
                    o.proxy_toml.push(value()?.to_owned());
                    explicit.push("proxy-toml");
                }
                "--max-retained-streams" => {
                    let n: u64 = value()?.parse()?;
                    o.proxy_toml
                        .push(format!("limits.max_retained_streams = {n}"));
                    explicit.push("max-retained-streams");
                }
                "--sync" => {
                    let modes: Vec<String> = value()?.split(',').map(str::to_owned).collect();
                    if let Some(bad) = modes.iter().find(|m| !SYNC_MODES.contains(&m.as_str())) {
                        bail!("unknown sync mode {bad:?} ({})", SYNC_MODES.join(", "));
                    }
                    o.sync = Some(modes);
                }
                "--store-extra" => {
                    o.store_extra = value()?.to_owned();
                    if !o.store_extra.is_empty() && !o.store_extra.ends_with('\n') {
                        o.store_extra.push('\n');
                    }
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
            if !keep("retained") {
                o.retained = vec![0, 20];
            }
        }
        if o.scenarios.iter().any(|s| s == "soak") {
            o.soak_alone(&explicit)?;
        } else if let Some(flag) = explicit.iter().find(|f| {
            [
                "segments",
                "segment-secs",
                "backend",
                "proxy-toml",
                "max-retained-streams",
            ]
            .contains(f)
        }) {
            bail!("--{flag} is an option of --scenario soak");
        } else if o.check {
            o.check_alone(&explicit)?;
        }
        o.no_cluster_unless_asked()?;
        if o.scenarios.is_empty() {
            o.scenarios = [
                "small",
                "streaming",
                "replay",
                "idle",
                "dialects",
                "auth",
                "observed",
                "scale",
            ]
            .map(str::to_owned)
            .to_vec();
        }
        if o.peers && !o.scenarios.iter().any(|s| s == "peers") {
            o.scenarios.push("peers".into());
        }
        for s in &o.scenarios {
            match s.as_str() {
                "small" | "streaming" | "replay" | "idle" | "dialects" | "auth" | "observed"
                | "scale" | "soak" | "instances" => {}
                "peers" if o.peers => {}
                "peers" => bail!("the peers scenario runs only with --peers"),
                other => bail!("unknown scenario {other:?}"),
            }
        }
        if o.rounds == 0 {
            bail!("--rounds must be at least 1");
        }
        o.upstream = o.upstreams[0];
        Ok(o)
    }

    /// `--check` measures what `recorded.toml` records and nothing else: the
    /// `small` scenario, `batch`, at concurrency 1 and 32. Options that would
    /// measure something else are refused rather than compared wrongly.
    fn check_alone(&mut self, explicit: &[&str]) -> Result<()> {
        if self.smoke
            || self.peers
            || self.sync.is_some()
            || explicit.contains(&"concurrency")
            || explicit.contains(&"pace")
        {
            bail!("--check takes no --smoke, --peers, --sync, --concurrency or --pace");
        }
        if self.upstreams != [Upstream::Rust] {
            bail!("--check compares figures recorded behind the rust upstream only");
        }
        if self.scenarios.iter().any(|s| s != "small") {
            bail!("--check runs with --scenario small (or --scenario soak) only");
        }
        self.scenarios = vec!["small".into()];
        self.concurrency = vec![1, 32];
        Ok(())
    }

    /// A Redis Cluster is started only when `--sync redis-cluster` asks for
    /// one, never for a quick run (`--check` takes no `--sync` at all);
    /// `instances` measures instances sharing a Redis log, so only the
    /// Redis modes it can count commands on.
    fn no_cluster_unless_asked(&self) -> Result<()> {
        let modes = self.sync.as_deref().unwrap_or_default();
        if self.smoke && modes.iter().any(|m| m == "redis-cluster") {
            bail!("--smoke never starts a Redis Cluster: --sync redis-cluster without --smoke");
        }
        if self.scenarios.iter().any(|s| s == "instances") {
            if let Some(bad) = modes
                .iter()
                .find(|m| !["redis", "redis-cluster"].contains(&m.as_str()))
            {
                bail!("the instances scenario runs on --sync redis or redis-cluster, not {bad:?}");
            }
        }
        Ok(())
    }

    /// The soak runs alone, at one concurrency (32 unless asked), with
    /// `--check` judging its own bounds; `--smoke` makes it 3 segments of a
    /// second at concurrency 4.
    fn soak_alone(&mut self, explicit: &[&str]) -> Result<()> {
        if self.scenarios.iter().any(|s| s != "soak") {
            bail!("the soak scenario runs alone");
        }
        if self.sync.is_some() {
            bail!(
                "the soak takes --backend, and --proxy-toml 'store.sync = \"…\"' for a sync mode"
            );
        }
        if !explicit.contains(&"concurrency") {
            self.concurrency = vec![if self.smoke { 4 } else { 32 }];
        }
        if self.concurrency.len() != 1 {
            bail!("the soak runs at one --concurrency");
        }
        if self.smoke && !explicit.contains(&"segments") {
            self.segments = 3;
        }
        if self.smoke && !explicit.contains(&"segment-secs") {
            self.segment_secs = Duration::from_secs(1);
        }
        if self.segments == 0 || self.segment_secs.is_zero() {
            bail!("the soak needs at least one segment, of some length");
        }
        if self.check && self.segments < 3 {
            bail!("--check measures growth from segment 2 on: at least 3 segments");
        }
        Ok(())
    }

    /// The `[store] sync` modes a scenario runs proxies with: `--sync`, or
    /// the scenario's own `default`.
    fn sync_modes(&self, default: &[&str]) -> Vec<String> {
        self.sync
            .clone()
            .unwrap_or_else(|| default.iter().map(|&m| m.to_owned()).collect())
    }
}

/// What `--sync` takes: the journal's modes, then the Redis backend's
/// pseudo modes.
const SYNC_MODES: [&str; 6] = [
    "never",
    "batch",
    "always",
    "redis",
    "redis-tls",
    "redis-cluster",
];

async fn run(opts: Opts) -> bool {
    let started = Instant::now();
    // Before any proxy starts: every one's `[store]` takes them.
    let _ = redis_modes::STORE_EXTRA.set(opts.store_extra.clone());
    println!("# mcp-resume-proxy load harness");
    println!(
        "command: cargo bench --bench load -- {}",
        // cargo appends --bench itself. Quoted as a shell would need them,
        // so that the line runs as printed (`--proxy-toml 'a = 1'`).
        std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .map(|a| shlex::try_quote(&a).map_or(a.clone(), |q| q.into_owned()))
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
        "options: upstreams={:?} rounds={} duration={:?} warmup={:?} concurrency={:?} streaming={}x{} replay={} idle={} hold={:?}",
        opts.upstreams,
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
    for &upstream in &opts.upstreams {
        let pass = Opts {
            upstream,
            ..opts.clone()
        };
        println!();
        println!("# behind the {} fast upstream", upstream.name());
        all_ok &= run_scenarios(&pass, &bin).await;
    }
    redis_modes::clean_redis();
    redis_modes::stop_redis_tls();
    cluster::stop();
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

/// Every scenario of `o` in turn, behind `o.upstream`; whether all passed.
async fn run_scenarios(o: &Opts, bin: &std::path::Path) -> bool {
    let mut all_ok = true;
    for name in &o.scenarios {
        println!();
        let limit = scenario_limit(name, o);
        let t0 = Instant::now();
        let outcome = match name.as_str() {
            "small" if o.check => bounded(limit, check::run(o, bin)).await,
            "small" => bounded(limit, small::run(o, bin)).await,
            "streaming" => bounded(limit, streaming::run(o, bin)).await,
            "replay" => bounded(limit, replay::run(o, bin)).await,
            "idle" => bounded(limit, idle::run(o, bin)).await,
            "dialects" => bounded(limit, dialects::run(o, bin)).await,
            "auth" => bounded(limit, auth::run(o, bin)).await,
            "observed" => bounded(limit, observed::run(o, bin)).await,
            "instances" => bounded(limit, instances::run(o, bin)).await,
            "scale" => bounded(limit, scale::run(o, bin)).await,
            "peers" => bounded(limit, peers::run(o, bin)).await,
            "soak" => bounded(limit, soak::run(o, bin)).await,
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
    all_ok
}

fn scenario_limit(name: &str, o: &Opts) -> Duration {
    let per_run = o.duration + o.warmup + Duration::from_secs(15);
    match name {
        "small" | "dialects" | "auth" | "observed" => {
            per_run * (o.rounds * o.concurrency.len() * 5) as u32 + Duration::from_secs(30)
        }
        // Once per Redis mode, and a cluster to start (its nodes may take
        // 30 s to join and 30 s more to agree).
        "instances" => {
            let modes = o.sync_modes(&["redis"]).len();
            per_run * (o.rounds * o.concurrency.len() * 5 * modes) as u32 + Duration::from_secs(90)
        }
        // Up to seven targets, plus the installs (mcp-proxy's cargo install).
        "peers" => {
            per_run * (o.rounds * o.concurrency.len() * 7) as u32 + Duration::from_secs(1800)
        }
        "idle" => Duration::from_secs(120) + o.idle_hold * 2,
        // Per retained count: the fill (~20,000 calls a second, at least
        // 2,000), two targets' rounds, the logged call and its replays (at
        // least 1,000 messages a second), and a recovery.
        "scale" => {
            let calls = o.retained.iter().sum::<usize>() * (1 + o.fill_progress as usize / 10);
            let rounds = per_run * (o.rounds * o.concurrency.len() * 2) as u32;
            let replays = (2 * o.rounds + 1) as u64 * u64::from(o.replay_entries) / 1_000;
            Duration::from_secs(calls as u64 / 2_000 + 30)
                + (rounds + Duration::from_secs(130 + replays)) * o.retained.len() as u32
        }
        "soak" => o.segment_secs * o.segments as u32 + Duration::from_secs(120),
        _ => Duration::from_secs(60 + 30 * o.rounds as u64),
    }
}

async fn bounded<T>(limit: Duration, f: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| anyhow!("timed out after {limit:?}"))?
}

/// A row's figure per round, comma separated, and their median: the median
/// is what rows are compared by, so one round disturbed by the machine does
/// not decide the ratio.
fn per_round_and_median(mut rates: Vec<f64>) -> (String, f64) {
    let per_round = rates
        .iter()
        .map(|r| format!("{r:.0}"))
        .collect::<Vec<_>>()
        .join(",");
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    (per_round, median)
}
