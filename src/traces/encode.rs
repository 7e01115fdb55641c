//! The body of an OTLP/HTTP export: a batch of finished spans as the
//! protobuf `ExportTraceServiceRequest` of `opentelemetry/proto`, written
//! from the SDK's `SpanData` straight into one buffer.
//!
//! The OTLP crates build the same message as owned structs first (every
//! id, name, key and string value copied into a `String` or `Vec` of its
//! own, about thirty allocations a call with two spans) and then encode
//! them; here nothing is allocated per span, and the result decodes to
//! exactly what theirs does (the test below holds the two side by side).
//! Field numbers are the proto files'; a field at its default value is
//! left out, as any protobuf encoder does.
//!
//! It only encodes: what is sent, and where, is `export.rs`'s.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;
use prost::encoding::{encode_key, encode_varint, WireType};

/// Room kept for a nested message's length before its body is written:
/// five varint bytes hold any length below 32 GiB.
const LEN_ROOM: usize = 5;

/// `SpanFlags`: the flags word says whether the parent was remote.
const CONTEXT_HAS_IS_REMOTE: u32 = 0x100;
const CONTEXT_IS_REMOTE: u32 = 0x200;

/// Appends to `out` the `ExportTraceServiceRequest` of `spans`, all of one
/// resource (`resource`: its attributes), grouped by instrumentation scope
/// in the order each scope first appears.
pub fn request(resource: &[KeyValue], spans: &[SpanData], out: &mut Vec<u8>) {
    // ExportTraceServiceRequest.resource_spans = 1
    nested(out, 1, |out| {
        // ResourceSpans.resource = 1; Resource.attributes = 1
        nested(out, 1, |out| attributes(out, 1, resource));
        let mut scopes: Vec<&InstrumentationScope> = Vec::new();
        for span in spans {
            if !scopes.contains(&&span.instrumentation_scope) {
                scopes.push(&span.instrumentation_scope);
            }
        }
        for scope in scopes {
            // ResourceSpans.scope_spans = 2
            nested(out, 2, |out| scope_spans(out, scope, spans));
        }
    });
}

fn scope_spans(out: &mut Vec<u8>, scope: &InstrumentationScope, spans: &[SpanData]) {
    // ScopeSpans.scope = 1
    nested(out, 1, |out| {
        string(out, 1, scope.name());
        string(out, 2, scope.version().unwrap_or_default());
        for attribute in scope.attributes() {
            nested(out, 3, |out| key_value(out, attribute));
        }
    });
    for span in spans.iter().filter(|s| s.instrumentation_scope == *scope) {
        // ScopeSpans.spans = 2
        nested(out, 2, |out| self::span(out, span));
    }
    // ScopeSpans.schema_url = 3
    string(out, 3, scope.schema_url().unwrap_or_default());
}

fn span(out: &mut Vec<u8>, span: &SpanData) {
    let context = &span.span_context;
    bytes(out, 1, &context.trace_id().to_bytes());
    bytes(out, 2, &context.span_id().to_bytes());
    // An empty state's header is an empty string: nothing allocated.
    string(out, 3, &context.trace_state().header());
    if span.parent_span_id != SpanId::INVALID {
        bytes(out, 4, &span.parent_span_id.to_bytes());
    }
    string(out, 5, &span.name);
    varint(out, 6, kind(&span.span_kind));
    fixed64(out, 7, nanos(span.start_time));
    fixed64(out, 8, nanos(span.end_time));
    attributes(out, 9, &span.attributes);
    varint(out, 10, span.dropped_attributes_count.into());
    for event in span.events.iter() {
        // Span.events = 11
        nested(out, 11, |out| {
            fixed64(out, 1, nanos(event.timestamp));
            string(out, 2, &event.name);
            attributes(out, 3, &event.attributes);
            varint(out, 4, event.dropped_attributes_count.into());
        });
    }
    varint(out, 12, span.events.dropped_count.into());
    for link in span.links.iter() {
        // Span.links = 13
        nested(out, 13, |out| {
            let context = &link.span_context;
            bytes(out, 1, &context.trace_id().to_bytes());
            bytes(out, 2, &context.span_id().to_bytes());
            string(out, 3, &context.trace_state().header());
            attributes(out, 4, &link.attributes);
            varint(out, 5, link.dropped_attributes_count.into());
            let flags = flags(context.is_remote(), context.trace_flags().to_u8());
            fixed32(out, 6, flags);
        });
    }
    varint(out, 14, span.links.dropped_count.into());
    // Span.status = 15, always present (UNSET when nothing was said).
    nested(out, 15, |out| match &span.status {
        Status::Error { description } => {
            string(out, 2, description);
            varint(out, 3, 2);
        }
        Status::Ok => varint(out, 3, 1),
        Status::Unset => {}
    });
    let flags = flags(span.parent_span_is_remote, context.trace_flags().to_u8());
    fixed32(out, 16, flags);
}

fn flags(parent_is_remote: bool, trace_flags: u8) -> u32 {
    let remote = if parent_is_remote {
        CONTEXT_IS_REMOTE
    } else {
        0
    };
    u32::from(trace_flags) | CONTEXT_HAS_IS_REMOTE | remote
}

/// `Span.SpanKind`'s number.
fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Each of `attributes` as a `KeyValue` message in field `tag`.
fn attributes(out: &mut Vec<u8>, tag: u32, attributes: &[KeyValue]) {
    for attribute in attributes {
        nested(out, tag, |out| key_value(out, attribute));
    }
}

fn key_value(out: &mut Vec<u8>, attribute: &KeyValue) {
    string(out, 1, attribute.key.as_str());
    // KeyValue.value = 2: an AnyValue, present even when its value is the
    // default (false, 0, ""), which the oneof then still names.
    nested(out, 2, |out| any_value(out, &attribute.value));
}

fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(s) => string_always(out, 1, s.as_str()),
        Value::Bool(b) => {
            encode_key(2, WireType::Varint, out);
            encode_varint(u64::from(*b), out);
        }
        Value::I64(i) => {
            encode_key(3, WireType::Varint, out);
            encode_varint(*i as u64, out);
        }
        Value::F64(f) => {
            encode_key(4, WireType::SixtyFourBit, out);
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        // AnyValue.array_value = 5; ArrayValue.values = 1
        Value::Array(array) => nested(out, 5, |out| match array {
            Array::Bool(all) => each(out, all, |b| Value::Bool(*b)),
            Array::I64(all) => each(out, all, |i| Value::I64(*i)),
            Array::F64(all) => each(out, all, |f| Value::F64(*f)),
            Array::String(all) => {
                for s in all {
                    nested(out, 1, |out| string_always(out, 1, s.as_str()));
                }
            }
            // A kind of array newer than this encoder: left empty.
            _ => {}
        }),
        // A kind of value newer than this encoder: an empty AnyValue.
        _ => {}
    }
}

fn each<T>(out: &mut Vec<u8>, all: &[T], value: impl Fn(&T) -> Value) {
    for item in all {
        nested(out, 1, |out| any_value(out, &value(item)));
    }
}

/// A length-delimited field `tag` whose body `body` writes: the body is
/// written after room for its length, which is then filled in and the
/// body moved up to meet it.
fn nested(out: &mut Vec<u8>, tag: u32, body: impl FnOnce(&mut Vec<u8>)) {
    encode_key(tag, WireType::LengthDelimited, out);
    let at = out.len();
    out.extend_from_slice(&[0; LEN_ROOM]);
    body(out);
    let len = (out.len() - at - LEN_ROOM) as u64;
    let mut head = [0u8; LEN_ROOM];
    let mut room = &mut head[..];
    encode_varint(len, &mut room);
    let used = LEN_ROOM - room.len();
    out.copy_within(at + LEN_ROOM.., at + used);
    out.truncate(out.len() - (LEN_ROOM - used));
    out[at..at + used].copy_from_slice(&head[..used]);
}

fn string(out: &mut Vec<u8>, tag: u32, s: &str) {
    bytes(out, tag, s.as_bytes());
}

/// A string in a oneof: written even when empty, so that the oneof names
/// it.
fn string_always(out: &mut Vec<u8>, tag: u32, s: &str) {
    length_delimited(out, tag, s.as_bytes());
}

fn bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    if !b.is_empty() {
        length_delimited(out, tag, b);
    }
}

fn length_delimited(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

fn varint(out: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        encode_key(tag, WireType::Varint, out);
        encode_varint(v, out);
    }
}

fn fixed64(out: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        encode_key(tag, WireType::SixtyFourBit, out);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn fixed32(out: &mut Vec<u8>, tag: u32, v: u32) {
    if v != 0 {
        encode_key(tag, WireType::ThirtyTwoBit, out);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use opentelemetry::trace::{Event, Link};
    use opentelemetry::trace::{SpanContext, TraceFlags, TraceId, TraceState};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use opentelemetry_sdk::Resource;
    use prost::Message;

    use super::*;

    fn context(trace: u128, span: u64, remote: bool, state: &str) -> SpanContext {
        let state = if state.is_empty() {
            TraceState::default()
        } else {
            TraceState::from_key_value([("vendor", state)]).unwrap()
        };
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            remote,
            state,
        )
    }

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_790_000_000_000 + ms)
    }

    /// A server span with a remote parent, every kind of attribute, an
    /// event, a link and an error status; a client span with none of
    /// those; and one of a second scope.
    fn spans() -> Vec<SpanData> {
        let ours = InstrumentationScope::builder("mcp-resume-proxy")
            .with_version("0.1.0")
            .build();
        let other = InstrumentationScope::builder("other")
            .with_attributes([KeyValue::new("scope.attr", 1)])
            .with_schema_url("https://opentelemetry.io/schemas/1.30.0")
            .build();
        let mut events = SpanEvents::default();
        events.events = vec![Event::new(
            "mcp.proxy.replay",
            at(3),
            vec![KeyValue::new("mcp.proxy.dialect", "last-event-id")],
            1,
        )];
        events.dropped_count = 3;
        let mut links = SpanLinks::default();
        links.links = vec![Link::new(
            context(0xdef, 0x2, true, ""),
            vec![KeyValue::new("why", "takeover")],
            4,
        )];
        links.dropped_count = 5;
        let server = SpanData {
            span_context: context(0xabc, 0x1, false, "x"),
            parent_span_id: SpanId::from(0x99),
            parent_span_is_remote: true,
            span_kind: SpanKind::Server,
            name: Cow::Owned("POST /mcp".into()),
            start_time: at(0),
            end_time: at(7),
            attributes: vec![
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("http.response.status_code", 200),
                KeyValue::new("empty", ""),
                KeyValue::new("ratio", 0.25),
                KeyValue::new("flag", false),
                KeyValue::new("zero", 0),
                KeyValue::new("ints", Value::Array(Array::I64(vec![1, -2]))),
                KeyValue::new(
                    "names",
                    Value::Array(Array::String(vec!["a".into(), "".into()])),
                ),
                KeyValue::new("bools", Value::Array(Array::Bool(vec![true]))),
                KeyValue::new("floats", Value::Array(Array::F64(vec![1.5]))),
            ],
            dropped_attributes_count: 2,
            events,
            links,
            status: Status::error("boom"),
            instrumentation_scope: ours.clone(),
        };
        let client = SpanData {
            span_context: context(0xabc, 0x2, false, ""),
            parent_span_id: SpanId::from(0x1),
            parent_span_is_remote: false,
            span_kind: SpanKind::Client,
            name: Cow::Borrowed("POST"),
            attributes: vec![KeyValue::new("http.request.method", "POST")],
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            ..server.clone()
        };
        let root = SpanData {
            span_context: context(0x123, 0x3, false, ""),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            status: Status::Ok,
            instrumentation_scope: other,
            ..client.clone()
        };
        let consumer = SpanData {
            span_kind: SpanKind::Consumer,
            instrumentation_scope: ours,
            ..root.clone()
        };
        vec![server, client, root, consumer]
    }

    /// The message sorted where the OTLP crates' order is a hash map's
    /// (the resource's attributes).
    fn settled(mut request: ExportTraceServiceRequest) -> ExportTraceServiceRequest {
        for resource_spans in &mut request.resource_spans {
            if let Some(resource) = resource_spans.resource.as_mut() {
                resource.attributes.sort_by(|a, b| a.key.cmp(&b.key));
            }
        }
        request
    }

    #[test]
    fn a_batch_decodes_to_what_the_otlp_crates_would_have_sent() {
        let resource = Resource::builder()
            .with_service_name("proxy")
            .with_attribute(KeyValue::new("service.version", "0.1.0"))
            .build();
        let attributes: Vec<KeyValue> = resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        let mut out = Vec::new();
        request(&attributes, &spans(), &mut out);
        let ours = ExportTraceServiceRequest::decode(&out[..]).unwrap();
        let theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        assert_eq!(settled(ours), settled(theirs));
    }

    #[test]
    fn an_empty_batch_is_one_resource_with_no_spans() {
        let mut out = Vec::new();
        request(&[KeyValue::new("service.name", "p")], &[], &mut out);
        let decoded = ExportTraceServiceRequest::decode(&out[..]).unwrap();
        assert_eq!(decoded.resource_spans.len(), 1);
        assert!(decoded.resource_spans[0].scope_spans.is_empty());
    }

    #[test]
    fn a_length_that_needs_more_than_one_byte_is_written_whole() {
        let long = "x".repeat(70_000);
        let mut out = Vec::new();
        let mut span = spans().remove(1);
        span.attributes = vec![KeyValue::new("long", long.clone())];
        request(&[], &[span], &mut out);
        let decoded = ExportTraceServiceRequest::decode(&out[..]).unwrap();
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        let value = span.attributes[0].value.as_ref().unwrap().value.as_ref();
        assert!(
            matches!(value, Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) if *s == long)
        );
    }
}
