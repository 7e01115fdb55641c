//! The `scale` scenario: whether the proxy stays flat as its log grows.
//! For each count of retained streams (`--retained`, default 0, 10,000 and
//! 100,000), a fresh proxy (`batch`) is filled with that many finished
//! calls (retention keeps them 15 minutes; `--fill-progress N` gives each
//! answer N progress notifications, for a larger log). One more call logs a
//! long answer (`--replay-entries`) that is replayed from its first event
//! id, before and after the proxy is killed with SIGKILL and started again on
//! the same data: once right after those writes, then once per round after
//! 2.5 s without any (the journal checkpoints a quiet log). The time from
//! spawn to answering `GET /healthz` is its recovery (the first kill's, and
//! the median of the quiet ones), and its memory before and after is the
//! index's cost per retained stream; then it is stopped gracefully
//! (SIGTERM, as a rollout does) and started once more. The proxy's own log adds the journal's
//! recovery time and how much log it replayed after its checkpoint, and the
//! largest checkpoint taken during the fill with the longest time it held
//! the journal's lock and the longest it took to merge and write one (off
//! the lock). Then the `small` load runs against the
//! restarted proxy beside the upstream reached directly, rounds interleaved
//! (after the restarts, so that its own calls, retained too, do not swell
//! the log recovery reads).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use crate::client::{call, connect_many, open_session, Target};
use crate::procs::{
    dir_bytes, logged_numbers, restart_proxy, rss_kib, start_proxy, start_upstream, Proc,
};
use crate::replay::Logged;
use crate::small::{measure, write_table};
use crate::Opts;

/// One start after SIGKILL: spawn to the first `/healthz` answer, and what
/// the journal said of its recovery — its own time, the part of it reading
/// the checkpoint (µs), and the log bytes it replayed (those after the
/// checkpoint's cut).
#[derive(Clone, Copy, Default)]
struct Recovery {
    total: Duration,
    journal_ms: u64,
    checkpoint_read_us: u64,
    replayed: u64,
}

/// How long the log is left alone before the quiet kills: past the
/// journal's quiet checkpoint (a second of no writes, looked at every
/// second).
const QUIET: Duration = Duration::from_millis(2500);

/// The proxy after its last restart, and what the restarts found.
struct Restarted {
    running: Proc,
    /// Killed right after the writes (the fill, the logged call): the log
    /// written since the size rule's last checkpoint is replayed.
    mid_write: Recovery,
    /// The median of the kills after [`QUIET`] of no writes.
    quiet: Recovery,
    /// Spawn to `/healthz` after a graceful stop (SIGTERM), and the
    /// journal's part of it.
    after_stop: Duration,
    after_stop_journal_ms: u64,
    /// The data directory's size at the last kill.
    log_bytes: u64,
    /// The largest checkpoint the first proxy took while it was filled, the
    /// longest it held the journal's lock taking one (µs), and the longest
    /// it took to merge and write one off the lock (ms).
    checkpoint_bytes: u64,
    checkpoint_held_us: u64,
    checkpoint_written_ms: u64,
}

/// Kills the proxy with SIGKILL and starts it again on the same data,
/// `times` times: the first right away, the others after [`QUIET`].
async fn kill_and_restart(
    times: usize,
    proxy: Proc,
    bin: &Path,
    target: &Target,
) -> Result<Restarted> {
    let mut running = proxy;
    let mut recoveries = Vec::with_capacity(times);
    let mut log_bytes = 0;
    let (mut checkpoint_bytes, mut checkpoint_held_us, mut checkpoint_written_ms) = (0, 0, 0);
    for i in 0..times {
        if i > 0 {
            tokio::time::sleep(QUIET).await;
        }
        let dir = running
            .kill_keeping_dir()
            .ok_or_else(|| anyhow!("the proxy has no directory"))?;
        if i == 0 {
            let filled = dir.path().join("proxy.log");
            let max = |what, key| logged_numbers(&filled, what, key).into_iter().max();
            checkpoint_bytes = max("journal checkpoint written", "bytes").unwrap_or(0);
            checkpoint_written_ms = max("journal checkpoint written", "ms").unwrap_or(0);
            checkpoint_held_us = max("journal checkpoint taken", "held_us").unwrap_or(0);
        }
        log_bytes = dir_bytes(&dir.path().join("data"));
        let log = dir.path().join("proxy-restarted.log");
        let (restarted, total) = restart_proxy(bin, dir, target.addr).await?;
        let last = |key| logged_numbers(&log, "journal recovered", key).pop();
        recoveries.push(Recovery {
            total,
            journal_ms: last("ms").unwrap_or(0),
            checkpoint_read_us: last("checkpoint_us").unwrap_or(0),
            replayed: last("replayed_bytes").unwrap_or(0),
        });
        running = restarted;
    }
    let mid_write = recoveries[0];
    let mut quiet = recoveries.split_off(1);
    quiet.sort_by_key(|r| r.total);
    let quiet = quiet.get(quiet.len() / 2).copied().unwrap_or_default();
    // Then as a rollout restarts it: a graceful stop takes a last
    // checkpoint, and the start after it replays nothing.
    let dir = running.stop_keeping_dir(Duration::from_secs(60)).await?;
    let log = dir.path().join("proxy-restarted.log");
    let (running, after_stop) = restart_proxy(bin, dir, target.addr).await?;
    let after_stop_journal_ms = logged_numbers(&log, "journal recovered", "ms").pop();
    Ok(Restarted {
        running,
        mid_write,
        quiet,
        after_stop,
        after_stop_journal_ms: after_stop_journal_ms.unwrap_or(0),
        log_bytes,
        checkpoint_bytes,
        checkpoint_held_us,
        checkpoint_written_ms,
    })
}

/// Connections the fill uses.
const FILL_CONCURRENCY: usize = 32;

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let (_upstream, up_addr) = start_upstream(o.upstream).await?;
    let mut out = String::new();
    let mut summary = String::new();
    for &retained in &o.retained {
        let (proxy, target) = start_proxy(bin, up_addr, "batch").await?;
        let filled = Instant::now();
        fill(&target, retained, o.fill_progress).await?;
        let fill_secs = filled.elapsed().as_secs_f64();
        // The restarts come before the load: its calls are retained too,
        // and would otherwise be most of what recovery reads at small counts.
        let logged = Logged::call(&target, o.replay_entries).await?;
        let replay_before = replay_rate(&logged, &target, o.rounds).await?;
        let rss_before = rss_kib(proxy.pid())?;
        let Restarted {
            running,
            mid_write,
            quiet,
            after_stop,
            after_stop_journal_ms,
            log_bytes,
            checkpoint_bytes,
            checkpoint_held_us,
            checkpoint_written_ms,
        } = kill_and_restart(o.rounds.max(1) + 1, proxy, bin, &target).await?;
        let rss_after = rss_kib(running.pid())?;
        let replay_after = replay_rate(&logged, &target, o.rounds).await?;
        let targets = [Target::direct(up_addr), target.clone()];
        for &c in &o.concurrency {
            let rows = measure(&targets, c, o).await?;
            let title = format!("scale, {retained} retained streams, after a restart");
            write_table(&mut out, &title, c, o, &rows)?;
        }
        let mib = |bytes: u64| bytes as f64 / 1_048_576.0;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let kill = |r: Recovery| {
            format!(
                "{:.1} ({}; {:.1}; {:.1})",
                ms(r.total),
                r.journal_ms,
                r.checkpoint_read_us as f64 / 1000.0,
                mib(r.replayed)
            )
        };
        writeln!(
            summary,
            "{retained:>9} {fill_secs:>7.1} {:>8.1} {rss_before:>15} {rss_after:>14} {:>27} {:>27} {:>17.1} {after_stop_journal_ms:>13} {:>15.1} {:>12.1} {checkpoint_written_ms:>11} {replay_before:>13.0} {replay_after:>14.0}",
            mib(log_bytes),
            kill(mid_write),
            kill(quiet),
            ms(after_stop),
            mib(checkpoint_bytes),
            checkpoint_held_us as f64 / 1000.0,
        )?;
    }
    writeln!(
        out,
        "## scale: the log, memory and recovery per retained count"
    )?;
    writeln!(
        out,
        "recovery after SIGKILL: spawn to /healthz ms (the journal's ms; of it reading the checkpoint; MiB of log replayed)"
    )?;
    writeln!(
        out,
        "retained  fill s  log MiB  RSS KiB before  RSS KiB after  SIGKILL mid-write recovery  SIGKILL when quiet recovery  after SIGTERM ms  its journal ms  checkpoint MiB  its lock ms  written ms  replay msg/s  after restart"
    )?;
    out.push_str(&summary);
    writeln!(out)?;
    Ok(out)
}

/// The median replay rate of `logged` over `rounds` replays, in messages
/// a second.
async fn replay_rate(logged: &Logged, target: &Target, rounds: usize) -> Result<f64> {
    let mut rates = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        let (_, total) = logged.replay(target).await?;
        rates.push(logged.messages as f64 / total.as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates[rates.len() / 2])
}

/// Makes `n` calls through `target` on [`FILL_CONCURRENCY`] connections;
/// each leaves a finished stream the proxy retains, of `progress`
/// notifications and the result.
async fn fill(target: &Target, n: usize, progress: u32) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let args: Arc<str> = if progress == 0 {
        "{}".into()
    } else {
        format!("{{\"progress\":{progress}}}").into()
    };
    let mut conns = connect_many(target.addr, FILL_CONCURRENCY).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for mut conn in conns.drain(..) {
        let (t, next, args) = (target.clone(), next.clone(), args.clone());
        tasks.push(tokio::spawn(async move {
            let session = open_session(&mut conn, &t).await?;
            let mut id = 1;
            while next.fetch_add(1, Ordering::Relaxed) < n {
                call(&mut conn, &t, &session, id, &args).await?;
                id += 1;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}
