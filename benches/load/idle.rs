//! The `idle` scenario: thousands of long calls whose SSE answers stay open
//! and silent — the memory and file descriptors each held stream costs the
//! proxy, against what the same streams cost the upstream reached directly
//! and the floor (a plain hyper forwarder: what any hyper proxy holds).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use http::{Method, StatusCode};
use tokio::sync::Semaphore;

use crate::client::{
    call_body, connect, open_sessions, request, send, Target, CONNECT_PARALLELISM,
};
use crate::procs::{nofile_limit, open_fds, rss_kib, start_floor, start_proxy, start_upstream};
use crate::Opts;

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
async fn run_once(t: &Target, pid: u32, streams: usize, o: &Opts) -> Result<IdleRun> {
    let mut conn = connect(t.addr).await?;
    let sessions = open_sessions(&mut conn, t, streams).await?;
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
        let session = sessions[i % sessions.len()].clone();
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

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    // Each idle stream costs the proxy two sockets (client and upstream), and
    // the hard fd limit cannot be raised without CAP_SYS_RESOURCE.
    let limit = nofile_limit();
    let cap = (limit.saturating_sub(512) / 2) as usize;
    let streams = o.idle_streams.min(cap);
    let (up, up_addr) = start_upstream(o.upstream).await?;
    let direct = Target::direct(up_addr);
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
    let run = run_once(&direct, up.pid(), streams, o).await?;
    lines.push(("upstream (direct)".to_owned(), run));
    // Fresh processes for each proxied run, so the upstream's memory from
    // the run before does not matter and each proxy starts clean. The floor
    // (a plain hyper forwarder) shows what any hyper proxy holds per stream.
    drop(up);
    let (up, up_addr) = start_upstream(o.upstream).await?;
    let (floor, floored) = start_floor(up_addr).await?;
    let run = run_once(&floored, floor.pid(), streams, o).await?;
    lines.push(("floor (hyper forwarder)".to_owned(), run));
    drop((floor, up));
    let (up, up_addr) = start_upstream(o.upstream).await?;
    let (proxy, proxied) = start_proxy(bin, up_addr, "batch").await?;
    let run = run_once(&proxied, proxy.pid(), streams, o).await?;
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
