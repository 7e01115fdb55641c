//! The `small` scenario: many small `tools/call` requests answered with
//! plain JSON, back to back on keep-alive connections, at each concurrency —
//! the proxy's per-request overhead in throughput and latency, per `[store]
//! sync` mode, against the upstream reached directly. Its table is also what
//! `peers` prints for the other proxies.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};

use crate::client::{call, connect, connect_many, open_session, Target};
use crate::histogram::Histogram;
use crate::procs::{start_floor, start_stand};
use crate::{per_round_and_median, Opts};

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
async fn run_once(t: &Target, concurrency: usize, o: &Opts) -> Result<SmallRun> {
    let mut conns = connect_many(t.addr, concurrency).await?;
    let mut sessions = Vec::with_capacity(concurrency);
    for (n, conn) in conns.iter_mut().enumerate() {
        let t = t.client(n);
        let session = open_session(conn, &t).await?;
        sessions.push((t, session));
    }
    let start = Instant::now();
    let measure_from = start + o.warmup;
    let until = measure_from + o.duration;
    let mut tasks = Vec::new();
    let pace = o.pace;
    for (mut conn, (t, session)) in conns.into_iter().zip(sessions) {
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
                if !pace.is_zero() {
                    tokio::time::sleep(pace).await;
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

/// `concurrency` sessions spread over `targets` (as a balancer would), all
/// loaded at once, for `o.rounds` rounds: the calls completed in all and
/// the fleet's throughput (calls per second).
pub async fn spread(targets: &[Target], concurrency: usize, o: &Opts) -> Result<(u64, f64)> {
    let each = (concurrency / targets.len()).max(1);
    let mut calls = 0;
    for _ in 0..o.rounds {
        let runs = targets.iter().map(|t| run_once(t, each, o));
        for run in futures_util::future::join_all(runs).await {
            let run = run?;
            if run.errors > 0 {
                bail!("{} failed calls at concurrency {each} each", run.errors);
            }
            calls += run.requests;
        }
    }
    let secs = o.duration.as_secs_f64() * o.rounds as f64;
    Ok((calls, calls as f64 / secs))
}

/// One target's figures at one concurrency, all rounds taken together.
pub struct Row {
    pub name: String,
    per_round: String,
    /// Median of the rounds' throughputs, requests per second.
    pub rps: f64,
    /// Latency quantiles of all rounds merged, in µs.
    pub p50: f64,
    p99: f64,
    p999: f64,
    /// Calls that counted, all rounds taken together.
    pub calls: u64,
}

/// Rounds of every target in turn (direct, proxy, …, direct, proxy, …), so
/// drift in the machine's load hits all of them alike; one row per target.
/// Fails when a target had failed calls or none completed.
pub async fn measure(targets: &[Target], c: usize, o: &Opts) -> Result<Vec<Row>> {
    let mut runs: Vec<Vec<SmallRun>> = targets.iter().map(|_| Vec::new()).collect();
    for _ in 0..o.rounds {
        for (i, t) in targets.iter().enumerate() {
            runs[i].push(run_once(t, c, o).await?);
        }
    }
    let mut rows = Vec::with_capacity(targets.len());
    for (t, rs) in targets.iter().zip(&runs) {
        let errors: u64 = rs.iter().map(|r| r.errors).sum();
        if errors > 0 {
            bail!("{}: {errors} failed calls at concurrency {c}", t.name);
        }
        let mut hist = Histogram::new();
        for r in rs {
            hist.merge(&r.hist);
        }
        if hist.total == 0 {
            bail!("{}: no call completed at concurrency {c}", t.name);
        }
        let (per_round, rps) = per_round_and_median(rs.iter().map(SmallRun::rps).collect());
        rows.push(Row {
            name: t.name.clone(),
            per_round,
            rps,
            p50: hist.quantile_us(0.5),
            p99: hist.quantile_us(0.99),
            p999: hist.quantile_us(0.999),
            calls: rs.iter().map(|r| r.requests).sum(),
        });
    }
    Ok(rows)
}

/// One table per concurrency: median throughput and merged latency
/// quantiles, against the first row (direct) and, when nginx took part,
/// against nginx too — the plain reverse proxy a user would compare with —
/// and, when both `redis` and `redis-tls` took part, against `redis`: what
/// TLS and the ACL login add to the Redis backend, read off one run.
pub async fn table(title: &str, targets: &[Target], o: &Opts) -> Result<String> {
    let mut out = String::new();
    for &c in &o.concurrency {
        let rows = measure(targets, c, o).await?;
        write_table(&mut out, title, c, o, &rows)?;
    }
    Ok(out)
}

/// The table of one concurrency's rows, the first of them the yardstick.
pub fn write_table(out: &mut String, title: &str, c: usize, o: &Opts, rows: &[Row]) -> Result<()> {
    writeln!(
        out,
        "## {title}: tools/call, JSON upstream answer ({} upstream), concurrency {c}, {} rounds x {:.1} s",
        o.upstream.name(),
        o.rounds,
        o.duration.as_secs_f64()
    )?;
    write_rows(out, rows)?;
    writeln!(out)?;
    Ok(())
}

fn write_rows(out: &mut String, rows: &[Row]) -> std::fmt::Result {
    let nginx = rows.iter().find(|r| r.name == "nginx");
    let redis = rows
        .iter()
        .find(|r| r.name == "proxy redis")
        .filter(|_| rows.iter().any(|r| r.name == "proxy redis-tls"));
    // 16 wide: `proxy redis-tls` is the longest name of a row.
    write!(
        out,
        "{:<16} {:>26} {:>9} {:>8} {:>9} {:>9} {:>9} {:>10}",
        "target",
        "req/s per round",
        "median",
        "x direct",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "+p50 us"
    )?;
    if nginx.is_some() {
        write!(out, " {:>8} {:>12}", "x nginx", "+p50 v nginx")?;
    }
    if redis.is_some() {
        write!(out, " {:>8} {:>12}", "x redis", "+p50 v redis")?;
    }
    writeln!(out)?;
    let base = &rows[0];
    for r in rows {
        write!(
            out,
            "{:<16} {:>26} {:>9.0} {:>7.2}x {:>9.1} {:>9.1} {:>9.1} {:>10.1}",
            r.name,
            r.per_round,
            r.rps,
            r.rps / base.rps,
            r.p50,
            r.p99,
            r.p999,
            r.p50 - base.p50,
        )?;
        if let Some(n) = nginx {
            write!(out, " {:>7.2}x {:>12.1}", r.rps / n.rps, r.p50 - n.p50)?;
        }
        if let Some(n) = redis {
            write!(out, " {:>7.2}x {:>12.1}", r.rps / n.rps, r.p50 - n.p50)?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// Direct, the floor proxy, then ours per sync mode.
pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let modes = o.sync_modes(&["never", "batch", "always"]);
    let mut stand = start_stand(bin, &modes, o.upstream).await?;
    let upstream = stand.targets[0].addr;
    let (floor, target) = start_floor(upstream).await?;
    stand.targets.insert(1, target);
    stand.proxies.push(floor);
    table("small", &stand.targets, o).await
}
