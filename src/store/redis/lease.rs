//! Who owns what among the instances sharing one Redis: each instance holds
//! a lease (its score in `P:instances`, a time on Redis' clock) that it
//! renews every third of its length; each live stream is owned by the
//! instance that forwarded its request (`owner` in the stream's metadata,
//! and `P:owned:<instance>`). When a lease runs out, the first instance to
//! look claims the dead one's streams in one script, so exactly one takes
//! each over; the old owner, should it still be running, can no longer log
//! to them (the append script refuses it).
//!
//! It owns the instance's identity and the renewal task; it must not decide
//! what happens to a claimed stream (the proxy resumes or fails it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Script;
use tokio_util::sync::CancellationToken;

use super::read::metas_on;
use super::record::backend;
use super::sentinel::Conn;
use super::{ids, RedisStore};
use crate::id::StreamId;
use crate::store::{Result, StreamMeta};

/// A process's name among the instances: random, new at every start, so a
/// restarted process never mistakes its predecessor's streams for its own
/// living ones.
pub(super) fn new_instance() -> String {
    // 64 random bits: every live stream names its owner, so the name is
    // kept short.
    let random = crate::id::StreamId::random();
    format!("{}-{}", std::process::id(), crate::id::hex(&random.0[..8]))
}

/// When the lease was last renewed (or the store made): how long Redis has
/// not answered this instance, for readiness.
pub(super) struct Renewed {
    base: Instant,
    /// Milliseconds from `base` to the last renewal.
    at_ms: AtomicU64,
}

impl Renewed {
    pub fn now() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            at_ms: AtomicU64::new(0),
        })
    }

    fn mark(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.at_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Time since the last renewal.
    pub fn ago(&self) -> Duration {
        let at = self.base + Duration::from_millis(self.at_ms.load(Ordering::Relaxed));
        at.elapsed()
    }
}

/// Renews the lease every third of its length until `stop`. A renewal that
/// fails is tried again at the next tick; a lease that runs out meanwhile
/// lets the other instances take this one's streams over. Each renewal is
/// marked in `renewed`.
pub(super) fn spawn_renewal(
    mut conn: Conn,
    renew: Script,
    instances_key: String,
    instance: String,
    lease: Duration,
    renewed: Arc<Renewed>,
    stop: CancellationToken,
) {
    let every = lease / 3;
    let marks = renewed;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let renewed = renew
                .key(&instances_key)
                .arg(&instance)
                .arg(lease.as_millis() as u64)
                .invoke_async::<i64>(&mut conn)
                .await;
            if renewed.is_ok() {
                marks.mark();
            }
            match (renewed, failing) {
                (Ok(_), true) => {
                    tracing::info!("the instance lease is renewed again");
                    failing = false;
                }
                (Err(e), false) => {
                    tracing::warn!(error = %e, "cannot renew the instance lease");
                    failing = true;
                }
                _ => {}
            }
        }
    });
}

/// Stops the background tasks of a store when the last handle on it drops.
pub(super) struct Tasks {
    pub stop: CancellationToken,
    /// Stops the renewal alone (retirement keeps the feed followed).
    pub renewal: CancellationToken,
}

impl Tasks {
    pub fn new() -> Arc<Self> {
        let stop = CancellationToken::new();
        Arc::new(Self {
            renewal: stop.child_token(),
            stop,
        })
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The instance's side of ownership.
impl RedisStore {
    /// Claims the live streams of instances whose lease ran out (see
    /// `scripts.rs`: one script, so exactly one instance gets each), and
    /// hands out what this instance's pending set holds: those, and any an
    /// earlier look claimed but could not read.
    pub(super) async fn claim_orphans(&self) -> Result<Vec<StreamMeta>> {
        let pending = self.global_key(&format!("claimed:{}", self.instance));
        self.scripts
            .claim
            .key(self.global_key("instances"))
            .key(&pending)
            .arg(&self.instance)
            .arg(&self.prefix)
            .arg(self.lease.as_millis() as u64)
            .invoke_async::<i64>(&mut self.conn())
            .await
            .map_err(backend)?;
        let raw: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&pending)
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let claimed: Vec<StreamId> = ids(raw);
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let metas = metas_on(&mut self.conn(), &self.prefix, &claimed)
            .await
            .map_err(backend)?;
        let mut orphans = Vec::new();
        for (id, meta) in claimed.iter().zip(metas) {
            match meta {
                Ok(Some(meta)) if meta.status.is_live() => orphans.push(meta),
                Ok(_) => {}
                // One unreadable record must not hold the others back.
                Err(e) => {
                    tracing::error!(stream = %id, error = %e, "a claimed stream is unreadable")
                }
            }
        }
        // Read: from here on the caller sees each to its end (or, should
        // this process die first, the next owner does).
        redis::cmd("SREM")
            .arg(&pending)
            .arg(claimed.iter().map(|id| id.to_string()).collect::<Vec<_>>())
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(orphans)
    }

    /// Stops renewing and lets the lease run out now.
    pub(super) async fn give_up_lease(&self) -> Result<()> {
        self.tasks.renewal.cancel();
        redis::cmd("ZADD")
            .arg(self.global_key("instances"))
            .arg(0)
            .arg(&self.instance)
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(backend)
    }
}
