//! A task on the wire, one shape for both revisions: the 2025-11-25
//! experimental tasks and the 2026-07-28 extension show the same fields in
//! the same order and differ in two names — `ttl` and `pollInterval` of the
//! older revision are `ttlMs` and `pollIntervalMs` of the newer — which the
//! task's [`Revision`] picks when it is written. The newer revision's
//! answer fields (`resultType`, `result`, `error`, `inputRequests`) are
//! left out when unset, so an older revision's task never carries them.
//! Shapes only: what a task is comes from `state`.

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

use super::status::TaskStatus;
use crate::store::{rfc3339, TaskRecord};

/// The revision a task is shown to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revision {
    /// 2025-11-25, the experimental tasks served on the session path.
    Legacy,
    /// 2026-07-28, the tasks extension served to modern requests.
    Modern,
}

impl Revision {
    fn ttl(self) -> &'static str {
        match self {
            Revision::Legacy => "ttl",
            Revision::Modern => "ttlMs",
        }
    }

    fn poll_interval(self) -> &'static str {
        match self {
            Revision::Legacy => "pollInterval",
            Revision::Modern => "pollIntervalMs",
        }
    }
}

/// A task as a client sees it.
#[derive(Clone, Copy, Debug)]
pub struct Task<'a> {
    pub revision: Revision,
    /// The sealed handle the client names the task by.
    pub task_id: &'a str,
    pub status: TaskStatus,
    pub status_message: Option<&'a str>,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub ttl_ms: u64,
    pub poll_interval_ms: u64,
    pub result_type: Option<&'static str>,
    pub result: Option<&'a RawValue>,
    pub error: Option<&'a RawValue>,
    /// The input requests still unanswered (raw JSON object).
    pub input_requests: Option<&'a RawValue>,
}

impl<'a> Task<'a> {
    /// What identifies and times task `record` (named `handle`, last
    /// changed at `updated_ms`), with no message and no answer.
    pub fn of(
        revision: Revision,
        handle: &'a str,
        status: TaskStatus,
        record: &TaskRecord,
        updated_ms: u64,
    ) -> Self {
        Task {
            revision,
            task_id: handle,
            status,
            status_message: None,
            created_ms: record.created_ms,
            updated_ms,
            ttl_ms: record.ttl_ms,
            poll_interval_ms: record.poll_interval_ms,
            result_type: None,
            result: None,
            error: None,
            input_requests: None,
        }
    }
}

impl Serialize for Task<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut task = serializer.serialize_struct("Task", 11)?;
        task.serialize_field("taskId", self.task_id)?;
        task.serialize_field("status", self.status.as_str())?;
        unless_none(&mut task, "statusMessage", self.status_message)?;
        task.serialize_field("createdAt", &rfc3339(self.created_ms))?;
        task.serialize_field("lastUpdatedAt", &rfc3339(self.updated_ms))?;
        task.serialize_field(self.revision.ttl(), &self.ttl_ms)?;
        task.serialize_field(self.revision.poll_interval(), &self.poll_interval_ms)?;
        unless_none(&mut task, "resultType", self.result_type)?;
        unless_none(&mut task, "result", self.result)?;
        unless_none(&mut task, "error", self.error)?;
        unless_none(&mut task, "inputRequests", self.input_requests)?;
        task.end()
    }
}

/// A field written only when it has a value (an absent field, never `null`).
fn unless_none<S: SerializeStruct, T: Serialize + ?Sized>(
    task: &mut S,
    key: &'static str,
    value: Option<&T>,
) -> Result<(), S::Error> {
    match value {
        Some(value) => task.serialize_field(key, value),
        None => task.skip_field(key),
    }
}

/// A `tools/call` request with JSON-RPC id `id` and `params` as given: a
/// task leg's call upstream, in either revision.
pub fn tools_call(id: &crate::jsonrpc::RequestId, params: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{params}}}"#,
        id.as_json()
    ))
}

/// A task's `taskId`: its handle, sealed for its route and principal.
pub fn handle(keyring: &crate::token::Keyring, record: &TaskRecord) -> String {
    keyring.task_handle(&record.route, &record.principal, record.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::TaskId;

    fn shown(revision: Revision) -> String {
        let record = crate::store::contract::task(TaskId::random(), 0, 60_000);
        let task = Task::of(revision, "T", TaskStatus::Working, &record, 0);
        serde_json::to_string(&task).unwrap()
    }

    #[test]
    fn the_revisions_differ_in_the_names_of_ttl_and_poll_interval_only() {
        let legacy = shown(Revision::Legacy);
        let modern = shown(Revision::Modern);
        assert!(
            legacy.contains(r#""ttl":60000,"pollInterval":"#),
            "{legacy}"
        );
        assert!(
            modern.contains(r#""ttlMs":60000,"pollIntervalMs":"#),
            "{modern}"
        );
        let renamed = legacy
            .replace(r#""ttl":"#, r#""ttlMs":"#)
            .replace(r#""pollInterval":"#, r#""pollIntervalMs":"#);
        assert_eq!(renamed, modern);
        assert!(!legacy.contains("resultType") && !legacy.contains("statusMessage"));
    }
}
