//! A log spread over a Redis Cluster's primaries (`[store] partitions`):
//! the log in `n` partitions, each a whole one-slot log ([`RedisStore`],
//! under the hash tag `cluster::partition_prefixes` gives it), placed so
//! that the partitions fall evenly on the primaries. It owns which
//! partition holds what, and the count recorded under the prefix; it must
//! not let an operation that needs two keys of different partitions
//! happen, since a cluster runs a script only on keys of one slot.
//!
//! What lives together must be written together, so a session, its
//! streams, its tasks and their legs share a partition: the one the first
//! byte of their ids picks. The proxy mints a stream's id with its
//! session's first byte, and a task leg's with its task's
//! (`random_beside` in `id.rs`), so the partition of anything is known
//! from its id alone — an append carries only its stream's id — and every
//! script (create, append, change, delete, task) stays on one slot. The
//! indexes that span streams (retention, abandonment, tasks, idle
//! sessions, instances and what each owns, the feed and its shards) are
//! each partition's own; a sweep asks every partition and puts the
//! answers together. The tasks' pseudo-session (`SessionId::TASKS`) is the
//! one session in every partition, since its legs follow their tasks.
//!
//! Each partition is an instance of its own on the feed and the lease, all
//! under this instance's name: a partition's feed listener reads its own
//! feed (a blocked connection per partition, on the node that serves it),
//! its lease renewal keeps its own instances set, and its claims take only
//! its own orphans. Commands of every partition share each thread's
//! cluster connection, which reaches every node.
//!
//! The count is recorded (`{P}:partitions`) by the first instance to
//! start, and an instance configured with another count refuses to start:
//! each count lays the log out under other keys. So does a count above one
//! where an earlier version left a log in one slot (`{P}:…`), which
//! `partitions = 1` keeps serving.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::try_join_all;
use tokio::sync::broadcast;

use super::cluster::{self, Cluster};
use super::endpoint::Endpoint;
use super::follow::Follow;
use super::lease;
use super::record::backend;
use super::sentinel::Route;
use super::{Lifetimes, RedisStore, Replicas, RESPONSE_TIMEOUT};
use crate::id::{Seq, SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
use crate::store::{
    Along, Change, Entry, Finish, Prior, ReaderLease, Result, SessionNews, SessionRecord,
    SharedStore, Store, StoreError, StreamMeta, Subscription, TaskRecord, Watermark,
};

/// How many partitions a log on a cluster is spread over when
/// `[store] partitions` says nothing: more than the primaries of most
/// clusters, so that each holds several, and few enough that an instance's
/// blocked feed connections (one per partition) stay few.
pub const DEFAULT_PARTITIONS: usize = 16;

/// The most partitions: a partition is picked by one byte of an id.
pub const MAX_PARTITIONS: usize = 256;

/// What the server tunes on the log it opens.
#[derive(Clone, Copy)]
pub struct Tuning {
    pub lifetimes: Lifetimes,
    pub replicas: Replicas,
    pub workers: usize,
}

/// Opens the Redis log `at` describes for serving: on one server (or the
/// sentinels' primary) the log as it always was; on a cluster, in the
/// partitions `at.partitions` names, checked against the count recorded.
pub async fn open_log(
    at: &Endpoint,
    prefix: &str,
    lease: Duration,
    tuning: Tuning,
) -> Result<SharedStore> {
    let n = at.partitions();
    if !at.cluster.is_empty() {
        let (base, stand_in) = cluster::reach(at, &cluster::one_slot(prefix))?;
        settle_partitions(&base, prefix, n).await?;
        if n > 1 {
            let spread = Spread::build(&base, &stand_in, prefix, n, lease, true)?;
            spread.probe().await?;
            return Ok(Arc::new(spread.tuned(tuning)));
        }
    }
    let store = RedisStore::open_at(at, prefix, lease).await?;
    Ok(Arc::new(store.tuned(tuning)))
}

/// Opens the Redis log `at` describes for looking only (`streams list`):
/// on a cluster, in as many partitions as were recorded.
pub async fn observe_log(at: &Endpoint, prefix: &str) -> Result<Box<dyn Store>> {
    if !at.cluster.is_empty() {
        let (base, stand_in) = cluster::reach(at, &cluster::one_slot(prefix))?;
        if let Some(n) = recorded_partitions(&base, prefix).await?.filter(|n| *n > 1) {
            let spread = Spread::build(&base, &stand_in, prefix, n, Duration::ZERO, false)?;
            spread.probe().await?;
            return Ok(Box::new(spread));
        }
    }
    Ok(Box::new(RedisStore::observer(at, prefix).await?))
}

/// The hash tag of the partition that holds what an id (`bytes`) names in
/// a log under `prefix` spread over `partitions`: the keys to look at, or
/// whose primary to ask for (`CLUSTER KEYSLOT`), for a session or a call.
pub fn partition_of(prefix: &str, partitions: usize, bytes: &[u8; 16]) -> String {
    let mut tags = cluster::partition_prefixes(prefix, partitions);
    let at = usize::from(bytes[0]) % tags.len();
    tags.swap_remove(at)
}

/// The key that records the count, in the prefix's own slot.
fn partitions_key(prefix: &str) -> String {
    format!("{}:partitions", cluster::one_slot(prefix))
}

async fn recorded_partitions(base: &Cluster, prefix: &str) -> Result<Option<usize>> {
    let mut conn = base.connect_direct(RESPONSE_TIMEOUT);
    let held: Option<String> = redis::cmd("GET")
        .arg(partitions_key(prefix))
        .query_async(&mut conn)
        .await
        .map_err(backend)?;
    Ok(held.and_then(|n| n.parse().ok()))
}

/// Records `n` as the count of the log under `prefix`, or checks it
/// against the count recorded.
async fn settle_partitions(base: &Cluster, prefix: &str, n: usize) -> Result<()> {
    base.probe().await?;
    let mut conn = base.connect_direct(RESPONSE_TIMEOUT);
    if recorded_partitions(base, prefix).await?.is_none() && n > 1 {
        let one_slot = cluster::one_slot(prefix);
        let earlier_keys = ["instances", "sessions", "retention", "tasks"];
        let earlier: usize = redis::cmd("EXISTS")
            .arg(earlier_keys.map(|k| format!("{one_slot}:{k}")).to_vec())
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        if earlier > 0 {
            return Err(StoreError::Backend(format!(
                "store.partitions = {n}, but this cluster holds a log under key_prefix \
                 {prefix:?} in one slot, as versions without partitions wrote it: set \
                 partitions = 1 to keep serving it, or start the spread log on another key_prefix"
            )));
        }
    }
    let _: () = redis::cmd("SET")
        .arg(partitions_key(prefix))
        .arg(n)
        .arg("NX")
        .query_async(&mut conn)
        .await
        .map_err(backend)?;
    match recorded_partitions(base, prefix).await? {
        Some(held) if held == n => Ok(()),
        held => Err(StoreError::Backend(format!(
            "store.partitions = {n}, but the log under key_prefix {prefix:?} on this cluster is \
             spread over {}: set partitions to that (another count needs another key_prefix)",
            held.map_or_else(|| "an unreadable count".to_owned(), |h| h.to_string())
        ))),
    }
}

/// The log in partitions, each a one-slot log on the node that serves it.
pub struct Spread {
    parts: Vec<RedisStore>,
}

impl Spread {
    /// A spread log of `n` partitions on the cluster of `nodes`, which
    /// connects lazily; inside a Tokio runtime every partition starts
    /// following its feed and renewing its lease at once.
    pub fn clustered(nodes: &[String], prefix: &str, n: usize, lease: Duration) -> Result<Self> {
        let at = Endpoint {
            cluster: nodes.to_vec(),
            ..Endpoint::default()
        };
        let (base, stand_in) = cluster::reach(&at, &cluster::one_slot(prefix))?;
        let running = tokio::runtime::Handle::try_current().is_ok();
        Self::build(&base, &stand_in, prefix, n, lease, running)
    }

    /// The partitions, under one instance name and telling of sessions on
    /// one channel; `run` starts their feed listeners and lease renewals.
    fn build(
        base: &Cluster,
        stand_in: &redis::Client,
        prefix: &str,
        n: usize,
        lease: Duration,
        run: bool,
    ) -> Result<Self> {
        let instance = lease::new_instance();
        let news = broadcast::channel(1024).0;
        let mut parts = Vec::with_capacity(n);
        for tag in cluster::partition_prefixes(prefix, n) {
            let route = Route::clustered(base.part(&tag), stand_in.clone());
            let mut part = RedisStore::build(route, &tag, lease)?;
            part.instance = instance.clone();
            part.follow = Arc::new(Follow::telling(news.clone()));
            if run {
                part.start_tasks();
            }
            parts.push(part);
        }
        Ok(Self { parts })
    }

    /// Checks that the node of every partition answers.
    async fn probe(&self) -> Result<()> {
        for part in &self.parts {
            if let Some(answered) = part.probe_cluster().await {
                answered?;
            }
        }
        Ok(())
    }

    fn tuned(self, tuning: Tuning) -> Self {
        let parts = self.parts.into_iter();
        Self {
            parts: parts.map(|p| p.tuned(tuning)).collect(),
        }
    }

    /// The partition an id's first byte picks.
    /// The partition an id's first byte picks (as [`partition_of`] names
    /// it), by its place.
    fn index(&self, byte: u8) -> usize {
        usize::from(byte) % self.parts.len()
    }

    fn of_stream(&self, id: StreamId) -> &RedisStore {
        &self.parts[self.index(id.partition_byte())]
    }

    fn of_session(&self, id: SessionId) -> &RedisStore {
        &self.parts[self.index(id.partition_byte())]
    }

    fn of_task(&self, id: TaskId) -> &RedisStore {
        &self.parts[self.index(id.partition_byte())]
    }

    /// The partitions that hold a session's streams: its own, or every
    /// one for the tasks' pseudo-session.
    fn holding(&self, session: SessionId) -> &[RedisStore] {
        match session == SessionId::TASKS {
            true => &self.parts,
            false => std::slice::from_ref(self.of_session(session)),
        }
    }

    /// The partition a new stream goes to: its id's, which must be its
    /// session's (or, for a task leg, its task's), or the session would
    /// not find it.
    fn to_create(&self, meta: &StreamMeta) -> Result<&RedisStore> {
        let kin = match meta.task {
            Some(task) => task.partition_byte(),
            None => meta.session.partition_byte(),
        };
        match self.index(meta.id.partition_byte()) == self.index(kin) {
            true => Ok(self.of_stream(meta.id)),
            false => Err(StoreError::Backend(format!(
                "stream {} was not minted in its session's (or task's) partition",
                meta.id
            ))),
        }
    }
}

/// What `each` of `parts` answers, put together, asked at once.
async fn together<'a, T, F, Fut>(parts: &'a [RedisStore], each: F) -> Result<Vec<T>>
where
    F: Fn(&'a RedisStore) -> Fut,
    Fut: Future<Output = Result<Vec<T>>>,
{
    let answers = try_join_all(parts.iter().map(each)).await?;
    Ok(answers.into_iter().flatten().collect())
}

impl RedisStore {
    /// The store with what the server tunes.
    fn tuned(self, tuning: Tuning) -> Self {
        self.with_lifetimes(tuning.lifetimes)
            .with_replicas(tuning.replicas)
            .with_workers(tuning.workers)
    }
}

#[async_trait::async_trait]
impl Store for Spread {
    async fn put_session(&self, session: &SessionRecord) -> Result<()> {
        self.of_session(session.id).put_session(session).await
    }

    async fn get_session(&self, id: SessionId) -> Result<Option<SessionRecord>> {
        self.of_session(id).get_session(id).await
    }

    async fn list_sessions(&self) -> Result<Vec<SessionRecord>> {
        together(&self.parts, |p| p.list_sessions()).await
    }

    async fn sessions_idle_by(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        together(&self.parts, |p| {
            p.sessions_idle_by(seen_by_ms, closed_by_ms)
        })
        .await
    }

    async fn delete_session(&self, id: SessionId) -> Result<()> {
        self.of_session(id).delete_session(id).await
    }

    async fn create_with(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<()> {
        self.to_create(meta)?.create_with(meta, opening).await
    }

    async fn create_call(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<Option<Prior>> {
        self.to_create(meta)?.create_call(meta, opening).await
    }

    async fn stream_meta(&self, id: StreamId) -> Result<Option<StreamMeta>> {
        self.of_stream(id).stream_meta(id).await
    }

    async fn list_streams(&self) -> Result<Vec<StreamMeta>> {
        together(&self.parts, |p| p.list_streams()).await
    }

    async fn streams_of_session(&self, session: SessionId) -> Result<Vec<StreamMeta>> {
        together(self.holding(session), |p| p.streams_of_session(session)).await
    }

    async fn set_status(&self, id: StreamId, end: Finish) -> Result<()> {
        self.of_stream(id).set_status(id, end).await
    }

    async fn update_stream(&self, id: StreamId, change: Change) -> Result<()> {
        self.of_stream(id).update_stream(id, change).await
    }

    async fn delete_stream(&self, id: StreamId) -> Result<()> {
        self.of_stream(id).delete_stream(id).await
    }

    /// The tasks' pseudo-session is asked in every partition, the newest
    /// stream winning as in one.
    async fn stream_of_request(
        &self,
        session: SessionId,
        id: &RequestId,
    ) -> Result<Option<StreamId>> {
        if session != SessionId::TASKS {
            return self
                .of_session(session)
                .stream_of_request(session, id)
                .await;
        }
        let mut newest: Option<StreamMeta> = None;
        for part in &self.parts {
            let Some(stream) = part.stream_of_request(session, id).await? else {
                continue;
            };
            if let Some(meta) = part.stream_meta(stream).await? {
                if newest
                    .as_ref()
                    .is_none_or(|n| n.created_ms < meta.created_ms)
                {
                    newest = Some(meta);
                }
            }
        }
        Ok(newest.map(|m| m.id))
    }

    async fn abandoned_by(&self, now_ms: u64) -> Result<Vec<StreamId>> {
        together(&self.parts, |p| p.abandoned_by(now_ms)).await
    }

    async fn finished_by(&self, at_ms: u64) -> Result<Vec<StreamId>> {
        together(&self.parts, |p| p.finished_by(at_ms)).await
    }

    async fn write(&self, stream: StreamId, messages: &[Bytes], along: Along<'_>) -> Result<Seq> {
        self.of_stream(stream).write(stream, messages, along).await
    }

    async fn read_after(&self, stream: StreamId, after: Seq, limit: usize) -> Result<Vec<Entry>> {
        self.of_stream(stream)
            .read_after(stream, after, limit)
            .await
    }

    async fn subscribe(&self, stream: StreamId) -> Subscription {
        self.of_stream(stream).subscribe(stream).await
    }

    fn peek(&self, stream: StreamId) -> Option<Watermark> {
        self.of_stream(stream).peek(stream)
    }

    async fn put_task(&self, task: &TaskRecord) -> Result<()> {
        self.of_task(task.id).put_task(task).await
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        self.of_task(id).get_task(id).await
    }

    async fn update_task(&self, task: &TaskRecord) -> Result<bool> {
        self.of_task(task.id).update_task(task).await
    }

    async fn delete_task(&self, id: TaskId) -> Result<()> {
        self.of_task(id).delete_task(id).await
    }

    async fn tasks_expired_by(&self, now_ms: u64) -> Result<Vec<TaskId>> {
        together(&self.parts, |p| p.tasks_expired_by(now_ms)).await
    }

    fn size_on_disk(&self) -> u64 {
        0
    }

    async fn flush(&self) -> Result<()> {
        Ok(())
    }

    async fn orphans(&self) -> Result<Vec<StreamMeta>> {
        together(&self.parts, |p| p.orphans()).await
    }

    fn shared(&self) -> bool {
        true
    }

    /// Unready only while every partition is: a primary away takes its
    /// partitions' calls from every instance alike, and an instance
    /// pulled from its balancer for it would take the others' too. Those
    /// calls fail one by one meanwhile, and the outage is logged.
    fn health(&self) -> std::result::Result<(), String> {
        let mut first_away = None;
        for part in &self.parts {
            match part.health() {
                Ok(()) => return Ok(()),
                Err(why) => {
                    first_away.get_or_insert(why);
                }
            }
        }
        first_away.map_or(Ok(()), Err)
    }

    async fn hold_reader(&self, stream: StreamId) -> Result<ReaderLease> {
        self.of_stream(stream).hold_reader(stream).await
    }

    /// One channel, which every partition's feed listener tells on.
    fn session_changes(&self) -> Option<broadcast::Receiver<SessionNews>> {
        self.parts.first()?.session_changes()
    }

    async fn retire(&self) -> Result<()> {
        try_join_all(self.parts.iter().map(|p| p.retire())).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partition reaching no Redis, its lease (of no length) renewed
    /// last a moment ago when `away`, never when not (so well).
    fn partition(away: bool) -> RedisStore {
        let client = redis::Client::open("redis://127.0.0.1:9").unwrap();
        let part = RedisStore::build(Route::fixed(client), "p", Duration::ZERO).unwrap();
        if away {
            let _ = part.renewed.set(lease::Renewed::now());
        }
        part
    }

    #[tokio::test]
    async fn a_spread_log_is_unready_only_while_every_partition_is() {
        let some = Spread {
            parts: vec![partition(true), partition(false), partition(true)],
        };
        let every = Spread {
            parts: vec![partition(true), partition(true)],
        };
        std::thread::sleep(Duration::from_millis(5));
        assert!(some.parts[0].health().is_err());
        assert_eq!(some.health(), Ok(()));
        let why = every.health().unwrap_err();
        assert!(why.starts_with("redis unreachable for "), "{why}");
    }
}
