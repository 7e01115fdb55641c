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
//! Opt-in (`--scenario instances`): it needs `redis-server`, as `--sync
//! redis` does.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, Result};

use crate::client::Target;
use crate::procs::{
    cpu_of, free_port, proxy_dir, spawn_proxy, start_upstream, store_section, Proc,
};
use crate::small::{measure, Row};
use crate::Opts;

/// Instances on the log, the serving one included.
const COUNTS: [usize; 3] = [1, 2, 4];

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let (_upstream, upstream) = start_upstream(o.upstream).await?;
    let mut out = String::new();
    for &c in &o.concurrency {
        writeln!(
            out,
            "## instances: one serving `small` (c = {c}), the others idle on the same Redis log\n\
             instances   req/s   Redis commands/call   XREADs/call   serving CPU us/call   idle ones' CPU us/call (each)"
        )?;
        let mut first_cpu = None;
        for n in COUNTS {
            let (procs, targets, key_dir) = start_instances(bin, upstream, n).await?;
            let (before, counts_before) = (cpu_of(&targets)?, RedisCounts::now()?);
            let rows: Vec<Row> = measure(&targets[..1], c, o).await?;
            let (after, counts_after) = (cpu_of(&targets)?, RedisCounts::now()?);
            let calls = rows[0].calls.max(1) as f64;
            let (commands, xreads) = counts_after.per_call(counts_before, calls);
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
                "{n:>9}   {:>5.0}   {commands:>19.1}   {xreads:>11.3}   {serving:>8.1} ({:+.1} %)        {}",
                rows[0].rps,
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
        spread_table(&mut out, bin, upstream, c, o).await?;
    }
    Ok(out)
}

/// The same load spread over every instance at once, as a balancer would.
/// Each instance's CPU per call is set against one instance alone under
/// its share of the load (`c / n`): fewer calls in flight batch less, so
/// that, not the number of instances, is the baseline an added instance's
/// cost shows against.
async fn spread_table(
    out: &mut String,
    bin: &Path,
    upstream: std::net::SocketAddr,
    c: usize,
    o: &Opts,
) -> Result<()> {
    writeln!(
        out,
        "## instances: `small` (c = {c} in all) spread over every instance\n\
         instances   req/s   Redis commands/call   XREADs/call   alone at c/n: CPU us/call   each with the others: CPU us/call"
    )?;
    for n in COUNTS.into_iter().filter(|n| c % n == 0 && c / n > 0) {
        let (alone, _, _) = spread_run(bin, upstream, 1, c / n, o).await?;
        let (each, rps, (commands, xreads)) = spread_run(bin, upstream, n, c, o).await?;
        let each: Vec<String> = each
            .iter()
            .map(|x| format!("{x:.1} ({:+.1} %)", (x / alone[0] - 1.0) * 100.0))
            .collect();
        writeln!(
            out,
            "{n:>9}   {rps:>5.0}   {commands:>19.1}   {xreads:>11.3}   {:>24.1}   {}",
            alone[0],
            each.join(", ")
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// `n` instances loaded with `c` sessions spread over them: each one's CPU
/// µs per call it served, the fleet's req/s, and Redis commands and
/// `XREAD`s per call.
async fn spread_run(
    bin: &Path,
    upstream: std::net::SocketAddr,
    n: usize,
    c: usize,
    o: &Opts,
) -> Result<(Vec<f64>, f64, (f64, f64))> {
    let (procs, targets, key_dir) = start_instances(bin, upstream, n).await?;
    let (before, counts_before) = (cpu_of(&targets)?, RedisCounts::now()?);
    let (calls, rps) = crate::small::spread(&targets, c, o).await?;
    let (after, counts_after) = (cpu_of(&targets)?, RedisCounts::now()?);
    // Each instance serves an equal share of the calls.
    let share = (calls.max(1) as f64) / n as f64;
    let each = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) * 1e6 / share)
        .collect();
    drop(procs);
    drop(key_dir);
    Ok((
        each,
        rps,
        counts_after.per_call(counts_before, calls.max(1) as f64),
    ))
}

/// `n` proxies on one Redis log, each with a directory of its own.
async fn start_instances(
    bin: &Path,
    upstream: std::net::SocketAddr,
    n: usize,
) -> Result<(Vec<Proc>, Vec<Target>, tempfile::TempDir)> {
    let shared = proxy_dir()?;
    let store = store_section("redis", shared.path())?;
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

/// What the benches' Redis has processed: all commands (`INFO stats`), and
/// the `XREAD`s among them (`INFO commandstats`): the listeners' reads of
/// the feed, each one a wake-up of an instance.
#[derive(Clone, Copy)]
struct RedisCounts {
    commands: u64,
    xreads: u64,
}

impl RedisCounts {
    fn now() -> Result<Self> {
        let url = crate::redis_server::shared().map_err(|why| anyhow!(why))?;
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
                .ok_or_else(|| anyhow!("no total_commands_processed in INFO"))?,
            // No line before the first XREAD.
            xreads: field("cmdstat_xread:calls=").unwrap_or(0),
        })
    }

    /// Commands and `XREAD`s per call since `before`.
    fn per_call(self, before: Self, calls: f64) -> (f64, f64) {
        (
            (self.commands - before.commands) as f64 / calls,
            (self.xreads - before.xreads) as f64 / calls,
        )
    }
}
