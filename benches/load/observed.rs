//! The `observed` scenario (issue 38): what seeing every call costs a plain
//! call, in one run — the same fast upstream and floor, rounds interleaved,
//! three proxies that differ only in what they record of each request:
//!
//! - `proxy quiet`: `access_log = false`, no tracing (the request metrics
//!   are always kept: they cannot be turned off, so they are in every row);
//! - `proxy logged`: the default, an access line per request;
//! - `proxy traced`: the access line and OpenTelemetry traces, a server span
//!   and a client span per call, exported over OTLP/HTTP to a collector
//!   that keeps nothing ([`crate::otlp_sink`]), on this process's runtime.
//!
//! Besides throughput and latency it prints each proxy's CPU per call, the
//! figure the noise of a shared machine moves least, and, when the proxies
//! run with `benches/support/count_allocs.c` preloaded (see there), their
//! heap allocations per call: a count, which does not drift at all.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::{bail, Result};

use crate::client::Target;
use crate::otlp_sink::OtlpSink;
use crate::procs::{cpu_of, start_floor, start_proxy_keyed, start_upstream, Proc};
use crate::small::{measure, write_table, Row};
use crate::Opts;

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let sync = o.sync_modes(&["batch"]);
    let sink = OtlpSink::start().await?;
    let (_upstream, up_addr) = start_upstream(o.upstream).await?;
    let (_floor, floor) = start_floor(up_addr).await?;
    let quiet = "access_log = false\n";
    let (_quiet, quiet) = observed_proxy(bin, up_addr, &sync[0], "quiet", quiet, "").await?;
    let (_logged, logged) = observed_proxy(bin, up_addr, &sync[0], "logged", "", "").await?;
    let tracing = format!(
        "\n[tracing]\notlp_endpoint = \"{}\"\nexport_delay_ms = 1000\n",
        sink.endpoint()
    );
    let (_traced, traced) = observed_proxy(bin, up_addr, &sync[0], "traced", "", &tracing).await?;
    let targets = [Target::direct(up_addr), floor, quiet, logged, traced];
    let mut out = String::new();
    for &c in &o.concurrency {
        let (before, allocs_before) = (cpu_of(&targets)?, allocations(&targets));
        let rows = measure(&targets, c, o).await?;
        let (after, allocs_after) = (cpu_of(&targets)?, allocations(&targets));
        write_table(&mut out, "observed", c, o, &rows)?;
        verdict(&mut out, &rows, &before, &after)?;
        for ((row, a), b) in rows.iter().zip(&allocs_after).zip(&allocs_before).skip(2) {
            if let (Some(a), Some(b)) = (a, b) {
                let per_call = (a - b) as f64 / row.calls.max(1) as f64;
                writeln!(out, "{}: {per_call:.1} allocations per call", row.name)?;
            }
        }
    }
    let exports = sink.received.exports.load(Ordering::Relaxed);
    if exports == 0 {
        bail!("the traced proxy exported nothing to its collector");
    }
    writeln!(
        out,
        "collector: {exports} exports, {:.1} MiB received\n",
        sink.received.bytes.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
    )?;
    Ok(out)
}

/// A proxy in front of `upstream` named `proxy {name}`, with `keys` among
/// its top-level keys and `tables` after its `[[upstream]]`.
async fn observed_proxy(
    bin: &Path,
    upstream: SocketAddr,
    sync: &str,
    name: &str,
    keys: &str,
    tables: &str,
) -> Result<(Proc, Target)> {
    let (p, mut t) = start_proxy_keyed(bin, upstream, sync, keys, tables).await?;
    t.name = format!("proxy {name}");
    Ok((p, t))
}

/// Each target's heap allocations so far, as `count_allocs.c` last wrote
/// them (`None` without it).
fn allocations(targets: &[Target]) -> Vec<Option<u64>> {
    targets
        .iter()
        .map(|t| {
            let text = std::fs::read_to_string(format!("/tmp/count_allocs.{}", t.pid?)).ok()?;
            text.lines().last()?.split_whitespace().nth(1)?.parse().ok()
        })
        .collect()
}

/// Each proxy against the quiet one: throughput, p50 and CPU per call.
fn verdict(out: &mut String, rows: &[Row], before: &[f64], after: &[f64]) -> Result<()> {
    let per_call = |i: usize| (after[i] - before[i]) * 1e6 / rows[i].calls.max(1) as f64;
    let quiet = &rows[2];
    for (i, row) in rows.iter().enumerate().skip(2) {
        writeln!(
            out,
            "{}: {:.3}x quiet req/s, {:+.1} us p50 over quiet, {:.1} us CPU per call ({:+.1} %)",
            row.name,
            row.rps / quiet.rps,
            row.p50 - quiet.p50,
            per_call(i),
            (per_call(i) / per_call(2) - 1.0) * 100.0,
        )?;
    }
    writeln!(out)?;
    Ok(())
}
