//! How the replicas of an HTTP upstream are reached and kept: their
//! connection pools, made once per replica set; for a `resolve = "each"`
//! host, a pool per address with its connections pinned there (the URL's
//! host kept for `Host`, `:authority` and TLS) and the look-ups that follow
//! the host (`resolve.rs`); and the health checks (`health.rs`), each a
//! GET of `health_path` on a replica's own pool. The background work runs
//! until the upstream drops the guard handed back with its replicas.
//!
//! This builds and keeps; it never chooses a replica (`replicas.rs`) and
//! sends no client's request (`http.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::health::{self, Check};
use super::replicas::{Ejection, Endpoint, Replica, Replicas};
use super::resolve;
use crate::config::{Resolve, UpstreamConfig};
use crate::metrics::ReplicaMeter;
use crate::tls::outbound::{self, error_chain, Connector};
use crate::workers::PerWorker;

/// The most of a health check's answer body that is read.
const HEALTH_BODY: usize = 64 * 1024;

/// How requests reach a replica: one pool per worker (a connection is
/// driven by the worker that opened it, so a call that borrowed another
/// worker's connection would wake that worker twice). The replicas of
/// `urls` share one; those of a resolved host have one each.
pub type Via = Arc<PerWorker<Client<Connector, Full<Bytes>>>>;

pub type HttpReplica = Replica<Via>;

/// Makes the pools of one upstream's replicas.
#[derive(Clone)]
struct Pools {
    tls: rustls::ClientConfig,
    connect_timeout: Duration,
    workers: usize,
}

impl Pools {
    fn of(&self, connector: Connector) -> Via {
        Arc::new(PerWorker::new(self.workers, |_| {
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .build(connector.clone())
        }))
    }

    /// One pool for every replica of `urls` (each its own URL).
    fn shared(&self) -> Via {
        self.of(outbound::connector(self.tls.clone(), self.connect_timeout))
    }

    /// A pool whose connections all go to `addr`.
    fn pinned(&self, addr: SocketAddr) -> Via {
        let connector = outbound::pinned_connector(addr, self.tls.clone(), self.connect_timeout);
        self.of(connector)
    }
}

/// The replicas `config` describes, their series made with `meter`, and
/// the guard that stops their look-ups and health checks. A resolved host
/// is looked up now, and must have an address: a proxy that started
/// without one would answer nothing but errors.
pub fn replicas(
    config: &UpstreamConfig,
    workers: usize,
    meter: ReplicaMeter,
) -> Result<(Arc<Replicas<Via>>, DropGuard), String> {
    let ejection = Ejection {
        after: config.eject_after.max(1),
        base: Duration::from_millis(config.eject_ms.max(1)),
    };
    let key = crate::tls::upstream_ca_key(&config.path);
    let tls =
        crate::tls::upstream_client(&key, config.ca_file.as_deref()).map_err(|e| e.to_string())?;
    let pools = Pools {
        tls,
        connect_timeout: Duration::from_secs(config.connect_timeout_secs),
        workers,
    };
    let stop = CancellationToken::new();
    let replicas = match config.resolve {
        Resolve::One => listed(config, ejection, meter, &pools)?,
        Resolve::Each => resolved(config, ejection, meter, pools, &stop)?,
    };
    if let Some(path) = &config.health_path {
        check_health(&replicas, path, config.health_every_ms, &stop)?;
    }
    Ok((replicas, stop.drop_guard()))
}

fn parse(text: &str) -> Result<Uri, String> {
    text.parse()
        .map_err(|e| format!("upstream url {text:?}: {e}"))
}

/// The one `url`, or each of `urls`, on one pool.
fn listed(
    config: &UpstreamConfig,
    ejection: Ejection,
    meter: ReplicaMeter,
    pools: &Pools,
) -> Result<Arc<Replicas<Via>>, String> {
    let shared = pools.shared();
    let endpoints = config
        .endpoints()
        .into_iter()
        .map(|text| {
            Ok(Endpoint {
                name: text.to_owned(),
                url: parse(text)?,
                via: shared.clone(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let named = endpoints.len() > 1;
    Ok(Arc::new(Replicas::new(endpoints, ejection, named, meter)?))
}

/// Every address of the `url`'s host, each on a pool of its own, followed
/// every `resolve_every_ms`.
fn resolved(
    config: &UpstreamConfig,
    ejection: Ejection,
    meter: ReplicaMeter,
    pools: Pools,
    stop: &CancellationToken,
) -> Result<Arc<Replicas<Via>>, String> {
    let text = config.url.as_deref().unwrap_or_default();
    let url = parse(text)?;
    let (host, port) = resolve::host_and_port(&url)?;
    let found = resolve::lookup_now(&config.lookup, &host, port).map_err(|e| {
        format!(
            "upstream {text:?} has resolve = \"each\", and its host {host:?} resolves to no \
             address ({e}): there is no replica to start with"
        )
    })?;
    let make = move |name: &str, addr: SocketAddr| Endpoint {
        name: name.to_owned(),
        url: url.clone(),
        via: pools.pinned(addr),
    };
    let endpoints = found.into_iter().map(|(n, a)| make(&n, a)).collect();
    // Named even while there is one address: a second may come, and a
    // session's record must say which one holds it.
    let replicas = Arc::new(Replicas::new(endpoints, ejection, true, meter)?);
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(resolve::follow(
            Arc::downgrade(&replicas),
            config.lookup.clone(),
            (host, port),
            Duration::from_millis(config.resolve_every_ms.max(1)),
            make,
            stop.clone(),
        ));
    }
    Ok(replicas)
}

/// Starts the health checks of `replicas`: a GET of `path` on each.
fn check_health(
    replicas: &Arc<Replicas<Via>>,
    path: &str,
    every_ms: u64,
    stop: &CancellationToken,
) -> Result<(), String> {
    let path: http::uri::PathAndQuery = path
        .parse()
        .map_err(|e| format!("health_path {path:?}: {e}"))?;
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Ok(());
    };
    let check = move |replica: Arc<HttpReplica>| -> Check {
        let path = path.clone();
        Box::pin(async move { ask(&replica, path).await })
    };
    runtime.spawn(health::check_every(
        Arc::downgrade(replicas),
        Duration::from_millis(every_ms.max(1)),
        check,
        stop.clone(),
    ));
    Ok(())
}

/// One health check: a GET of `path` on `replica`, its body read (so that
/// the connection can serve the next one), passing on a 2xx.
async fn ask(replica: &HttpReplica, path: http::uri::PathAndQuery) -> Result<(), String> {
    let mut parts = replica.url.clone().into_parts();
    parts.path_and_query = Some(path);
    let uri = Uri::from_parts(parts).map_err(|e| e.to_string())?;
    let req = Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let res = replica
        .via
        .get()
        .request(req)
        .await
        .map_err(|e| error_chain(&e))?;
    let status = res.status();
    // Read to its end so that the connection serves the next check; a body
    // past this size is no health answer, and the connection is let go.
    let _ = Limited::new(res.into_body(), HEALTH_BODY).collect().await;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {status}"))
    }
}
