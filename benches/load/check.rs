//! The regression guard (`cargo bench --bench load -- --scenario small
//! --check`): the `small` load through this proxy (`batch`) and through the
//! floor proxy in one run, rounds interleaved, and two ratios between them
//! compared with the figures recorded in `benches/load/recorded.toml`. The
//! floor moves with the machine as the proxy does, so the ratio holds across
//! machine states where absolute req/s would not; a ratio more than the
//! recorded tolerance under its figure fails the run (non-zero exit).
//!
//! A benchmark, not a test: it takes about a minute and a half of load and is
//! run by hand before a stop that touches the hot path, never by `cargo test`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, bail, Context as _, Result};
use serde::Deserialize;

use crate::procs::{start_floor, start_stand};
use crate::small::{self, Row};
use crate::Opts;

/// Relative to the crate root.
const RECORDED: &str = "benches/load/recorded.toml";

#[derive(Deserialize)]
struct Recorded {
    small: Figures,
}

/// The ratios, each "higher is better", so one rule judges both.
#[derive(Deserialize)]
struct Figures {
    /// Concurrency 32: proxy req/s over floor req/s.
    c32_rps_vs_floor: f64,
    /// Concurrency 1: floor p50 over proxy p50.
    c1_p50_floor_over_proxy: f64,
    /// A ratio lower than `figure × (1 − tolerance)` fails.
    tolerance: f64,
}

fn recorded() -> Result<Figures> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORDED);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {RECORDED}"))?;
    let recorded: Recorded =
        toml::from_str(&text).with_context(|| format!("parsing {RECORDED}"))?;
    Ok(recorded.small)
}

fn row<'a>(rows: &'a [Row], name: &str) -> Result<&'a Row> {
    rows.iter()
        .find(|r| r.name == name)
        .ok_or_else(|| anyhow!("no {name} row"))
}

/// One verdict line; whether the ratio held.
fn judge(out: &mut String, what: &str, measured: f64, figure: f64, tolerance: f64) -> Result<bool> {
    let least = figure * (1.0 - tolerance);
    let held = measured >= least;
    writeln!(
        out,
        "{what:<34} measured {measured:.3}  recorded {figure:.3}  least {least:.3}  ({:+.0} %)  {}",
        (measured / figure - 1.0) * 100.0,
        if held { "ok" } else { "REGRESSION" }
    )?;
    Ok(held)
}

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    // Read first: a broken file fails before a minute of load, not after.
    let figures = recorded()?;
    let mut stand = start_stand(bin, &["batch".to_owned()], o.upstream).await?;
    let (floor, target) = start_floor(stand.targets[0].addr).await?;
    stand.targets.insert(1, target);
    stand.proxies.push(floor);
    let mut out = String::new();
    let c1 = small::measure(&stand.targets, 1, o).await?;
    small::write_table(&mut out, "check", 1, o, &c1)?;
    let c32 = small::measure(&stand.targets, 32, o).await?;
    small::write_table(&mut out, "check", 32, o, &c32)?;
    let (proxy, floor) = ("proxy batch", "floor");
    let rps = row(&c32, proxy)?.rps / row(&c32, floor)?.rps;
    let p50 = row(&c1, floor)?.p50 / row(&c1, proxy)?.p50;
    writeln!(
        out,
        "## check against {RECORDED} (tolerance {:.0} %)",
        figures.tolerance * 100.0
    )?;
    let tol = figures.tolerance;
    let rps_held = judge(
        &mut out,
        "c=32 req/s, proxy / floor",
        rps,
        figures.c32_rps_vs_floor,
        tol,
    )?;
    let p50_held = judge(
        &mut out,
        "c=1 p50, floor / proxy",
        p50,
        figures.c1_p50_floor_over_proxy,
        tol,
    )?;
    if !(rps_held && p50_held) {
        // The tables and verdicts are what a reader needs to see why.
        print!("{out}");
        bail!(
            "the proxy fell more than {:.0} % under a recorded ratio",
            tol * 100.0
        );
    }
    writeln!(out, "check passed")?;
    Ok(out)
}
