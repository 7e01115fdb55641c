//! Redis Cluster (`[store] redis_cluster`): the log on a cluster of
//! primaries with replicas, reached through redis-rs' own cluster client,
//! which learns the slot map from the nodes listed and follows `MOVED`,
//! `ASK`, `TRYAGAIN` and `CLUSTERDOWN` itself (a resharding, a failover).
//! It owns the cluster key layout, the connections pinned to the prefix's
//! slot ([`Pinned`]) and the probe; it must not change the layout of a
//! store that is not on a cluster, whose keys existing deployments hold.
//!
//! Redis Cluster runs a script, a `MULTI`/`EXEC` or a pipeline only on keys
//! of one hash slot (`CROSSSLOT` otherwise), and a script may touch keys it
//! did not declare only if they are in the declared keys' slot. What each
//! step touches, with `P` the key prefix and `<s>` a stream id:
//!
//! | step | keys |
//! |---|---|
//! | create (`CREATE`) | the stream's `:stream`, `:log`; its session's `:requests`, `:streams`; a prior stream's `:stream`/`:meta` under the same request id; `abandon`, `finished`, `retention`, `instances`, the creator's `owned`; a leg's task |
//! | append (`APPEND`) | the stream's `:stream`, `:meta`, `:log`; `finished`, `retention`, the stream's `feed:<n>`; its owner's `owned` |
//! | change (`CHANGE`) | the stream's `:stream`, `:meta`; `abandon`, the stream's `feed:<n>` |
//! | delete (`DELETE`) | the stream's three keys; its session's `:streams`, `:requests`; `streams`, `abandon`, `finished`, `retention`, the stream's `feed:<n>`; its owner's `owned` |
//! | task (`TASK`) | the task's `:task`, `tasks`; each leg's `:stream`, `:meta`, `:log` |
//! | renew (`RENEW`) | `instances` |
//! | claim (`CLAIM`) | `instances`, every dead instance's `owned` and `claimed`, the claimer's; every stream those name |
//! | session writes (transactions) | the session's three keys, `sessions`, `sessions:seen`, `sessions:closed`, `feed` |
//! | reader claim | `feed` |
//! | starting a shard | its `feed:<n>`; the instance's `wake:<instance>` |
//! | the feed listener | `feed`, its `wake:<instance>`, the `feed:<n>` it reads; the metadata of the streams it follows |
//!
//! Create, delete and claim join keys of several streams and of a session
//! with the indexes that span streams: a layout of one slot per stream
//! (`{P:<s>}`, the layout on one server) splits them. Stream ids are random
//! and name no session, so the session a stream belongs to (and so its
//! slot) cannot be told from the id that every append carries.
//!
//! A store on a cluster therefore keeps its keys in one slot: a one-slot
//! prefix is the hash tag, `{P}`, and every key is `{P}:` then the key the
//! one-server layout names without its braces: `{P}:<s>:stream`,
//! `{P}:<s>:log`, `{P}:<session>:requests`, `{P}:<task>:task`, `{P}:feed`,
//! `{P}:owned:<instance>`, … Every step above is then on one slot, and
//! every command of the store is sent to the node that serves it
//! ([`Pinned`]), so that keyless commands (`WAIT`, `SCAN`, `SCRIPT LOAD`,
//! `PING`) go where the keys are. The cluster gives failover and
//! resharding of that slot. A log spread over the primaries
//! (`spread.rs`) is several such stores, one per partition, each under
//! its own one-slot prefix ([`partition_prefixes`]) and sharing the
//! connections; with one partition, the prefix is `{P}` itself, the
//! layout earlier versions wrote.
//!
//! While the slot moves to another primary, every script names a key
//! that is on neither node (`:meta`, which only the previous layout
//! writes), so Redis answers `TRYAGAIN` until the move ends, and the
//! client sends it again: writes wait for the move, none half-lands.
//! The client also sends a command again by itself when the connection it
//! went on broke (a primary killed): the old primary may have run it. An
//! append carries a name so that the script applies it once (`write.rs`);
//! the other scripts are idempotent, but for a task's compare-and-set,
//! which a second run refuses (the caller reads the task again). The
//! client's retries are counted, and a primary killed spends them in well
//! under a second, long before a replica takes over: the store's
//! connections send a command again until the new primary answers, for up
//! to 30 s (`outage.rs`), so that a write in a failover lands on the new
//! primary once — applied there, or found there already by its name —
//! and, with `min_replicas`, is answered only once a replica of the new
//! primary holds it.
//!
//! The one-slot prefix is the configured `key_prefix` in braces; since the
//! configuration refuses braces in `key_prefix`, a prefix that starts with
//! one is a cluster's, and [`tag`] (and the scripts' `tag`) read the layout
//! from it. The two layouts never meet: a cluster starts empty.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route as SlotRoute, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::endpoint::{self, Endpoint};
use super::outage::{self, Outage, FAILOVER_WAIT};
use super::RedisStore;
use crate::store::{Result, StoreError};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the client sends a command again after a redirection, a
/// `TRYAGAIN` or a node gone, before it gives the error back (to
/// `outage.rs`, which waits out a failover, see [`reach`]).
const RETRIES: u32 = 20;
/// How long the probe waits for the prefix's node to answer: the client
/// tries the listed nodes, and again, before it gives up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The key prefix a store on a cluster uses: `prefix` as the hash tag.
pub(super) fn one_slot(prefix: &str) -> String {
    format!("{{{prefix}}}")
}

/// The prefix the keys of a store at `at` start with: on a cluster, the
/// configured one as a hash tag.
pub(super) fn laid_out(at: &Endpoint, prefix: &str) -> String {
    match at.cluster.is_empty() {
        true => prefix.to_owned(),
        false => one_slot(prefix),
    }
}

/// Hash slots in a cluster.
const SLOTS: usize = 16_384;

/// The slot of the keys tagged `{tag}`: CRC16 (XMODEM) of the tag, as
/// every Redis Cluster computes it.
fn slot_of_tag(tag: &str) -> usize {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) as usize % SLOTS
}

/// The one-slot prefixes of a log spread over `n` partitions
/// (`spread.rs`): [`one_slot`] of `prefix` alone for one (the layout of
/// one slot, which earlier versions wrote), else `{P:<k>.<salt>}` for
/// each partition `k`, with the first salt that puts its slot in the
/// `k`-th of `n` equal runs of slots. `redis-cli --cluster create`, like
/// most managed clusters, gives each primary one run of slots, so the
/// partitions spread evenly over the primaries, not as their names happen
/// to hash (16 names hashed at random leave a primary of three with 8 or
/// more about one time in ten).
pub(super) fn partition_prefixes(prefix: &str, n: usize) -> Vec<String> {
    if n <= 1 {
        return vec![one_slot(prefix)];
    }
    (0..n)
        .map(|k| {
            let in_run = |tag: &String| slot_of_tag(tag) * n / SLOTS == k;
            let tag = (0u32..)
                .map(|salt| format!("{prefix}:{k}.{salt}"))
                .find(in_run)
                .unwrap_or_else(|| format!("{prefix}:{k}"));
            one_slot(&tag)
        })
        .collect()
}

/// Whether `prefix` is a cluster's ([`one_slot`]).
pub(super) fn is_one_slot(prefix: &str) -> bool {
    prefix.starts_with('{')
}

/// The start of the keys of stream, session or task `id`: `{P:<id>}` on
/// one server, `{P}:<id>` on a cluster.
pub(super) fn tag(prefix: &str, id: impl Display) -> String {
    match is_one_slot(prefix) {
        true => format!("{prefix}:{id}"),
        false => format!("{{{prefix}:{id}}}"),
    }
}

/// What stands around an id in its `what` key (see [`tag`]), for reading
/// ids back out of keys.
pub(super) fn around_id(prefix: &str, what: &str) -> (String, String) {
    match is_one_slot(prefix) {
        true => (format!("{prefix}:"), format!(":{what}")),
        false => (format!("{{{prefix}:"), format!("}}:{what}")),
    }
}

/// The cluster the store is on, and the slot its keys are in.
pub(super) struct Cluster {
    client: ClusterClient,
    home: SlotRoute,
    /// The nodes listed, for messages.
    listed: Arc<str>,
    /// Each listed node on its own, reached as the cluster's are: only
    /// to say why the probe found none (the cluster client says only that
    /// it has no connection).
    nodes: Vec<redis::Client>,
    /// The slot's node away, shared by every connection (`outage.rs`).
    outage: Arc<Outage>,
    /// The connections [`Cluster::connect`] made, by thread and timeout,
    /// shared by every partition of a spread log (`spread.rs`): a cluster
    /// connection reaches every node, so a partition needs none of its own.
    made: Arc<Made>,
}

/// Cluster connections by the thread they were made on (whose runtime
/// drives them) and their timeout.
type Made = std::sync::Mutex<Vec<(std::thread::ThreadId, Duration, ClusterConnection)>>;

impl Cluster {
    /// Connections made from `client` for the keys of (one-slot) `prefix`.
    fn new(client: ClusterClient, prefix: &str, listed: String, nodes: Vec<redis::Client>) -> Self {
        Self {
            client,
            home: SlotRoute::with_key(prefix.as_bytes(), SlotAddr::Master),
            listed: listed.into(),
            nodes,
            outage: Arc::default(),
            made: Arc::default(),
        }
    }

    /// The same cluster, for the keys of (one-slot) `prefix`, another
    /// partition of a spread log: its own slot and outage, the
    /// connections of every partition.
    pub fn part(&self, prefix: &str) -> Self {
        Self {
            client: self.client.clone(),
            home: SlotRoute::with_key(prefix.as_bytes(), SlotAddr::Master),
            listed: self.listed.clone(),
            nodes: self.nodes.clone(),
            outage: Arc::default(),
            made: self.made.clone(),
        }
    }

    /// A connection of its own that connects on first use, failing a
    /// command not answered within `timeout`; a command that fails as a
    /// failover makes it fail is sent again until the new primary answers
    /// it, for up to [`FAILOVER_WAIT`] (`outage.rs`). Made on the Tokio
    /// runtime that is to drive it.
    /// This thread's connection of that timeout is shared with the other
    /// partitions of a spread log.
    pub fn connect(&self, timeout: Duration) -> Pinned {
        let thread = std::thread::current().id();
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        let found = made.iter().find(|(t, d, _)| *t == thread && *d == timeout);
        let conn = match found {
            Some((_, _, conn)) => conn.clone(),
            None => {
                let conn = self.connection(timeout);
                made.push((thread, timeout, conn.clone()));
                conn
            }
        };
        Pinned {
            conn,
            home: self.home,
            wait: Some(FAILOVER_WAIT.saturating_add(timeout)),
            outage: self.outage.clone(),
            listed: self.listed.clone(),
        }
    }

    /// The same, failing a command as soon as the cluster client gives up
    /// on it: for the probe, which says why at once, and the live feed,
    /// which reconnects by itself. Never shared: the feed's blocking read
    /// must not hold up anyone's commands.
    pub fn connect_direct(&self, timeout: Duration) -> Pinned {
        Pinned {
            conn: self.connection(timeout),
            home: self.home,
            wait: None,
            outage: self.outage.clone(),
            listed: self.listed.clone(),
        }
    }

    fn connection(&self, timeout: Duration) -> ClusterConnection {
        let config = ClusterConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(timeout);
        self.client.get_pending_async_connection_with_config(config)
    }

    /// Why the slot's node is away, while commands wait for a failover.
    pub fn failing(&self) -> Option<String> {
        self.outage.failing()
    }

    /// Checks that the node serving the prefix's slot answers.
    pub(super) async fn probe(&self) -> Result<()> {
        let mut conn = self.connect_direct(CONNECT_TIMEOUT);
        let ping = redis::cmd("PING");
        let ping = ping.query_async::<String>(&mut conn);
        let silent = |why: String| {
            StoreError::Backend(format!(
                "redis cluster at {} does not answer: {why}",
                self.listed
            ))
        };
        let why = match tokio::time::timeout(PROBE_TIMEOUT, ping).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        match self.first_refusal().await {
            Some(node) => Err(silent(format!("{why}; {node}"))),
            None => Err(silent(why)),
        }
    }

    /// Why the first listed node that refuses a connection of its own
    /// does: a certificate that does not verify, a wrong password, … which
    /// the cluster client keeps to itself.
    async fn first_refusal(&self) -> Option<String> {
        for node in &self.nodes {
            let at = node.get_connection_info().addr().to_string();
            let ping = async {
                let mut conn = node.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            };
            match tokio::time::timeout(CONNECT_TIMEOUT, ping).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Some(format!("{at}: {e}")),
                Err(_) => return Some(format!("{at}: no answer within {CONNECT_TIMEOUT:?}")),
            }
        }
        None
    }
}

/// A cluster connection whose every command and pipeline goes to the node
/// serving the prefix's slot (redirected as the cluster says), waiting out
/// a failover when `wait` says for how long.
#[derive(Clone)]
pub(crate) struct Pinned {
    conn: ClusterConnection,
    home: SlotRoute,
    wait: Option<Duration>,
    outage: Arc<Outage>,
    listed: Arc<str>,
}

impl Pinned {
    /// Sends what `send` makes on the connection, once or until a failover
    /// ended (see [`Cluster::connect`]).
    async fn send<T, Fut>(&self, send: impl Fn(ClusterConnection) -> Fut) -> RedisResult<T>
    where
        Fut: Future<Output = RedisResult<T>>,
    {
        match self.wait {
            None => send(self.conn.clone()).await,
            Some(wait) => {
                let again = || send(self.conn.clone());
                outage::wait_out(&self.outage, &self.listed, wait, again).await
            }
        }
    }
}

impl ConnectionLike for Pinned {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(self.home));
        Box::pin(self.send(move |mut conn| {
            let (cmd, to) = (cmd.clone(), to.clone());
            async move { conn.route_command(cmd, to).await }
        }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let to = SingleNodeRoutingInfo::SpecificNode(self.home);
        Box::pin(self.send(move |mut conn| {
            let (pipe, to) = (pipe.clone(), to.clone());
            async move { conn.route_pipeline(pipe, offset, count, to).await }
        }))
    }

    /// A cluster has database 0 only.
    fn get_db(&self) -> i64 {
        0
    }
}

/// The cluster `store` lists, for the keys of (one-slot) `prefix`, and the
/// plain client that stands in where a route needs one.
pub(super) fn reach(store: &Endpoint, prefix: &str) -> Result<(Cluster, redis::Client)> {
    let listed = store.cluster.join(", ");
    let refused = |e: redis::RedisError| {
        StoreError::Backend(format!("store.redis_cluster = [{listed}]: {e}"))
    };
    // A slot that moves answers `TRYAGAIN` to the scripts (their keys are
    // on both nodes meanwhile): retried after a random wait of 20 ms up to
    // a bound that doubles from 20 ms to 3 s (the client's default waits
    // 1.3 s before a first retry). A failover is waited out by time, not
    // by these counted retries, which a node gone spends at once
    // (`outage.rs`).
    let mut builder = ClusterClientBuilder::new(store.cluster.iter().map(String::as_str))
        .connection_timeout(CONNECT_TIMEOUT)
        .retries(RETRIES)
        .min_retry_wait(20)
        .max_retry_wait(3_000);
    if let Some(user) = &store.username {
        builder = builder.username(user);
    }
    if let Some(password) = endpoint::password(store)? {
        builder = builder.password(password);
    }
    if store.cluster.iter().any(|u| u.starts_with("rediss://")) {
        builder = builder.certs(endpoint::certificates(store)?);
    }
    let client = builder.build().map_err(refused)?;
    let nodes = store
        .cluster
        .iter()
        .map(|url| {
            let one = Endpoint {
                url: url.clone(),
                cluster: Vec::new(),
                ..store.clone()
            };
            endpoint::client(&one)
        })
        .collect::<Result<Vec<_>>>()?;
    // Never connected through: the cluster's connections are `Pinned`.
    let first = store.cluster.first().map_or("", String::as_str);
    let stand_in = redis::Client::open(first).map_err(refused)?;
    Ok((Cluster::new(client, prefix, listed, nodes), stand_in))
}

impl RedisStore {
    /// Checks the cluster answers, when the store is on one.
    pub(super) async fn probe_cluster(&self) -> Option<Result<()>> {
        Some(self.route.cluster()?.probe().await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_keys_share_the_prefix_as_their_hash_tag_and_one_servers_do_not() {
        let cluster = one_slot("p");
        assert_eq!(tag(&cluster, "s1"), "{p}:s1");
        assert_eq!(tag("p", "s1"), "{p:s1}");
        let (head, tail) = around_id(&cluster, "stream");
        assert_eq!(
            format!("{head}s1{tail}"),
            format!("{}:stream", tag(&cluster, "s1"))
        );
        let (head, tail) = around_id("p", "stream");
        assert_eq!(
            format!("{head}s1{tail}"),
            format!("{}:stream", tag("p", "s1"))
        );
    }

    #[test]
    fn sixteen_partitions_fall_five_or_six_on_each_of_three_primaries() {
        let slot = |tag: &str| SlotRoute::with_key(tag.as_bytes(), SlotAddr::Master);
        let tags = partition_prefixes("mcp-resume-proxy", 16);
        assert_eq!(tags.len(), 16);
        assert_eq!(tags[3], "{mcp-resume-proxy:3.2}", "README's example");
        let mut on = [0; 3];
        for (k, tag) in tags.iter().enumerate() {
            let inner = tag.trim_start_matches('{').trim_end_matches('}');
            let number = slot_of_tag(inner);
            assert_eq!(number * 16 / SLOTS, k, "{tag}");
            // The slot redis-rs routes the tag's keys by is that one.
            assert_eq!(slot(tag), slot(&format!("{tag}:feed")));
            // `redis-cli --cluster create` gives three primaries a third each.
            on[number * 3 / SLOTS] += 1;
        }
        assert!(on.iter().all(|n| (5..=6).contains(n)), "{on:?}");
        let distinct: std::collections::HashSet<_> = tags.iter().map(|t| slot(t)).collect();
        assert_eq!(distinct.len(), 16);
    }

    #[test]
    fn one_partition_is_the_layout_of_one_slot() {
        assert_eq!(partition_prefixes("p", 1), vec![one_slot("p")]);
    }

    #[test]
    fn every_key_of_a_cluster_prefix_hashes_to_one_slot() {
        let prefix = one_slot("mcp-resume-proxy");
        let slot = |key: &str| SlotRoute::with_key(key.as_bytes(), SlotAddr::Master);
        let home = slot(&prefix);
        for key in [
            format!("{}:stream", tag(&prefix, crate::id::StreamId::random())),
            format!("{}:requests", tag(&prefix, crate::id::SessionId::random())),
            format!("{prefix}:feed"),
            format!("{prefix}:feed:15"),
            format!("{prefix}:wake:1-ab"),
            format!("{prefix}:owned:1-ab"),
        ] {
            assert_eq!(slot(&key), home, "{key}");
        }
        let one_server = [tag("p", "a"), tag("p", "b")].map(|k| slot(&k));
        assert_ne!(one_server[0], one_server[1]);
    }
}
