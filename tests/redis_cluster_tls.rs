//! Redis Cluster over TLS with an ACL user (`redis_cluster =
//! ["rediss://…"]` with `redis_username`, `redis_password_file` and
//! `redis_ca_file`, the keys single-server TLS takes): a private cluster of
//! three primaries serving TLS, its bus and replication over TLS too
//! (`common::redis_cluster`), with a test CA and a user of its own; one
//! cluster for the whole file, since a cluster is slow to start. The proxy
//! is given only the TLS ports and learns the others from the cluster over
//! TLS.

mod common;

use std::sync::OnceLock;

use common::redis_cluster::RedisCluster;
use common::redis_server::Tls;
use common::tls::Pki;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::Server;

const USER: &str = "mcp-proxy";
const PASSWORD: &str = "a password only the file holds";

/// The TLS cluster of this file's tests and its CA, started by the first.
fn cluster() -> &'static (Pki, RedisCluster) {
    static SHARED: OnceLock<(Pki, RedisCluster)> = OnceLock::new();
    SHARED.get_or_init(|| {
        let pki = Pki::new();
        let tls = Tls {
            client_certificates: false,
            port: 0,
            cert: pki.server_cert_file.clone(),
            key: pki.server_key_file.clone(),
            ca: pki.ca_file.clone(),
            users: vec![(USER.into(), PASSWORD.into())],
        };
        let cluster = RedisCluster::start_tls(3, 0, tls).unwrap_or_else(|why| panic!("{why}"));
        (pki, cluster)
    })
}

/// A proxy configuration on the TLS cluster as [`USER`], trusting `ca`,
/// its keys under `prefix`, its data dir `dir`.
fn config_on(ca: &std::path::Path, prefix: &str, dir: &std::path::Path) -> Config {
    let (_, cluster) = cluster();
    let password_file = dir.join("redis.password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).expect("password file");
    let mut config = common::failover::redis_proxy_config(dir, prefix, 0);
    config.store.redis_cluster = cluster.tls_urls();
    config.store.redis_username = Some(USER.into());
    config.store.redis_password_file = Some(password_file);
    config.store.redis_ca_file = Some(ca.to_path_buf());
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_begun_on_one_instance_is_resumed_on_another_over_a_tls_cluster_as_an_acl_user() {
    let (pki, cluster) = cluster();
    let (servers, _upstream, _dirs) = common::failover::a_call_resumed_on_another_instance(|dir| {
        config_on(&pki.ca_file, "tls-cluster-resume", dir)
    })
    .await;
    // Every node's `default` user needs no password: what shows the
    // password was used is who the proxy's connections are, on the
    // primary that holds the log.
    let primary = cluster
        .primary_of("{tls-cluster-resume}")
        .expect("a primary holds the log");
    let mut plain = common::redis_server::connect(&format!("redis://127.0.0.1:{primary}"))
        .expect("the rig's plain port");
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut plain)
        .expect("CLIENT LIST");
    assert!(clients.contains(&format!("user={USER} ")), "{clients}");
    for server in servers {
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_certificate_from_another_ca_stops_the_start_saying_why() {
    cluster();
    let stranger = Pki::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = config_on(&stranger.ca_file, "tls-cluster-refused", dir.path());
    config.upstream = vec![UpstreamConfig::new("http://127.0.0.1:1/mcp")];
    let err = match Server::start(config).await {
        Ok(_) => panic!("an untrusted certificate must stop the start"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("redis cluster"), "{err}");
    assert!(err.contains("certificate"), "{err}");
}
