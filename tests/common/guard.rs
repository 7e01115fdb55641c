//! An OAuth-protected MCP server for the tests: a resource server that
//! stands in front of the demo upstream the way the SDKs' `requireBearerAuth`
//! does, speaking the real wire format of the authorization spec.
//!
//! - Every MCP request needs `Authorization: Bearer <token>` with a token it
//!   knows; without one it answers `401` with `WWW-Authenticate: Bearer
//!   resource_metadata="<its own URL>"`, as servers do.
//! - It serves its protected-resource metadata (path-based and root) naming
//!   its own URL as `resource`, unless told its public URL.
//! - It binds each upstream session to the user whose token created it
//!   (the security guidance's `<user id>:<session id>`): another user's
//!   token on it gets 404; the same user's next token is accepted.
//! - `/token` answers like a token endpoint (for pass-through paths).
//! - It answers CORS preflights as server-everything does.
//!
//! Everything else is forwarded, streaming, to the demo upstream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, hyper::Error>;

/// What the guard knows and what it saw.
#[derive(Default)]
pub struct GuardState {
    /// Token → user.
    pub tokens: HashMap<String, String>,
    /// Upstream session → user who created it.
    pub sessions: HashMap<String, String>,
    /// The URL it names as its resource (its own, unless set).
    pub resource: Option<String>,
    /// Set: a `WWW-Authenticate` of this value instead of the usual one.
    pub challenge: Option<String>,
    /// Set: the metadata body served as it is.
    pub metadata: Option<Vec<u8>>,
    /// Set: the metadata is served at this path only (and named there by
    /// the 401s), not at the well-known ones.
    pub metadata_at: Option<String>,
    /// `ping`s seen (the proxy asks one when a credential changes).
    pub pings: usize,
    /// Takes any user's token on any session, as the TS SDK's example
    /// server does.
    pub sessions_unbound: bool,
    /// Paths of the requests that reached it.
    pub paths: Vec<String>,
}

pub struct Guard {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<GuardState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Guard {
    /// A guard in front of the MCP endpoint at `upstream` (`http://…/mcp`).
    pub async fn start(upstream: String) -> Guard {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind guard");
        let addr = listener.local_addr().expect("guard addr");
        let state = Arc::new(Mutex::new(GuardState::default()));
        let shared = (state.clone(), Arc::new(upstream));
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let (state, upstream) = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (state, upstream) = (state.clone(), upstream.clone());
                        async move { Ok::<_, Infallible>(serve(req, addr, &state, &upstream).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        Guard { addr, state, task }
    }

    /// The MCP endpoint's own URL, named the way SDK servers name themselves.
    pub fn url(&self) -> String {
        format!("http://localhost:{}/mcp", self.addr.port())
    }

    pub fn grant(&self, token: &str, user: &str) {
        let mut s = self.state.lock().unwrap();
        s.tokens.insert(token.into(), user.into());
    }

    pub fn revoke(&self, token: &str) {
        self.state.lock().unwrap().tokens.remove(token);
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut GuardState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut res = Response::new(Full::new(body.into()).map_err(|e| match e {}).boxed());
    *res.status_mut() = status;
    res
}

async fn serve(
    req: Request<Incoming>,
    addr: SocketAddr,
    state: &Mutex<GuardState>,
    upstream: &str,
) -> Response<Body> {
    let own = format!("http://localhost:{}", addr.port());
    let path = req.uri().path().to_owned();
    state.lock().unwrap().paths.push(req.uri().to_string());
    if req.method() == http::Method::OPTIONS {
        return preflight(&req);
    }
    let custom = state.lock().unwrap().metadata_at.clone();
    match &custom {
        Some(at) if path == *at => return metadata(state, &own),
        None if path.starts_with("/.well-known/oauth-protected-resource") => {
            return metadata(state, &own)
        }
        _ => {}
    }
    if path == "/token" {
        let mut res = full(
            StatusCode::OK,
            r#"{"access_token":"t","token_type":"Bearer"}"#,
        );
        res.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        return res;
    }
    if path != "/mcp" {
        return full(StatusCode::NOT_FOUND, "not found");
    }
    let user = bearer(&req).and_then(|t| state.lock().unwrap().tokens.get(&t).cloned());
    let Some(user) = user else {
        return unauthorized(state, &own);
    };
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let unbound = state.lock().unwrap().sessions_unbound;
    if let Some(session) = session.as_ref().filter(|_| !unbound) {
        let owner = state.lock().unwrap().sessions.get(session).cloned();
        if owner.is_some_and(|o| o != user) {
            return full(
                StatusCode::NOT_FOUND,
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#,
            );
        }
    }
    let (mut parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    if body.windows(14).any(|w| w == b"\"method\":\"ping") {
        state.lock().unwrap().pings += 1;
    }
    parts.uri = upstream.parse().unwrap();
    parts.headers.remove("host");
    let forwarded = forward(parts, body).await;
    let res = match forwarded {
        Some(res) => res,
        None => return full(StatusCode::BAD_GATEWAY, "demo upstream unreachable"),
    };
    if let Some(created) = res
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        state
            .lock()
            .unwrap()
            .sessions
            .entry(created.to_owned())
            .or_insert(user);
    }
    res.map(|b| b.boxed())
}

/// Sends the request on to the demo upstream with its body re-wrapped.
/// One connection per request: the answer (often an SSE stream) flows
/// for as long as the demo sends it.
async fn forward(parts: http::request::Parts, body: Bytes) -> Option<Response<Incoming>> {
    let stream = tokio::net::TcpStream::connect(parts.uri.authority()?.as_str())
        .await
        .ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let mut req = Request::from_parts(parts, Full::new(body));
    let authority = req.uri().authority()?.to_string();
    req.headers_mut().insert("host", authority.parse().ok()?);
    *req.uri_mut() = req.uri().path().parse().ok()?;
    sender.send_request(req).await.ok()
}

fn bearer(req: &Request<Incoming>) -> Option<String> {
    let value = req.headers().get("authorization")?.to_str().ok()?;
    value.strip_prefix("Bearer ").map(str::to_owned)
}

fn unauthorized(state: &Mutex<GuardState>, own: &str) -> Response<Body> {
    let (challenge, at) = {
        let s = state.lock().unwrap();
        (s.challenge.clone(), s.metadata_at.clone())
    };
    let at = at.unwrap_or_else(|| "/.well-known/oauth-protected-resource/mcp".into());
    let challenge = challenge.unwrap_or_else(|| {
        format!(
            r#"Bearer error="invalid_token", error_description="No valid token", resource_metadata="{own}{at}""#
        )
    });
    let mut res = full(StatusCode::UNAUTHORIZED, r#"{"error":"invalid_token"}"#);
    res.headers_mut()
        .insert("www-authenticate", challenge.parse().unwrap());
    res
}

fn metadata(state: &Mutex<GuardState>, own: &str) -> Response<Body> {
    let s = state.lock().unwrap();
    let body = s.metadata.clone().unwrap_or_else(|| {
        let resource = s.resource.clone().unwrap_or_else(|| format!("{own}/mcp"));
        format!(
            r#"{{"resource":"{resource}","authorization_servers":["http://localhost:9/"],"bearer_methods_supported":["header"]}}"#
        )
        .into_bytes()
    });
    let mut res = full(StatusCode::OK, body);
    res.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    res
}

/// As server-everything answers a preflight: any origin, the MCP headers.
fn preflight(req: &Request<Incoming>) -> Response<Body> {
    let mut res = full(StatusCode::NO_CONTENT, "");
    let h = res.headers_mut();
    let origin = req
        .headers()
        .get("origin")
        .cloned()
        .unwrap_or_else(|| "*".parse().unwrap());
    h.insert("access-control-allow-origin", origin);
    h.insert(
        "access-control-allow-methods",
        "GET,POST,DELETE".parse().unwrap(),
    );
    h.insert(
        "access-control-allow-headers",
        "content-type,authorization,mcp-session-id,mcp-protocol-version,last-event-id"
            .parse()
            .unwrap(),
    );
    h.insert(
        "access-control-expose-headers",
        "mcp-session-id,last-event-id,mcp-protocol-version"
            .parse()
            .unwrap(),
    );
    res
}
