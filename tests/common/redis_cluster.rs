//! A Redis Cluster of this process: three primaries with a replica each,
//! `redis-server --cluster-enabled` on free loopback ports, joined by
//! `redis-cli --cluster create`, ready once every node says
//! `cluster_state:ok` and knows every other (or all of it over TLS:
//! [`RedisCluster::start_tls`]); its nodes are killed when it drops, and
//! when this process ends (they are `RedisServer`s). Tests that
//! only need a cluster share one ([`shared`]; its nodes' temp dirs stay
//! behind, as a node exits when it cannot rewrite its `nodes.conf`); a test
//! that kills nodes starts its own.
//!
//! Included with `#[path]` next to `redis_server.rs`, by the library's unit
//! tests and the integration tests, so it uses only std, redis and that
//! file.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::redis_server::{connect, RedisServer, Tls};

/// How long the nodes may take to agree on the cluster, or on a failover.
const SETTLE: Duration = Duration::from_secs(30);

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// The cluster this process's tests share, started by the first that asks.
pub fn shared() -> Result<&'static RedisCluster, String> {
    static SHARED: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| RedisCluster::start(3, 1))
        .as_ref()
        .map_err(Clone::clone)
}

impl RedisCluster {
    /// `primaries` primaries with `replicas` replicas each, ready.
    pub fn start(primaries: usize, replicas: usize) -> Result<Self, String> {
        Self::start_with(primaries, replicas, None)
    }

    /// The same over TLS (`tls-cluster`, `tls-replication`, its ACL users;
    /// see `RedisServer::start_cluster_node_tls`), joined over TLS.
    pub fn start_tls(primaries: usize, replicas: usize, tls: Tls) -> Result<Self, String> {
        Self::start_with(primaries, replicas, Some(tls))
    }

    fn start_with(primaries: usize, replicas: usize, tls: Option<Tls>) -> Result<Self, String> {
        let mut nodes = Vec::new();
        for _ in 0..primaries * (1 + replicas) {
            nodes.push(match &tls {
                Some(tls) => RedisServer::start_cluster_node_tls(tls.clone())?,
                None => RedisServer::start_cluster_node()?,
            });
        }
        let mut cli = Command::new("redis-cli");
        if let Some(tls) = &tls {
            cli.arg("--tls").arg("--cacert").arg(&tls.ca);
        }
        cli.args(["--cluster", "create"]);
        for node in &nodes {
            let port = node.tls_port().unwrap_or(node.port);
            cli.arg(format!("127.0.0.1:{port}"));
        }
        cli.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = joined(cli)?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let cluster = Self { nodes };
        cluster.settled()?;
        Ok(cluster)
    }

    /// Some nodes to give a client (it learns the others).
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The nodes' TLS ports, to give a client (`rediss://`, by the address
    /// the nodes announce, which the test certificate names).
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter_map(|n| n.tls_port())
            .map(|port| format!("rediss://127.0.0.1:{port}"))
            .collect()
    }

    /// Waits until every running node says `cluster_state:ok` and counts
    /// them all as known, and every replica has synced with its primary
    /// (one that never did cannot take over from it).
    pub fn settled(&self) -> Result<(), String> {
        let deadline = Instant::now() + SETTLE;
        let mut last = String::new();
        loop {
            let ok = self.nodes.iter().all(|node| {
                let info = cluster_info(node.port).and_then(|info| {
                    let replication = replication_info(node.port)?;
                    Ok(format!("{info}{replication}"))
                });
                match info {
                    Ok(info) => {
                        let known = format!("cluster_known_nodes:{}", self.nodes.len());
                        let ok = info.contains("cluster_state:ok")
                            && info.contains(&known)
                            && (info.contains("role:master")
                                || info.contains("master_link_status:up"));
                        last = info;
                        ok
                    }
                    Err(e) => {
                        last = e;
                        false
                    }
                }
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the cluster did not settle within {SETTLE:?}: {last}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The ports of the nodes that are primaries now.
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| role(n.port).as_deref() == Some("master"))
            .map(|n| n.port)
            .collect()
    }

    /// The keys matching `pattern` on each primary, by port.
    pub fn keys(&self, pattern: &str) -> Vec<(u16, Vec<String>)> {
        self.primaries()
            .into_iter()
            .map(|port| {
                let keys = connect(&url(port))
                    .and_then(|mut c| {
                        redis::cmd("KEYS")
                            .arg(pattern)
                            .query::<Vec<String>>(&mut c)
                            .map_err(|e| e.to_string())
                    })
                    .unwrap_or_default();
                (port, keys)
            })
            .collect()
    }

    /// Deletes the keys matching `pattern`; returns how many are left (0).
    pub fn delete(&self, pattern: &str) -> usize {
        for (port, keys) in self.keys(pattern) {
            if let (Ok(mut conn), false) = (connect(&url(port)), keys.is_empty()) {
                // One key at a time: they may be of several slots.
                for key in keys {
                    let _ = redis::cmd("DEL").arg(key).query::<()>(&mut conn);
                }
            }
        }
        self.keys(pattern).iter().map(|(_, k)| k.len()).sum()
    }
}

/// A node as `CLUSTER NODES` lists it.
struct Node {
    id: String,
    port: u16,
    primary: bool,
    /// The slot ranges it serves (a primary).
    slots: Vec<(u16, u16)>,
}

impl Node {
    fn parse(line: &str) -> Option<Node> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = fields
            .get(1)?
            .split(['@', ','])
            .next()?
            .rsplit(':')
            .next()?;
        let flags = fields.get(2)?;
        let slots = fields
            .iter()
            .skip(8)
            .filter(|r| !r.starts_with('['))
            .filter_map(|r| match r.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => r.parse().ok().map(|s| (s, s)),
            })
            .collect();
        Some(Node {
            id: fields.first()?.to_string(),
            port: port.parse().ok()?,
            primary: flags.contains("master") && !flags.contains("fail"),
            slots,
        })
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

fn query<T: redis::FromRedisValue>(port: u16, cmd: &mut redis::Cmd) -> Result<T, String> {
    let mut conn = connect(&url(port))?;
    cmd.query(&mut conn).map_err(|e| format!("on {port}: {e}"))
}

impl RedisCluster {
    /// The nodes as the first running one sees them.
    fn topology(&self) -> Result<Vec<Node>, String> {
        let port = self.primaries().first().copied().ok_or("no primary runs")?;
        let text: String = query(port, redis::cmd("CLUSTER").arg("NODES"))?;
        Ok(text.lines().filter_map(Node::parse).collect())
    }

    /// The port of the primary serving the slot of `key` now, as a running
    /// primary sees the cluster; `None` while none does.
    pub fn primary_of(&self, key: &str) -> Option<u16> {
        let nodes = self.topology().ok()?;
        let any = *self.primaries().first()?;
        let slot: u16 = query(any, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).ok()?;
        nodes
            .iter()
            .find(|n| n.primary && n.serves(slot))
            .map(|n| n.port)
    }

    /// Moves the slot of `key` to another primary as `redis-cli --cluster
    /// reshard` does — `IMPORTING` on the new one, `MIGRATING` on the old,
    /// `MIGRATE` key by key, then `NODE` on every primary — pausing between
    /// keys so that the clients meet the slot half moved (`ASK`,
    /// `TRYAGAIN`), then the new owner everywhere (`MOVED`).
    pub fn move_slot_of(&self, key: &str) -> Result<(), String> {
        let nodes = self.topology()?;
        let any = nodes.iter().find(|n| n.primary).ok_or("no primary")?.port;
        let slot: u16 = query(any, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))?;
        let from = nodes.iter().find(|n| n.primary && n.serves(slot));
        let from = from.ok_or(format!("no primary serves slot {slot}"))?;
        let to = nodes.iter().find(|n| n.primary && n.id != from.id);
        let to = to.ok_or("no other primary")?;
        let setslot = |port: u16, how: &str, id: &str| {
            query::<()>(
                port,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(how)
                    .arg(id),
            )
        };
        setslot(to.port, "IMPORTING", &from.id)?;
        setslot(from.port, "MIGRATING", &to.id)?;
        loop {
            let keys: Vec<String> = query(
                from.port,
                redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(1),
            )?;
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(to.port)
                .arg("")
                .arg(0)
                .arg(5000);
            migrate.arg("KEYS").arg(&keys);
            query::<()>(from.port, &mut migrate)?;
            std::thread::sleep(Duration::from_millis(100));
        }
        for node in nodes.iter().filter(|n| n.primary) {
            setslot(node.port, "NODE", &to.id)?;
        }
        self.settled()
    }
}

/// Runs `redis-cli --cluster create` (`cli`) to its end, within
/// [`SETTLE`]: it waits for the nodes to join with no end of its own, and
/// nodes that cannot reach each other's bus never do.
fn joined(mut cli: Command) -> Result<std::process::Output, String> {
    let mut child = cli
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("redis-cli --cluster create did not run: {e}"))?;
    let deadline = Instant::now() + SETTLE;
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            return Err(format!(
                "the nodes did not join within {SETTLE:?}: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().map_err(|e| e.to_string())
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

fn cluster_info(port: u16) -> Result<String, String> {
    let mut conn = connect(&url(port))?;
    redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut conn)
        .map_err(|e| format!("CLUSTER INFO on {port}: {e}"))
}

fn replication_info(port: u16) -> Result<String, String> {
    let mut conn = connect(&url(port))?;
    redis::cmd("INFO")
        .arg("replication")
        .query(&mut conn)
        .map_err(|e| format!("INFO replication on {port}: {e}"))
}

/// `master` or `slave`, as `ROLE` says; `None` for a node that is down.
fn role(port: u16) -> Option<String> {
    let mut conn = connect(&url(port)).ok()?;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn).ok()?;
    redis::from_redis_value(role.into_iter().next()?).ok()
}
