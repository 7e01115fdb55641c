//! A collector that keeps nothing: it answers every OTLP/HTTP export with an
//! empty `ExportTraceServiceResponse` (every span accepted) after reading the
//! body, and counts the exports and their bytes. The `observed` scenario
//! points a traced proxy at it, so that what tracing costs is the proxy's
//! (a span made, batched, encoded and sent) and not a collector's decoding
//! on the same cores: a collector runs elsewhere in a deployment.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

#[derive(Default)]
pub struct Received {
    pub exports: AtomicU64,
    pub bytes: AtomicU64,
}

/// The sink, on the harness' runtime; it stops when dropped.
pub struct OtlpSink {
    pub addr: SocketAddr,
    pub received: Arc<Received>,
    accepting: tokio::task::JoinHandle<()>,
}

impl OtlpSink {
    pub async fn start() -> std::io::Result<OtlpSink> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Received::default());
        let counts = received.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let counts = counts.clone();
                let service = hyper::service::service_fn(move |req| take(counts.clone(), req));
                tokio::spawn(async move {
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service);
                    let _ = conn.await;
                });
            }
        });
        Ok(OtlpSink {
            addr,
            received,
            accepting,
        })
    }

    /// The base URL `[tracing] otlp_endpoint` takes.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn take(
    counts: Arc<Received>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = req.into_body().collect().await?.to_bytes();
    counts.exports.fetch_add(1, Ordering::Relaxed);
    counts.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    let mut res = Response::new(Full::new(Bytes::new()));
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(res)
}
