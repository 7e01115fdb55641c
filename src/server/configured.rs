//! What a configuration makes of the proxy, as one value: the routes (each
//! with its upstream), the edge, the settings every request reads
//! ([`Shared`]: the configuration, `[auth]`, the token keys) and where each
//! request's visit reports. Built at start-up, and again by each reload
//! (`reload.rs`) beside the running one, from the configuration and what
//! outlives every configuration ([`Lasting`]: the log, the sessions, the
//! drain). A request holds the one it started with to its end, so a reload
//! changes nothing under it.
//!
//! An upstream whose configuration did not change is carried over whole —
//! its connection pool, its stdio children, its tasks — so that a reload
//! that does not touch it is invisible to its calls.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::access::{Access, Reporting};
use crate::config::{Config, UpstreamConfig};
use crate::edge::Edge;
use crate::proxy::{Route, Shared};
use crate::session::Sessions;
use crate::stream::Log;
use crate::token::Keyring;
use crate::traces::Tracer;
use crate::upstream::http::HttpUpstream;
use crate::upstream::stdio::StdioUpstream;
use crate::upstream::Upstream;

/// What outlives every configuration of a running proxy.
#[derive(Clone)]
pub struct Lasting {
    pub log: Arc<Log>,
    pub sessions: Arc<Sessions>,
    /// Cancelled when the proxy starts shutting down.
    pub draining: CancellationToken,
    /// Where spans go; `None` with tracing off. A `[tracing]` change
    /// needs a restart (`reload.rs`).
    pub tracer: Option<Arc<Tracer>>,
}

/// One configuration, made into routes, an edge and settings.
pub struct Configured {
    pub routes: Vec<Route>,
    pub edge: Edge,
    pub shared: Arc<Shared>,
    pub access: Arc<Access>,
}

impl Configured {
    /// Builds what `config` makes of the proxy; `before` is the running
    /// one, whose unchanged upstreams are carried over.
    pub fn build(
        config: Config,
        lasting: &Lasting,
        before: Option<&Configured>,
    ) -> anyhow::Result<Configured> {
        let keyring = keyring(&config)?;
        let auth = crate::auth::Authenticator::new(&config)?;
        let shared = Arc::new(Shared {
            config,
            log: lasting.log.clone(),
            sessions: lasting.sessions.clone(),
            keyring,
            auth,
            draining: lasting.draining.clone(),
            tracer: lasting.tracer.clone(),
        });
        let routes = shared
            .config
            .upstream
            .iter()
            .map(|up| route(up, &shared, before))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let edge = Edge::new(&shared.config).map_err(anyhow::Error::msg)?;
        let config = &shared.config;
        let mounts: Vec<&str> = routes.iter().map(|r| r.path.as_str()).collect();
        let table = lasting
            .log
            .metrics()
            .requests()
            .declare(&mounts, &config.metrics_tools);
        let tool_labels = !config.metrics_tools.is_empty();
        let reporting = Reporting {
            requests: table,
            lines: config.access_log,
            tool_labels,
            tracer: lasting.tracer.clone(),
            routes: mounts.iter().map(|m| Arc::from(*m)).collect(),
        };
        let access = match before {
            Some(before) => before.access.reconfigured(reporting),
            None => Access::new(reporting),
        };
        Ok(Configured {
            routes,
            edge,
            shared,
            access,
        })
    }

    /// The route mounted at `path`.
    pub fn route_of(&self, path: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.path == path)
    }

    /// The running upstream of `up`'s path, if its configuration is the
    /// same: it is carried over whole.
    fn unchanged(&self, up: &UpstreamConfig) -> Option<&Route> {
        let was = self
            .shared
            .config
            .upstream
            .iter()
            .find(|u| u.path == up.path)?;
        (was == up).then(|| self.route_of(up.path.trim_end_matches('/')))?
    }
}

/// The token keys `config` names (or the data dir's own).
fn keyring(config: &Config) -> anyhow::Result<Keyring> {
    let tokens = &config.tokens;
    let previous = tokens.previous_key_file.as_deref().map(|file| {
        let window = tokens.previous_key_window_secs.saturating_mul(1000);
        (file, crate::store::now_ms().saturating_add(window))
    });
    Keyring::load(&config.data_dir, tokens.key_file.as_deref(), previous)
        .map_err(|e| anyhow::anyhow!("cannot load the token key: {e}"))
}

/// The route of `up`: its upstream carried over when unchanged, else new.
fn route(
    up: &UpstreamConfig,
    shared: &Arc<Shared>,
    before: Option<&Configured>,
) -> anyhow::Result<Route> {
    let kept = before.and_then(|b| b.unchanged(up));
    let upstream = match (kept, &up.command) {
        (Some(kept), _) => kept.upstream.clone(),
        (None, Some(_)) => Upstream::Stdio(Arc::new(StdioUpstream::new(up, &shared.config.limits))),
        (None, None) => {
            let workers = shared.config.workers();
            let mount = up.path.trim_end_matches('/');
            let meter = shared.log.metrics().replica_meter(mount);
            Upstream::Http(Arc::new(
                HttpUpstream::new(up, workers, meter).map_err(anyhow::Error::msg)?,
            ))
        }
    };
    let mut dialects = shared.config.dialects.clone();
    dialects.resume_tokens = up.resume_tokens.clone();
    dialects.tasks = up.tasks.clone();
    Ok(Route {
        path: up.path.trim_end_matches('/').to_owned(),
        upstream,
        dialects,
        tasks: kept.map(|k| k.tasks.clone()).unwrap_or_default(),
        shared: shared.clone(),
    })
}
