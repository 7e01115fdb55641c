//! JSON-RPC envelope classification over raw bytes.
//!
//! The proxy must forward messages byte for byte, so it never deserializes a
//! message into a typed model and back. It only peeks: is this a request, a
//! notification or a response, what is its `id` (kept as the raw JSON text, so
//! `1` and `"1"` stay different ids), and what is its `method`. `params` and
//! `result` are skipped, never copied. Building error responses is the one
//! place where this module writes JSON.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The raw JSON text of a request id (`1`, `"abc"`), compared textually.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub String);

impl RequestId {
    pub fn as_json(&self) -> &str {
        &self.0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    Response,
}

/// What the proxy needs to know about one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub kind: Kind,
    pub id: Option<RequestId>,
    pub method: Option<String>,
}

impl Envelope {
    pub fn is_request(&self) -> bool {
        self.kind == Kind::Request
    }

    pub fn is_method(&self, method: &str) -> bool {
        self.method.as_deref() == Some(method)
    }
}

/// A POST body: one message, or a JSON-RPC batch (2025-03-26 only, but the
/// proxy forwards whatever it gets and lets the upstream judge the revision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Single(Envelope),
    Batch(Vec<Envelope>),
}

impl Body {
    pub fn envelopes(&self) -> &[Envelope] {
        match self {
            Body::Single(e) => std::slice::from_ref(e),
            Body::Batch(v) => v,
        }
    }

    /// Ids of the requests in the body: the responses the stream waits for.
    pub fn request_ids(&self) -> Vec<RequestId> {
        self.envelopes()
            .iter()
            .filter(|e| e.is_request())
            .filter_map(|e| e.id.clone())
            .collect()
    }

    pub fn has_requests(&self) -> bool {
        self.envelopes().iter().any(Envelope::is_request)
    }

    /// The single request's method, if the body is exactly one request.
    pub fn single_method(&self) -> Option<&str> {
        match self {
            Body::Single(e) if e.is_request() => e.method.as_deref(),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("body is not valid JSON: {0}")]
    Json(String),
    #[error("not a JSON-RPC 2.0 message: {0}")]
    Shape(&'static str),
}

#[derive(Deserialize)]
struct Peek<'a> {
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<Cow<'a, str>>,
    result: Option<IgnoredAny>,
    error: Option<IgnoredAny>,
}

/// Classifies one message (an object, not an array).
pub fn classify(bytes: &[u8]) -> Result<Envelope, ParseError> {
    let peek: Peek<'_> =
        serde_json::from_slice(bytes).map_err(|e| ParseError::Json(e.to_string()))?;
    envelope(peek)
}

fn envelope(peek: Peek<'_>) -> Result<Envelope, ParseError> {
    if peek.jsonrpc.as_deref() != Some("2.0") {
        return Err(ParseError::Shape("\"jsonrpc\" must be \"2.0\""));
    }
    // `"id": null` deserializes as a present RawValue "null"; a request with a
    // null id is not a request the proxy can answer, so treat it as absent.
    let id = peek
        .id
        .map(|raw| raw.get())
        .filter(|raw| *raw != "null")
        .map(|raw| RequestId(raw.to_owned()));
    let kind = match (&peek.method, &id) {
        (Some(_), Some(_)) => Kind::Request,
        (Some(_), None) => Kind::Notification,
        (None, _) if peek.result.is_some() || peek.error.is_some() => Kind::Response,
        (None, _) => return Err(ParseError::Shape("no \"method\", \"result\" or \"error\"")),
    };
    Ok(Envelope {
        kind,
        id,
        method: peek.method.map(Cow::into_owned),
    })
}

/// Classifies a POST body: one message or a batch.
pub fn parse_body(bytes: &[u8]) -> Result<Body, ParseError> {
    let first = bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .ok_or(ParseError::Json("empty body".into()))?;
    if *first == b'[' {
        let items: Vec<&RawValue> =
            serde_json::from_slice(bytes).map_err(|e| ParseError::Json(e.to_string()))?;
        if items.is_empty() {
            return Err(ParseError::Shape("empty batch"));
        }
        let envelopes = items
            .into_iter()
            .map(|raw| classify(raw.get().as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Body::Batch(envelopes))
    } else {
        classify(bytes).map(Body::Single)
    }
}

/// Response ids carried by one upstream message: one for a response, several
/// for a batch of responses (2025-03-26 JSON answers), none otherwise.
pub fn response_ids(bytes: &[u8]) -> Vec<RequestId> {
    match parse_body(bytes) {
        Ok(body) => body
            .envelopes()
            .iter()
            .filter(|e| e.kind == Kind::Response)
            .filter_map(|e| e.id.clone())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Reads `params.protocolVersion` of an `initialize` request, or
/// `result.protocolVersion` of its response.
pub fn protocol_version(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Inner<'a> {
        #[serde(rename = "protocolVersion", borrow)]
        protocol_version: Option<Cow<'a, str>>,
    }
    #[derive(Deserialize)]
    struct Outer<'a> {
        #[serde(borrow)]
        params: Option<Inner<'a>>,
        #[serde(borrow)]
        result: Option<Inner<'a>>,
    }
    let outer: Outer<'_> = serde_json::from_slice(bytes).ok()?;
    outer
        .params
        .or(outer.result)
        .and_then(|i| i.protocol_version)
        .map(Cow::into_owned)
}

/// The `params.requestId` of every `notifications/cancelled` in a body.
pub fn cancelled_request_ids(bytes: &[u8]) -> Vec<RequestId> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(rename = "requestId", borrow)]
        request_id: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Cancel<'a> {
        method: Option<Cow<'a, str>>,
        #[serde(borrow)]
        params: Option<Params<'a>>,
    }
    let items: Vec<Cancel<'_>> = match serde_json::from_slice::<Vec<Cancel<'_>>>(bytes) {
        Ok(items) => items,
        Err(_) => match serde_json::from_slice::<Cancel<'_>>(bytes) {
            Ok(one) => vec![one],
            Err(_) => return Vec::new(),
        },
    };
    items
        .into_iter()
        .filter(|c| c.method.as_deref() == Some("notifications/cancelled"))
        .filter_map(|c| c.params?.request_id)
        .map(|raw| RequestId(raw.get().to_owned()))
        .collect()
}

/// The progress token a message names: `params._meta.progressToken` of a
/// request, or `params.progressToken` of `notifications/progress` (raw JSON
/// text, so `1` and `"1"` differ as they must).
pub fn progress_token(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(rename = "progressToken", borrow)]
        progress_token: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(rename = "progressToken", borrow)]
        progress_token: Option<&'a RawValue>,
        #[serde(rename = "_meta", borrow)]
        meta: Option<Meta<'a>>,
    }
    #[derive(Deserialize)]
    struct Message<'a> {
        #[serde(borrow)]
        params: Option<Params<'a>>,
    }
    let message: Message<'_> = serde_json::from_slice(bytes).ok()?;
    let params = message.params?;
    params
        .progress_token
        .or(params.meta.and_then(|m| m.progress_token))
        .map(|raw| raw.get().to_owned())
}

/// Standard and MCP-specific JSON-RPC error codes the proxy emits.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// What SDK servers use for transport-level rejections ("Bad Request: …").
    pub const SERVER_ERROR: i64 = -32000;
    /// "Session not found", as the TypeScript SDK answers it.
    pub const SESSION_NOT_FOUND: i64 = -32001;
}

/// A JSON-RPC error response. `id` is `None` for transport errors that belong
/// to no request (the spec's "error response that has no id").
pub fn error_response(id: Option<&RequestId>, code: i64, message: &str) -> Vec<u8> {
    let id = id.map(RequestId::as_json).unwrap_or("null");
    let message = serde_json::Value::String(message.to_owned());
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{message}}}}}"#)
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_every_message_kind() {
        let req = classify(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}"#);
        assert_eq!(req.as_ref().map(|e| e.kind), Ok(Kind::Request));
        assert_eq!(req.unwrap().id, Some(RequestId("7".into())));
        let note = classify(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert_eq!(note.map(|e| e.kind), Ok(Kind::Notification));
        let ok = classify(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#);
        assert_eq!(ok.map(|e| e.kind), Ok(Kind::Response));
        let err = classify(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#);
        assert_eq!(err.map(|e| e.kind), Ok(Kind::Response));
    }

    #[test]
    fn string_and_number_ids_stay_distinct() {
        let a = classify(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap();
        let b = classify(br#"{"jsonrpc":"2.0","id":"1","method":"ping"}"#).unwrap();
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn malformed_json_and_foreign_shapes_are_errors() {
        assert!(matches!(classify(b"{"), Err(ParseError::Json(_))));
        assert!(matches!(
            classify(br#"{"id":1,"method":"x"}"#),
            Err(ParseError::Shape(_))
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":1}"#),
            Err(ParseError::Shape(_))
        ));
        assert!(matches!(parse_body(b"[]"), Err(ParseError::Shape(_))));
        assert!(matches!(parse_body(b"  "), Err(ParseError::Json(_))));
    }

    #[test]
    fn batches_list_their_request_ids() {
        let body = parse_body(
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},
                 {"jsonrpc":"2.0","method":"notifications/x"},
                 {"jsonrpc":"2.0","id":2,"method":"ping"}]"#,
        )
        .unwrap();
        assert_eq!(
            body.request_ids(),
            vec![RequestId("1".into()), RequestId("2".into())]
        );
    }

    #[test]
    fn reads_protocol_version_from_initialize_and_its_result() {
        let req = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{}}}"#;
        assert_eq!(protocol_version(req).as_deref(), Some("2025-11-25"));
        let res = br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18"}}"#;
        assert_eq!(protocol_version(res).as_deref(), Some("2025-06-18"));
    }

    #[test]
    fn finds_the_request_ids_of_cancellations() {
        let one = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"x"}}"#;
        assert_eq!(cancelled_request_ids(one), vec![RequestId("5".into())]);
        let batch = br#"[{"jsonrpc":"2.0","method":"notifications/progress","params":{}},
                        {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a"}}]"#;
        assert_eq!(
            cancelled_request_ids(batch),
            vec![RequestId("\"a\"".into())]
        );
    }

    #[test]
    fn finds_progress_tokens_in_requests_and_progress_notifications() {
        let req = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":"t1"}}}"#;
        assert_eq!(progress_token(req).as_deref(), Some("\"t1\""));
        let note = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":1}}"#;
        assert_eq!(progress_token(note).as_deref(), Some("7"));
        assert_eq!(
            progress_token(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            None
        );
    }

    #[test]
    fn error_responses_are_valid_json_rpc() {
        let bytes = error_response(
            Some(&RequestId("\"x\"".into())),
            -32603,
            "a \"quoted\" word",
        );
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["id"], "x");
        assert_eq!(v["error"]["message"], "a \"quoted\" word");
        let none = error_response(None, code::PARSE_ERROR, "bad");
        let v: serde_json::Value = serde_json::from_slice(&none).unwrap();
        assert!(v["id"].is_null());
    }
}
