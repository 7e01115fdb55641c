//! The floor: the least any HTTP reverse proxy written on hyper can do — take
//! each request, forward method, path, headers and body to the upstream over
//! a pooled keep-alive connection, and stream the answer back. No parsing,
//! no log, no sessions.
//!
//! The load harness runs it beside the real proxy so every figure can also be
//! read against what two extra loopback hops and one more process cost on the
//! same machine in the same run: the part of the proxy's overhead that is the
//! proxy's own design, and the part no proxy can avoid here.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{header, HeaderValue, Request, Response, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type Body = UnsyncBoxBody<bytes::Bytes, hyper::Error>;

pub async fn serve(listener: TcpListener, upstream: SocketAddr) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    let authority = HeaderValue::from_str(&upstream.to_string()).expect("socket address");
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let _ = socket.set_nodelay(true);
        let client = client.clone();
        let authority = authority.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let client = client.clone();
                let authority = authority.clone();
                async move { Ok::<_, Infallible>(forward(&client, &authority, req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(socket), service)
                .await;
        });
    }
}

async fn forward(
    client: &Client<HttpConnector, Incoming>,
    authority: &HeaderValue,
    req: Request<Incoming>,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let uri: Uri = format!("http://{}{path}", authority.to_str().unwrap_or_default())
        .parse()
        .expect("upstream uri");
    parts.uri = uri;
    parts.headers.insert(header::HOST, authority.clone());
    match client.request(Request::from_parts(parts, body)).await {
        Ok(res) => res.map(|b| b.boxed_unsync()),
        Err(_) => Response::builder()
            .status(502)
            .body(
                http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .expect("static response"),
    }
}
