//! A modern task as a client sees it: the `DetailedTask` of `tasks/get`,
//! the `CreateTaskResult`, MRTR's surfaced input keys and the re-issued
//! request's params. What a task *is* (read from the log, changed with
//! compare-and-set) is the core's, `crate::task`.

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::dialect::tasks as wire;
use crate::jsonrpc::RequestId;
use crate::task::wire::{Revision, Task};
use crate::task::{Answer, Seen, TaskRecord, TaskStatus};
use crate::token::Keyring;

impl Seen {
    /// The round of MRTR the current leg is (1 for the call itself):
    /// surfaced input keys carry it, so they are unique over the task's
    /// life even when the upstream reuses its keys.
    pub fn round(&self) -> usize {
        self.record.legs.len()
    }

    /// The upstream's input requests still unanswered, under surfaced keys.
    fn open_requests(&self) -> Option<Box<RawValue>> {
        let Some(Answer::InputRequired { requests, .. }) = &self.answer else {
            return None;
        };
        let requests: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(requests.get()).ok()?;
        let answered = self.record.input.as_ref().map(|i| &i.answered);
        let open: serde_json::Map<String, serde_json::Value> = requests
            .into_iter()
            .filter(|(key, _)| !answered.is_some_and(|a| a.contains_key(key)))
            .map(|(key, request)| (surfaced(self.round(), &key), request))
            .collect();
        serde_json::value::to_raw_value(&open).ok()
    }

    /// The `tasks/get` answer.
    pub fn get_result(&self, keyring: &Keyring, id: &RequestId) -> Vec<u8> {
        let handle = handle(keyring, &self.record);
        let open = (self.status == TaskStatus::InputRequired)
            .then(|| self.open_requests())
            .flatten();
        let (result, error, message) = match (&self.status, &self.answer) {
            (TaskStatus::Completed, Some(Answer::Result(result))) => (Some(&**result), None, None),
            (TaskStatus::Failed, Some(Answer::Error(error, message))) => {
                (None, Some(&**error), Some(message.as_str()))
            }
            _ => (None, None, None),
        };
        let failed_unread = self.status == TaskStatus::Failed && error.is_none();
        let unreadable = unreadable_error();
        let task = Task {
            status_message: message,
            result,
            error: if failed_unread {
                Some(&*unreadable)
            } else {
                error
            },
            input_requests: open.as_deref(),
            ..Task::of(
                Revision::Modern,
                &handle,
                self.status,
                &self.record,
                self.updated_ms,
            )
        };
        wire::get_result(task, id)
    }
}

/// The key a client sees for upstream input key `key` of MRTR round `round`.
pub fn surfaced(round: usize, key: &str) -> String {
    format!("{round}.{key}")
}

/// The upstream key of a surfaced key of round `round`; `None` for a key of
/// another round or none of ours.
pub fn upstream_key(round: usize, surfaced: &str) -> Option<&str> {
    let (r, key) = surfaced.split_once('.')?;
    (r.parse::<usize>().ok()? == round).then_some(key)
}

fn unreadable_error() -> Box<RawValue> {
    RawValue::from_string(
        r#"{"code":-32603,"message":"the proxy holds no answer of the upstream for this task (it could not read one, or the request was lost)"}"#.into(),
    )
    .expect("a JSON literal")
}

/// The task's `taskId`.
pub fn handle(keyring: &Keyring, record: &TaskRecord) -> String {
    keyring.task_handle(&record.route, &record.principal, record.id)
}

/// The `CreateTaskResult` of a task just made.
pub fn create_result(keyring: &Keyring, record: &TaskRecord, id: &RequestId) -> Vec<u8> {
    let handle = handle(keyring, record);
    let task = Task::of(
        Revision::Modern,
        &handle,
        TaskStatus::Working,
        record,
        record.updated_ms,
    );
    wire::create_result(task, id)
}

/// The raw JSON of an MRTR re-issue's params: the original params with the
/// answers and the upstream's request state (both at the top level).
pub fn reissue_params(
    request: &str,
    answers: &std::collections::BTreeMap<String, String>,
    request_state: Option<&str>,
) -> Option<String> {
    // Every value stays the raw text it came as: the upstream may bind its
    // request state to a digest of the arguments.
    type Raw = std::collections::BTreeMap<String, Box<RawValue>>;
    let mut params: Raw = serde_json::from_str(request).ok()?;
    let mut responses = Raw::new();
    for (key, answer) in answers {
        responses.insert(key.clone(), RawValue::from_string(answer.clone()).ok()?);
    }
    params.insert(
        "inputResponses".into(),
        serde_json::value::to_raw_value(&responses).ok()?,
    );
    match request_state {
        Some(state) => {
            params.insert(
                "requestState".into(),
                RawValue::from_string(state.into()).ok()?,
            );
        }
        None => {
            params.remove("requestState");
        }
    }
    serde_json::to_string(&params).ok()
}

/// The body of a re-issued request with JSON-RPC id `id`.
pub fn reissue_body(id: &RequestId, params: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{params}}}"#,
        id.as_json()
    ))
}
