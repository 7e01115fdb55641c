//! The 2025-11-25 experimental tasks (SEP-1686), served by the proxy to
//! sessions of that revision whose upstream declares no `capabilities.tasks`
//! (opt-in per upstream, `[upstream.tasks] legacy`): a `tools/call` with
//! `params.task` is answered at once with a `CreateTaskResult`, and runs on
//! upstream as an ordinary request stream of the session — a *leg*, logged,
//! resumed upstream after a cut or a restart like any other — under an id
//! of the proxy's own, so the client may reuse its id at once.
//!
//! `tasks/get`, `tasks/list` and `tasks/cancel` are answered from the task's
//! record and leg (`crate::task`); `tasks/result` replays the leg — the
//! upstream's progress and its requests to the client, which the client
//! answers as usual — and ends with the leg's answer under the `tasks/result`
//! id, tagged with the related task. The session's `initialize` result gains
//! `capabilities.tasks` and its `tools/list` results mark every tool that says
//! nothing of tasks `optional`; both only on the wire (the log keeps the
//! upstream's bytes).
//!
//! A task belongs to the session that made it: another session's task, an
//! expired one and a forged id all read as unknown (-32602).
//!
//! Layout: this file has the offer (`initialize`, `tools/list`), the caller's
//! own task, and the end announcement; `calls` the commands a client sends
//! (`tools/call` with `params.task`, `tasks/*`); `fetched` the replay of a
//! leg as the answer of a `tasks/result`, and the waiters. A task as this
//! revision shows it, a leg's call and a leg's answer on the wire are
//! `task::legacy`'s; this dialect imports them, never the other way.

mod calls;
mod fetched;

pub use calls::{asks_for_task, Create, List, Named, Start};
pub use fetched::{Fetched, Waiters};

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::{Context, Refusal};
use crate::config::TasksConfig;
use crate::jsonrpc::{self, RequestId};
use crate::metrics::TaskEnd;
use crate::session::Session;
use crate::stream::Log;
use crate::task::legacy::{show, Shown};
use crate::task::{Leg, TaskStatus};
use crate::token::Keyring;

pub const GET: &str = "tasks/get";
pub const RESULT: &str = "tasks/result";
pub const LIST: &str = "tasks/list";
pub const CANCEL: &str = "tasks/cancel";
pub const METHODS: [&str; 4] = [GET, RESULT, LIST, CANCEL];

/// The revision that has these tasks.
const REVISION: &str = "2025-11-25";

const UNKNOWN_TASK: &str = "unknown or expired task";

/// Why a `tasks/result` has no answer to give (-32603, as native servers).
const NO_ANSWER: &str = "the proxy holds no answer of the upstream for this task";
const CANCELLED: &str = "the task was cancelled before it answered";

/// The shortest `ttl` a task is kept for, whatever the client asked.
const MIN_TTL_MS: u64 = 1_000;

/// Whether a session opening with `initialize` is offered tasks: the route
/// serves them and the client speaks their revision.
pub fn offered(config: &TasksConfig, initialize: &[u8]) -> bool {
    config.legacy && jsonrpc::protocol_version(initialize).as_deref() == Some(REVISION)
}

/// Whether the proxy serves tasks to a session whose upstream answered its
/// `initialize` with `result`: an upstream with tasks of its own keeps them
/// all. (An upstream that agreed an older revision still gets them: the
/// client asked for theirs, and SDK clients use them on either.)
pub fn served(result: &[u8]) -> bool {
    let Ok(message) = serde_json::from_slice::<Value>(result) else {
        return false;
    };
    message["result"]["capabilities"]
        .as_object()
        .is_some_and(|capabilities| !capabilities.contains_key("tasks"))
}

/// Adds what the proxy serves to an `initialize` result's capabilities.
pub(super) fn advertise(capabilities: &mut Map<String, Value>) {
    capabilities.insert(
        "tasks".into(),
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
    );
}

/// A `tools/list` result with every tool that says nothing of tasks marked
/// `execution.taskSupport: "optional"`; `None` when nothing changes.
pub fn tools_offered(message: &[u8]) -> Option<Bytes> {
    let mut value: Value = serde_json::from_slice(message).ok()?;
    let tools = value.pointer_mut("/result/tools")?.as_array_mut()?;
    let mut changed = false;
    for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
        let execution = tool.entry("execution").or_insert_with(|| json!({}));
        if let Some(execution) = execution.as_object_mut() {
            if !execution.contains_key("taskSupport") {
                execution.insert("taskSupport".into(), json!("optional"));
                changed = true;
            }
        }
    }
    changed
        .then(|| serde_json::to_vec(&value).ok().map(Bytes::from))
        .flatten()
}

impl Context<'_> {
    /// The caller's task a handle names; unknown, expired, forged and
    /// another session's alike are `UNKNOWN_TASK`.
    async fn own_task(&self, id: &RequestId, handle: &str) -> Result<Shown, Refusal> {
        let unknown = || Refusal::InvalidParams {
            id: id.clone(),
            message: UNKNOWN_TASK,
        };
        let record = self.session.record();
        let task = self
            .keyring
            .open_task_handle(&record.route, &record.principal, handle)
            .ok_or_else(unknown)?;
        let shown = show(self.log, self.keyring, task)
            .await?
            .ok_or_else(unknown)?;
        if shown.seen.record.session != Some(self.session.id) {
            return Err(unknown());
        }
        Ok(shown)
    }
}

/// Tells the session when a task ends: a `notifications/tasks/status` on
/// its standalone stream (when one is open; the notification is a
/// courtesy — clients poll), and the task's end in the metrics. Runs while
/// this process lives; a task that ends after a restart is only polled.
pub async fn announce_end(log: Arc<Log>, keyring: Keyring, session: Arc<Session>, leg: Leg) {
    let mut watermark = log.store().subscribe(leg.stream).await;
    tokio::select! {
        // A closed subscription is a stream this process no longer
        // follows: what the log says decides.
        _ = watermark.wait_for(|w| w.finished) => {}
        _ = session.ended.cancelled() => return,
    }
    drop(watermark);
    let Ok(Some(shown)) = show(&log, &keyring, leg.task).await else {
        return;
    };
    if !shown.status.is_terminal() {
        return;
    }
    log.metrics().task_ended(match shown.status {
        TaskStatus::Completed => TaskEnd::Completed,
        TaskStatus::Cancelled => TaskEnd::Cancelled,
        _ => TaskEnd::Failed,
    });
    let Some(standalone) = session.standalone() else {
        return;
    };
    if !matches!(log.meta(standalone).await, Ok(Some(m)) if m.status.is_live()) {
        return;
    }
    let notification = super::notification("notifications/tasks/status", shown.value());
    if let Err(e) = log.append(standalone, &[notification]).await {
        tracing::debug!(task = %leg.task, error = %e, "cannot announce a task's end");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_declaring_tasks_keeps_them() {
        let own = br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{"tasks":{}}}}"#;
        let none = br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}}}}"#;
        assert!(!served(own));
        assert!(served(none));
        assert!(!served(
            br#"{"jsonrpc":"2.0","id":0,"error":{"code":-32600,"message":"x"}}"#
        ));
    }

    #[test]
    fn tools_list_marks_only_tools_that_say_nothing_of_tasks() {
        let listed = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"},{"name":"b","execution":{"taskSupport":"forbidden"}}]}}"#;
        let shown: Value = serde_json::from_slice(&tools_offered(listed).unwrap()).unwrap();
        assert_eq!(
            shown["result"]["tools"][0]["execution"]["taskSupport"],
            "optional"
        );
        assert_eq!(
            shown["result"]["tools"][1]["execution"]["taskSupport"],
            "forbidden"
        );
        let all_said = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"b","execution":{"taskSupport":"required"}}]}}"#;
        assert!(tools_offered(all_said).is_none());
    }
}
