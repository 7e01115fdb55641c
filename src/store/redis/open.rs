//! Opening the Redis store: a store on a URL, on the route a
//! `[store]` endpoint describes (one server, the sentinels' primary, a
//! cluster's slot node), or for looking only; the probe that checks Redis
//! answers before an instance counts on it; the feed listener and lease
//! renewal it starts; and the connections per worker it is given. It must
//! not read or write the log: that is the rest of the module's.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::follow::{Follow, Listener};
use super::lease::{self, Tasks};
use super::record::backend;
use super::replicas::Waiting;
use super::scripts::Scripts;
use super::sentinel::Route;
use super::shards::SHARDS;
use super::ttl::Lifetimes;
use super::{cluster, connection, endpoint, reach, RedisStore, RESPONSE_TIMEOUT};
use crate::store::{Result, StoreError};
use crate::workers::PerWorker;

impl RedisStore {
    /// A store on `url` whose keys all start with `prefix`, holding an
    /// instance lease of `lease`. Connects lazily (see [`RedisStore::open`]
    /// for a store that checks the server first); inside a Tokio runtime it
    /// starts following the feed and renewing its lease at once.
    pub fn new(url: &str, prefix: &str, lease: Duration) -> Result<Self> {
        let client = redis::Client::open(url).map_err(backend)?;
        Self::with_route(Route::fixed(client), prefix, lease)
    }

    pub(super) fn with_route(route: Route, prefix: &str, lease: Duration) -> Result<Self> {
        let store = Self::build(route, prefix, lease)?;
        if tokio::runtime::Handle::try_current().is_ok() {
            store.start_tasks();
        }
        Ok(store)
    }

    pub(super) fn build(route: Route, prefix: &str, lease: Duration) -> Result<Self> {
        let route = Arc::new(route);
        let first = connection(&route, RESPONSE_TIMEOUT)?;
        let conn = PerWorker::new(0, |_| OnceLock::from(first.clone()));
        let store = Self {
            prefix: prefix.to_owned(),
            first,
            conn,
            route,
            follow: Arc::new(Follow::new()),
            scripts: Scripts::new(),
            instance: lease::new_instance(),
            lease,
            renewed: OnceLock::new(),
            expire_after: Lifetimes::default(),
            tasks: Tasks::new(),
            sessions_indexed: std::sync::Mutex::new(None),
            waiting: Waiting::new(0),
        };
        Ok(store)
    }

    /// Starts the feed listener and the lease renewal, both stopped when the
    /// store drops.
    pub(super) fn start_tasks(&self) {
        let listener = Listener {
            follow: self.follow.clone(),
            route: self.route.clone(),
            instance: self.instance.clone(),
            feed_key: self.global_key("feed"),
            wake_key: self.wake_key(),
            shard_keys: (0..SHARDS).map(|n| self.shard_key(n)).collect(),
            prefix: self.prefix.clone(),
        };
        tokio::spawn(listener.run(self.tasks.stop.clone()));
        lease::spawn_renewal(
            self.conn(),
            self.scripts.renew.clone(),
            self.global_key("instances"),
            self.instance.clone(),
            self.lease,
            self.renewed.get_or_init(lease::Renewed::now).clone(),
            self.tasks.renewal.clone(),
        );
    }

    /// Gives each of `workers` worker threads a connection of its own,
    /// made on the worker by its first command there. A connection is
    /// driven by tasks on the runtime it was made on: a command from
    /// another thread then costs two thread wake-ups besides the round
    /// trip, and a call makes two of them. Code on no worker (the lease
    /// renewal, the sweeper) keeps the first connection. With
    /// `min_replicas`, each worker's waited writes get one more
    /// (`replicas.rs`).
    pub fn with_workers(mut self, workers: usize) -> Self {
        let first = &self.first;
        self.conn = PerWorker::new(workers, |worker| match worker {
            0 => OnceLock::from(first.clone()),
            _ => OnceLock::new(),
        });
        self.waiting = self.waiting.for_workers(workers);
        self
    }

    /// The TTLs its keys get (see [`Lifetimes`]).
    pub fn with_lifetimes(mut self, lifetimes: Lifetimes) -> Self {
        self.expire_after = lifetimes;
        self
    }

    /// A store on the Redis `[store]` describes, for looking only
    /// (`streams list|show`): no lease, no feed listener, so it never
    /// counts as an instance.
    pub async fn observer(at: &endpoint::Endpoint, prefix: &str) -> Result<Self> {
        let prefix = &cluster::laid_out(at, prefix);
        let route = reach::route(at, prefix).await?;
        let store = Self::build(route, prefix, Duration::ZERO)?;
        store.probe(&at.url).await?;
        Ok(store)
    }

    /// A store on `url`, after checking that Redis answers there.
    pub async fn open(url: &str, prefix: &str, lease: Duration) -> Result<Self> {
        let store = Self::new(url, prefix, lease)?;
        store.probe(url).await?;
        Ok(store)
    }

    /// Opens the log at `at`: its URL (`rediss://` for TLS), ACL user,
    /// password, CA and client certificate ([`endpoint`]).
    pub async fn open_at(at: &endpoint::Endpoint, prefix: &str, lease: Duration) -> Result<Self> {
        let prefix = &cluster::laid_out(at, prefix);
        let route = reach::route(at, prefix).await?;
        let store = Self::with_route(route, prefix, lease)?;
        store.probe(&at.url).await?;
        Ok(store)
    }

    /// Checks that Redis answers at `url` (or where the sentinels said).
    async fn probe(&self, url: &str) -> Result<()> {
        if let Some(answered) = self.probe_cluster().await {
            return answered;
        }
        let client = self.route.now().client.clone();
        let at = match self.route.follows() {
            true => client.get_connection_info().addr().to_string(),
            false => url.to_owned(),
        };
        // A connection of its own: the manager would retry for seconds.
        let silent = |e: redis::RedisError| {
            StoreError::Backend(format!("redis at {at} does not answer: {e}"))
        };
        let mut probe = client
            .get_multiplexed_async_connection()
            .await
            .map_err(silent)?;
        redis::cmd("PING")
            .query_async::<String>(&mut probe)
            .await
            .map_err(silent)?;
        Ok(())
    }
}
