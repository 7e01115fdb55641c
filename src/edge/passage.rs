//! Plain forwarding of the discovery and authorization paths
//! ([`super::discovery`] decides which) to an upstream's origin: the
//! client's method, end-to-end headers and body (bounded by `max_body`
//! and the body timeout, like every request), the upstream's answer
//! streamed back. Nothing is logged: these are not MCP messages.
//!
//! One answer is read whole: the protected-resource metadata, whose
//! `resource` names the upstream's own URL and must name the proxy's
//! (RFC 9728 §3.3: a client refuses metadata for another resource than
//! the one it connected to). It is bounded; a larger one is refused rather
//! than passed half-rewritten.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::discovery::Passage;
use super::origin::PublicOrigin;
use super::public_url::PublicUrls;
use crate::proxy::Rejection;
use crate::reply::{self, Body};
use crate::upstream::headers;
use crate::upstream::http::HttpUpstream;
use crate::upstream::UpstreamError;

/// How long an upstream has to answer a discovery or authorization
/// request's head: these are quick by nature, and a client waits on them.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// The largest protected-resource metadata the proxy rewrites (1 MiB);
/// real ones are a few hundred bytes.
const MAX_METADATA: usize = 1024 * 1024;

/// One request on its way to the upstream's origin.
pub struct Forward<'a> {
    pub upstream: &'a HttpUpstream,
    pub urls: &'a PublicUrls,
    pub origin: &'a PublicOrigin,
}

impl Forward<'_> {
    /// Sends the request along `passage` and hands back the upstream's
    /// answer (its metadata rewritten).
    pub async fn send(
        &self,
        passage: &Passage,
        method: Method,
        query: Option<&str>,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Result<Response<Body>, Rejection> {
        let target = |path: &str| match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        };
        let mut res = self
            .once(
                method.clone(),
                &target(&passage.path),
                headers,
                body.clone(),
            )
            .await?;
        if let (StatusCode::NOT_FOUND, Some(root)) = (res.status(), &passage.fallback) {
            res = self.once(method, &target(root), headers, body).await?;
        }
        if passage.metadata && res.status().is_success() {
            return self.metadata(res).await;
        }
        Ok(relayed(res))
    }

    async fn once(
        &self,
        method: Method,
        target: &str,
        headers: &http::HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, Rejection> {
        let sent = self.upstream.send_to(method, target, headers, body);
        match tokio::time::timeout(ANSWER_WITHIN, sent).await {
            Ok(answered) => Ok(answered?),
            Err(_) => Err(UpstreamError::TimedOut("no answer to a discovery request").into()),
        }
    }

    /// The metadata with its `resource` naming the proxy when it named the
    /// upstream; every other byte as the upstream wrote it.
    async fn metadata(&self, res: Response<Incoming>) -> Result<Response<Body>, Rejection> {
        let (head, body) = res.into_parts();
        let bytes = match Limited::new(body, MAX_METADATA).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                tracing::warn!(error = %e, "protected-resource metadata from the upstream refused");
                return Err(Rejection::bad_gateway(
                    "the upstream's protected-resource metadata is too large or unreadable",
                ));
            }
        };
        let bytes = match rewrite_resource(&bytes, |url| self.urls.to_public(url, self.origin)) {
            Some(rewritten) => Bytes::from(rewritten),
            None => bytes,
        };
        let mut out = Response::new(reply::full(bytes));
        *out.status_mut() = head.status;
        *out.headers_mut() = headers::to_client(&head.headers, None);
        out.headers_mut().remove(http::header::CONTENT_LENGTH);
        Ok(out)
    }
}

/// An upstream answer streamed back as it is, but for hop-by-hop headers.
fn relayed(res: Response<Incoming>) -> Response<Body> {
    let (head, body) = res.into_parts();
    let mut out = Response::new(reply::passthrough(body));
    *out.status_mut() = head.status;
    *out.headers_mut() = headers::to_client(&head.headers, None);
    out
}

/// A JSON object with its `resource` string replaced by `map`'s answer:
/// the members in their order, each other value byte for byte. `None` when
/// nothing changes (not an object, no `resource`, or one `map` leaves).
pub fn rewrite_resource(json: &[u8], map: impl Fn(&str) -> Option<String>) -> Option<Vec<u8>> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let members = (&mut de).deserialize_map(Members).ok()?;
    de.end().ok()?;
    let (at, url) = members.iter().enumerate().find_map(|(i, (key, value))| {
        let url: String = serde_json::from_str(value.get()).ok()?;
        (key == "resource").then_some((i, url))
    })?;
    let public = serde_json::to_string(&map(&url)?).ok()?;
    let mut out = Vec::with_capacity(json.len() + 64);
    out.push(b'{');
    for (i, (key, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(serde_json::to_string(key).ok()?.as_bytes());
        out.push(b':');
        let value = if i == at {
            public.as_str()
        } else {
            value.get()
        };
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'}');
    Some(out)
}

/// An object's members in order, values left raw.
struct Members;

impl<'de> Visitor<'de> for Members {
    type Value = Vec<(String, &'de RawValue)>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
            members.push(member);
        }
        Ok(members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(url: &str) -> Option<String> {
        (url == "http://localhost:3920/mcp").then(|| "http://127.0.0.1:3922/mcp".to_owned())
    }

    #[test]
    fn the_resource_is_rewritten_and_every_other_member_kept_in_order() {
        let json = br#"{"resource":"http://localhost:3920/mcp","authorization_servers":["http://localhost:3921/"],"scopes_supported":["mcp:tools"],"resource_name":"x \"y\""}"#;
        let out = rewrite_resource(json, public).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"resource":"http://127.0.0.1:3922/mcp","authorization_servers":["http://localhost:3921/"],"scopes_supported":["mcp:tools"],"resource_name":"x \"y\""}"#
        );
    }

    #[test]
    fn metadata_naming_another_resource_or_malformed_is_left_as_it_is() {
        for json in [
            &br#"{"resource":"https://mcp.example.com/mcp"}"#[..],
            br#"{"resource":42}"#,
            br#"{"authorization_servers":[]}"#,
            br#"["http://localhost:3920/mcp"]"#,
            br#"{"resource":"http://localhost:3920/mcp""#,
            br#"{"resource":"http://localhost:3920/mcp"} trailing"#,
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(rewrite_resource(json, public), None, "{json:?}");
        }
    }
}
