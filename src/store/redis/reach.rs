//! Which route a store's connections take ([`route`]): `redis_url`'s one
//! server, the primary the sentinels name (`sentinel.rs`), or the cluster's
//! node serving the prefix's slot (`cluster.rs`), each reached with the
//! user, password and TLS settings of the [`Endpoint`].
//!
//! It only chooses and assembles; finding a primary, following a failover
//! and pinning a slot are the routes' own.

use std::time::Duration;

use redis::sentinel::SentinelClientBuilder;
use redis::{IntoConnectionInfo, TlsCertificates, TlsMode};

use super::endpoint::{certificates, client, first_line, password, Endpoint};
use super::sentinel::{Route, Sentinels};
use super::RedisStore;
use crate::store::Result;

/// Where the store's connections go: `url`'s server, or the primary the
/// sentinels name (an error when none of them names one that answers), or
/// the cluster's node serving the slot of (one-slot) `prefix`.
pub(super) async fn route(store: &Endpoint, prefix: &str) -> Result<Route> {
    if !store.cluster.is_empty() {
        let (cluster, stand_in) = super::cluster::reach(store, prefix)?;
        return Ok(Route::clustered(cluster, stand_in));
    }
    if store.sentinels.is_empty() {
        return Ok(Route::fixed(client(store)?));
    }
    let master = store.sentinel_master.as_deref().unwrap_or_default();
    let (builders, listed) = Sentinels::builders(&store.sentinels, master)?;
    let how = Reached::from(store)?;
    let builders = builders.into_iter().map(|b| how.apply(b)).collect();
    Route::through(Sentinels::new(builders, master, listed)?).await
}

/// How the sentinels and the data nodes are reached: users, passwords, TLS.
struct Reached {
    username: Option<String>,
    password: Option<String>,
    sentinel_username: Option<String>,
    sentinel_password: Option<String>,
    /// With `rediss://` sentinels: both verified, never `TlsMode::Insecure`.
    tls: Option<TlsCertificates>,
}

impl Reached {
    fn from(store: &Endpoint) -> Result<Self> {
        let sentinel_password = match &store.sentinel_password_file {
            Some(file) => Some(first_line("store.redis_sentinel_password_file", file)?),
            None => None,
        };
        let sentinel_username = store.sentinels.iter().find_map(|url| {
            let info = url.as_str().into_connection_info().ok()?;
            info.redis_settings().username().map(str::to_owned)
        });
        let tls = match store.sentinels.iter().any(|u| u.starts_with("rediss://")) {
            true => Some(certificates(store)?),
            false => None,
        };
        Ok(Self {
            username: store.username.clone(),
            password: password(store)?,
            sentinel_username,
            sentinel_password,
            tls,
        })
    }

    fn apply(&self, mut builder: SentinelClientBuilder) -> SentinelClientBuilder {
        if let Some(user) = &self.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(user) = &self.sentinel_username {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = &self.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(certificates) = &self.tls {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                .set_client_to_redis_certificates(certificates.clone())
                .set_client_to_sentinel_certificates(certificates.clone());
        }
        builder
    }
}

impl RedisStore {
    /// A store on the cluster whose nodes (some of them) are `nodes`, its
    /// keys in the slot of `prefix` (see the module's doc). As
    /// [`RedisStore::new`], but made inside a Tokio runtime, which drives
    /// its connections.
    pub fn clustered(nodes: &[String], prefix: &str, lease: Duration) -> Result<Self> {
        let at = Endpoint {
            cluster: nodes.to_vec(),
            ..Endpoint::default()
        };
        let prefix = super::cluster::one_slot(prefix);
        let (cluster, stand_in) = super::cluster::reach(&at, &prefix)?;
        Self::with_route(Route::clustered(cluster, stand_in), &prefix, lease)
    }
}
