//! The paths the authorization spec routes through an MCP server's origin,
//! and which upstream each one reaches: the protected-resource metadata
//! (RFC 9728, root and path-based), the authorization-server metadata
//! (RFC 8414) and OpenID's, and the paths an upstream lists as its own
//! (`passthrough`: `/authorize`, `/token`, `/register` of a server that is
//! its own authorization server, the 2025-03-26 fallback).
//!
//! This module only decides; forwarding is [`super::passage`]'s. It opens
//! nothing but these paths: a path is matched whole against what the
//! configuration names, and one with a dot segment, an encoded dot, slash
//! or backslash matches nothing, so no spelling reaches another path.

use super::public_url::{AUTHORIZATION_SERVER, OPENID_CONFIGURATION, PROTECTED_RESOURCE};

/// What the edge knows of one route for this decision.
pub struct MountView<'a> {
    /// The proxy path (`/mcp`), without a trailing slash.
    pub mount: &'a str,
    /// The upstream's own MCP path; `None` for a stdio upstream.
    pub upstream_path: Option<&'a str>,
    pub passthrough: &'a [String],
}

/// Where a request goes on the upstream's origin.
#[derive(Debug, PartialEq, Eq)]
pub struct Passage {
    /// Index of the route in the configuration's order.
    pub route: usize,
    /// The path on the upstream's origin.
    pub path: String,
    /// Asked when `path` answers 404: the upstream's root metadata, for an
    /// upstream that serves no path-based one.
    pub fallback: Option<String>,
    /// Protected-resource metadata: its `resource` is rewritten.
    pub metadata: bool,
}

/// The upstream (and path there) a request for `path` goes to, if any.
pub fn find(path: &str, mounts: &[MountView<'_>]) -> Option<Passage> {
    if !plain(path) {
        return None;
    }
    if let Some(rest) = path.strip_prefix(PROTECTED_RESOURCE) {
        return protected_resource(rest, mounts);
    }
    for well_known in [AUTHORIZATION_SERVER, OPENID_CONFIGURATION] {
        if let Some(rest) = path.strip_prefix(well_known) {
            if !rest.is_empty() && !rest.starts_with('/') {
                return None;
            }
            return by_issuer_path(path, rest, mounts);
        }
        // OpenID's own form appends the well-known path to the issuer's.
        if let Some(issuer) = path.strip_suffix(well_known) {
            let (route, up) = http_mount(issuer, mounts)?;
            let path = format!("{}{well_known}", nonroot(up));
            return Some(Passage {
                route,
                path,
                fallback: None,
                metadata: false,
            });
        }
    }
    let route = mounts
        .iter()
        .position(|m| m.upstream_path.is_some() && m.passthrough.iter().any(|p| p == path))?;
    Some(Passage {
        route,
        path: path.to_owned(),
        fallback: None,
        metadata: false,
    })
}

/// `/.well-known/oauth-protected-resource[/<mount>]`: the path-based form
/// names a mount; the root one is the only HTTP upstream's.
fn protected_resource(rest: &str, mounts: &[MountView<'_>]) -> Option<Passage> {
    let (route, up) = if rest.is_empty() {
        only_http(mounts)?
    } else {
        http_mount(rest, mounts)?
    };
    let root = PROTECTED_RESOURCE.to_owned();
    Some(if up == "/" {
        Passage {
            route,
            path: root,
            fallback: None,
            metadata: true,
        }
    } else {
        let path = format!("{PROTECTED_RESOURCE}{up}");
        Passage {
            route,
            path,
            fallback: Some(root),
            metadata: true,
        }
    })
}

/// An authorization server's metadata: an issuer path that names a mount
/// goes to that upstream with the upstream's path in its place; any other
/// goes unchanged to the only HTTP upstream.
fn by_issuer_path(path: &str, rest: &str, mounts: &[MountView<'_>]) -> Option<Passage> {
    if !rest.is_empty() {
        if let Some((route, up)) = http_mount(rest, mounts) {
            let base = &path[..path.len() - rest.len()];
            let path = format!("{base}{}", nonroot(up));
            return Some(Passage {
                route,
                path,
                fallback: None,
                metadata: false,
            });
        }
    }
    let (route, _) = only_http(mounts)?;
    Some(Passage {
        route,
        path: path.to_owned(),
        fallback: None,
        metadata: false,
    })
}

fn http_mount<'a>(mount: &str, mounts: &[MountView<'a>]) -> Option<(usize, &'a str)> {
    let mount = mount.trim_end_matches('/');
    mounts.iter().enumerate().find_map(|(i, m)| {
        let up = m.upstream_path?;
        (m.mount == mount || (mount.is_empty() && m.mount == "/")).then_some((i, up))
    })
}

fn only_http<'a>(mounts: &[MountView<'a>]) -> Option<(usize, &'a str)> {
    let mut http = mounts
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.upstream_path.map(|up| (i, up)));
    let only = http.next()?;
    http.next().is_none().then_some(only)
}

fn nonroot(path: &str) -> &str {
    if path == "/" {
        ""
    } else {
        path
    }
}

pub use crate::config::edge::plain_path as plain;

#[cfg(test)]
mod tests {
    use super::*;

    fn mounts(passthrough: &[String]) -> Vec<MountView<'_>> {
        vec![
            MountView {
                mount: "/mcp",
                upstream_path: Some("/mcp"),
                passthrough,
            },
            MountView {
                mount: "/local",
                upstream_path: None,
                passthrough: &[],
            },
        ]
    }

    fn to(route: usize, path: &str, fallback: Option<&str>, metadata: bool) -> Option<Passage> {
        Some(Passage {
            route,
            path: path.into(),
            fallback: fallback.map(Into::into),
            metadata,
        })
    }

    #[test]
    fn path_based_metadata_goes_to_the_mounts_upstream_with_root_as_fallback() {
        assert_eq!(
            find("/.well-known/oauth-protected-resource/mcp", &mounts(&[])),
            to(
                0,
                "/.well-known/oauth-protected-resource/mcp",
                Some("/.well-known/oauth-protected-resource"),
                true
            )
        );
        assert_eq!(
            find("/.well-known/oauth-protected-resource/local", &mounts(&[])),
            None
        );
        assert_eq!(
            find("/.well-known/oauth-protected-resource/other", &mounts(&[])),
            None
        );
    }

    #[test]
    fn root_metadata_goes_to_the_only_http_upstream() {
        assert_eq!(
            find("/.well-known/oauth-protected-resource", &mounts(&[])),
            to(
                0,
                "/.well-known/oauth-protected-resource/mcp",
                Some("/.well-known/oauth-protected-resource"),
                true
            )
        );
        let two = vec![
            MountView {
                mount: "/a",
                upstream_path: Some("/mcp"),
                passthrough: &[],
            },
            MountView {
                mount: "/b",
                upstream_path: Some("/mcp"),
                passthrough: &[],
            },
        ];
        assert_eq!(find("/.well-known/oauth-protected-resource", &two), None);
        assert!(find("/.well-known/oauth-protected-resource/b", &two).is_some_and(|p| p.route == 1));
    }

    #[test]
    fn authorization_server_metadata_goes_to_the_upstreams_origin() {
        for path in [
            "/.well-known/oauth-authorization-server",
            "/.well-known/openid-configuration",
            "/.well-known/oauth-authorization-server/tenant1",
        ] {
            assert_eq!(find(path, &mounts(&[])), to(0, path, None, false), "{path}");
        }
        assert_eq!(
            find("/.well-known/openid-configuration/mcp", &mounts(&[])),
            to(0, "/.well-known/openid-configuration/mcp", None, false)
        );
        assert_eq!(
            find("/mcp/.well-known/openid-configuration", &mounts(&[])),
            to(0, "/mcp/.well-known/openid-configuration", None, false)
        );
        assert_eq!(
            find("/.well-known/oauth-authorization-serverX", &mounts(&[])),
            None
        );
    }

    #[test]
    fn only_listed_pass_through_paths_open() {
        let listed = ["/authorize".to_owned(), "/token".to_owned()];
        assert_eq!(
            find("/token", &mounts(&listed)),
            to(0, "/token", None, false)
        );
        for path in ["/register", "/token/x", "/tokens", "/admin", "/"] {
            assert_eq!(find(path, &mounts(&listed)), None, "{path}");
        }
    }

    #[test]
    fn dot_segments_and_encoded_separators_reach_nothing() {
        let listed = ["/token".to_owned()];
        for path in [
            "/token/../admin",
            "/x/../token",
            "/%2e%2e/token",
            "/.well-known/oauth-protected-resource/%2fmcp",
            "/.well-known/oauth-protected-resource/../../mcp",
            "/.well-known/oauth-authorization-server/..",
            "/token%2F..%2Fadmin",
            "/.well-known\\oauth-protected-resource",
            "//token",
            "/./token",
        ] {
            assert_eq!(find(path, &mounts(&listed)), None, "{path}");
        }
    }
}
