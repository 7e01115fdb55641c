//! The shared backend: the log in Redis, so that several proxy instances
//! serve the same sessions — any instance replays, follows live, answers
//! status for, and takes over when its owner dies, any stream.
//!
//! It owns the Redis key layout below and the Lua scripts that keep a
//! stream's entries, counts, upstream mark and status in step. It must not
//! let a reader see half a write (every append, with its counts, mark and
//! final status, is one script: Redis runs it whole or not at all), must not
//! move a subscription's watermark before Redis acknowledged the write, and
//! must not touch keys outside its `key_prefix`.
//!
//! Layout, with `P` the configured `key_prefix`, on one server (with or
//! without Sentinel; on a Redis Cluster the log is in partitions, and
//! every key of partition `k` is `{P:<k>.<salt>}:` then the key below
//! without its braces, all in one slot: `spread.rs`, `cluster.rs`). A stream's
//! keys and a session's keys each share a hash tag:
//! - `{P:<stream>}:stream`: the stream as one value (`packed.rs`): its
//!   metadata — what it was created with, what changes after (status,
//!   cursors, the upstream mark, `owner`), the counts the store keeps — and,
//!   while it has at most a few entries of a few KB, its entries; a task
//!   leg's names its task, so that the scripts know a leg (never due for
//!   retention) when they see one;
//! - `{P:<stream>}:log`: once a stream outgrew its value, a Redis Stream of
//!   its entries: entry `<seq>` has the id `0-<seq>` (so seq ↔ entry id is
//!   exact) and one field `m`, the message;
//! - `{P:<session>}:session`: the `SessionRecord` JSON;
//!   `{P:<session>}:requests`: hash request id → the newest stream (by
//!   `created_ms`) created under it, its 16 bytes;
//!   `{P:<session>}:streams`: set of its streams that no request id names
//!   (a standalone stream, a batch's, one a newer stream took the id of):
//!   the two list every stream of the session;
//! - `{P:<task>}:task`: hash — `record` (the `TaskRecord` JSON) and
//!   `version` (its version, which compare-and-set checks);
//! - `P:sessions:seen`, `P:sessions:closed`: sorted sets of session ids by
//!   `last_seen_ms` and `closed_ms`, written with the session record, so a
//!   sweep reads only the sessions that are due (`sessions.rs`);
//! - `P:sessions`: set of all session ids; `P:abandon`: sorted set of
//!   stream ids by `abandon_at_ms`; `P:retention` (and `P:finished`): the
//!   finished streams by `finished_ms` (`retention.rs`; task legs are never
//!   in it: they are deleted with their task); `P:tasks`: sorted set of
//!   task ids by `expires_ms`;
//! - `P:feed:<n>`, `n` in 0..16: capped Redis Streams of stream changes
//!   (appends, status, coalescing, deletes), each stream's on the shard its
//!   id picks, read by the instances with a reader of a stream another
//!   instance writes there (`shards.rs`, `follow.rs`); `P:feed`: the same
//!   for reader claims and session changes, read by every instance;
//!   `P:wake:<instance>`: a line that makes an instance's listener read a
//!   shard it just started;
//! - `P:instances`: sorted set of instances by lease expiry;
//!   `P:owned:<instance>`: the live streams it owns (`lease.rs`);
//! - `P:reads`: a counter each read increments with `min_replicas`, so
//!   that the `WAIT` after it says whether the replicas hold what the read
//!   saw (`replicas.rs`).
//!
//! A retained short call is then one key, a field of its session's requests
//! hash and an entry of the retention index: under 1 KB with a 300-byte
//! answer (BENCHMARKS.md, session 20), where the previous layout took some
//! 6 KB (a Redis Stream of its own, a hash of a dozen fields, four index
//! entries).
//!
//! The previous layout kept a stream as `{P:<stream>}:meta`, a hash (the
//! `StreamMeta` JSON as `record`, plus a field for each value that changes
//! after creation), with its entries in its `:log`; wrote
//! `"<created_ms> <stream id>"` in the requests hash and every stream in
//! the session's set and in `P:streams`; and indexed finished streams in
//! `P:finished` alone. An instance upgraded in place reads all of it: a
//! stream in a hash is read as it is, and moved into one value (its
//! entries left in its log) by the first script that writes to it.
//! An instance of the previous version sees none of the new streams: run
//! one version at a time on a key prefix.
//!
//! `read.rs` reads both layouts; `write.rs` runs the scripts that write,
//! which `scripts.rs` holds, through `replicas.rs` (which waits for the
//! replicas, with `min_replicas`); `packed.rs` (and `msgpack.rs`) map the value
//! to `StreamMeta`, `record.rs` the previous layout's hash; `retention.rs`
//! reads the retention index, `sessions.rs` keeps the idle-session index;
//! `tests.rs` runs the contract suite against a real Redis.
//!
//! Where the primary is, `endpoint.rs` says and `sentinel.rs` keeps: one
//! server (`redis_url`), the node of a cluster serving the prefix's slot
//! (`redis_cluster`, found and followed by the cluster client:
//! `cluster.rs`), or the primary the sentinels name, asked again
//! when a connection to it fails or it answers `READONLY`. Every connection
//! of the store — the workers', the waited writes', the lease's, the
//! feed's — follows it. A command that cannot have run is sent again to
//! the new primary; an append the old one may have run without answering
//! is settled on the new one against the entry count this instance's
//! writes left (`write.rs`); any other such write fails with a `Backend`
//! error saying it may or may not be in the log.
//!
//! Durability: a write counts once Redis answered it (the `sync` mode is
//! not used), or with `min_replicas` once that many replicas acknowledged
//! it too (`replicas.rs`); whether Redis itself survives a crash (AOF,
//! `appendfsync`) is the operator's choice. Redis runs a script
//! atomically, so what another connection reads is always whole;
//! `read_after` and `stream_meta` show what Redis holds. A reader can
//! therefore read an entry the moment Redis ran its script, a moment
//! before the writer's answer moves the watermark: that entry is already
//! as durable as an answered one (only its answer is in flight), and a
//! status shows only with the entries it ends. With `min_replicas` it is
//! not yet: the primary holds it, its replicas may not (the feed line that
//! wakes readers is written by the same script), so a read is answered
//! only once the replicas hold what it saw (`replicas.rs`).
//!
//! Limits:
//! - The scripts that also update the global indexes (create, finish,
//!   touch, delete, claims, tasks) name keys of several slots: fine on one
//!   Redis primary (with replicas); on a cluster each partition's keys are
//!   therefore in one slot, and what spans partitions is asked of each
//!   (`spread.rs`).
//! - `size_on_disk` is 0 (the log is not on this machine), so the disk
//!   quota does not apply; Redis' `maxmemory` is the bound.
//! - Numbers the scripts compare or add (seqs, millisecond times) are exact
//!   below 2^53 (Lua numbers are doubles).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;

use self::follow::Follow;
use self::lease::Tasks;
use self::record::{backend, decode, encode};
pub use self::replicas::Replicas;
use self::replicas::Waiting;
use self::scripts::Scripts;
use self::sentinel::{Conn, Route};
use self::sessions::Indexing;
use self::shards::FEED_LENGTH;
pub use self::spread::{
    observe_log, open_log, partition_of, Spread, Tuning, DEFAULT_PARTITIONS, MAX_PARTITIONS,
};
pub use self::ttl::Lifetimes;
use super::{
    Along, Change, Entry, Finish, Prior, ReaderLease, Result, SessionNews, SessionRecord, Store,
    StoreError, StreamMeta, Subscription, TaskRecord, Watermark,
};
use crate::id::{Seq, SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
use crate::workers::PerWorker;

/// How long one command may take before it fails (the client's default,
/// 500 ms, is short for a long `XRANGE` on a loaded server).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct RedisStore {
    prefix: String,
    /// The connection of code on no worker, made with the store.
    first: Conn,
    /// Each worker's own, made there on its first command
    /// ([`RedisStore::with_workers`]); the first for code on no worker.
    conn: PerWorker<OnceLock<Conn>>,
    /// Where the primary is (`sentinel.rs`): makes the workers'
    /// connections, the feed listener's own (its `XREAD BLOCK` must not
    /// hold up the others) and the probe's.
    route: Arc<Route>,
    follow: Arc<Follow>,
    scripts: Scripts,
    /// This process's name among the instances (see `lease.rs`).
    instance: String,
    lease: Duration,
    /// When the lease was last renewed, once the renewal runs: past
    /// `lease` ago, Redis counts as unreachable (see [`Store::health`]).
    renewed: OnceLock<Arc<lease::Renewed>>,
    /// How long finished streams and idle sessions outlive their deadline
    /// before Redis expires their keys (see [`RedisStore::with_lifetimes`]).
    expire_after: Lifetimes,
    tasks: Arc<Tasks>,
    /// When a sweep last listed every session into the idle-session index
    /// (`sessions.rs`); `None` before the first.
    sessions_indexed: std::sync::Mutex<Option<std::time::Instant>>,
    /// The replicas a write waits for, and its connections (`replicas.rs`).
    waiting: Waiting,
}

/// A connection to the route's primary that connects on first use, and
/// again after it breaks (to the primary then), failing a command not
/// answered within `timeout`.
fn connection(route: &Arc<Route>, timeout: Duration) -> Result<Conn> {
    Conn::new(route.clone(), timeout)
}

/// The key of one of a stream's values (`meta`, `log`) under `prefix`.
fn stream_key(prefix: &str, id: StreamId, what: &str) -> String {
    format!("{}:{what}", cluster::tag(prefix, id))
}

/// Parses the ids of a set or sorted set, skipping what is not an id.
fn ids<T: std::str::FromStr>(raw: Vec<String>) -> Vec<T> {
    raw.iter().filter_map(|s| s.parse().ok()).collect()
}

impl RedisStore {
    fn conn(&self) -> Conn {
        let own = self.conn.get().get_or_init(|| {
            // Made here, on the worker, so that the connection's tasks (and
            // those of every reconnection) run on this thread. Making it
            // fails only on a configuration `build` already accepted.
            connection(&self.route, RESPONSE_TIMEOUT).unwrap_or_else(|_| self.first.clone())
        });
        own.clone()
    }

    fn stream_key(&self, id: StreamId, what: &str) -> String {
        stream_key(&self.prefix, id, what)
    }

    fn session_key(&self, id: SessionId, what: &str) -> String {
        format!("{}:{what}", cluster::tag(&self.prefix, id))
    }

    fn task_key(&self, id: TaskId) -> String {
        format!("{}:task", cluster::tag(&self.prefix, id))
    }

    fn global_key(&self, what: &str) -> String {
        format!("{}:{what}", self.prefix)
    }

    fn owned_key(&self, instance: &str) -> String {
        format!("{}:owned:{instance}", self.prefix)
    }

    /// A line of the feed every instance reads (`P:feed`), from this
    /// instance: `field` names what it is about (`e`: a session changed,
    /// `r`: a reader claimed a stream; both rare next to a stream's changes,
    /// which go to its shard).
    fn feed_line(&self, field: &str, about: String) -> redis::Cmd {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.global_key("feed"))
            .arg("MAXLEN")
            .arg("~")
            .arg(FEED_LENGTH)
            .arg("*")
            .arg("i")
            .arg(&self.instance)
            .arg(field)
            .arg(about);
        cmd
    }

    /// The feed line telling other instances that a session changed.
    fn session_changed(&self, id: SessionId) -> redis::Cmd {
        self.feed_line("e", id.to_string())
    }

    /// The records of sessions `ids`, in order, in one round trip; `None`
    /// for one whose record is gone (deleted, or expired by its TTL).
    async fn session_records(&self, ids: &[SessionId]) -> Result<Vec<Option<SessionRecord>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("GET").arg(self.session_key(*id, "session"));
        }
        let raws: Vec<Option<Vec<u8>>> =
            pipe.query_async(&mut self.conn()).await.map_err(backend)?;
        raws.into_iter()
            .map(|raw| raw.map(|r| decode("session", &r)).transpose())
            .collect()
    }

    async fn members(&self, key: String) -> Result<Vec<String>> {
        redis::cmd("SMEMBERS")
            .arg(key)
            .query_async(&mut self.conn())
            .await
            .map_err(backend)
    }

    /// The ids in sorted set `index` whose score is at or before `at`.
    async fn due<T: std::str::FromStr>(&self, index: &str, at: u64) -> Result<Vec<T>> {
        let raw: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(self.global_key(index))
            .arg("-inf")
            .arg(at)
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(ids(raw))
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn put_session(&self, session: &SessionRecord) -> Result<()> {
        let ttl = self.expire_after.session.as_millis() as u64;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("SET")
            .arg(self.session_key(session.id, "session"))
            .arg(encode(session)?)
            .arg("PX")
            .arg(ttl)
            .ignore();
        for what in ["streams", "requests"] {
            pipe.cmd("PEXPIRE")
                .arg(self.session_key(session.id, what))
                .arg(ttl)
                .ignore();
        }
        self.index_session(&mut pipe, session, Indexing::WithRecord);
        pipe.cmd("SADD")
            .arg(self.global_key("sessions"))
            .arg(session.id.to_string())
            .ignore()
            .add_command(self.session_changed(session.id))
            .ignore();
        self.run_transaction(&pipe).await
    }

    async fn get_session(&self, id: SessionId) -> Result<Option<SessionRecord>> {
        let raw: Option<Vec<u8>> = redis::cmd("GET")
            .arg(self.session_key(id, "session"))
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        raw.map(|r| decode("session", &r)).transpose()
    }

    async fn list_sessions(&self) -> Result<Vec<SessionRecord>> {
        let sessions: Vec<SessionId> = ids(self.members(self.global_key("sessions")).await?);
        let records = self.session_records(&sessions).await?;
        Ok(records.into_iter().flatten().collect())
    }

    async fn sessions_idle_by(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        self.sessions_due(seen_by_ms, closed_by_ms).await
    }

    async fn delete_session(&self, id: SessionId) -> Result<()> {
        for meta in self.streams_of_session(id).await? {
            self.delete_meta(&meta).await?;
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        self.unindex_session(&mut pipe, id);
        pipe.cmd("DEL")
            .arg(self.session_key(id, "session"))
            .arg(self.session_key(id, "streams"))
            .arg(self.session_key(id, "requests"))
            .ignore()
            .cmd("SREM")
            .arg(self.global_key("sessions"))
            .arg(id.to_string())
            .ignore()
            .add_command(self.session_changed(id))
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(backend)
    }

    async fn create_with(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<()> {
        self.create(meta, opening, false).await.map(|_| ())
    }

    async fn create_call(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<Option<Prior>> {
        self.create(meta, opening, meta.call_id().is_some()).await
    }

    async fn stream_meta(&self, id: StreamId) -> Result<Option<StreamMeta>> {
        self.meta(id).await
    }

    async fn list_streams(&self) -> Result<Vec<StreamMeta>> {
        self.every_stream().await
    }

    async fn streams_of_session(&self, session: SessionId) -> Result<Vec<StreamMeta>> {
        self.session_streams(session).await
    }

    async fn set_status(&self, id: StreamId, end: Finish) -> Result<()> {
        self.append_inner(id, &[], Along::ending(end))
            .await
            .map(|_| ())
    }

    async fn update_stream(&self, id: StreamId, change: Change) -> Result<()> {
        let (kind, value) = match change {
            Change::Ack(seq) => ("ack", seq),
            Change::Touch { at_ms } => ("touch", at_ms),
            Change::Request(seq) => ("request", seq),
            Change::Coalesced => ("coalesced", 1),
        };
        let mut invocation = self.scripts.change.prepare_invoke();
        invocation
            .key(self.stream_key(id, "stream"))
            .key(self.stream_key(id, "meta"))
            .key(self.global_key("abandon"))
            .key(self.feed_of(id))
            .arg(id.to_string())
            .arg(kind)
            .arg(value)
            .arg(&self.instance);
        let done: i64 = replicas::invoke(&invocation, &mut self.conn()).await?;
        if done < 0 {
            return Err(StoreError::NoSuchStream(id));
        }
        if change == Change::Coalesced {
            if let Some(tail) = self.follow.tails.get(&id) {
                tail.watermark.send_modify(|w| w.coalesced = true);
            }
        }
        Ok(())
    }

    async fn delete_stream(&self, id: StreamId) -> Result<()> {
        match self.stream_meta(id).await? {
            Some(meta) => self.delete_meta(&meta).await,
            None => {
                // Expired by its TTL (or deleted by another instance):
                // what may still name it in the global indexes goes too.
                self.follow.gone(id);
                redis::pipe()
                    .cmd("SREM")
                    .arg(self.global_key("streams"))
                    .arg(id.to_string())
                    .ignore()
                    .cmd("ZREM")
                    .arg(self.global_key("abandon"))
                    .arg(id.to_string())
                    .ignore()
                    .cmd("ZREM")
                    .arg(self.global_key("finished"))
                    .arg(id.to_string())
                    .ignore()
                    .query_async::<()>(&mut self.conn())
                    .await
                    .map_err(backend)
            }
        }
    }

    async fn stream_of_request(
        &self,
        session: SessionId,
        id: &RequestId,
    ) -> Result<Option<StreamId>> {
        let held: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.session_key(session, "requests"))
            .arg(id.as_json())
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(held.as_deref().and_then(read::named))
    }

    async fn abandoned_by(&self, now_ms: u64) -> Result<Vec<StreamId>> {
        self.due("abandon", now_ms).await
    }

    async fn finished_by(&self, at_ms: u64) -> Result<Vec<StreamId>> {
        self.finished_due(at_ms).await
    }

    async fn write(&self, stream: StreamId, messages: &[Bytes], along: Along<'_>) -> Result<Seq> {
        self.append_inner(stream, messages, along).await
    }

    async fn read_after(&self, stream: StreamId, after: Seq, limit: usize) -> Result<Vec<Entry>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.entries_after(stream, after, limit).await
    }

    async fn subscribe(&self, stream: StreamId) -> Subscription {
        match self.tail(stream).await {
            Some(tail) => tail.watermark.subscribe(),
            // No such stream (or Redis did not answer): "finished"; the
            // reader's next look at the store tells which.
            None => super::no_such_stream(),
        }
    }

    /// Only a tail this instance holds: no round trip.
    fn peek(&self, stream: StreamId) -> Option<Watermark> {
        self.follow
            .tails
            .get(&stream)
            .map(|t| *t.watermark.borrow())
    }

    async fn put_task(&self, task: &TaskRecord) -> Result<()> {
        self.write_task(task, None).await.map(|_| ())
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        let raw: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.task_key(id))
            .arg("record")
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        raw.map(|r| decode("task", &r)).transpose()
    }

    async fn update_task(&self, task: &TaskRecord) -> Result<bool> {
        match task.version.checked_sub(1) {
            Some(expected) => self.write_task(task, Some(expected)).await,
            // No stored version precedes 0.
            None => Ok(false),
        }
    }

    async fn delete_task(&self, id: TaskId) -> Result<()> {
        // A record its TTL took has left its legs to theirs (the same).
        if let Some(task) = self.get_task(id).await? {
            for leg in &task.legs {
                self.delete_stream(*leg).await?;
            }
        }
        // After the legs: should this stop half-way, the task is still
        // indexed to be deleted again, and retention never deletes legs.
        redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(self.task_key(id))
            .ignore()
            .cmd("ZREM")
            .arg(self.global_key("tasks"))
            .arg(id.to_string())
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(backend)
    }

    async fn tasks_expired_by(&self, now_ms: u64) -> Result<Vec<TaskId>> {
        self.due("tasks", now_ms).await
    }

    /// The log is not on this machine's disk.
    fn size_on_disk(&self) -> u64 {
        0
    }

    /// Every write already waited for Redis' answer.
    async fn flush(&self) -> Result<()> {
        Ok(())
    }

    async fn orphans(&self) -> Result<Vec<StreamMeta>> {
        self.claim_orphans().await
    }

    fn shared(&self) -> bool {
        true
    }

    /// Unreachable once the lease went unrenewed for as long as it lasts:
    /// from then on the other instances may take this one's calls over,
    /// so it should be given no new ones. A shorter outage (a failover)
    /// leaves it ready: its writes wait for Redis or fail one by one.
    fn health(&self) -> std::result::Result<(), String> {
        let Some(renewed) = self.renewed.get() else {
            return Ok(());
        };
        let away = renewed.ago();
        if away <= self.lease || self.tasks.renewal.is_cancelled() {
            return Ok(());
        }
        let unreachable = format!("redis unreachable for {}s", away.as_secs());
        match self.route.failing() {
            Some(why) => Err(format!("{unreachable}: {why}")),
            None => Err(unreachable),
        }
    }

    async fn hold_reader(&self, stream: StreamId) -> Result<ReaderLease> {
        self.claim_reader(stream).await
    }

    fn session_changes(&self) -> Option<tokio::sync::broadcast::Receiver<SessionNews>> {
        Some(self.follow.sessions.subscribe())
    }

    /// Stops renewing and lets the lease run out now: the other instances
    /// take this one's live streams over at their next look.
    async fn retire(&self) -> Result<()> {
        self.give_up_lease().await
    }
}

mod cluster;
pub mod endpoint;
mod follow;
mod lease;
mod msgpack;
mod open;
mod outage;
mod packed;
mod reach;
mod read;
mod record;
mod replicas;
mod retention;
mod scripts;
mod sentinel;
mod sessions;
mod shards;
mod spread;
#[cfg(test)]
mod tests;
mod ttl;
mod write;
