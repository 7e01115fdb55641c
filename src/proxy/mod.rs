//! Request handling for one mounted upstream: picks the protocol era of each
//! request and hands it to the legacy (sessions, logged streams, replay) or
//! modern (stateless pass-through) handler. Also owns what both need: the
//! shared state and reading a bounded request body.

mod exchange;
pub mod legacy;
pub mod modern;

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::config::Config;
use crate::jsonrpc::code;
use crate::reply::{self, Body};
use crate::session::{Era, Sessions};
use crate::stream::Log;
use crate::token::Keyring;
use crate::upstream::Upstream;

/// State shared by every route.
pub struct Shared {
    pub config: Config,
    pub log: Arc<Log>,
    pub sessions: Arc<Sessions>,
    pub keyring: Keyring,
}

/// One upstream, mounted at `path`.
pub struct Route {
    pub path: String,
    pub upstream: Upstream,
    pub shared: Arc<Shared>,
}

impl Route {
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        match (Era::of(req.headers()), req.method()) {
            (Era::Modern, _) => match &self.upstream {
                Upstream::Http(http) => modern::forward(self, http, req).await,
                // A stdio server speaks one revision, with a handshake; answer
                // the way legacy HTTP servers do, so dual-era clients fall back.
                Upstream::Stdio(_) => reply::error(
                    StatusCode::BAD_REQUEST,
                    None,
                    code::SERVER_ERROR,
                    "Bad Request: this server needs an initialize handshake (protocol revisions up to 2025-11-25)",
                ),
            },
            (Era::Legacy, &Method::POST) => legacy::post(self, req).await,
            (Era::Legacy, &Method::GET) => legacy::get(self, req).await,
            (Era::Legacy, &Method::DELETE) => legacy::delete(self, req).await,
            _ => {
                let mut res = reply::error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    None,
                    code::SERVER_ERROR,
                    "Method Not Allowed: use POST, GET or DELETE",
                );
                res.headers_mut().insert(
                    http::header::ALLOW,
                    http::HeaderValue::from_static("GET, POST, DELETE"),
                );
                res
            }
        }
    }
}

/// Reads a request body of at most `limit` bytes; a larger one is refused
/// with 413 before it is read whole.
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, Response<Body>> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(reply::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
            code::INVALID_REQUEST,
            &format!("Payload Too Large: request bodies are limited to {limit} bytes"),
        )),
        Err(e) => Err(reply::error(
            StatusCode::BAD_REQUEST,
            None,
            code::INVALID_REQUEST,
            &format!("Bad Request: cannot read body: {e}"),
        )),
    }
}

/// The upstream could not be reached at all.
pub fn bad_gateway(error: &crate::upstream::UpstreamError) -> Response<Body> {
    let status = match error {
        crate::upstream::UpstreamError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    reply::error(status, None, code::SERVER_ERROR, &error.to_string())
}

/// The log failed: nothing can be promised to the client.
pub fn store_failure(error: &crate::store::StoreError) -> Response<Body> {
    tracing::error!(error = %error, "log failure");
    reply::error(
        StatusCode::SERVICE_UNAVAILABLE,
        None,
        code::INTERNAL_ERROR,
        "the proxy's log is unavailable",
    )
}
