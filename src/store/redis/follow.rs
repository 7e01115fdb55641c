//! Following what other instances write: the one `XREAD BLOCK` listener of
//! an instance, on a connection of its own, reading the session feed
//! (`P:feed`) and the shards of the stream feed its tails are in
//! (`shards.rs`), and fanning each change out to this instance's readers
//! through their stream's [`Tail`].
//!
//! It owns the tails (one per stream read here) and the session-change
//! broadcast; it must not read entries (readers do, from the log itself)
//! nor write anything. A change it misses (a cut connection, a feed trimmed
//! past it) is never lost for good: after every reconnect, and every
//! [`RESYNC_EVERY`] anyway, each tail is re-read from its stream's
//! metadata.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::streams::{StreamId as FeedEntry, StreamReadReply};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::read::metas_on;
use super::record::backend;
use super::sentinel::{Conn, Route};
use super::shards::{order_of, shard_of, spelled, Cursors, SHARDS};
use super::RedisStore;
use crate::id::{IdDashMap, SessionId, StreamId};
use crate::store::{ClaimOrder, ReaderLease, Result, SessionNews, StoreError, Watermark};

/// How long one `XREAD` blocks before it is asked again.
const BLOCK: Duration = Duration::from_secs(2);
/// Changes taken from the feed at once.
const BATCH: usize = 1024;
/// How often every tail is re-read from Redis whatever the feed said.
pub(super) const RESYNC_EVERY: Duration = Duration::from_secs(30);
/// Longest pause between attempts to reach Redis again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The local end of one stream: what this instance's readers wait on.
pub(super) struct Tail {
    pub watermark: watch::Sender<Watermark>,
    /// The newest reader claim another instance made on the stream.
    pub claims: watch::Sender<ClaimOrder>,
    /// Made by this instance as it created the stream, and no reader has
    /// claimed it yet: the first reader here needs no claim on the feed
    /// (any claim elsewhere is newer than none).
    fresh: AtomicBool,
    /// Read from Redis after it was put where writes find it (see
    /// [`RedisStore::tail`]).
    synced: AtomicBool,
    /// Made by this instance as it created the stream, whose writes move
    /// it then: it needs no shard of the feed, until a write here is
    /// refused because another instance took the stream
    /// ([`RedisStore::written_elsewhere`]).
    own: AtomicBool,
    /// The stream's entry count as this instance's last answered write
    /// left it ([`UNKNOWN`] before one): what settles a write the primary
    /// went away without answering (`write.rs`). Moved by nothing else.
    written: AtomicU64,
}

/// [`Tail::written`] before this instance wrote.
const UNKNOWN: u64 = u64::MAX;

impl Tail {
    pub fn new(mark: Watermark) -> Self {
        Self {
            watermark: watch::Sender::new(mark),
            claims: watch::Sender::new((0, 0)),
            fresh: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            own: AtomicBool::new(false),
            written: AtomicU64::new(UNKNOWN),
        }
    }

    /// The tail of a stream this instance just created.
    pub fn created(mark: Watermark) -> Self {
        Self {
            fresh: AtomicBool::new(true),
            synced: AtomicBool::new(true),
            own: AtomicBool::new(true),
            written: AtomicU64::new(mark.seq),
            ..Self::new(mark)
        }
    }

    /// The entry count this instance's last answered write left.
    pub fn written(&self) -> Option<u64> {
        Some(self.written.load(Ordering::SeqCst)).filter(|n| *n != UNKNOWN)
    }

    /// Notes an answered write that left `seq` entries.
    pub fn wrote(&self, seq: u64) {
        self.written.store(seq, Ordering::SeqCst);
    }

    /// Moves the watermark to what Redis says now: never back in seq, and
    /// never out of `finished` (a read answered before a finishing line was
    /// applied must not undo it; nothing re-opens a stream once finished).
    pub fn sync(&self, now: Watermark) {
        self.watermark.send_if_modified(|w| {
            let moved = Watermark {
                seq: now.seq.max(w.seq),
                finished: w.finished || now.finished,
                coalesced: w.coalesced || now.coalesced,
            };
            let changed = moved != *w;
            *w = moved;
            changed
        });
    }

    fn moved(&self, seq: u64, finished: Option<bool>) {
        self.watermark.send_if_modified(|w| {
            let before = *w;
            w.seq = w.seq.max(seq);
            if let Some(finished) = finished {
                w.finished = finished;
            }
            *w != before
        });
    }
}

/// What the listener keeps up to date.
pub(super) struct Follow {
    pub tails: IdDashMap<StreamId, Arc<Tail>>,
    /// Sessions another instance changed or deleted.
    pub sessions: broadcast::Sender<SessionNews>,
    /// Which shards of the stream feed are read, from where.
    pub cursors: Cursors,
}

impl Follow {
    pub fn new() -> Self {
        Self {
            tails: IdDashMap::default(),
            sessions: broadcast::channel(1024).0,
            cursors: Cursors::default(),
        }
    }

    /// The same, telling of sessions on `news`, which the other
    /// partitions of a spread log (`spread.rs`) tell on too.
    pub fn telling(news: broadcast::Sender<SessionNews>) -> Self {
        Self {
            sessions: news,
            ..Self::new()
        }
    }

    /// Tells readers of a deleted stream that it will say nothing more.
    pub fn gone(&self, stream: StreamId) {
        if let Some((_, tail)) = self.tails.remove(&stream) {
            tail.watermark.send_modify(|w| w.finished = true);
        }
    }

    /// Applies one line of the feed (taking its fields: each is read once).
    fn apply(&self, entry: &mut FeedEntry, me: &str) {
        let mut text = |k: &str| -> Option<String> {
            entry
                .map
                .remove(k)
                .and_then(|v| redis::from_redis_value::<String>(v).ok())
        };
        let mine = text("i").as_deref() == Some(me);
        if let Some(stream) = text("s").and_then(|s| s.parse::<StreamId>().ok()) {
            if text("g").is_some() {
                return self.gone(stream);
            }
            let Some(tail) = self.tails.get(&stream).map(|t| t.clone()) else {
                return;
            };
            if text("c").is_some() {
                tail.watermark
                    .send_if_modified(|w| !std::mem::replace(&mut w.coalesced, true));
                return;
            }
            let seq = text("q").and_then(|q| q.parse().ok()).unwrap_or(0);
            let finished = match text("f").as_deref() {
                Some("1") => Some(true),
                Some("0") => Some(false),
                _ => None,
            };
            tail.moved(seq, finished);
        } else if let Some(stream) = text("r").and_then(|s| s.parse::<StreamId>().ok()) {
            // This instance's own readers replace each other in the log.
            if mine {
                return;
            }
            if let (Some(tail), Some(order)) = (self.tails.get(&stream), order_of(&entry.id)) {
                tail.claims.send_if_modified(|c| {
                    let newer = order > *c;
                    if newer {
                        *c = order;
                    }
                    newer
                });
            }
        } else if let Some(session) = text("e").and_then(|s| s.parse::<SessionId>().ok()) {
            if !mine {
                let _ = self.sessions.send(SessionNews::Changed(session));
            }
        }
    }
}

/// Where the listener reads.
pub(super) struct Listener {
    pub follow: Arc<Follow>,
    /// Where the primary is: asked again when the feed's connection fails.
    pub route: Arc<Route>,
    pub instance: String,
    /// The session feed, `P:feed` (where an instance of the version before
    /// the shards wrote every change: read whole, as ever).
    pub feed_key: String,
    /// This instance's wake key (`RedisStore::wake_key`).
    pub wake_key: String,
    /// The stream feed's shards, by number.
    pub shard_keys: Vec<String>,
    /// The deployment's `key_prefix`.
    pub prefix: String,
}

/// Where the session feed and the wake key are read after (the shards'
/// cursors are `Follow::cursors`): kept across reconnects, so that a line
/// written meanwhile is still read (the feed keeps ~100k).
struct Reading {
    feed: String,
    wake: String,
}

impl Listener {
    /// Follows the feed until `stop`, reconnecting (with back-off) whenever
    /// Redis is away.
    pub async fn run(self, stop: CancellationToken) {
        let mut backoff = Duration::from_millis(50);
        let mut away = false;
        let mut read_up_to: Option<Reading> = None;
        loop {
            let generation = self.route.now().generation;
            let followed = tokio::select! {
                r = self.follow_feed(&mut away, &mut read_up_to) => r,
                () = stop.cancelled() => return,
            };
            if let Err(e) = followed {
                // Said once per outage, not once per attempt.
                if !std::mem::replace(&mut away, true) {
                    tracing::warn!(error = %e, "lost the Redis feed; reconnecting");
                    backoff = Duration::from_millis(50);
                }
                if self.route.follows() {
                    // The primary may have moved: the next attempt goes
                    // where the sentinels say (a failure is logged there).
                    let until = tokio::time::Instant::now() + MAX_BACKOFF;
                    let asked = tokio::select! {
                        r = self.route.follow(generation, until) => r,
                        () = stop.cancelled() => return,
                    };
                    if let Err(why) = asked {
                        tracing::debug!(error = %why, "the feed waits for a primary");
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn follow_feed(
        &self,
        away: &mut bool,
        read_up_to: &mut Option<Reading>,
    ) -> redis::RedisResult<()> {
        let mut conn = self.route.dedicated(BLOCK + Duration::from_secs(5)).await?;
        let reading = match read_up_to.take() {
            Some(before) => before,
            None => Reading {
                feed: newest(&mut conn, &self.feed_key).await?,
                wake: newest(&mut conn, &self.wake_key).await?,
            },
        };
        let reading = read_up_to.insert(reading);
        self.resync(&mut conn).await?;
        if std::mem::replace(away, false) {
            tracing::info!("following the Redis feed again");
            // Session lines the feed no longer holds (or a Redis that lost
            // them) would go unseen: every cached session is re-read.
            let _ = self.follow.sessions.send(SessionNews::Unknown);
        }
        let mut resynced = tokio::time::Instant::now();
        loop {
            let shards = self.follow.cursors.read();
            let mut read = redis::cmd("XREAD");
            read.arg("COUNT")
                .arg(BATCH)
                .arg("BLOCK")
                .arg(BLOCK.as_millis() as u64)
                .arg("STREAMS")
                .arg(&self.feed_key)
                .arg(&self.wake_key);
            for (shard, _) in &shards {
                read.arg(&self.shard_keys[*shard]);
            }
            read.arg(&reading.feed).arg(&reading.wake);
            for (_, after) in &shards {
                read.arg(spelled(*after));
            }
            let reply: Option<StreamReadReply> = read.query_async(&mut conn).await?;
            for key in reply.map(|r| r.keys).unwrap_or_default() {
                self.take(key, reading);
            }
            if resynced.elapsed() >= RESYNC_EVERY {
                self.resync(&mut conn).await?;
                resynced = tokio::time::Instant::now();
            }
        }
    }

    /// Applies what one key of an `XREAD` answered, moving its cursor.
    fn take(&self, key: redis::streams::StreamKey, reading: &mut Reading) {
        let Some(last) = key.ids.last().map(|line| line.id.clone()) else {
            return;
        };
        if key.key == self.wake_key {
            // Nothing to apply: the line only woke the read, so that it
            // names the shards started since.
            reading.wake = last;
            return;
        }
        for mut line in key.ids {
            self.follow.apply(&mut line, &self.instance);
        }
        if key.key == self.feed_key {
            reading.feed = last;
        } else if let Some(shard) = self.shard_keys.iter().position(|k| *k == key.key) {
            if let Some(order) = order_of(&last) {
                self.follow.cursors.advance(shard, order);
            }
        }
    }

    /// Re-reads every tail's watermark from Redis, and forgets tails nobody
    /// waits on any more.
    async fn resync(&self, conn: &mut Conn) -> redis::RedisResult<()> {
        let follow = &self.follow;
        // A tail `tail()` is still making has no receiver yet, but a second
        // holder of its `Arc`.
        follow.tails.retain(|_, t| {
            t.watermark.receiver_count() > 0
                || t.claims.receiver_count() > 0
                || Arc::strong_count(t) > 1
        });
        let mut in_use = [false; SHARDS];
        for tail in follow.tails.iter() {
            if !tail.own.load(Ordering::SeqCst) {
                in_use[shard_of(*tail.key())] = true;
            }
        }
        follow.cursors.prune(&in_use, RESYNC_EVERY);
        let streams: Vec<StreamId> = follow.tails.iter().map(|t| *t.key()).collect();
        for chunk in streams.chunks(BATCH) {
            let metas = metas_on(conn, &self.prefix, chunk).await?;
            for (id, meta) in chunk.iter().zip(metas) {
                match meta {
                    Ok(Some(meta)) => {
                        if let Some(tail) = follow.tails.get(id) {
                            tail.sync(meta.watermark());
                        }
                    }
                    Ok(None) => follow.gone(*id),
                    Err(e) => tracing::warn!(stream = %id, error = %e, "unreadable stream"),
                }
            }
        }
        Ok(())
    }
}

/// The id of the feed's newest entry (`0-0` for an empty feed): where a
/// listener that just (re)connected starts.
async fn newest(conn: &mut Conn, feed: &str) -> redis::RedisResult<String> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(feed)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await?;
    Ok(reply
        .ids
        .into_iter()
        .next()
        .map(|e| e.id)
        .unwrap_or_else(|| "0-0".to_owned()))
}

/// The tails of this instance's readers, made from Redis on first use.
impl RedisStore {
    /// The stream's tail; `None` for a stream that does not exist. A tail
    /// not yet made here is read from the stream's metadata first.
    pub(super) async fn tail(&self, stream: StreamId) -> Option<Arc<Tail>> {
        let tail = match self.follow.tails.get(&stream) {
            Some(tail) => tail.clone(),
            None => {
                let mark = self.watermark(stream).await?;
                let tail = self.follow.tails.entry(stream);
                tail.or_insert_with(|| Arc::new(Tail::new(mark))).clone()
            }
        };
        let started = !tail.own.load(Ordering::SeqCst) && self.shard_started(stream).await;
        if started || !tail.synced.load(Ordering::SeqCst) {
            // A write answered between the first read and the insert found
            // no tail to move: read once more, now that every later answer
            // (and feed line) finds this one. Until such a read has come
            // back, every caller makes it: one whose task was dropped while
            // it waited (a client gone) leaves it to the next.
            match self.watermark(stream).await {
                Some(now) => {
                    tail.sync(now);
                    tail.synced.store(true, Ordering::SeqCst);
                }
                None => {
                    self.follow.gone(stream);
                    return None;
                }
            }
        }
        Some(tail)
    }

    /// Whether this call started the stream's shard: one not read before,
    /// whose lines so far are only in the stream itself (read again by the
    /// caller). Failing, the shard is started by the next caller.
    async fn shard_started(&self, stream: StreamId) -> bool {
        self.follow_shard(stream).await.unwrap_or_else(|e| {
            tracing::debug!(stream = %stream, error = %e, "could not start its feed shard");
            false
        })
    }

    /// Another instance writes `stream` now (it took it over while this
    /// one's lease had run out): its tail here follows the feed from now
    /// on, and is read again for what it missed meanwhile.
    pub(super) async fn written_elsewhere(&self, stream: StreamId) {
        let Some(tail) = self.follow.tails.get(&stream).map(|t| t.clone()) else {
            return;
        };
        if tail.own.swap(false, Ordering::SeqCst) {
            self.shard_started(stream).await;
            if let Some(now) = self.watermark(stream).await {
                tail.sync(now);
            }
        }
    }

    /// Where the stream stands in Redis; `None` when it does not exist or
    /// Redis did not answer.
    async fn watermark(&self, stream: StreamId) -> Option<Watermark> {
        Some(self.meta(stream).await.ok()??.watermark())
    }

    /// Claims the stream for a reader of this instance: a line on the feed,
    /// whose place in it orders the claim against other instances' claims.
    pub(super) async fn claim_reader(&self, stream: StreamId) -> Result<ReaderLease> {
        let Some(tail) = self.tail(stream).await else {
            return Ok(ReaderLease::sole());
        };
        let claims = tail.claims.subscribe();
        if tail.fresh.swap(false, Ordering::SeqCst) {
            return Ok(ReaderLease::new(claims, (0, 0)));
        }
        let id: String = self
            .feed_line("r", stream.to_string())
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let mine =
            order_of(&id).ok_or_else(|| StoreError::Corrupt(format!("feed entry id {id}")))?;
        Ok(ReaderLease::new(claims, mine))
    }
}
