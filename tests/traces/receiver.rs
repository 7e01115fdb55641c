//! An OTLP/HTTP receiver on loopback: it decodes every
//! `ExportTraceServiceRequest` POSTed to `/v1/traces` (protobuf) and keeps
//! its spans, each with the `service.name` of its resource.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::common::LIMIT;

/// One span as received.
#[derive(Clone, Debug)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

impl Received {
    pub fn attr(&self, key: &str) -> Option<String> {
        attr(&self.span.attributes, key)
    }

    pub fn trace_id(&self) -> String {
        hex::encode(&self.span.trace_id)
    }

    pub fn span_id(&self) -> String {
        hex::encode(&self.span.span_id)
    }

    pub fn parent_id(&self) -> String {
        hex::encode(&self.span.parent_span_id)
    }

    pub fn has_event(&self, name: &str) -> bool {
        self.span.events.iter().any(|e| e.name == name)
    }
}

/// A span attribute's value, as text.
pub fn attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

mod hex {
    pub fn encode(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[derive(Default)]
struct Kept {
    spans: Vec<Received>,
    exports: usize,
    /// Every export's body as it arrived, refused ones included.
    bodies: Vec<Bytes>,
    /// The headers of the last export.
    headers: http::HeaderMap,
    /// Exports still to be refused, and with which status (a 503 or a
    /// 429 says `Retry-After: 0`).
    refusals: usize,
    refusal: Option<StatusCode>,
}

pub struct Receiver {
    pub addr: SocketAddr,
    kept: Arc<Mutex<Kept>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("receiver binds");
        let addr = listener.local_addr().expect("an address");
        let kept = Arc::new(Mutex::new(Kept::default()));
        let shared = kept.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let kept = shared.clone();
                let service = hyper::service::service_fn(move |req| take(kept.clone(), req));
                tokio::spawn(async move {
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service);
                    let _ = conn.await;
                });
            }
        });
        Receiver {
            addr,
            kept,
            accepting,
        }
    }

    /// The OTLP/HTTP base URL, as `[tracing] otlp_endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Refuses the next `n` exports with `status` (keeping nothing of
    /// them).
    pub fn refuse(&self, n: usize, status: StatusCode) {
        let mut kept = self.kept.lock().unwrap();
        kept.refusals = n;
        kept.refusal = Some(status);
    }

    /// Every export's body, in the order they arrived (a retry sends the
    /// same bytes again).
    pub fn bodies(&self) -> Vec<Bytes> {
        self.kept.lock().unwrap().bodies.clone()
    }

    /// The headers the last export came with.
    pub fn last_headers(&self) -> http::HeaderMap {
        self.kept.lock().unwrap().headers.clone()
    }

    /// How many export requests arrived.
    pub fn exports(&self) -> usize {
        self.kept.lock().unwrap().exports
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.kept.lock().unwrap().spans.clone()
    }

    /// The first span `wanted` picks, waiting for it (bounded).
    pub async fn span(&self, what: &str, wanted: impl Fn(&Received) -> bool) -> Received {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            if let Some(found) = self.spans().into_iter().find(&wanted) {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what} among {:#?}",
                self.spans()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn take(
    kept: Arc<Mutex<Kept>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let protobuf = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/x-protobuf");
    if req.uri().path() != "/v1/traces" || !protobuf {
        let mut res = Response::new(Full::new(Bytes::new()));
        *res.status_mut() = StatusCode::NOT_FOUND;
        return Ok(res);
    }
    let headers = req.headers().clone();
    let body = req.into_body().collect().await?.to_bytes();
    let export =
        ExportTraceServiceRequest::decode(body.clone()).expect("an ExportTraceServiceRequest");
    let mut kept = kept.lock().unwrap();
    kept.exports += 1;
    kept.bodies.push(body);
    kept.headers = headers;
    if kept.refusals > 0 {
        kept.refusals -= 1;
        let mut res = Response::new(Full::new(Bytes::new()));
        *res.status_mut() = kept.refusal.unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        res.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("0"),
        );
        return Ok(res);
    }
    for resource_spans in export.resource_spans {
        let resource = resource_spans.resource.unwrap_or_default();
        let service = attr(&resource.attributes, "service.name").unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let service = service.clone();
                kept.spans.push(Received { service, span });
            }
        }
    }
    // An empty ExportTraceServiceResponse: every span accepted.
    let mut res = Response::new(Full::new(Bytes::new()));
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(res)
}
