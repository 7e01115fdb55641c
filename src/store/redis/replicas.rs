//! Writes that survive a failover (`[store] min_replicas`): a write the
//! store answers with success is held by at least that many replicas. It
//! owns the Redis `WAIT` sent after each such write, the connections those
//! writes go on, and the error when too few replicas answered in time.
//!
//! Redis replicates asynchronously: its answer to a write says the primary
//! has it, and a primary that fails right after may take it along. `WAIT n
//! ms` answers how many replicas acknowledged every earlier write *of the
//! connection it is sent on*, so it follows its write in the same pipeline:
//! one request, one connection — a reconnection between the two would leave
//! it counting the writes of a fresh connection (none), a vacuous yes.
//!
//! Waited for: what a client is told exists or happened — a stream created,
//! an append, an ending, a session record, a task record. Not waited for:
//! the stream changes that commute (acks, touches, request marks: their
//! failure is only logged), the lease and the takeovers (their own
//! protocol), and deletions (one a failover loses brings back a session or
//! stream that the sweeps end or expire again).
//!
//! What waits is the answer to the write, not the entry: the primary shows
//! it at once. The writing instance's own readers are told of it only
//! from the answer (it reads no feed for the calls it writes), but the
//! script's feed line wakes readers on other instances before the `WAIT`
//! answered, and anyone may read the stream meanwhile. So what a stream
//! shows waits too: a read of its entries or its metadata is followed, in
//! the same pipeline, by an `INCR` of the prefix's `reads` key and a
//! `WAIT`. Redis replicates in the order it ran commands, so a replica
//! that acknowledged that `INCR` holds everything the read saw; the read
//! is answered once enough did, and fails otherwise, like a write (an
//! entry whose write failed is shown once the replicas hold it after all,
//! never before). One round trip still, longer by the wait for the
//! replicas; and while too few replicas answer, reads fail as writes do.
//!
//! With `min_replicas = 0` nothing here sends a command: the writes go as
//! they always did, on the worker's connection, without `WAIT`.
//!
//! `WAIT` holds the connection it is sent on until it answers (Redis runs a
//! connection's commands in order), so the waited writes have connections
//! of their own, one per worker, made on first use: reads, the lease
//! renewal and the feed go on as before while a write waits. A write fails
//! with a `Backend` error — the kind a store that is away gives, so that an
//! ending it refused is owed and written again later (`stream::Log::owe`).

use std::sync::OnceLock;
use std::time::Duration;

use redis::{ErrorKind, FromRedisValue, Pipeline, ScriptInvocation, ServerErrorKind, Value};

use super::record::backend;
use super::sentinel::Conn;
use super::{connection, RedisStore, RESPONSE_TIMEOUT};
use crate::store::{Result, StoreError};
use crate::workers::PerWorker;

/// How many times a waited write loads its script on a node that has not
/// got it (see [`RedisStore::run_write`]).
const SCRIPT_LOADS: u32 = 3;

/// How many replicas must acknowledge a write before the store answers it,
/// and how long a write waits for them (`[store] min_replicas`,
/// `replica_wait_ms`). `min: 0`, the default: the primary's answer is enough.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replicas {
    pub min: u32,
    pub wait: Duration,
}

impl Replicas {
    /// `WAIT` for these replicas, appended to `pipe`.
    fn wait_in(&self, pipe: &mut Pipeline) {
        let ms = u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX);
        pipe.cmd("WAIT").arg(self.min).arg(ms);
    }

    /// Whether `acked` replicas (`WAIT`'s answer) are enough for a write.
    fn check(&self, acked: i64) -> Result<()> {
        self.enough(acked, "written on the primary", "acknowledged")
    }

    /// Whether `acked` replicas are enough for what a read saw.
    fn check_read(&self, acked: i64) -> Result<()> {
        self.enough(acked, "read from the primary", "shown")
    }

    fn enough(&self, acked: i64, done: &str, not: &str) -> Result<()> {
        if acked >= i64::from(self.min) {
            return Ok(());
        }
        Err(StoreError::Backend(format!(
            "redis: {done} but acknowledged by only {acked} of {} replicas within {} ms \
             (store.min_replicas): not {not}, as a failover could lose it",
            self.min,
            self.wait.as_millis()
        )))
    }
}

/// The replicas a write waits for, and the connections waited writes go on.
pub(super) struct Waiting {
    replicas: Replicas,
    conns: PerWorker<OnceLock<Conn>>,
}

impl Waiting {
    /// Nothing to wait for yet; connections for `workers` workers, made
    /// when first used (so never, while there is nothing to wait for).
    pub(super) fn new(workers: usize) -> Self {
        Self {
            replicas: Replicas::default(),
            conns: PerWorker::new(workers, |_| OnceLock::new()),
        }
    }

    /// The same replicas, with connections for `workers` workers.
    pub(super) fn for_workers(&self, workers: usize) -> Self {
        Self {
            replicas: self.replicas,
            ..Self::new(workers)
        }
    }
}

/// Runs a script on `conn`, loading it where it is missing. redis-rs
/// loads a script once on `NOSCRIPT` and gives up if the second try meets
/// another node without it: on a cluster whose slot is moving, or failing
/// over, the load and the retry may each go to a different node. Each try
/// loads it where the last one went.
pub(super) async fn invoke<T: FromRedisValue>(
    invocation: &ScriptInvocation<'_>,
    conn: &mut Conn,
) -> Result<T> {
    let mut loads = 0;
    loop {
        match invocation.invoke_async(conn).await {
            Err(e)
                if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
                    && loads < SCRIPT_LOADS =>
            {
                loads += 1;
            }
            answered => return answered.map_err(backend),
        }
    }
}

impl RedisStore {
    /// Has each write a client is told of wait for `replicas` (see the
    /// module's doc); before the store is used.
    pub fn with_replicas(mut self, replicas: Replicas) -> Self {
        self.waiting.replicas = replicas;
        self
    }

    /// This worker's connection for waited writes. Its answers may take
    /// the wait longer than a command's.
    fn waited_conn(&self) -> Conn {
        let timeout = RESPONSE_TIMEOUT.saturating_add(self.waiting.replicas.wait);
        let own = self.waiting.conns.get().get_or_init(|| {
            // As `RedisStore::conn`: made on the worker, failing only on a
            // configuration the store already accepted.
            connection(&self.route, timeout).unwrap_or_else(|_| self.first.clone())
        });
        own.clone()
    }

    /// Runs a write script; with `min_replicas`, its `WAIT` follows in the
    /// same pipeline, and too few replicas make it fail.
    pub(super) async fn run_write<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let replicas = self.waiting.replicas;
        if replicas.min == 0 {
            return invoke(invocation, &mut self.conn()).await;
        }
        let mut conn = self.waited_conn();
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation);
        replicas.wait_in(&mut pipe);
        let mut loads = 0;
        let (answer, acked): (T, i64) = loop {
            match pipe.query_async(&mut conn).await {
                // A node that never ran the script wrote nothing: load it
                // there, then the same again. A primary restarted or
                // promoted by a failover needs one load; on a cluster the
                // client may still take the old primary, back as a
                // replica, for the slot's node: it is loaded there too,
                // its `READONLY` then has the client refresh its slot map,
                // and the new primary may need its own load.
                Err(e)
                    if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
                        && loads < SCRIPT_LOADS =>
                {
                    loads += 1;
                    invocation.load_async(&mut conn).await.map_err(backend)?;
                }
                answered => break answered.map_err(backend)?,
            }
        };
        replicas.check(acked)?;
        Ok(answer)
    }

    /// Runs the reads of `pipe` (each answering one value, none ignored);
    /// with `min_replicas`, answers only once that many replicas hold
    /// what they saw (see the module's doc).
    pub(super) async fn run_read<T: FromRedisValue>(&self, mut pipe: Pipeline) -> Result<T> {
        let replicas = self.waiting.replicas;
        if replicas.min == 0 {
            return pipe.query_async(&mut self.conn()).await.map_err(backend);
        }
        pipe.cmd("INCR").arg(self.global_key("reads")).ignore();
        replicas.wait_in(&mut pipe);
        let mut answers: Vec<Value> = pipe
            .query_async(&mut self.waited_conn())
            .await
            .map_err(backend)?;
        let acked = answers.pop().map(redis::from_redis_value::<i64>);
        replicas.check_read(acked.and_then(|a| a.ok()).unwrap_or(-1))?;
        redis::from_redis_value(Value::Array(answers)).map_err(backend)
    }

    /// Runs `transaction` (a `MULTI`/`EXEC` pipeline); with
    /// `min_replicas`, its `WAIT` follows in the same pipeline.
    pub(super) async fn run_transaction(&self, transaction: &Pipeline) -> Result<()> {
        let replicas = self.waiting.replicas;
        if replicas.min == 0 {
            return transaction
                .query_async::<()>(&mut self.conn())
                .await
                .map_err(backend);
        }
        // A `WAIT` inside `MULTI` answers at once, waiting for nothing: the
        // transaction is spelled out so that the `WAIT` comes after `EXEC`.
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI").ignore();
        for command in transaction.cmd_iter() {
            pipe.add_command(command.clone()).ignore();
        }
        pipe.cmd("EXEC");
        replicas.wait_in(&mut pipe);
        // An error inside `EXEC`'s answer fails the query, as it would the
        // atomic pipeline's.
        let (_, acked): (Value, i64) = pipe
            .query_async(&mut self.waited_conn())
            .await
            .map_err(backend)?;
        replicas.check(acked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(min: u32) -> Replicas {
        Replicas {
            min,
            wait: Duration::from_millis(250),
        }
    }

    #[test]
    fn too_few_replicas_fail_the_write_naming_them_and_the_wait() {
        let err = replicas(2).check(1).unwrap_err().to_string();
        assert!(
            err.contains("acknowledged by only 1 of 2 replicas within 250 ms"),
            "{err}"
        );
        assert!(matches!(replicas(2).check(-1), Err(StoreError::Backend(_))));
        assert!(replicas(2).check(2).is_ok());
        assert!(replicas(2).check(3).is_ok());
    }

    #[test]
    fn too_few_replicas_fail_a_read_saying_it_was_not_shown() {
        let err = replicas(1).check_read(0).unwrap_err().to_string();
        assert!(err.contains("read from the primary"), "{err}");
        assert!(
            err.contains("acknowledged by only 0 of 1 replicas within 250 ms"),
            "{err}"
        );
        assert!(err.contains("not shown"), "{err}");
        assert!(replicas(1).check_read(1).is_ok());
    }

    #[test]
    fn the_wait_is_one_command_with_the_count_and_the_milliseconds() {
        let mut pipe = redis::pipe();
        replicas(2).wait_in(&mut pipe);
        let packed = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        assert_eq!(packed, "*3\r\n$4\r\nWAIT\r\n$1\r\n2\r\n$3\r\n250\r\n");
    }
}
