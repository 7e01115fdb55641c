//! Reload: a configuration applied to a running proxy (SIGHUP), without a
//! restart and without touching a call in flight.
//!
//! Everything is built beside the running configuration first — the TLS
//! files read, the token keys loaded, every route, the edge, `[auth]` — and
//! only when all of it stands is it swapped in: a file that does not parse,
//! validate or load changes nothing. What a configuration makes of the
//! proxy is swapped whole ([`Configured`]); a request holds the one it
//! started with, so running calls finish on the upstream they started on,
//! and an unchanged upstream is carried over with its connections, children
//! and tasks. New connections get the new certificate and front-door limits
//! ([`FrontDoor`]). Sessions and live streams belong to what outlives every
//! configuration (the log), and stay.
//!
//! What the running process cannot change is refused with its key named:
//! where it listens and keeps its log, the store, its worker threads, its log
//! format, `[tracing]` (its tracer and exporter are made at start-up),
//! whether it serves TLS at all, and a stdio upstream (its children belong
//! to sessions). An HTTP upstream may be added, removed or changed;
//! the sessions of a removed one end for their clients (404), and those of a
//! changed one meet the new server as after an upstream restart.

use std::sync::Arc;

use super::configured::Configured;
use super::front_door::FrontDoor;
use super::App;
use crate::config::Config;
use crate::upstream::Upstream;

/// A reload that was refused, and why (for the log).
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A configuration built beside the running one, ready to be swapped in.
pub struct Prepared {
    configured: Configured,
}

impl App {
    /// Builds what `config` makes of the proxy, beside the running one.
    pub fn prepare(&self, config: Config) -> Result<Prepared, Refused> {
        let now = self.now();
        fixed(&now.shared.config, &config)?;
        let configured = Configured::build(config, &self.lasting, Some(&now))
            .map_err(|e| Refused(format!("{e:#}")))?;
        Ok(Prepared { configured })
    }

    /// Swaps `prepared` in: requests that arrive from now on get it.
    pub fn install(&self, prepared: Prepared) {
        forget_replicas_gone(
            &self.now(),
            &prepared.configured,
            self.lasting.log.metrics(),
        );
        let config = &prepared.configured.shared.config;
        self.lasting.sessions.set_limits(&config.limits);
        let bound = config.limits.max_retained_streams;
        self.lasting.log.store().set_retained_bound(bound);
        self.configured.store(Arc::new(prepared.configured));
    }
}

/// The replicas of each HTTP upstream of a configured proxy, by mount.
fn replicas_of(configured: &Configured) -> Vec<(&str, Vec<Arc<str>>)> {
    let of = |route: &crate::proxy::Route| match &route.upstream {
        Upstream::Http(up) => up.replicas().all().iter().map(|r| r.name.clone()).collect(),
        Upstream::Stdio(_) => Vec::new(),
    };
    let routes = configured.routes.iter();
    routes.map(|r| (r.path.as_str(), of(r))).collect()
}

/// Takes the series of the replicas `was` had and `now` has not (dropped
/// from `urls`, or their upstream removed) off the metrics page: a replica
/// nothing will send to again is not one to watch. Requests still running
/// there count on, unseen.
fn forget_replicas_gone(was: &Configured, now: &Configured, metrics: &crate::metrics::Metrics) {
    let kept = replicas_of(now);
    for (mount, names) in replicas_of(was) {
        let still = kept.iter().find(|(m, _)| *m == mount).map(|(_, n)| n);
        let meter = metrics.replica_meter(mount);
        for name in names {
            if !still.is_some_and(|n| n.contains(&name)) {
                meter.forget(&name);
            }
        }
    }
}

/// The front door `config` asks for: its TLS files read now.
pub fn front_door(
    config: &Config,
    handler: Arc<dyn super::front_door::Handler>,
) -> Result<FrontDoor, Refused> {
    let tls = config
        .tls
        .as_ref()
        .map(crate::tls::acceptor)
        .transpose()
        .map_err(|e| Refused(e.to_string()))?;
    Ok(FrontDoor::new(handler, tls, config))
}

/// Refuses what a running process cannot change.
fn fixed(was: &Config, new: &Config) -> Result<(), Refused> {
    let restart = |key: &str| Err(Refused(format!("{key} cannot change without a restart")));
    if was.listen != new.listen {
        return restart("listen");
    }
    if was.data_dir != new.data_dir {
        return restart("data_dir");
    }
    if was.workers != new.workers {
        return restart("workers");
    }
    if was.log_format != new.log_format {
        return restart("log_format");
    }
    if was.store != new.store {
        return restart("[store]");
    }
    if was.tracing != new.tracing {
        // The tracer and its batch thread are made once, at start-up.
        return restart("[tracing]");
    }
    if was.tls.is_some() != new.tls.is_some() {
        return restart("whether [tls] is set (the listener's scheme)");
    }
    for stdio in was.upstream.iter().filter(|u| u.command.is_some()) {
        if !new.upstream.iter().any(|u| u == stdio) {
            return Err(Refused(format!(
                "the stdio upstream at {} cannot change or go without a restart: its children \
                 belong to sessions",
                stdio.path
            )));
        }
    }
    Ok(())
}

/// The keys of `was` that `new` changes, for the log line of a reload.
pub fn changed(was: &Config, new: &Config) -> Vec<String> {
    let mut keys = Vec::new();
    let mut note = |key: &str, differs: bool| {
        if differs {
            keys.push(key.to_owned());
        }
    };
    note("upstream", was.upstream != new.upstream);
    note("[limits]", was.limits != new.limits);
    note("[auth]", was.auth != new.auth);
    note("[cors]", was.cors != new.cors);
    note("[tls]", was.tls != new.tls);
    note("[tokens]", was.tokens != new.tokens);
    note("[dialects]", was.dialects != new.dialects);
    note("[sse]", was.sse != new.sse);
    note(
        "allowed_origins",
        was.allowed_origins != new.allowed_origins,
    );
    note("allowed_hosts", was.allowed_hosts != new.allowed_hosts);
    note("public_url", was.public_url != new.public_url);
    note(
        "trusted_proxies",
        was.trusted_proxies != new.trusted_proxies,
    );
    note(
        "principal_header",
        was.principal_header != new.principal_header,
    );
    note("max_body", was.max_body != new.max_body);
    note("metrics", was.metrics != new.metrics);
    note("metrics_tools", was.metrics_tools != new.metrics_tools);
    note("access_log", was.access_log != new.access_log);
    note(
        "drain_delay_secs",
        was.drain_delay_secs != new.drain_delay_secs,
    );
    note(
        "shutdown_grace_secs",
        was.shutdown_grace_secs != new.shutdown_grace_secs,
    );
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        Config::from_toml(&format!(
            "{extra}\n[[upstream]]\nurl = \"http://127.0.0.1:1/mcp\"\n"
        ))
        .expect("a valid configuration")
    }

    #[test]
    fn where_it_listens_and_keeps_its_log_cannot_change() {
        let was = config("");
        let err = fixed(&was, &config("listen = \"127.0.0.1:9999\"")).unwrap_err();
        assert!(err.0.starts_with("listen cannot change"), "{err}");
        let err = fixed(&was, &config("data_dir = \"/elsewhere\"")).unwrap_err();
        assert!(err.0.starts_with("data_dir cannot change"), "{err}");
        let err = fixed(&was, &config("[store]\nretention_secs = 5")).unwrap_err();
        assert!(err.0.starts_with("[store] cannot change"), "{err}");
    }

    #[test]
    fn how_many_replicas_a_write_waits_for_cannot_change() {
        let redis = "[store]\nbackend = \"redis\"\n";
        let key = "[tokens]\nkey_file = \"k\"";
        let was = config(&format!("{redis}{key}"));
        for set in ["min_replicas = 1", "replica_wait_ms = 200"] {
            let err = fixed(&was, &config(&format!("{redis}{set}\n{key}"))).unwrap_err();
            assert!(err.0.starts_with("[store] cannot change"), "{set}: {err}");
        }
    }

    #[test]
    fn where_traces_go_cannot_change() {
        let was = config("");
        let on = config("[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"");
        let err = fixed(&was, &on).unwrap_err();
        assert!(err.0.starts_with("[tracing] cannot change"), "{err}");
        let renamed = config("[tracing]\nservice_name = \"edge\"");
        assert!(fixed(&was, &renamed).is_err());
        assert!(fixed(&on, &on).is_ok());
    }

    #[test]
    fn limits_auth_and_upstream_urls_may_change() {
        let was = config("");
        let new = Config::from_toml(
            "max_body = 2048\n[limits]\nmax_sessions = 3\n[[upstream]]\nurl = \"http://127.0.0.1:2/mcp\"\n",
        )
        .expect("valid");
        assert!(fixed(&was, &new).is_ok());
        assert_eq!(changed(&was, &new), ["upstream", "[limits]", "max_body"]);
    }

    #[test]
    fn a_stdio_upstream_stays_as_it_is() {
        let stdio = "[[upstream]]\npath = \"/tools\"\ncommand = [\"server\"]\n";
        let was = config(stdio);
        assert!(fixed(&was, &config(stdio)).is_ok());
        let changed = config("[[upstream]]\npath = \"/tools\"\ncommand = [\"other-server\"]\n");
        let err = fixed(&was, &changed).unwrap_err();
        assert!(err.0.contains("stdio upstream at /tools"), "{err}");
        assert!(fixed(&was, &config("")).is_err(), "gone");
    }
}
