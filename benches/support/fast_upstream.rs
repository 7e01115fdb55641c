//! A minimal, fast legacy MCP Streamable HTTP upstream for the load harness:
//! raw hyper 1 behind the hyper-util auto server, so that what the harness
//! measures is the proxy, not the server behind it.
//!
//! It speaks just enough of the protocol (2025-03-26 … 2025-11-25) for a
//! client session: `initialize` mints an `Mcp-Session-Id` and echoes a
//! supported `protocolVersion`; notifications and responses get 202; `ping`
//! and `tools/list` (one tool, `echo`) answer at once; `GET` opens a
//! standalone SSE stream that stays silent until the client leaves; `DELETE`
//! gets 200. `tools/call` reads its behaviour from the tool arguments, so each
//! scenario of the harness picks it per request:
//!
//! - `{}`: a small result at once, as `application/json`;
//! - `{"delay_ms":D,"progress":N,"interval_us":I,"sse":true}`: a
//!   `text/event-stream` answer whose head goes out at once, then after `D` ms
//!   `N` `notifications/progress` events (`I` µs apart, default back to back),
//!   then the result. Any of `delay_ms`, `progress` or `sse` selects SSE.
//!
//! The hot path parses only the envelope (`id`, `method`) and the tool
//! arguments with borrowed serde structs, and writes every answer with byte
//! appends: no `serde_json::Value` anywhere. Sessions are not checked (a
//! counter mints them): the harness never sends a wrong one.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Revisions this upstream accepts; anything else gets the first one.
const VERSIONS: [&str; 4] = ["2025-06-18", "2025-11-25", "2025-03-26", "2024-11-05"];

/// Events queued toward a slow client before the producer waits: bounded, so
/// 10,000 progress events to a slow reader cost a few KB, not megabytes.
const SSE_QUEUE: usize = 64;

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a str>,
    #[serde(borrow)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, rename = "protocolVersion")]
    protocol_version: Option<&'a str>,
    #[serde(default)]
    arguments: CallArgs,
    #[serde(borrow, rename = "_meta")]
    meta: Option<Meta<'a>>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, rename = "progressToken")]
    progress_token: Option<&'a RawValue>,
}

/// What a `tools/call` should do; see the module docs.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct CallArgs {
    delay_ms: u64,
    progress: u32,
    interval_us: u64,
    sse: bool,
}

static SESSIONS: AtomicU64 = AtomicU64::new(0);

/// Serves until the process ends. Each connection is its own task; HTTP/1.1
/// keep-alive and HTTP/2 both work.
pub async fn serve(listener: TcpListener) {
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            // EMFILE and friends: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let builder = builder.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(handle);
            // Connection errors are the client's business (the harness
            // drops idle streams by closing sockets).
            let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}

async fn handle(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    Ok(match *req.method() {
        Method::POST => post(req).await,
        Method::GET => {
            // A standalone stream: silent until the client goes away.
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(async move { tx.closed().await });
            sse_response(rx)
        }
        Method::DELETE => status(StatusCode::OK),
        _ => status(StatusCode::METHOD_NOT_ALLOWED),
    })
}

async fn post(req: Request<Incoming>) -> Response<Body> {
    let Ok(body) = req.into_body().collect().await else {
        return status(StatusCode::BAD_REQUEST);
    };
    let bytes = body.to_bytes();
    let Ok(msg) = serde_json::from_slice::<Envelope<'_>>(&bytes) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let (Some(id), Some(method)) = (msg.id, msg.method) else {
        // Notifications and responses.
        return status(StatusCode::ACCEPTED);
    };
    let id = id.get();
    match method {
        "initialize" => {
            let want = msg.params.as_ref().and_then(|p| p.protocol_version);
            let version = want.filter(|v| VERSIONS.contains(v)).unwrap_or(VERSIONS[0]);
            let mut out = BytesMut::with_capacity(256);
            open_result(&mut out, id);
            out.put_slice(b"{\"protocolVersion\":\"");
            out.put_slice(version.as_bytes());
            out.put_slice(
                b"\",\"capabilities\":{\"tools\":{}},\"serverInfo\":{\"name\":\"fast-upstream\",\"version\":\"1\"}}}",
            );
            let mut res = json(out.freeze());
            let sid = format!("fast-{}", SESSIONS.fetch_add(1, Ordering::Relaxed));
            if let Ok(value) = HeaderValue::from_str(&sid) {
                res.headers_mut().insert("mcp-session-id", value);
            }
            res
        }
        "tools/call" => {
            let params = msg.params.as_ref();
            let args = params.map(|p| p.arguments).unwrap_or_default();
            if args.delay_ms == 0 && args.progress == 0 && !args.sse {
                return json(call_result(id));
            }
            let token = params
                .and_then(|p| p.meta.as_ref())
                .and_then(|m| m.progress_token)
                .map_or(id, RawValue::get);
            let (tx, rx) = mpsc::channel(SSE_QUEUE);
            tokio::spawn(stream_call(
                tx,
                args,
                Bytes::copy_from_slice(token.as_bytes()),
                call_result(id),
            ));
            sse_response(rx)
        }
        "tools/list" => {
            let mut out = BytesMut::with_capacity(192);
            open_result(&mut out, id);
            out.put_slice(
                b"{\"tools\":[{\"name\":\"echo\",\"description\":\"echo\",\"inputSchema\":{\"type\":\"object\"}}]}}",
            );
            json(out.freeze())
        }
        _ => {
            // ping and anything else: an empty result.
            let mut out = BytesMut::with_capacity(64);
            open_result(&mut out, id);
            out.put_slice(b"{}}");
            json(out.freeze())
        }
    }
}

/// `{"jsonrpc":"2.0","id":<id>,"result":` — the caller closes it.
fn open_result(out: &mut BytesMut, id: &str) {
    out.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.put_slice(id.as_bytes());
    out.put_slice(b",\"result\":");
}

fn call_result(id: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(128);
    open_result(&mut out, id);
    out.put_slice(b"{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],\"isError\":false}}");
    out.freeze()
}

/// Sends the progress events and then the result as SSE events. A client that
/// left makes the sends fail; the call then simply stops.
async fn stream_call(tx: mpsc::Sender<Bytes>, args: CallArgs, token: Bytes, result: Bytes) {
    if args.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
    }
    for n in 1..=args.progress {
        let mut out = BytesMut::with_capacity(160);
        out.put_slice(b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":");
        out.put_slice(&token);
        out.put_slice(b",\"progress\":");
        out.put_slice(n.to_string().as_bytes());
        out.put_slice(b",\"total\":");
        out.put_slice(args.progress.to_string().as_bytes());
        out.put_slice(b"}}\n\n");
        if tx.send(out.freeze()).await.is_err() {
            return;
        }
        if args.interval_us > 0 {
            tokio::time::sleep(Duration::from_micros(args.interval_us)).await;
        }
    }
    let mut out = BytesMut::with_capacity(result.len() + 24);
    out.put_slice(b"event: message\ndata: ");
    out.put_slice(&result);
    out.put_slice(b"\n\n");
    let _ = tx.send(out.freeze()).await;
}

fn status(code: StatusCode) -> Response<Body> {
    let mut res = Response::new(Body::Empty);
    *res.status_mut() = code;
    res
}

fn json(bytes: Bytes) -> Response<Body> {
    let mut res = Response::new(Body::Full(Some(bytes)));
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

fn sse_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut res = Response::new(Body::Events(rx));
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

/// Response bodies: none, one buffer, or SSE events as a producer task sends
/// them (the body ends when the producer drops its sender).
pub enum Body {
    Empty,
    Full(Option<Bytes>),
    Events(mpsc::Receiver<Bytes>),
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Empty => Poll::Ready(None),
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Events(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Full(bytes) => bytes.is_none(),
            Body::Events(_) => false,
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Body::Empty => http_body::SizeHint::with_exact(0),
            Body::Full(Some(b)) => http_body::SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => http_body::SizeHint::with_exact(0),
            Body::Events(_) => http_body::SizeHint::default(),
        }
    }
}
