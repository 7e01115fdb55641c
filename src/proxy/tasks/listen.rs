//! `subscriptions/listen` for tasks: a modern client that names `taskIds`
//! in its listen request's `notifications` gets `notifications/tasks` — the
//! whole task, as `tasks/get` shows it — each time one of its tasks changes,
//! on a stream the proxy serves itself. Ids that are not the caller's tasks
//! are left out of the acknowledgement, as servers leave out what they do
//! not offer. A listen that asks for other notifications as well goes to
//! the upstream as it came (the upstream leaves `taskIds` out of its
//! acknowledgement); one that names no tasks is none of this module's.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::Response;
use serde_json::Value;

use super::Modern;
use crate::id::TaskId;
use crate::proxy::{Rejection, Route};
use crate::reply::{self, Body};
use crate::task::modern as wire;

/// The most tasks one listen watches.
const MAX_WATCHED: usize = 64;
use crate::task::{self, Seen};

/// Longest pause between two looks at the watched tasks.
const LOOK_EVERY_MAX: Duration = Duration::from_millis(500);

/// Buffered notifications before the stream waits for its client.
const DEPTH: usize = 16;

/// What a listen request asks for.
pub(super) enum Listen {
    /// Only tasks: the proxy serves it.
    Tasks(Vec<String>),
    /// Tasks and more, or no tasks: the upstream's.
    Upstream,
}

impl Listen {
    pub(super) fn of(body: &[u8]) -> Listen {
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            return Listen::Upstream;
        };
        let Some(filters) = value
            .pointer("/params/notifications")
            .and_then(Value::as_object)
        else {
            return Listen::Upstream;
        };
        let ids: Vec<String> = filters
            .get("taskIds")
            .and_then(Value::as_array)
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| id.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if ids.is_empty() || filters.len() > 1 {
            return Listen::Upstream;
        }
        Listen::Tasks(ids)
    }
}

/// Serves a listen for `ids`: the acknowledgement, then every change of
/// each accepted task, until the client leaves or the proxy drains.
pub(super) async fn serve(
    route: &Route,
    request: &Modern<'_>,
    ids: Vec<String>,
    poll_ms: u64,
) -> Result<Response<Body>, Rejection> {
    if !wire::declared(&request.body) {
        return Err(Rejection::tasks_not_declared(Some(request.id.clone())));
    }
    let principal = route.shared.caller(request.parts).await?;
    let log = route.shared.log.clone();
    let mut watched: Vec<(String, TaskId)> = Vec::new();
    // Each id watched costs reads every poll: a listen names each once, and
    // at most `MAX_WATCHED` of them (more are not acknowledged).
    let mut seen = std::collections::HashSet::new();
    for text in ids {
        if watched.len() == MAX_WATCHED || !seen.insert(text.clone()) {
            continue;
        }
        let Some(task) = route
            .shared
            .keyring
            .open_task_handle(&route.path, &principal, &text)
        else {
            continue;
        };
        let mine = task::read(&log, task)
            .await?
            .is_some_and(|seen| task::belongs(&seen.record, &route.path, &principal));
        if mine {
            watched.push((text, task));
        }
    }
    let subscription = request.id.as_json().to_owned();
    let accepted: Vec<&str> = watched.iter().map(|(text, _)| text.as_str()).collect();
    let ack = serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {
            "notifications": {"taskIds": accepted},
            "_meta": {"io.modelcontextprotocol/subscriptionId": raw(&subscription)},
        },
    });
    let (tx, body) = reply::streamed(DEPTH);
    let poll = Duration::from_millis(poll_ms).min(LOOK_EVERY_MAX);
    let keepalive = Duration::from_secs(route.shared.config.sse.keepalive_secs);
    let draining = route.shared.draining.clone();
    let keyring = route.shared.keyring.clone();
    tokio::spawn(async move {
        if tx.send(event(&ack)).await.is_err() {
            return;
        }
        let mut last: HashMap<TaskId, (&'static str, u64)> = HashMap::new();
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            for (_, task) in &watched {
                let Ok(Some(seen)) = task::read(&log, *task).await else {
                    continue;
                };
                let now = (seen.status.as_str(), seen.updated_ms);
                if last.get(task) == Some(&now) {
                    continue;
                }
                last.insert(*task, now);
                let note = notification(&seen, &keyring, &subscription);
                if tx.send(note).await.is_err() {
                    return;
                }
                quiet_since = tokio::time::Instant::now();
            }
            if quiet_since.elapsed() >= keepalive {
                if tx
                    .send(Bytes::from_static(b": keepalive\n\n"))
                    .await
                    .is_err()
                {
                    return;
                }
                quiet_since = tokio::time::Instant::now();
            }
            tokio::select! {
                () = draining.cancelled() => return,
                () = tokio::time::sleep(poll) => {}
            }
        }
    });
    Ok(reply::event_stream(body))
}

/// A `notifications/tasks` with the task as `tasks/get` shows it.
fn notification(seen: &Seen, keyring: &crate::token::Keyring, subscription: &str) -> Bytes {
    let id = crate::jsonrpc::RequestId("0".into());
    let shown: Value = serde_json::from_slice(&seen.get_result(keyring, &id)).unwrap_or_default();
    let mut params = shown.get("result").cloned().unwrap_or_default();
    params["_meta"] =
        serde_json::json!({"io.modelcontextprotocol/subscriptionId": raw(subscription)});
    event(&serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/tasks",
        "params": params,
    }))
}

/// A request id's JSON text as a value.
fn raw(json: &str) -> Value {
    serde_json::from_str(json).unwrap_or(Value::Null)
}

fn event(message: &Value) -> Bytes {
    let mut out = BytesMut::new();
    let data = serde_json::to_vec(message).unwrap_or_default();
    crate::reply::sse::encode_event(&mut out, None, &data);
    out.freeze()
}
