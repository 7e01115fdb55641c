//! A visit's spans, with tracing on: its server span, started at arrival
//! as a child of the client's `traceparent` and ended with the visit, and
//! the client spans of the upstream exchanges the request path starts —
//! ended with the visit, or handed to what outlives it (a relay, a task).
//!
//! The request path asks for an exchange's span where it sends upstream,
//! through the visit in scope ([`super::VISIT`]), as it notes facts: no
//! parameter threads a span through the pipeline. With tracing off every
//! function here returns at once, having looked at one thread-local and
//! allocated nothing, and the bytes and headers sent upstream are the
//! client's.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use opentelemetry::KeyValue;

use super::{Facts, Visit, VISIT};
use crate::metrics::Replayed;
use crate::traces::{Ended, Exchange, ServerSpan, Tracer};

/// The spans of one visit.
pub(super) struct Spans {
    server: ServerSpan,
    /// Exchanges that end with the visit.
    exchanges: Vec<Exchange>,
}

impl Spans {
    pub(super) fn start(
        tracer: &Tracer,
        method: &http::Method,
        uri: &http::Uri,
        headers: &HeaderMap,
    ) -> Box<Self> {
        Box::new(Self {
            server: tracer.server(method, uri, headers),
            exchanges: Vec::new(),
        })
    }

    /// Ends the exchanges, then the server span.
    pub(super) fn end(self: Box<Self>, ended: &Ended<'_>) {
        let Spans { server, exchanges } = *self;
        drop(exchanges);
        server.end(ended);
    }
}

impl Visit {
    /// A client span under this visit's server span; `None` with tracing
    /// off.
    fn exchange(
        &self,
        name: &'static str,
        attributes: impl IntoIterator<Item = KeyValue>,
    ) -> Option<Exchange> {
        let tracer = self.access().tracer.as_ref()?;
        let facts = self.facts();
        let spans = facts.spans.as_ref()?;
        Some(tracer.exchange(spans.server.context(), name, attributes))
    }

    /// The span of an HTTP exchange, its `traceparent` written into
    /// `headers` in place of the client's.
    fn http_exchange(&self, headers: &mut HeaderMap, method: &'static str) -> Option<Exchange> {
        self.access().tracer.as_ref()?;
        let exchange = self.exchange(method, [KeyValue::new("http.request.method", method)])?;
        exchange.stamp(headers);
        Some(exchange)
    }

    fn keep(&self, exchange: Exchange) {
        self.note(|facts: &mut Facts| {
            if let Some(spans) = facts.spans.as_mut() {
                spans.exchanges.push(exchange);
            }
        });
    }
}

/// The span of an HTTP exchange that outlives the request (a relay or a
/// task owns it, and ends it when it drops it), its `traceparent` written
/// into `headers` in place of the client's. `None` with tracing off, or
/// outside a request.
pub fn exchange(headers: &mut HeaderMap, method: &'static str) -> Option<Box<Exchange>> {
    let made = VISIT.try_with(|visit| visit.http_exchange(headers, method));
    made.ok().flatten().map(Box::new)
}

/// As [`exchange`], on headers shared with others: copied (for the
/// `traceparent`) only when a span is made, never with tracing off.
pub fn exchange_shared(
    headers: &mut Arc<HeaderMap>,
    method: &'static str,
) -> Option<Box<Exchange>> {
    let made = VISIT.try_with(|visit| {
        visit.access().tracer.as_ref()?;
        visit.http_exchange(Arc::make_mut(headers), method)
    });
    made.ok().flatten().map(Box::new)
}

/// The headers to send upstream for an exchange that ends with the request:
/// the client's as they are with tracing off, else a copy carrying the
/// `traceparent` of the exchange's span.
pub fn traced<'a>(headers: &'a HeaderMap, method: &'static str) -> Cow<'a, HeaderMap> {
    let copied = VISIT.try_with(|visit| {
        visit.access().tracer.as_ref()?;
        let mut copy = headers.clone();
        visit.keep(visit.http_exchange(&mut copy, method)?);
        Some(copy)
    });
    match copied {
        Ok(Some(copy)) => Cow::Owned(copy),
        _ => Cow::Borrowed(headers),
    }
}

/// As [`traced`], on headers the caller owns.
pub fn trace_into(headers: &mut HeaderMap, method: &'static str) {
    let _ = VISIT.try_with(|visit| {
        if let Some(exchange) = visit.http_exchange(headers, method) {
            visit.keep(exchange);
        }
    });
}

/// A request for a stdio child, with the `traceparent` of its exchange's
/// span (kind client, named by the MCP method, ended with the request) in
/// each request's `params._meta`; `None`: send it as it is (always, with
/// tracing off).
pub fn traced_message(message: &[u8]) -> Option<Bytes> {
    let stamped = VISIT.try_with(|visit| {
        visit.access().tracer.as_ref()?;
        let method = visit.facts().method.as_str();
        let exchange = visit.exchange(
            method,
            [
                KeyValue::new("mcp.method.name", method),
                KeyValue::new("network.transport", "pipe"),
            ],
        )?;
        let stamped = exchange.into_meta(message);
        visit.keep(exchange);
        stamped
    });
    stamped.ok().flatten()
}

/// A client came back for a stream with `dialect`: noted, and an event on
/// the request's server span.
pub fn note_replayed(dialect: Replayed) {
    let _ = VISIT.try_with(|visit| {
        visit.note(|facts| {
            facts.resumed = Some(dialect);
            if let Some(spans) = facts.spans.as_mut() {
                let attributes = vec![KeyValue::new("mcp.proxy.dialect", dialect.as_str())];
                spans.server.event("mcp.proxy.replay", attributes);
            }
        });
    });
}
