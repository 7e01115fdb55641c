//! Scale-out: two proxy processes (A and B) sharing one Redis log, in front
//! of one upstream. A call started on A is resumed on B — with
//! `Last-Event-ID`, `requests/resume` and `stream/resume` — and the rest
//! arrives live, while A is still writing it; B answers status and poll for
//! A's call; B takes a call over when A is killed; a new reader on B ends the
//! one on A.
//!
//! Runs on `REDIS_URL`, else on a private `redis-server` it starts itself
//! (`common::redis_server`); fails, never skips, with neither. The live
//! follow, the takeover and both kinds of task run on a private Redis
//! Cluster too (`common::redis_cluster`), the log spread over its
//! primaries.

mod common;

use std::time::Duration;

use common::cluster::{Cluster, Log};
use common::dialects::{
    initialize_declaring, method, read_then_cut, read_to_end, request, resume_request,
    resume_stream, resume_token, stream_handle,
};
use common::redis_server;
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::{json, Value};

/// Progress values among `messages`, in order.
fn progress(messages: &[(Option<String>, Value)]) -> Vec<u64> {
    messages
        .iter()
        .filter(|(_, m)| method(m) == "notifications/progress")
        .map(|(_, m)| m["params"]["progress"].as_u64().expect("progress"))
        .collect()
}

/// The response to request `id` among `messages`.
fn response(messages: &[(Option<String>, Value)], id: u64) -> Option<&Value> {
    messages
        .iter()
        .map(|(_, m)| m)
        .find(|m| m["id"] == id && method(m).is_empty())
}

/// A slow call (`steps` steps of 100 ms) posted on `client`, read until
/// `seen` messages arrived, then cut.
async fn start_call_then_cut(
    client: &McpClient,
    sid: &str,
    id: u64,
    steps: u64,
    seen: usize,
) -> Vec<(Option<String>, Value)> {
    let res = client
        .send(Call::post(&slow_call(id, steps, 100)).session(sid))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    read_then_cut(res, seen).await
}

/// Asserts that `before` + `after` carry every progress step once, in
/// order, and end with the call's result.
fn assert_whole_call(
    before: &[(Option<String>, Value)],
    after: &[(Option<String>, Value)],
    id: u64,
    steps: u64,
) {
    let mut all = progress(before);
    all.extend(progress(after));
    assert_eq!(all, (1..=steps).collect::<Vec<_>>(), "no gap, no repeat");
    let result = response(after, id).expect("the call's response");
    assert!(result.get("result").is_some(), "{result}");
}

/// Asserts that `after` carries the call from at most where `before` was
/// cut (the resume dialects replay from the acknowledged cursor: at least
/// once, never a gap) to its result, each step once.
fn assert_rest_of_call(
    before: &[(Option<String>, Value)],
    after: &[(Option<String>, Value)],
    id: u64,
    steps: u64,
) {
    let rest = progress(after);
    let first = *rest.first().expect("progress after the resume");
    assert!(first as usize <= progress(before).len() + 1, "{rest:?}");
    assert_eq!(
        rest,
        (first..=steps).collect::<Vec<_>>(),
        "no gap, no repeat"
    );
    let result = response(after, id).expect("the call's response");
    assert!(result.get("result").is_some(), "{result}");
}

#[tokio::test]
async fn a_call_started_on_a_is_followed_live_on_b_after_last_event_id() {
    followed_live_on_b(&Cluster::start(DemoOptions::default()).await).await;
}

#[tokio::test]
async fn a_call_started_on_a_is_followed_live_on_b_on_a_redis_cluster() {
    let log = Log::Cluster(redis_cluster());
    followed_live_on_b(&Cluster::start_on_log(log, DemoOptions::default()).await).await;
}

/// The Redis Cluster this process's tests share.
fn redis_cluster() -> &'static common::redis_cluster::RedisCluster {
    common::redis_cluster::shared().unwrap_or_else(|why| panic!("{why}"))
}

/// A call started on A, cut, and followed on B with `Last-Event-ID`: B
/// serves all of it, most of it live.
async fn followed_live_on_b(cluster: &Cluster) {
    let sid = cluster.a.client().initialize(V_LATEST).await;
    let before = start_call_then_cut(&cluster.a.client(), &sid, 2, 30, 3).await;
    let last_id = before.last().and_then(|(id, _)| id.clone()).expect("an id");

    let res = cluster
        .b
        .client()
        .send(Call::get().session(&sid).header("last-event-id", &last_id))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let after = read_to_end(res).await;
    assert_whole_call(&before, &after, 2, 30);
    assert!(
        progress(&after).len() > 10,
        "most of the call reached B while A was still writing it"
    );
}

#[tokio::test]
async fn a_call_re_sent_on_b_after_a_cut_on_a_runs_once() {
    let cluster = Cluster::start(DemoOptions::default()).await;
    let sid = cluster.a.client().initialize(V_LATEST).await;
    start_call_then_cut(&cluster.a.client(), &sid, 4, 10, 2).await;
    let res = cluster
        .b
        .client()
        .send(Call::post(&slow_call(4, 10, 100)).session(&sid))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let again = read_to_end(res).await;
    assert_eq!(
        progress(&again),
        (1..=10).collect::<Vec<_>>(),
        "the same call, from its start"
    );
    assert!(response(&again, 4).is_some_and(|r| r.get("result").is_some()));
    let started = &cluster.upstream.stats.calls_started;
    assert_eq!(started.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn requests_resume_on_b_delivers_the_rest_of_a_call_running_on_a() {
    let cluster = Cluster::start(DemoOptions::default()).await;
    let caps = json!({"resumableRequests": {}});
    let (sid, _) = initialize_declaring(&cluster.a.client(), caps).await;
    let before = start_call_then_cut(&cluster.a.client(), &sid, 3, 20, 3).await;
    let token = resume_token(&before);

    let status = request(
        json!(50),
        "requests/getStatus",
        json!({"requestId": 3, "resumeToken": token}),
    );
    let on_b = dialects::ask(&cluster.b.client(), &sid, &status).await;
    assert_eq!(on_b["result"]["status"], "processing", "{on_b}");

    let after = read_to_end(resume_request(&cluster.b.client(), &sid, 3, &token).await).await;
    assert_rest_of_call(&before, &after, 3, 20);
}

#[tokio::test]
async fn stream_resume_and_poll_on_b_serve_a_call_running_on_a() {
    let cluster = Cluster::start(DemoOptions::default()).await;
    let caps = json!({"streams": {}});
    let (sid, _) = initialize_declaring(&cluster.a.client(), caps).await;
    let before = start_call_then_cut(&cluster.a.client(), &sid, 4, 20, 3).await;
    let handle = stream_handle(&before);

    let poll = request(json!(60), "stream/poll", json!({"streamId": handle}));
    let on_b = dialects::ask(&cluster.b.client(), &sid, &poll).await;
    assert_eq!(on_b["result"]["status"], "live", "{on_b}");
    assert_eq!(on_b["result"]["pendingMessages"], true, "{on_b}");

    let after = read_to_end(resume_stream(&cluster.b.client(), &sid, 61, &handle).await).await;
    assert_rest_of_call(&before, &after, 4, 20);
    assert!(
        after
            .iter()
            .any(|(_, m)| method(m) == "notifications/stream/end"),
        "the stream ends as seed 003 says"
    );
}

/// A call of 40 steps started on A, A killed mid-call, and the stream read
/// on B from the last event id A sent: what A sent, and what B serves.
async fn call_outliving_a(
    cluster: &mut Cluster,
    sid: &str,
    id: u64,
) -> (Vec<(Option<String>, Value)>, Vec<(Option<String>, Value)>) {
    let before = start_call_then_cut(&cluster.a.client(), sid, id, 40, 3).await;
    let last_id = before.last().and_then(|(id, _)| id.clone()).expect("an id");
    cluster.a.proxy.kill9();
    let res = cluster
        .b
        .client()
        .send(Call::get().session(sid).header("last-event-id", &last_id))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    (before, read_to_end(res).await)
}

#[tokio::test]
async fn b_takes_over_a_call_whose_instance_was_killed() {
    taken_over_by_b(&mut Cluster::start(DemoOptions::default()).await).await;
}

#[tokio::test]
async fn b_takes_over_a_call_whose_instance_was_killed_on_a_redis_cluster() {
    let log = Log::Cluster(redis_cluster());
    taken_over_by_b(&mut Cluster::start_on_log(log, DemoOptions::default()).await).await;
}

/// A killed mid-call: B takes the call over, and the session goes on, on
/// B and on A restarted.
async fn taken_over_by_b(cluster: &mut Cluster) {
    let sid = cluster.a.client().initialize(V_LATEST).await;
    // B follows the stream while A's lease runs out, then takes the call
    // over: it resumes the upstream from the last event A logged.
    let (before, after) = call_outliving_a(cluster, &sid, 5).await;
    assert_whole_call(&before, &after, 5, 40);

    // The session carries on, on B and on a restarted A.
    cluster.restart_a().await;
    for client in [cluster.a.client(), cluster.b.client()] {
        let call = Call::post(&tool_call(6, "echo", json!({"text": "on"}))).session(&sid);
        let answer = messages(client.send(call).await).await;
        assert_eq!(answer.last().expect("an answer")["id"], 6);
    }
}

#[tokio::test]
async fn a_call_that_cannot_be_resumed_ends_with_an_error_after_its_instance_died() {
    let mut cluster = Cluster::start(DemoOptions {
        no_event_ids: true,
        ..DemoOptions::default()
    })
    .await;
    let sid = cluster.a.client().initialize(V_LATEST).await;
    let (_, after) = call_outliving_a(&mut cluster, &sid, 7).await;
    let error = response(&after, 7).expect("a response, never silence");
    assert!(error.get("error").is_some(), "{error}");
}

#[tokio::test]
async fn a_reader_on_b_ends_the_reader_of_the_same_stream_on_a() {
    let cluster = Cluster::start(DemoOptions::default()).await;
    let sid = cluster.a.client().initialize(V_LATEST).await;
    let res = cluster
        .a
        .client()
        .send(Call::post(&slow_call(8, 100, 100)).session(&sid))
        .await;
    let mut on_a = SseReader::new(res);
    let (id, _) = on_a.next_message().await.expect("a first message");
    let id = id.expect("an event id");

    let res = cluster
        .b
        .client()
        .send(Call::get().session(&sid).header("last-event-id", &id))
        .await;
    let mut on_b = SseReader::new(res);
    assert!(on_b.next_message().await.is_some(), "B reads the stream");
    // A's answer ends: the stream has one reader, on B.
    let ended = tokio::time::timeout(LIMIT, async {
        while on_a.next_message().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "A's reader was not ended");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(on_b.next_message().await.is_some(), "B still reads");
}

#[tokio::test]
async fn a_cancellation_sent_to_b_stops_a_call_running_on_a() {
    let cluster = Cluster::start(DemoOptions::default()).await;
    let sid = cluster.a.client().initialize(V_LATEST).await;
    let before = start_call_then_cut(&cluster.a.client(), &sid, 9, 200, 2).await;
    let last_id = before.last().and_then(|(id, _)| id.clone()).expect("an id");
    let cancel = json!({"jsonrpc":"2.0","method":"notifications/cancelled",
        "params":{"requestId": 9, "reason": "changed my mind"}});
    let res = cluster
        .b
        .client()
        .send(Call::post(&cancel).session(&sid))
        .await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    // The stream ends (cancelled) long before the call's 20 s would have.
    let res = cluster
        .b
        .client()
        .send(Call::get().session(&sid).header("last-event-id", &last_id))
        .await;
    let after = tokio::time::timeout(Duration::from_secs(10), read_to_end(res))
        .await
        .expect("the cancelled stream ends");
    assert!(progress(&after).len() < 150, "the upstream stopped early");
}

#[tokio::test]
async fn redis_going_away_mid_call_gives_clear_errors_then_everything_recovers() {
    // A server of its own, with an append-only file: it is killed and
    // restarted, and must come back with what it acknowledged.
    let mut redis = redis_server::RedisServer::start(redis_server::Persistence::Aof)
        .unwrap_or_else(|why| panic!("{why}"));
    let cluster = Cluster::start_on(&redis.url(), DemoOptions::default()).await;
    let sid = cluster.a.client().initialize(V_LATEST).await;
    let before = start_call_then_cut(&cluster.a.client(), &sid, 10, 40, 3).await;
    let last_id = before.last().and_then(|(id, _)| id.clone()).expect("an id");

    redis.kill9();
    let call = Call::post(&tool_call(11, "echo", json!({"text": "x"}))).session(&sid);
    let refused = cluster.b.client().send(call).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = body_json(refused).await;
    assert!(body["error"]["message"].is_string(), "{body}");
    // Long enough for A's relay to meet the missing log.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    redis.restart();
    // The interrupted call ends with a response (never silence), and
    // nothing it logged is repeated.
    let after = loop {
        let res = cluster
            .b
            .client()
            .send(Call::get().session(&sid).header("last-event-id", &last_id))
            .await;
        if res.status() == StatusCode::OK {
            break tokio::time::timeout(LIMIT, read_to_end(res))
                .await
                .expect("the interrupted stream ends");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(response(&after, 10).is_some(), "{after:?}");
    let mut all = progress(&before);
    all.extend(progress(&after));
    assert!(all.windows(2).all(|w| w[1] == w[0] + 1), "{all:?}");

    let call = Call::post(&tool_call(12, "echo", json!({"text": "back"}))).session(&sid);
    let answer = messages(cluster.b.client().send(call).await).await;
    assert_eq!(answer.last().expect("an answer")["id"], 12);
}

#[tokio::test]
async fn streams_list_reads_the_shared_log_while_the_instances_run() {
    let cluster = Cluster::start(DemoOptions::default()).await;
    let sid = cluster.a.client().initialize(V_LATEST).await;
    start_call_then_cut(&cluster.b.client(), &sid, 13, 20, 2).await;
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
        .args(["streams", "list", "--live", "--json", "--config"])
        .arg(&cluster.config)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(LIMIT, run)
        .await
        .expect("streams list finishes")
        .expect("streams list runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["method"] == "tools/call" && l["session"].as_str() == Some(sid.as_str())),
        "{text}"
    );
}

#[tokio::test]
async fn an_instance_stopped_with_sigterm_hands_its_calls_over_at_once() {
    // A lease far longer than the test may wait: only the handover can
    // finish the call in time.
    let mut cluster = Cluster::with_lease(DemoOptions::default(), 120_000).await;
    let sid = cluster.a.client().initialize(V_LATEST).await;
    let before = start_call_then_cut(&cluster.a.client(), &sid, 14, 30, 3).await;
    let last_id = before.last().and_then(|(id, _)| id.clone()).expect("an id");
    assert!(cluster.a.proxy.terminate().await.success());

    let res = cluster
        .b
        .client()
        .send(Call::get().session(&sid).header("last-event-id", &last_id))
        .await;
    let after = tokio::time::timeout(LIMIT, read_to_end(res))
        .await
        .expect("B carries the call on well before A's lease would have run out");
    assert_whole_call(&before, &after, 14, 30);
}

/// Tasks live in the shared log: any instance answers any task, and a
/// cancellation on one stops the upstream call the other runs.
#[tokio::test]
async fn a_task_created_on_a_is_polled_and_cancelled_on_b() {
    let modern = DemoOptions {
        modern: true,
        ..DemoOptions::default()
    };
    polled_and_cancelled_on_b(&Cluster::start(modern).await).await;
}

/// The same on a Redis Cluster, where the task and its legs are in their
/// own partition of the log, whichever partition that is.
#[tokio::test]
async fn a_task_created_on_a_is_polled_and_cancelled_on_b_on_a_redis_cluster() {
    let modern = DemoOptions {
        modern: true,
        ..DemoOptions::default()
    };
    let log = Log::Cluster(redis_cluster());
    polled_and_cancelled_on_b(&Cluster::start_on_log(log, modern).await).await;
}

async fn polled_and_cancelled_on_b(cluster: &Cluster) {
    use common::tasks::{answer_from, modern, settled_on, slow, tasks_call};
    use std::sync::atomic::Ordering;
    // Calls become tasks after the default second.
    let (_, created) = answer_from(&cluster.a.client(), modern(&slow(1, 200, 50, true))).await;
    let task = created["result"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();
    let (status, seen) = answer_from(&cluster.b.client(), tasks_call(2, "tasks/get", &task)).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["result"]["status"], "working");
    let (_, ack) = answer_from(&cluster.b.client(), tasks_call(3, "tasks/cancel", &task)).await;
    assert_eq!(ack["result"], json!({"resultType":"complete"}));
    let stats = cluster.upstream.stats.clone();
    eventually("A dropped the upstream call", || {
        stats.calls_cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    let on_a = settled_on(&cluster.a.client(), &task).await;
    assert_eq!(on_a["status"], "cancelled", "{on_a}");
}

/// Every message of the answer to `body`, sent in `session` to `instance`.
async fn in_session(
    instance: &common::cluster::Instance,
    session: &str,
    body: &Value,
) -> Vec<Value> {
    let res = instance
        .client()
        .send(Call::post(body).session(session))
        .await;
    common::tasks::said(res).await
}

/// A 2025-11-25 task's record and its call's stream live in the shared log:
/// the session's requests on the other instance see the task, list it and
/// fetch its result with every progress notification once.
#[tokio::test]
async fn a_legacy_task_made_on_a_is_fetched_and_listed_on_b() {
    let cluster = Cluster::with_upstream_toml(DemoOptions::default(), LEGACY_TASKS).await;
    fetched_and_listed_on_b(&cluster).await;
}

/// The same on a Redis Cluster, where the task, its call's stream and its
/// session are in the session's partition of the log.
#[tokio::test]
async fn a_legacy_task_made_on_a_is_fetched_and_listed_on_b_on_a_redis_cluster() {
    let log = Log::Cluster(redis_cluster());
    let options = DemoOptions::default();
    let cluster = Cluster::on_log_with_upstream_toml(log, options, LEGACY_TASKS).await;
    fetched_and_listed_on_b(&cluster).await;
}

const LEGACY_TASKS: &str = "[upstream.tasks]\nlegacy = true\npoll_interval_ms = 50\n";

async fn fetched_and_listed_on_b(cluster: &Cluster) {
    let session = cluster.a.client().initialize(V_LATEST).await;
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
        "name":"slow","arguments":{"steps":5,"interval_ms":60},"task":{},
        "_meta":{"progressToken":"lt1"}}});
    let created = in_session(&cluster.a, &session, &call).await;
    let task = created[0]["result"]["task"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();
    let fetch = json!({"jsonrpc":"2.0","id":2,"method":"tasks/result","params":{"taskId":task}});
    let on_b = in_session(&cluster.b, &session, &fetch).await;
    let progress = progress_values(&on_b);
    assert_eq!(progress, [1, 2, 3, 4, 5], "{on_b:?}");
    let last = on_b.last().expect("the result");
    assert_eq!(last["id"], 2);
    assert_eq!(
        last["result"]["content"][0]["text"],
        "slow done after 5 steps"
    );
    let list = json!({"jsonrpc":"2.0","id":3,"method":"tasks/list"});
    let listed = in_session(&cluster.b, &session, &list).await;
    let tasks = &listed[0]["result"]["tasks"];
    assert_eq!(tasks[0]["taskId"], task, "{listed:?}");
    assert_eq!(tasks[0]["status"], "completed");
}
