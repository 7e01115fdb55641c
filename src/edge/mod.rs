//! The edge: what is settled about a request before a route sees it, and
//! what every answer carries on its way out.
//!
//! In: where the request came from and the public URL its client used
//! ([`origin`]); the `Host` check against DNS rebinding, done on the name
//! the client asked for; browsers' preflights ([`cors`]); and the paths the
//! authorization spec routes through a server's origin, which go to an
//! upstream as plain HTTP ([`discovery`] decides, [`passage`] forwards).
//! Out: the upstream's own URL replaced by the proxy's public one where a
//! client reads it ([`public_url`]: `WWW-Authenticate`'s
//! `resource_metadata`, `Location`), and CORS headers on every answer,
//! the ones the proxy makes itself from the log included.
//!
//! The edge knows routes only as mounts with an upstream URL: sessions,
//! streams and the log are the routes' business, and nothing here reads
//! or writes a message body but the protected-resource metadata.

pub mod cors;
pub mod discovery;
pub mod origin;
pub mod passage;
pub mod public_url;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};

use self::cors::{CorsConfig, Grant, Grants};
use self::discovery::{MountView, Passage};
use self::origin::{Arrival, Origins, PublicOrigin, TrustedProxies};
use self::public_url::PublicUrls;
use crate::config::Config;
use crate::proxy::OwnChallenge;
use crate::reply::Body;
use crate::upstream::http::HttpUpstream;

/// One mounted upstream as the edge sees it.
pub struct Mount {
    /// The proxy path, without a trailing slash.
    pub path: String,
    /// `None` for a stdio upstream: no origin to forward to.
    pub urls: Option<PublicUrls>,
    passthrough: Vec<String>,
    /// What the upstream grants browsers, by origin (no `[cors]`).
    grants: Grants,
    /// Where the upstream keeps its protected-resource metadata when its
    /// `401`s name a path of its own (learned from them).
    metadata_path: std::sync::Mutex<Option<String>>,
}

/// The edge of one proxy, built once at start-up.
pub struct Edge {
    pub origins: Origins,
    pub cors: Option<CorsConfig>,
    pub mounts: Vec<Mount>,
    /// Names clients may use besides localhost ones: `allowed_hosts` and
    /// the hosts of every configured `public_url`.
    allowed_hosts: Vec<String>,
    /// Origins that pass the `Origin` check: `allowed_origins` and the
    /// `[cors]` list (an origin allowed to read answers may send requests).
    allowed_origins: Vec<String>,
}

impl Edge {
    pub fn new(config: &Config) -> Result<Self, String> {
        let trusted = TrustedProxies::parse(&config.trusted_proxies)?;
        let configured = config.public_url.as_deref().map(|url| {
            PublicOrigin::parse(url).ok_or_else(|| format!("public_url = {url:?} is not an origin"))
        });
        let origins = Origins {
            configured: configured.transpose()?.map(std::sync::Arc::new),
            trusted,
        };
        let mounts: Vec<Mount> = config
            .upstream
            .iter()
            .map(|up| {
                let path = up.path.trim_end_matches('/').to_owned();
                // Replicas serve one path; the first names their origin.
                let urls = up.endpoints().first().and_then(|url| {
                    PublicUrls::new(url, &path, up.public_url.as_deref(), &up.passthrough)
                });
                Mount {
                    path,
                    urls,
                    passthrough: up.passthrough.clone(),
                    grants: Grants::default(),
                    metadata_path: Default::default(),
                }
            })
            .collect();
        let public_hosts = config
            .public_url
            .iter()
            .chain(config.upstream.iter().filter_map(|u| u.public_url.as_ref()))
            .filter_map(|url| url.parse::<http::Uri>().ok())
            .filter_map(|uri| uri.authority().map(|a| a.as_str().to_owned()));
        let allowed_hosts = config
            .allowed_hosts
            .iter()
            .cloned()
            .chain(public_hosts)
            .collect();
        let cors_origins = config
            .cors
            .iter()
            .flat_map(|c| c.allowed_origins.iter().cloned());
        let allowed_origins = config
            .allowed_origins
            .iter()
            .cloned()
            .chain(cors_origins)
            .collect();
        Ok(Self {
            origins,
            cors: config.cors.clone(),
            mounts,
            allowed_hosts,
            allowed_origins,
        })
    }

    /// DNS-rebinding protection, on the name the client asked for: on a
    /// loopback listener only localhost names and the configured ones pass,
    /// and whatever a trusted ingress forwarded (a browser cannot send
    /// `X-Forwarded-Host` without a preflight, which the `Origin` check
    /// refuses for a foreign page).
    pub fn host_allowed(&self, arrival: &Arrival, loopback_listener: bool) -> bool {
        if (self.allowed_hosts.is_empty() && !loopback_listener) || arrival.host_forwarded {
            return true;
        }
        match arrival.host() {
            Some(host) => host_allowed(host, &self.allowed_hosts),
            // HTTP/2 carries the authority in the URI, not a Host header.
            None => true,
        }
    }

    /// Whether a browser's `Origin` may make requests here.
    pub fn origin_allowed(&self, origin: &HeaderValue) -> bool {
        origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, &self.allowed_origins))
    }

    /// Where a discovery or pass-through path goes, if it is one.
    pub fn passage(&self, path: &str) -> Option<Passage> {
        let views: Vec<MountView<'_>> = self
            .mounts
            .iter()
            .map(|m| MountView {
                mount: &m.path,
                upstream_path: m.urls.as_ref().map(PublicUrls::upstream_path),
                passthrough: &m.passthrough,
            })
            .collect();
        discovery::find(path, &views)
    }

    /// What every answer carries out: the public URL in place of the
    /// upstream's, and CORS for a browser. `route` is the mount the request
    /// reached (through its path or a passage), `upstream` its HTTP
    /// upstream, if any.
    pub async fn outgoing(
        &self,
        res: &mut Response<Body>,
        route: Option<(&Mount, Option<&HttpUpstream>)>,
        arrival: &Arrival,
        origin: Option<&HeaderValue>,
    ) {
        if let Some((mount, urls)) = route.and_then(|(m, _)| Some((m, m.urls.as_ref()?))) {
            let status = res.status();
            let own = res.extensions().get::<OwnChallenge>().is_some();
            let rewrites = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
                || res.headers().contains_key(header::LOCATION);
            // Most answers name no URL: the public origin is worked out
            // only for those that do.
            let public = (rewrites || own).then(|| arrival.origin());
            if let Some(public) = &public {
                let learned = rewrite_headers(res.headers_mut(), status, urls, public);
                if let Some(path) = learned {
                    mount.learn_metadata_path(path);
                }
                if own {
                    point_to_metadata(res.headers_mut(), urls, public);
                }
            }
            if let (Some(public), false, StatusCode::UNAUTHORIZED, true) =
                (&public, own, status, arrival.credentialed)
            {
                // The operator's first question when a client that works
                // direct fails through the proxy.
                tracing::info!(
                    endpoint = %urls.endpoint(public),
                    "the upstream refused a token with 401; if it checks a token's audience \
                     against its own URL, tell it the public one (tokens are issued for the URL \
                     clients use)"
                );
            }
        }
        let Some(origin) = origin else { return };
        match (&self.cors, route) {
            (Some(cors), _) => {
                if let Ok(origin) = origin.to_str() {
                    cors::decorate(cors, origin, res.headers_mut());
                }
            }
            (None, Some((mount, Some(upstream)))) => {
                if !res
                    .headers()
                    .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
                {
                    let grant = mount.grant(upstream, origin).await;
                    grant.apply(res.headers_mut());
                }
            }
            (None, _) => {}
        }
    }
}

impl Mount {
    /// What the upstream grants `origin`: remembered, or asked with a
    /// preflight of the proxy's own (one per origin while remembered).
    async fn grant(&self, upstream: &HttpUpstream, origin: &HeaderValue) -> Grant {
        let Ok(text) = origin.to_str() else {
            return Grant::default();
        };
        if let Some(grant) = self.grants.get(text) {
            return grant;
        }
        let path = self.urls.as_ref().map_or("/", PublicUrls::upstream_path);
        let probe = cors::probe_headers(origin);
        let asked = upstream.send_to(Method::OPTIONS, path, &probe, bytes::Bytes::new());
        let grant = match tokio::time::timeout(std::time::Duration::from_secs(10), asked).await {
            Ok(Ok(res)) => Grant::of_preflight(res.headers()),
            // Not remembered: the next request asks again.
            _ => return Grant::default(),
        };
        self.grants.learn(text, grant.clone());
        grant
    }

    /// Remembers where the upstream keeps its metadata (its `401` said).
    fn learn_metadata_path(&self, path: String) {
        let mut known = self.metadata_path.lock().unwrap_or_else(|p| p.into_inner());
        if known.as_deref() != Some(path.as_str()) {
            *known = Some(path);
        }
    }

    /// Where to fetch the upstream's metadata for `passage`: a path its
    /// `401`s named first, then the well-known one.
    pub fn metadata_passage(&self, passage: Passage) -> Passage {
        let known = self
            .metadata_path
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match known {
            Some(path) if passage.metadata => Passage {
                fallback: Some(passage.path),
                path,
                ..passage
            },
            _ => passage,
        }
    }

    /// Learns from a preflight the upstream answered for a browser.
    pub fn learn(&self, origin: &HeaderValue, answer: &HeaderMap) {
        if let Ok(text) = origin.to_str() {
            self.grants.learn(text, Grant::of_preflight(answer));
        }
    }
}

/// `resource_metadata` in a `401`/`403`'s challenges and a `Location`
/// that name the upstream name the proxy instead.
fn rewrite_headers(
    h: &mut HeaderMap,
    status: StatusCode,
    urls: &PublicUrls,
    origin: &PublicOrigin,
) -> Option<String> {
    let mut learned = None;
    if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        let challenges: Vec<HeaderValue> = h
            .get_all(header::WWW_AUTHENTICATE)
            .iter()
            .map(|v| {
                let rewritten = v
                    .to_str()
                    .ok()
                    .and_then(|t| urls.www_authenticate(t, origin));
                let rewritten = rewritten.and_then(|c| {
                    let value = HeaderValue::from_str(&c.value).ok()?;
                    learned = learned.take().or(c.metadata_path);
                    Some(value)
                });
                rewritten.unwrap_or_else(|| v.clone())
            })
            .collect();
        if !challenges.is_empty() {
            h.remove(header::WWW_AUTHENTICATE);
            for value in challenges {
                h.append(header::WWW_AUTHENTICATE, value);
            }
        }
    }
    let location = h
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|text| urls.to_public(text, origin))
        .and_then(|new| HeaderValue::from_str(&new).ok());
    if let Some(location) = location {
        h.insert(header::LOCATION, location);
    }
    learned
}

/// A challenge the proxy made itself names where the client learns to
/// authorize: the upstream's metadata, through the proxy (RFC 9728 §5.1).
fn point_to_metadata(h: &mut HeaderMap, urls: &PublicUrls, origin: &PublicOrigin) {
    let Some(challenge) = h
        .get(header::WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
    else {
        return;
    };
    let separator = if challenge.contains('=') { "," } else { "" };
    let pointed = format!(
        "{challenge}{separator} resource_metadata=\"{}\"",
        urls.metadata(origin)
    );
    if let Ok(value) = HeaderValue::from_str(&pointed) {
        h.insert(header::WWW_AUTHENTICATE, value);
    }
}

/// Localhost hosts (any port) are always allowed; others only when listed,
/// as `host` (any port) or `host:port`.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    // A slice of `host` but for a bracket left open (read as if closed).
    let name: std::borrow::Cow<'_, str> = match host.strip_prefix('[') {
        Some(v6) => match v6.find(']') {
            Some(end) => host[..end + 2].into(),
            None => format!("[{v6}]").into(),
        },
        None => host.split(':').next().unwrap_or_default().into(),
    };
    matches!(name.as_ref(), "localhost" | "127.0.0.1" | "[::1]")
        || allowed
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(&name))
}

/// Localhost origins are always allowed; others only when configured.
pub fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    if allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Ok(uri) = origin.parse::<http::Uri>() else {
        return false;
    };
    matches!(uri.scheme_str(), Some("http" | "https"))
        && matches!(
            uri.host(),
            Some("localhost" | "127.0.0.1" | "[::1]" | "::1")
        )
}

#[cfg(test)]
mod tests {
    use super::origin::Peer;
    use super::*;

    #[test]
    fn localhost_origins_are_allowed_by_default() {
        for o in [
            "http://localhost",
            "http://localhost:3000",
            "https://127.0.0.1:8443",
            "http://[::1]:8080",
        ] {
            assert!(origin_allowed(o, &[]), "{o}");
        }
    }

    #[test]
    fn only_localhost_hosts_pass_unless_configured() {
        for h in ["localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080"] {
            assert!(host_allowed(h, &[]), "{h}");
        }
        assert!(!host_allowed("evil.example", &[]));
        assert!(!host_allowed("evil.example:8080", &[]));
        let allowed = vec!["mcp.example.com".to_owned()];
        assert!(host_allowed("mcp.example.com:443", &allowed));
        assert!(host_allowed("anything", &["*".to_owned()]));
    }

    #[test]
    fn an_ipv6_host_is_named_by_its_brackets_even_left_open() {
        assert!(host_allowed("[::1]", &[]));
        assert!(host_allowed("[::1", &[]));
        assert!(!host_allowed("[::2]:80", &[]));
        assert!(host_allowed("[fe80::1]:80", &["[fe80::1]".to_owned()]));
    }

    #[test]
    fn foreign_origins_need_configuration() {
        assert!(!origin_allowed("https://evil.example", &[]));
        assert!(!origin_allowed("null", &[]));
        assert!(!origin_allowed("http://localhost.evil.example", &[]));
        let allowed = vec!["https://app.example.com".to_owned()];
        assert!(origin_allowed("https://app.example.com", &allowed));
        assert!(origin_allowed("https://evil.example", &["*".to_owned()]));
    }

    #[test]
    fn a_public_url_is_an_allowed_host() {
        let config = Config {
            public_url: Some("https://mcp.example.com".into()),
            upstream: vec![crate::config::UpstreamConfig::new("http://127.0.0.1:1/mcp")],
            ..Config::default()
        };
        let edge = Edge::new(&config).unwrap();
        let arriving = |host: &str| {
            let req = http::Request::builder()
                .header("host", host)
                .body(())
                .unwrap();
            edge.origins.arrival(&req.into_parts().0, Peer::local())
        };
        assert!(edge.host_allowed(&arriving("mcp.example.com"), true));
        let other = arriving("mcp_resume_proxy");
        assert!(!edge.host_allowed(&other, true));
    }
}
