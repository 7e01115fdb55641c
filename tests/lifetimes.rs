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
