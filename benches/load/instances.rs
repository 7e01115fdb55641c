//! The `instances` scenario (issue 39): what an added instance on the same
//! Redis costs the instances already there. One instance serves the
//! `small` load; 0, 1 and 3 more run beside it on the same Redis log (the
//! same key prefix and token key, as behind a balancer) serving nothing,
//! so that all they do is follow the live feed (session changes and reader
//! claims, and the shards of the streams they read: none here). Per count
//! of instances it prints the serving instance's throughput and CPU per
//! call, the CPU the idle ones spent per call it served (their cost of
//! following it), and the commands Redis processed per call (`INFO stats`,
//! all instances' together: a script or a pipeline's every command
//! counts). A second table spreads the same load over every instance at
//! once, as a balancer would, and prints what the whole fleet spends per
//! call.
//!
//! ## instances on a cluster
//!
//! `--sync redis-cluster` runs the same tables on a private Redis Cluster
//! of three primaries (`cluster`), the proxies given all three nodes
//! (`[store] redis_cluster`) and the key prefix and lease the one-server
//! mode uses. Redis's counts are then summed over the nodes, and a column
//! says which share of the commands each primary processed (`41/30/29`):
//! whether the log spreads over the primaries or sits on one.
//! `--sync redis,redis-cluster` prints both, one server first.
//! `--store-extra` reaches these proxies too (`partitions = 1`).
//!
//! Opt-in (`--scenario instances`): it needs `redis-server`, as `--sync
//! redis` does (and `redis-cli` on a cluster). This file must not start a
//! Redis itself: `procs` and `cluster` do, for the proxies' `[store]`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::{anyhow, Result};

use crate::client::Target;
use crate::procs::{cpu_of, free_port, proxy_dir, spawn_proxy, start_upstream, Proc};
use crate::redis_modes::store_section;
use crate::small::{measure, Row};
use crate::Opts;

/// Instances on the log, the serving one included.
const COUNTS: [usize; 3] = [1, 2, 4];

/// The cluster's extra column, after `reads/call`, and its width.
const BY_PRIMARY: &str = "   commands by primary %";
const BY_PRIMARY_WIDTH: usize = 21;

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let (_upstream, upstream) = start_upstream(o.upstream).await?;
    let mut out = String::new();
    // `Opts` let only `redis` and `redis-cluster` through.
    for mode in o.sync_modes(&["redis"]) {
        for &c in &o.concurrency {
            serving_table(&mut out, bin, upstream, &mode, c, o).await?;
            spread_table(&mut out, bin, upstream, &mode, c, o).await?;
        }
    }
    Ok(out)
}

/// What a table of `mode` adds to its title (where the instances log) and
/// to its header (the cluster's column).
fn labels(mode: &str) -> (&'static str, &'static str) {
    match mode {
        "redis-cluster" => (", on a 3-primary Redis Cluster", BY_PRIMARY),
        _ => ("", ""),
    }
}

/// One instance serving `small` at concurrency `c`, the others idle.
async fn serving_table(
    out: &mut String,
    bin: &Path,
    upstream: SocketAddr,
    mode: &str,
    c: usize,
    o: &Opts,
) -> Result<()> {
    let (on, by) = labels(mode);
    writeln!(
        out,
        "## instances: one serving `small` (c = {c}), the others idle on the same Redis log{on}\n\
         instances   req/s   Redis commands/call   XREADs/call   reads/call{by}   serving CPU us/call   idle ones' CPU us/call (each)"
    )?;
    let mut first_cpu = None;
    for n in COUNTS {
        let (procs, targets, key_dir) = start_instances(bin, upstream, n, mode).await?;
        let (before, counts_before) = (cpu_of(&targets)?, RedisCounts::now(mode)?);
        let rows: Vec<Row> = measure(&targets[..1], c, o).await?;
        let (after, counts_after) = (cpu_of(&targets)?, RedisCounts::now(mode)?);
        let calls = rows[0].calls.max(1) as f64;
        let redis = counts_after.since(&counts_before, calls);
        let per_call: Vec<f64> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| (a - b) * 1e6 / calls)
            .collect();
        let serving = per_call[0];
        let base = *first_cpu.get_or_insert(serving);
        let idle: Vec<String> = per_call[1..].iter().map(|x| format!("{x:.1}")).collect();
        writeln!(
            out,
            "{n:>9}   {:>5.0}   {}   {serving:>8.1} ({:+.1} %)        {}",
            rows[0].rps,
            redis.columns(),
            (serving / base - 1.0) * 100.0,
            if idle.is_empty() {
                "-".into()
            } else {
                idle.join(", ")
            }
        )?;
        drop(procs);
        drop(key_dir);
    }
    writeln!(out)?;
    Ok(())
}

/// The same load spread over every instance at once, as a balancer would.
/// Each instance's CPU per call is set against one instance alone under
/// its share of the load (`c / n`): fewer calls in flight batch less, so
/// that, not the number of instances, is the baseline an added instance's
/// cost shows against.
async fn spread_table(
    out: &mut String,
    bin: &Path,
    upstream: SocketAddr,
    mode: &str,
    c: usize,
    o: &Opts,
) -> Result<()> {
    let (on, by) = labels(mode);
    writeln!(
        out,
        "## instances: `small` (c = {c} in all) spread over every instance{on}\n\
         instances   req/s   Redis commands/call   XREADs/call   reads/call{by}   alone at c/n: CPU us/call   each with the others: CPU us/call"
    )?;
    for n in COUNTS.into_iter().filter(|n| c % n == 0 && c / n > 0) {
        let (alone, _, _) = spread_run(bin, upstream, mode, 1, c / n, o).await?;
        let (each, rps, redis) = spread_run(bin, upstream, mode, n, c, o).await?;
        let each: Vec<String> = each
            .iter()
            .map(|x| format!("{x:.1} ({:+.1} %)", (x / alone[0] - 1.0) * 100.0))
            .collect();
        writeln!(
            out,
            "{n:>9}   {rps:>5.0}   {}   {:>24.1}   {}",
            redis.columns(),
            alone[0],
            each.join(", ")
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// `n` instances loaded with `c` sessions spread over them: each one's CPU
/// µs per call it served, the fleet's req/s, and what Redis did per call.
async fn spread_run(
    bin: &Path,
    upstream: SocketAddr,
    mode: &str,
    n: usize,
    c: usize,
    o: &Opts,
) -> Result<(Vec<f64>, f64, RedisLoad)> {
    let (procs, targets, key_dir) = start_instances(bin, upstream, n, mode).await?;
    let (before, counts_before) = (cpu_of(&targets)?, RedisCounts::now(mode)?);
    let (calls, rps) = crate::small::spread(&targets, c, o).await?;
    let (after, counts_after) = (cpu_of(&targets)?, RedisCounts::now(mode)?);
    // Each instance serves an equal share of the calls.
    let share = (calls.max(1) as f64) / n as f64;
    let each = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) * 1e6 / share)
        .collect();
    drop(procs);
    drop(key_dir);
    let redis = counts_after.since(&counts_before, calls.max(1) as f64);
    Ok((each, rps, redis))
}

/// `n` proxies on one Redis log (`mode`: `redis` or `redis-cluster`), each
/// with a directory of its own.
async fn start_instances(
    bin: &Path,
    upstream: SocketAddr,
    n: usize,
    mode: &str,
) -> Result<(Vec<Proc>, Vec<Target>, tempfile::TempDir)> {
    let shared = proxy_dir()?;
    let store = store_section(mode, shared.path())?;
    let (mut procs, mut targets) = (vec![], vec![]);
    for i in 0..n {
        let dir = proxy_dir()?;
        let port = free_port()?;
        let config = format!(
            "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n{store}\n\
             [limits]\nstreams_per_principal = 1000000\n\n\
             [[upstream]]\npath = \"/mcp\"\nurl = \"http://{upstream}/mcp\"\n",
            dir.path().join("data").display(),
        );
        let (p, t) = spawn_proxy(bin, &format!("instance {i}"), dir, port, &config).await?;
        procs.push(p);
        targets.push(t);
    }
    // The token key's directory, to outlive the instances.
    Ok((procs, targets, shared))
}

/// What the Redis nodes of `mode` have processed so far, node by node (one
/// for `redis`, the three primaries for `redis-cluster`, always in the
/// same order).
struct RedisCounts(Vec<NodeCounts>);

/// What one Redis node has processed: all commands (`INFO stats`), and the
/// `XREAD`s among them (`INFO commandstats`): the listeners' reads of the
/// feed, each one a wake-up of an instance.
struct NodeCounts {
    commands: u64,
    xreads: u64,
    /// Read events on its client sockets (`total_reads_processed`): a
    /// request, or a pipeline arriving whole, is one, so per call at
    /// c = 1 it counts a call's round trips to Redis.
    reads: u64,
}

impl RedisCounts {
    fn now(mode: &str) -> Result<Self> {
        let urls = match mode {
            "redis-cluster" => crate::cluster::node_urls()?,
            _ => vec![crate::redis_server::shared().map_err(|why| anyhow!(why))?],
        };
        urls.iter()
            .map(|url| NodeCounts::of(url))
            .collect::<Result<_>>()
            .map(Self)
    }

    /// What Redis did per call, `calls` of them, since `before`.
    fn since(&self, before: &Self, calls: f64) -> RedisLoad {
        let commands: Vec<u64> = self
            .0
            .iter()
            .zip(&before.0)
            .map(|(a, b)| a.commands.saturating_sub(b.commands))
            .collect();
        let xreads: u64 = self
            .0
            .iter()
            .zip(&before.0)
            .map(|(a, b)| a.xreads.saturating_sub(b.xreads))
            .sum();
        let reads: u64 = self
            .0
            .iter()
            .zip(&before.0)
            .map(|(a, b)| a.reads.saturating_sub(b.reads))
            .sum();
        let total = commands.iter().sum::<u64>();
        RedisLoad {
            commands: total as f64 / calls,
            xreads: xreads as f64 / calls,
            reads: reads as f64 / calls,
            shares: commands
                .iter()
                .map(|&n| n as f64 * 100.0 / total.max(1) as f64)
                .collect(),
        }
    }
}

impl NodeCounts {
    fn of(url: &str) -> Result<Self> {
        let mut conn = redis::Client::open(url)?.get_connection()?;
        let info: String = redis::cmd("INFO").arg("all").query(&mut conn)?;
        let field = |prefix: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.trim().parse().ok())
        };
        Ok(Self {
            commands: field("total_commands_processed:")
                .ok_or_else(|| anyhow!("no total_commands_processed in INFO of {url}"))?,
            // No line before the first XREAD.
            xreads: field("cmdstat_xread:calls=").unwrap_or(0),
            reads: field("total_reads_processed:")
                .ok_or_else(|| anyhow!("no total_reads_processed in INFO of {url}"))?,
        })
    }
}

/// What Redis did for a measurement's calls, summed over its nodes.
struct RedisLoad {
    commands: f64,
    xreads: f64,
    reads: f64,
    /// Each node's share of the commands, in %.
    shares: Vec<f64>,
}

impl RedisLoad {
    /// The tables' Redis columns: commands, `XREAD`s and reads per call and, on
    /// more than one node, each one's share of the commands.
    fn columns(&self) -> String {
        let mut cols = format!(
            "{:>19.1}   {:>11.3}   {:>10.2}",
            self.commands, self.xreads, self.reads
        );
        if self.shares.len() > 1 {
            let shares: Vec<String> = self.shares.iter().map(|s| format!("{s:.0}")).collect();
            let _ = write!(cols, "   {:>BY_PRIMARY_WIDTH$}", shares.join("/"));
        }
        cols
    }
}
