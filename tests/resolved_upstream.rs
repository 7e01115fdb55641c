//! One `[[upstream]]` whose `url` names a host with several addresses (a
//! Kubernetes headless Service) and `resolve = "each"`: every address is a
//! replica, the host is looked up again so that pods that come and go are
//! followed, and requests keep the configured host in `Host` while they
//! connect to an address. The replicas are demo upstreams on loopback
//! addresses, all on one port, as a Service's pods are.
//!
//! Most of these tests give the proxy a table of host names
//! ([`Lookup::Table`]) instead of the machine's resolver: the tests are
//! about following an answer that changes, and no test can change what the
//! machine's resolver answers (it would mean editing `/etc/hosts` or
//! running the DNS server it asks, for every process on the machine). The
//! table stands for the resolver only; the proxy, its connections and the
//! replicas are real. `every_address_of_localhost_is_a_replica` uses the
//! machine's resolver, whatever `localhost` resolves to here (127.0.0.1,
//! and ::1 on most machines).

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::replicas::{echo, sessions};
use common::scrape::scrape;
use common::*;
use mcp_resume_proxy::config::{Lookup, Resolve, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::Server;

type Table = Arc<Mutex<BTreeMap<String, Vec<IpAddr>>>>;

const HOST: &str = "mcp.test";

/// Demo upstreams, one on each of `ips`, all on one free port.
async fn pods(ips: &[IpAddr]) -> (u16, Vec<DemoUpstream>) {
    'port: for _ in 0..10 {
        let mut pods = Vec::new();
        let mut port = 0;
        for ip in ips {
            match DemoUpstream::spawn(SocketAddr::new(*ip, port), DemoOptions::default()).await {
                Ok(pod) => {
                    port = pod.addr.port();
                    pods.push(pod);
                }
                // That port is taken on this address: another port for all.
                Err(_) => continue 'port,
            }
        }
        return (port, pods);
    }
    panic!("no port free on every one of {ips:?}");
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// A proxy in front of `url` with `resolve = "each"`, looked up through
/// `lookup` every 50 ms.
async fn proxy(url: String, lookup: Lookup) -> (Server, McpClient, tempfile::TempDir) {
    let upstream = UpstreamConfig {
        resolve: Resolve::Each,
        resolve_every_ms: 50,
        lookup,
        ..UpstreamConfig::new(url)
    };
    common::replicas::proxy_before(upstream).await
}

/// `HOST` resolving to `ips` in a table the test can change.
fn table(ips: &[IpAddr]) -> Table {
    let table = BTreeMap::from([(HOST.to_owned(), ips.to_vec())]);
    Arc::new(Mutex::new(table))
}

fn resolve_to(table: &Table, ips: &[IpAddr]) {
    table.lock().unwrap().insert(HOST.to_owned(), ips.to_vec());
}

/// The `in_flight` series of replica `name`, as the page prints it.
fn series_of(name: &str) -> String {
    format!("mcp_proxy_upstream_replica_in_flight{{upstream=\"/mcp\",replica=\"{name}\"}}")
}

/// Waits until the metrics page lists replica `name` (`true`) or not.
async fn until_listed(client: &McpClient, name: &str, listed: bool) {
    let series = series_of(name);
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let page = scrape(client).await;
        if page.lines().any(|l| l.starts_with(&series)) == listed {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {listed}: {name}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn created(pods: &[DemoUpstream]) -> Vec<u64> {
    let count = |p: &DemoUpstream| p.stats.sessions_created.load(Ordering::Relaxed);
    pods.iter().map(count).collect()
}

fn requests(pod: &DemoUpstream) -> usize {
    pod.stats.requests.lock().unwrap().len()
}

async fn calls(client: &McpClient, sids: &[String], first_id: u64) {
    for (k, sid) in sids.iter().enumerate() {
        echo(client, sid, first_id + k as u64).await;
    }
}

#[tokio::test]
async fn every_address_of_localhost_is_a_replica() {
    let mut ips: Vec<IpAddr> = std::net::ToSocketAddrs::to_socket_addrs(&("localhost", 0))
        .expect("localhost resolves")
        .map(|a| a.ip())
        .collect();
    ips.sort();
    ips.dedup();
    let (port, pods) = pods(&ips).await;
    let url = format!("http://localhost:{port}/mcp");
    let (proxy, client, _dir) = proxy(url, Lookup::System).await;
    let sids = sessions(&client, 2 * pods.len()).await;
    calls(&client, &sids, 10).await;
    assert!(
        created(&pods).iter().all(|&n| n == 2),
        "{:?}",
        created(&pods)
    );
    let page = scrape(&client).await;
    for pod in &pods {
        let series = series_of(&pod.addr.to_string());
        assert!(page.lines().any(|l| l.starts_with(&series)), "{page}");
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn requests_keep_the_configured_host_while_connecting_to_an_address() {
    let (port, pods) = pods(&[loopback(1), loopback(2)]).await;
    let names = table(&[loopback(1), loopback(2)]);
    let url = format!("http://{HOST}:{port}/mcp");
    let (proxy, client, _dir) = proxy(url, Lookup::Table(names)).await;
    let sids = sessions(&client, 2).await;
    calls(&client, &sids, 10).await;
    let expected = format!("{HOST}:{port}");
    for pod in &pods {
        let seen = pod.stats.requests.lock().unwrap();
        assert!(!seen.is_empty(), "each address was a replica");
        for headers in seen.iter() {
            assert_eq!(headers.get("host").unwrap(), expected.as_str());
        }
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_new_address_of_the_host_becomes_a_replica() {
    let (port, pods) = pods(&[loopback(1), loopback(2)]).await;
    let names = table(&[loopback(1)]);
    let url = format!("http://{HOST}:{port}/mcp");
    let (proxy, client, _dir) = proxy(url, Lookup::Table(names.clone())).await;
    sessions(&client, 2).await;
    assert_eq!(created(&pods), [2, 0]);

    resolve_to(&names, &[loopback(1), loopback(2)]);
    until_listed(&client, &pods[1].addr.to_string(), true).await;
    sessions(&client, 4).await;
    assert_eq!(created(&pods), [4, 2], "ties taken in turn");
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_sessions_of_an_address_that_vanished_move_with_the_client_session_kept() {
    let (port, pods) = pods(&[loopback(1), loopback(2), loopback(3)]).await;
    let names = table(&[loopback(1), loopback(2)]);
    let url = format!("http://{HOST}:{port}/mcp");
    let (proxy, client, _dir) = proxy(url, Lookup::Table(names.clone())).await;
    let sids = sessions(&client, 4).await;
    calls(&client, &sids, 10).await;
    assert_eq!(created(&pods), [2, 2, 0]);

    resolve_to(&names, &[loopback(2), loopback(3)]);
    until_listed(&client, &pods[0].addr.to_string(), false).await;
    let reached = requests(&pods[0]);
    calls(&client, &sids, 1_000).await;
    calls(&client, &sids, 2_000).await;
    let now = created(&pods);
    assert_eq!(now[0], 2);
    assert_eq!(now[1] + now[2], 4, "its two sessions moved, once each");
    assert_eq!(requests(&pods[0]), reached, "nothing more reached it");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_failed_look_up_keeps_the_replicas_there_were() {
    let (port, pods) = pods(&[loopback(1), loopback(2)]).await;
    let names = table(&[loopback(1), loopback(2)]);
    let url = format!("http://{HOST}:{port}/mcp");
    let (proxy, client, _dir) = proxy(url, Lookup::Table(names.clone())).await;
    let sids = sessions(&client, 2).await;

    names.lock().unwrap().clear();
    // Several look-ups fail meanwhile (one every 50 ms); nothing says when
    // one did but the log, so the test waits for a few.
    tokio::time::sleep(Duration::from_millis(300)).await;
    calls(&client, &sids, 10).await;
    sessions(&client, 2).await;
    assert_eq!(created(&pods), [2, 2], "both replicas stayed");
    proxy.shutdown().await;
}
