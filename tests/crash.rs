//! kill -9 of the proxy process: everything it logged is served after a
//! restart, sessions still map to their upstream sessions, a call whose
//! upstream stream can be resumed carries on to its result — also in front of
//! an upstream that replays its whole session on a resume and never
//! re-attaches live (server-everything) — and one that cannot ends with a
//! JSON-RPC error entry.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::process::{free_addr, Crashable, ProxyProcess};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use mcp_resume_proxy::id::{SessionId, StreamId};
use mcp_resume_proxy::jsonrpc::RequestId;
use mcp_resume_proxy::store::commit::SyncMode;
use mcp_resume_proxy::store::journal::Journal;
use mcp_resume_proxy::store::{
    now_ms, Finish, Outcome, Store, StreamKind, StreamMeta, StreamStatus,
};
use serde_json::json;

/// Starts a slow call (`steps` progress notifications) and reads the first
/// few; returns the proxy's last event id and the progress seen.
async fn start_slow_call(client: &McpClient, sid: &str, steps: u64) -> (String, Vec<u64>) {
    start_call(client, sid, 2, steps).await
}

/// The same for a call of any id (its progress token is `p{id}`).
async fn start_call(client: &McpClient, sid: &str, id: u64, steps: u64) -> (String, Vec<u64>) {
    let mut live = SseReader::new(
        client
            .send(Call::post(&slow_call(id, steps, 50)).session(sid))
            .await,
    );
    let mut last_id = live.next().await.unwrap().id.unwrap();
    let mut progress = Vec::new();
    while progress.len() < 3 {
        let (id, m) = live.next_message().await.unwrap();
        last_id = id.unwrap();
        progress.push(m["params"]["progress"].as_u64().unwrap());
    }
    // Let more entries reach the log than the client has seen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (last_id, progress)
}

/// Everything the proxy serves after `last_id` on a GET, to the stream's end
/// (which must come within `LIMIT`: a stream that falls silent fails).
async fn tail_after(client: &McpClient, sid: &str, last_id: &str) -> Vec<serde_json::Value> {
    tokio::time::timeout(LIMIT, read_tail(client, sid, last_id))
        .await
        .expect("the stream ends, never falls silent")
}

async fn read_tail(client: &McpClient, sid: &str, last_id: &str) -> Vec<serde_json::Value> {
    let res = client
        .send(Call::get().session(sid).header("last-event-id", last_id))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut reader = SseReader::new(res);
    let mut tail = Vec::new();
    while let Some((_, m)) = reader.next_message().await {
        tail.push(m);
    }
    tail
}

#[tokio::test]
async fn a_call_survives_kill9_when_its_upstream_can_be_resumed() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let sid = rig.client().initialize(V_LATEST).await;
    let (last_id, mut progress) = start_slow_call(&rig.client(), &sid, 40).await;
    rig.kill9_and_restart().await;

    let client = rig.client();
    let tail = tail_after(&client, &sid, &last_id).await;
    let (result, replayed) = tail.split_last().expect("at least the result");
    for m in replayed {
        progress.push(m["params"]["progress"].as_u64().unwrap());
    }
    assert_eq!(
        progress,
        (1..=40).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    assert_eq!(result["id"], 2);
    assert!(result.get("result").is_some(), "{result}");
    let metrics = McpClient::new(format!("http://{}/metrics", rig.proxy.addr));
    let text = body_bytes(metrics.send(Call::get()).await).await;
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains("mcp_proxy_upstream_resumes_total{after=\"restart\"} 1"),
        "{text}"
    );

    // The session still maps to the same upstream session.
    let call = Call::post(&tool_call(3, "echo", json!({"text":"still here"}))).session(&sid);
    let messages = messages(client.send(call).await).await;
    assert_eq!(messages[0]["result"]["content"][0]["text"], "still here");
}

/// The upstream's priming event carries an id before any message: a kill
/// between it and the first progress must not cost the call.
#[tokio::test]
async fn a_call_killed_before_its_first_message_is_resumed_from_the_upstream_priming_event() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let sid = rig.client().initialize(V_LATEST).await;
    let mut live = SseReader::new(
        rig.client()
            .send(Call::post(&slow_call(2, 3, 1500)).session(&sid))
            .await,
    );
    let priming = live.next().await.unwrap().id.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.kill9_and_restart().await;
    drop(live);

    let tail = tail_after(&rig.client(), &sid, &priming).await;
    let (result, progress) = tail.split_last().expect("at least the result");
    let progress: Vec<_> = progress
        .iter()
        .map(|m| m["params"]["progress"].as_u64().unwrap())
        .collect();
    assert_eq!(progress, [1, 2, 3]);
    assert_eq!(result["id"], 2);
    assert!(result.get("result").is_some(), "{result}");
}

#[tokio::test]
async fn a_call_whose_upstream_gave_no_event_ids_ends_with_an_error_after_kill9() {
    let mut rig = Crashable::start(DemoOptions {
        no_event_ids: true,
        ..DemoOptions::default()
    })
    .await;
    let sid = rig.client().initialize(V_LATEST).await;
    let mut live = SseReader::new(
        rig.client()
            .send(Call::post(&slow_call(2, 40, 50)).session(&sid))
            .await,
    );
    let priming = live.next().await.unwrap().id.unwrap();
    live.next_message().await.expect("the first progress");
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.kill9_and_restart().await;
    drop(live);

    let tail = tail_after(&rig.client(), &sid, &priming).await;
    let error = tail.last().expect("the error entry");
    assert_eq!(error["id"], 2);
    assert_eq!(error["error"]["code"], -32603);
}

#[tokio::test]
async fn a_completed_call_is_fully_replayable_after_kill9() {
    let mut rig = Crashable::start(DemoOptions::default()).await;
    let sid = rig.client().initialize(V_LATEST).await;
    let events = read_all(
        rig.client()
            .send(Call::post(&slow_call(2, 5, 1)).session(&sid))
            .await,
    )
    .await;
    let before: Vec<_> = events.iter().filter_map(message).collect();
    rig.kill9_and_restart().await;

    let priming = events[0].id.clone().unwrap();
    let res = rig
        .client()
        .send(Call::get().session(&sid).header("last-event-id", &priming))
        .await;
    let after = messages(res).await;
    assert_eq!(after, before);
}

/// The demo upstream resuming as server-everything does: a `Last-Event-ID`
/// GET replays every stream of the session after that id, then stays silent.
fn session_wide_replay() -> DemoOptions {
    DemoOptions {
        session_wide_replay: true,
        ..DemoOptions::default()
    }
}

/// The progress values of a call's messages, and its final message.
fn progress_and_end(messages: &[serde_json::Value]) -> (Vec<u64>, &serde_json::Value) {
    let (end, progress) = messages.split_last().expect("at least the final message");
    let progress = progress
        .iter()
        .map(|m| m["params"]["progress"].as_u64().unwrap_or(0))
        .collect();
    (progress, end)
}

#[tokio::test]
async fn a_resumed_upstream_that_never_re_attaches_live_is_asked_again_until_the_result() {
    let mut rig = Crashable::start(session_wide_replay()).await;
    let sid = rig.client().initialize(V_LATEST).await;
    let (last_id, mut progress) = start_slow_call(&rig.client(), &sid, 30).await;
    rig.kill9_and_restart().await;

    let tail = tail_after(&rig.client(), &sid, &last_id).await;
    let (more, result) = progress_and_end(&tail);
    progress.extend(more);
    assert_eq!(progress, (1..=30).collect::<Vec<_>>(), "no gap, no repeat");
    assert_eq!(result["id"], 2);
    assert!(result.get("result").is_some(), "{result}");
    let metrics = McpClient::new(format!("http://{}/metrics", rig.proxy.addr));
    let text = body_bytes(metrics.send(Call::get()).await).await;
    let asked_again = String::from_utf8_lossy(&text).lines().any(|l| {
        l.starts_with("mcp_proxy_upstream_resumes_total{after=\"silence\"}") && !l.ends_with(" 0")
    });
    assert!(asked_again, "the silent resumed stream was asked again");
}

#[tokio::test]
async fn a_replay_of_other_calls_messages_lands_each_on_its_own_stream_once() {
    let mut rig = Crashable::start(session_wide_replay()).await;
    let client = rig.client();
    let sid = client.initialize(V_LATEST).await;
    let (two_at, mut two) = start_call(&client, &sid, 2, 25).await;
    let (three_at, mut three) = start_call(&client, &sid, 3, 25).await;
    rig.kill9_and_restart().await;
    // A request answered after the restart: the upstream replays its
    // response onto the calls' resumed streams too.
    let client = rig.client();
    let ping = json!({"jsonrpc":"2.0","id":9,"method":"ping"});
    let pong = messages(client.send(Call::post(&ping).session(&sid)).await).await;
    assert_eq!(pong.len(), 1, "the ping's own answer, once: {pong:?}");

    let (tail_two, tail_three) = tokio::join!(
        tail_after(&client, &sid, &two_at),
        tail_after(&client, &sid, &three_at)
    );
    for (id, seen, tail) in [(2, &mut two, tail_two), (3, &mut three, tail_three)] {
        let token = format!("p{id}");
        let (_, end) = progress_and_end(&tail);
        for m in &tail[..tail.len() - 1] {
            assert_eq!(m["method"], "notifications/progress", "call {id}: {m}");
            assert_eq!(
                m["params"]["progressToken"],
                token.as_str(),
                "call {id}: {m}"
            );
        }
        seen.extend(progress_and_end(&tail).0);
        assert_eq!(*seen, (1..=25).collect::<Vec<_>>(), "call {id}: each once");
        assert_eq!(end["id"], id, "call {id} ends with its own result: {end}");
        assert!(end.get("result").is_some(), "{end}");
    }
}

/// A journal in `data_dir` holding `calls` finished calls of three entries
/// each, as a proxy that ran a while leaves it, every tenth call deleted
/// again; gives back what each kept call holds, and the deleted ones.
async fn a_large_log(
    data_dir: &std::path::Path,
    calls: usize,
) -> (Vec<(StreamId, Vec<Bytes>)>, Vec<StreamId>) {
    let journal = Journal::open(data_dir, SyncMode::Never).expect("journal opens");
    let session = SessionId::random();
    let (mut kept, mut deleted) = (Vec::new(), Vec::new());
    for i in 0..calls {
        let meta = StreamMeta::new(
            StreamId::random(),
            session,
            StreamKind::Request,
            vec![RequestId(i.to_string().into())],
            Some("tools/call".into()),
            now_ms(),
        );
        journal.create_stream(&meta).await.unwrap();
        let messages: Vec<Bytes> = (0..3)
            .map(|n| {
                Bytes::from(format!(
                    r#"{{"jsonrpc":"2.0","method":"m","params":{{"call":{i},"n":{n}}}}}"#
                ))
            })
            .collect();
        let done = Finish::new(StreamStatus::Completed, Some(Outcome::Result));
        journal
            .append_final(meta.id, &messages, done)
            .await
            .unwrap();
        if i % 10 == 9 {
            journal.delete_stream(meta.id).await.unwrap();
            deleted.push(meta.id);
        } else {
            kept.push((meta.id, messages));
        }
    }
    journal.flush().await.unwrap();
    (kept, deleted)
}

/// `kill -9` at moments spread over the start-up of a large log (recovery,
/// the checkpoint it takes, the first segment it opens): every call the
/// log kept reads back whole, and no deleted one comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_start_up_of_a_large_log_loses_nothing_and_brings_nothing_back() {
    let dir = tempfile::tempdir().unwrap();
    let (kept, deleted) = a_large_log(dir.path(), 30_000).await;
    let (addr, upstream) = (free_addr(), ["--upstream", "http://127.0.0.1:9/mcp"]);
    let started = std::time::Instant::now();
    ProxyProcess::start(&upstream, dir.path(), addr, &[])
        .await
        .kill9();
    let start_up = started.elapsed();
    let log = dir.path().join("journal");
    let bytes: u64 = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    println!("start-up {start_up:?} over {bytes} bytes of log");
    const KILLS: u32 = 8;
    for i in 1..=KILLS {
        let mut proxy = ProxyProcess::spawn(&upstream, dir.path(), addr, &[]);
        tokio::time::sleep(start_up * i / KILLS).await;
        proxy.kill9();
    }
    let journal = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    for (id, messages) in &kept {
        let entries = journal.read_after(*id, 0, usize::MAX).await.unwrap();
        let read: Vec<Bytes> = entries.into_iter().map(|e| e.message).collect();
        assert_eq!(&read, messages, "stream {id}");
    }
    for id in &deleted {
        assert_eq!(
            journal.stream_meta(*id).await.unwrap(),
            None,
            "{id} deleted"
        );
    }
}
