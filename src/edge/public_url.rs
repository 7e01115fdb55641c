//! An upstream's URLs as its clients must see them. An upstream names
//! itself by the URL the proxy reaches it at (`http://10.0.0.7:3000/mcp`);
//! a client that reads that URL in a `401`'s `resource_metadata`, in the
//! protected-resource metadata's `resource` or in a `Location` would go
//! around the proxy, or refuse the metadata because it names another
//! resource than the one it connected to. So those places are rewritten to
//! the proxy's public URL, and nothing else is: `authorization_servers` and
//! every other field stay as the upstream wrote them, and an upstream that
//! already names the public URL passes through untouched.
//!
//! This module maps and rewrites text; it does not route or forward.

use http::Uri;

use super::origin::PublicOrigin;

/// Where the authorization spec puts a resource's metadata (RFC 9728).
pub const PROTECTED_RESOURCE: &str = "/.well-known/oauth-protected-resource";
/// An authorization server's metadata (RFC 8414) and OpenID's.
pub const AUTHORIZATION_SERVER: &str = "/.well-known/oauth-authorization-server";
pub const OPENID_CONFIGURATION: &str = "/.well-known/openid-configuration";

/// The longest header or URL the proxy rewrites; a longer one passes as
/// the upstream wrote it (it cannot be a URL the proxy would write).
const MAX_REWRITTEN: usize = 8 * 1024;

/// One upstream's own URL and the proxy path it is mounted at.
#[derive(Clone, Debug)]
pub struct PublicUrls {
    scheme: String,
    host: String,
    port: u16,
    upstream_path: String,
    /// The mount on the proxy, or the path of a configured `public_url`.
    public_path: String,
    /// A configured per-upstream `public_url`'s origin.
    configured: Option<PublicOrigin>,
    passthrough: Vec<String>,
}

impl PublicUrls {
    /// `None` for an upstream that is not an http(s) URL (a stdio command).
    pub fn new(
        upstream_url: &str,
        mount: &str,
        public_url: Option<&str>,
        passthrough: &[String],
    ) -> Option<Self> {
        let (scheme, host, port, upstream_path) = split(upstream_url)?;
        let (configured, public_path) = match public_url.and_then(|u| u.parse::<Uri>().ok()) {
            Some(uri) => {
                let origin = uri
                    .authority()
                    .map(|a| format!("{}://{}", uri.scheme_str().unwrap_or("https"), a));
                (
                    origin.as_deref().and_then(PublicOrigin::parse),
                    trimmed(uri.path()).to_owned(),
                )
            }
            None => (None, trimmed(mount).to_owned()),
        };
        Some(Self {
            scheme,
            host,
            port,
            upstream_path,
            public_path,
            configured,
            passthrough: passthrough.to_vec(),
        })
    }

    /// The path the upstream serves MCP at (`/mcp`).
    pub fn upstream_path(&self) -> &str {
        &self.upstream_path
    }

    /// The origin clients use for this upstream: its own `public_url`, else
    /// the request's.
    fn origin<'a>(&'a self, request: &'a PublicOrigin) -> &'a PublicOrigin {
        self.configured.as_ref().unwrap_or(request)
    }

    /// The MCP endpoint as clients reach it.
    pub fn endpoint(&self, request: &PublicOrigin) -> String {
        format!("{}{}", self.origin(request).url(), self.public_path)
    }

    /// Where clients read this upstream's protected-resource metadata
    /// through the proxy (the path-based form: unambiguous with several
    /// upstreams).
    pub fn metadata(&self, request: &PublicOrigin) -> String {
        let path = if self.public_path == "/" {
            ""
        } else {
            &self.public_path
        };
        format!("{}{PROTECTED_RESOURCE}{path}", self.origin(request).url())
    }

    /// `url` as a client must see it, if it is one of the upstream's own
    /// URLs that the proxy serves: the endpoint, its metadata, its
    /// authorization-server metadata and its pass-through paths. `None`:
    /// leave it as it is.
    pub fn to_public(&self, url: &str, request: &PublicOrigin) -> Option<String> {
        if url.len() > MAX_REWRITTEN {
            return None;
        }
        let uri = url.parse::<Uri>().ok()?;
        let (scheme, host, port, path) = split_uri(&uri)?;
        if scheme != self.scheme || port != self.port || !same_host(&host, &self.host) {
            return None;
        }
        let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        let origin = self.origin(request).url();
        let public = if path == self.upstream_path {
            self.endpoint(request)
        } else if path == "/" {
            // The upstream naming itself by its origin (a `resource` of
            // root metadata) is named by the proxy's.
            let slash = if uri.path() == "/" && url.ends_with('/') {
                "/"
            } else {
                ""
            };
            format!("{origin}{slash}")
        } else if path == PROTECTED_RESOURCE
            || path.strip_prefix(PROTECTED_RESOURCE) == Some(self.upstream_path.as_str())
        {
            self.metadata(request)
        } else if path.starts_with(AUTHORIZATION_SERVER)
            || path.starts_with(OPENID_CONFIGURATION)
            || self.passthrough.contains(&path)
        {
            format!("{origin}{path}")
        } else {
            return None;
        };
        Some(format!("{public}{query}"))
    }

    /// A `WWW-Authenticate` value with its `resource_metadata` parameter
    /// naming the proxy; `None` when there is nothing to change (no such
    /// parameter, or one that does not name this upstream). An upstream
    /// that keeps its metadata at a path of its own choosing gets the
    /// proxy's standard one in its place, and that path is handed back for
    /// the proxy to fetch the metadata from.
    pub fn www_authenticate(&self, value: &str, request: &PublicOrigin) -> Option<Challenge> {
        if value.len() > MAX_REWRITTEN {
            return None;
        }
        let (start, end, url) = resource_metadata(value)?;
        // Whatever path of its own origin the upstream names, clients are
        // sent to the proxy's standard one; a path that is not a
        // well-known one is remembered, to read the metadata from.
        let path = self.own_path(&url)?;
        let public = self.metadata(request);
        let standard = self.to_public(&url, request).as_deref() == Some(public.as_str());
        let metadata_path = (!standard).then_some(path);
        let value = format!("{}\"{public}\"{}", &value[..start], &value[end..]);
        Some(Challenge {
            value,
            metadata_path,
        })
    }

    /// The path (and query) of `url` if it is on the upstream's own origin
    /// and a plain path.
    fn own_path(&self, url: &str) -> Option<String> {
        let uri = url.parse::<Uri>().ok()?;
        let (scheme, host, port, path) = split_uri(&uri)?;
        let own = scheme == self.scheme && port == self.port && same_host(&host, &self.host);
        let path_and_query = uri.path_and_query()?.as_str();
        (own && crate::config::edge::plain_path(&path)).then(|| path_and_query.to_owned())
    }
}

/// A rewritten challenge.
#[derive(Debug, PartialEq, Eq)]
pub struct Challenge {
    pub value: String,
    /// Where the upstream keeps its metadata, when not at a well-known path.
    pub metadata_path: Option<String>,
}

fn trimmed(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        p => p,
    }
}

fn split(url: &str) -> Option<(String, String, u16, String)> {
    split_uri(&url.parse::<Uri>().ok()?)
}

fn split_uri(uri: &Uri) -> Option<(String, String, u16, String)> {
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = uri.authority()?;
    if authority.as_str().contains('@') {
        return None;
    }
    let host = authority.host().to_ascii_lowercase();
    let port = authority.port_u16().unwrap_or(default_port);
    Some((scheme, host, port, trimmed(uri.path()).to_owned()))
}

/// `localhost`, `127.0.0.1` and `[::1]` name one machine: an upstream
/// configured as one of them often names itself by another.
fn same_host(a: &str, b: &str) -> bool {
    const LOOPBACK: &[&str] = &["localhost", "127.0.0.1", "[::1]", "::1"];
    a == b || (LOOPBACK.contains(&a) && LOOPBACK.contains(&b))
}

/// Finds `resource_metadata="<url>"` (or an unquoted token) in a
/// challenge: the byte range of the value as written, and the URL.
fn resource_metadata(value: &str) -> Option<(usize, usize, String)> {
    let lower = value.to_ascii_lowercase();
    let mut from = 0;
    let at = loop {
        let found = from + lower[from..].find("resource_metadata")?;
        // A parameter name starts the value or follows a separator.
        let starts = found == 0 || matches!(value.as_bytes()[found - 1], b' ' | b',' | b'\t');
        if starts {
            break found;
        }
        from = found + 1;
    };
    let rest = &value[at + "resource_metadata".len()..];
    let eq = rest.find(|c: char| c != ' ')?;
    let after_eq = rest[eq..].strip_prefix('=')?;
    let skipped = after_eq.len() - after_eq.trim_start().len();
    let start = value.len() - after_eq.len() + skipped;
    let body = &value[start..];
    if let Some(quoted) = body.strip_prefix('"') {
        let mut url = String::new();
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => url.push(chars.next()?.1),
                '"' => return Some((start, start + 1 + i + 1, url)),
                c => url.push(c),
            }
        }
        None // unterminated: not rewritten
    } else {
        let len = body.find([',', ' ', '\t']).unwrap_or(body.len());
        Some((start, start + len, body[..len].to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls() -> PublicUrls {
        PublicUrls::new(
            "http://localhost:3920/mcp",
            "/mcp",
            None,
            &["/authorize".to_owned(), "/token".to_owned()],
        )
        .unwrap()
    }

    fn proxy() -> PublicOrigin {
        PublicOrigin::parse("http://127.0.0.1:3922").unwrap()
    }

    #[test]
    fn the_upstreams_endpoint_becomes_the_proxys() {
        let u = urls();
        assert_eq!(
            u.to_public("http://localhost:3920/mcp", &proxy())
                .as_deref(),
            Some("http://127.0.0.1:3922/mcp")
        );
        // The upstream named by another loopback name is still itself.
        assert_eq!(
            u.to_public("http://127.0.0.1:3920/mcp/", &proxy())
                .as_deref(),
            Some("http://127.0.0.1:3922/mcp")
        );
    }

    #[test]
    fn metadata_urls_root_or_path_based_become_the_proxys_path_based_one() {
        let u = urls();
        for url in [
            "http://localhost:3920/.well-known/oauth-protected-resource/mcp",
            "http://localhost:3920/.well-known/oauth-protected-resource",
        ] {
            assert_eq!(
                u.to_public(url, &proxy()).as_deref(),
                Some("http://127.0.0.1:3922/.well-known/oauth-protected-resource/mcp"),
                "{url}"
            );
        }
    }

    #[test]
    fn pass_through_paths_keep_their_path_and_query() {
        assert_eq!(
            urls()
                .to_public("http://localhost:3920/authorize?client_id=a", &proxy())
                .as_deref(),
            Some("http://127.0.0.1:3922/authorize?client_id=a")
        );
    }

    #[test]
    fn other_urls_and_other_servers_are_left_alone() {
        let u = urls();
        for url in [
            "http://localhost:3921/mcp",
            "https://localhost:3920/mcp",
            "http://as.example/.well-known/oauth-protected-resource/mcp",
            "http://localhost:3920/admin",
            "http://127.0.0.1:3922/mcp",
            "http://localhost:3921/",
            "not a url",
        ] {
            assert_eq!(u.to_public(url, &proxy()), None, "{url}");
        }
    }

    #[test]
    fn a_configured_public_url_names_origin_and_path() {
        let u = PublicUrls::new(
            "http://10.0.0.7:3000/mcp",
            "/mcp",
            Some("https://mcp.example.com/tools/mcp"),
            &[],
        )
        .unwrap();
        assert_eq!(
            u.to_public("http://10.0.0.7:3000/mcp", &proxy()).as_deref(),
            Some("https://mcp.example.com/tools/mcp")
        );
        assert_eq!(
            u.metadata(&proxy()),
            "https://mcp.example.com/.well-known/oauth-protected-resource/tools/mcp"
        );
    }

    #[test]
    fn the_upstreams_origin_becomes_the_proxys() {
        let u = urls();
        assert_eq!(
            u.to_public("http://localhost:3920", &proxy()).as_deref(),
            Some("http://127.0.0.1:3922")
        );
        assert_eq!(
            u.to_public("http://localhost:3920/", &proxy()).as_deref(),
            Some("http://127.0.0.1:3922/")
        );
    }

    #[test]
    fn metadata_kept_at_a_path_of_the_upstreams_own_is_named_by_the_proxys_standard_url() {
        let header =
            r#"Bearer resource_metadata="http://localhost:3920/custom/metadata/location.json""#;
        assert_eq!(
            urls().www_authenticate(header, &proxy()),
            Some(Challenge {
                value: r#"Bearer resource_metadata="http://127.0.0.1:3922/.well-known/oauth-protected-resource/mcp""#.into(),
                metadata_path: Some("/custom/metadata/location.json".into()),
            })
        );
    }

    #[test]
    fn www_authenticate_gets_the_proxys_metadata_url_and_keeps_the_rest() {
        let header = r#"Bearer error="invalid_token", error_description="Missing", resource_metadata="http://localhost:3920/.well-known/oauth-protected-resource/mcp", scope="mcp""#;
        assert_eq!(
            urls()
                .www_authenticate(header, &proxy())
                .map(|c| c.value)
                .as_deref(),
            Some(
                r#"Bearer error="invalid_token", error_description="Missing", resource_metadata="http://127.0.0.1:3922/.well-known/oauth-protected-resource/mcp", scope="mcp""#
            )
        );
        let unquoted = "Bearer resource_metadata=http://localhost:3920/.well-known/oauth-protected-resource/mcp";
        assert_eq!(
            urls()
                .www_authenticate(unquoted, &proxy())
                .map(|c| c.value)
                .as_deref(),
            Some(
                r#"Bearer resource_metadata="http://127.0.0.1:3922/.well-known/oauth-protected-resource/mcp""#
            )
        );
    }

    #[test]
    fn malformed_or_foreign_challenges_pass_unchanged() {
        let u = urls();
        for header in [
            "Bearer",
            "Bearer resource_metadata=",
            r#"Bearer resource_metadata="http://localhost:3920/.well-known/oauth-protected-resource/mcp"#,
            r#"Bearer x_resource_metadata="http://localhost:3920/mcp""#,
            r#"Bearer resource_metadata="https://as.example/meta""#,
            r#"Bearer resource_metadata="http://localhost:3920/a/../b""#,
            "\u{0}\u{1}resource_metadata=\"",
        ] {
            assert_eq!(u.www_authenticate(header, &proxy()), None, "{header:?}");
        }
        let huge = format!(
            "Bearer resource_metadata=\"http://localhost:3920/mcp\", x=\"{}\"",
            "a".repeat(MAX_REWRITTEN)
        );
        assert_eq!(u.www_authenticate(&huge, &proxy()), None);
    }
}
