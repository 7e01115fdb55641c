//! Last-Event-ID replay: a client that lost its connection gets exactly the
//! entries it missed, in order, then follows the stream live to its end; ids
//! from elsewhere are refused.

mod common;

use common::cluster::{delete_prefix, redis_url, require_redis};
use common::*;
use http::StatusCode;
use serde_json::{json, Value};

/// Runs a call to completion; returns (event id, message) for every event.
async fn completed_call(rig: &Rig, sid: &str, id: u64, steps: u64) -> Vec<(String, Option<Value>)> {
    let events = read_all(
        rig.client
            .send(Call::post(&slow_call(id, steps, 1)).session(sid))
            .await,
    )
    .await;
    events
        .iter()
        .map(|e| (e.id.clone().expect("every event has an id"), message(e)))
        .collect()
}

async fn resume(
    rig: &Rig,
    sid: &str,
    last_event_id: &str,
) -> http::Response<hyper::body::Incoming> {
    rig.client
        .send(
            Call::get()
                .session(sid)
                .header("last-event-id", last_event_id),
        )
        .await
}

/// (event id, message) of every replayed event that carries a message.
async fn replayed(res: http::Response<hyper::body::Incoming>) -> Vec<(String, Option<Value>)> {
    read_all(res)
        .await
        .iter()
        .filter(|e| !e.data.is_empty())
        .map(|e| (e.id.clone().unwrap(), message(e)))
        .collect()
}

#[tokio::test]
async fn replay_from_every_cut_point_yields_exactly_the_missing_suffix() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let all = completed_call(&rig, &sid, 2, 8).await;
    for (cut, (id, _)) in all.iter().enumerate() {
        let res = resume(&rig, &sid, id).await;
        assert_eq!(res.status(), StatusCode::OK);
        let want: Vec<_> = all[cut + 1..].to_vec();
        assert_eq!(replayed(res).await, want, "resume after event {cut}");
    }
}

#[tokio::test]
async fn the_sled_backend_replays_the_missing_suffix_too() {
    let rig = Rig::with(Default::default(), |c| {
        c.store.backend = mcp_resume_proxy::config::Backend::Sled
    })
    .await;
    assert!(
        rig.dir.path().join("log").exists(),
        "sled's files are in use"
    );
    let sid = rig.client.initialize(V_LATEST).await;
    let all = completed_call(&rig, &sid, 2, 4).await;
    let res = resume(&rig, &sid, &all[1].0).await;
    assert_eq!(replayed(res).await, all[2..].to_vec());
}

/// A slow call (id 3, `steps` steps) read for two messages, then cut (the
/// network cable is pulled); after `pause`, resumed with the last event id
/// seen and read to its end. Every message the client saw, in order.
async fn cut_then_resume(
    rig: &Rig,
    sid: &str,
    steps: u64,
    pause: std::time::Duration,
) -> Vec<Value> {
    let mut first = SseReader::new(
        rig.client
            .send(Call::post(&slow_call(3, steps, 30)).session(sid))
            .await,
    );
    let mut last_id = first.next().await.unwrap().id.unwrap(); // priming
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let (id, m) = first.next_message().await.unwrap();
        last_id = id.unwrap();
        seen.push(m);
    }
    drop(first);
    tokio::time::sleep(pause).await;
    let mut rest = SseReader::new(resume(rig, sid, &last_id).await);
    while let Some((_, m)) = rest.next_message().await {
        seen.push(m);
    }
    seen
}

fn progress_of(messages: &[Value]) -> Vec<u64> {
    messages
        .iter()
        .filter_map(|m| m["params"]["progress"].as_u64())
        .collect()
}

#[tokio::test]
async fn a_dropped_call_keeps_running_and_resumes_live_to_its_result() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let seen = cut_then_resume(&rig, &sid, 10, std::time::Duration::from_millis(100)).await;
    let progress = progress_of(&seen);
    assert_eq!(
        progress,
        (1..=10).collect::<Vec<_>>(),
        "every progress exactly once"
    );
    assert_eq!(seen.last().unwrap()["id"], 3);
}

#[tokio::test]
async fn the_priming_event_id_resumes_from_the_start() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let all = completed_call(&rig, &sid, 4, 3).await;
    let events = read_all(resume(&rig, &sid, &all[0].0).await).await;
    assert_eq!(events.iter().filter_map(message).count(), 4);
}

#[tokio::test]
async fn a_new_reader_takes_the_stream_over_from_a_stale_connection() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let mut stale = SseReader::new(
        rig.client
            .send(Call::post(&slow_call(5, 5, 50)).session(&sid))
            .await,
    );
    let priming = stale.next().await.unwrap().id.unwrap();
    let mut fresh = SseReader::new(resume(&rig, &sid, &priming).await);
    let mut messages = Vec::new();
    while let Some((_, m)) = fresh.next_message().await {
        messages.push(m);
    }
    assert_eq!(messages.len(), 6);
    // The stale connection ended instead of receiving the same messages.
    let mut leaked = 0;
    while stale.next_message().await.is_some() {
        leaked += 1;
    }
    assert!(leaked < 6, "a message went to both connections");
}

#[tokio::test]
async fn an_event_id_from_another_session_is_refused() {
    let rig = Rig::start().await;
    let a = rig.client.initialize(V_LATEST).await;
    let b = rig.client.initialize(V_LATEST).await;
    let all = completed_call(&rig, &a, 2, 2).await;
    let res = resume(&rig, &b, &all[1].0).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let body = body_json(res).await;
    assert_eq!(body["jsonrpc"], "2.0");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Last-Event-ID"));
}

#[tokio::test]
async fn tampered_and_made_up_event_ids_are_refused() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let all = completed_call(&rig, &sid, 2, 2).await;
    let mut tampered = all[1].0.clone().into_bytes();
    tampered[10] = if tampered[10] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    for bad in [tampered.as_str(), "1", "not-an-id", &"A".repeat(50)] {
        let res = resume(&rig, &sid, bad).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert!(body_json(res).await["error"].is_object());
    }
}

#[tokio::test]
async fn a_session_used_by_another_principal_is_not_found() {
    let rig = Rig::start().await;
    let res = rig
        .client
        .send(Call::post(&initialize(V_LATEST)).header("authorization", "Bearer alice"))
        .await;
    let sid = session_id(res.headers()).unwrap();
    read_all(res).await;
    let call = Call::post(&tool_call(2, "echo", json!({"text":"x"})))
        .session(&sid)
        .header("authorization", "Bearer mallory");
    assert_eq!(rig.client.send(call).await.status(), StatusCode::NOT_FOUND);
    let call = Call::post(&tool_call(3, "echo", json!({"text":"x"})))
        .session(&sid)
        .header("authorization", "Bearer alice");
    assert_eq!(rig.client.send(call).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_standalone_stream_is_resumable_too() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let mut get = SseReader::new(rig.client.send(Call::get().session(&sid)).await);
    let priming = get.next().await.unwrap().id.unwrap();
    drop(get);
    for (i, text) in ["one", "two"].iter().enumerate() {
        let call =
            Call::post(&tool_call(10 + i as u64, "notify", json!({"text": text}))).session(&sid);
        read_all(rig.client.send(call).await).await;
    }
    let mut again = SseReader::new(resume(&rig, &sid, &priming).await);
    let (_, one) = again.next_message().await.unwrap();
    let (_, two) = again.next_message().await.unwrap();
    assert_eq!(
        (one["params"]["data"].clone(), two["params"]["data"].clone()),
        (json!("one"), json!("two"))
    );
}

/// Deletes the keys of a test's Redis prefix when dropped (passed or failed).
struct RedisKeys(String);

impl RedisKeys {
    /// A fresh prefix on the test Redis; panics, saying what is missing,
    /// when no Redis answers.
    fn fresh() -> Self {
        drop(require_redis(&redis_url()));
        RedisKeys(format!(
            "mcp-resume-proxy-test:{}",
            mcp_resume_proxy::id::StreamId::random()
        ))
    }
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        delete_prefix(&redis_url(), &self.0);
    }
}

#[tokio::test]
async fn the_redis_backend_replays_the_missing_suffix_and_follows_its_own_writes_live() {
    let keys = RedisKeys::fresh();
    let rig = Rig::with(Default::default(), |c| {
        c.store.backend = mcp_resume_proxy::config::Backend::Redis;
        c.store.redis_url = redis_url();
        c.store.key_prefix = keys.0.clone();
    })
    .await;
    let sid = rig.client.initialize(V_LATEST).await;
    let all = completed_call(&rig, &sid, 2, 4).await;
    let res = resume(&rig, &sid, &all[1].0).await;
    assert_eq!(replayed(res).await, all[2..].to_vec());
    // A short stream's entries are in its one value (`:stream`).
    let stored: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{}:*}}:stream", keys.0))
        .query(&mut require_redis(&redis_url()))
        .unwrap();
    assert!(!stored.is_empty(), "the entries are in Redis");

    // Cut mid-call, then resume: replay, then live to the result.
    let seen = cut_then_resume(&rig, &sid, 6, std::time::Duration::ZERO).await;
    let progress = progress_of(&seen);
    assert_eq!(progress, (1..=6).collect::<Vec<_>>());
    assert_eq!(seen.last().unwrap()["id"], 3);
}
