//! The 2025-11-25 experimental tasks (SEP-1686) on the wire: a task as this
//! revision shows it — its status in this revision's words (a call that
//! asks the client something is `input_required`; a tool's error is
//! `failed`), read from the shared `state` — a leg's `tools/call` under the
//! proxy's own id, and a leg's answer shown as the answer of a
//! `tasks/result`, tagged with its task. The commands that use them (the
//! session path's `tasks/*`) are `dialect::legacy_tasks`'; this file reads
//! the log but answers no request and imports no dialect.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::state::{read, Seen};
use super::status::{Answer as Outcome, TaskStatus};
use super::wire::{Revision, Task};
use crate::id::TaskId;
use crate::jsonrpc::{self, Kind, RequestId};
use crate::store::StoreError;
use crate::stream::Log;
use crate::token::Keyring;

/// The `_meta` key tying a message to its task.
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// A task with the status this revision gives it.
pub struct Shown {
    /// The sealed handle the client names the task by.
    pub handle: String,
    pub status: TaskStatus,
    pub message: Option<String>,
    pub seen: Seen,
}

impl Shown {
    fn task(&self) -> Task<'_> {
        Task {
            status_message: self.message.as_deref(),
            ..Task::of(
                Revision::Legacy,
                &self.handle,
                self.status,
                &self.seen.record,
                self.seen.updated_ms,
            )
        }
    }

    /// The task as this revision's `tasks/get`, `tasks/list` and
    /// `notifications/tasks/status` show it.
    pub fn value(&self) -> Value {
        serde_json::to_value(self.task()).unwrap_or(Value::Null)
    }
}

/// Reads a task and gives it this revision's status: a live leg whose last
/// entry is a request of the upstream to the client waits for the client's
/// answer (`input_required`: the client should call `tasks/result`, which
/// brings the request).
pub async fn show(log: &Log, keyring: &Keyring, id: TaskId) -> Result<Option<Shown>, StoreError> {
    let Some(seen) = read(log, id).await? else {
        return Ok(None);
    };
    let mut status = seen.status;
    let message = match &seen.answer {
        Some(Outcome::Error(_, message)) => Some(message.clone()),
        None if status == TaskStatus::Failed => Some("the upstream request was lost".to_owned()),
        _ => None,
    };
    if status == TaskStatus::InputRequired {
        // An MRTR answer is no question of this revision: the call ended.
        status = TaskStatus::Completed;
    }
    if status == TaskStatus::Completed && seen.answer.as_ref().is_some_and(is_tool_error) {
        // As native servers of this revision report a tool's error; its
        // result is still what `tasks/result` answers.
        status = TaskStatus::Failed;
    }
    if status == TaskStatus::Working && asks_the_client(log, &seen).await? {
        status = TaskStatus::InputRequired;
    }
    let handle = super::wire::handle(keyring, &seen.record);
    Ok(Some(Shown {
        handle,
        status,
        message,
        seen,
    }))
}

/// Whether an answer is a tool's result with `isError: true`.
fn is_tool_error(answer: &Outcome) -> bool {
    #[derive(serde::Deserialize)]
    struct ToolResult {
        #[serde(rename = "isError", default)]
        is_error: bool,
    }
    let Outcome::Result(result) = answer else {
        return false;
    };
    serde_json::from_str::<ToolResult>(result.get()).is_ok_and(|r| r.is_error)
}

/// Whether the task's current leg last logged a request to the client.
async fn asks_the_client(log: &Log, seen: &Seen) -> Result<bool, StoreError> {
    let Some(leg) = seen.record.current_leg() else {
        return Ok(false);
    };
    let Some(meta) = log.meta(leg).await? else {
        return Ok(false);
    };
    if meta.entries == 0 {
        return Ok(false);
    }
    let last = log.store().read_after(leg, meta.entries - 1, 1).await?;
    Ok(last
        .first()
        .and_then(|e| jsonrpc::classify(&e.message).ok())
        .is_some_and(|e| e.kind == Kind::Request))
}

/// The `tools/call` a task's leg sends upstream: the client's params
/// without `task`, under the proxy's id.
pub fn upstream_call(task: TaskId, params: &str) -> Bytes {
    super::wire::tools_call(&upstream_id(task), params)
}

/// The id a task's leg has upstream: the proxy's own, so the client may
/// reuse the id of its `tools/call` once it has the task.
pub fn upstream_id(task: TaskId) -> RequestId {
    RequestId(format!("\"mcp-resume-proxy-task-{task}\"").into())
}

/// A leg's answer as the answer of `tasks/result` request `client`: its
/// id, and the related task in the result's `_meta`.
pub fn as_result_of(message: &[u8], client: &RequestId, handle: &str) -> Option<Bytes> {
    let mut value: Map<String, Value> = serde_json::from_slice(message).ok()?;
    if !value.contains_key("result") && !value.contains_key("error") {
        return None;
    }
    value.insert("id".into(), serde_json::from_str(client.as_json()).ok()?);
    if let Some(result) = value.get_mut("result").and_then(Value::as_object_mut) {
        tag(result, handle);
    }
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

/// Ties `object` (a result, a request's params) to its task in its
/// `_meta`, made when absent.
pub fn tag(object: &mut Map<String, Value>, handle: &str) {
    let meta = object.entry("_meta").or_insert_with(|| json!({}));
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(RELATED_TASK.into(), json!({ "taskId": handle }));
    }
}
