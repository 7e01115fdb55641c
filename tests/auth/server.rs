//! A small authorization server on 127.0.0.1 for the tests: RFC 8414
//! metadata, a JWKS that can be swapped or taken down, and an RFC 7662
//! introspection endpoint that checks the proxy's client credentials. It
//! counts the requests of every path, and stops when dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::task::JoinSet;

pub const CLIENT_ID: &str = "proxy";
pub const CLIENT_SECRET: &str = "s3cret:with/odd chars";

#[derive(Default)]
pub struct State {
    issuer: Mutex<String>,
    jwks: Mutex<Value>,
    /// token → introspection answer; an unknown token is inactive.
    answers: Mutex<HashMap<String, Value>>,
    /// While false, every endpoint answers 503.
    down: AtomicBool,
    hits: Mutex<HashMap<String, usize>>,
}

pub struct AuthServer {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        // The accept loop owns the connections' tasks: aborting it ends all.
        self.task.abort();
    }
}

impl AuthServer {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(State::default());
        *state.issuer.lock().unwrap() = format!("http://{addr}");
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                let state = shared.clone();
                let service = service_fn(move |req| answer(state.clone(), req));
                connections.spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service),
                );
            }
        });
        Self { addr, state, task }
    }

    pub fn issuer(&self) -> String {
        self.state.issuer.lock().unwrap().clone()
    }

    /// What the metadata says the issuer is (another name: a metadata
    /// document speaking for someone else).
    pub fn set_issuer(&self, issuer: &str) {
        *self.state.issuer.lock().unwrap() = issuer.into();
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn publish(&self, keys: &[&super::keys::TestKey]) {
        let keys: Vec<Value> = keys.iter().map(|k| k.jwk()).collect();
        *self.state.jwks.lock().unwrap() = json!({ "keys": keys });
    }

    pub fn answer_for(&self, token: &str, answer: Value) {
        self.state
            .answers
            .lock()
            .unwrap()
            .insert(token.into(), answer);
    }

    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }

    pub fn hits(&self, path: &str) -> usize {
        self.state
            .hits
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

async fn answer(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    *state.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    if state.down.load(Ordering::SeqCst) {
        return Ok(reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": "down"}),
        ));
    }
    let issuer = state.issuer.lock().unwrap().clone();
    let body = match path.as_str() {
        "/.well-known/oauth-authorization-server" => json!({
            "issuer": issuer,
            "jwks_uri": format!("{}/jwks", base(&state)),
            "introspection_endpoint": format!("{}/introspect", base(&state)),
        }),
        "/jwks" => state.jwks.lock().unwrap().clone(),
        "/introspect" => return Ok(introspect(&state, req).await),
        _ => return Ok(reply(StatusCode::NOT_FOUND, json!({}))),
    };
    Ok(reply(StatusCode::OK, body))
}

/// The server's own base URL, whatever its metadata claims the issuer is.
fn base(state: &State) -> String {
    let issuer = state.issuer.lock().unwrap().clone();
    let rest = issuer.trim_start_matches("http://");
    let host = rest.split('/').next().unwrap_or_default();
    format!("http://{host}")
}

async fn introspect(state: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let expected = {
        let enc = |s: &str| mcp_resume_proxy::auth::fetch::form_encode(s);
        let pair = format!("{}:{}", enc(CLIENT_ID), enc(CLIENT_SECRET));
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    };
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == expected.as_bytes());
    let form = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let form = String::from_utf8_lossy(&form).into_owned();
    if !authorized {
        return reply(StatusCode::UNAUTHORIZED, json!({"error": "invalid_client"}));
    }
    let mut token = None;
    let mut hint = None;
    for pair in form.split('&') {
        match pair.split_once('=') {
            Some(("token", value)) => token = Some(percent_decode(value)),
            Some(("token_type_hint", value)) => hint = Some(value.to_owned()),
            _ => {}
        }
    }
    if hint.as_deref() != Some("access_token") {
        return reply(StatusCode::BAD_REQUEST, json!({"error": "invalid_request"}));
    }
    let answers = state.answers.lock().unwrap();
    let answer = token.and_then(|t| answers.get(&t).cloned());
    reply(StatusCode::OK, answer.unwrap_or(json!({"active": false})))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}
