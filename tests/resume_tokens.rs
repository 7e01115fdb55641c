//! Resume tokens (seeds 000/001): a long `tools/call` of a client that opted
//! in answers early with an interim result and `nextResumeToken`; the call
//! re-sent with `resumeToken`, under any id, continues it until the final
//! result — the upstream's bytes but for the id. The upstream runs it once.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::dialects::*;
use common::*;
use mcp_resume_proxy::config::{Config, Placement, ResumeTokensMode};
use serde_json::{json, Value};

/// Interims after 300 ms: a 1.2 s call sees a few.
fn quick(c: &mut Config) {
    c.upstream[0].resume_tokens.interim_after_ms = 300;
}

fn opted_in() -> Value {
    json!({"resumeTokens": {}})
}

fn slow(id: u64, token: Option<&str>) -> Value {
    let mut call = slow_call(id, 12, 100);
    if let Some(token) = token {
        call["params"]["_meta"]["resumeToken"] = json!(token);
    }
    call
}

/// The one answer to a call: the last message of its SSE (or JSON) body,
/// with the raw bytes it came as.
async fn answer(front: &Front, sid: &str, call: &Value) -> (Value, String) {
    let res = front.client.send(Call::post(call).session(sid)).await;
    let mut reader = SseReader::new(res);
    let mut last = None;
    while let Some(event) = reader.next().await {
        if !event.data.is_empty() {
            last = Some(event);
        }
    }
    let event = last.expect("an answer");
    let raw = String::from_utf8(event.data.to_vec()).unwrap();
    (serde_json::from_str(&raw).unwrap(), raw)
}

fn next_token(answer: &Value) -> Option<String> {
    answer["result"]["_meta"]["nextResumeToken"]
        .as_str()
        .or(answer["result"]["nextResumeToken"].as_str())
        .map(str::to_owned)
}

/// Continues a call until an answer comes without a token; returns every
/// answer.
async fn run_to_the_end(front: &Front, sid: &str, first: Value) -> Run {
    let mut run = Run {
        answers: vec![first],
        last_raw: String::new(),
        last_token: None,
    };
    let mut id = 100;
    while let Some(token) = next_token(run.answers.last().unwrap()) {
        id += 1;
        assert!(id < 200, "never finished: {:?}", run.answers);
        let (got, raw) = answer(front, sid, &slow(id, Some(&token))).await;
        run.answers.push(got);
        run.last_raw = raw;
        run.last_token = Some(token);
    }
    run
}

/// A call continued to its end: every answer (the first under id 2, then
/// ids 101, 102, …), the last one's raw bytes, and the token that fetched it.
struct Run {
    answers: Vec<Value>,
    last_raw: String,
    last_token: Option<String>,
}

async fn a_long_call_answers_with_interims_then_the_final_result(kind: Kind) {
    let front = Front::with(kind, quick).await;
    let (sid, init) = front.session(opted_in()).await;
    assert_eq!(
        init["result"]["capabilities"]["experimental"]["resumeTokens"]["interimAfterMs"],
        300
    );
    let (first, _) = answer(&front, &sid, &slow(2, None)).await;
    assert_eq!(first["id"], 2);
    assert_eq!(first["result"]["isError"], false);
    assert!(first["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("still running"));
    let answers = run_to_the_end(&front, &sid, first).await.answers;
    assert!(answers.len() >= 3, "several interims: {answers:?}");
    let last = answers.last().unwrap();
    assert!(last["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("slow done"));
    assert_eq!(
        last["id"],
        100 + answers.len() as u64 - 1,
        "the final answer carries the new id"
    );
    if let Some(demo) = &front.upstream {
        assert_eq!(
            demo.stats.calls_started.load(Ordering::Relaxed),
            1,
            "called once"
        );
    }
}

async fn a_client_that_did_not_opt_in_gets_the_plain_blocking_answer(kind: Kind) {
    let front = Front::with(kind, quick).await;
    let (sid, init) = front.session(json!({})).await;
    assert!(init["result"]["capabilities"]["experimental"].is_null());
    let (only, _) = answer(&front, &sid, &slow(2, None)).await;
    assert!(next_token(&only).is_none());
    assert!(only["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("slow done"));
}

async fn progress_since_the_last_answer_comes_on_the_new_progress_token(kind: Kind) {
    let front = Front::with(kind, quick).await;
    let (sid, _) = front.session(opted_in()).await;
    let (first, _) = answer(&front, &sid, &slow(2, None)).await;
    let token = next_token(&first).expect("an interim");
    let mut again = slow(3, Some(&token));
    again["params"]["_meta"]["progressToken"] = json!("fresh");
    let res = front.client.send(Call::post(&again).session(&sid)).await;
    let got = messages(res).await;
    let progress: Vec<&Value> = got
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(!progress.is_empty(), "{got:?}");
    assert!(
        progress
            .iter()
            .all(|p| p["params"]["progressToken"] == "fresh"),
        "{progress:?}"
    );
}

both_upstreams!(
    a_long_call_answers_with_interims_then_the_final_result,
    a_client_that_did_not_opt_in_gets_the_plain_blocking_answer,
    progress_since_the_last_answer_comes_on_the_new_progress_token,
);

#[tokio::test]
async fn the_final_result_is_the_upstreams_bytes_but_for_the_id() {
    let front = Front::with(Kind::Http, quick).await;
    let (sid, _) = front.session(opted_in()).await;
    let res = front
        .client
        .send(Call::post(&slow(2, None)).session(&sid))
        .await;
    let events = read_all(res).await;
    let first_id = events
        .iter()
        .find_map(|e| e.id.clone())
        .expect("an event id");
    let interim: Value = serde_json::from_slice(&events.last().unwrap().data).unwrap();
    let run = run_to_the_end(&front, &sid, interim).await;
    let final_id = run.answers.last().unwrap()["id"].clone();
    let raw_final = run.last_raw;
    // The upstream's own bytes, as the log holds them.
    let logged = read_all(
        front
            .client
            .send(Call::get().session(&sid).header("last-event-id", &first_id))
            .await,
    )
    .await;
    let upstream = logged
        .iter()
        .map(|e| String::from_utf8(e.data.to_vec()).unwrap())
        .find(|d| d.contains("slow done"))
        .unwrap();
    assert_eq!(
        raw_final.replacen(&format!("\"id\":{final_id}"), "\"id\":2", 1),
        upstream
    );
    assert_ne!(raw_final, upstream);
}

#[tokio::test]
async fn reordered_params_continue_the_call_and_changed_values_do_not() {
    let front = Front::with(Kind::Http, quick).await;
    let (sid, _) = front.session(opted_in()).await;
    let (first, _) = answer(&front, &sid, &slow(2, None)).await;
    let token = next_token(&first).unwrap();
    let reordered = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{
        "_meta":{"resumeToken": token},
        "arguments":{"interval_ms":100,"steps":12},"name":"slow"}});
    let (ok, _) = answer(&front, &sid, &reordered).await;
    assert!(ok.get("result").is_some(), "{ok}");
    let changed = json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{
        "_meta":{"resumeToken": token},
        "arguments":{"interval_ms":100,"steps":13},"name":"slow"}});
    let refused = ask(&front.client, &sid, &changed).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
}

#[tokio::test]
async fn every_bad_token_gets_the_same_invalid_params_answer() {
    let front = Front::with(Kind::Http, |c| {
        quick(c);
        c.upstream[0].resume_tokens.idle_expiry_ms = 1_000;
        c.store.sweep_secs = 600; // expiry by the token's own clock, not the sweeper
    })
    .await;
    let (sid, _) = front
        .session(json!({"resumeTokens": {}, "resumableRequests": {}}))
        .await;
    let (other, _) = front.session(opted_in()).await;
    let (first, _) = answer(&front, &sid, &slow(2, None)).await;
    let token = next_token(&first).unwrap();
    let (theirs, _) = answer(&front, &other, &slow(2, None)).await;
    let mut tampered = token.clone().into_bytes();
    tampered[12] = if tampered[12] == b'A' { b'B' } else { b'A' };
    let policy_token = {
        let res = front
            .client
            .send(Call::post(&slow(9, None)).session(&sid))
            .await;
        let seen = read_then_cut(res, 1).await;
        resume_token(&seen)
    };
    let mut cases = vec![
        ("garbage", "nope".to_owned()),
        ("tampered", String::from_utf8(tampered).unwrap()),
        ("another session's", next_token(&theirs).unwrap()),
        ("a resumable-request token", policy_token),
    ];
    let mut answers = Vec::new();
    for (what, bad) in cases.drain(..) {
        answers.push((what, ask(&front.client, &sid, &slow(50, Some(&bad))).await));
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    answers.push((
        "expired",
        ask(&front.client, &sid, &slow(51, Some(&token))).await,
    ));
    for (what, answer) in &answers {
        assert_eq!(answer["error"]["code"], -32602, "{what}: {answer}");
        assert_eq!(
            answer["error"]["message"], "Invalid params: unknown or expired resumeToken",
            "{what}"
        );
    }
}

#[tokio::test]
async fn a_token_fetches_the_final_answer_again_within_the_grace_and_not_after() {
    let front = Front::with(Kind::Http, |c| {
        quick(c);
        c.upstream[0].resume_tokens.final_grace_ms = 2_000;
    })
    .await;
    let (sid, _) = front.session(opted_in()).await;
    let (first, _) = answer(&front, &sid, &slow(2, None)).await;
    let last_token = run_to_the_end(&front, &sid, first)
        .await
        .last_token
        .expect("at least one continuation");
    let (again, _) = answer(&front, &sid, &slow(4, Some(&last_token))).await;
    assert!(again["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("slow done"));
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let late = ask(&front.client, &sid, &slow(5, Some(&last_token))).await;
    assert_eq!(late["error"]["code"], -32602, "{late}");
}

#[tokio::test]
async fn two_concurrent_continuations_with_one_token_are_both_answered() {
    let front = Front::with(Kind::Http, quick).await;
    let (sid, _) = front.session(opted_in()).await;
    let (first, _) = answer(&front, &sid, &slow(2, None)).await;
    let token = next_token(&first).unwrap();
    let (three, four) = (slow(3, Some(&token)), slow(4, Some(&token)));
    let (a, b) = tokio::join!(answer(&front, &sid, &three), answer(&front, &sid, &four));
    assert_eq!(a.0["id"], 3);
    assert_eq!(b.0["id"], 4);
    assert!(a.0.get("result").is_some() && b.0.get("result").is_some());
    let demo = front.upstream.as_ref().unwrap();
    assert_eq!(demo.stats.calls_started.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_token_not_presented_in_time_cancels_the_call_upstream() {
    let front = Front::with(Kind::Http, |c| {
        quick(c);
        c.upstream[0].resume_tokens.idle_expiry_ms = 1_000;
        c.store.sweep_secs = 1;
    })
    .await;
    let (sid, _) = front.session(opted_in()).await;
    let (first, _) = answer(&front, &sid, &slow_call(2, 100, 100)).await;
    assert!(next_token(&first).is_some());
    let demo = front.upstream.as_ref().unwrap();
    eventually("the abandoned call was cancelled upstream", || {
        demo.stats.calls_cancelled.load(Ordering::Relaxed) == 1
    })
    .await;
}

#[tokio::test]
async fn the_token_can_be_placed_at_the_root_or_in_both_places() {
    for (placement, meta, root) in [
        (Placement::Root, false, true),
        (Placement::Both, true, true),
    ] {
        let front = Front::with(Kind::Http, |c| {
            quick(c);
            c.upstream[0].resume_tokens.placement = placement;
        })
        .await;
        let (sid, _) = front.session(opted_in()).await;
        let (first, _) = answer(&front, &sid, &slow(2, None)).await;
        assert_eq!(
            first["result"]["_meta"]["nextResumeToken"].is_string(),
            meta,
            "{first}"
        );
        assert_eq!(
            first["result"]["nextResumeToken"].is_string(),
            root,
            "{first}"
        );
        // Seed 001 puts the token at the params root on the way back.
        let token = next_token(&first).unwrap();
        let mut again = slow_call(3, 12, 100);
        again["params"]["resumeToken"] = json!(token);
        let (next, _) = answer(&front, &sid, &again).await;
        assert!(next.get("result").is_some(), "{next}");
    }
}

#[tokio::test]
async fn listed_tools_get_tokens_for_every_client_and_others_do_not() {
    let front = Front::with(Kind::Http, |c| {
        quick(c);
        c.upstream[0].resume_tokens.tools = vec!["slow".into()];
    })
    .await;
    let (sid, _) = front.session(json!({})).await;
    let (slow_answer, _) = answer(&front, &sid, &slow(2, None)).await;
    assert!(next_token(&slow_answer).is_some());
    let (echo, _) = answer(&front, &sid, &tool_call(3, "echo", json!({"text": "x"}))).await;
    assert_eq!(echo["result"]["content"][0]["text"], "x");
}

#[tokio::test]
async fn in_passthrough_the_upstreams_own_tokens_reach_the_client_untouched() {
    let front = Front::with(Kind::Http, |c| {
        quick(c);
        c.upstream[0].resume_tokens.mode = ResumeTokensMode::Passthrough;
    })
    .await;
    let (sid, init) = front.session(opted_in()).await;
    assert!(init["result"]["instructions"]
        .as_str()
        .unwrap()
        .contains("resumeTokens"));
    let (first, _) = answer(&front, &sid, &tool_call(2, "paged", json!({}))).await;
    assert_eq!(next_token(&first).as_deref(), Some("demo-page-2"));
    // Re-sent under the same id, with the upstream's token: not a duplicate.
    let again = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"paged","arguments":{},"_meta":{"resumeToken":"demo-page-2"}}});
    let (second, _) = answer(&front, &sid, &again).await;
    assert_eq!(second["result"]["content"][0]["text"], "part 2, the end");
}

#[tokio::test]
async fn after_an_interim_and_a_kill9_the_token_brings_the_restart_error() {
    use common::process::{free_addr, ProxyProcess};
    use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
    // An upstream without event ids cannot be resumed by a restarted proxy.
    let opts = DemoOptions {
        no_event_ids: true,
        ..DemoOptions::default()
    };
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), opts)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("proxy.toml"),
        format!(
            "[[upstream]]\nurl = \"{}\"\n[upstream.resume_tokens]\ninterim_after_ms = 300\n",
            upstream.url()
        ),
    )
    .unwrap();
    let config = dir.path().join("proxy.toml");
    let args = ["--config", config.to_str().unwrap()];
    let addr = free_addr();
    let data = dir.path().join("data");
    let mut proxy = ProxyProcess::start(&args, &data, addr, &[]).await;
    let (sid, _) = initialize_declaring(&proxy.client(), opted_in()).await;
    let res = proxy
        .client()
        .send(Call::post(&slow_call(2, 100, 100)).session(&sid))
        .await;
    let interim = messages(res).await.pop().unwrap();
    let token = next_token(&interim).expect("an interim");
    proxy.kill9();
    let proxy = ProxyProcess::start(&args, &data, addr, &[]).await;
    let mut again = slow_call(3, 100, 100);
    again["params"]["_meta"]["resumeToken"] = json!(token);
    let got = messages(proxy.client().send(Call::post(&again).session(&sid)).await).await;
    let last = got.last().unwrap();
    assert_eq!(last["id"], 3);
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("restarted"),
        "{last}"
    );
}

#[tokio::test]
async fn a_token_of_a_deleted_session_opens_nowhere() {
    let front = Front::with(Kind::Http, quick).await;
    let (sid, _) = front.session(opted_in()).await;
    let (first, _) = answer(&front, &sid, &slow(2, None)).await;
    let token = next_token(&first).unwrap();
    let res = front.client.send(Call::delete().session(&sid)).await;
    assert!(res.status().is_success());
    let gone = front
        .client
        .send(Call::post(&slow(3, Some(&token))).session(&sid))
        .await;
    assert_eq!(
        gone.status(),
        http::StatusCode::NOT_FOUND,
        "the session is gone"
    );
    let (fresh, _) = front.session(opted_in()).await;
    let foreign = ask(&front.client, &fresh, &slow(3, Some(&token))).await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");
    assert_eq!(
        foreign["error"]["message"],
        "Invalid params: unknown or expired resumeToken"
    );
}
