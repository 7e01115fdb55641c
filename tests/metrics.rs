//! `GET /metrics`: OpenMetrics text from the running proxy, and the
//! counters that traffic through it moves.

mod common;

use std::sync::atomic::Ordering;

use common::scrape::{sample as value, scrape};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::UpstreamConfig;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};

/// initialize + one completed tool call of `steps` progress notifications.
async fn a_session_with_one_call(rig: &Rig, steps: u64) -> (String, Vec<Option<String>>) {
    let sid = rig.client.initialize(V_LATEST).await;
    let res = rig
        .client
        .send(Call::post(&slow_call(2, steps, 1)).session(&sid))
        .await;
    let ids = read_all(res)
        .await
        .into_iter()
        .filter(|e| !e.data.is_empty())
        .map(|e| e.id)
        .collect();
    (sid, ids)
}

#[tokio::test]
async fn the_page_is_openmetrics_text_with_a_type_for_every_series() {
    let rig = Rig::start().await;
    a_session_with_one_call(&rig, 2).await;
    let text = scrape(&rig.client).await;
    assert!(text.ends_with("# EOF\n"), "{text}");
    for (name, kind) in [
        ("mcp_proxy_ready", "gauge"),
        ("mcp_proxy_store_writable", "gauge"),
        ("mcp_proxy_log_size_bytes", "gauge"),
        ("mcp_proxy_log_quota_bytes", "gauge"),
        ("mcp_proxy_sessions_open", "gauge"),
        ("mcp_proxy_streams_live", "gauge"),
        ("mcp_proxy_entries_appended", "counter"),
        ("mcp_proxy_appended_bytes", "counter"),
        ("mcp_proxy_replays", "counter"),
        ("mcp_proxy_flush_duration_seconds", "histogram"),
        ("mcp_proxy_upstream_errors", "counter"),
        ("mcp_proxy_recovered_streams", "counter"),
        ("mcp_proxy_upstream_resumes", "counter"),
    ] {
        let line = format!("# TYPE {name} {kind}");
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
}

#[tokio::test]
async fn the_log_s_size_and_quota_are_read_when_scraped() {
    let rig = Rig::with(Default::default(), |c| {
        c.limits.max_log_bytes = Some(1 << 30)
    })
    .await;
    a_session_with_one_call(&rig, 2).await;
    let text = scrape(&rig.client).await;
    assert_eq!(value(&text, "mcp_proxy_store_writable"), 1.0);
    assert!(value(&text, "mcp_proxy_log_size_bytes") > 0.0, "{text}");
    assert_eq!(
        value(&text, "mcp_proxy_log_quota_bytes"),
        f64::from(1u32 << 30)
    );
}

#[tokio::test]
async fn a_proxy_that_serves_counts_as_ready() {
    let rig = Rig::start().await;
    assert_eq!(value(&scrape(&rig.client).await, "mcp_proxy_ready"), 1.0);
}

#[tokio::test]
async fn a_call_counts_its_messages_as_appended_and_its_flushes() {
    let rig = Rig::start().await;
    let (_, events) = a_session_with_one_call(&rig, 3).await;
    let text = scrape(&rig.client).await;
    // The initialize result, then the call's progress and result.
    let logged = 1.0 + events.len() as f64;
    assert!(events.len() >= 4, "3 progress + the result: {events:?}");
    assert!(
        value(&text, "mcp_proxy_entries_appended_total") >= logged,
        "{text}"
    );
    assert!(value(&text, "mcp_proxy_appended_bytes_total") > 0.0);
    assert!(value(&text, "mcp_proxy_flush_duration_seconds_count") >= 1.0);
}

#[tokio::test]
async fn an_initialized_session_is_one_open_session() {
    let rig = Rig::start().await;
    let (sid, _) = a_session_with_one_call(&rig, 1).await;
    let text = scrape(&rig.client).await;
    assert_eq!(value(&text, "mcp_proxy_sessions_open"), 1.0);
    assert_eq!(value(&text, "mcp_proxy_streams_live"), 0.0, "{text}");
    let res = rig.client.send(Call::delete().session(&sid)).await;
    assert!(res.status().is_success());
    let text = scrape(&rig.client).await;
    assert_eq!(value(&text, "mcp_proxy_sessions_open"), 0.0);
}

#[tokio::test]
async fn a_last_event_id_resume_counts_as_a_last_event_id_replay() {
    let rig = Rig::start().await;
    let (sid, ids) = a_session_with_one_call(&rig, 3).await;
    let first = ids[0].clone().expect("every event has an id");
    let before = scrape(&rig.client).await;
    assert_eq!(
        value(
            &before,
            "mcp_proxy_replays_total{dialect=\"last_event_id\"}"
        ),
        0.0
    );
    let res = rig
        .client
        .send(Call::get().session(&sid).header("last-event-id", &first))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    read_all(res).await;
    let after = scrape(&rig.client).await;
    assert_eq!(
        value(&after, "mcp_proxy_replays_total{dialect=\"last_event_id\"}"),
        1.0
    );
    assert_eq!(
        value(&after, "mcp_proxy_replays_total{dialect=\"streams\"}"),
        0.0
    );
}

/// A proxy whose upstream has two demo replicas, the rig's and the one
/// handed back, with `tweak` applied to the upstream.
async fn with_two_replicas(tweak: impl FnOnce(&mut UpstreamConfig)) -> (Rig, DemoUpstream) {
    let other = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("a second replica");
    let second = other.url();
    let rig = Rig::with(Default::default(), |c| {
        let first = c.upstream[0].url.take();
        c.upstream[0].urls = Some(first.into_iter().chain([second]).collect());
        tweak(&mut c.upstream[0]);
    })
    .await;
    (rig, other)
}

/// An address nothing listens on: a port that was just free.
fn closed_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// A proxy whose upstream has a second replica nobody answers on, taken
/// out at its first failure for `eject_ms`; and that replica's URL.
async fn with_a_dead_replica(eject_ms: u64) -> (Rig, String) {
    let dead = format!("http://{}/mcp", closed_port());
    let rig = Rig::with(Default::default(), |c| {
        let first = c.upstream[0].url.take();
        c.upstream[0].urls = Some(first.into_iter().chain([dead.clone()]).collect());
        c.upstream[0].eject_after = 1;
        c.upstream[0].eject_ms = eject_ms;
    })
    .await;
    (rig, dead)
}

#[tokio::test]
async fn an_unreachable_upstream_counts_as_a_connect_error() {
    let closed = closed_port();
    let rig = Rig::with(Default::default(), |c| {
        c.upstream = vec![UpstreamConfig::new(format!("http://{closed}/mcp"))];
    })
    .await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    let text = scrape(&rig.client).await;
    assert_eq!(
        value(&text, "mcp_proxy_upstream_errors_total{kind=\"connect\"}"),
        1.0
    );
    assert_eq!(value(&text, "mcp_proxy_sessions_open"), 0.0);
}

#[tokio::test]
async fn metrics_can_be_switched_off() {
    let rig = Rig::with(Default::default(), |c| c.metrics = false).await;
    let url = rig.client.url.trim_end_matches("/mcp").to_owned() + "/metrics";
    let res = McpClient::new(url).send(Call::get()).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

/// The sample of the per-replica series `name` for replica `url`.
fn replica_sample(text: &str, name: &str, url: &str) -> f64 {
    value(
        text,
        &format!("mcp_proxy_upstream_replica_{name}{{upstream=\"/mcp\",replica=\"{url}\"}}"),
    )
}

#[tokio::test]
async fn a_replica_s_requests_in_flight_are_counted_while_its_answer_streams() {
    let (rig, other) = with_two_replicas(|_| {}).await;
    let urls = [rig.upstream.url(), other.url()];
    let sid = rig.client.initialize(V_LATEST).await;
    let on = usize::from(other.stats.sessions_created.load(Ordering::Relaxed) == 1);
    let call = Call::post(&slow_call(2, 40, 100)).session(&sid);
    let mut reader = SseReader::new(rig.client.send(call).await);
    reader.next_message().await.expect("the call runs");

    let text = scrape(&rig.client).await;
    assert_eq!(replica_sample(&text, "in_flight", &urls[on]), 1.0);
    assert_eq!(replica_sample(&text, "in_flight", &urls[1 - on]), 0.0);
}

#[tokio::test]
async fn a_replica_that_fails_counts_its_failure_and_shows_as_ejected() {
    let (rig, dead) = with_a_dead_replica(60_000).await;
    for _ in 0..2 {
        rig.client.initialize(V_LATEST).await;
    }
    let text = scrape(&rig.client).await;
    let alive = rig.upstream.url();
    assert_eq!(replica_sample(&text, "failures_total", &dead), 1.0);
    assert_eq!(replica_sample(&text, "ejected", &dead), 1.0);
    assert_eq!(replica_sample(&text, "failures_total", &alive), 0.0);
    assert_eq!(replica_sample(&text, "ejected", &alive), 0.0);
}

#[tokio::test]
async fn a_replica_whose_stream_goes_silent_past_the_idle_timeout_counts_a_failure() {
    let (rig, other) = with_two_replicas(|u| u.idle_timeout_ms = Some(300)).await;
    let urls = [rig.upstream.url(), other.url()];
    let sid = rig.client.initialize(V_LATEST).await;
    let on = usize::from(other.stats.sessions_created.load(Ordering::Relaxed) == 1);
    // Its answer's head comes at once, its first message after 5 s.
    let call = Call::post(&slow_call(2, 1, 5_000)).session(&sid);
    let answer = messages(rig.client.send(call).await).await;
    assert!(
        answer.iter().any(|m| m.get("error").is_some()),
        "{answer:?}"
    );

    let text = scrape(&rig.client).await;
    assert_eq!(replica_sample(&text, "failures_total", &urls[on]), 1.0);
    assert_eq!(replica_sample(&text, "failures_total", &urls[1 - on]), 0.0);
}

#[tokio::test]
async fn a_call_that_outlives_its_deadline_blames_no_replica() {
    let (rig, other) = with_two_replicas(|u| u.request_timeout_ms = Some(300)).await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&slow_call(2, 1, 5_000)).session(&sid);
    let answer = messages(rig.client.send(call).await).await;
    assert!(
        answer.iter().any(|m| m.get("error").is_some()),
        "{answer:?}"
    );

    let text = scrape(&rig.client).await;
    for url in [rig.upstream.url(), other.url()] {
        assert_eq!(replica_sample(&text, "failures_total", &url), 0.0);
    }
}

#[tokio::test]
async fn an_ejected_replica_shows_as_back_once_its_back_off_ran_out() {
    let (rig, dead) = with_a_dead_replica(200).await;
    for _ in 0..2 {
        rig.client.initialize(V_LATEST).await;
    }
    assert_eq!(
        replica_sample(&scrape(&rig.client).await, "ejected", &dead),
        1.0
    );
    let deadline = tokio::time::Instant::now() + LIMIT;
    while replica_sample(&scrape(&rig.client).await, "ejected", &dead) != 0.0 {
        assert!(tokio::time::Instant::now() < deadline, "never back");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_replica_dropped_by_a_reload_leaves_the_page() {
    let other = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("a second replica");
    let second = other.url();
    let two = |c: &mut mcp_resume_proxy::Config| {
        let first = c.upstream[0].url.take();
        c.upstream[0].urls = Some(first.into_iter().chain([second.clone()]).collect());
    };
    let rig = Rig::with(Default::default(), two).await;
    let kept = rig.upstream.url();
    let series = |url: &str| {
        format!("mcp_proxy_upstream_replica_in_flight{{upstream=\"/mcp\",replica=\"{url}\"}}")
    };
    let listed = |text: &str, url: &str| text.lines().any(|l| l.starts_with(&series(url)));
    assert!(listed(&scrape(&rig.client).await, &other.url()));

    let fewer = mcp_resume_proxy::Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: rig.dir.path().to_path_buf(),
        upstream: vec![UpstreamConfig::new(kept.clone())],
        shutdown_grace_secs: 1,
        ..Default::default()
    };
    let proxy = rig.proxy.as_ref().expect("running");
    proxy.reload(fewer).expect("the reload applies");
    let text = scrape(&rig.client).await;
    assert!(!listed(&text, &other.url()), "{text}");
    assert!(listed(&text, &kept), "{text}");
}
