//! The shapes of the demo upstream's HTTP answers: status, content type,
//! headers and the JSON-RPC error bodies, byte for byte as the SDK servers
//! write them, so that the proxy meets exactly what real servers send.

use http::header::{self, HeaderName};
use http::{HeaderValue, Response, StatusCode};
use serde_json::Value;

use crate::reply::{self, Body};

pub(super) const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");

/// Why a request names no session it may use.
pub(super) enum NoSession {
    Missing,
    Unknown,
}

impl NoSession {
    pub(super) fn response(self) -> Response<Body> {
        match self {
            NoSession::Missing => rpc_error_response(
                StatusCode::BAD_REQUEST,
                -32000,
                "Bad Request: Mcp-Session-Id header is required",
            ),
            NoSession::Unknown => {
                rpc_error_response(StatusCode::NOT_FOUND, -32001, "Session not found")
            }
        }
    }
}

pub(super) fn response(
    status: StatusCode,
    content_type: Option<&'static str>,
    body: Body,
) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Some(content_type) = content_type {
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    resp
}

pub(super) fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    response(status, Some("text/plain; charset=utf-8"), reply::full(text))
}

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    response(
        status,
        Some("application/json"),
        reply::full(body.to_string()),
    )
}

/// A JSON-RPC error with a null id, keys in the order SDK servers write them.
pub(super) fn rpc_error_response(status: StatusCode, code: i64, message: &str) -> Response<Body> {
    let message = Value::from(message);
    let body =
        format!(r#"{{"jsonrpc":"2.0","id":null,"error":{{"code":{code},"message":{message}}}}}"#);
    response(status, Some("application/json"), reply::full(body))
}

pub(super) fn sse_response(body: Body) -> Response<Body> {
    let mut resp = response(StatusCode::OK, Some("text/event-stream"), body);
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

pub(super) fn with_session(mut resp: Response<Body>, session: &str) -> Response<Body> {
    // Our ids are hex, so this cannot fail; the check costs nothing.
    if let Ok(id) = HeaderValue::from_str(session) {
        resp.headers_mut().insert(SESSION_HEADER, id);
    }
    resp
}

/// A tool's result with one text.
pub(super) fn text_result(text: &str) -> Value {
    serde_json::json!({"content": [{"type": "text", "text": text}]})
}

/// A tool's error result (`isError: true`) with one text.
pub(super) fn tool_error(text: &str) -> Value {
    serde_json::json!({"content": [{"type": "text", "text": text}], "isError": true})
}
