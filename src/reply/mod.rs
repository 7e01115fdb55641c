//! The bodies and responses the proxy writes to clients: error responses with
//! JSON-RPC bodies, whole bodies, streamed bodies fed by a task, and upstream
//! bodies passed through; and in [`sse`], the framing of an event-stream
//! body, encoded for clients and decoded from upstreams.
//!
//! Nothing here decides *which* answer to give; handlers do.

pub mod sse;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body::Frame;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use tokio::sync::mpsc;

use crate::jsonrpc::{self, RequestId};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> Body {
    full(Bytes::new())
}

/// An upstream body streamed to the client frame by frame.
pub fn passthrough(body: hyper::body::Incoming) -> Body {
    body.map_err(BoxError::from).boxed_unsync()
}

/// A body produced by polling `chunks` from the connection's own task.
pub fn polled<S>(chunks: S) -> Body
where
    S: futures_util::Stream<Item = Bytes> + Send + 'static,
{
    use futures_util::StreamExt;
    http_body_util::StreamBody::new(chunks.map(|b| Ok::<_, BoxError>(Frame::data(b))))
        .boxed_unsync()
}

/// A body whose chunks a task sends through the returned sender; dropping
/// the body (client gone) makes the task's next send fail, which is how the
/// task learns to stop. The body ends when the sender is dropped.
pub fn streamed(depth: usize) -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel(depth);
    (tx, ChannelBody { rx }.boxed_unsync())
}

struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// A transport-level rejection: HTTP status plus a JSON-RPC error body with
/// the given id (or none).
pub fn error(
    status: StatusCode,
    id: Option<&RequestId>,
    code: i64,
    message: &str,
) -> Response<Body> {
    json(status, jsonrpc::error_response(id, code, message))
}

pub fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut res = Response::new(full(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// Headers every SSE response of the proxy carries.
pub fn event_stream(body: Body) -> Response<Body> {
    let mut res = Response::new(body);
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx and friends buffer responses unless told not to.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}
