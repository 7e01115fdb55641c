//! Tasks for modern clients in front of task-unaware upstreams: which modern
//! requests the proxy answers itself (a declaring client's `tools/call`, the
//! `tasks/*` methods, `server/discover`), and the per-route state that goes
//! with them — whether the upstream has tasks of its own (then everything
//! passes through untouched) and how many tasks each principal runs.
//!
//! `call.rs` turns a call into a task once it runs past `task_after_ms`;
//! `methods.rs` answers `tasks/get`, `tasks/update` and `tasks/cancel` from
//! the log, so any instance sharing it answers any task; `listen.rs` serves
//! `notifications/tasks` on `subscriptions/listen`. The wire shapes are
//! `task::modern`'s; this module does the I/O.

mod call;
mod listen;
mod methods;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use dashmap::DashMap;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Response};

use super::{Rejection, Route};
use crate::jsonrpc::{self, Kind, RequestId};
use crate::reply::{self, Body};
use crate::task::modern as wire;
use crate::upstream::http::{carries_messages, HttpUpstream, Messages};
use crate::upstream::replicas::Binding;

/// What a route knows of its upstream and its tasks.
#[derive(Default)]
pub struct Tasks {
    /// Whether the upstream lists the extension itself: 0 not known yet,
    /// `UNAWARE` or `NATIVE`.
    native: AtomicU8,
    /// Tasks running here, per principal (the per-principal cap counts them
    /// with the principal's streams).
    running: DashMap<String, usize>,
    /// The 2025-11-25 `tasks/result` requests waiting here.
    pub waiters: crate::dialect::legacy_tasks::Waiters,
}

const UNAWARE: u8 = 1;
const NATIVE: u8 = 2;

impl Tasks {
    fn learn(&self, native: bool) {
        let value = if native { NATIVE } else { UNAWARE };
        self.native.store(value, Ordering::Relaxed);
    }

    /// Whether the upstream has tasks of its own, asking it once
    /// (`server/discover`) when no client's discover taught it yet.
    async fn upstream_is_native(&self, upstream: &HttpUpstream, headers: &HeaderMap) -> bool {
        match self.native.load(Ordering::Relaxed) {
            NATIVE => return true,
            UNAWARE => return false,
            _ => {}
        }
        match discover(upstream, headers).await {
            Some(native) => {
                self.learn(native);
                native
            }
            // Cannot tell now: serve tasks this time, ask again next time.
            None => false,
        }
    }

    fn running(&self, principal: &str) -> usize {
        self.running.get(principal).map_or(0, |n| *n)
    }

    fn started(&self, principal: &str) {
        *self.running.entry(principal.to_owned()).or_default() += 1;
    }

    fn ended(&self, principal: &str) {
        self.running.remove_if_mut(principal, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

/// A modern request, read once.
pub struct Modern<'a> {
    pub parts: &'a Parts,
    pub body: Bytes,
    pub id: RequestId,
    pub method: String,
}

/// Answers a modern request the tasks dialect claims; `None` for one that
/// goes upstream untouched.
pub async fn claim(
    route: &Route,
    upstream: &Arc<HttpUpstream>,
    parts: &Parts,
    body: &Bytes,
) -> Result<Option<Response<Body>>, Rejection> {
    let config = &upstream.config.tasks;
    if !config.enabled {
        return Ok(None);
    }
    let Ok(envelope) = jsonrpc::classify(body) else {
        return Ok(None); // batches and the malformed: the upstream's to judge
    };
    let (Kind::Request, Some(id), Some(method)) = (envelope.kind, envelope.id, envelope.method)
    else {
        return Ok(None);
    };
    let request = Modern {
        parts,
        body: body.clone(),
        id,
        method,
    };
    if request.method == "server/discover" {
        return discover_through(route, upstream, &request).await.map(Some);
    }
    let is_tasks_method = request.method.starts_with("tasks/");
    let listen = match request.method.as_str() {
        "subscriptions/listen" => match listen::Listen::of(&request.body) {
            listen::Listen::Tasks(ids) => Some(ids),
            listen::Listen::Upstream => return Ok(None),
        },
        "tools/call" => None,
        _ if is_tasks_method => None,
        _ => return Ok(None),
    };
    // A call that cannot become a task needs no word from the upstream.
    let plain_call = request.method == "tools/call"
        && config.required_tools.is_empty()
        && !wire::declared(&request.body);
    if plain_call {
        return Ok(None);
    }
    // A native server keeps its own tasks: everything passes through.
    if route
        .tasks
        .upstream_is_native(upstream, &parts.headers)
        .await
    {
        return Ok(None);
    }
    if let Some(ids) = listen {
        return listen::serve(route, &request, ids, config.poll_interval_ms)
            .await
            .map(Some);
    }
    if is_tasks_method {
        check_header(
            &request,
            &crate::upstream::headers::MCP_METHOD,
            &request.method,
        )?;
        return methods::answer(route, &request).await.map(Some);
    }
    call::answer(route, upstream, &request).await
}

/// `server/discover` through the proxy: the upstream's answer with the
/// extension added, unless the upstream lists it (then it is its own).
async fn discover_through(
    route: &Route,
    upstream: &HttpUpstream,
    request: &Modern<'_>,
) -> Result<Response<Body>, Rejection> {
    let parts = request.parts;
    let res = upstream
        .send(
            parts.method.clone(),
            &parts.headers,
            request.body.clone(),
            &Binding::NONE,
        )
        .await?;
    let json = res.status().is_success()
        && crate::upstream::headers::has_media_type(res.headers(), "application/json");
    let (head, incoming) = res.into_parts();
    let headers = crate::upstream::headers::to_client(&head.headers, None);
    if !json {
        let mut out = Response::new(reply::passthrough(incoming));
        *out.status_mut() = head.status;
        *out.headers_mut() = headers;
        return Ok(out);
    }
    let bytes = http_body_util::BodyExt::collect(incoming)
        .await
        .map_err(|e| Rejection::from(crate::upstream::UpstreamError::Broken(e.to_string())))?
        .to_bytes();
    let native = wire::lists_extension(&bytes);
    route.tasks.learn(native);
    let body = match wire::with_extension(&bytes) {
        Some(added) if !native => Bytes::from(added),
        _ => bytes,
    };
    let mut out = reply::json(head.status, body);
    for (name, value) in &headers {
        if name != http::header::CONTENT_LENGTH && name != http::header::CONTENT_TYPE {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    Ok(out)
}

/// Asks the upstream's `server/discover` whether it lists the extension;
/// `None` when it does not say (unreachable, refused, no such method).
async fn discover(upstream: &HttpUpstream, client: &HeaderMap) -> Option<bool> {
    const REVISION: &str = "2026-07-28";
    // A request as the revision wants every one: its version, the client's
    // capabilities (none declared: the proxy asks for itself) and info.
    let body = Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":"mcp-resume-proxy-discover","method":"server/discover","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"{REVISION}","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"mcp-resume-proxy","version":"{}"}}}}}}}}"#,
        env!("CARGO_PKG_VERSION")
    ));
    let mut headers = client.clone();
    for (name, value) in [
        ("mcp-protocol-version", REVISION),
        ("mcp-method", "server/discover"),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    crate::upstream::headers::drop_routing(&mut headers);
    // Unreachable: cannot tell. Reached, but no discover answer (a refusal,
    // an error): it has no tasks to speak of, and is not asked again.
    let res = upstream
        .send(Method::POST, &headers, body, &Binding::NONE)
        .await
        .ok()?;
    if !carries_messages(&res) {
        return Some(false);
    }
    let mut messages = Messages::new(res);
    while let Some(Ok(events)) = messages.next_batch().await {
        if let Some(answer) = events
            .iter()
            .find(|e| !jsonrpc::response_ids(&e.message).is_empty())
        {
            return Some(wire::lists_extension(&answer.message));
        }
    }
    Some(false)
}

/// A routing header (`Mcp-Method`, `Mcp-Name`), checked against what the
/// body says: a mismatch is refused (HTTP 400, -32020); an absent header is
/// let be (SDK clients send no `Mcp-Name` on `tasks/*`).
fn check_header(
    request: &Modern<'_>,
    header: &http::HeaderName,
    body_says: &str,
) -> Result<(), Rejection> {
    let Some(value) = crate::upstream::headers::get_str(&request.parts.headers, header) else {
        return Ok(());
    };
    if header_value(value).as_deref() == Some(body_says) {
        return Ok(());
    }
    Err(Rejection::header_mismatch(
        Some(request.id.clone()),
        header.as_str(),
        body_says,
    ))
}

/// A routing header's text: values that are not plain ASCII travel as
/// `=?base64?…?=`.
fn header_value(value: &str) -> Option<String> {
    use base64::Engine;
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        None => Some(value.to_owned()),
    }
}
