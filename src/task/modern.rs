//! Tasks (`io.modelcontextprotocol/tasks`, SEP-2663), the durability of the
//! 2026-07-28 revision, spoken by the proxy for upstreams that know nothing
//! of them: the wire shapes only — the client's declaration, the
//! `CreateTaskResult`, the `DetailedTask` of `tasks/get`, the empty acks, the
//! extension in `server/discover`, and MRTR's rounds as a client sees them
//! (surfaced input keys, the re-issued request). No I/O: `proxy::tasks`
//! runs the calls and keeps the records.
//!
//! Upstream results and errors are spliced into what the proxy writes as the
//! raw bytes the upstream sent, never re-serialized: a completed task's
//! `result` is byte-equal to the upstream's.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::state::Seen;
use super::status::{Answer, TaskStatus};
use super::wire::{Revision, Task};
use crate::jsonrpc::RequestId;
use crate::store::TaskRecord;
use crate::token::Keyring;

/// The extension's identifier, in `_meta` declarations and capabilities.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Where a modern request declares its client capabilities.
const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// Error codes of the 2026-07-28 revision the tasks methods answer with.
pub mod code {
    /// A header (`Mcp-Name`, `Mcp-Method`) disagrees with the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// The request needs a capability the client did not declare.
    pub const MISSING_CAPABILITY: i64 = -32021;
}

/// Whether a request declared the extension in its own `_meta` (modern
/// clients declare per request; there is no session to remember it).
pub fn declared(message: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(message) else {
        return false;
    };
    value
        .pointer("/params/_meta")
        .and_then(|meta| meta.get(CLIENT_CAPABILITIES))
        .and_then(|caps| caps.get("extensions"))
        .and_then(|extensions| extensions.get(EXTENSION))
        .is_some()
}

#[derive(Serialize)]
struct Reply<'a, T: Serialize> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    result: T,
}

fn reply<T: Serialize>(id: &RequestId, result: T) -> Vec<u8> {
    // A request id is JSON text already (a number or a string).
    let id = RawValue::from_string(id.as_json().to_owned())
        .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"));
    let reply = Reply {
        jsonrpc: "2.0",
        id: &id,
        result,
    };
    serde_json::to_vec(&reply).unwrap_or_default()
}

/// The answer to the `tools/call` that became `task`: the flat
/// `CreateTaskResult` — only what identifies and times the task.
fn create_reply(task: Task<'_>, id: &RequestId) -> Vec<u8> {
    reply(
        id,
        Task {
            revision: Revision::Modern,
            result_type: Some("task"),
            status_message: None,
            result: None,
            error: None,
            input_requests: None,
            ..task
        },
    )
}

/// The answer to `tasks/get`: the whole `DetailedTask`.
fn get_reply(task: Task<'_>, id: &RequestId) -> Vec<u8> {
    reply(
        id,
        Task {
            revision: Revision::Modern,
            result_type: Some("complete"),
            ..task
        },
    )
}

/// The empty answer of `tasks/cancel` and `tasks/update`.
pub fn ack(id: &RequestId) -> Vec<u8> {
    #[derive(Serialize)]
    struct Ack {
        #[serde(rename = "resultType")]
        result_type: &'static str,
    }
    reply(
        id,
        Ack {
            result_type: "complete",
        },
    )
}

/// The `data` of -32021: what the client must declare.
pub fn missing_capability_data() -> String {
    format!(r#"{{"requiredCapabilities":{{"extensions":{{"{EXTENSION}":{{}}}}}}}}"#)
}

/// Whether a `server/discover` result lists the extension (the upstream
/// has tasks of its own).
pub fn lists_extension(message: &[u8]) -> bool {
    serde_json::from_slice::<Value>(message)
        .ok()
        .and_then(|v| {
            v.pointer("/result/capabilities/extensions")
                .map(|e| e.get(EXTENSION).is_some())
        })
        .unwrap_or(false)
}

/// A `server/discover` result with the extension added to its
/// capabilities; `None` when it is no such result or lists it already.
pub fn with_extension(message: &[u8]) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(message).ok()?;
    let capabilities = value.pointer_mut("/result/capabilities")?.as_object_mut()?;
    let extensions = capabilities
        .entry("extensions")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()?;
    if extensions.contains_key(EXTENSION) {
        return None;
    }
    extensions.insert(EXTENSION.to_owned(), Value::Object(Default::default()));
    serde_json::to_vec(&value).ok()
}

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
        let handle = super::wire::handle(keyring, &self.record);
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
        get_reply(task, id)
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

/// The `CreateTaskResult` of a task just made.
pub fn create_result(keyring: &Keyring, record: &TaskRecord, id: &RequestId) -> Vec<u8> {
    let handle = super::wire::handle(keyring, record);
    let task = Task::of(
        Revision::Modern,
        &handle,
        TaskStatus::Working,
        record,
        record.updated_ms,
    );
    create_reply(task, id)
}

/// The raw JSON of an MRTR re-issue's params: the original params with the
/// answers and the upstream's request state (both at the top level).
pub fn reissue_params(
    request: &str,
    answers: &BTreeMap<String, String>,
    request_state: Option<&str>,
) -> Option<String> {
    // Every value stays the raw text it came as: the upstream may bind its
    // request state to a digest of the arguments.
    type Raw = BTreeMap<String, Box<RawValue>>;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_is_read_from_the_requests_own_meta() {
        let yes = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}"#;
        let no = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        assert!(declared(yes));
        assert!(!declared(no));
        assert!(!declared(b"not json"));
    }

    #[test]
    fn discover_gains_the_extension_unless_listed() {
        let plain = br#"{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"tools":{}}}}"#;
        let added = with_extension(plain).unwrap();
        assert!(lists_extension(&added));
        assert!(!lists_extension(plain));
        assert_eq!(with_extension(&added), None);
    }

    #[test]
    fn a_create_result_is_flat_and_carries_no_outcome() {
        let raw = RawValue::from_string("{\"x\":1}".into()).unwrap();
        let task = Task {
            revision: Revision::Modern,
            task_id: "T",
            status: TaskStatus::Working,
            created_ms: 0,
            updated_ms: 0,
            ttl_ms: 60_000,
            poll_interval_ms: 500,
            status_message: None,
            result: Some(&raw),
            error: None,
            input_requests: None,
            result_type: None,
        };
        let v: Value = serde_json::from_slice(&create_reply(task, &RequestId("5".into()))).unwrap();
        assert_eq!(v["id"], 5);
        assert_eq!(v["result"]["resultType"], "task");
        assert_eq!(v["result"]["taskId"], "T");
        assert_eq!(v["result"]["ttlMs"], 60_000);
        assert!(v["result"].get("result").is_none());
    }
}
