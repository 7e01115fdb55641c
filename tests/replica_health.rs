//! The active health check of a replicated upstream (`health_path`): a
//! replica whose check fails is taken out before a client's request meets
//! it, and one whose check passes again comes back at once. The replicas
//! are demo upstreams, whose `GET /healthz` the test turns bad and good.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::scrape::{sample, scrape};
use common::*;
use mcp_resume_proxy::config::UpstreamConfig;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::Server;

struct Checked {
    replicas: Vec<DemoUpstream>,
    proxy: Server,
    client: McpClient,
    _dir: tempfile::TempDir,
}

impl Checked {
    /// Two demo replicas under `urls`, checked every 50 ms, out at the
    /// first failure and for a minute (only a passing check brings one
    /// back within a test).
    async fn start() -> Self {
        let mut replicas = Vec::new();
        for _ in 0..2 {
            let up = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default());
            replicas.push(up.await.expect("a replica starts"));
        }
        let upstream = UpstreamConfig {
            url: None,
            urls: Some(replicas.iter().map(DemoUpstream::url).collect()),
            health_path: Some("/healthz".into()),
            health_every_ms: 50,
            eject_after: 1,
            eject_ms: 60_000,
            ..UpstreamConfig::new("")
        };
        let (proxy, client, dir) = common::replicas::proxy_before(upstream).await;
        Self {
            replicas,
            proxy,
            client,
            _dir: dir,
        }
    }

    fn created(&self) -> Vec<u64> {
        let count = |r: &DemoUpstream| r.stats.sessions_created.load(Ordering::Relaxed);
        self.replicas.iter().map(count).collect()
    }

    /// Waits until the metrics page shows replica `i` ejected (1) or not.
    async fn until_ejected(&self, i: usize, ejected: f64) {
        let series = format!(
            "mcp_proxy_upstream_replica_ejected{{upstream=\"/mcp\",replica=\"{}\"}}",
            self.replicas[i].url()
        );
        let deadline = tokio::time::Instant::now() + LIMIT;
        while sample(&scrape(&self.client).await, &series) != ejected {
            assert!(tokio::time::Instant::now() < deadline, "never {ejected}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn turn_unhealthy(&self, i: usize, unhealthy: bool) {
        let flag = &self.replicas[i].stats.unhealthy;
        flag.store(unhealthy, Ordering::Relaxed);
    }
}

#[tokio::test]
async fn a_replica_whose_health_check_fails_is_taken_out_before_a_request_meets_it() {
    let rig = Checked::start().await;
    rig.turn_unhealthy(1, true);
    rig.until_ejected(1, 1.0).await;
    for _ in 0..4 {
        rig.client.initialize(V_LATEST).await;
    }
    assert_eq!(rig.created(), [4, 0]);
    let reached = rig.replicas[1].stats.requests.lock().unwrap().len();
    assert_eq!(reached, 0, "no client request reached it");
    rig.proxy.shutdown().await;
}

#[tokio::test]
async fn a_replica_taken_out_by_its_health_check_comes_back_when_it_passes() {
    let rig = Checked::start().await;
    rig.turn_unhealthy(1, true);
    rig.until_ejected(1, 1.0).await;
    rig.turn_unhealthy(1, false);
    rig.until_ejected(1, 0.0).await;
    for _ in 0..4 {
        rig.client.initialize(V_LATEST).await;
    }
    assert_eq!(rig.created(), [2, 2], "back before its minute out");
    rig.proxy.shutdown().await;
}
