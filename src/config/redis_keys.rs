//! The Redis keys of `[store]` that must agree with one another: a URL
//! with no password in it and no certificate check turned off, and Redis
//! Sentinel's keys — the sentinels and the primary's name together, in
//! place of a server in `redis_url`, reached one way (all `redis://` or all
//! `rediss://`); Redis Cluster's nodes, in place of both, reached one way,
//! on database 0 (a cluster has no other). It only refuses; the store reads
//! the keys (`store::redis::endpoint`).

use super::{Backend, StoreConfig};

impl StoreConfig {
    /// The Sentinel keys: the sentinels and the primary's name together,
    /// for Redis only, in place of a server in `redis_url`, one scheme for
    /// all. Returns that scheme, when there are sentinels.
    pub(super) fn check_sentinels(&self) -> Result<Option<&str>, String> {
        let sentinels = &self.redis_sentinels;
        let named = self
            .redis_sentinel_master
            .as_deref()
            .is_some_and(|m| !m.trim().is_empty());
        if sentinels.is_empty() {
            if self.redis_sentinel_master.is_some() || self.redis_sentinel_password_file.is_some() {
                return Err(
                    "store.redis_sentinel_master and store.redis_sentinel_password_file \
                            need store.redis_sentinels"
                        .into(),
                );
            }
            return Ok(None);
        }
        if self.backend != Backend::Redis {
            return Err("store.redis_sentinels needs backend = \"redis\"".into());
        }
        if !named {
            return Err(
                "store.redis_sentinels needs store.redis_sentinel_master: the name the \
                        sentinels know the primary by"
                    .into(),
            );
        }
        if self.redis_url != StoreConfig::default().redis_url {
            return Err(format!(
                "store.redis_url = {} names a server, and store.redis_sentinels ask for the \
                 primary: give one or the other",
                self.redis_url
            ));
        }
        let mut schemes = Vec::new();
        for url in sentinels {
            check_redis_url("store.redis_sentinels", url)?;
            let scheme = url.split_once("://").map_or("", |(s, _)| s);
            if !matches!(scheme, "redis" | "rediss") {
                return Err(format!(
                    "store.redis_sentinels: {url} is not a redis:// or rediss:// URL"
                ));
            }
            schemes.push(scheme);
        }
        if schemes.iter().any(|s| *s != schemes[0]) {
            return Err(
                "store.redis_sentinels mixes redis:// and rediss://: all sentinels \
                        (and so the data nodes) are reached one way"
                    .into(),
            );
        }
        Ok(Some(schemes[0]))
    }
}

impl StoreConfig {
    /// The cluster's nodes: for Redis only, in place of a server in
    /// `redis_url` and of sentinels, one scheme for all, database 0.
    /// Returns that scheme, when there are nodes.
    pub(super) fn check_cluster(&self) -> Result<Option<&str>, String> {
        let nodes = &self.redis_cluster;
        self.check_partitions()?;
        if nodes.is_empty() {
            return Ok(None);
        }
        if self.backend != Backend::Redis {
            return Err("store.redis_cluster needs backend = \"redis\"".into());
        }
        if !self.redis_sentinels.is_empty() || self.redis_sentinel_master.is_some() {
            return Err(
                "store.redis_cluster and store.redis_sentinels both say where the primary \
                 is: a cluster finds its own primaries, give one or the other"
                    .into(),
            );
        }
        if self.redis_url != StoreConfig::default().redis_url {
            return Err(format!(
                "store.redis_url = {} names a server, and store.redis_cluster the nodes of a \
                 cluster: give one or the other",
                self.redis_url
            ));
        }
        let mut schemes = Vec::new();
        for url in nodes {
            schemes.push(check_node(url)?);
        }
        if schemes.iter().any(|s| *s != schemes[0]) {
            return Err(
                "store.redis_cluster mixes redis:// and rediss://: all nodes are reached one way"
                    .into(),
            );
        }
        Ok(Some(schemes[0]))
    }
}

impl StoreConfig {
    /// `partitions`: on a cluster only (one server holds the whole log
    /// anyway), from 1 to the most an id's byte can pick.
    fn check_partitions(&self) -> Result<(), String> {
        let Some(n) = self.partitions else {
            return Ok(());
        };
        if self.redis_cluster.is_empty() {
            return Err(
                "store.partitions spreads a log over a cluster's primaries: it needs \
                 store.redis_cluster"
                    .into(),
            );
        }
        let most = crate::store::redis::MAX_PARTITIONS;
        if n == 0 || n > most {
            return Err(format!(
                "store.partitions = {n}: give 1 (the log in one slot) to {most}"
            ));
        }
        Ok(())
    }
}

/// One node of `store.redis_cluster`: a Redis URL of database 0; its scheme.
fn check_node(url: &str) -> Result<&str, String> {
    const KEY: &str = "store.redis_cluster";
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    if !matches!(scheme, "redis" | "rediss") {
        return Err(format!("{KEY}: {url} is not a redis:// or rediss:// URL"));
    }
    check_redis_url(KEY, url)?;
    let db = redis::IntoConnectionInfo::into_connection_info(url)
        .map(|info| info.redis_settings().db())
        .map_err(|e| format!("{KEY}: {url}: {e}"))?;
    if db != 0 {
        return Err(format!(
            "{KEY}: {url} names database {db}: a cluster has database 0 only"
        ));
    }
    Ok(scheme)
}

/// One Redis URL of `key`: no password in it, no certificate check turned
/// off (`#insecure`), and one the client can read.
pub(super) fn check_redis_url(key: &str, url: &str) -> Result<(), String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        if userinfo.contains(':') {
            return Err(format!(
                "{key} holds a password: give it in store.redis_password_file \
                 or MCP_RESUME_PROXY_REDIS_PASSWORD, never in the configuration"
            ));
        }
    }
    if url.contains("#insecure") {
        return Err(format!(
            "{key}: {url} turns off the check of the server's certificate (#insecure): \
             refused; trust its CA with store.redis_ca_file instead"
        ));
    }
    redis::IntoConnectionInfo::into_connection_info(url)
        .map(|_| ())
        .map_err(|e| format!("{key}: {url}: {e}"))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const UP: &str = "[[upstream]]\nurl = \"http://a/\"\n";
    const KEY: &str = "[tokens]\nkey_file = \"/etc/k\"\n";

    fn refused(store: &str) -> String {
        let toml = format!("[store]\nbackend = \"redis\"\n{store}\n{UP}");
        Config::from_toml(&toml).unwrap_err().0
    }

    #[test]
    fn sentinels_and_the_primary_name_make_a_valid_configuration() {
        let store = "redis_sentinels = [\"redis://10.0.0.1:26379\", \"redis://10.0.0.2:26379\"]\n\
                     redis_sentinel_master = \"mcp\"";
        let toml = format!("[store]\nbackend = \"redis\"\n{store}\n{KEY}{UP}");
        let c = Config::from_toml(&toml).expect("valid");
        let at = c.store.redis_endpoint();
        assert_eq!(at.sentinels.len(), 2);
        assert_eq!(at.sentinel_master.as_deref(), Some("mcp"));
    }

    #[test]
    fn sentinels_without_the_primary_name_are_refused() {
        let err = refused("redis_sentinels = [\"redis://s:26379\"]");
        assert!(err.contains("needs store.redis_sentinel_master"), "{err}");
        let err = refused("redis_sentinels = [\"redis://s:26379\"]\nredis_sentinel_master = \" \"");
        assert!(err.contains("needs store.redis_sentinel_master"), "{err}");
    }

    #[test]
    fn a_primary_name_without_sentinels_is_refused() {
        let err = refused("redis_sentinel_master = \"mcp\"");
        assert!(err.contains("need store.redis_sentinels"), "{err}");
    }

    #[test]
    fn a_server_in_redis_url_and_sentinels_are_refused_together() {
        let err = refused(
            "redis_url = \"redis://10.0.0.5:6379/0\"\nredis_sentinels = [\"redis://s:26379\"]\n\
             redis_sentinel_master = \"mcp\"",
        );
        assert!(err.contains("give one or the other"), "{err}");
    }

    #[test]
    fn sentinels_with_another_backend_are_refused() {
        let toml = format!(
            "[store]\nredis_sentinels = [\"redis://s:26379\"]\nredis_sentinel_master = \"m\"\n{UP}"
        );
        let err = Config::from_toml(&toml).unwrap_err().0;
        assert!(err.contains("needs backend = \"redis\""), "{err}");
    }

    #[test]
    fn a_sentinel_url_with_a_password_or_of_another_scheme_or_mixed_is_refused() {
        let named = "redis_sentinel_master = \"m\"";
        let err = refused(&format!(
            "redis_sentinels = [\"redis://u:secret@s:26379\"]\n{named}"
        ));
        assert!(err.contains("holds a password"), "{err}");
        assert!(!err.contains("secret"), "{err}");
        let err = refused(&format!("redis_sentinels = [\"http://s:26379\"]\n{named}"));
        assert!(err.contains("store.redis_sentinels"), "{err}");
        let err = refused(&format!(
            "redis_sentinels = [\"redis://a:26379\", \"rediss://b:26379\"]\n{named}"
        ));
        assert!(err.contains("mixes redis:// and rediss://"), "{err}");
    }

    #[test]
    fn tls_that_does_not_verify_is_refused() {
        let named = "redis_sentinel_master = \"m\"";
        let err = refused(&format!(
            "redis_sentinels = [\"rediss://s:26379/#insecure\"]\n{named}"
        ));
        assert!(err.contains("#insecure"), "{err}");
        let err = refused("redis_url = \"rediss://r:6380/0#insecure\"");
        assert!(err.contains("turns off the check"), "{err}");
    }

    const NODES: &str = "redis_cluster = [\"redis://10.0.0.1:7000\", \"redis://10.0.0.2:7000\"]";

    #[test]
    fn cluster_nodes_make_a_valid_configuration() {
        let toml = format!("[store]\nbackend = \"redis\"\n{NODES}\n{KEY}{UP}");
        let c = Config::from_toml(&toml).expect("valid");
        assert_eq!(c.store.redis_endpoint().cluster.len(), 2);
    }

    #[test]
    fn partitions_on_a_cluster_are_kept_and_default_to_sixteen() {
        let toml = format!("[store]\nbackend = \"redis\"\n{NODES}\npartitions = 4\n{KEY}{UP}");
        let c = Config::from_toml(&toml).expect("valid");
        assert_eq!(c.store.redis_endpoint().partitions(), 4);
        let toml = format!("[store]\nbackend = \"redis\"\n{NODES}\n{KEY}{UP}");
        let c = Config::from_toml(&toml).expect("valid");
        assert_eq!(c.store.redis_endpoint().partitions(), 16);
    }

    #[test]
    fn partitions_without_a_cluster_or_out_of_range_are_refused() {
        let err = refused("partitions = 4");
        assert!(err.contains("it needs store.redis_cluster"), "{err}");
        for n in [0, 257] {
            let err = refused(&format!("{NODES}\npartitions = {n}"));
            assert!(err.contains("give 1 (the log in one slot) to 256"), "{err}");
        }
    }

    #[test]
    fn cluster_nodes_with_a_server_or_sentinels_or_another_backend_are_refused() {
        let err = refused(&format!("redis_url = \"redis://10.0.0.5:6379/0\"\n{NODES}"));
        assert!(err.contains("give one or the other"), "{err}");
        assert!(err.contains("store.redis_cluster"), "{err}");
        let sentinels = "redis_sentinels = [\"redis://s:26379\"]\nredis_sentinel_master = \"m\"";
        let err = refused(&format!("{sentinels}\n{NODES}"));
        assert!(
            err.contains("store.redis_cluster and store.redis_sentinels"),
            "{err}"
        );
        let err = Config::from_toml(&format!("[store]\n{NODES}\n{UP}"))
            .unwrap_err()
            .0;
        assert!(
            err.contains("store.redis_cluster needs backend = \"redis\""),
            "{err}"
        );
    }

    #[test]
    fn a_cluster_node_with_a_password_another_database_or_scheme_or_mixed_is_refused() {
        let err = refused("redis_cluster = [\"redis://u:secret@n:7000\"]");
        assert!(err.contains("holds a password"), "{err}");
        assert!(!err.contains("secret"), "{err}");
        let err = refused("redis_cluster = [\"redis://n:7000/3\"]");
        assert!(
            err.contains("database 3: a cluster has database 0 only"),
            "{err}"
        );
        let err = refused("redis_cluster = [\"http://n:7000\"]");
        assert!(err.contains("not a redis:// or rediss:// URL"), "{err}");
        let err = refused("redis_cluster = [\"redis://a:7000\", \"rediss://b:7000\"]");
        assert!(err.contains("mixes redis:// and rediss://"), "{err}");
        let tls = "redis_cluster = [\"rediss://n:7000\"]\nredis_ca_file = \"/ca.pem\"";
        let toml = format!("[store]\nbackend = \"redis\"\n{tls}\n{KEY}{UP}");
        Config::from_toml(&toml).expect("TLS files go with rediss:// nodes");
        let err = refused("redis_cluster = [\"redis://n:7000\"]\nredis_ca_file = \"/ca.pem\"");
        assert!(err.contains("store.redis_ca_file is for TLS"), "{err}");
    }

    #[test]
    fn tls_files_go_with_rediss_sentinels() {
        let named = "redis_sentinel_master = \"m\"\nredis_ca_file = \"/ca.pem\"";
        let err = refused(&format!("redis_sentinels = [\"redis://s:26379\"]\n{named}"));
        assert!(err.contains("store.redis_ca_file is for TLS"), "{err}");
        let toml = format!(
            "[store]\nbackend = \"redis\"\nredis_sentinels = [\"rediss://s:26379\"]\n{named}\n{KEY}{UP}"
        );
        Config::from_toml(&toml).expect("valid");
    }
}
