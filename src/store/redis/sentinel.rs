//! Where the primary is: one fixed server (`redis_url`), or the primary
//! Redis Sentinel names for `redis_sentinel_master` now ([`Route`]), and the
//! connections that follow it across a failover ([`Conn`]).
//!
//! It owns the resolution — redis-rs' own (`SENTINEL MASTERS` through each
//! sentinel in turn, then `ROLE` on the node named, which must say it is the
//! primary) — and when to do it again: on a connection that failed or was
//! refused, and on a `READONLY` (or `LOADING`, `MASTERDOWN`) answer, which a
//! demoted or restarting node gives. Each resolution is bounded by
//! [`FAILOVER_WAIT`] and said in the log. It must not decide what a failed
//! write means for a stream (`write.rs` does): it retries only what cannot
//! have run — a command refused before it ran, one never sent (no
//! connection), or a read — and gives a write that the old primary may have
//! run without answering back as [`unanswered`], for the caller to settle.
//! With a fixed server nothing here changes how commands go: no retry, the
//! connection manager's own reconnection. On a cluster (`cluster.rs`) the
//! cluster client finds the primaries and follows them itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};
use tokio::time::Instant;

use super::cluster::{Cluster, Pinned};
use crate::store::{Result, StoreError};

/// How long a command waits for the sentinels to name a primary that
/// answers, after the one it was sent to went away: a failover takes the
/// sentinels' `down-after-milliseconds` plus an election.
pub const FAILOVER_WAIT: Duration = Duration::from_secs(30);
/// How long one round of asking the sentinels may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The description of [`unanswered`]'s error.
const UNANSWERED: &str = "the Redis primary went away before answering a write";

/// The sentinels and the name of the primary they watch.
pub(super) struct Sentinels {
    /// One client per sentinel, each asking them all but starting from its
    /// own: redis-rs takes the answers in the order it was given, so a
    /// sentinel that accepts and never answers would hold up every round
    /// that starts with it. Rounds take turns.
    clients: Vec<tokio::sync::Mutex<SentinelClient>>,
    next: AtomicUsize,
    master: String,
    /// The sentinels' addresses, for messages.
    listed: String,
}

impl Sentinels {
    pub fn new(builders: Vec<SentinelClientBuilder>, master: &str, listed: String) -> Result<Self> {
        let clients = builders
            .into_iter()
            .map(|b| b.build().map(tokio::sync::Mutex::new))
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(|e| StoreError::Backend(format!("store.redis_sentinels = {listed}: {e}")))?;
        Ok(Self {
            clients,
            next: AtomicUsize::new(0),
            master: master.to_owned(),
            listed,
        })
    }

    /// A builder for each turn of `sentinels`' addresses (see
    /// [`Sentinels::clients`]), with the primary's name and type.
    pub fn builders(
        sentinels: &[String],
        master: &str,
    ) -> Result<(Vec<SentinelClientBuilder>, String)> {
        let mut addrs = Vec::new();
        for url in sentinels {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|e| StoreError::Backend(format!("store.redis_sentinels: {url}: {e}")))?;
            addrs.push(info.addr().clone());
        }
        let listed = addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let mut builders = Vec::new();
        for turn in 0..addrs.len() {
            let mut turned = addrs.clone();
            turned.rotate_left(turn);
            let builder = SentinelClientBuilder::new(turned, master, SentinelServerType::Master)
                .map_err(|e| {
                    StoreError::Backend(format!("store.redis_sentinels = {listed}: {e}"))
                })?;
            builders.push(builder);
        }
        Ok((builders, listed))
    }

    /// One round: the primary's client, or why none.
    async fn ask(&self) -> std::result::Result<redis::Client, String> {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len().max(1);
        let Some(client) = self.clients.get(turn) else {
            return Err("no sentinels to ask".into());
        };
        let mut client = client.lock().await;
        match tokio::time::timeout(ASK_TIMEOUT, client.async_get_client()).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(format!(
                "no primary named {:?} through the sentinels {}: {e}",
                self.master, self.listed
            )),
            Err(_) => Err(format!(
                "the sentinels {} named no primary {:?} within {ASK_TIMEOUT:?}",
                self.listed, self.master
            )),
        }
    }

    /// Asks once in each turn, until one names a primary.
    async fn ask_each(&self) -> std::result::Result<redis::Client, String> {
        let mut why = String::from("no sentinels to ask");
        for _ in 0..self.clients.len() {
            match self.ask().await {
                Ok(client) => return Ok(client),
                Err(e) => why = e,
            }
        }
        Err(why)
    }
}

/// The primary commands go to now; a new generation after each resolution.
pub(super) struct Target {
    pub generation: u64,
    pub client: redis::Client,
}

/// Where the store's connections go.
pub(super) struct Route {
    sentinels: Option<Sentinels>,
    /// On a cluster, what its connections are made from; `now` then holds
    /// a client nothing connects through.
    cluster: Option<Cluster>,
    now: Mutex<Arc<Target>>,
    /// One resolution at a time: the commands that failed together wait
    /// for the same one.
    resolving: tokio::sync::Mutex<()>,
    /// Why the last resolution failed, until one succeeds (for readiness).
    failing: Mutex<Option<String>>,
}

impl Route {
    /// Always `client`.
    pub fn fixed(client: redis::Client) -> Self {
        Self::with(None, client)
    }

    /// The primary the sentinels name now; an error saying why when none
    /// does in a round from each (the store is not opened).
    pub async fn through(sentinels: Sentinels) -> Result<Self> {
        let client = sentinels.ask_each().await.map_err(StoreError::Backend)?;
        tracing::info!(
            primary = %client.get_connection_info().addr(),
            master = %sentinels.master,
            "the sentinels name the Redis primary"
        );
        Ok(Self::with(Some(sentinels), client))
    }

    /// The cluster's connections; `stand_in` is never connected through.
    pub fn clustered(cluster: Cluster, stand_in: redis::Client) -> Self {
        Self {
            cluster: Some(cluster),
            ..Self::with(None, stand_in)
        }
    }

    fn with(sentinels: Option<Sentinels>, client: redis::Client) -> Self {
        Self {
            sentinels,
            cluster: None,
            now: Mutex::new(Arc::new(Target {
                generation: 0,
                client,
            })),
            resolving: tokio::sync::Mutex::new(()),
            failing: Mutex::new(None),
        }
    }

    pub fn now(&self) -> Arc<Target> {
        self.now.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn follows(&self) -> bool {
        self.sentinels.is_some()
    }

    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// A connection of its own to the primary (the feed's, whose blocking
    /// reads must hold up no other command), failing a command not
    /// answered within `timeout`.
    pub async fn dedicated(&self, timeout: Duration) -> redis::RedisResult<Conn> {
        if let Some(cluster) = &self.cluster {
            return Ok(Conn::Cluster(cluster.connect_direct(timeout)));
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(timeout));
        let client = self.now().client.clone();
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(Conn::Direct(conn))
    }

    /// Why the primary cannot be found (or, on a cluster, the slot's node
    /// is away), while it cannot.
    pub fn failing(&self) -> Option<String> {
        if let Some(cluster) = &self.cluster {
            return cluster.failing();
        }
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Asks the sentinels again, since generation `seen` failed, until they
    /// name a primary that answers or `until`; a resolution made by another
    /// caller meanwhile is taken as it is.
    pub async fn follow(&self, seen: u64, until: Instant) -> std::result::Result<(), String> {
        let Some(sentinels) = &self.sentinels else {
            return Err("no sentinels to ask".into());
        };
        let _one = self.resolving.lock().await;
        if self.now().generation != seen {
            return Ok(());
        }
        let mut pause = Duration::from_millis(50);
        loop {
            let why = match sentinels.ask().await {
                Ok(client) => {
                    self.found(seen, client);
                    return Ok(());
                }
                Err(why) => why,
            };
            let first = self
                .failing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replace(why.clone())
                .is_none();
            if Instant::now() + pause >= until {
                return Err(why);
            }
            // Said once per outage; a failover takes a few rounds.
            if first {
                tracing::warn!(error = %why, "the Redis primary is away; asking the sentinels again");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    fn found(&self, seen: u64, client: redis::Client) {
        tracing::warn!(
            primary = %client.get_connection_info().addr(),
            master = self.sentinels.as_ref().map_or("", |s| s.master.as_str()),
            "following the Redis primary the sentinels name now"
        );
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(Target {
            generation: seen + 1,
            client,
        });
    }
}

/// What a failed command says about the primary it was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sign {
    /// Not a sign of a failover: the error as it is.
    None,
    /// The node refused it before running it, or it was never sent.
    NotRun,
    /// It may have run: the connection broke or timed out after it was sent.
    MayHaveRun,
}

fn sign(e: &RedisError) -> Sign {
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::ReadOnly | ServerErrorKind::BusyLoading | ServerErrorKind::MasterDown,
        ) => Sign::NotRun,
        // A transaction a replica refused: its commands were queued, never run.
        ErrorKind::Server(ServerErrorKind::ExecAbort) if e.to_string().contains("READONLY") => {
            Sign::NotRun
        }
        _ if e.is_connection_refusal() => Sign::NotRun,
        _ if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => Sign::MayHaveRun,
        _ => Sign::None,
    }
}

/// The error of a write the old primary may have run without answering.
fn unanswered(e: &RedisError) -> RedisError {
    RedisError::from((ErrorKind::Io, UNANSWERED, e.to_string()))
}

/// Whether a store error's message is [`unanswered`]'s: the write may or
/// may not be in the log.
pub(super) fn unanswered_message(message: &str) -> bool {
    message.contains(UNANSWERED)
}

/// Commands that only read: sent again after any failure.
fn reads(name: &[u8]) -> bool {
    const READS: &[&[u8]] = &[
        b"GET",
        b"MGET",
        b"HGET",
        b"HMGET",
        b"HGETALL",
        b"SMEMBERS",
        b"SCARD",
        b"SISMEMBER",
        b"ZRANGE",
        b"ZRANGEBYSCORE",
        b"ZSCORE",
        b"ZCARD",
        b"XRANGE",
        b"XREVRANGE",
        b"XREAD",
        b"XLEN",
        b"EXISTS",
        b"PTTL",
        b"TTL",
        b"TYPE",
        b"PING",
        b"ROLE",
    ];
    READS.iter().any(|r| r.eq_ignore_ascii_case(name))
}

fn cmd_reads(cmd: &Cmd) -> bool {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => reads(name),
        _ => false,
    }
}

/// A connection to the route's primary, one per worker (or purpose). On a
/// fixed route, the connection manager as it is; on the sentinels', one
/// that follows the primary: after a resolution its next command goes to
/// the new one; on a cluster, one pinned to the prefix's slot. `Direct`:
/// one connection, as made, that fails once it breaks ([`Route::dedicated`]).
#[derive(Clone)]
pub(crate) enum Conn {
    Fixed(ConnectionManager),
    Following { route: Arc<Route>, held: Arc<Held> },
    Cluster(Pinned),
    Direct(MultiplexedConnection),
}

pub(crate) struct Held {
    timeout: Duration,
    /// The generation the manager was made for, and the manager.
    conn: Mutex<(u64, ConnectionManager)>,
}

impl Conn {
    /// A connection to `route`'s primary that connects on first use,
    /// failing a command not answered within `timeout`.
    pub(super) fn new(route: Arc<Route>, timeout: Duration) -> Result<Self> {
        if let Some(cluster) = route.cluster() {
            return Ok(Self::Cluster(cluster.connect(timeout)));
        }
        let target = route.now();
        let manager = manager(&route, &target.client, timeout)?;
        if !route.follows() {
            return Ok(Self::Fixed(manager));
        }
        let held = Arc::new(Held {
            timeout,
            conn: Mutex::new((target.generation, manager)),
        });
        Ok(Self::Following { route, held })
    }
}

impl Held {
    /// The manager for `route`'s primary now, and its generation.
    fn current(&self, route: &Route) -> std::result::Result<(u64, ConnectionManager), RedisError> {
        let target = route.now();
        let mut held = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if held.0 != target.generation {
            let made = manager(route, &target.client, self.timeout)
                .map_err(|e| RedisError::from((ErrorKind::Io, "redis", e.to_string())))?;
            *held = (target.generation, made);
        }
        Ok(held.clone())
    }

    /// Sends `request` until it is answered, or fails with no sign of a
    /// failover, or a resolution fails; `reads`: sending it twice is
    /// harmless.
    async fn run(
        &self,
        route: &Route,
        reads: bool,
        request: Request<'_>,
    ) -> redis::RedisResult<Answer> {
        let until = Instant::now() + FAILOVER_WAIT;
        loop {
            let (generation, mut conn) = self.current(route)?;
            let e = match request.send(&mut conn).await {
                Ok(answer) => return Ok(answer),
                Err(e) => e,
            };
            let sign = sign(&e);
            if sign == Sign::None || Instant::now() >= until {
                return Err(e);
            }
            if sign == Sign::NotRun {
                // A node still loading, or one the sentinels name before
                // it turned primary: not asked again at once.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            route
                .follow(generation, until)
                .await
                .map_err(|why| RedisError::from((ErrorKind::Io, "redis", why)))?;
            if sign == Sign::MayHaveRun && !reads {
                return Err(unanswered(&e));
            }
        }
    }
}

/// A connection manager for `client`; in a route that follows the
/// sentinels, it gives up on a node quickly, since the route asks the
/// sentinels where to go instead.
fn manager(route: &Route, client: &redis::Client, timeout: Duration) -> Result<ConnectionManager> {
    let mut config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(CONNECT_TIMEOUT));
    if route.follows() {
        config = config.set_number_of_retries(0);
    }
    ConnectionManager::new_lazy_with_config(client.clone(), config)
        .map_err(|e| StoreError::Backend(e.to_string()))
}

/// What a [`Conn`] sends.
#[derive(Clone, Copy)]
enum Request<'a> {
    One(&'a Cmd),
    Pipeline(&'a Pipeline, usize, usize),
}

enum Answer {
    One(Value),
    Many(Vec<Value>),
}

impl Request<'_> {
    async fn send(self, conn: &mut ConnectionManager) -> redis::RedisResult<Answer> {
        match self {
            Request::One(cmd) => conn.req_packed_command(cmd).await.map(Answer::One),
            Request::Pipeline(pipe, offset, count) => conn
                .req_packed_commands(pipe, offset, count)
                .await
                .map(Answer::Many),
        }
    }
}

/// The answer of the other shape than asked: never, as `Request::send`
/// answers each request in its own.
fn mismatched() -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "redis",
        "an answer of the wrong shape".into(),
    ))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let (route, held) = match self {
            Conn::Fixed(manager) => return manager.req_packed_command(cmd),
            Conn::Cluster(pinned) => return pinned.req_packed_command(cmd),
            Conn::Direct(conn) => return conn.req_packed_command(cmd),
            Conn::Following { route, held } => (route, held),
        };
        let reads = cmd_reads(cmd);
        Box::pin(async move {
            match held.run(route, reads, Request::One(cmd)).await? {
                Answer::One(value) => Ok(value),
                Answer::Many(_) => Err(mismatched()),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let (route, held) = match self {
            Conn::Fixed(manager) => return manager.req_packed_commands(cmd, offset, count),
            Conn::Cluster(pinned) => return pinned.req_packed_commands(cmd, offset, count),
            Conn::Direct(conn) => return conn.req_packed_commands(cmd, offset, count),
            Conn::Following { route, held } => (route, held),
        };
        let reads = cmd.cmd_iter().all(cmd_reads);
        Box::pin(async move {
            match held
                .run(route, reads, Request::Pipeline(cmd, offset, count))
                .await?
            {
                Answer::Many(values) => Ok(values),
                Answer::One(_) => Err(mismatched()),
            }
        })
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Fixed(manager) => manager.get_db(),
            Conn::Cluster(pinned) => pinned.get_db(),
            Conn::Direct(conn) => conn.get_db(),
            Conn::Following { route, .. } => route
                .now()
                .client
                .get_connection_info()
                .redis_settings()
                .db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str) -> RedisError {
        let reply = format!("-{code} something\r\n");
        let parsed = redis::parse_redis_value(reply.as_bytes()).expect("an error reply");
        match parsed {
            Value::ServerError(e) => e.into(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_replica_refusing_a_write_is_a_failover_that_ran_nothing() {
        assert_eq!(sign(&server("READONLY")), Sign::NotRun);
        assert_eq!(sign(&server("LOADING")), Sign::NotRun);
        assert_eq!(sign(&server("MASTERDOWN")), Sign::NotRun);
        assert_eq!(sign(&server("WRONGTYPE")), Sign::None);
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(sign(&refused), Sign::NotRun);
    }

    #[test]
    fn a_connection_cut_after_sending_may_have_run_the_write() {
        let cut = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(sign(&cut), Sign::MayHaveRun);
        let unanswered = unanswered(&cut).to_string();
        assert!(unanswered_message(&unanswered), "{unanswered}");
        assert!(!unanswered_message(&cut.to_string()));
    }

    #[test]
    fn only_reads_are_sent_again_after_a_cut() {
        assert!(cmd_reads(redis::cmd("XRANGE").arg("k")));
        assert!(cmd_reads(redis::cmd("get").arg("k")));
        assert!(!cmd_reads(redis::cmd("EVALSHA").arg("abc")));
        assert!(!cmd_reads(redis::cmd("SET").arg("k")));
    }
}
