//! The 2025-11-25 experimental tasks, served by the proxy to sessions of an
//! upstream that has none (opt-in per upstream): a `tools/call` with
//! `params.task` answers at once with a task; `tasks/get`, `tasks/result`,
//! `tasks/list` and `tasks/cancel` answer as a native server's would, from
//! the log; the task's upstream request is an ordinary request of the
//! session, so it survives cuts and restarts like any other.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::tasks::said;
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::{json, Value};

/// A proxy serving 2025-11-25 tasks in front of the demo upstream.
async fn rig() -> Rig {
    rig_with(DemoOptions::default(), |_| {}).await
}

async fn rig_with(
    options: DemoOptions,
    tweak: impl FnOnce(&mut mcp_resume_proxy::config::TasksConfig),
) -> Rig {
    Rig::with(options, |config| {
        let tasks = &mut config.upstream[0].tasks;
        tasks.legacy = true;
        tasks.poll_interval_ms = 50;
        tweak(tasks);
    })
    .await
}

/// A `tools/call` that asks for a task.
fn task_call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name":name,"arguments":arguments,"task":{"ttl":60_000},
        "_meta":{"progressToken": format!("p{id}")}}})
}

fn tasks_request(id: u64, method: &str, task: &str) -> Value {
    // SDK clients send `params.task` again on `tasks/*`: it is ignored.
    json!({"jsonrpc":"2.0","id":id,"method":method,"params":{"taskId":task,"task":{"ttl":60_000}}})
}

/// The requests of these tests, sent by one client.
struct Caller<'a> {
    client: &'a McpClient,
}

impl Caller<'_> {
    /// Every message of the answer to `body` in `session`, with its status.
    async fn exchange(&self, session: &str, body: &Value) -> (StatusCode, Vec<Value>) {
        let res = self.client.send(Call::post(body).session(session)).await;
        let status = res.status();
        (status, said(res).await)
    }

    /// The one answer to `body` in `session`.
    async fn answer(&self, session: &str, body: &Value) -> Value {
        let (status, mut all) = self.exchange(session, body).await;
        assert_eq!(status, StatusCode::OK, "{all:?}");
        all.pop().expect("an answer")
    }

    async fn create(&self, session: &str, id: u64, name: &str, arguments: Value) -> String {
        let created = self.answer(session, &task_call(id, name, arguments)).await;
        assert_eq!(created["id"], id, "{created}");
        let task = &created["result"]["task"];
        assert_eq!(task["status"], "working", "{created}");
        task["taskId"].as_str().expect("a task id").to_owned()
    }

    /// Polls `tasks/get` until the task's status is not `working`.
    async fn settled(&self, session: &str, task: &str) -> Value {
        let get = tasks_request(90, "tasks/get", task);
        common::tasks::until_settled(|| self.answer(session, &get)).await
    }
}

async fn exchange(rig: &Rig, session: &str, body: &Value) -> (StatusCode, Vec<Value>) {
    Caller {
        client: &rig.client,
    }
    .exchange(session, body)
    .await
}

async fn answer(rig: &Rig, session: &str, body: &Value) -> Value {
    Caller {
        client: &rig.client,
    }
    .answer(session, body)
    .await
}

async fn create(rig: &Rig, session: &str, id: u64, name: &str, arguments: Value) -> String {
    Caller {
        client: &rig.client,
    }
    .create(session, id, name, arguments)
    .await
}

async fn get(rig: &Rig, session: &str, task: &str) -> Value {
    answer(rig, session, &tasks_request(90, "tasks/get", task)).await
}

async fn settled(rig: &Rig, session: &str, task: &str) -> Value {
    Caller {
        client: &rig.client,
    }
    .settled(session, task)
    .await
}

fn error_code(message: &Value) -> i64 {
    message["error"]["code"].as_i64().unwrap_or_default()
}

#[tokio::test]
async fn initialize_advertises_tasks_and_tools_list_marks_each_tool_optional() {
    let rig = rig().await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    let session = session_id(res.headers()).expect("a session");
    let result = said(res).await.pop().expect("the initialize result");
    let tasks = &result["result"]["capabilities"]["tasks"];
    assert_eq!(tasks["requests"]["tools"]["call"], json!({}), "{result}");
    assert_eq!(tasks["list"], json!({}));
    assert_eq!(tasks["cancel"], json!({}));
    let listed = answer(
        &rig,
        &session,
        &json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}),
    )
    .await;
    let tools = listed["result"]["tools"].as_array().expect("tools");
    assert!(!tools.is_empty());
    for tool in tools {
        assert_eq!(tool["execution"]["taskSupport"], "optional", "{tool}");
    }
}

#[tokio::test]
async fn without_the_opt_in_nothing_is_rewritten_and_a_task_call_runs_plainly() {
    let rig = Rig::start().await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    let session = session_id(res.headers()).expect("a session");
    let result = said(res).await.pop().expect("the initialize result");
    assert!(
        result["result"]["capabilities"].get("tasks").is_none(),
        "{result}"
    );
    let plain = answer(&rig, &session, &task_call(3, "echo", json!({"text":"hi"}))).await;
    assert_eq!(plain["result"]["content"][0]["text"], "hi", "{plain}");
}

#[tokio::test]
async fn an_upstream_with_tasks_of_its_own_keeps_them() {
    let options = DemoOptions {
        declares_tasks: true,
        ..Default::default()
    };
    let rig = rig_with(options, |_| {}).await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    let session = session_id(res.headers()).expect("a session");
    let result = said(res).await.pop().expect("the initialize result");
    assert!(
        result["result"]["capabilities"]["tasks"]
            .get("list")
            .is_none(),
        "{result}"
    );
    // The call and the tasks methods are the upstream's.
    let plain = answer(&rig, &session, &task_call(4, "echo", json!({"text":"hi"}))).await;
    assert_eq!(plain["result"]["content"][0]["text"], "hi", "{plain}");
    let got = get(&rig, &session, "anything").await;
    assert_eq!(error_code(&got), -32601, "{got}");
}

/// The scenario HTTP and stdio upstreams share: a task made at once,
/// polled to its end, its result fetched under the `tasks/result` id.
async fn a_task_completes_and_its_result_is_fetched(client: &McpClient) {
    let session = client.initialize(V_LATEST).await;
    let rig = Caller { client };
    let task = rig
        .create(&session, 5, "slow", json!({"steps":4,"interval_ms":30}))
        .await;
    let done = rig.settled(&session, &task).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["taskId"], task);
    assert_eq!(done["ttl"], 60_000);
    assert_eq!(done["pollInterval"], 50);
    let fetched = rig
        .answer(&session, &tasks_request(6, "tasks/result", &task))
        .await;
    assert_eq!(fetched["id"], 6, "{fetched}");
    assert_eq!(
        fetched["result"]["content"][0]["text"],
        "slow done after 4 steps"
    );
    let related = &fetched["result"]["_meta"]["io.modelcontextprotocol/related-task"];
    assert_eq!(related["taskId"], task, "{fetched}");
}

#[tokio::test]
async fn a_task_call_is_answered_at_once_and_its_result_fetched_once_completed() {
    let rig = rig().await;
    a_task_completes_and_its_result_is_fetched(&rig.client).await;
}

#[tokio::test]
async fn a_task_runs_on_a_stdio_upstream_too() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut upstream = mcp_resume_proxy::config::UpstreamConfig::command(vec![
        env!("CARGO_BIN_EXE_mcp-resume-proxy").into(),
        "demo-stdio-server".into(),
    ]);
    upstream.tasks.legacy = true;
    upstream.tasks.poll_interval_ms = 50;
    let config = mcp_resume_proxy::config::Config {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        upstream: vec![upstream],
        shutdown_grace_secs: 1,
        ..Default::default()
    };
    let proxy = mcp_resume_proxy::Server::start(config)
        .await
        .expect("proxy starts");
    let client = McpClient::new(format!("http://{}/mcp", proxy.addr));
    a_task_completes_and_its_result_is_fetched(&client).await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn tasks_result_waits_for_the_end_and_brings_the_calls_progress_first() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let task = create(
        &rig,
        &session,
        7,
        "slow",
        json!({"steps":3,"interval_ms":60}),
    )
    .await;
    let (status, all) = exchange(&rig, &session, &tasks_request(8, "tasks/result", &task)).await;
    assert_eq!(status, StatusCode::OK);
    let progress = progress_values(&all);
    assert_eq!(progress, [1, 2, 3], "{all:?}");
    let tokens = all
        .iter()
        .filter(|m| m["method"] == "notifications/progress");
    assert!(
        tokens.clone().all(|m| m["params"]["progressToken"] == "p7"),
        "{all:?}"
    );
    let last = all.last().expect("the answer");
    assert_eq!(last["id"], 8, "{last}");
    assert_eq!(
        last["result"]["content"][0]["text"],
        "slow done after 3 steps"
    );
}

#[tokio::test]
async fn the_client_may_reuse_the_id_of_a_call_that_became_a_task() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let _task = create(
        &rig,
        &session,
        9,
        "slow",
        json!({"steps":20,"interval_ms":50}),
    )
    .await;
    let again = answer(
        &rig,
        &session,
        &tool_call(9, "echo", json!({"text":"again"})),
    )
    .await;
    assert_eq!(again["result"]["content"][0]["text"], "again", "{again}");
}

#[tokio::test]
async fn a_task_call_sent_again_names_the_same_task_and_runs_once() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let arguments = json!({"steps":3,"interval_ms":30});
    let first = create(&rig, &session, 70, "slow", arguments.clone()).await;
    // The client lost the answer and sends the call again.
    let again = answer(&rig, &session, &task_call(70, "slow", arguments)).await;
    assert_eq!(again["result"]["task"]["taskId"], first, "{again}");
    assert_eq!(settled(&rig, &session, &first).await["status"], "completed");
    let started = rig.upstream.stats.calls_started.load(Ordering::Relaxed);
    assert_eq!(started, 1, "the tool ran once");
    // Other params under the same id: another call, another task.
    let other = create(&rig, &session, 70, "echo", json!({"text":"x"})).await;
    assert_ne!(other, first);
}

#[tokio::test]
async fn a_question_of_the_upstream_shows_input_required_and_is_answered_through_tasks_result() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let task = create(&rig, &session, 10, "ask", json!({"kind":"elicitation"})).await;
    let waiting = settled(&rig, &session, &task).await;
    assert_eq!(waiting["status"], "input_required", "{waiting}");
    let call = Call::post(&tasks_request(11, "tasks/result", &task)).session(&session);
    let mut reader = SseReader::new(rig.client.send(call).await);
    let (_, asked) = reader
        .next_message()
        .await
        .expect("the upstream's question");
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    let related = &asked["params"]["_meta"]["io.modelcontextprotocol/related-task"];
    assert_eq!(related["taskId"], task, "{asked}");
    let reply = json!({"jsonrpc":"2.0","id":asked["id"],
        "result":{"action":"accept","content":{"colour":"teal"}}});
    let res = rig.client.send(Call::post(&reply).session(&session)).await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let (_, result) = reader.next_message().await.expect("the task's answer");
    assert_eq!(result["id"], 11, "{result}");
    let text = result["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("teal"), "{result}");
    assert_eq!(settled(&rig, &session, &task).await["status"], "completed");
    // Asked again once the task ended: its answer alone, no question twice.
    let (_, again) = exchange(&rig, &session, &tasks_request(12, "tasks/result", &task)).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0]["id"], 12);
}

#[tokio::test]
async fn a_cut_tasks_result_resumed_with_last_event_id_still_ends_with_its_answer() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let task = create(
        &rig,
        &session,
        80,
        "slow",
        json!({"steps":6,"interval_ms":50}),
    )
    .await;
    let fetch = Call::post(&tasks_request(81, "tasks/result", &task)).session(&session);
    let mut cut = SseReader::new(rig.client.send(fetch).await);
    let (last, first) = cut.next_message().await.expect("the first progress");
    assert_eq!(first["params"]["progress"], 1, "{first}");
    drop(cut);
    let resume = Call::get()
        .session(&session)
        .header("last-event-id", &last.expect("an event id"));
    let rest = messages(rig.client.send(resume).await).await;
    let progress = progress_values(&rest);
    assert_eq!(progress, [2, 3, 4, 5, 6], "{rest:?}");
    let answer = rest.last().expect("the answer");
    assert_eq!(answer["id"], 81, "{answer}");
    let related = &answer["result"]["_meta"]["io.modelcontextprotocol/related-task"];
    assert_eq!(related["taskId"], task);
}

#[tokio::test]
async fn cancelling_a_running_task_stops_its_upstream_call() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let task = create(
        &rig,
        &session,
        12,
        "slow",
        json!({"steps":200,"interval_ms":50}),
    )
    .await;
    let cancelled = answer(&rig, &session, &tasks_request(13, "tasks/cancel", &task)).await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["result"]["taskId"], task);
    let stats = rig.upstream.stats.clone();
    eventually("the upstream call cancelled", || {
        stats.calls_cancelled.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!(
        get(&rig, &session, &task).await["result"]["status"],
        "cancelled"
    );
    let fetched = answer(&rig, &session, &tasks_request(14, "tasks/result", &task)).await;
    assert_eq!(error_code(&fetched), -32603, "{fetched}");
    assert_eq!(fetched["id"], 14);
}

#[tokio::test]
async fn cancelling_an_ended_task_is_invalid_params() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let task = create(&rig, &session, 15, "echo", json!({"text":"x"})).await;
    assert_eq!(settled(&rig, &session, &task).await["status"], "completed");
    let refused = answer(&rig, &session, &tasks_request(16, "tasks/cancel", &task)).await;
    assert_eq!(error_code(&refused), -32602, "{refused}");
}

#[tokio::test]
async fn a_tool_error_fails_the_task_and_tasks_result_still_returns_it() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let task = create(&rig, &session, 17, "echo", json!({})).await;
    assert_eq!(settled(&rig, &session, &task).await["status"], "failed");
    let fetched = answer(&rig, &session, &tasks_request(18, "tasks/result", &task)).await;
    assert_eq!(fetched["result"]["isError"], true, "{fetched}");
}

#[tokio::test]
async fn another_sessions_task_and_a_forged_id_are_unknown() {
    let rig = rig().await;
    let mine = rig.client.initialize(V_LATEST).await;
    let theirs = rig.client.initialize(V_LATEST).await;
    let task = create(&rig, &mine, 19, "echo", json!({"text":"x"})).await;
    for (session, id) in [(&theirs, task.as_str()), (&mine, "forged"), (&mine, "")] {
        for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
            let refused = answer(&rig, session, &tasks_request(20, method, id)).await;
            assert_eq!(error_code(&refused), -32602, "{method} {refused}");
        }
    }
    let missing = json!({"jsonrpc":"2.0","id":21,"method":"tasks/get","params":{}});
    assert_eq!(error_code(&answer(&rig, &mine, &missing).await), -32602);
}

#[tokio::test]
async fn tasks_list_shows_the_sessions_own_tasks_a_page_at_a_time() {
    let rig = rig().await;
    let mine = rig.client.initialize(V_LATEST).await;
    let theirs = rig.client.initialize(V_LATEST).await;
    let mut made = Vec::new();
    for id in 0..53 {
        made.push(create(&rig, &mine, 100 + id, "echo", json!({"text":"x"})).await);
    }
    let _other = create(&rig, &theirs, 99, "echo", json!({"text":"y"})).await;
    let list = |cursor: Option<&str>| {
        let mut params = json!({});
        if let Some(cursor) = cursor {
            params["cursor"] = json!(cursor);
        }
        json!({"jsonrpc":"2.0","id":30,"method":"tasks/list","params":params})
    };
    let first = answer(&rig, &mine, &list(None)).await;
    let cursor = first["result"]["nextCursor"].as_str().expect("a next page");
    let second = answer(&rig, &mine, &list(Some(cursor))).await;
    assert!(second["result"].get("nextCursor").is_none(), "{second}");
    let listed: Vec<String> = [&first, &second]
        .iter()
        .flat_map(|page| {
            page["result"]["tasks"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|t| t["taskId"].as_str().unwrap_or_default().to_owned())
        .collect();
    // Oldest first; tasks made in the same millisecond in a fixed order of
    // their own: every task once, over the two pages.
    let (mut listed, mut made) = (listed, made);
    listed.sort();
    made.sort();
    assert_eq!(listed, made);
    let bad = answer(&rig, &mine, &list(Some("nonsense"))).await;
    assert_eq!(error_code(&bad), -32602, "{bad}");
}

#[tokio::test]
async fn the_end_of_a_task_is_announced_on_the_standalone_stream() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let get = rig.client.send(Call::get().session(&session)).await;
    assert_eq!(get.status(), StatusCode::OK);
    let mut standalone = SseReader::new(get);
    let task = create(
        &rig,
        &session,
        40,
        "slow",
        json!({"steps":2,"interval_ms":30}),
    )
    .await;
    let announced = loop {
        let (_, message) = standalone.next_message().await.expect("a notification");
        if message["method"] == "notifications/tasks/status" {
            break message;
        }
    };
    assert_eq!(announced["params"]["taskId"], task, "{announced}");
    assert_eq!(announced["params"]["status"], "completed");
}

#[tokio::test]
async fn tasks_result_waiters_beyond_the_cap_are_told_to_come_back() {
    let rig = rig_with(DemoOptions::default(), |t| t.result_waiters = 1).await;
    let session = rig.client.initialize(V_LATEST).await;
    let task = create(
        &rig,
        &session,
        41,
        "slow",
        json!({"steps":100,"interval_ms":50}),
    )
    .await;
    let first = Call::post(&tasks_request(42, "tasks/result", &task)).session(&session);
    let mut waiting = SseReader::new(rig.client.send(first).await);
    let (status, refused) =
        exchange(&rig, &session, &tasks_request(43, "tasks/result", &task)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused:?}");
    assert_eq!(refused[0]["id"], 43);
    assert_eq!(error_code(&refused[0]), -32000);
    // The waiter keeps its place until its answer ends.
    let _ = answer(&rig, &session, &tasks_request(44, "tasks/cancel", &task)).await;
    while waiting.next_message().await.is_some() {}
    let fetched = answer(&rig, &session, &tasks_request(45, "tasks/result", &task)).await;
    assert_eq!(error_code(&fetched), -32603, "{fetched}");
}

#[tokio::test]
async fn tasks_methods_in_a_batch_are_refused() {
    let rig = rig().await;
    let session = rig.client.initialize(V_LATEST).await;
    let batch = json!([tasks_request(50, "tasks/get", "x")]);
    let res = rig.client.send(Call::post(&batch).session(&session)).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

/// The proxy as a real process, `kill -9`ed while a task runs: the task's
/// upstream request is resumed like any request of the session.
#[tokio::test]
async fn a_task_running_when_the_proxy_is_killed_completes_after_the_restart() {
    use common::process::Crashable;
    let toml = "[upstream.tasks]\nlegacy = true\npoll_interval_ms = 50\n";
    let mut rig = Crashable::with_upstream_toml(DemoOptions::default(), toml).await;
    let client = rig.client();
    let session = client.initialize(V_LATEST).await;
    let created = client
        .send(
            Call::post(&task_call(60, "slow", json!({"steps":12,"interval_ms":50})))
                .session(&session),
        )
        .await;
    let created = said(created).await.pop().expect("the task");
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Still running when the kill comes: the restart must resume it.
    let get = Call::post(&tasks_request(62, "tasks/get", &task)).session(&session);
    let before = said(client.send(get).await).await;
    assert_eq!(before[0]["result"]["status"], "working", "{before:?}");
    rig.kill9_and_restart().await;

    let client = rig.client();
    let fetch = Call::post(&tasks_request(61, "tasks/result", &task)).session(&session);
    let all = said(client.send(fetch).await).await;
    let last = all.last().expect("the answer");
    assert_eq!(last["id"], 61, "{all:?}");
    assert_eq!(
        last["result"]["content"][0]["text"],
        "slow done after 12 steps"
    );
    let progress = progress_values(&all);
    assert_eq!(
        progress,
        (1..=12).collect::<Vec<_>>(),
        "every step once, in order"
    );
}
