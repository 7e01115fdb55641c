//! The Redis log over TLS with an ACL user, as managed Redis is reached: a
//! real `redis-server` with `--tls-port`, a test CA, and a user of its own;
//! the password from a file, never from the configuration.

mod common;

use common::redis_server::{RedisServer, Tls};
use common::tls::Pki;
use common::*;
use mcp_resume_proxy::config::{Backend, Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::Server;

const USER: &str = "mcp-proxy";
const PASSWORD: &str = "a password only the file holds";

/// A TLS Redis with the ACL user [`USER`], its certificate from `pki`.
fn tls_redis(pki: &Pki) -> RedisServer {
    tls_redis_asking(pki, false)
}

/// The same, asking clients for a certificate from `pki`'s CA when
/// `client_certificates`.
fn tls_redis_asking(pki: &Pki, client_certificates: bool) -> RedisServer {
    let tls = Tls {
        client_certificates,
        port: 0,
        cert: pki.server_cert_file.clone(),
        key: pki.server_key_file.clone(),
        ca: pki.ca_file.clone(),
        users: vec![(USER.into(), PASSWORD.into())],
    };
    RedisServer::start_tls(tls).unwrap_or_else(|why| panic!("{why}"))
}

/// A proxy configuration on `redis` over TLS as [`USER`], trusting `ca`,
/// with the password in `password` (a file written here).
fn config_on(
    redis: &RedisServer,
    ca: &std::path::Path,
    password: &str,
    dir: &std::path::Path,
) -> Config {
    let password_file = dir.join("redis.password");
    std::fs::write(&password_file, format!("{password}\n")).expect("password file");
    let key = dir.join("token.key");
    std::fs::write(&key, [7u8; 32]).expect("key file");
    let mut config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    config.store.backend = Backend::Redis;
    config.store.redis_url = redis.tls_url();
    config.store.redis_username = Some(USER.into());
    config.store.redis_password_file = Some(password_file);
    config.store.redis_ca_file = Some(ca.to_path_buf());
    config.store.key_prefix = "tls-test".into();
    config.tokens.key_file = Some(key);
    config
}

async fn demo() -> DemoUpstream {
    DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_logged_and_resumed_over_tls_as_an_acl_user() {
    let pki = Pki::new();
    let redis = tls_redis(&pki);
    let upstream = demo().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = config_on(&redis, &pki.ca_file, PASSWORD, dir.path());
    config.upstream = vec![UpstreamConfig::new(upstream.url())];
    let server = Server::start(config)
        .await
        .expect("the proxy starts on TLS Redis");
    let client = McpClient::new(format!("http://{}/mcp", server.addr));
    let (sid, first) = a_session_with_a_finished_call(&client).await;
    let resumed = client
        .send(Call::get().session(&sid).header("last-event-id", &first))
        .await;
    let replayed = messages(resumed).await;
    let last = replayed.last().expect("the rest of the call");
    assert_eq!(last["id"], 2, "{last}");
    assert!(last.get("result").is_some(), "{last}");
    let mut plain = common::redis_server::connect(&redis.url()).expect("the plain port");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tls-test*")
        .query(&mut plain)
        .expect("KEYS");
    assert!(!keys.is_empty(), "the log is in Redis");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_stops_the_start_without_printing_it() {
    let pki = Pki::new();
    let redis = tls_redis(&pki);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = config_on(&redis, &pki.ca_file, "not the password", dir.path());
    config.upstream = vec![UpstreamConfig::new("http://127.0.0.1:1/mcp")];
    let err = match Server::start(config).await {
        Ok(_) => panic!("a wrong password must stop the start"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("redis"), "{err}");
    assert!(!err.contains("not the password"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_certificate_from_another_ca_stops_the_start() {
    let (pki, stranger) = (Pki::new(), Pki::new());
    let redis = tls_redis(&pki);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = config_on(&redis, &stranger.ca_file, PASSWORD, dir.path());
    config.upstream = vec![UpstreamConfig::new("http://127.0.0.1:1/mcp")];
    let err = match Server::start(config).await {
        Ok(_) => panic!("an untrusted certificate must stop the start"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("redis"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_begun_on_one_instance_is_resumed_on_another_over_tls() {
    let pki = Pki::new();
    let redis = tls_redis(&pki);
    let (servers, _upstream, _dirs) = common::failover::a_call_resumed_on_another_instance(|dir| {
        config_on(&redis, &pki.ca_file, PASSWORD, dir)
    })
    .await;
    for server in servers {
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_to_a_redis_that_asks_for_one() {
    let pki = Pki::new();
    let redis = tls_redis_asking(&pki, true);
    let upstream = demo().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = config_on(&redis, &pki.ca_file, PASSWORD, dir.path());
    config.upstream = vec![UpstreamConfig::new(upstream.url())];
    let without = match Server::start(config.clone()).await {
        Ok(_) => panic!("without a client certificate Redis refuses the connection"),
        Err(e) => format!("{e:#}"),
    };
    assert!(without.contains("redis"), "{without}");
    let (cert, key) = pki.client_files("proxy");
    config.store.redis_client_cert = Some(cert);
    config.store.redis_client_key = Some(key);
    let server = Server::start(config)
        .await
        .expect("the proxy starts with its certificate");
    let client = McpClient::new(format!("http://{}/mcp", server.addr));
    let (sid, _) = a_session_with_a_finished_call(&client).await;
    assert!(!sid.is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_from_the_environment_logs_in_the_acl_user() {
    let pki = Pki::new();
    let redis = tls_redis(&pki);
    let keys = tempfile::tempdir().expect("temp dir");
    let key = keys.path().join("token.key");
    std::fs::write(&key, [7u8; 32]).expect("key file");
    let toml = format!(
        "[store]\nbackend = \"redis\"\nredis_url = \"{}\"\nredis_username = \"{USER}\"\n\
         redis_ca_file = \"{}\"\nkey_prefix = \"env-password\"\n\n[tokens]\nkey_file = \"{}\"\n",
        redis.tls_url(),
        pki.ca_file.display(),
        key.display(),
    );
    let env = [("MCP_RESUME_PROXY_REDIS_PASSWORD", PASSWORD)];
    let on = common::process::OnAFile::start(&toml, &env, false).await;
    let client = McpClient::new(format!("http://{}/mcp", on.proxy.addr));
    a_session_with_a_finished_call(&client).await;
    // The server's `default` user needs no password: what shows the
    // password was used is who the proxy's connections are.
    let mut plain = common::redis_server::connect(&redis.url()).expect("the plain port");
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut plain)
        .expect("CLIENT LIST");
    let as_user = format!("user={USER} ");
    assert!(clients.contains(&as_user), "{clients}");
}
