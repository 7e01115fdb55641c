//! The `streaming` scenario: many concurrent calls, each answered over SSE
//! with progress notifications and a result — the proxy's cost per logged
//! message (entries per second, CPU and disk bytes per message) when every
//! message goes through its durable log, per `[store] sync` mode, against the
//! upstream reached directly.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::client::{call, connect, connect_many, open_sessions, Target};
use crate::procs::{cpu_seconds, device_written_bytes, disk_write_bytes, start_stand};
use crate::{per_round_and_median, Opts};

struct StreamRun {
    messages: u64,
    secs: f64,
    target_cpu: Option<f64>,
    target_disk: Option<u64>,
    /// What the device holding the log took meanwhile (every process).
    device: Option<u64>,
    upstream_cpu: f64,
}

/// `calls` concurrent calls, each answered with `progress` notifications and
/// a result, spread over sessions of 100 calls; counts every message that
/// reaches the client and the CPU the proxy and the upstream spent on them.
async fn run_once(t: &Target, upstream_pid: u32, o: &Opts) -> Result<StreamRun> {
    let mut conn = connect(t.addr).await?;
    let sessions = open_sessions(&mut conn, t, o.streaming_calls).await?;
    let conns = connect_many(t.addr, o.streaming_calls).await?;
    let args = format!("{{\"delay_ms\":5,\"progress\":{}}}", o.progress);
    let cpu0 = t.pid.map(cpu_seconds).transpose()?;
    let disk0 = t.pid.map(disk_write_bytes).transpose()?;
    let device0 = t.pid.and_then(|_| settled_device_bytes());
    let up0 = cpu_seconds(upstream_pid)?;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(conns.len());
    for (i, mut conn) in conns.into_iter().enumerate() {
        let t = t.clone();
        let session = sessions[i % sessions.len()].clone();
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
    let device = device0.and_then(|d0| Some(settled_device_bytes()? - d0));
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
        device,
        upstream_cpu: cpu_seconds(upstream_pid)? - up0,
    })
}

/// The bytes written so far to the device the proxies' logs are on (the
/// harness puts their data directories in the temporary directory), once
/// everything dirty has been written out: a run is charged for its own
/// writeback, not for the one before it.
fn settled_device_bytes() -> Option<u64> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    device_written_bytes(&std::env::temp_dir())
}

/// Bytes per message over the runs, or `-` when a run could not count them.
fn bytes_per_message(runs: impl Iterator<Item = Option<u64>>, msgs: u64) -> String {
    runs.sum::<Option<u64>>()
        .map_or("-".to_owned(), |d| format!("{:.0}", d as f64 / msgs as f64))
}

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let stand = start_stand(bin, &o.sync_modes(&["batch", "never"]), o.upstream).await?;
    let targets = &stand.targets;
    let mut runs: Vec<Vec<StreamRun>> = targets.iter().map(|_| Vec::new()).collect();
    for _ in 0..o.rounds {
        for (i, t) in targets.iter().enumerate() {
            runs[i].push(run_once(t, stand.upstream.pid(), o).await?);
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
        "{:<16} {:>10} {:>26} {:>10} {:>8} {:>16} {:>16} {:>15} {:>16}",
        "target",
        "messages",
        "messages/s per round",
        "median",
        "x direct",
        "proxy CPU us/msg",
        "upstr CPU us/msg",
        "proxy disk B/msg",
        "device B/msg"
    )?;
    let mut base = None;
    for (t, rs) in targets.iter().zip(&runs) {
        let (per_round, median) =
            per_round_and_median(rs.iter().map(|r| r.messages as f64 / r.secs).collect());
        let base = *base.get_or_insert(median);
        let msgs: u64 = rs.iter().map(|r| r.messages).sum();
        let proxy_cpu = rs
            .iter()
            .map(|r| r.target_cpu)
            .sum::<Option<f64>>()
            .map_or("-".to_owned(), |c| format!("{:.2}", c * 1e6 / msgs as f64));
        let up_cpu: f64 = rs.iter().map(|r| r.upstream_cpu).sum();
        let disk = bytes_per_message(rs.iter().map(|r| r.target_disk), msgs);
        let device = bytes_per_message(rs.iter().map(|r| r.device), msgs);
        writeln!(
            out,
            "{:<16} {:>10} {:>26} {:>10.0} {:>7.2}x {:>16} {:>16.2} {:>15} {:>16}",
            t.name,
            rs[0].messages,
            per_round,
            median,
            median / base,
            proxy_cpu,
            up_cpu * 1e6 / msgs as f64,
            disk,
            device
        )?;
    }
    writeln!(
        out,
        "(CPU = utime+stime from /proc/<pid>/stat, disk = write_bytes from /proc/<pid>/io (pages as \
         the proxy dirtied them), device = sectors written to the disk under the temporary \
         directory by every process, after sync(2); over the runs; CPU ticks are 10 ms: coarse at \
         smoke sizes)"
    )?;
    Ok(out)
}
