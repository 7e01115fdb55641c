//! Where the log lives and how it is reached (`[store]`): the backend,
//! how writes are made durable, how long things are kept, and every key of
//! the Redis backend, with the checks that refuse a bad combination at
//! start. Plain data: nothing here opens a store or connects to Redis.

use std::path::PathBuf;

use serde::Deserialize;

use super::redis_keys;
use crate::store::commit::SyncMode;

/// Where the log lives (`[store] backend`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Append-only segment files under `data_dir/journal` (the default).
    #[default]
    Journal,
    /// sled trees under `data_dir/log`: the first backend, kept for
    /// comparison and for data directories written by it.
    Sled,
    /// Redis at `redis_url`, keys under `key_prefix`: several instances
    /// share the log and serve every session (HTTP upstreams only).
    Redis,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub backend: Backend,
    pub sync: SyncMode,
    /// Seconds a finished stream stays replayable.
    pub retention_secs: u64,
    /// Seconds without any request after which a session is ended.
    pub session_idle_secs: u64,
    /// Seconds between sweeps for expired streams and sessions.
    pub sweep_secs: u64,
    /// The Redis server of `backend = "redis"` (`url` is accepted too):
    /// `redis://` or, over TLS, `rediss://`. Never a password in it.
    #[serde(alias = "url")]
    pub redis_url: String,
    /// The ACL user Redis is reached as (`AUTH user password`); unset:
    /// the URL's user, else `default`.
    pub redis_username: Option<String>,
    /// A file holding the password (its first line); else the environment
    /// variable `MCP_RESUME_PROXY_REDIS_PASSWORD`; else none.
    pub redis_password_file: Option<PathBuf>,
    /// CA certificates (PEM) a `rediss://` server must chain to; unset: the
    /// system's roots.
    pub redis_ca_file: Option<PathBuf>,
    /// A client certificate (PEM) for Redis' `tls-auth-clients`, with its
    /// key in `redis_client_key`.
    pub redis_client_cert: Option<PathBuf>,
    pub redis_client_key: Option<PathBuf>,
    /// Redis Sentinel: the sentinels (`redis://host:26379`, or all
    /// `rediss://`) asked for the primary named `redis_sentinel_master`, in
    /// place of `redis_url`'s server; asked again whenever the primary
    /// fails or turns replica. The user, password and TLS keys above apply
    /// to the data nodes (TLS with `rediss://` sentinels).
    pub redis_sentinels: Vec<String>,
    pub redis_sentinel_master: Option<String>,
    /// The sentinels' own password (`requirepass`), if they have one: its
    /// first line.
    pub redis_sentinel_password_file: Option<PathBuf>,
    /// Redis Cluster: some of its nodes (`redis://host:7000`, or all
    /// `rediss://`), in place of `redis_url` and of sentinels; the client
    /// learns the rest, and follows resharding and failovers. The user,
    /// password and TLS keys above apply to every node.
    pub redis_cluster: Vec<String>,
    /// On a Redis Cluster: how many partitions the log is spread over, so
    /// that its load falls on every primary (16 when unset; 1 keeps the
    /// log in one slot, as versions before it laid it out). Fixed for a
    /// key prefix once its first instance started.
    pub partitions: Option<usize>,
    /// The start of every key `backend = "redis"` writes, so that several
    /// deployments can share one Redis.
    pub key_prefix: String,
    /// How long an instance sharing a Redis log stays the owner of its
    /// calls without renewing its lease; after that, another instance takes
    /// them over (so also the longest a call of a dead instance waits).
    pub lease_ms: u64,
    /// With `backend = "redis"`: how many replicas must hold a write before
    /// the proxy counts it written (Redis `WAIT` after each), so that a
    /// failover loses nothing a client was told; 0 (the default): the
    /// primary's answer is enough, as Redis replicates asynchronously.
    pub min_replicas: u32,
    /// How long a write waits for `min_replicas` replicas before it fails
    /// (milliseconds; unset: [`DEFAULT_REPLICA_WAIT_MS`]).
    pub replica_wait_ms: Option<u64>,
    /// Bytes of sled's page cache (`backend = "sled"`): what the sled log
    /// may keep in memory however much it retains (sled's own default is 1
    /// GiB).
    pub sled_cache_bytes: u64,
}

/// How long a write waits for its replicas when `replica_wait_ms` is unset.
pub const DEFAULT_REPLICA_WAIT_MS: u64 = 1_000;

/// The longest `replica_wait_ms`: a write holds its client's call (and the
/// commands behind it on its connection) for as long.
pub const MAX_REPLICA_WAIT_MS: u64 = 60_000;

impl StoreConfig {
    /// How to reach the Redis log these keys describe.
    pub fn redis_endpoint(&self) -> crate::store::redis::endpoint::Endpoint {
        crate::store::redis::endpoint::Endpoint {
            url: self.redis_url.clone(),
            username: self.redis_username.clone(),
            password_file: self.redis_password_file.clone(),
            ca_file: self.redis_ca_file.clone(),
            client_cert: self.redis_client_cert.clone(),
            client_key: self.redis_client_key.clone(),
            sentinels: self.redis_sentinels.clone(),
            sentinel_master: self.redis_sentinel_master.clone(),
            sentinel_password_file: self.redis_sentinel_password_file.clone(),
            cluster: self.redis_cluster.clone(),
            partitions: self.partitions,
        }
    }

    /// How many replicas a write waits for, and how long.
    pub fn replicas(&self) -> crate::store::redis::Replicas {
        let wait_ms = self.replica_wait_ms.unwrap_or(DEFAULT_REPLICA_WAIT_MS);
        crate::store::redis::Replicas {
            min: self.min_replicas,
            wait: std::time::Duration::from_millis(wait_ms),
        }
    }

    /// `min_replicas` and `replica_wait_ms`: Redis only (the other logs
    /// are on this machine, with no replica to wait for), and a wait that
    /// ends (`WAIT` with 0 would wait forever).
    pub(super) fn check_replicas(&self) -> Result<(), String> {
        let wait_ms = self.replica_wait_ms;
        if self.backend != Backend::Redis {
            if self.min_replicas > 0 {
                return Err(format!(
                    "store.min_replicas = {} needs backend = \"redis\": the journal and sled \
                     logs are on this machine, with no replica to wait for",
                    self.min_replicas
                ));
            }
            if wait_ms.is_some() {
                return Err(
                    "store.replica_wait_ms is for backend = \"redis\" (with store.min_replicas)"
                        .into(),
                );
            }
            return Ok(());
        }
        match wait_ms {
            Some(0) if self.min_replicas > 0 => Err(
                "store.replica_wait_ms = 0 would let a write wait for its replicas forever \
                 (Redis WAIT 0): give it at least 1"
                    .into(),
            ),
            Some(ms) if ms > MAX_REPLICA_WAIT_MS => Err(format!(
                "store.replica_wait_ms = {ms} is more than {MAX_REPLICA_WAIT_MS}: a write holds \
                 its client's call while it waits"
            )),
            _ => Ok(()),
        }
    }

    /// The Redis keys that must agree with one another: no password in the
    /// URL (it would sit in the file and in every error message), TLS files
    /// only for `rediss://`, a client certificate with its key.
    pub(super) fn check_redis(&self) -> Result<(), String> {
        let url = &self.redis_url;
        redis_keys::check_redis_url("store.redis_url", url)?;
        let mut scheme = url.split_once("://").map_or("", |(s, _)| s);
        if let Some(nodes) = self.check_cluster()? {
            scheme = nodes;
        }
        if let Some(sentinels) = self.check_sentinels()? {
            scheme = sentinels;
        }
        let tls_files = [
            ("redis_ca_file", &self.redis_ca_file),
            ("redis_client_cert", &self.redis_client_cert),
            ("redis_client_key", &self.redis_client_key),
        ];
        if let Some((key, _)) = tls_files.iter().find(|(_, f)| f.is_some()) {
            if scheme != "rediss" {
                return Err(format!(
                    "store.{key} is for TLS: store.redis_url (or store.redis_sentinels, \
                     store.redis_cluster) must start with rediss://"
                ));
            }
        }
        if self.redis_client_cert.is_some() != self.redis_client_key.is_some() {
            return Err("store.redis_client_cert and store.redis_client_key go together".into());
        }
        Ok(())
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Journal,
            sync: SyncMode::Batch,
            retention_secs: 900,
            session_idle_secs: 86_400,
            sweep_secs: 30,
            redis_url: "redis://127.0.0.1:6379/0".into(),
            redis_username: None,
            redis_password_file: None,
            redis_ca_file: None,
            redis_client_cert: None,
            redis_client_key: None,
            redis_sentinels: Vec::new(),
            redis_sentinel_master: None,
            redis_sentinel_password_file: None,
            redis_cluster: Vec::new(),
            partitions: None,
            key_prefix: "mcp-resume-proxy".into(),
            lease_ms: 10_000,
            min_replicas: 0,
            replica_wait_ms: None,
            sled_cache_bytes: crate::store::sled::DEFAULT_CACHE_BYTES,
        }
    }
}
