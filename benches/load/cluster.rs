//! The private Redis Cluster of the `redis-cluster` pseudo sync mode:
//! three primaries without replicas, `redis-server --cluster-enabled` on
//! free loopback ports without persistence (the nodes the tests' rig
//! starts, `RedisServer::start_cluster_node`, each in its own temp dir),
//! joined by `redis-cli --cluster create` and ready once every node says
//! `cluster_state:ok` and knows the others. This file owns its start (when
//! the first proxy of that mode asks for its nodes, once per run), its
//! nodes' URLs (for `[store] redis_cluster` and for reading each node's
//! counters) and its stop, temp dirs included. It must not start a
//! cluster for anything else — `--smoke`, `--check` and every run without
//! `--sync redis-cluster` never start one — nor look at 127.0.0.1:6379, nor
//! outlive the harness: the nodes die with it (`PR_SET_PDEATHSIG`, set by
//! the rig) and [`stop`] removes their directories.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::redis_server::{connect, RedisServer};

/// Primaries: enough for the keys to spread, few enough for 2 cores.
const PRIMARIES: usize = 3;

/// How long the nodes may take to join and agree on the cluster.
const SETTLE: Duration = Duration::from_secs(30);

/// The rig's nodes count a silent peer as failed after 1 s, so that the
/// tests' replicas take over soon. This cluster has no replica to take
/// over, and a node stalled that long on a busy machine would stop the
/// whole cluster (`CLUSTERDOWN`) mid-measurement: Redis's default instead.
const NODE_TIMEOUT_MS: u64 = 15_000;

/// A running cluster. Fields drop in order: the nodes stop before the
/// directory holding `redis-cli`'s log goes.
struct Cluster {
    nodes: Vec<RedisServer>,
    _dir: tempfile::TempDir,
}

/// The cluster once asked for: `None` until a proxy of the mode starts,
/// then the cluster or why it could not start (kept, so every later proxy
/// fails with the same line instead of trying again). Taken out and
/// dropped by [`stop`]: a static is never dropped, and the nodes alone
/// would go with the harness, leaving their temp dirs behind.
static CLUSTER: Mutex<Option<std::result::Result<Cluster, String>>> = Mutex::new(None);

/// The URLs of the cluster's nodes, `redis://127.0.0.1:PORT` (database 0,
/// as `[store] redis_cluster` wants them), starting it on first use.
pub fn node_urls() -> Result<Vec<String>> {
    let mut slot = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = slot
        .get_or_insert_with(|| start().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|why| anyhow!("the Redis Cluster: {why}"))?;
    Ok(cluster
        .nodes
        .iter()
        .map(|node| format!("redis://127.0.0.1:{}", node.port))
        .collect())
}

/// Stops the cluster, if one was started, and removes its files.
pub fn stop() {
    drop(CLUSTER.lock().unwrap_or_else(|p| p.into_inner()).take());
}

/// Starts [`PRIMARIES`] nodes, joins them and waits until they agree.
fn start() -> Result<Cluster> {
    let dir = tempfile::Builder::new()
        .prefix("mcp-resume-proxy-load-cluster-")
        .tempdir()?;
    let mut nodes = Vec::with_capacity(PRIMARIES);
    for _ in 0..PRIMARIES {
        let node = RedisServer::start_cluster_node().map_err(|why| anyhow!(why))?;
        let mut conn = connect(&node.url()).map_err(|why| anyhow!(why))?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-node-timeout")
            .arg(NODE_TIMEOUT_MS)
            .query::<()>(&mut conn)
            .with_context(|| format!("CONFIG SET cluster-node-timeout on {}", node.port))?;
        nodes.push(node);
    }
    join(&nodes, dir.path())?;
    ready(&nodes)?;
    Ok(Cluster { nodes, _dir: dir })
}

/// `redis-cli --cluster create` on `nodes`, all primaries, its output in
/// `dir`: bounded by [`SETTLE`] (coreutils' `timeout`, so that this file
/// needs nothing of the proxies' process guard), as it waits for the nodes
/// to join with no end of its own.
fn join(nodes: &[RedisServer], dir: &Path) -> Result<()> {
    let log = dir.join("cluster-create.log");
    let file = std::fs::File::create(&log)?;
    let joined = Command::new("timeout")
        .arg(SETTLE.as_secs().to_string())
        .args(["redis-cli", "--cluster", "create"])
        .args(nodes.iter().map(|node| format!("127.0.0.1:{}", node.port)))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .context("running redis-cli (Debian package redis-tools)")?
        .success();
    if !joined {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        bail!(
            "redis-cli --cluster create failed or took over {SETTLE:?}: {}",
            said.trim_end()
        );
    }
    Ok(())
}

/// Waits until every node says `cluster_state:ok` (all slots served) and
/// knows all the others, so that a proxy given any of them learns the
/// whole map.
fn ready(nodes: &[RedisServer]) -> Result<()> {
    let known = format!("cluster_known_nodes:{}", nodes.len());
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut last = String::new();
        let all_ok = nodes.iter().all(|node| match cluster_info(node.port) {
            Ok(info) => {
                let ok = info.contains("cluster_state:ok") && info.contains(&known);
                last = format!("{}: {}", node.port, info.trim_end());
                ok
            }
            Err(why) => {
                last = why;
                false
            }
        });
        if all_ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the cluster was not ready within {SETTLE:?}: {last}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn cluster_info(port: u16) -> std::result::Result<String, String> {
    let mut conn = connect(&format!("redis://127.0.0.1:{port}"))?;
    redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut conn)
        .map_err(|e| format!("CLUSTER INFO on {port}: {e}"))
}
