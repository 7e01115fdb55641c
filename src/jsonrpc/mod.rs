//! JSON-RPC envelope classification over raw bytes.
//!
//! The proxy must forward messages byte for byte, so it never deserializes a
//! message into a typed model and back. It only peeks: is this a request, a
//! notification or a response, what is its `id` (kept as the raw JSON text, so
//! `1` and `"1"` stay different ids), and what is its `method`. `params` and
//! `result` are skipped, never copied. Building error responses is the one
//! place where this module writes JSON.

use std::borrow::Cow;
use std::sync::OnceLock;

use memchr::memmem::Finder;

use std::sync::Arc;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

mod digest;
pub use digest::params_digest;

/// The raw JSON text of a request id (`1`, `"abc"`), compared textually.
/// Shared, not copied: a call's id is held by its stream, the session's
/// in-flight set, the log's index and the access line at once, and a clone
/// per holder was an allocation each.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub Arc<str>);

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
    /// A response carrying `error` rather than `result`.
    pub error: bool,
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

/// The envelope fields of a message, and its params as `P` reads them
/// (`IgnoredAny` when only the envelope matters).
#[derive(Deserialize)]
struct Peek<'a, P> {
    #[serde(borrow)]
    jsonrpc: Option<Text<'a>>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<Text<'a>>,
    /// Present, whatever its value: `"result": null` is a valid result.
    #[serde(default, deserialize_with = "present")]
    result: bool,
    error: Option<IgnoredAny>,
    params: Option<P>,
}

/// A string field read in place from the message when it holds no escapes.
/// (serde reads an `Option<Cow<str>>` into a new `String` every time: the
/// `"2.0"` of every message classified — several per call, one or two per
/// streamed message — was an allocation only to be compared.)
#[derive(Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(d).map(|_| true)
}

/// What routing an upstream message needs, from one parse: its envelope
/// and, for progress, the token (raw JSON) and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Glance {
    pub envelope: Envelope,
    pub progress: Option<Progress>,
}

/// A `notifications/progress`'s token (raw JSON text) and `progress`.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub token: String,
    pub value: Option<f64>,
}

#[derive(Deserialize)]
struct ProgressParams<'a> {
    #[serde(rename = "progressToken", borrow)]
    token: Option<&'a RawValue>,
    #[serde(borrow)]
    progress: Option<&'a RawValue>,
    #[serde(rename = "_meta", borrow)]
    meta: Option<ProgressMeta<'a>>,
}

#[derive(Deserialize)]
struct ProgressMeta<'a> {
    #[serde(rename = "progressToken", borrow)]
    token: Option<&'a RawValue>,
}

/// A byte string looked for in every message on a hot path, with its
/// searcher built once: `memchr::memmem::find` builds one per call, which
/// `perf` put at a third of a microsecond (more than the search itself).
pub struct Needle {
    text: &'static [u8],
    finder: OnceLock<Finder<'static>>,
}

impl Needle {
    pub const fn new(text: &'static [u8]) -> Self {
        Self {
            text,
            finder: OnceLock::new(),
        }
    }

    pub fn found_in(&self, haystack: &[u8]) -> bool {
        let finder = self.finder.get_or_init(|| Finder::new(self.text));
        finder.find(haystack).is_some()
    }
}

static PROGRESS: Needle = Needle::new(b"notifications/progress");
static RESUME_TOKEN: Needle = Needle::new(b"resumeToken");

/// Classifies one message and reads its progress, in one parse (the
/// relay's look at every upstream message).
pub fn glance(bytes: &[u8]) -> Result<Glance, ParseError> {
    // Cheap check first: most messages carry no params worth reading.
    if !PROGRESS.found_in(bytes) {
        return classify(bytes).map(|envelope| Glance {
            envelope,
            progress: None,
        });
    }
    let mut peek: Peek<'_, ProgressParams<'_>> =
        serde_json::from_slice(bytes).map_err(|e| ParseError::Json(e.to_string()))?;
    let params = peek.params.take();
    let envelope = envelope(peek)?;
    let progress = params
        .filter(|_| envelope.is_method("notifications/progress"))
        .and_then(|p| {
            let token = p.token.or(p.meta.and_then(|m| m.token))?;
            Some(Progress {
                token: token.get().to_owned(),
                value: p.progress.and_then(|v| v.get().parse().ok()),
            })
        });
    Ok(Glance { envelope, progress })
}

/// Classifies one message (an object, not an array).
pub fn classify(bytes: &[u8]) -> Result<Envelope, ParseError> {
    let peek: Peek<'_, IgnoredAny> =
        serde_json::from_slice(bytes).map_err(|e| ParseError::Json(e.to_string()))?;
    envelope(peek)
}

fn envelope<P>(peek: Peek<'_, P>) -> Result<Envelope, ParseError> {
    if peek.jsonrpc.as_ref().map(|t| t.0.as_ref()) != Some("2.0") {
        return Err(ParseError::Shape("\"jsonrpc\" must be \"2.0\""));
    }
    // `"id": null` deserializes as a present RawValue "null"; a request with a
    // null id is not a request the proxy can answer, so treat it as absent.
    let id = peek
        .id
        .map(|raw| raw.get())
        .filter(|raw| *raw != "null")
        .map(|raw| RequestId(raw.into()));
    let kind = match (&peek.method, &id) {
        (Some(_), Some(_)) => Kind::Request,
        (Some(_), None) => Kind::Notification,
        (None, _) if peek.result || peek.error.is_some() => Kind::Response,
        (None, _) => return Err(ParseError::Shape("no \"method\", \"result\" or \"error\"")),
    };
    Ok(Envelope {
        kind,
        id,
        error: kind == Kind::Response && peek.error.is_some(),
        method: peek.method.map(|t| t.0.into_owned()),
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

/// The tool a `tools/call` request calls (`params.name`), read in place
/// when it holds no escapes; `None` for any other message.
pub fn tool_name(bytes: &[u8]) -> Option<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        name: Option<Cow<'a, str>>,
    }
    #[derive(Deserialize)]
    struct Call<'a> {
        #[serde(borrow)]
        method: Option<Text<'a>>,
        #[serde(borrow)]
        params: Option<Params<'a>>,
    }
    let call: Call<'_> = serde_json::from_slice(bytes).ok()?;
    if call.method.as_ref().map(|m| m.0.as_ref()) != Some("tools/call") {
        return None;
    }
    call.params?.name
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
        .map(|raw| RequestId(raw.get().into()))
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

/// The token of a `notifications/progress`, or `None` for anything else.
pub fn progress_of(bytes: &[u8]) -> Option<String> {
    // Cheap check first: most entries are not progress.
    if !PROGRESS.found_in(bytes) {
        return None;
    }
    glance(bytes).ok()?.progress.map(|p| p.token)
}

/// Progress tokens of the requests in a POST body.
pub fn request_progress_tokens(bytes: &[u8], body: &Body) -> Vec<Arc<str>> {
    match body {
        Body::Single(_) => progress_token(bytes).into_iter().map(Arc::from).collect(),
        Body::Batch(_) => serde_json::from_slice::<Vec<&RawValue>>(bytes)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|raw| progress_token(raw.get().as_bytes()))
                    .map(Arc::from)
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Whether a request carries a resume token (seeds 000/001), in
/// `params._meta.resumeToken` or at the params root — never read from tool
/// `arguments`.
pub fn resume_token(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(rename = "resumeToken", borrow)]
        resume_token: Option<Cow<'a, str>>,
    }
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(rename = "resumeToken", borrow)]
        resume_token: Option<Cow<'a, str>>,
        #[serde(rename = "_meta", borrow)]
        meta: Option<Meta<'a>>,
    }
    #[derive(Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        params: Option<Params<'a>>,
    }
    if !RESUME_TOKEN.found_in(bytes) {
        return None;
    }
    let request: Request<'_> = serde_json::from_slice(bytes).ok()?;
    let params = request.params?;
    params
        .meta
        .and_then(|m| m.resume_token)
        .or(params.resume_token)
        .map(Cow::into_owned)
}

/// The message with its top-level `id` replaced by `id`, every other byte as
/// it was: a logged response answered under another request's id without
/// re-serializing it. `None` when `bytes` is not an object with an `id`.
pub fn with_id(bytes: &[u8], id: &RequestId) -> Option<bytes::Bytes> {
    let span = top_level_value(bytes, b"id")?;
    let mut out = Vec::with_capacity(bytes.len() + id.as_json().len());
    out.extend_from_slice(&bytes[..span.start]);
    out.extend_from_slice(id.as_json().as_bytes());
    out.extend_from_slice(&bytes[span.end..]);
    Some(out.into())
}

/// Where the value of the top-level `key` of a JSON object sits. A scanner,
/// not a parser: it trusts the bytes to be JSON (they were classified
/// before), and only tracks strings and nesting to skip other values.
fn top_level_value(bytes: &[u8], key: &[u8]) -> Option<std::ops::Range<usize>> {
    let ws = |i: &mut usize| {
        while bytes.get(*i).is_some_and(u8::is_ascii_whitespace) {
            *i += 1;
        }
    };
    // The end of the string starting at `i` (a quote), past its closing quote.
    let string_end = |mut i: usize| -> Option<usize> {
        i += 1;
        loop {
            match bytes.get(i)? {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
    };
    let value_end = |mut i: usize| -> Option<usize> {
        match bytes.get(i)? {
            b'"' => string_end(i),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match bytes.get(i)? {
                        b'"' => i = string_end(i)?,
                        b'{' | b'[' => {
                            depth += 1;
                            i += 1;
                        }
                        b'}' | b']' => {
                            depth -= 1;
                            i += 1;
                            if depth == 0 {
                                return Some(i);
                            }
                        }
                        _ => i += 1,
                    }
                }
            }
            _ => {
                while !matches!(bytes.get(i), None | Some(b',' | b'}' | b']'))
                    && !bytes[i].is_ascii_whitespace()
                {
                    i += 1;
                }
                Some(i)
            }
        }
    };
    let mut i = 0;
    ws(&mut i);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        ws(&mut i);
        if bytes.get(i)? != &b'"' {
            return None;
        }
        let key_end = string_end(i)?;
        let name = &bytes[i + 1..key_end - 1];
        i = key_end;
        ws(&mut i);
        if bytes.get(i)? != &b':' {
            return None;
        }
        i += 1;
        ws(&mut i);
        let start = i;
        i = value_end(i)?;
        if name == key {
            return Some(start..i);
        }
        ws(&mut i);
        match bytes.get(i)? {
            b',' => i += 1,
            _ => return None,
        }
    }
}

/// Standard and MCP-specific JSON-RPC error codes the proxy emits.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// What SDK servers use for transport-level rejections ("Bad Request: …").
    pub const SERVER_ERROR: i64 = -32000;
    /// "Session not found", as the TypeScript SDK answers it.
    pub const SESSION_NOT_FOUND: i64 = -32001;
    pub const METHOD_NOT_FOUND: i64 = -32601;
}

/// A `notifications/cancelled` for request `id`, as the proxy sends it
/// upstream on a client's behalf.
pub fn cancellation(id: &RequestId, reason: &str) -> Vec<u8> {
    let reason = serde_json::Value::String(reason.to_owned());
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{},"reason":{reason}}}}}"#,
        id.as_json()
    )
    .into_bytes()
}

/// A JSON-RPC error response. `id` is `None` for transport errors that belong
/// to no request (the spec's "error response that has no id").
pub fn error_response(id: Option<&RequestId>, code: i64, message: &str) -> Vec<u8> {
    error_response_with_data(id, code, message, None)
}

/// The same, with `data` (raw JSON) when given.
pub fn error_response_with_data(
    id: Option<&RequestId>,
    code: i64,
    message: &str,
    data: Option<&str>,
) -> Vec<u8> {
    let id = id.map(RequestId::as_json).unwrap_or("null");
    let message = serde_json::Value::String(message.to_owned());
    let data = data.map(|d| format!(r#","data":{d}"#)).unwrap_or_default();
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{message}{data}}}}}"#)
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_name_is_that_of_a_tools_call_only() {
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"s\u0065arch","arguments":{}}}"#;
        assert_eq!(tool_name(call).as_deref(), Some("search"));
        let prompt =
            br#"{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"greet"}}"#;
        assert_eq!(tool_name(prompt), None);
        assert_eq!(tool_name(b"not json"), None);
    }

    #[test]
    fn a_glance_reads_the_envelope_and_progress_in_one_parse() {
        let note = glance(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":3.5}}"#).unwrap();
        assert_eq!(note.envelope.kind, Kind::Notification);
        let progress = note.progress.unwrap();
        assert_eq!(
            (progress.token.as_str(), progress.value),
            ("\"t\"", Some(3.5))
        );
        let meta = glance(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"_meta":{"progressToken":7},"progress":1}}"#).unwrap();
        assert_eq!(meta.progress.unwrap().token, "7");
        let answer =
            glance(br#"{"jsonrpc":"2.0","id":4,"result":{"text":"notifications/progress"}}"#)
                .unwrap();
        assert_eq!(answer.envelope.id, Some(RequestId("4".into())));
        assert!(answer.progress.is_none());
    }

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
    fn escaped_envelope_strings_are_read_as_their_text() {
        // Read in place when plain, unescaped into a copy otherwise: the
        // same envelope either way.
        let plain = classify(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#).unwrap();
        let escaped = classify(br#"{"jsonrpc":"2\u002e0","id":1,"method":"tools\/call"}"#).unwrap();
        assert_eq!(escaped, plain);
        assert_eq!(escaped.method.as_deref(), Some("tools/call"));
        assert!(matches!(
            classify(br#"{"jsonrpc":2.0,"id":1,"method":"x"}"#),
            Err(ParseError::Json(_))
        ));
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
    fn params_digests_ignore_key_order_and_meta_but_not_values() {
        let a = params_digest(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":1,"b":2},"_meta":{"progressToken":"p"}}}"#);
        let b = params_digest(br#"{"id":7,"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{"b":2,"a":1},"name":"x"}}"#);
        let c = params_digest(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":1,"b":3}}}"#);
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn a_new_id_is_spliced_in_and_every_other_byte_kept() {
        let logged =
            br#"{"result":{"id":1,"s":"}\"id\":{","a":[{"id":2}]} ,  "id" : 7 ,"jsonrpc":"2.0"}"#;
        let spliced = with_id(logged, &RequestId("\"n-9\"".into())).unwrap();
        assert_eq!(
            &spliced[..],
            &br#"{"result":{"id":1,"s":"}\"id\":{","a":[{"id":2}]} ,  "id" : "n-9" ,"jsonrpc":"2.0"}"#[..]
        );
        let v: serde_json::Value = serde_json::from_slice(&spliced).unwrap();
        assert_eq!(v["id"], "n-9");
        assert_eq!(v["result"]["id"], 1);
        assert!(with_id(br#"{"jsonrpc":"2.0","result":{}}"#, &RequestId("1".into())).is_none());
        assert!(with_id(b"[1]", &RequestId("1".into())).is_none());
    }

    proptest::proptest! {
        /// Whatever the other members hold, only the top-level id changes.
        #[test]
        fn splicing_changes_the_id_and_nothing_else(
            text in ".{0,20}",
            n in proptest::prelude::any::<i64>(),
            nested in proptest::prelude::any::<bool>(),
        ) {
            let result = if nested {
                serde_json::json!({"id": text.clone(), "content": [{"text": text.clone()}]})
            } else {
                serde_json::json!(text.clone())
            };
            let message = serde_json::json!({"jsonrpc": "2.0", "result": result, "id": n});
            let bytes = serde_json::to_vec(&message).unwrap();
            let spliced = with_id(&bytes, &RequestId("\"x\"".into())).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&spliced).unwrap();
            proptest::prop_assert_eq!(&v["id"], "x");
            proptest::prop_assert_eq!(&v["result"], &message["result"]);
        }
    }

    #[test]
    fn cancellations_name_the_request_by_its_raw_id() {
        let bytes = cancellation(&RequestId("\"r-1\"".into()), "abandoned");
        assert_eq!(
            cancelled_request_ids(&bytes),
            vec![RequestId("\"r-1\"".into())]
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
