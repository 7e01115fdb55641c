//! Tasks for modern (2026-07-28) clients in front of an upstream that knows
//! nothing of them: a declaring client's long call becomes a task the proxy
//! serves from its log; a quick one gets its plain answer; the `tasks/*`
//! methods answer as a native server's would, errors included.

mod common;

use common::tasks::*;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::{Config, TasksConfig, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::{json, Value};

/// A proxy in front of the modern demo upstream; calls become tasks after
/// 100 ms.
async fn rig() -> Rig {
    rig_with(|tasks| tasks.task_after_ms = 100).await
}

/// The same with other task settings (`poll_interval_ms` 50 unless set).
async fn rig_with(tweak: impl FnOnce(&mut TasksConfig)) -> Rig {
    let options = DemoOptions {
        modern: true,
        ..Default::default()
    };
    Rig::with(options, |config| {
        let tasks = &mut config.upstream[0].tasks;
        tasks.poll_interval_ms = 50;
        tweak(tasks);
    })
    .await
}

/// The last JSON-RPC message of a response, with its status.
async fn answer(rig: &Rig, call: Call) -> (StatusCode, Value) {
    answer_from(&rig.client, call).await
}

async fn create_task(rig: &Rig, id: u64, steps: u64) -> String {
    let (status, created) = answer(rig, modern(&slow(id, steps, 50, true))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    created["result"]["taskId"].as_str().unwrap().to_owned()
}

/// Polls `tasks/get` until the task leaves `working`.
async fn settled(rig: &Rig, task: &str) -> Value {
    settled_on(&rig.client, task).await
}

#[tokio::test]
async fn a_long_call_of_a_declaring_client_becomes_a_task_that_completes_with_the_upstreams_result()
{
    let rig = rig().await;
    let (_, created) = answer(&rig, modern(&slow(1, 6, 50, true))).await;
    let result = &created["result"];
    assert_eq!(created["id"], 1);
    assert_eq!(result["resultType"], "task");
    assert_eq!(result["status"], "working");
    for field in ["createdAt", "lastUpdatedAt"] {
        assert!(
            result[field].as_str().is_some_and(|t| t.ends_with('Z')),
            "{result}"
        );
    }
    assert_eq!(result["ttlMs"], 3_600_000);
    assert_eq!(result["pollIntervalMs"], 50);
    assert!(result.get("result").is_none());

    let task = result["taskId"].as_str().unwrap();
    let done = settled(&rig, task).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["resultType"], "complete");
    assert_eq!(done["taskId"], task);
    // What the upstream answers the same call directly.
    let direct = McpClient::new(rig.upstream.url());
    let plain = said(direct.send(modern(&slow(2, 6, 1, false))).await).await;
    assert_eq!(done["result"], plain.last().unwrap()["result"]);
}

#[tokio::test]
async fn a_call_that_ends_before_task_after_ms_gets_its_plain_answer() {
    let rig = rig().await;
    let echo = request(
        3,
        "tools/call",
        json!({"name":"echo","arguments":{"text":"hi"}}),
        true,
    );
    let (status, got) = answer(&rig, modern(&echo)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["result"]["content"][0]["text"], "hi");
    assert!(got["result"].get("taskId").is_none());
}

#[tokio::test]
async fn a_call_without_the_declaration_passes_through_and_never_becomes_a_task() {
    let rig = rig().await;
    let res = rig.client.send(modern(&slow(4, 4, 50, false))).await;
    let all = said(res).await;
    let last = all.last().unwrap();
    assert_eq!(last["id"], 4);
    assert!(last["result"]["content"].is_array(), "{last}");
    assert!(last["result"].get("taskId").is_none());
}

#[tokio::test]
async fn cancelling_a_task_stops_the_upstream_call() {
    let rig = rig().await;
    let task = create_task(&rig, 5, 100).await;
    let (status, ack) = answer(&rig, tasks_call(6, "tasks/cancel", &task)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ack["result"], json!({"resultType":"complete"}));
    let stats = rig.upstream.stats.clone();
    eventually("the upstream saw the cancellation", || {
        stats.calls_cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(settled(&rig, &task).await["status"], "cancelled");
    // Cancelling again changes nothing and says so the same way.
    let (_, again) = answer(&rig, tasks_call(7, "tasks/cancel", &task)).await;
    assert_eq!(again["result"], json!({"resultType":"complete"}));
}

#[tokio::test]
async fn a_client_gone_before_its_answer_cancels_the_call() {
    let rig = rig_with(|tasks| tasks.task_after_ms = 400).await;
    let client = McpClient::new(rig.client.url.clone());
    let sent = tokio::spawn(async move { client.send(modern(&slow(8, 100, 50, true))).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    sent.abort();
    let stats = rig.upstream.stats.clone();
    eventually("the upstream saw the cancellation", || {
        stats.calls_cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
}

#[tokio::test]
async fn another_principals_task_is_unknown_not_forbidden() {
    let rig = rig().await;
    let task = create_task(&rig, 9, 40).await;
    let (status, got) = answer(
        &rig,
        tasks_call(10, "tasks/get", &task).header("authorization", "Bearer mallory"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["code"], -32602);
    let (_, unknown) = answer(&rig, tasks_call(11, "tasks/get", "no-such-task")).await;
    assert_eq!(
        got["error"], unknown["error"],
        "indistinguishable from unknown"
    );
}

#[tokio::test]
async fn an_mcp_name_that_is_not_the_task_id_is_refused() {
    let rig = rig().await;
    let task = create_task(&rig, 12, 40).await;
    let (status, got) = answer(
        &rig,
        tasks_call(13, "tasks/get", &task).header("mcp-name", "another-task"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["code"], -32020);
    let (status, _) = answer(
        &rig,
        tasks_call(14, "tasks/get", &task).header("mcp-name", &task),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "a matching Mcp-Name is fine");
}

#[tokio::test]
async fn tasks_methods_without_the_declaration_are_refused() {
    let rig = rig().await;
    let task = create_task(&rig, 15, 40).await;
    let get = request(16, "tasks/get", json!({"taskId": task}), false);
    let (status, got) = answer(&rig, modern(&get)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["code"], -32021);
    assert!(
        got["error"]["data"]["requiredCapabilities"]["extensions"]["io.modelcontextprotocol/tasks"]
            .is_object(),
        "{got}"
    );
}

#[tokio::test]
async fn methods_the_extension_removed_are_not_found() {
    let rig = rig().await;
    for (id, method) in [(17, "tasks/result"), (18, "tasks/list")] {
        let (status, got) = answer(&rig, tasks_call(id, method, "x")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
        assert_eq!(got["error"]["code"], -32601, "{method}");
    }
}

#[tokio::test]
async fn discover_offers_the_extension_of_an_upstream_without_it() {
    let rig = rig().await;
    let discover = request(19, "server/discover", json!({}), false);
    let (status, got) = answer(&rig, modern(&discover)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        got["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"].is_object(),
        "{got}"
    );
}

#[tokio::test]
async fn a_completed_task_is_still_served_after_a_restart_of_the_proxy() {
    let mut rig = rig().await;
    let task = create_task(&rig, 20, 4).await;
    let before = settled(&rig, &task).await;
    assert_eq!(before["status"], "completed");
    rig.proxy.take().unwrap().shutdown().await;
    let mut upstream = UpstreamConfig::new(rig.upstream.url());
    upstream.tasks.poll_interval_ms = 50;
    let config = Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: rig.dir.path().to_path_buf(),
        upstream: vec![upstream],
        ..Config::default()
    };
    let proxy = mcp_resume_proxy::Server::start(config)
        .await
        .expect("restarts");
    rig.client = McpClient::new(format!("http://{}/mcp", proxy.addr));
    rig.proxy = Some(proxy);
    let after = settled(&rig, &task).await;
    assert_eq!(after["result"], before["result"]);
}

/// The proxy as a real process, `kill -9`ed mid-task.
#[tokio::test]
async fn a_task_running_when_the_proxy_is_killed_ends_failed_with_a_clear_error() {
    use common::process::Crashable;
    let mut rig = Crashable::start(DemoOptions {
        modern: true,
        ..Default::default()
    })
    .await;
    // Calls become tasks after the default second.
    let (_, created) = answer_from(&rig.client(), modern(&slow(21, 60, 50, true))).await;
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();
    let (_, done_first) = answer_from(&rig.client(), modern(&slow(22, 25, 50, true))).await;
    let done = done_first["result"]["taskId"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(400)).await;
    rig.kill9_and_restart().await;

    let client = rig.client();
    let failed = settled_on(&client, &task).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("the proxy restarted"), "{failed}");
    let completed = settled_on(&client, &done).await;
    assert_eq!(completed["status"], "completed", "{completed}");
}

#[tokio::test]
async fn a_listen_for_a_task_gets_each_change_of_it_as_notifications_tasks() {
    let rig = rig().await;
    let task = create_task(&rig, 23, 6).await;
    let listen = request(
        24,
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [task, "not-a-task"]}}),
        true,
    );
    let mut reader = SseReader::new(rig.client.send(modern(&listen)).await);
    let (_, ack) = reader.next_message().await.unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([task]));
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        24
    );
    let mut statuses = Vec::new();
    while statuses.last().map(String::as_str) != Some("completed") {
        let (_, note) = tokio::time::timeout(LIMIT, reader.next_message())
            .await
            .expect("a notification in time")
            .expect("the stream stays open");
        assert_eq!(note["method"], "notifications/tasks", "{note}");
        assert_eq!(note["params"]["taskId"], task.as_str());
        statuses.push(note["params"]["status"].as_str().unwrap().to_owned());
    }
    assert_eq!(statuses, ["working", "completed"]);
}

#[tokio::test]
async fn a_listen_watches_each_named_task_once() {
    let rig = rig().await;
    let task = create_task(&rig, 25, 2).await;
    let ids: Vec<&str> = std::iter::repeat_n(task.as_str(), 500).collect();
    let listen = request(
        26,
        "subscriptions/listen",
        json!({"notifications": {"taskIds": ids}}),
        true,
    );
    let mut reader = SseReader::new(rig.client.send(modern(&listen)).await);
    let (_, ack) = reader.next_message().await.unwrap();
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([task]));
}

#[tokio::test]
async fn an_upstream_that_cannot_answer_discover_is_asked_once() {
    // The legacy-only demo refuses every modern request.
    let rig = Rig::with(DemoOptions::default(), |_| {}).await;
    for id in [27, 28, 29] {
        let _ = rig.client.send(modern(&slow(id, 1, 10, true))).await;
    }
    let asked = rig
        .upstream
        .stats
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|h| h.get("mcp-method").is_some_and(|m| m == "server/discover"))
        .count();
    assert_eq!(asked, 1);
}

#[tokio::test]
async fn calls_not_yet_tasks_count_against_the_principals_cap() {
    let options = DemoOptions {
        modern: true,
        ..Default::default()
    };
    let rig = Rig::with(options, |config| {
        config.limits.streams_per_principal = 2;
        config.upstream[0].tasks.task_after_ms = 5_000;
    })
    .await;
    let calls = (0..3).map(|id| {
        let client = &rig.client;
        async move {
            client
                .send(modern(&slow(60 + id, 20, 50, true)))
                .await
                .status()
        }
    });
    let statuses = futures_util::future::join_all(calls).await;
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(refused, 1, "{statuses:?}");
}

#[tokio::test]
async fn a_task_past_its_ttl_is_unknown() {
    let rig = rig_with(|tasks| {
        tasks.task_after_ms = 0;
        tasks.ttl_ms = 400;
    })
    .await;
    let task = create_task(&rig, 25, 2).await;
    assert_eq!(settled(&rig, &task).await["ttlMs"], 400);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, gone) = answer(&rig, tasks_call(26, "tasks/get", &task)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(gone["error"]["code"], -32602, "{gone}");
}

#[tokio::test]
async fn input_the_upstream_asks_for_is_answered_through_the_task_and_the_call_reissued() {
    let rig = rig().await;
    let confirm = request(
        27,
        "tools/call",
        json!({"name":"confirm","arguments":{"text":"Delete a.txt?","ask_after_ms":300,"answer_after_ms":200}}),
        true,
    );
    let (_, created) = answer(&rig, modern(&confirm)).await;
    let task = created["result"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();
    let asked = settled(&rig, &task).await;
    assert_eq!(asked["status"], "input_required", "{asked}");
    let requests = asked["inputRequests"].as_object().unwrap();
    let keys: Vec<&String> = requests.keys().collect();
    assert_eq!(keys, ["1.confirm"], "keys carry their round");
    assert_eq!(requests["1.confirm"]["method"], "elicitation/create");
    assert!(
        asked.get("requestState").is_none(),
        "the state stays the proxy's"
    );

    let answers = json!({
        "taskId": task,
        "inputResponses": {
            "0.confirm": {"action": "decline"},
            "1.confirm": {"action": "accept", "content": {"confirm": true}},
        },
    });
    let update = request(28, "tasks/update", answers, true);
    let (status, ack) = answer(&rig, modern(&update)).await;
    assert_eq!(status, StatusCode::OK, "{ack}");
    assert_eq!(ack["result"], json!({"resultType":"complete"}));
    let done = settled(&rig, &task).await;
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("confirmed:") && text.contains("accept"),
        "{text}"
    );
}

/// Clients poll their tasks through a relay that cuts responses at random
/// byte positions: a cut poll is asked again; every task's statuses only
/// move forward, and every task ends completed with the upstream's result.
#[tokio::test]
async fn polls_cut_at_random_lose_no_task_and_change_no_result() {
    use common::chaos::{cuts_wanted, seed, Relay, Rng};
    use http_body_util::BodyExt;
    let rig = rig().await;
    let relay = Relay::start(rig.proxy.as_ref().expect("proxy").addr).await;
    let through = McpClient::unpooled(relay.url());
    let seed = seed();
    eprintln!("task chaos: seed {seed} (replay with CHAOS_SEED={seed})");
    let mut rng = Rng::new(seed);
    let wanted = cuts_wanted(40);
    let mut tasks = Vec::new();
    for id in 0..8 {
        tasks.push((create_task(&rig, 100 + id, 4 + id % 5).await, Vec::new()));
    }
    let direct = McpClient::new(rig.upstream.url());
    let expected = |steps: u64| {
        let direct = &direct;
        async move { said(direct.send(modern(&slow(1, steps, 1, false))).await).await }
    };
    let mut polls = 0;
    while tasks.iter().any(|(_, seen): &(String, Vec<Value>)| {
        seen.last().is_none_or(|s| s["status"] != "completed")
    }) || relay.cuts() < wanted
    {
        polls += 1;
        assert!(polls < 20_000, "seed {seed}: polling never ended");
        let n = rng.below(tasks.len() as u64) as usize;
        if rng.below(2) == 0 {
            relay.arm(rng.below(400) as usize);
        } else {
            relay.disarm();
        }
        let call = tasks_call(200, "tasks/get", &tasks[n].0);
        let Ok(res) = through.try_send(call).await else {
            continue; // cut in the head
        };
        let Ok(body) = res.into_body().collect().await else {
            continue; // cut in the body
        };
        let Ok(got) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
            continue;
        };
        tasks[n].1.push(got["result"].clone());
    }
    for (i, (task, seen)) in tasks.iter().enumerate() {
        let statuses: Vec<&str> = seen.iter().filter_map(|s| s["status"].as_str()).collect();
        let first_done = statuses.iter().position(|s| *s == "completed").unwrap();
        assert!(
            statuses[..first_done].iter().all(|s| *s == "working")
                && statuses[first_done..].iter().all(|s| *s == "completed"),
            "seed {seed}: task {task} went {statuses:?}"
        );
        let want = expected(4 + i as u64 % 5).await;
        for done in &seen[first_done..] {
            assert_eq!(
                done["result"],
                want.last().unwrap()["result"],
                "seed {seed}"
            );
        }
    }
    assert!(relay.cuts() >= wanted, "seed {seed}: {} cuts", relay.cuts());
}
