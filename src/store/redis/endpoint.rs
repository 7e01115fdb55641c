//! Where the Redis log is and how to reach it ([`Endpoint`]): the URL, or
//! the sentinels and the name of the primary they watch, or the nodes of a
//! Redis Cluster (`cluster.rs`); the ACL user and
//! its password, and for `rediss://` the CA to trust and a client
//! certificate. Made from `[store]` by the configuration, read once when
//! the store opens, into the route every connection of the store is made
//! from (commands, the live feed, the probe; `reach.rs` makes it): one
//! [`redis::Client`], or the sentinels' (`sentinel.rs`), which the same
//! user, password and TLS settings reach the data nodes through. It knows
//! nothing of sentinels or clusters beyond their addresses.
//!
//! The password never comes from the configuration file (validation refuses
//! one in `redis_url`): from `redis_password_file`, else the environment.
//! It must not appear in an error message; the URL may, since it holds none.

use std::path::{Path, PathBuf};

use redis::{ClientTlsConfig, IntoConnectionInfo, TlsCertificates};

use crate::store::{Result, StoreError};

/// How to reach the Redis log; `[store]`'s keys of the same names.
#[derive(Clone, Debug, Default)]
pub struct Endpoint {
    pub url: String,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// Sentinels to ask for the primary instead of `url`'s server.
    pub sentinels: Vec<String>,
    /// The name the sentinels know the primary by.
    pub sentinel_master: Option<String>,
    /// The sentinels' own password (`requirepass`), if they have one.
    pub sentinel_password_file: Option<PathBuf>,
    /// Nodes of a Redis Cluster, in place of `url`'s server and of
    /// sentinels.
    pub cluster: Vec<String>,
    /// How many partitions a log on a cluster is spread over (`None`: the
    /// default, [`super::DEFAULT_PARTITIONS`]); one elsewhere.
    pub partitions: Option<usize>,
}

impl Endpoint {
    /// How many partitions the log is in: one but on a cluster.
    pub fn partitions(&self) -> usize {
        match self.cluster.is_empty() {
            true => 1,
            false => self.partitions.unwrap_or(super::DEFAULT_PARTITIONS),
        }
    }
}

/// The environment variable a password is taken from when no file is named.
pub const PASSWORD_VAR: &str = "MCP_RESUME_PROXY_REDIS_PASSWORD";

/// The Redis client `store` describes.
pub fn client(store: &Endpoint) -> Result<redis::Client> {
    let url = &store.url;
    let mut info = url
        .as_str()
        .into_connection_info()
        .map_err(|e| StoreError::Backend(format!("store.redis_url = {url}: {e}")))?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &store.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = password(store)? {
        settings = settings.set_password(password);
    }
    info = info.set_redis_settings(settings);
    if !url.starts_with("rediss://") {
        return redis::Client::open(info).map_err(|e| StoreError::Backend(e.to_string()));
    }
    redis::Client::build_with_tls(info, certificates(store)?)
        .map_err(|e| StoreError::Backend(format!("store.redis_url = {url}: TLS: {e}")))
}

/// The CA and client certificate `rediss://` connections present.
pub(super) fn certificates(store: &Endpoint) -> Result<TlsCertificates> {
    let client_tls = match (&store.client_cert, &store.client_key) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read("store.redis_client_cert", cert)?,
            client_key: read("store.redis_client_key", key)?,
        }),
        _ => None,
    };
    let root_cert = match &store.ca_file {
        Some(ca) => Some(read("store.redis_ca_file", ca)?),
        None => None,
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// The password: `redis_password_file`'s first line, else the environment.
pub(super) fn password(store: &Endpoint) -> Result<Option<String>> {
    if let Some(file) = &store.password_file {
        return first_line("store.redis_password_file", file).map(Some);
    }
    Ok(std::env::var(PASSWORD_VAR).ok().filter(|p| !p.is_empty()))
}

/// A password file's first line.
pub(super) fn first_line(key: &str, file: &Path) -> Result<String> {
    let text = read(key, file)?;
    let text = String::from_utf8(text)
        .map_err(|_| StoreError::Backend(format!("{key} = {}: not UTF-8", file.display())))?;
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

fn read(key: &str, file: &Path) -> Result<Vec<u8>> {
    std::fs::read(file).map_err(|e| StoreError::Backend(format!("{key} = {}: {e}", file.display())))
}
