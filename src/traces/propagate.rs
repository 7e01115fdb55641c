//! W3C trace context across the proxy: the parent a client's
//! `traceparent`/`tracestate` name (read with OpenTelemetry's
//! TraceContext propagator), and the `traceparent` of a span of the
//! proxy's own, written where an upstream reads it — the request's headers
//! (HTTP), or `params._meta.traceparent` of the request (stdio: the MCP
//! semantic conventions' place, as a pipe has no headers).
//!
//! It only reads and writes trace context: it starts no span and decides
//! nothing about a request. Nothing here runs unless tracing is on.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::SpanContext;
use opentelemetry::Context;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::{Map, Value};

use crate::id::hex_into;

pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The context a request's headers continue: the client's span as a remote
/// parent, or an empty context (a new trace) when it names none or an
/// invalid one.
pub fn parent(headers: &HeaderMap) -> Context {
    if !headers.contains_key(TRACEPARENT) {
        return Context::new();
    }
    TraceContextPropagator::new().extract_with_context(&Context::new(), &HeaderExtractor(headers))
}

/// `00-{trace id}-{span id}-{flags}`, the version-0 `traceparent` of `span`.
pub fn traceparent(span: &SpanContext) -> HeaderValue {
    let mut out = [0u8; 55];
    out[..3].copy_from_slice(b"00-");
    hex_into(&span.trace_id().to_bytes(), &mut out[3..35]);
    out[35] = b'-';
    hex_into(&span.span_id().to_bytes(), &mut out[36..52]);
    out[52] = b'-';
    hex_into(&[span.trace_flags().to_u8()], &mut out[53..55]);
    // Hex digits and dashes only: always a valid header value.
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `headers` with `traceparent` replaced by `value` (the client's
/// `tracestate` stays: the proxy adds no vendor entry of its own).
pub fn stamp(headers: &mut HeaderMap, value: &HeaderValue) {
    headers.insert(TRACEPARENT, value.clone());
}

/// A client message with `params._meta.traceparent` set to `value` in each
/// request it carries, or `None` when it carries none that can hold it (a
/// notification, positional params, a `_meta` that is not an object, bytes
/// that are not JSON): those are sent as they came.
pub fn into_meta(message: &[u8], value: &HeaderValue) -> Option<Bytes> {
    let text = value.to_str().ok()?;
    let mut parsed: Value = serde_json::from_slice(message).ok()?;
    let stamped = match &mut parsed {
        // Every request of a batch (no short cut past the first).
        Value::Array(batch) => {
            batch
                .iter_mut()
                .map(|m| meta(m, text))
                .filter(|s| *s)
                .count()
                > 0
        }
        single => meta(single, text),
    };
    if !stamped {
        return None;
    }
    serde_json::to_vec(&parsed).ok().map(Bytes::from)
}

/// Sets `params._meta.traceparent` of one request; `false` when `message`
/// is no request or its params cannot hold it.
fn meta(message: &mut Value, traceparent: &str) -> bool {
    let Some(request) = message.as_object_mut() else {
        return false;
    };
    if !request.contains_key("id") || !request.contains_key("method") {
        return false;
    }
    let params = request
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(params) = params.as_object_mut() else {
        return false;
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return false;
    };
    meta.insert("traceparent".into(), Value::String(traceparent.into()));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

    const CLIENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn span() -> SpanContext {
        SpanContext::new(
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        )
    }

    #[test]
    fn the_client_s_traceparent_is_the_remote_parent() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(CLIENT));
        let cx = parent(&headers);
        let parent = cx.span().span_context().clone();
        assert!(parent.is_remote() && parent.is_sampled());
        assert_eq!(parent.span_id().to_string(), "b7ad6b7169203331");
        let garbled = HeaderMap::from_iter([(TRACEPARENT, HeaderValue::from_static("00-x-y-01"))]);
        assert!(!parent_of(&garbled).is_valid());
        assert!(!parent_of(&HeaderMap::new()).is_valid());
    }

    fn parent_of(headers: &HeaderMap) -> SpanContext {
        parent(headers).span().span_context().clone()
    }

    #[test]
    fn a_span_is_written_as_a_version_0_traceparent() {
        assert_eq!(
            traceparent(&span()),
            "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn every_request_of_a_message_gets_the_traceparent_in_its_meta() {
        let value = traceparent(&span());
        let single = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","_meta":{"progressToken":7}}}"#;
        let out: Value = serde_json::from_slice(&into_meta(single, &value).unwrap()).unwrap();
        assert_eq!(
            out["params"]["_meta"]["traceparent"],
            value.to_str().unwrap()
        );
        assert_eq!(out["params"]["_meta"]["progressToken"], 7);
        assert_eq!(out["params"]["name"], "slow");
        let bare = br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"}]"#;
        let out: Value = serde_json::from_slice(&into_meta(bare, &value).unwrap()).unwrap();
        assert!(out[0]["params"]["_meta"]["traceparent"].is_string());
        assert!(
            out[1].get("params").is_none(),
            "a notification is left alone"
        );
    }

    #[test]
    fn a_message_that_cannot_hold_it_is_sent_as_it_came() {
        let value = traceparent(&span());
        for message in [
            &br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1,2]}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":3}}"#,
            b"not json",
        ] {
            assert_eq!(into_meta(message, &value), None);
        }
    }
}
