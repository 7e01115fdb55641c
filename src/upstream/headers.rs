//! Which HTTP headers cross the proxy, in each direction.
//!
//! End-to-end headers pass unchanged (`Authorization`, `MCP-Protocol-Version`,
//! `Mcp-Method`, `Mcp-Name`, every `Mcp-Param-*`, and anything the proxy does
//! not know — the 2026 spec requires intermediaries to forward unknown
//! `Mcp-Param-*`). Hop-by-hop headers are dropped, as RFC 9110 §7.6.1 says.
//! The session id is the one header the proxy rewrites: clients see the
//! proxy's, upstreams see their own. `Last-Event-ID` is the proxy's own
//! cursor and never reaches an upstream unless the proxy resumes it there.
//!
//! It sits with the upstreams because the HTTP upstream is the lowest of its
//! users (what [`to_upstream`] keeps is what it sends); the routes and the
//! edge read the same names and filters from here. It only reads and filters
//! header maps: it decides nothing about a request and refuses none.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

pub const SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
pub const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
pub const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");
/// 2026-07-28 routing headers, which repeat what the body says.
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn is_hop_by_hop(name: &HeaderName, listed: &[HeaderName]) -> bool {
    HOP_BY_HOP.contains(&name.as_str()) || listed.contains(name)
}

/// Headers named by `Connection` are hop-by-hop too.
fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// The headers of a client request as the upstream should see them.
pub fn to_upstream(client: &HeaderMap, upstream_session: Option<&str>) -> HeaderMap {
    let listed = connection_listed(client);
    let mut out = HeaderMap::with_capacity(client.len());
    for (name, value) in client {
        if is_hop_by_hop(name, &listed)
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == SESSION_ID
            || name == LAST_EVENT_ID
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(id) = upstream_session.and_then(|s| HeaderValue::from_str(s).ok()) {
        out.insert(SESSION_ID, id);
    }
    out
}

/// The headers of an upstream response as the client should see them, when
/// the proxy passes the body through unchanged.
pub fn to_client(upstream: &HeaderMap, proxy_session: Option<&str>) -> HeaderMap {
    let listed = connection_listed(upstream);
    let mut out = HeaderMap::with_capacity(upstream.len());
    for (name, value) in upstream {
        if is_hop_by_hop(name, &listed) || name == SESSION_ID {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(id) = proxy_session.and_then(|s| HeaderValue::from_str(s).ok()) {
        out.insert(SESSION_ID, id);
    }
    out
}

/// Whether an `Accept` header admits `mime` (or `*/*`, or `type/*`).
pub fn accepts(headers: &HeaderMap, mime: &str) -> bool {
    let kind = mime.split('/').next().unwrap_or("");
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|item| item.split(';').next().unwrap_or("").trim())
        .any(|item| {
            item.eq_ignore_ascii_case(mime)
                || item == "*/*"
                || item
                    .strip_suffix("/*")
                    .is_some_and(|t| t.eq_ignore_ascii_case(kind))
        })
}

/// Whether the `Content-Type` is `mime` (lowercase), whatever the case it
/// was sent in and its parameters.
pub fn has_media_type(headers: &HeaderMap, mime: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(mime))
}

/// The client's `Last-Event-ID`, if it sent the header. Bytes that are not
/// text are decoded lossily rather than taken for no header at all: such a
/// value cannot be an id the proxy issued, so it is refused like any other
/// unknown id instead of quietly opening a new stream.
pub fn last_event_id(headers: &HeaderMap) -> Option<std::borrow::Cow<'_, str>> {
    headers
        .get(LAST_EVENT_ID)
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
}

/// Removes a modern request's routing headers (`Mcp-Name`, every
/// `Mcp-Param-*`): for a request the proxy sends on its own, whose body
/// names something else than the client's request did.
pub fn drop_routing(headers: &mut HeaderMap) {
    headers.remove(MCP_NAME);
    let params: Vec<_> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("mcp-param-"))
        .cloned()
        .collect();
    for name in params {
        headers.remove(name);
    }
}

pub fn get_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn end_to_end_headers_reach_the_upstream_and_hop_by_hop_ones_do_not() {
        let client = map(&[
            ("authorization", "Bearer x"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "slow"),
            ("mcp-param-region", "eu"),
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("mcp-session-id", "proxy-session"),
            ("last-event-id", "proxy-cursor"),
            ("host", "proxy:8080"),
        ]);
        let up = to_upstream(&client, Some("upstream-session"));
        for name in [
            "authorization",
            "mcp-protocol-version",
            "mcp-method",
            "mcp-name",
            "mcp-param-region",
        ] {
            assert_eq!(up.get(name), client.get(name), "{name}");
        }
        for name in [
            "connection",
            "x-secret-hop",
            "keep-alive",
            "last-event-id",
            "host",
        ] {
            assert!(up.get(name).is_none(), "{name}");
        }
        assert_eq!(up.get("mcp-session-id").unwrap(), "upstream-session");
    }

    #[test]
    fn clients_see_the_proxy_session_id() {
        let upstream = map(&[
            ("mcp-session-id", "theirs"),
            ("content-type", "text/event-stream"),
        ]);
        let out = to_client(&upstream, Some("ours"));
        assert_eq!(out.get("mcp-session-id").unwrap(), "ours");
        assert_eq!(out.get("content-type").unwrap(), "text/event-stream");
    }

    #[test]
    fn a_last_event_id_that_is_not_text_is_still_a_last_event_id() {
        let mut h = HeaderMap::new();
        h.insert(LAST_EVENT_ID, HeaderValue::from_bytes(b"id\xff").unwrap());
        assert_eq!(last_event_id(&h).as_deref(), Some("id\u{fffd}"));
        assert_eq!(last_event_id(&HeaderMap::new()), None);
    }

    #[test]
    fn a_media_type_matches_whatever_its_case_and_parameters() {
        let json = map(&[("content-type", "Application/JSON; charset=utf-8")]);
        assert!(has_media_type(&json, "application/json"));
        assert!(!has_media_type(&json, "text/event-stream"));
        let sse = map(&[("content-type", " text/event-stream ")]);
        assert!(has_media_type(&sse, "text/event-stream"));
        assert!(!has_media_type(&HeaderMap::new(), "application/json"));
    }

    #[test]
    fn accept_matching_handles_lists_wildcards_and_parameters() {
        let h = map(&[("accept", "application/json, text/event-stream;q=0.9")]);
        assert!(accepts(&h, "text/event-stream"));
        assert!(accepts(&h, "application/json"));
        assert!(accepts(&map(&[("accept", "*/*")]), "text/event-stream"));
        assert!(accepts(&map(&[("accept", "text/*")]), "text/event-stream"));
        assert!(!accepts(
            &map(&[("accept", "application/json")]),
            "text/event-stream"
        ));
    }
}
