//! The live feed's shards: which shard a stream's feed lines go to, and
//! which shards this instance reads, from where.
//!
//! A stream's changes (appends, status, coalescing, deletes) go to one of
//! [`SHARDS`] feeds, `P:feed:<n>`, chosen by its id; reader claims and
//! session changes, rare next to them, stay on `P:feed`, which every
//! instance reads. An instance reads a shard only while it has a reader
//! there of a stream another instance writes: its own calls' changes reach
//! its readers from its own writes. So an instance that serves only its own
//! calls reads no shard at all, and one following a few streams written
//! elsewhere reads about that many shards' worth of the fleet's writes.
//!
//! This owns the cursors only: the listener (`follow.rs`) reads from them
//! and moves them, and [`RedisStore::follow_shard`] starts a cold one. It
//! must not read or apply feed lines itself.
//!
//! Starting a shard must lose no line a tail needs. Its cursor is the
//! shard's newest id read *before* the tail's stream is read again, so
//! every change after that read has a later id and is read from the
//! shard, and every change before it is in what the tail read. A shard is
//! let go only once no tail has wanted it for a whole resync period of the
//! listener's, so a tail being made as the listener prunes never finds its
//! shard dropped under it.

use std::sync::Mutex;
use std::time::Instant;

use super::{backend, RedisStore};
use crate::id::StreamId;
use crate::store::{ClaimOrder, Result};

/// How many changes the feed keeps (approximately). A listener further
/// behind than that re-reads its streams' metadata instead (see
/// `follow.rs`).
pub(super) const FEED_LENGTH: u32 = 100_000;

/// How many feeds a deployment's stream changes are spread over. Every
/// instance of a deployment must agree on it: it is part of the key layout.
pub(super) const SHARDS: usize = 16;

/// How many lines each shard keeps (approximately): together, as many as
/// the one feed kept before, so a listener may fall as far behind in time.
pub(super) const SHARD_LENGTH: u32 = FEED_LENGTH / SHARDS as u32;

/// How long a wake line is kept for a listener that is not reading: an
/// instance killed without a goodbye leaves its wake key behind this long.
const WAKE_TTL_MS: u64 = 3_600_000;

/// The shard `stream`'s changes go to.
pub(super) fn shard_of(stream: StreamId) -> usize {
    // Stream ids are random: any byte spreads them evenly.
    stream.as_bytes()[15] as usize % SHARDS
}

/// Where this instance reads each shard from.
#[derive(Default)]
pub(super) struct Cursors {
    table: Mutex<[Shard; SHARDS]>,
}

#[derive(Clone, Copy, Default)]
struct Shard {
    /// The id of the last line read (or the newest before reading began);
    /// `None` while the shard is not read.
    after: Option<ClaimOrder>,
    /// When a tail last asked for it: a shard is kept a while after.
    wanted: Option<Instant>,
}

impl Cursors {
    fn table(&self) -> std::sync::MutexGuard<'_, [Shard; SHARDS]> {
        // A panic elsewhere cannot leave a cursor half-written: each is
        // one assignment.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `shard` is read, noting that a tail wants it.
    pub fn want(&self, shard: usize) -> bool {
        let mut table = self.table();
        table[shard].wanted = Some(Instant::now());
        table[shard].after.is_some()
    }

    /// Starts reading `shard` after `newest`; `false` if it was read
    /// already (from no later a point: its earlier start loses nothing).
    pub fn start(&self, shard: usize, newest: ClaimOrder) -> bool {
        let mut table = self.table();
        let cold = table[shard].after.is_none();
        if cold {
            table[shard].after = Some(newest);
        }
        table[shard].wanted = Some(Instant::now());
        cold
    }

    /// The shards read now, each with where to read it after.
    pub fn read(&self) -> Vec<(usize, ClaimOrder)> {
        let table = self.table();
        (0..SHARDS)
            .filter_map(|n| table[n].after.map(|after| (n, after)))
            .collect()
    }

    /// Notes that `shard` was read up to `id` (never moving it back, and
    /// leaving a shard let go meanwhile alone).
    pub fn advance(&self, shard: usize, id: ClaimOrder) {
        let mut table = self.table();
        if let Some(after) = &mut table[shard].after {
            *after = (*after).max(id);
        }
    }

    /// Lets go of the shards no tail has wanted for `idle`, other than
    /// those `in_use` (the shards of the tails kept).
    pub fn prune(&self, in_use: &[bool; SHARDS], idle: std::time::Duration) {
        let mut table = self.table();
        for (shard, used) in table.iter_mut().zip(in_use) {
            let stale = shard.wanted.is_none_or(|at| at.elapsed() >= idle);
            if !used && stale {
                *shard = Shard::default();
            }
        }
    }
}

/// A feed entry id (`<ms>-<seq>`) as an order.
pub(super) fn order_of(id: &str) -> Option<ClaimOrder> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// A feed id as Redis spells it.
pub(super) fn spelled((ms, seq): ClaimOrder) -> String {
    format!("{ms}-{seq}")
}

impl RedisStore {
    /// The key of `shard`'s feed.
    pub(super) fn shard_key(&self, shard: usize) -> String {
        self.global_key(&format!("feed:{shard}"))
    }

    /// The feed a stream's changes go to.
    pub(super) fn feed_of(&self, stream: StreamId) -> String {
        self.shard_key(shard_of(stream))
    }

    /// This instance's wake key: a line there makes its listener read the
    /// shards again at once, instead of after its block runs out.
    pub(super) fn wake_key(&self) -> String {
        self.global_key(&format!("wake:{}", self.instance))
    }

    /// Makes sure the listener reads `stream`'s shard before the caller
    /// reads the stream again: one round trip for a shard not read
    /// yet, none otherwise. `true` when this started it.
    pub(super) async fn follow_shard(&self, stream: StreamId) -> Result<bool> {
        let shard = shard_of(stream);
        if self.follow.cursors.want(shard) {
            return Ok(false);
        }
        let newest: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(self.shard_key(shard))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let newest = newest
            .ids
            .first()
            .and_then(|line| order_of(&line.id))
            .unwrap_or((0, 0));
        let started = self.follow.cursors.start(shard, newest);
        if started {
            redis::pipe()
                .cmd("XADD")
                .arg(self.wake_key())
                .arg("MAXLEN")
                .arg(1)
                .arg("*")
                .arg("w")
                .arg(shard)
                .ignore()
                .cmd("PEXPIRE")
                .arg(self.wake_key())
                .arg(WAKE_TTL_MS)
                .ignore()
                .query_async::<()>(&mut self.conn())
                .await
                .map_err(backend)?;
        }
        Ok(started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_shard_is_read_from_its_first_start_only() {
        let cursors = Cursors::default();
        assert!(!cursors.want(3));
        assert!(cursors.start(3, (10, 0)));
        assert!(!cursors.start(3, (20, 0)));
        assert_eq!(cursors.read(), vec![(3, (10, 0))]);
        assert!(cursors.want(3));
    }

    #[test]
    fn a_cursor_never_moves_back() {
        let cursors = Cursors::default();
        cursors.start(1, (10, 5));
        cursors.advance(1, (10, 9));
        cursors.advance(1, (10, 2));
        assert_eq!(cursors.read(), vec![(1, (10, 9))]);
    }

    #[test]
    fn a_shard_let_go_is_not_moved_by_a_late_read() {
        let cursors = Cursors::default();
        cursors.start(2, (1, 0));
        cursors.prune(&[false; SHARDS], Duration::ZERO);
        cursors.advance(2, (5, 0));
        assert!(cursors.read().is_empty());
    }

    #[test]
    fn a_shard_wanted_lately_is_kept_without_a_tail() {
        let cursors = Cursors::default();
        cursors.start(4, (1, 0));
        cursors.prune(&[false; SHARDS], Duration::from_secs(3600));
        assert_eq!(cursors.read(), vec![(4, (1, 0))]);
    }

    #[test]
    fn a_shard_in_use_is_kept_however_long_unasked() {
        let cursors = Cursors::default();
        cursors.start(0, (1, 0));
        let mut in_use = [false; SHARDS];
        in_use[0] = true;
        cursors.prune(&in_use, Duration::ZERO);
        assert_eq!(cursors.read(), vec![(0, (1, 0))]);
    }

    #[test]
    fn streams_spread_over_every_shard() {
        let mut seen = [0usize; SHARDS];
        for _ in 0..SHARDS * 64 {
            seen[shard_of(StreamId::random())] += 1;
        }
        assert!(seen.iter().all(|n| *n > 0), "{seen:?}");
    }
}
