//! Reload without a restart: the real binary re-reads its configuration
//! file on SIGHUP and applies it, or keeps the running one and says why;
//! an in-process server swaps its TLS certificate for new connections.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::process::{free_addr, ProxyProcess};
use common::scrape::{sample, scrape};
use common::tls::Pki;
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::Server;
use serde_json::json;

const APPLIED: &str = "mcp_proxy_config_reloads_total{result=\"applied\"}";
const REFUSED: &str = "mcp_proxy_config_reloads_total{result=\"refused\"}";

/// A proxy process on a configuration file the test rewrites.
struct Reloadable {
    proxy: ProxyProcess,
    file: std::path::PathBuf,
    log: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl Reloadable {
    async fn start(toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("proxy.toml");
        std::fs::write(&file, toml).expect("config file");
        let log = dir.path().join("proxy.log");
        let path = file.display().to_string();
        let env = [("RUST_LOG", "warn,mcp_resume_proxy=info")];
        let proxy =
            ProxyProcess::start_logged(&["--config", &path], dir.path(), free_addr(), &env, &log)
                .await;
        Self {
            proxy,
            file,
            log,
            dir,
        }
    }

    /// Writes `toml` as the configuration, sends SIGHUP, and waits for the
    /// reload's counter to move.
    async fn reload(&self, toml: &str) -> String {
        std::fs::write(&self.file, toml).expect("config file");
        let client = self.proxy.client();
        let before = scrape(&client).await;
        let done = sample(&before, APPLIED) + sample(&before, REFUSED);
        self.proxy.signal(libc::SIGHUP);
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let page = scrape(&client).await;
            if sample(&page, APPLIED) + sample(&page, REFUSED) > done {
                return page;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no reload was counted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the proxy logged, once `text` is in it (lines are written
    /// every 100 ms).
    async fn logged(&self, text: &str) -> String {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if log.contains(text) || tokio::time::Instant::now() > deadline {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn upstream_toml(url: &str) -> String {
    format!("[[upstream]]\nurl = \"{url}\"\n")
}

async fn demo() -> DemoUpstream {
    DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts")
}

#[tokio::test]
async fn a_changed_upstream_url_lets_running_calls_finish_and_takes_new_ones() {
    let (a, b) = (demo().await, demo().await);
    let proxy = Reloadable::start(&upstream_toml(&a.url())).await;
    let client = proxy.proxy.client();
    let sid = client.initialize(V_LATEST).await;
    let running = client
        .send(Call::post(&slow_call(2, 5, 100)).session(&sid))
        .await;
    let page = proxy.reload(&upstream_toml(&b.url())).await;
    assert_eq!(sample(&page, APPLIED), 1.0);
    let answer = messages(running).await;
    let last = answer.last().expect("an answer");
    assert_eq!(last["id"], 2, "{last}");
    assert!(last.get("result").is_some(), "{last}");
    let fresh = client.initialize(V_LATEST).await;
    let call = tool_call(3, "echo", json!({"text": "to b"}));
    read_all(client.send(Call::post(&call).session(&fresh)).await).await;
    assert_eq!(a.stats.calls_started.load(Ordering::Relaxed), 1);
    assert_eq!(b.stats.calls_started.load(Ordering::Relaxed), 1);
    // The session begun on the old server goes on, on the new one.
    let call = tool_call(4, "echo", json!({"text": "old session, to b"}));
    let answer = messages(client.send(Call::post(&call).session(&sid)).await).await;
    assert!(
        answer
            .iter()
            .any(|m| m["id"] == 4 && m.get("result").is_some()),
        "{answer:?}"
    );
    assert_eq!(b.stats.calls_started.load(Ordering::Relaxed), 2);
    let log = proxy.logged("configuration reloaded").await;
    assert!(log.contains("configuration reloaded"), "{log}");
}

#[tokio::test]
async fn a_file_that_does_not_parse_changes_nothing_and_says_why() {
    let a = demo().await;
    let proxy = Reloadable::start(&upstream_toml(&a.url())).await;
    let page = proxy.reload("[[upstream]\nurl = ").await;
    assert_eq!(sample(&page, REFUSED), 1.0);
    assert_eq!(sample(&page, APPLIED), 0.0);
    let log = proxy.logged("configuration not reloaded").await;
    assert!(log.contains("configuration not reloaded"), "{log}");
    let client = proxy.proxy.client();
    let sid = client.initialize(V_LATEST).await;
    let call = tool_call(2, "echo", json!({"text": "still a"}));
    read_all(client.send(Call::post(&call).session(&sid)).await).await;
    assert_eq!(a.stats.calls_started.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_key_that_needs_a_restart_is_refused_by_name() {
    let a = demo().await;
    let proxy = Reloadable::start(&upstream_toml(&a.url())).await;
    let more_threads = format!("workers = 7\n{}", upstream_toml(&a.url()));
    let page = proxy.reload(&more_threads).await;
    assert_eq!(sample(&page, REFUSED), 1.0);
    let log = proxy
        .logged("workers cannot change without a restart")
        .await;
    assert!(
        log.contains("workers cannot change without a restart"),
        "{log}"
    );
}

#[tokio::test]
async fn an_added_upstream_serves_at_once_and_a_removed_one_answers_404() {
    let (a, b) = (demo().await, demo().await);
    let proxy = Reloadable::start(&upstream_toml(&a.url())).await;
    let both = format!(
        "{}[[upstream]]\npath = \"/other\"\nurl = \"{}\"\n",
        upstream_toml(&a.url()),
        b.url()
    );
    proxy.reload(&both).await;
    let other = McpClient::new(format!("http://{}/other", proxy.proxy.addr));
    let sid = other.initialize(V_LATEST).await;
    assert!(!sid.is_empty());
    assert_eq!(b.stats.sessions_created.load(Ordering::Relaxed), 1);
    let only_other = format!("[[upstream]]\npath = \"/other\"\nurl = \"{}\"\n", b.url());
    proxy.reload(&only_other).await;
    let res = proxy
        .proxy
        .client()
        .send(Call::post(&initialize(V_LATEST)))
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_lowered_session_bound_refuses_the_next_initialize() {
    let a = demo().await;
    let proxy = Reloadable::start(&upstream_toml(&a.url())).await;
    let client = proxy.proxy.client();
    client.initialize(V_LATEST).await;
    let bounded = format!("[limits]\nmax_sessions = 1\n{}", upstream_toml(&a.url()));
    proxy.reload(&bounded).await;
    let res = client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// The certificate a new TLS connection to `addr` is shown, trusting `pki`.
async fn certificate_seen(addr: std::net::SocketAddr, pki: &Pki) -> Option<Vec<u8>> {
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(pki.client_config(None)));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
    let tls = connector.connect(name, tcp).await.ok()?;
    let seen = tls.get_ref().1.peer_certificates()?.first()?.to_vec();
    Some(seen)
}

#[tokio::test]
async fn a_swapped_certificate_is_what_new_connections_see() {
    let (before, after) = (Pki::new(), Pki::new());
    let a = demo().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        tls: Some(before.proxy_tls(false)),
        upstream: vec![UpstreamConfig::new(a.url())],
        ..Config::default()
    };
    let server = Server::start(config.clone()).await.expect("proxy starts");
    let seen = certificate_seen(server.addr, &before).await;
    assert_eq!(seen.as_deref(), Some(before.server.cert.as_ref()));
    std::fs::copy(&after.server_cert_file, &before.server_cert_file).expect("new cert");
    std::fs::copy(&after.server_key_file, &before.server_key_file).expect("new key");
    server.reload(config).expect("the reload applies");
    let seen = certificate_seen(server.addr, &after).await;
    assert_eq!(seen.as_deref(), Some(after.server.cert.as_ref()));
    assert!(
        certificate_seen(server.addr, &before).await.is_none(),
        "the old CA no longer verifies"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_certificate_file_that_does_not_load_keeps_the_running_one() {
    let pki = Pki::new();
    let a = demo().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        tls: Some(pki.proxy_tls(false)),
        upstream: vec![UpstreamConfig::new(a.url())],
        ..Config::default()
    };
    let server = Server::start(config.clone()).await.expect("proxy starts");
    std::fs::write(&pki.server_key_file, "not a key").expect("broken key");
    let refused = server
        .reload(config)
        .expect_err("a key that does not load is refused");
    assert!(refused.0.contains("tls.key"), "{refused}");
    let seen = certificate_seen(server.addr, &pki).await;
    assert_eq!(seen.as_deref(), Some(pki.server.cert.as_ref()));
    server.shutdown().await;
}

#[tokio::test]
async fn a_rotated_token_key_still_opens_the_handles_of_the_previous_one() {
    let a = demo().await;
    let keys = tempfile::tempdir().expect("temp dir");
    let (old, new) = (keys.path().join("old.key"), keys.path().join("new.key"));
    std::fs::write(&old, [1u8; 32]).expect("old key");
    std::fs::write(&new, [2u8; 32]).expect("new key");
    let tokens = |file: &std::path::Path, previous: Option<&std::path::Path>| {
        let previous = previous.map_or(String::new(), |p| {
            format!("previous_key_file = \"{}\"\n", p.display())
        });
        format!(
            "[tokens]\nkey_file = \"{}\"\n{previous}{}",
            file.display(),
            upstream_toml(&a.url())
        )
    };
    let proxy = Reloadable::start(&tokens(&old, None)).await;
    let client = proxy.proxy.client();
    let (sid, first) = a_session_with_a_finished_call(&client).await;
    let resume = || Call::get().session(&sid).header("last-event-id", &first);
    let page = proxy.reload(&tokens(&new, Some(&old))).await;
    assert_eq!(sample(&page, APPLIED), 1.0);
    let res = client.send(resume()).await;
    assert_eq!(res.status(), StatusCode::OK, "the old key still opens it");
    read_all(res).await;
    let page = proxy.reload(&tokens(&new, None)).await;
    assert_eq!(sample(&page, APPLIED), 2.0);
    let res = client.send(resume()).await;
    assert_ne!(res.status(), StatusCode::OK, "the old key is gone");
}

/// `mcp-resume-proxy reload --config FILE --data-dir DIR`.
fn reload_command(file: &std::path::Path, dir: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
        .arg("reload")
        .arg("--config")
        .arg(file)
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("the reload command runs")
}

/// The page once a reload was counted.
async fn counted(client: &McpClient) -> String {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let page = scrape(client).await;
        if sample(&page, APPLIED) + sample(&page, REFUSED) > 0.0 {
            return page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload was counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_reload_command_has_the_running_proxy_apply_its_file() {
    let (a, b) = (demo().await, demo().await);
    let proxy = Reloadable::start(&upstream_toml(&a.url())).await;
    std::fs::write(&proxy.file, upstream_toml(&b.url())).expect("config file");
    let out = reload_command(&proxy.file, proxy.dir.path());
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("sent SIGHUP to the proxy"), "{said}");
    let page = counted(&proxy.proxy.client()).await;
    assert_eq!(sample(&page, APPLIED), 1.0);
}

#[tokio::test]
async fn the_reload_command_refuses_an_invalid_file_without_signalling() {
    let a = demo().await;
    let proxy = Reloadable::start(&upstream_toml(&a.url())).await;
    let bad = format!("max_body = 1\n{}", upstream_toml(&a.url()));
    std::fs::write(&proxy.file, bad).expect("config file");
    let out = reload_command(&proxy.file, proxy.dir.path());
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("max_body"),
        "{out:?}"
    );
    let page = scrape(&proxy.proxy.client()).await;
    assert_eq!(sample(&page, APPLIED) + sample(&page, REFUSED), 0.0);
}

#[test]
fn the_reload_command_without_a_running_proxy_exits_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("proxy.toml");
    std::fs::write(&file, upstream_toml("http://127.0.0.1:1/mcp")).expect("config file");
    let out = reload_command(&file, dir.path());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no running proxy"), "{err}");
}
