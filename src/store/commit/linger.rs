//! How long the syncer waits for company before a flush.
//!
//! Under load the syncer *lingers* before a flush: when writers have been
//! arriving more often than once per two flushes (both smoothed), it waits
//! up to one flush's time (at most [`MAX_LINGER`]) for more of them, so a
//! flush covers more calls; when they crowd in, several per flush's time,
//! it waits up to [`CROWDED_LINGER`]. Either wait ends early once no writer
//! came between two looks [`QUIET`] apart: then everyone a flush could
//! gather is already waiting on it. A lone writer never waits: one call at
//! a time arrives far more slowly than that.
//!
//! This file owns only the arithmetic of that wait (what it reads: the
//! smoothed gap between writers and the smoothed flush time); the queue
//! and the syncer that act on it are the module's.

use std::time::{Duration, Instant};

/// The longest a flush waits for more writers when they come a few per
/// flush.
pub const MAX_LINGER: Duration = Duration::from_micros(400);

/// Writers per flush's time from which the log counts as crowded.
const CROWD: u32 = 4;

/// The longest a flush waits for more writers when the log is crowded (a
/// thousand streams relaying progress, 32 clients calling at once). Each
/// flush rewrites the tail page of the segment and costs an `fdatasync`
/// whatever it covers, so under a crowd fewer, fuller flushes win: in the
/// `streaming` bench, 800 µs instead of one flush's time took a third less
/// disk and a fifth less CPU per message, and `small` at c=32 lost no p50
/// (BENCHMARKS.md, session 11). Longer (1.5 ms) began to cost c=32 latency.
pub const CROWDED_LINGER: Duration = Duration::from_micros(800);

/// How far apart a lingering syncer looks whether writers still come; it
/// stops at the first look that finds none came since the last (so after
/// one to two of these without a writer). Writers that
/// wait for their answer before writing again (32 clients, each calling
/// once its last call is answered) are then all parked on the coming
/// flush, and lingering on only leaves the cores idle: in `small` at c=32
/// a fixed 800 µs linger cost a fifth of the throughput (BENCHMARKS.md,
/// session 13). A crowd that keeps writing (a thousand streams relaying
/// progress) is never quiet this long and still gets the whole linger.
pub const QUIET: Duration = Duration::from_micros(100);

/// While the syncer lingers: when to look again whether writers still come,
/// and when to stop waiting for them.
pub(super) struct Company {
    until: Instant,
    seen: u64,
}

impl Company {
    pub(super) fn new(now: Instant, linger: Duration, issued: u64) -> Self {
        Self {
            until: now + linger,
            seen: issued,
        }
    }

    /// How long to sleep before looking again, given the tickets issued by
    /// `now`; `None` when the linger is over (time is up, or nobody came
    /// since the last look).
    pub(super) fn next(&mut self, now: Instant, issued: u64) -> Option<Duration> {
        let came = issued != std::mem::replace(&mut self.seen, issued);
        let left = self.until.saturating_duration_since(now);
        (came && !left.is_zero()).then(|| QUIET.min(left))
    }
}

/// An exponentially smoothed duration (weight 1/4 for each new sample).
#[derive(Clone, Copy, Default)]
pub(super) struct Smoothed(pub(super) Option<Duration>);

impl Smoothed {
    pub(super) fn add(&mut self, sample: Duration) {
        self.0 = Some(match self.0 {
            Some(old) => (old * 3 + sample) / 4,
            None => sample,
        });
    }
}

/// The longest the next flush waits for more writers, given the smoothed
/// `gap` between them and the smoothed time a `flush` takes:
/// [`CROWDED_LINGER`] when they have been coming more than [`CROWD`] per
/// flush's time; one flush's time when more often than once per two
/// flushes; else not at all (a writer alone: see [`alone`]).
pub(super) fn linger(gap: Smoothed, flush: Smoothed) -> Duration {
    match (gap.0, flush.0) {
        (Some(gap), Some(flush)) if gap * CROWD < flush => CROWDED_LINGER,
        (Some(gap), Some(flush)) if gap < flush * 2 => flush.min(MAX_LINGER),
        _ => Duration::ZERO,
    }
}

/// Whether writers come as one call at a time does: no wait would bring a
/// flush company.
pub(super) fn alone(gap: Smoothed, flush: Smoothed) -> bool {
    linger(gap, flush).is_zero()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smoothed(d: Duration) -> Smoothed {
        let mut s = Smoothed::default();
        s.add(d);
        s
    }

    fn us(n: u64) -> Smoothed {
        smoothed(Duration::from_micros(n))
    }

    #[test]
    fn writers_coming_faster_than_two_flushes_make_it_linger_up_to_one_flush() {
        assert_eq!(linger(us(50), us(150)), Duration::from_micros(150));
        let slow_disk = linger(us(200), us(700));
        assert_eq!(slow_disk, MAX_LINGER);
    }

    #[test]
    fn a_crowd_of_writers_makes_it_linger_the_crowded_time() {
        assert_eq!(linger(us(20), us(150)), CROWDED_LINGER);
        let slow_disk = linger(us(20), smoothed(Duration::from_millis(5)));
        assert_eq!(slow_disk, CROWDED_LINGER);
    }

    #[test]
    fn a_writer_alone_never_waits_for_company() {
        assert_eq!(linger(us(500), us(150)), Duration::ZERO);
        assert!(alone(us(500), us(150)));
        // Nothing known yet: no wait either.
        assert!(alone(Smoothed::default(), Smoothed::default()));
    }

    #[test]
    fn a_linger_goes_on_while_writers_keep_coming() {
        let start = Instant::now();
        let mut company = Company::new(start, CROWDED_LINGER, 5);
        let looked = start + QUIET;
        assert_eq!(company.next(looked, 9), Some(QUIET));
        assert_eq!(company.next(looked + QUIET, 10), Some(QUIET));
    }

    #[test]
    fn a_linger_ends_once_nobody_came_since_the_last_look() {
        let start = Instant::now();
        let mut company = Company::new(start, CROWDED_LINGER, 5);
        assert_eq!(company.next(start + QUIET, 9), Some(QUIET));
        assert_eq!(company.next(start + QUIET * 2, 9), None);
    }

    #[test]
    fn a_linger_never_outlasts_its_time() {
        let start = Instant::now();
        let linger = QUIET * 3 / 2;
        let mut company = Company::new(start, linger, 0);
        assert_eq!(company.next(start + QUIET, 1), Some(linger - QUIET));
        assert_eq!(company.next(start + linger, 2), None);
    }
}
