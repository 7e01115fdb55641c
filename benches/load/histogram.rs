//! The latency histogram the `small` scenario (and through it `peers`)
//! records every call into: fixed buckets, so per-task histograms merge by
//! adding counts and quantiles need no sorting of millions of samples.

use std::time::Duration;

/// A log-linear latency histogram in nanoseconds, HDR style: exact below 128,
/// then 64 sub-buckets per power of two (under 1.6 % relative error).
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    pub total: u64,
}

impl Histogram {
    const SUB: u32 = 64;

    pub fn new() -> Self {
        Self {
            counts: vec![0; 128 + 58 * Self::SUB as usize],
            total: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < 128 {
            return v as usize;
        }
        let shift = 63 - v.leading_zeros() - 6; // v >> shift is in 64..128
        128 + ((shift - 1) * Self::SUB) as usize + ((v >> shift) - 64) as usize
    }

    fn value(i: usize) -> u64 {
        if i < 128 {
            return i as u64;
        }
        let shift = ((i - 128) / Self::SUB as usize) as u32 + 1;
        let m = ((i - 128) % Self::SUB as usize) as u64 + 64;
        // The middle of the bucket.
        (m << shift) + (1 << (shift - 1))
    }

    pub fn record(&mut self, d: Duration) {
        let last = self.counts.len() - 1;
        let i = Self::index(d.as_nanos().min(u64::MAX as u128) as u64);
        self.counts[i.min(last)] += 1;
        self.total += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    /// The value at quantile `q` (0..=1), in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.total == 0 {
            return f64::NAN;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i) as f64 / 1000.0;
            }
        }
        f64::NAN
    }
}
