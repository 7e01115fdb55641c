//! The `soak` scenario (issue 36): whether one proxy holds its memory and
//! its pace under sustained load. `--concurrency` clients (default 32), each
//! a session on a connection of its own, make `small`'s `tools/call` back to
//! back, without a pause, for `--segments` (default 8) segments of
//! `--segment-secs` (default 30) against one proxy with the default
//! configuration — so retention (`retention_secs = 900`) keeps every finished
//! stream of a run shorter than 15 minutes. At each segment's end it prints a
//! markdown row: calls so far, the segment's req/s and the proxy's CPU per
//! call, its RSS, what its store holds (the data directory, or Redis'
//! `used_memory`), and the machine's idle share and load. The summary
//! (`soak_figures`) gives the RSS growth per 100k calls, least squares from
//! segment 2 on, per call for the store too, and the last segment's
//! throughput over the first's; `--check` fails the run past the bounds.
//!
//! `--backend journal|sled|redis` picks the store; `redis` starts a
//! `redis-server` of its own (free loopback port, temp dir, no persistence),
//! even when `REDIS_URL` is set, so that `used_memory` is this proxy's alone,
//! and stops it after. `--proxy-toml TEXT` (repeatable) merges a TOML
//! document over the configuration, tables key by key (`store.retention_secs
//! = 20`, or `[limits]` and its lines); `--max-retained-streams N` is
//! `limits.max_retained_streams = N`. Not in the default scenario list: it
//! runs for minutes and is meant to be run alone.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context as _, Result};
use tokio::task::JoinHandle;

use crate::client::{call, connect, connect_many, open_session, Sender, Target};
use crate::procs::{free_port, proxy_dir, spawn_proxy, start_upstream, Proc};
use crate::redis_server::{self, Persistence, RedisServer};
use crate::soak_figures::{dir_bytes, header, row, start_row, Sample, Summary};
use crate::Opts;

/// What the store column measures.
enum Store {
    /// The proxy's data directory (journal, sled).
    Dir(PathBuf),
    /// Redis' `used_memory`, at this URL.
    Redis(String),
}

impl Store {
    fn bytes(&self) -> Result<u64> {
        match self {
            Self::Dir(dir) => Ok(dir_bytes(dir)),
            // A blocking round trip on loopback once a segment: too short
            // to disturb the load's runtime.
            Self::Redis(url) => used_memory(url),
        }
    }

    fn column(&self) -> &'static str {
        match self {
            Self::Dir(_) => "data dir",
            Self::Redis(_) => "Redis used_memory",
        }
    }
}

fn used_memory(url: &str) -> Result<u64> {
    let mut conn = redis_server::connect(url).map_err(|e| anyhow!("Redis at {url}: {e}"))?;
    let info: String = redis::cmd("INFO").arg("memory").query(&mut conn)?;
    let value = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .ok_or_else(|| anyhow!("INFO memory without used_memory"))?;
    Ok(value.trim().parse()?)
}

/// The soak's processes. Fields drop in order: the proxy goes before its
/// upstream and its Redis.
struct Stand {
    proxy: Proc,
    target: Target,
    store: Store,
    config: String,
    _upstream: Proc,
    _redis: Option<RedisServer>,
}

async fn start(o: &Opts, bin: &Path) -> Result<Stand> {
    let (upstream, up_addr) = start_upstream(o.upstream).await?;
    let redis = match o.backend.as_str() {
        "redis" => Some(RedisServer::start(Persistence::None).map_err(|e| anyhow!(e))?),
        _ => None,
    };
    let dir = proxy_dir()?;
    let port = free_port()?;
    let data = dir.path().join("data");
    let redis_url = redis.as_ref().map(RedisServer::url);
    let config = config(o, port, dir.path(), up_addr, redis_url.as_deref())?;
    let name = format!("proxy {}", o.backend);
    let (proxy, target) = spawn_proxy(bin, &name, dir, port, &config).await?;
    let store = match redis_url {
        Some(url) => Store::Redis(url),
        None => Store::Dir(data),
    };
    Ok(Stand {
        proxy,
        target,
        store,
        config,
        _upstream: upstream,
        _redis: redis,
    })
}

/// The default configuration but for where the proxy listens, keeps its
/// data, finds its upstream and logs (`--backend`, and `--store-extra`'s
/// lines in its `[store]`), with every `--proxy-toml` merged over it in
/// turn.
fn config(
    o: &Opts,
    port: u16,
    dir: &Path,
    upstream: SocketAddr,
    redis: Option<&str>,
) -> Result<String> {
    let mut base = format!(
        "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n\n[store]\nbackend = \"{}\"\n{}",
        dir.join("data").display(),
        o.backend,
        crate::redis_modes::store_extra(),
    );
    if let Some(url) = redis {
        // The Redis backend refuses to start without a shared token key.
        let key = dir.join("token.key");
        std::fs::write(&key, [1u8; 32])?;
        let key = key.display();
        write!(
            base,
            "redis_url = \"{url}\"\n\n[tokens]\nkey_file = \"{key}\"\n"
        )?;
    }
    write!(
        base,
        "\n[[upstream]]\npath = \"/mcp\"\nurl = \"http://{upstream}/mcp\"\n"
    )?;
    let mut table: toml::Table = base.parse()?;
    for extra in &o.proxy_toml {
        let extra: toml::Table = extra
            .parse()
            .with_context(|| format!("--proxy-toml {extra:?} is not TOML"))?;
        merge(&mut table, extra);
    }
    Ok(toml::to_string(&table)?)
}

/// `from` over `into`: tables merge key by key, anything else replaces.
fn merge(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match value {
            toml::Value::Table(inner) => match into.get_mut(&key) {
                Some(toml::Value::Table(existing)) => merge(existing, inner),
                _ => {
                    into.insert(key, toml::Value::Table(inner));
                }
            },
            value => {
                into.insert(key, value);
            }
        }
    }
}

/// The running clients: what they count, and how they are stopped (also
/// when the scenario is dropped on its time limit).
struct Load {
    calls: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// `c` sessions, each on a connection of its own, opened before the start
/// sample so that it holds them.
async fn open_clients(t: &Target, c: usize) -> Result<Vec<(Sender, Target, String)>> {
    let mut clients = Vec::with_capacity(c);
    for (n, mut conn) in connect_many(t.addr, c).await?.into_iter().enumerate() {
        let t = t.client(n);
        let session = open_session(&mut conn, &t).await?;
        clients.push((conn, t, session));
    }
    Ok(clients)
}

/// Sets every client calling, back to back, until the [`Load`] stops.
fn start_load(clients: Vec<(Sender, Target, String)>) -> Load {
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = clients
        .into_iter()
        .map(|(mut conn, t, session)| {
            let (calls, errors, stop) = (calls.clone(), errors.clone(), stop.clone());
            tokio::spawn(async move {
                let mut id = 1;
                while !stop.load(Ordering::Relaxed) {
                    let outcome = call(&mut conn, &t, &session, id, "{}").await;
                    id += 1;
                    let Err(e) = outcome else {
                        calls.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("load: soak: {e:#}");
                    }
                    // The connection may be gone; go on with a new one, or
                    // stop when the proxy takes none.
                    match connect(t.addr).await {
                        Ok(c) => conn = c,
                        Err(_) => break,
                    }
                }
            })
        })
        .collect();
    Load {
        calls,
        errors,
        stop,
        tasks,
    }
}

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let stand = start(o, bin).await?;
    let c = o.concurrency[0];
    println!(
        "## soak: tools/call, JSON upstream answer ({} upstream), concurrency {c}, {} segments x {:.0} s, backend {}",
        o.upstream.name(),
        o.segments,
        o.segment_secs.as_secs_f64(),
        o.backend
    );
    println!("proxy.toml:\n```toml\n{}```", stand.config);
    let clients = open_clients(&stand.target, c).await?;
    let samples = segments(&stand, clients, o).await?;
    let summary = Summary::of(&samples);
    let mut out = summary.lines(stand.store.column());
    if o.check {
        let why = summary.failures();
        if !why.is_empty() {
            // The summary is what a reader needs to see why.
            print!("{out}");
            bail!("soak check failed: {}", why.join("; "));
        }
        writeln!(out, "soak check passed")?;
    }
    Ok(out)
}

/// Runs the load for `o.segments` segments, printing each segment's row as
/// it ends; the start's sample and every segment's.
async fn segments(
    stand: &Stand,
    clients: Vec<(Sender, Target, String)>,
    o: &Opts,
) -> Result<Vec<Sample>> {
    let pid = stand.proxy.pid();
    println!("\n{}", header(stand.store.column()));
    let first = Sample::take(pid, 0, 0, 0.0, stand.store.bytes()?);
    println!("{}", start_row(&first));
    let mut samples = vec![first];
    let load = start_load(clients);
    let t0 = Instant::now();
    for n in 1..=o.segments {
        tokio::time::sleep_until((t0 + o.segment_secs * n as u32).into()).await;
        let (calls, errors) = (
            load.calls.load(Ordering::Relaxed),
            load.errors.load(Ordering::Relaxed),
        );
        let secs = t0.elapsed().as_secs_f64();
        let sample = Sample::take(pid, calls, errors, secs, stand.store.bytes()?);
        println!("{}", row(n, &samples[n - 1], &sample));
        samples.push(sample);
    }
    drop(load);
    // The table's end: the summary follows as a list.
    println!();
    Ok(samples)
}
