//! OpenTelemetry traces: the tracer of one running proxy (never a global
//! one: several proxies may run in one process), its spans, and their
//! export over OTLP/HTTP (protobuf) in batches.
//!
//! Two kinds of span are made here, on the request path's behalf: a
//! [`ServerSpan`] per request, continuing the client's W3C trace context,
//! and an [`Exchange`] (kind client) per exchange with an upstream, whose
//! `traceparent` the upstream is sent ([`propagate`]). Which request a span
//! belongs to, and when it ends, is decided by their owners: the request's
//! visit ([`crate::access`]), a relay ([`crate::relay`]), a task.
//!
//! Off unless `[tracing]` or the `OTEL_*` variables name an endpoint: then
//! no [`Tracer`] exists and no span is made. A finished span is handed to
//! the SDK's batch processor (a bounded queue; a thread of its own exports
//! every `export_delay_ms`); nothing here waits on a collector, and a
//! collector that is down costs dropped spans, never a request.

mod encode;
mod export;
pub mod propagate;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, Span,
};
use opentelemetry_sdk::Resource;

use crate::config::TracingConfig;
use crate::id::{hex, SessionId, StreamId};

/// How long one export may take, answer included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most attributes a server span gets ([`ServerSpan::end`]'s and the
/// two it starts with), and a client span (its own and
/// [`Exchange::answered`]'s).
const SERVER_ATTRIBUTES: usize = 12;
const CLIENT_ATTRIBUTES: usize = 5;

/// How long a shutdown waits for the last spans to go out.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// The tracer of a running proxy, and the provider that exports its spans.
pub struct Tracer {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Tracer {
    /// The tracer `config` asks for, exporting from the runtime this is
    /// called on; `None` when tracing is off.
    pub fn start(config: &TracingConfig) -> anyhow::Result<Option<Arc<Tracer>>> {
        let Some((url, key)) = config.traces_url() else {
            return Ok(None);
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| anyhow::anyhow!("tracing needs a tokio runtime: {e}"))?;
        let headers = config.export_headers()?;
        let exporter = export::Exporter::new(runtime, &url, headers, EXPORT_TIMEOUT)
            .map_err(|e| anyhow::anyhow!("{key} = {url:?}: {e}"))?;
        let mut batch = BatchConfigBuilder::default();
        if let Some(ms) = config.export_delay_ms {
            batch = batch.with_scheduled_delay(Duration::from_millis(ms));
        }
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch.build())
            .build();
        let resource = Resource::builder()
            .with_service_name(config.service_name().to_owned())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let scope = InstrumentationScope::builder("mcp-resume-proxy")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = provider.tracer_with_scope(scope);
        tracing::info!(%url, "exporting traces over OTLP/HTTP");
        Ok(Some(Arc::new(Tracer { provider, tracer })))
    }

    /// Exports what is left and stops the batch thread. That blocks, so it
    /// runs on the blocking pool: the export it waits for runs on this
    /// runtime.
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_WAIT));
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "traces not all exported at shutdown"),
            Err(e) => tracing::warn!(error = %e, "traces not all exported at shutdown"),
        }
    }
}

/// The server span of one request: from its arrival to the end of its
/// answer's body.
pub struct ServerSpan {
    span: Span,
    /// `http.request.method`, which starts its name.
    method: &'static str,
}

/// What a request was, for its server span's attributes.
pub struct Ended<'a> {
    /// The mount that served it (`http.route`).
    pub route: Option<&'a Arc<str>>,
    pub status: u16,
    /// `mcp.method.name`, for a request that named one.
    pub mcp_method: Option<&'static str>,
    /// `gen_ai.tool.name`, of a `tools/call`.
    pub tool: Option<&'a str>,
    pub session: Option<SessionId>,
    pub stream: Option<StreamId>,
    /// The request series' outcome (`mcp.proxy.outcome`).
    pub outcome: &'static str,
    /// The code of a JSON-RPC error the proxy wrote.
    pub rpc_code: Option<i64>,
}

impl Tracer {
    /// The server span of a request that just arrived, child of the span
    /// its `traceparent` names (a new trace without one).
    pub fn server(
        &self,
        method: &http::Method,
        uri: &http::Uri,
        headers: &HeaderMap,
    ) -> ServerSpan {
        let parent = propagate::parent(headers);
        let method = method_name(method);
        // Room for what `end` adds: the span grows its list in place.
        let mut attributes = Vec::with_capacity(SERVER_ATTRIBUTES);
        attributes.push(KeyValue::new("http.request.method", method));
        attributes.push(KeyValue::new("url.path", uri.path().to_owned()));
        let span = self
            .tracer
            .span_builder(method)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        ServerSpan { span, method }
    }

    /// A client span for an exchange with an upstream, child of `parent`.
    pub fn exchange(
        &self,
        parent: &SpanContext,
        name: &'static str,
        attributes: impl IntoIterator<Item = KeyValue>,
    ) -> Exchange {
        let parent = Context::new().with_remote_span_context(parent.clone());
        let mut all = Vec::with_capacity(CLIENT_ATTRIBUTES);
        all.extend(attributes);
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(all)
            .start_with_context(&self.tracer, &parent);
        Exchange::new(span)
    }

    /// A client span for a stream this process took over from one that
    /// died (or from a previous run): a trace of its own, as the context
    /// the stream was started under is not in the log.
    pub fn takeover(&self, stream: StreamId, session: SessionId) -> Exchange {
        let span = self
            .tracer
            .span_builder("GET")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("http.request.method", "GET"),
                KeyValue::new("mcp.stream.id", hex(stream.as_bytes())),
                KeyValue::new("mcp.session.id", short(session)),
            ])
            .start_with_context(&self.tracer, &Context::new());
        let exchange = Exchange::new(span);
        exchange.event("mcp.proxy.takeover", Vec::new());
        exchange
    }
}

impl ServerSpan {
    pub fn context(&self) -> &SpanContext {
        self.span.span_context()
    }

    pub fn event(&mut self, name: &'static str, attributes: Vec<KeyValue>) {
        self.span.add_event(name, attributes);
    }

    /// Ends the span with what the request was (HTTP semantic conventions
    /// for a server span, MCP ones where they exist).
    pub fn end(mut self, ended: &Ended<'_>) {
        let span = &mut self.span;
        if !span.is_recording() {
            return;
        }
        if let Some(route) = ended.route {
            span.update_name(format!("{} {route}", self.method));
            span.set_attribute(KeyValue::new("http.route", Value::from(route.clone())));
        }
        let status = i64::from(ended.status);
        span.set_attribute(KeyValue::new("http.response.status_code", status));
        if let Some(method) = ended.mcp_method {
            span.set_attribute(KeyValue::new("mcp.method.name", method));
        }
        if let Some(tool) = ended.tool {
            span.set_attribute(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
        }
        if let Some(session) = ended.session {
            span.set_attribute(KeyValue::new("mcp.session.id", short(session)));
        }
        if let Some(stream) = ended.stream {
            span.set_attribute(KeyValue::new("mcp.stream.id", hex(stream.as_bytes())));
        }
        span.set_attribute(KeyValue::new("mcp.proxy.outcome", ended.outcome));
        if let Some(code) = ended.rpc_code {
            span.set_attribute(KeyValue::new("rpc.response.status_code", code.to_string()));
        }
        // A server span's status is an error for a 5xx only (a 4xx is the
        // client's doing).
        if ended.status >= 500 {
            span.set_attribute(KeyValue::new("error.type", ended.status.to_string()));
            span.set_status(Status::error(""));
        }
        span.end();
    }
}

/// A client span: one exchange with an upstream, and the `traceparent`
/// the upstream is sent. Shared by a relay's reading and writing halves,
/// hence the lock (taken only to add to it, and at its end).
pub struct Exchange {
    span: Mutex<Span>,
    traceparent: HeaderValue,
}

impl Exchange {
    fn new(span: Span) -> Self {
        let traceparent = propagate::traceparent(span.span_context());
        Self {
            span: Mutex::new(span),
            traceparent,
        }
    }

    /// Writes this span's `traceparent` into `headers`, in place of the
    /// client's.
    pub fn stamp(&self, headers: &mut HeaderMap) {
        propagate::stamp(headers, &self.traceparent);
    }

    /// `message` with this span's `traceparent` in each request's
    /// `params._meta` (for a stdio child); `None`: send it as it is.
    pub fn into_meta(&self, message: &[u8]) -> Option<bytes::Bytes> {
        propagate::into_meta(message, &self.traceparent)
    }

    pub fn event(&self, name: &'static str, attributes: Vec<KeyValue>) {
        self.with(|span| span.add_event(name, attributes));
    }

    pub fn attribute(&self, attribute: KeyValue) {
        self.with(|span| span.set_attribute(attribute));
    }

    /// The upstream answered with `status` (an error from 400 on, as the
    /// HTTP conventions say of a client span).
    pub fn answered(&self, status: u16) {
        self.with(|span| {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            if status >= 400 {
                span.set_attribute(KeyValue::new("error.type", status.to_string()));
                span.set_status(Status::error(""));
            }
        });
    }

    fn with(&self, f: impl FnOnce(&mut Span)) {
        // A span is plain data: one a panic left half-written is still one.
        f(&mut self.span.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// `http.request.method` as the conventions want it: a known method, or
/// `_OTHER`.
pub fn method_name(method: &http::Method) -> &'static str {
    use http::Method as M;
    match *method {
        M::GET => "GET",
        M::POST => "POST",
        M::DELETE => "DELETE",
        M::PUT => "PUT",
        M::PATCH => "PATCH",
        M::HEAD => "HEAD",
        M::OPTIONS => "OPTIONS",
        M::CONNECT => "CONNECT",
        M::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

/// A session id as the access log writes it: its first 8 hex digits.
fn short(session: SessionId) -> String {
    hex(&session.as_bytes()[..4])
}
