//! Where a request came from and which URL the client used to reach the
//! proxy: its connection's peer and scheme, the public origin (configured,
//! taken from a trusted ingress's forwarding headers, or read off the
//! request itself), and the `Host` the DNS-rebinding check looks at.
//!
//! Forwarding headers are believed only from the peers listed in
//! `trusted_proxies`: from anyone else they are ignored, so a client cannot
//! name the URL that the proxy writes into what other clients read. This
//! module only reads; it never changes a request.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{HeaderMap, HeaderValue, HOST};
use http::uri::Authority;
use ipnet::IpNet;

/// The connection a request arrived on.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// Whether the proxy terminated TLS on it.
    pub tls: bool,
}

impl Peer {
    /// A peer on loopback over plain HTTP (for tests and embedding).
    pub fn local() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
        }
    }
}

/// The scheme and authority a client used: `https://mcp.example.com`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicOrigin {
    pub scheme: String,
    pub authority: String,
}

impl PublicOrigin {
    /// `scheme://authority`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }

    /// Reads an origin (`https://host[:port]`, a path is not allowed).
    pub fn parse(text: &str) -> Option<Self> {
        let (scheme, authority) = crate::config::edge::origin_parts(text)?;
        Some(Self { scheme, authority })
    }
}

/// The peers whose forwarding headers are believed (`trusted_proxies`).
#[derive(Clone, Debug, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Reads `["127.0.0.1", "10.0.0.0/8", "::1"]`; names the entry that is
    /// neither an address nor a network.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        crate::config::edge::trusted_networks(entries).map(Self)
    }

    pub fn trusts(&self, peer: IpAddr) -> bool {
        // An IPv4 peer on a dual-stack socket shows up as ::ffff:a.b.c.d.
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|net| net.contains(&peer))
    }
}

/// What a trusted ingress says the client used.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Forwarded {
    pub proto: Option<String>,
    pub host: Option<String>,
}

impl Forwarded {
    /// The element the nearest proxy added (the last one): earlier ones may
    /// come from the client itself. `Forwarded` (RFC 7239) wins over the
    /// `X-Forwarded-*` pair; values that are not a scheme or an authority
    /// are ignored.
    pub fn read(headers: &HeaderMap) -> Self {
        let mut found = Self::default();
        if let Some(last) = last_element(headers, "forwarded") {
            for pair in last.split(';') {
                let Some((key, value)) = pair.split_once('=') else {
                    continue;
                };
                let value = value.trim().trim_matches('"');
                match key.trim().to_ascii_lowercase().as_str() {
                    "proto" => found.proto = scheme(value),
                    "host" => found.host = authority(value),
                    _ => {}
                }
            }
        }
        if found.proto.is_none() {
            found.proto = last_element(headers, "x-forwarded-proto").and_then(|v| scheme(&v));
        }
        if found.host.is_none() {
            found.host = last_element(headers, "x-forwarded-host").and_then(|v| authority(&v));
        }
        found
    }
}

fn last_element(headers: &HeaderMap, name: &str) -> Option<String> {
    let last_header = headers.get_all(name).iter().next_back()?.to_str().ok()?;
    let last = last_header.rsplit(',').next()?.trim();
    (!last.is_empty()).then(|| last.to_owned())
}

fn scheme(value: &str) -> Option<String> {
    let lower = value.to_ascii_lowercase();
    matches!(lower.as_str(), "http" | "https").then_some(lower)
}

fn authority(value: &str) -> Option<String> {
    let parsed = value.parse::<Authority>().ok()?;
    (!parsed.as_str().contains('@')).then(|| parsed.as_str().to_ascii_lowercase())
}

/// How the edge learns a request's public origin.
#[derive(Clone, Debug, Default)]
pub struct Origins {
    /// `public_url`: what clients use, whatever a request says.
    pub configured: Option<Arc<PublicOrigin>>,
    pub trusted: TrustedProxies,
}

/// Where a request came from, as read off it: its public origin and the
/// name it asked for are worked out only when asked (most answers need
/// neither), so serving a request allocates nothing here.
#[derive(Debug)]
pub struct Arrival {
    configured: Option<Arc<PublicOrigin>>,
    forwarded: Forwarded,
    own_host: Option<HeaderValue>,
    uri_authority: Option<Authority>,
    peer: Peer,
    /// Whether `host` is what a trusted ingress said: that ingress routes
    /// by name and answers for it, so the name needs no listing here.
    pub host_forwarded: bool,
    /// Whether the request carried `Authorization` (a `401` to it means a
    /// token was refused, not that one is wanted).
    pub credentialed: bool,
}

impl Origins {
    /// Where the request came from: a configured `public_url` first, then
    /// a trusted peer's forwarding headers, then the request's own scheme
    /// and `Host` (or HTTP/2 authority).
    pub fn arrival(&self, parts: &http::request::Parts, peer: Peer) -> Arrival {
        let forwarded = if self.trusted.trusts(peer.addr.ip()) {
            Forwarded::read(&parts.headers)
        } else {
            Forwarded::default()
        };
        Arrival {
            configured: self.configured.clone(),
            host_forwarded: forwarded.host.is_some(),
            forwarded,
            own_host: parts.headers.get(HOST).cloned(),
            uri_authority: parts.uri.authority().cloned(),
            peer,
            credentialed: parts.headers.contains_key(http::header::AUTHORIZATION),
        }
    }
}

impl Arrival {
    /// The host the client asked for (a trusted ingress's
    /// `X-Forwarded-Host` or `Forwarded: host`, else `Host`), for the
    /// DNS-rebinding check. `None` for HTTP/2 without a `Host` (the
    /// authority is in the URI).
    pub fn host(&self) -> Option<&str> {
        let own = || self.own_host.as_ref().and_then(|h| h.to_str().ok());
        self.forwarded.host.as_deref().or_else(own)
    }

    /// The origin the client used.
    pub fn origin(&self) -> PublicOrigin {
        if let Some(configured) = &self.configured {
            return PublicOrigin::clone(configured);
        }
        let scheme = match &self.forwarded.proto {
            Some(proto) => proto.clone(),
            None if self.peer.tls => "https".to_owned(),
            None => "http".to_owned(),
        };
        let authority = match (self.host(), &self.uri_authority) {
            (Some(host), _) => host.to_ascii_lowercase(),
            (None, Some(authority)) => authority.as_str().to_ascii_lowercase(),
            (None, None) => peer_authority(self.peer),
        };
        PublicOrigin { scheme, authority }
    }
}

/// An HTTP/1.0 request without `Host` still gets an origin: the address it
/// was sent to is unknown here, so the loopback name stands in.
fn peer_authority(peer: Peer) -> String {
    if peer.addr.is_ipv6() {
        "[::1]".into()
    } else {
        "127.0.0.1".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(pairs: &[(&str, &str)]) -> http::request::Parts {
        let mut req = http::Request::builder().uri("/mcp");
        for (k, v) in pairs {
            req = req.header(*k, *v);
        }
        req.body(()).unwrap().into_parts().0
    }

    fn peer(ip: &str) -> Peer {
        Peer {
            addr: SocketAddr::new(ip.parse().unwrap(), 5000),
            tls: false,
        }
    }

    fn trusting(nets: &[&str]) -> Origins {
        let nets: Vec<String> = nets.iter().map(|s| s.to_string()).collect();
        Origins {
            configured: None,
            trusted: TrustedProxies::parse(&nets).unwrap(),
        }
    }

    #[test]
    fn the_origin_is_the_requests_own_scheme_and_host_by_default() {
        let arrival =
            Origins::default().arrival(&parts(&[("host", "LocalHost:3922")]), peer("127.0.0.1"));
        assert_eq!(arrival.origin().url(), "http://localhost:3922");
        let tls = Peer {
            tls: true,
            ..peer("127.0.0.1")
        };
        let arrival = Origins::default().arrival(&parts(&[("host", "mcp.example.com")]), tls);
        assert_eq!(arrival.origin().url(), "https://mcp.example.com");
    }

    #[test]
    fn forwarding_headers_from_an_untrusted_peer_are_ignored() {
        let req = parts(&[
            ("host", "localhost:8080"),
            ("forwarded", "proto=https;host=evil.example"),
            ("x-forwarded-host", "evil.example"),
        ]);
        let arrival = trusting(&["10.0.0.0/8"]).arrival(&req, peer("127.0.0.1"));
        assert_eq!(arrival.origin().url(), "http://localhost:8080");
        assert_eq!(arrival.host(), Some("localhost:8080"));
    }

    #[test]
    fn a_trusted_peer_names_the_public_origin_with_its_own_last_element() {
        let req = parts(&[
            ("host", "mcp_resume_proxy"),
            ("x-forwarded-proto", "http, https"),
            ("x-forwarded-host", "evil.example, mcp.example.com"),
        ]);
        let arrival = trusting(&["127.0.0.1"]).arrival(&req, peer("127.0.0.1"));
        assert_eq!(arrival.origin().url(), "https://mcp.example.com");
        assert_eq!(arrival.host(), Some("mcp.example.com"));
    }

    #[test]
    fn forwarded_wins_over_the_x_forwarded_pair() {
        let req = parts(&[
            (
                "forwarded",
                "for=1.2.3.4;proto=https;host=\"a.example:8443\"",
            ),
            ("x-forwarded-host", "b.example"),
        ]);
        let arrival = trusting(&["::1", "127.0.0.0/8"]).arrival(&req, peer("127.0.0.1"));
        assert_eq!(arrival.origin().url(), "https://a.example:8443");
    }

    #[test]
    fn a_forwarded_value_that_is_no_scheme_or_authority_is_ignored() {
        let req = parts(&[
            ("host", "localhost"),
            ("x-forwarded-proto", "javascript"),
            ("x-forwarded-host", "a.example/path?x"),
        ]);
        let arrival = trusting(&["127.0.0.1"]).arrival(&req, peer("127.0.0.1"));
        assert_eq!(arrival.origin().url(), "http://localhost");
    }

    #[test]
    fn a_configured_public_url_wins_over_everything() {
        let origins = Origins {
            configured: PublicOrigin::parse("https://MCP.example.com").map(Arc::new),
            trusted: TrustedProxies::default(),
        };
        let arrival = origins.arrival(&parts(&[("host", "localhost")]), peer("127.0.0.1"));
        assert_eq!(arrival.origin().url(), "https://mcp.example.com");
    }

    #[test]
    fn an_ipv4_peer_mapped_into_ipv6_is_trusted_as_itself() {
        let trusted = TrustedProxies::parse(&["127.0.0.1".into()]).unwrap();
        assert!(trusted.trusts("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!trusted.trusts("::ffff:127.0.0.2".parse().unwrap()));
        assert!(TrustedProxies::parse(&["nope".into()]).is_err());
    }

    #[test]
    fn a_public_origin_has_no_path_or_credentials() {
        assert!(PublicOrigin::parse("https://a.example").is_some());
        assert!(PublicOrigin::parse("ftp://a.example").is_none());
        assert!(PublicOrigin::parse("https://user:pw@a.example").is_none());
        assert!(PublicOrigin::parse("a.example").is_none());
        assert!(PublicOrigin::parse("https://a.example/mcp").is_none());
    }
}
