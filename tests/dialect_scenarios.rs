//! The dialects' wire behaviour, one behaviour per test, each run against the
//! demo server as an HTTP upstream and as a stdio child: resumable requests
//! (seed 002), streams (seed 003), and `Last-Event-ID`, alone, mixed on one
//! stream, and carried by the seeds' POST resumes.

mod common;

use common::dialects::*;
use common::*;
use serde_json::{json, Value};

fn is_response_to(m: &Value, id: u64) -> bool {
    m["id"] == json!(id) && (m.get("result").is_some() || m.get("error").is_some())
}

async fn policy_and_create_open_every_request_stream(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(both()).await;
    let got = whole_call(&front, &sid, 7, 2).await;
    let policy = &got[0].1;
    assert_eq!(method(policy), "notifications/requests/resumePolicy");
    assert_eq!(policy["params"]["requestId"], 7);
    assert!(policy["params"]["resumeToken"].is_string());
    assert_eq!(policy["params"]["minWait"], 1);
    assert_eq!(policy["params"]["maxWait"], 600);
    let create = &got[1].1;
    assert_eq!(method(create), "notifications/stream/create");
    assert!(create["params"]["stream"]["streamId"].is_string());
    assert_eq!(
        create["params"]["stream"]["resumeInterval"],
        json!({"min": 1, "max": 3600})
    );
    assert!(
        got[0].0.is_some() && got[1].0.is_some(),
        "dialect entries carry event ids"
    );
}

async fn stream_end_follows_the_response(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"streams": {}})).await;
    let got = whole_call(&front, &sid, 3, 2).await;
    let n = got.len();
    assert!(is_response_to(&got[n - 2].1, 3), "{:?}", got[n - 2]);
    let end = &got[n - 1].1;
    assert_eq!(method(end), "notifications/stream/end");
    assert_eq!(end["params"]["streamId"], stream_handle(&got));
    assert!(
        got[n - 1].0.is_none(),
        "the end notification is not a log entry"
    );
}

async fn get_status_reports_processing_then_completed(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"resumableRequests": {}})).await;
    let res = front
        .client
        .send(Call::post(&slow_call(4, 4, 200)).session(&sid))
        .await;
    let seen = read_then_cut(res, 1).await;
    let token = resume_token(&seen);
    let status = |rpc: u64| {
        request(
            json!(rpc),
            "requests/getStatus",
            json!({"requestId": 4, "resumeToken": token}),
        )
    };
    let live = ask(&front.client, &sid, &status(100)).await;
    assert_eq!(live["id"], 100);
    assert_eq!(live["result"]["requestId"], 4);
    assert_eq!(live["result"]["status"], "processing");
    assert_eq!(live["result"]["hasInputRequest"], false);
    let mut done = Value::Null;
    for rpc in 101..400 {
        done = ask(&front.client, &sid, &status(rpc)).await;
        if done["result"]["status"] != "processing" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(done["result"]["status"], "completed");
    assert_eq!(
        done["result"]["hasPendingMessage"], true,
        "nothing was acknowledged"
    );
}

async fn requests_resume_delivers_the_rest_then_the_original_response(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"resumableRequests": {}})).await;
    let res = front
        .client
        .send(Call::post(&slow_call(9, 6, 60)).session(&sid))
        .await;
    let before = read_then_cut(res, 3).await;
    let token = resume_token(&before);
    let after = read_to_end(resume_request(&front.client, &sid, 9, &token).await).await;
    let (_, last) = after.last().expect("something after the resume");
    assert!(
        is_response_to(last, 9),
        "ends with the original response: {last}"
    );
    assert!(last["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .contains("slow done"));
    let progress: Vec<&Value> = after
        .iter()
        .filter(|(_, m)| method(m) == "notifications/progress")
        .map(|(_, m)| &m["params"]["progress"])
        .collect();
    let distinct: std::collections::HashSet<String> =
        progress.iter().map(|p| p.to_string()).collect();
    assert_eq!(distinct.len(), progress.len(), "no progress repeated");
    assert!(
        progress.windows(2).all(|w| w[0].as_u64() < w[1].as_u64()),
        "progress in order: {progress:?}"
    );
}

async fn a_resume_that_ran_to_its_end_acknowledges_nothing_so_a_second_one_repeats_it_with_the_same_ids(
    kind: Kind,
) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"resumableRequests": {}})).await;
    let first = whole_call(&front, &sid, 5, 2).await;
    let token = resume_token(&first);
    let again = read_to_end(resume_request(&front.client, &sid, 5, &token).await).await;
    assert_eq!(again.len(), first.len(), "nothing acknowledged: everything");
    // Writing an answer to its end is no proof the client read it (the
    // connection may have been cut after the write): the next resume repeats
    // it, under the same event ids, so a client drops what it already has.
    let once_more = read_to_end(resume_request(&front.client, &sid, 5, &token).await).await;
    assert_eq!(once_more, again);
    assert!(is_response_to(&once_more.last().unwrap().1, 5));
    let status = ask(
        &front.client,
        &sid,
        &request(
            json!(50),
            "requests/getStatus",
            json!({"requestId": 5, "resumeToken": token}),
        ),
    )
    .await;
    assert_eq!(status["result"]["hasPendingMessage"], true);
}

async fn stream_resume_delivers_the_rest_the_end_and_an_empty_result(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"streams": {}})).await;
    let res = front
        .client
        .send(Call::post(&slow_call(2, 5, 60)).session(&sid))
        .await;
    let before = read_then_cut(res, 2).await;
    let handle = stream_handle(&before);
    let after = read_to_end(resume_stream(&front.client, &sid, 77, &handle).await).await;
    let n = after.len();
    assert!(n >= 3, "{after:?}");
    assert!(is_response_to(&after[n - 3].1, 2), "{:?}", after[n - 3]);
    assert_eq!(method(&after[n - 2].1), "notifications/stream/end");
    assert_eq!(after[n - 1].1, json!({"jsonrpc":"2.0","id":77,"result":{}}));
}

async fn stream_poll_says_live_then_completed(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"streams": {}})).await;
    let res = front
        .client
        .send(Call::post(&slow_call(2, 3, 200)).session(&sid))
        .await;
    let handle = stream_handle(&read_then_cut(res, 1).await);
    let poll = |id: u64| request(json!(id), "stream/poll", json!({"streamId": handle}));
    let live = ask(&front.client, &sid, &poll(10)).await;
    assert_eq!(live["result"]["streamId"], handle);
    assert_eq!(live["result"]["status"], "live");
    assert_eq!(live["result"]["hasError"], false);
    let mut done = Value::Null;
    for id in 11..400 {
        done = ask(&front.client, &sid, &poll(id)).await;
        if done["result"]["status"] == "completed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(done["result"]["status"], "completed");
    assert_eq!(done["result"]["pendingMessages"], true);
}

/// Each way back, one after the other on one stream: every entry reaches
/// each reader once, in order, and together they cover the stream.
async fn last_event_id_requests_resume_and_stream_resume_share_one_stream(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(both()).await;
    let res = front
        .client
        .send(Call::post(&slow_call(6, 9, 40)).session(&sid))
        .await;
    let first = read_then_cut(res, 3).await;
    let (token, handle) = (resume_token(&first), stream_handle(&first));
    // Last-Event-ID: exact, and acknowledges what it names.
    let last = first
        .last()
        .and_then(|(id, _)| id.clone())
        .expect("an event id");
    let res = front
        .client
        .send(Call::get().session(&sid).header("last-event-id", &last))
        .await;
    let second = read_then_cut(res, 2).await;
    // requests/resume: from the acknowledged cursor (the GET's id), so it
    // repeats the two the GET delivered — at-least-once, in order.
    let third = read_then_cut(resume_request(&front.client, &sid, 6, &token).await, 3).await;
    assert_eq!(
        third[..2],
        second[..],
        "resumed from the acknowledged cursor"
    );
    let fourth_last = third
        .last()
        .and_then(|(id, _)| id.clone())
        .expect("an event id");
    let res = front
        .client
        .send(
            Call::get()
                .session(&sid)
                .header("last-event-id", &fourth_last),
        )
        .await;
    drop(read_then_cut(res, 0).await);
    let rest = read_to_end(resume_stream(&front.client, &sid, 60, &handle).await).await;
    let first_id = first[0].0.clone().expect("an event id");
    let mut seen: Vec<(Option<String>, Value)> = first;
    seen.extend(third);
    seen.extend(rest.into_iter().filter(|(id, _)| id.is_some()));
    assert!(
        distinct_ids(&seen),
        "no entry twice in the joined, acknowledged view"
    );
    assert!(
        seen.iter().any(|(_, m)| is_response_to(m, 6)),
        "the response arrived"
    );
    let whole = read_to_end(
        front
            .client
            .send(Call::get().session(&sid).header("last-event-id", &first_id))
            .await,
    )
    .await;
    let logged = whole.iter().filter(|(id, _)| id.is_some()).count();
    assert_eq!(
        logged + 1,
        seen.len(),
        "together the readers covered the stream"
    );
}

async fn get_status_and_poll_during_a_live_read_do_not_interrupt_it(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(both()).await;
    let res = front
        .client
        .send(Call::post(&slow_call(8, 4, 80)).session(&sid))
        .await;
    let mut reader = SseReader::new(res);
    let (_, policy) = reader.next_message().await.unwrap();
    let (_, create) = reader.next_message().await.unwrap();
    let token = policy["params"]["resumeToken"].as_str().unwrap().to_owned();
    let handle = create["params"]["stream"]["streamId"]
        .as_str()
        .unwrap()
        .to_owned();
    ask(
        &front.client,
        &sid,
        &request(
            json!(90),
            "requests/getStatus",
            json!({"requestId": 8, "resumeToken": token}),
        ),
    )
    .await;
    ask(
        &front.client,
        &sid,
        &request(json!(91), "stream/poll", json!({"streamId": handle})),
    )
    .await;
    ask(
        &front.client,
        &sid,
        &request(json!(92), "stream/poll/all", json!({})),
    )
    .await;
    let mut rest = Vec::new();
    while let Some((_, m)) = reader.next_message().await {
        rest.push(m);
    }
    assert!(
        rest.iter().any(|m| is_response_to(m, 8)),
        "the live read ran to the response: {rest:?}"
    );
    assert_eq!(method(rest.last().unwrap()), "notifications/stream/end");
}

async fn a_client_that_declared_nothing_sees_no_dialect_entries(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, result) = front.session(json!({})).await;
    assert!(
        result["result"]["capabilities"]["experimental"].is_null(),
        "{result}"
    );
    let got = whole_call(&front, &sid, 1, 2).await;
    assert!(got
        .iter()
        .all(|(_, m)| !method(m).starts_with("notifications/requests/")
            && !method(m).starts_with("notifications/stream/")));
    assert!(is_response_to(&got.last().unwrap().1, 1));
    // The dialect methods are not the proxy's to answer for this session.
    let res = front
        .client
        .send(Call::post(&request(json!(2), "stream/poll/all", json!({}))).session(&sid))
        .await;
    let answer = messages(res).await;
    assert_eq!(
        answer[0]["error"]["code"], -32601,
        "the upstream's own answer: {answer:?}"
    );
}

async fn abandonment_cancels_the_upstream_request_and_forgets_the_token(kind: Kind) {
    let front = Front::with(kind, |c| {
        c.dialects.resumable_requests.max_wait_ms = 1_000;
        c.store.sweep_secs = 1;
    })
    .await;
    let (sid, _) = front.session(json!({"resumableRequests": {}})).await;
    let res = front
        .client
        .send(Call::post(&slow_call(3, 200, 100)).session(&sid))
        .await;
    let token = resume_token(&read_then_cut(res, 1).await);
    let status = request(
        json!(30),
        "requests/getStatus",
        json!({"requestId": 3, "resumeToken": token}),
    );
    let deadline = tokio::time::Instant::now() + LIMIT;
    let answer = loop {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let res = front.client.send(Call::post(&status).session(&sid)).await;
        let answer = body_json(res).await;
        if answer.get("error").is_some() || tokio::time::Instant::now() > deadline {
            break answer;
        }
        // Asking re-arms the timer: stop asking and let it run out.
        tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    };
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert_eq!(
        answer["error"]["message"],
        "Invalid params: unknown or expired resumeToken"
    );
    if let Some(demo) = &front.upstream {
        eventually("the upstream call was cancelled", || {
            demo.stats
                .calls_cancelled
                .load(std::sync::atomic::Ordering::Relaxed)
                == 1
        })
        .await;
    }
}

/// What a message is, whatever request id it answers: its method and
/// progress value, or "response".
fn shape(m: &Value) -> String {
    match m.get("method") {
        Some(method) => format!("{method} {}", m["params"]["progress"]),
        None => "response".into(),
    }
}

/// Messages by event id, first delivery only.
fn deduplicated(messages: Vec<(Option<String>, Value)>) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    messages
        .into_iter()
        .filter(|(id, _)| id.as_ref().is_none_or(|id| seen.insert(id.clone())))
        .map(|(_, m)| m)
        .collect()
}

fn distinct_ids(messages: &[(Option<String>, Value)]) -> bool {
    let ids: Vec<_> = messages.iter().filter_map(|(id, _)| id.clone()).collect();
    ids.len() == ids.iter().collect::<std::collections::HashSet<_>>().len()
}

/// A call cut after `cut` messages (0: only the priming event seen).
async fn cut_call(
    front: &Front,
    sid: &str,
    id: u64,
    cut: usize,
) -> (Option<String>, Vec<(Option<String>, Value)>) {
    let res = front
        .client
        .send(Call::post(&slow_call(id, 4, 5)).session(sid))
        .await;
    let mut reader = SseReader::new(res);
    let priming = reader.next().await.expect("a priming event");
    assert!(priming.data.is_empty(), "priming first");
    let mut before = Vec::new();
    while before.len() < cut {
        before.push(reader.next_message().await.expect("a message"));
    }
    (priming.id, before)
}

async fn disconnecting_at_any_point_loses_and_repeats_nothing(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"resumableRequests": {}})).await;
    let whole: Vec<String> = whole_call(&front, &sid, 100, 4)
        .await
        .iter()
        .map(|(_, m)| shape(m))
        .collect();
    for cut in 0..whole.len() {
        // Last-Event-ID: exactly once.
        let id = 200 + cut as u64;
        let (priming, before) = cut_call(&front, &sid, id, cut).await;
        let last = before.last().map(|(e, _)| e.clone()).unwrap_or(priming);
        let res = front
            .client
            .send(
                Call::get()
                    .session(&sid)
                    .header("last-event-id", last.as_deref().unwrap()),
            )
            .await;
        let mut joined = before;
        joined.extend(read_to_end(res).await);
        assert!(
            distinct_ids(&joined),
            "Last-Event-ID, cut after {cut}: {joined:?}"
        );
        let shapes: Vec<String> = joined.iter().map(|(_, m)| shape(m)).collect();
        assert_eq!(shapes, whole, "Last-Event-ID, cut after {cut}");

        // requests/resume: from the acknowledged cursor — at-least-once, each
        // reader in order without repeats.
        if cut == 0 {
            continue; // no token yet: only Last-Event-ID can come back
        }
        let id = 300 + cut as u64;
        let (_, before) = cut_call(&front, &sid, id, cut).await;
        let after =
            read_to_end(resume_request(&front.client, &sid, id, &resume_token(&before)).await)
                .await;
        assert!(
            distinct_ids(&after),
            "requests/resume, cut after {cut}: {after:?}"
        );
        let mut joined = before;
        joined.extend(after);
        let shapes: Vec<String> = deduplicated(joined).iter().map(shape).collect();
        assert_eq!(shapes, whole, "requests/resume, cut after {cut}");
    }
}

fn shapes(messages: &[(Option<String>, Value)]) -> Vec<String> {
    messages.iter().map(|(_, m)| shape(m)).collect()
}

/// The messages of an answer that are log entries (they carry event ids).
fn logged(messages: &[(Option<String>, Value)]) -> Vec<(Option<String>, Value)> {
    messages
        .iter()
        .filter(|(id, _)| id.is_some())
        .cloned()
        .collect()
}

/// The event id of the last message a client holds.
fn last_id(messages: &[(Option<String>, Value)]) -> String {
    messages
        .iter()
        .rev()
        .find_map(|(id, _)| id.clone())
        .expect("an event id")
}

async fn requests_resume_with_last_event_id_is_exactly_once_wherever_the_call_was_cut(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"resumableRequests": {}})).await;
    let whole = shapes(&whole_call(&front, &sid, 100, 4).await);
    // From the policy alone to everything but the response.
    for cut in 1..whole.len() {
        let id = 200 + cut as u64;
        let (_, before) = cut_call(&front, &sid, id, cut).await;
        let (token, last) = (resume_token(&before), last_id(&before));
        let res = resume_request_after(&front.client, &sid, id, &token, &last).await;
        let mut joined = before;
        joined.extend(read_to_end(res).await);
        assert!(distinct_ids(&joined), "cut after {cut}: {joined:?}");
        assert_eq!(shapes(&joined), whole, "cut after {cut}");
    }
}

async fn stream_resume_with_last_event_id_is_exactly_once_wherever_the_call_was_cut(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"streams": {}})).await;
    let whole = shapes(&whole_call(&front, &sid, 100, 4).await);
    // The resume's own empty result follows the stream's end.
    let resumed: Vec<String> = whole.iter().cloned().chain(["response".into()]).collect();
    // From `stream/create` alone to everything but the end.
    for cut in 1..whole.len() {
        let id = 200 + cut as u64;
        let (_, before) = cut_call(&front, &sid, id, cut).await;
        let (handle, last) = (stream_handle(&before), last_id(&before));
        let rpc = 1000 + id;
        let res = resume_stream_after(&front.client, &sid, rpc, &handle, &last).await;
        let after = read_to_end(res).await;
        assert_eq!(
            after.last().map(|(_, m)| m),
            Some(&json!({"jsonrpc":"2.0","id":rpc,"result":{}})),
            "cut after {cut}"
        );
        let mut joined = before;
        joined.extend(after);
        assert!(distinct_ids(&joined), "cut after {cut}: {joined:?}");
        assert_eq!(shapes(&joined), resumed, "cut after {cut}");
    }
}

/// Without a position, `requests/resume` of a finished request always ends
/// with the response; a client that names the response's own event id says
/// it holds it, and gets nothing twice.
async fn requests_resume_naming_the_responses_event_id_delivers_nothing_again(kind: Kind) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"resumableRequests": {}})).await;
    let got = whole_call(&front, &sid, 5, 2).await;
    assert!(is_response_to(&got.last().unwrap().1, 5));
    let (token, last) = (resume_token(&got), last_id(&got));
    let res = resume_request_after(&front.client, &sid, 5, &token, &last).await;
    let after = read_to_end(res).await;
    assert!(after.is_empty(), "{after:?}");
}

async fn a_post_resume_with_last_event_id_acknowledges_it_so_a_later_one_without_starts_there(
    kind: Kind,
) {
    let front = Front::start(kind).await;
    let (sid, _) = front.session(json!({"streams": {}})).await;
    let got = whole_call(&front, &sid, 5, 3).await;
    let handle = stream_handle(&got);
    // `stream/create`, progress 1 | progress 2, progress 3, the response, the end.
    let (held, rest) = got.split_at(2);
    let named = last_id(held);
    let exact =
        read_to_end(resume_stream_after(&front.client, &sid, 50, &handle, &named).await).await;
    assert_eq!(logged(&exact), logged(rest), "exactly what follows it");
    let plain = read_to_end(resume_stream(&front.client, &sid, 51, &handle).await).await;
    assert_eq!(
        logged(&plain),
        logged(rest),
        "from the acknowledged cursor, which the named entry moved"
    );
}

both_upstreams!(
    policy_and_create_open_every_request_stream,
    stream_end_follows_the_response,
    get_status_reports_processing_then_completed,
    requests_resume_delivers_the_rest_then_the_original_response,
    a_resume_that_ran_to_its_end_acknowledges_nothing_so_a_second_one_repeats_it_with_the_same_ids,
    stream_resume_delivers_the_rest_the_end_and_an_empty_result,
    stream_poll_says_live_then_completed,
    last_event_id_requests_resume_and_stream_resume_share_one_stream,
    get_status_and_poll_during_a_live_read_do_not_interrupt_it,
    a_client_that_declared_nothing_sees_no_dialect_entries,
    abandonment_cancels_the_upstream_request_and_forgets_the_token,
    disconnecting_at_any_point_loses_and_repeats_nothing,
    requests_resume_with_last_event_id_is_exactly_once_wherever_the_call_was_cut,
    stream_resume_with_last_event_id_is_exactly_once_wherever_the_call_was_cut,
    requests_resume_naming_the_responses_event_id_delivers_nothing_again,
    a_post_resume_with_last_event_id_acknowledges_it_so_a_later_one_without_starts_there,
);
