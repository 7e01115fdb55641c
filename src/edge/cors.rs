//! Browsers: CORS on every answer, the ones the proxy makes itself from
//! the log included. Two ways, as the operator chooses:
//!
//! - **`[cors]` configured**: the proxy answers preflights itself and
//!   decorates every answer to an allowed origin, the MCP headers allowed
//!   and `Mcp-Session-Id` / `Mcp-Protocol-Version` exposed.
//! - **No `[cors]`**: the proxy is as open as its upstream, no more. A
//!   preflight goes to the upstream (the route forwards it), and an answer
//!   the proxy made itself carries what the upstream grants that origin,
//!   learned from a preflight of the proxy's own, remembered for a while.
//!
//! The `Origin` check against DNS rebinding is not here (it refuses before
//! any of this runs), and nothing here lets a request through that would
//! otherwise be refused: CORS only tells a browser what it may read.

use std::time::{Duration, Instant};

use dashmap::DashMap;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};

pub use crate::config::edge::CorsConfig;
use crate::reply::{self, Body};

/// What a browser may send to an MCP endpoint (2025-03-26 … 2026-07-28).
const REQUEST_HEADERS: &str = "Content-Type, Authorization, Mcp-Session-Id, \
     Mcp-Protocol-Version, Last-Event-ID, Mcp-Method, Mcp-Name";
/// What a browser client must read from an answer: the session id and
/// version, and the challenge that starts the authorization flow.
const EXPOSED: &str = "Mcp-Session-Id, Mcp-Protocol-Version, WWW-Authenticate";
const METHODS: &str = "GET, POST, DELETE, OPTIONS";

/// The answer to a preflight from `origin`: with the CORS headers when
/// the origin is allowed, without them (so the browser refuses) when
/// it is not.
pub fn preflight(cors: &CorsConfig, origin: &str, request: &HeaderMap) -> Response<Body> {
    let mut res = Response::new(reply::empty());
    *res.status_mut() = StatusCode::NO_CONTENT;
    let h = res.headers_mut();
    h.insert(header::VARY, vary_preflight());
    if !cors.allows(origin) {
        return res;
    }
    grant(cors, origin, h);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(METHODS),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        allowed_request_headers(request),
    );
    h.insert(header::ACCESS_CONTROL_MAX_AGE, cors.max_age_secs.into());
    res
}

/// Adds the CORS headers of an actual answer to an allowed origin,
/// replacing whatever the upstream said: the operator's list rules.
pub fn decorate(cors: &CorsConfig, origin: &str, headers: &mut HeaderMap) {
    if !cors.allows(origin) {
        return;
    }
    grant(cors, origin, headers);
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED),
    );
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
}

fn grant(cors: &CorsConfig, origin: &str, headers: &mut HeaderMap) {
    // The origin is echoed, never `*`: `*` is refused by browsers as
    // soon as credentials are allowed, and echoing works either way.
    if let Ok(value) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    if cors.allow_credentials {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
}

fn vary_preflight() -> HeaderValue {
    HeaderValue::from_static(
        "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    )
}

/// The MCP request headers, and any `Mcp-Param-*` the browser asks for
/// (2026-07-28 routing headers are open-ended; a list cannot name them).
fn allowed_request_headers(request: &HeaderMap) -> HeaderValue {
    let params: Vec<&str> = request
        .get_all(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|h| h.len() > 10 && h[..10].eq_ignore_ascii_case("mcp-param-"))
        .filter(|h| HeaderName::from_bytes(h.as_bytes()).is_ok())
        .collect();
    if params.is_empty() {
        return HeaderValue::from_static(REQUEST_HEADERS);
    }
    HeaderValue::from_str(&format!("{REQUEST_HEADERS}, {}", params.join(", ")))
        .unwrap_or_else(|_| HeaderValue::from_static(REQUEST_HEADERS))
}

/// Whether a request is a CORS preflight (not any `OPTIONS`).
pub fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::OPTIONS
        && headers.contains_key(header::ORIGIN)
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// What an upstream grants one origin, as its preflight said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grant {
    allow_origin: Option<HeaderValue>,
    allow_credentials: Option<HeaderValue>,
    expose: Option<HeaderValue>,
}

impl Grant {
    /// Reads an upstream's preflight answer. An upstream that grants the
    /// origin but exposes nothing on its preflight still means its browser
    /// clients to read the session id, so the MCP headers are exposed then.
    pub fn of_preflight(headers: &HeaderMap) -> Self {
        let allow_origin = headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).cloned();
        let expose = headers
            .get(header::ACCESS_CONTROL_EXPOSE_HEADERS)
            .cloned()
            .or_else(|| {
                allow_origin
                    .is_some()
                    .then(|| HeaderValue::from_static(EXPOSED))
            });
        Self {
            allow_origin,
            allow_credentials: headers
                .get(header::ACCESS_CONTROL_ALLOW_CREDENTIALS)
                .cloned(),
            expose,
        }
    }

    /// Adds the grant to an answer that has no CORS headers of its own.
    pub fn apply(&self, headers: &mut HeaderMap) {
        if headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
            return; // the upstream's own answer already says
        }
        let Some(origin) = &self.allow_origin else {
            return;
        };
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        if let Some(credentials) = &self.allow_credentials {
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                credentials.clone(),
            );
        }
        if let Some(expose) = &self.expose {
            headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
        }
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// How long what an upstream granted an origin is believed.
const REMEMBERED: Duration = Duration::from_secs(300);
/// Origins remembered per route: origins are client input, so the memory
/// is bounded; past it the oldest grant is forgotten (and asked again).
const MOST_ORIGINS: usize = 256;

/// Grants learned from one upstream, by origin.
#[derive(Default)]
pub struct Grants(DashMap<String, (Instant, Grant)>);

impl Grants {
    pub fn get(&self, origin: &str) -> Option<Grant> {
        let entry = self.0.get(origin)?;
        (entry.0.elapsed() < REMEMBERED).then(|| entry.1.clone())
    }

    pub fn learn(&self, origin: &str, grant: Grant) {
        if self.0.len() >= MOST_ORIGINS && !self.0.contains_key(origin) {
            let oldest = self.0.iter().min_by_key(|e| e.0).map(|e| e.key().clone());
            if let Some(oldest) = oldest {
                self.0.remove(&oldest);
            }
        }
        self.0.insert(origin.to_owned(), (Instant::now(), grant));
    }
}

/// The headers of the preflight the proxy sends for `origin` to learn what
/// the upstream grants it.
pub fn probe_headers(origin: &HeaderValue) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::ORIGIN, origin.clone());
    h.insert(
        header::ACCESS_CONTROL_REQUEST_METHOD,
        HeaderValue::from_static("POST"),
    );
    h.insert(
        header::ACCESS_CONTROL_REQUEST_HEADERS,
        HeaderValue::from_static("content-type,mcp-session-id,mcp-protocol-version,last-event-id"),
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(origins: &[&str]) -> CorsConfig {
        CorsConfig {
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            ..CorsConfig::default()
        }
    }

    fn preflight_request(headers: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://app.example"),
        );
        h.insert(
            header::ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("POST"),
        );
        h.insert(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_str(headers).unwrap(),
        );
        h
    }

    #[test]
    fn a_preflight_from_an_allowed_origin_allows_the_mcp_headers() {
        let res = preflight(
            &config(&["https://app.example"]),
            "https://app.example",
            &preflight_request("content-type,mcp-session-id"),
        );
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        let h = res.headers();
        assert_eq!(h["access-control-allow-origin"], "https://app.example");
        let allowed = h["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .to_lowercase();
        for name in [
            "content-type",
            "authorization",
            "mcp-session-id",
            "mcp-protocol-version",
            "last-event-id",
        ] {
            assert!(allowed.contains(name), "{name}");
        }
        assert!(h["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("DELETE"));
        assert_eq!(h["access-control-max-age"], "600");
    }

    #[test]
    fn a_preflight_asking_for_routing_params_is_allowed_them() {
        let res = preflight(
            &config(&["*"]),
            "https://app.example",
            &preflight_request("content-type, Mcp-Param-Region"),
        );
        let allowed = res.headers()["access-control-allow-headers"]
            .to_str()
            .unwrap();
        assert!(allowed.ends_with("Mcp-Param-Region"), "{allowed}");
    }

    #[test]
    fn a_preflight_from_another_origin_gets_no_cors_headers() {
        let res = preflight(
            &config(&["https://app.example"]),
            "https://evil.example",
            &preflight_request("content-type"),
        );
        assert!(res.headers().get("access-control-allow-origin").is_none());
        assert!(res.headers().get("access-control-allow-headers").is_none());
    }

    #[test]
    fn answers_to_an_allowed_origin_expose_the_session_id() {
        let mut h = HeaderMap::new();
        decorate(&config(&["*"]), "https://app.example", &mut h);
        assert_eq!(h["access-control-allow-origin"], "https://app.example");
        assert!(h["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .contains("Mcp-Session-Id"));
        let mut none = HeaderMap::new();
        decorate(
            &config(&["https://other.example"]),
            "https://app.example",
            &mut none,
        );
        assert!(none.is_empty());
    }

    #[test]
    fn an_upstreams_grant_is_copied_onto_answers_without_their_own() {
        let mut upstream = HeaderMap::new();
        upstream.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        upstream.insert(
            "access-control-expose-headers",
            HeaderValue::from_static("mcp-session-id,last-event-id,mcp-protocol-version"),
        );
        let grant = Grant::of_preflight(&upstream);
        let mut answer = HeaderMap::new();
        grant.apply(&mut answer);
        assert_eq!(answer["access-control-allow-origin"], "*");
        assert_eq!(
            answer["access-control-expose-headers"],
            "mcp-session-id,last-event-id,mcp-protocol-version"
        );
        // An upstream that grants nothing: nothing is added.
        let mut answer = HeaderMap::new();
        Grant::of_preflight(&HeaderMap::new()).apply(&mut answer);
        assert!(answer.is_empty());
    }

    #[test]
    fn grants_are_bounded_by_origin_count() {
        let grants = Grants::default();
        for i in 0..(MOST_ORIGINS + 10) {
            grants.learn(&format!("https://o{i}.example"), Grant::default());
        }
        assert_eq!(grants.0.len(), MOST_ORIGINS);
        assert!(grants
            .get(&format!("https://o{}.example", MOST_ORIGINS + 9))
            .is_some());
    }

    #[test]
    fn only_origins_or_a_star_are_valid() {
        assert!(config(&["*", "https://a.example:8443"]).validate().is_ok());
        assert!(config(&["a.example"]).validate().is_err());
    }
}
