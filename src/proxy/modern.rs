//! Modern era (2026-07-28 and later): no sessions, no replay. What the tasks
//! dialect claims (a declaring client's `tools/call`, `tasks/*`,
//! `server/discover`; see [`super::tasks`]) is answered there; everything
//! else goes to the upstream byte for byte with every header (`MCP-Protocol-Version`,
//! `Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`), and the answer streams back
//! unbuffered. Closing the response stream is cancellation in this era, so the
//! upstream body is tied to the client's: when the client goes away, hyper
//! drops the response, the upstream body with it, and the upstream connection
//! closes — which the upstream sees as the cancellation.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use super::{read_body, Rejection, Route};
use crate::access;
use crate::metrics::requests::Method as MethodLabel;
use crate::reply::{self, Body};
use crate::upstream::headers;
use crate::upstream::http::HttpUpstream;
use crate::upstream::replicas::Binding;

pub async fn forward(
    route: &Route,
    upstream: &Arc<HttpUpstream>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Rejection> {
    let (mut parts, body) = req.into_parts();
    let bytes = read_body(body, &route.shared.config).await?;
    note_request(&parts.headers, bytes.len());
    if let Some(answer) = super::tasks::claim(route, upstream, &parts, &bytes).await? {
        return Ok(answer);
    }
    // A stray session id is the upstream's business (the spec tells modern
    // servers to ignore it): pass it through as it came.
    access::trace_into(
        &mut parts.headers,
        crate::traces::method_name(&parts.method),
    );
    let session = headers::get_str(&parts.headers, &headers::SESSION_ID);
    let to = Binding {
        session: session.map(str::to_owned),
        replica: None,
    };
    let res = upstream
        .send(parts.method, &parts.headers, bytes, &to)
        .await?;
    let (head, body) = res.into_parts();
    let mut out = Response::new(reply::passthrough(body));
    *out.status_mut() = head.status;
    *out.headers_mut() = headers::to_client(&head.headers, session);
    Ok(out)
}

/// Notes what a modern request is from the headers that name it
/// (`Mcp-Method`, `Mcp-Name`): the body is passed on unread.
fn note_request(headers: &http::HeaderMap, size: usize) {
    let method = headers::get_str(headers, &headers::MCP_METHOD);
    let name = headers::get_str(headers, &headers::MCP_NAME);
    access::note(|facts| {
        facts.bytes_in = size;
        facts.method = method.map_or(MethodLabel::Other, MethodLabel::of);
        if facts.method == MethodLabel::ToolsCall {
            facts.tool = name.map(Box::from);
        }
    });
}
