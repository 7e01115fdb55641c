//! The private Redis Cluster of the `redis-cluster` pseudo sync mode:
//! three primaries without replicas, started and joined by the tests' own
//! rig (`tests/common/redis_cluster.rs`, `RedisCluster::start`: free
//! loopback ports, no persistence, ready once every node says
//! `cluster_state:ok` and knows the others). This file owns when it starts
//! (when the first proxy of that mode asks for its nodes, once per run),
//! the node timeout it measures with, its nodes' URLs (for `[store]
//! redis_cluster` and for reading each node's counters) and its stop, temp
//! dirs included. It must not start a cluster for anything else —
//! `--smoke`, `--check` and every run without `--sync redis-cluster` never
//! start one — nor outlive the harness: the nodes die with it
//! (`PR_SET_PDEATHSIG`, set by the rig) and [`stop`] removes their
//! directories.

use std::sync::Mutex;

use anyhow::{anyhow, Result};

use crate::redis_cluster::RedisCluster;
use crate::redis_server::connect;

/// Primaries: enough for the keys to spread, few enough for 2 cores.
const PRIMARIES: usize = 3;

/// The rig's nodes count a silent peer as failed after 1 s, so that the
/// tests' replicas take over soon. This cluster has no replica to take
/// over, and a node stalled that long on a busy machine would stop the
/// whole cluster (`CLUSTERDOWN`) mid-measurement: Redis's default instead.
const NODE_TIMEOUT_MS: u64 = 15_000;

/// The cluster once asked for: `None` until a proxy of the mode starts,
/// then the cluster or why it could not start (kept, so every later proxy
/// fails with the same line instead of trying again). Taken out and
/// dropped by [`stop`]: a static is never dropped, and the nodes alone
/// would go with the harness, leaving their temp dirs behind.
static CLUSTER: Mutex<Option<std::result::Result<RedisCluster, String>>> = Mutex::new(None);

/// The URLs of the cluster's nodes, `redis://127.0.0.1:PORT` (database 0,
/// as `[store] redis_cluster` wants them), starting it on first use.
pub fn node_urls() -> Result<Vec<String>> {
    let mut slot = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = slot
        .get_or_insert_with(start)
        .as_ref()
        .map_err(|why| anyhow!("the Redis Cluster: {why}"))?;
    Ok(cluster.urls())
}

/// Stops the cluster, if one was started, and removes its files.
pub fn stop() {
    drop(CLUSTER.lock().unwrap_or_else(|p| p.into_inner()).take());
}

/// [`PRIMARIES`] nodes, joined, with Redis' default node timeout.
fn start() -> std::result::Result<RedisCluster, String> {
    let cluster = RedisCluster::start(PRIMARIES, 0)?;
    for url in cluster.urls() {
        let mut conn = connect(&url)?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-node-timeout")
            .arg(NODE_TIMEOUT_MS)
            .query::<()>(&mut conn)
            .map_err(|e| format!("CONFIG SET cluster-node-timeout on {url}: {e}"))?;
    }
    Ok(cluster)
}
