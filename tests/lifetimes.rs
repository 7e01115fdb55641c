//! Lifetimes: finished streams are deleted after retention, ended sessions
//! take their streams with them, and the log does not grow without bound.

mod common;

use common::*;
use http::StatusCode;

fn quick_sweeps(config: &mut mcp_resume_proxy::Config) {
    config.store.retention_secs = 1;
    config.store.sweep_secs = 1;
}

#[tokio::test]
async fn a_finished_stream_is_deleted_after_retention() {
    let rig = Rig::with(Default::default(), quick_sweeps).await;
    let sid = rig.client.initialize(V_LATEST).await;
    let events = read_all(
        rig.client
            .send(Call::post(&slow_call(2, 2, 1)).session(&sid))
            .await,
    )
    .await;
    let first = events[0].id.clone().unwrap();
    let res = rig
        .client
        .send(Call::get().session(&sid).header("last-event-id", &first))
        .await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "replayable before retention ends"
    );
    read_all(res).await;
    let client = &rig.client;
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let res = client
            .send(Call::get().session(&sid).header("last-event-id", &first))
            .await;
        if res.status() == StatusCode::BAD_REQUEST {
            break;
        }
        read_all(res).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "stream never expired"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_idle_session_expires() {
    let rig = Rig::with(Default::default(), |c| {
        c.store.session_idle_secs = 1;
        c.store.sweep_secs = 1;
    })
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let res = rig
            .client
            .send(Call::get().session(&sid).header("last-event-id", "x"))
            .await;
        if res.status() == StatusCode::NOT_FOUND {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "session never expired"
        );
    }
}

/// The first event id of a call's answer (its priming event), once the
/// answer has been read to its end.
async fn finished_call(rig: &Rig, sid: &str, id: u64) -> (String, Vec<serde_json::Value>) {
    let res = rig
        .client
        .send(Call::post(&slow_call(id, 1, 1)).session(sid))
        .await;
    let events = read_all(res).await;
    let first = events[0].id.clone().expect("a priming event id");
    (first, events.iter().filter_map(message).collect())
}

#[tokio::test]
async fn past_max_retained_streams_the_oldest_finished_calls_replay_as_expired_ones() {
    let rig = Rig::with(Default::default(), |c| c.limits.max_retained_streams = 2).await;
    let sid = rig.client.initialize(V_LATEST).await;
    let mut calls = Vec::new();
    for id in 1..=4 {
        calls.push(finished_call(&rig, &sid, id).await);
    }
    // Later calls' writes retire the earlier ones (each once its reader let
    // go): the fourth is then among the two newest retired.
    finished_call(&rig, &sid, 5).await;
    finished_call(&rig, &sid, 6).await;
    let replay = |first: String| {
        rig.client
            .send(Call::get().session(&sid).header("last-event-id", &first))
    };
    for (first, _) in &calls[..2] {
        let res = replay(first.clone()).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "released as expired");
    }
    let (first, seen) = &calls[3];
    let res = replay(first.clone()).await;
    assert_eq!(res.status(), StatusCode::OK, "the newest are kept");
    assert_eq!(&messages(res).await, &seen[..]);
}

#[tokio::test]
async fn an_idle_session_that_expires_is_ended_upstream_too() {
    let rig = Rig::with(Default::default(), |c| {
        c.store.session_idle_secs = 1;
        c.store.sweep_secs = 1;
    })
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call =
        Call::post(&serde_json::json!({"jsonrpc":"2.0","id":1,"method":"ping"})).session(&sid);
    read_all(rig.client.send(call).await).await;
    let deleted = &rig.upstream.stats.sessions_deleted;
    eventually("the upstream gets the session's DELETE", || {
        deleted.load(std::sync::atomic::Ordering::SeqCst) > 0
    })
    .await;
}
