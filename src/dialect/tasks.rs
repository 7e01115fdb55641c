//! Tasks (`io.modelcontextprotocol/tasks`, SEP-2663), the durability of the
//! 2026-07-28 revision, spoken by the proxy for upstreams that know nothing
//! of them: the wire shapes only — the client's declaration, the
//! `CreateTaskResult`, the `DetailedTask` of `tasks/get`, the empty acks, the
//! extension in `server/discover`, and what an upstream's final answer means
//! for a task. No I/O: `proxy::tasks` runs the calls and keeps the records.
//!
//! Upstream results and errors are spliced into what the proxy writes as the
//! raw bytes the upstream sent, never re-serialized: a completed task's
//! `result` is byte-equal to the upstream's.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::jsonrpc::RequestId;
use crate::store::rfc3339;

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

/// Where a task stands, as `status` says it on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Nothing changes a task in this status any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }
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

/// What one upstream answer to a task's request means.
#[derive(Debug)]
pub enum Answer {
    /// A result (a tool error with `isError: true` included): the raw
    /// `result` object.
    Result(Box<RawValue>),
    /// A JSON-RPC error: the raw `error` object and its message.
    Error(Box<RawValue>, String),
    /// MRTR: the upstream needs input first. The raw `inputRequests` object,
    /// its keys, and the raw `requestState` to send back, if any.
    InputRequired {
        requests: Box<RawValue>,
        keys: Vec<String>,
        request_state: Option<Box<RawValue>>,
    },
}

impl Answer {
    /// Reads a JSON-RPC response; `None` for anything else.
    pub fn of(message: &[u8]) -> Option<Answer> {
        #[derive(serde::Deserialize)]
        struct Response {
            result: Option<Box<RawValue>>,
            error: Option<Box<RawValue>>,
        }
        #[derive(serde::Deserialize)]
        struct Message {
            message: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Mrtr {
            #[serde(rename = "resultType")]
            result_type: Option<String>,
            #[serde(rename = "inputRequests")]
            input_requests: Option<Box<RawValue>>,
            #[serde(rename = "requestState")]
            request_state: Option<Box<RawValue>>,
        }
        let response: Response = serde_json::from_slice(message).ok()?;
        if let Some(error) = response.error {
            let text = serde_json::from_str::<Message>(error.get())
                .ok()
                .and_then(|m| m.message)
                .unwrap_or_default();
            return Some(Answer::Error(error, text));
        }
        let result = response.result?;
        let mrtr: Mrtr = serde_json::from_str(result.get()).ok()?;
        match (mrtr.result_type.as_deref(), mrtr.input_requests) {
            (Some("input_required"), Some(requests)) => {
                let keys = serde_json::from_str::<serde_json::Map<String, Value>>(requests.get())
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                Some(Answer::InputRequired {
                    requests,
                    keys,
                    request_state: mrtr.request_state,
                })
            }
            _ => Some(Answer::Result(result)),
        }
    }
}

/// Everything `tasks/get` shows of a task.
pub struct Detailed<'a> {
    pub task_id: &'a str,
    pub status: TaskStatus,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub ttl_ms: u64,
    pub poll_interval_ms: u64,
    pub status_message: Option<&'a str>,
    pub result: Option<&'a RawValue>,
    pub error: Option<&'a RawValue>,
    /// The input requests still unanswered (raw JSON object).
    pub input_requests: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct Task<'a> {
    #[serde(rename = "taskId")]
    task_id: &'a str,
    status: &'static str,
    #[serde(rename = "statusMessage", skip_serializing_if = "Option::is_none")]
    status_message: Option<&'a str>,
    #[serde(rename = "createdAt")]
    created_at: String,
    #[serde(rename = "lastUpdatedAt")]
    last_updated_at: String,
    #[serde(rename = "ttlMs")]
    ttl_ms: u64,
    #[serde(rename = "pollIntervalMs")]
    poll_interval_ms: u64,
    #[serde(rename = "resultType")]
    result_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RawValue>,
    #[serde(rename = "inputRequests", skip_serializing_if = "Option::is_none")]
    input_requests: Option<&'a RawValue>,
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

impl Detailed<'_> {
    fn task(&self, result_type: &'static str) -> Task<'_> {
        Task {
            task_id: self.task_id,
            status: self.status.as_str(),
            status_message: self.status_message,
            created_at: rfc3339(self.created_ms),
            last_updated_at: rfc3339(self.updated_ms),
            ttl_ms: self.ttl_ms,
            poll_interval_ms: self.poll_interval_ms,
            result_type,
            result: self.result,
            error: self.error,
            input_requests: self.input_requests,
        }
    }

    /// The answer to the `tools/call` that became this task: the flat
    /// `CreateTaskResult` — only what identifies and times the task.
    pub fn create_result(&self, id: &RequestId) -> Vec<u8> {
        let mut task = self.task("task");
        task.result = None;
        task.error = None;
        task.input_requests = None;
        task.status_message = None;
        reply(id, task)
    }

    /// The answer to `tasks/get`: the whole `DetailedTask`.
    pub fn get_result(&self, id: &RequestId) -> Vec<u8> {
        reply(id, self.task("complete"))
    }
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
    fn a_results_bytes_are_kept_as_the_upstream_sent_them() {
        let message = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"a"}],  "isError":true}}"#;
        let Some(Answer::Result(raw)) = Answer::of(message) else {
            panic!("a result");
        };
        assert_eq!(
            raw.get(),
            r#"{"content":[{"type":"text","text":"a"}],  "isError":true}"#
        );
    }

    #[test]
    fn an_input_required_result_names_its_keys_and_state() {
        let message = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","inputRequests":{"a":{"method":"elicitation/create"},"b":{}},"requestState":"s1"}}"#;
        let Some(Answer::InputRequired {
            keys,
            request_state,
            ..
        }) = Answer::of(message)
        else {
            panic!("input required");
        };
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(
            request_state.map(|s| s.get().to_owned()),
            Some("\"s1\"".into())
        );
    }

    #[test]
    fn an_error_keeps_its_object_and_message() {
        let message = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"boom"}}"#;
        let Some(Answer::Error(raw, text)) = Answer::of(message) else {
            panic!("an error");
        };
        assert_eq!(raw.get(), r#"{"code":-32603,"message":"boom"}"#);
        assert_eq!(text, "boom");
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
        let detailed = Detailed {
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
        };
        let v: Value =
            serde_json::from_slice(&detailed.create_result(&RequestId("5".into()))).unwrap();
        assert_eq!(v["id"], 5);
        assert_eq!(v["result"]["resultType"], "task");
        assert_eq!(v["result"]["taskId"], "T");
        assert_eq!(v["result"]["ttlMs"], 60_000);
        assert!(v["result"].get("result").is_none());
    }
}
