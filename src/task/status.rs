//! Where a task stands and what its answer was, in the words both revisions
//! map from: read off a task's record and current leg by `state`, shown by
//! each revision in its own words. Parses
//! an upstream's answer and nothing else; no I/O.

use serde_json::value::RawValue;
use serde_json::Value;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
