//! `tasks/get`, `tasks/cancel` and `tasks/update`, answered from the log for
//! the principal the task belongs to. The checks run in the order native
//! servers run them: a method the extension does not have (-32601), no
//! declaration (-32021), a routing header that disagrees (-32020), then the
//! task itself (-32602 for unknown, expired and another principal's alike).

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;

use super::call::{leg_meta, Call};
use super::{check_header, Modern};
use crate::id::TaskId;
use crate::jsonrpc::RequestId;
use crate::proxy::{Rejection, Route};
use crate::reply::{self, Body};
use crate::store::now_ms;
use crate::task::modern as wire;
use crate::task::{self, Answer, Seen, TaskRecord, TaskStatus};
use crate::upstream::Upstream;

/// The params of a `tasks/*` request.
#[derive(serde::Deserialize)]
struct Params {
    #[serde(rename = "taskId")]
    task_id: String,
    #[serde(rename = "inputResponses", default)]
    input_responses: Option<BTreeMap<String, Box<RawValue>>>,
}

#[derive(serde::Deserialize)]
struct Request {
    params: Params,
}

pub(super) async fn answer(
    route: &Route,
    request: &Modern<'_>,
) -> Result<Response<Body>, Rejection> {
    let id = request.id.clone();
    let method = request.method.as_str();
    if !matches!(method, "tasks/get" | "tasks/cancel" | "tasks/update") {
        return Err(Rejection::method_not_found(id, method));
    }
    if !wire::declared(&request.body) {
        return Err(Rejection::tasks_not_declared(Some(id)));
    }
    let Ok(Request { params }) = serde_json::from_slice::<Request>(&request.body) else {
        return Err(Rejection::invalid_params(
            id,
            "params.taskId must be a string",
        ));
    };
    check_header(
        request,
        &crate::upstream::headers::MCP_NAME,
        &params.task_id,
    )?;
    let principal = route.shared.caller(request.parts).await?;
    let keyring = &route.shared.keyring;
    let not_found = || Rejection::task_not_found(id.clone());
    let task = keyring
        .open_task_handle(&route.path, &principal, &params.task_id)
        .ok_or_else(not_found)?;
    let log = &route.shared.log;
    let seen = task::read(log, task)
        .await?
        .filter(|seen| task::belongs(&seen.record, &route.path, &principal))
        .ok_or_else(not_found)?;
    match method {
        "tasks/get" => Ok(reply::json(StatusCode::OK, seen.get_result(keyring, &id))),
        "tasks/cancel" => {
            // Cancelling an ended task changes nothing, and says so the
            // same way.
            if !seen.status.is_terminal() {
                task::cancel(log, task).await?;
            }
            Ok(ack(&id))
        }
        _ => {
            let answers = params.input_responses.unwrap_or_default();
            update(route, request, task, &seen, answers).await?;
            Ok(ack(&id))
        }
    }
}

fn ack(id: &RequestId) -> Response<Body> {
    reply::json(StatusCode::OK, wire::ack(id))
}

/// Takes the client's answers to the current round's input requests; once
/// every request of the round is answered, re-issues the call upstream with
/// them as the task's next leg. Answers to keys of other rounds, unknown
/// keys and keys already answered are ignored.
async fn update(
    route: &Route,
    request: &Modern<'_>,
    task: TaskId,
    seen: &Seen,
    answers: BTreeMap<String, Box<RawValue>>,
) -> Result<(), Rejection> {
    let (
        TaskStatus::InputRequired,
        Some(Answer::InputRequired {
            keys,
            request_state,
            ..
        }),
    ) = (seen.status, &seen.answer)
    else {
        return Ok(());
    };
    let round = seen.round();
    let fresh: Vec<(String, String)> = answers
        .iter()
        .filter_map(|(surfaced, answer)| {
            let key = wire::upstream_key(round, surfaced)?;
            keys.iter()
                .any(|k| k == key)
                .then(|| (key.to_owned(), answer.get().to_owned()))
        })
        .collect();
    if fresh.is_empty() {
        return Ok(());
    }
    let log = &route.shared.log;
    let Some(record) = task::change(log, task, |r| {
        if r.legs.len() != round || r.cancelled_ms.is_some() {
            return false; // moved on by another update, or cancelled
        }
        let input = r.input.get_or_insert_with(Default::default);
        let before = input.answered.len();
        for (key, answer) in &fresh {
            input
                .answered
                .entry(key.clone())
                .or_insert_with(|| answer.clone());
        }
        input.answered.len() != before
    })
    .await?
    else {
        return Ok(());
    };
    let answered = record.input.as_ref().map(|i| &i.answered);
    let complete = record.legs.len() == round
        && keys
            .iter()
            .all(|k| answered.is_some_and(|a| a.contains_key(k)));
    if complete {
        let state = request_state.as_ref().map(|s| s.get());
        reissue(route, request, &record, state).await?;
    }
    Ok(())
}

/// The task's next leg: the original call again, under a new id, with the
/// client's answers and the upstream's request state.
async fn reissue(
    route: &Route,
    request: &Modern<'_>,
    record: &TaskRecord,
    request_state: Option<&str>,
) -> Result<(), Rejection> {
    let Upstream::Http(upstream) = &route.upstream else {
        return Ok(());
    };
    let log = &route.shared.log;
    let round = record.legs.len();
    let answers = record
        .input
        .as_ref()
        .map(|i| i.answered.clone())
        .unwrap_or_default();
    let Some(params) = wire::reissue_params(&record.request, &answers, request_state) else {
        tracing::error!(task = %record.id, "cannot build a task's next request");
        return Ok(());
    };
    let id = RequestId(format!("\"mcp-resume-proxy-{}-{}\"", record.id, round + 1).into());
    let leg = leg_meta(record.id, id.clone(), now_ms());
    // The record names the leg first (a leg never exists without its task,
    // see `call::create`); only the update whose change lands re-issues.
    let moved_on = task::change(log, record.id, |r| {
        if r.legs.len() != round || r.cancelled_ms.is_some() {
            return false; // another update re-issued first, or cancelled
        }
        r.legs.push(leg.id);
        r.input = None;
        true
    })
    .await?;
    if moved_on.is_none_or(|r| r.current_leg() != Some(leg.id)) {
        return Ok(());
    }
    let leg = log.open(leg).await?;
    // A cancellation between naming the leg and opening it found no leg
    // to end: end it here rather than run the call.
    let cancelled = log.store().get_task(record.id).await?;
    if cancelled.is_none_or(|r| r.cancelled_ms.is_some()) {
        log.finish(leg.id, crate::store::StreamStatus::Cancelled)
            .await?;
        return Ok(());
    }
    let mut headers = reissue_headers(&request.parts.headers, record);
    let trace = crate::access::exchange(&mut headers, "POST");
    let call = Call {
        log: log.clone(),
        keyring: route.shared.keyring.clone(),
        upstream: upstream.clone(),
        tasks: route.tasks.clone(),
        route: route.path.clone(),
        principal: record.principal.clone(),
        headers,
        trace,
        id: id.clone(),
        params: record.request.clone(),
    };
    tokio::spawn(call.run_leg(leg, crate::task::wire::tools_call(&id, &params)));
    Ok(())
}

/// The headers of a re-issue: the update's own (its credentials), routed
/// as the original call was.
fn reissue_headers(update: &HeaderMap, record: &TaskRecord) -> HeaderMap {
    let mut headers = update.clone();
    crate::upstream::headers::drop_routing(&mut headers);
    headers.insert(
        crate::upstream::headers::MCP_METHOD,
        HeaderValue::from_static("tools/call"),
    );
    for (name, value) in &record.headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(name, value);
        }
    }
    headers
}
