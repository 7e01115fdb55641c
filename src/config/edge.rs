//! The edge's keys — the public URL, the trusted ingresses, `[cors]`, each
//! upstream's `public_url` and `passthrough` — as data, and their
//! validation. The pure readings that validation shares with the edge (a
//! plain path, an origin, a network) live here: the edge uses them, and the
//! configuration never reaches up into the edge.

use ipnet::IpNet;
use serde::Deserialize;

use super::Config;

/// `[cors]`: which origins browsers may call the proxy from.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Origins (`scheme://host[:port]`) answered with CORS headers; `"*"`
    /// allows any. These pass the `Origin` check too.
    pub allowed_origins: Vec<String>,
    /// Whether browsers may send cookies and HTTP authentication
    /// (`Access-Control-Allow-Credentials`); bearer tokens need no such
    /// thing.
    pub allow_credentials: bool,
    /// How long a browser may cache a preflight's answer.
    pub max_age_secs: u64,
}

impl Default for CorsConfig {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            allow_credentials: false,
            max_age_secs: 600,
        }
    }
}

impl CorsConfig {
    pub fn allows(&self, origin: &str) -> bool {
        self.allowed_origins
            .iter()
            .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    }

    pub fn validate(&self) -> Result<(), String> {
        for origin in &self.allowed_origins {
            let uri_ok = origin
                .parse::<http::Uri>()
                .is_ok_and(|u| u.scheme().is_some() && u.authority().is_some());
            if origin != "*" && !uri_ok {
                return Err(format!(
                    "cors.allowed_origins: {origin:?} is not an origin (scheme://host[:port]) or \"*\""
                ));
            }
        }
        Ok(())
    }
}

/// The networks of `trusted_proxies` (`"127.0.0.1"`, `"10.0.0.0/8"`,
/// `"::1"`), naming the entry that is neither an address nor a network.
pub fn trusted_networks(entries: &[String]) -> Result<Vec<IpNet>, String> {
    entries
        .iter()
        .map(|e| {
            e.parse::<IpNet>()
                .or_else(|_| e.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| format!("trusted_proxies: {e:?} is not an IP address or network"))
        })
        .collect()
}

/// The scheme and authority (lowercase) of an origin
/// (`https://host[:port]`); `None` for anything with a path, credentials
/// or another scheme.
pub fn origin_parts(text: &str) -> Option<(String, String)> {
    let uri = text.parse::<http::Uri>().ok()?;
    let scheme = uri
        .scheme_str()
        .filter(|s| matches!(*s, "http" | "https"))?;
    let authority = uri.authority()?;
    if authority.as_str().contains('@') || !matches!(uri.path(), "" | "/") {
        return None;
    }
    Some((scheme.to_owned(), authority.as_str().to_ascii_lowercase()))
}

/// A path that means what it says: no dot segments, no encoded dot,
/// slash or backslash, no backslash, no empty segment.
pub fn plain_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    path.starts_with('/')
        && !path.contains('\\')
        && !path.contains("//")
        && !["%2e", "%2f", "%5c", "%00"]
            .iter()
            .any(|e| lower.contains(e))
        && !path.split('/').any(|s| s == "." || s == "..")
}

/// Checks the edge's keys, naming the one at fault.
pub fn validate(config: &Config) -> Result<(), String> {
    trusted_networks(&config.trusted_proxies)?;
    if let Some(url) = &config.public_url {
        origin_parts(url).ok_or_else(|| {
            format!("public_url = {url:?} must be an origin: http(s)://host[:port], no path")
        })?;
    }
    if let Some(cors) = &config.cors {
        cors.validate()?;
    }
    let mut opened = std::collections::HashSet::new();
    for (i, up) in config.upstream.iter().enumerate() {
        if let Some(url) = &up.public_url {
            let ok = url.parse::<http::Uri>().is_ok_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
            });
            if !ok {
                return Err(format!(
                    "upstream[{i}].public_url = {url:?} is not an http(s) URL"
                ));
            }
        }
        if !up.passthrough.is_empty() && up.endpoints().is_empty() {
            return Err(format!(
                "upstream[{i}].passthrough needs an upstream `url`: a stdio command has no origin"
            ));
        }
        for path in &up.passthrough {
            let mounted = config
                .upstream
                .iter()
                .any(|u| u.path.trim_end_matches('/') == path.trim_end_matches('/'));
            let reserved = ["/", "/metrics"].contains(&path.as_str())
                || super::PROBES.contains(&path.trim_end_matches('/'));
            if !plain_path(path) || reserved || mounted {
                return Err(format!(
                    "upstream[{i}].passthrough: {path:?} must be a plain path (no dot segments or \
                     encoded separators) other than /, a mount, /healthz, /livez, /readyz and \
                     /metrics"
                ));
            }
            if !opened.insert(path.as_str()) {
                return Err(format!(
                    "upstream[{i}].passthrough: {path:?} is listed twice"
                ));
            }
        }
    }
    Ok(())
}
