//! The `dialects` scenario: what a client that negotiates every dialect
//! (`resumableRequests`, `streams`, `resumeTokens`) and the 2025-11-25
//! tasks pays per call, against a client that negotiates nothing, through
//! the same proxy process in the same run (rounds interleaved) — issue 19
//! budgets it at 10 %. A third client makes every call a task (`tools/call`
//! with `params.task`, then `tasks/result`): two requests and a durable
//! task record per call, reported beside the budget, not held to it.
//!
//! The proxy serves the 2025-11-25 tasks (`[upstream.tasks] legacy = true`)
//! for all three clients, so the rows differ only in what the client asks.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::client::{Speaks, Target};
use crate::procs::{start_proxy_with, start_upstream};
use crate::small::{measure, write_table, Row};
use crate::Opts;

/// The least a negotiating client may reach of a plain one's throughput.
const BUDGET: f64 = 0.90;

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let sync = o.sync_modes(&["batch"]);
    let (_upstream, up_addr) = start_upstream(o.upstream).await?;
    let tasks = "[upstream.tasks]\nlegacy = true\n";
    let (_proxy, proxy) = start_proxy_with(bin, up_addr, &sync[0], tasks).await?;
    let targets = [
        Target::direct(up_addr),
        proxy.clone().speaking("proxy plain", Speaks::Plain),
        proxy.clone().speaking("proxy dialects", Speaks::Dialects),
        proxy.speaking("proxy tasks", Speaks::Tasks),
    ];
    let mut out = String::new();
    for &c in &o.concurrency {
        let rows = measure(&targets, c, o).await?;
        write_table(&mut out, "dialects", c, o, &rows)?;
        verdict(&mut out, &rows)?;
    }
    Ok(out)
}

/// Each negotiating row against the plain one: throughput ratio and added
/// p50, and whether the dialects stay within the budget.
fn verdict(out: &mut String, rows: &[Row]) -> std::fmt::Result {
    let plain = &rows[1];
    for row in &rows[2..] {
        let ratio = row.rps / plain.rps;
        write!(
            out,
            "{}: {ratio:.2}x plain req/s, {:+.1} us p50",
            row.name,
            row.p50 - plain.p50
        )?;
        if row.name == "proxy dialects" {
            let within = if ratio >= BUDGET { "within" } else { "OVER" };
            write!(out, " (budget >= {BUDGET:.2}x: {within})")?;
        }
        writeln!(out)?;
    }
    writeln!(out)
}
