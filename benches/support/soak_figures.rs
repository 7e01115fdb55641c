//! The soak's figures (issue 36), shared by the load harness's `soak`
//! scenario (`benches/load/soak.rs`) and the long test (`tests/soak.rs`), so
//! that both print the same table and judge by the same bounds: a sample of
//! the proxy at each segment's end (calls so far, RSS, what its store holds),
//! one markdown row per segment, and a summary whose growth is the least
//! squares slope of RSS over calls from segment 2 on — segment 1 holds the
//! start-up (runtime, buffers, allocator arenas), which is no growth per call.
//! Each row also has the proxy's CPU time per call and the machine's idle
//! time: on a machine that other work shares, throughput falls with that work
//! too, CPU per call much less; and a proxy whose throughput falls while the
//! machine has cores idle is waiting (on its disk, a lock), not starved.
//!
//! Included with `#[path]` by both, rather than a module of the library: the
//! library ships, its measuring aids need not. It uses only std and libc.

use std::fmt::Write as _;
use std::path::Path;

/// Growth past this fails a checked soak: the target itself, a retained
/// stream of at most 256 bytes (24.4 MiB per 100k calls), with a little room
/// for the allocator; issue 36 found 5–7 times as much.
pub const MAX_GROWTH_MIB_PER_100K: f64 = 25.0;
/// The last segment's throughput under this share of the first's fails.
pub const MIN_THROUGHPUT_RATIO: f64 = 0.9;

/// The proxy at one instant of the soak: `samples[0]` is the start (sessions
/// open, no call yet), `samples[i]` the end of segment `i`.
pub struct Sample {
    pub calls: u64,
    pub errors: u64,
    /// Seconds since the load started.
    pub secs: f64,
    pub rss_kib: u64,
    /// The proxy's CPU time so far (user + system), in seconds.
    pub cpu_secs: f64,
    /// The data directory's size, or Redis' `used_memory`.
    pub store_bytes: u64,
    /// The 1-minute load average: other work on the machine shows here.
    pub load1: f64,
    /// The machine's CPU time so far, from `/proc/stat`, in ticks.
    pub machine: Ticks,
}

/// All CPUs' time from `/proc/stat`: in total, idle, and waiting on I/O.
#[derive(Clone, Copy, Default)]
pub struct Ticks {
    total: u64,
    idle: u64,
    iowait: u64,
}

impl Ticks {
    fn now() -> Ticks {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        // `cpu  user nice system idle iowait irq softirq steal …`
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|f| f.parse().ok())
            .collect();
        match fields[..] {
            [_, _, _, idle, iowait, ..] => Ticks {
                total: fields.iter().sum(),
                idle,
                iowait,
            },
            _ => Ticks::default(),
        }
    }
}

impl Sample {
    /// Reads the proxy `pid`'s RSS and the load average; the rest is the
    /// caller's.
    pub fn take(pid: u32, calls: u64, errors: u64, secs: f64, store_bytes: u64) -> Sample {
        Sample {
            calls,
            errors,
            secs,
            rss_kib: vm_rss_kib(pid).unwrap_or(0),
            cpu_secs: cpu_secs(pid).unwrap_or(0.0),
            store_bytes,
            load1: load1(),
            machine: Ticks::now(),
        }
    }
}

/// `VmRSS` of `/proc/<pid>/status`, in KiB.
fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// utime + stime of `/proc/<pid>/stat`, in seconds.
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) start at
    // `state`; utime and stime are the 12th and 13th of them.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((utime + stime) as f64 / hz)
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Bytes of the files under `dir`, recursively.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

const MIB: f64 = 1_048_576.0;

/// The table's head; `store` names what the store column measures ("data
/// dir").
pub fn header(store: &str) -> String {
    format!(
        "| segment | calls | req/s | proxy CPU µs/call | proxy RSS MiB | {store} MiB | errors | idle % (iowait) | load 1m |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
}

/// Segment `n`'s row, from the samples at its start and its end.
pub fn row(n: usize, start: &Sample, end: &Sample) -> String {
    format!(
        "| {n} | {} | {:.0} | {:.1} | {:.0} | {:.1} | {} | {} | {:.2} |",
        end.calls,
        rate(start, end),
        cpu_us_per_call(start, end),
        end.rss_kib as f64 / 1024.0,
        end.store_bytes as f64 / MIB,
        end.errors,
        idle(start, end),
        end.load1,
    )
}

/// The machine's idle share between two samples, iowait included and also
/// apart: "37 (4)".
fn idle(start: &Sample, end: &Sample) -> String {
    let (a, b) = (start.machine, end.machine);
    let total = b.total.saturating_sub(a.total).max(1) as f64;
    let idle = (b.idle + b.iowait).saturating_sub(a.idle + a.iowait) as f64;
    let iowait = b.iowait.saturating_sub(a.iowait) as f64;
    format!(
        "{:.0} ({:.0})",
        idle * 100.0 / total,
        iowait * 100.0 / total
    )
}

/// The row of the start (`samples[0]`): no rate yet.
pub fn start_row(s: &Sample) -> String {
    format!(
        "| start | 0 | | | {:.0} | {:.1} | 0 | | {:.2} |",
        s.rss_kib as f64 / 1024.0,
        s.store_bytes as f64 / MIB,
        s.load1
    )
}

/// Calls a second between two samples.
fn rate(start: &Sample, end: &Sample) -> f64 {
    (end.calls - start.calls) as f64 / (end.secs - start.secs).max(1e-9)
}

/// The proxy's CPU time per call between two samples, in µs.
fn cpu_us_per_call(start: &Sample, end: &Sample) -> f64 {
    (end.cpu_secs - start.cpu_secs) * 1e6 / (end.calls - start.calls).max(1) as f64
}

/// What a soak comes to.
pub struct Summary {
    /// RSS growth per call in bytes (least squares, segments 2..n); `None`
    /// with fewer than two such segments.
    pub rss_bytes_per_call: Option<f64>,
    /// The store's growth per call in bytes, the same way.
    pub store_bytes_per_call: Option<f64>,
    /// Requests a second in the first and the last segment.
    pub first_rate: f64,
    pub last_rate: f64,
    /// The proxy's CPU µs per call in the first and the last segment.
    pub first_cpu: f64,
    pub last_cpu: f64,
    pub errors: u64,
}

impl Summary {
    /// `samples` as described at [`Sample`]: the start, then each segment's
    /// end (at least one).
    pub fn of(samples: &[Sample]) -> Summary {
        let last = samples.len() - 1;
        let segment = |i: usize| (&samples[i - 1], &samples[i]);
        let ((a, b), (y, z)) = (segment(1), segment(last));
        // From segment 2's end on: segment 1 is start-up.
        let steady = samples.get(2..).unwrap_or_default();
        let slope_of = |y: fn(&Sample) -> f64| {
            let points: Vec<(f64, f64)> = steady.iter().map(|s| (s.calls as f64, y(s))).collect();
            slope(&points)
        };
        Summary {
            rss_bytes_per_call: slope_of(|s| s.rss_kib as f64 * 1024.0),
            store_bytes_per_call: slope_of(|s| s.store_bytes as f64),
            first_rate: rate(a, b),
            last_rate: rate(y, z),
            first_cpu: cpu_us_per_call(a, b),
            last_cpu: cpu_us_per_call(y, z),
            errors: samples[last].errors,
        }
    }

    pub fn growth_mib_per_100k(&self) -> Option<f64> {
        self.rss_bytes_per_call.map(|b| b * 100_000.0 / MIB)
    }

    pub fn throughput_ratio(&self) -> f64 {
        self.last_rate / self.first_rate.max(1e-9)
    }

    /// The summary lines under the table; `store` names what the store
    /// column measures.
    pub fn lines(&self, store: &str) -> String {
        let mut out = String::new();
        let na = || "n/a (fewer than 3 segments)".to_owned();
        let growth = match (self.growth_mib_per_100k(), self.rss_bytes_per_call) {
            (Some(g), Some(b)) => format!("{g:+.1} MiB per 100k calls ({b:+.0} bytes per call)"),
            _ => na(),
        };
        let store_growth = self
            .store_bytes_per_call
            .map_or_else(na, |b| format!("{b:+.0} bytes per call"));
        let _ = writeln!(
            out,
            "- RSS growth, least squares over segments 2..n: {growth}"
        );
        let _ = writeln!(out, "- {store} growth, the same way: {store_growth}");
        let _ = writeln!(
            out,
            "- throughput, last / first segment: {:.3} ({:.0} -> {:.0} req/s)",
            self.throughput_ratio(),
            self.first_rate,
            self.last_rate
        );
        let _ = writeln!(
            out,
            "- proxy CPU per call, last / first segment: {:.3} ({:.1} -> {:.1} µs)",
            self.last_cpu / self.first_cpu.max(1e-9),
            self.first_cpu,
            self.last_cpu
        );
        let _ = writeln!(out, "- failed calls: {}", self.errors);
        out
    }

    /// Why a checked soak fails; empty when it passes.
    pub fn failures(&self) -> Vec<String> {
        let mut why = Vec::new();
        match self.growth_mib_per_100k() {
            Some(g) if g > MAX_GROWTH_MIB_PER_100K => why.push(format!(
                "RSS grew {g:.1} MiB per 100k calls (bound {MAX_GROWTH_MIB_PER_100K})"
            )),
            Some(_) => {}
            None => why.push("growth needs at least 3 segments".to_owned()),
        }
        let ratio = self.throughput_ratio();
        if ratio < MIN_THROUGHPUT_RATIO {
            why.push(format!(
                "the last segment ran at {ratio:.3} of the first's throughput (least {MIN_THROUGHPUT_RATIO})"
            ));
        }
        if self.errors > 0 {
            why.push(format!("{} calls failed", self.errors));
        }
        why
    }
}

/// The least squares slope of `points` (x, y); `None` under two points or
/// when every x is the same.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}
