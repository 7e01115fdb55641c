//! `[auth]`: how the principal of a request is found, as plain data with
//! its defaults and its validation (messages that name the key).
//!
//! Nothing here reads a secret, opens a connection or looks at a request:
//! [`Authenticator::new`](super::Authenticator::new) does the first two and
//! [`Authenticator::identify`](super::Authenticator::identify) the third.
//! `proxy.toml.example` documents every key and must change with this file.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::ConfigError;

/// Where a request's principal comes from (`auth.principal`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum PrincipalMode {
    /// A digest of the `principal_header` value (today's behaviour).
    #[default]
    Token,
    /// A trusted identity header set by an authenticating proxy in front.
    Header,
    /// A verified JWT bearer token: its issuer and subject.
    Jwt,
    /// A bearer token the authorization server vouches for (RFC 7662).
    Introspection,
}

impl PrincipalMode {
    pub const ALL: &'static [Self] = &[
        PrincipalMode::Token,
        PrincipalMode::Header,
        PrincipalMode::Jwt,
        PrincipalMode::Introspection,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalMode::Token => "token",
            PrincipalMode::Header => "header",
            PrincipalMode::Jwt => "jwt",
            PrincipalMode::Introspection => "introspection",
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub principal: PrincipalMode,
    /// The identity header of `principal = "header"`.
    pub header: String,
    /// Required with `principal = "jwt"`.
    pub jwt: Option<JwtConfig>,
    /// Required with `principal = "introspection"`.
    pub introspection: Option<IntrospectionConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            principal: PrincipalMode::Token,
            header: "x-authenticated-user".into(),
            jwt: None,
            introspection: None,
        }
    }
}

/// Signature algorithms a JWT may be accepted with. Only public-key ones:
/// the keys come from a published set, and an HMAC "signed" with a public
/// key proves nothing (the classic algorithm confusion); `none` proves
/// nothing either.
pub const ASYMMETRIC_ALGORITHMS: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// `iss` must equal it; also where the key set is discovered.
    pub issuer: String,
    /// The key set; unset: the issuer metadata's `jwks_uri`.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// When set, `aud` must contain one of these.
    #[serde(default)]
    pub audience: Vec<String>,
    /// The claim naming the person.
    #[serde(default = "default_claim")]
    pub claim: String,
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// An unknown `kid` fetches the key set again at most this often.
    #[serde(default = "default_refetch")]
    pub refetch_min_secs: u64,
    /// A key set this old is fetched again (behind the request), so that
    /// a key the issuer removed stops verifying.
    #[serde(default = "default_refresh")]
    pub refresh_secs: u64,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_leeway")]
    pub leeway_secs: u64,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IntrospectionConfig {
    /// The RFC 7662 endpoint.
    pub endpoint: String,
    pub client_id: String,
    /// A file holding the client secret (one line); or:
    #[serde(default)]
    pub client_secret_file: Option<PathBuf>,
    /// The environment variable holding it.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// Most tokens whose answer is kept.
    #[serde(default = "default_cache_entries")]
    pub cache_entries: usize,
    /// An answer is kept until its `exp`, at most this long.
    #[serde(default = "default_cache_max")]
    pub cache_max_secs: u64,
    /// The member of the answer naming the person; unset: `sub`, else
    /// `username`. (`client_id` for servers whose clients are the people.)
    #[serde(default)]
    pub claim: Option<String>,
}

fn default_claim() -> String {
    "sub".into()
}
fn default_algorithms() -> Vec<String> {
    ["RS256", "ES256", "EdDSA"].map(String::from).to_vec()
}
fn default_refetch() -> u64 {
    60
}
fn default_refresh() -> u64 {
    900
}
fn default_leeway() -> u64 {
    30
}
fn default_cache_entries() -> usize {
    10_000
}
fn default_cache_max() -> u64 {
    300
}

/// Whether `text` is an absolute http:// or https:// URL.
fn is_http_url(text: &str) -> bool {
    text.parse::<http::Uri>().is_ok_and(|uri| {
        matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some()
    })
}

impl AuthConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |msg: String| Err(ConfigError(msg));
        match self.principal {
            PrincipalMode::Token => Ok(()),
            PrincipalMode::Header => {
                if self.header.is_empty()
                    || http::HeaderName::from_bytes(self.header.as_bytes()).is_err()
                {
                    return fail(format!(
                        "auth.header = {:?} is not a valid header name",
                        self.header
                    ));
                }
                Ok(())
            }
            PrincipalMode::Jwt => match &self.jwt {
                Some(jwt) => jwt.validate(),
                None => fail(
                    "auth.principal = \"jwt\" needs an [auth.jwt] table with at least `issuer`"
                        .into(),
                ),
            },
            PrincipalMode::Introspection => match &self.introspection {
                Some(i) => i.validate(),
                None => fail(
                    "auth.principal = \"introspection\" needs an [auth.introspection] table \
                     with `endpoint`, `client_id` and a client secret"
                        .into(),
                ),
            },
        }
    }
}

impl JwtConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let fail = |msg: String| Err(ConfigError(msg));
        if !is_http_url(&self.issuer) {
            return fail(format!(
                "auth.jwt.issuer = {:?} is not an http:// or https:// URL",
                self.issuer
            ));
        }
        if let Some(url) = self.jwks_url.as_deref().filter(|u| !is_http_url(u)) {
            return fail(format!(
                "auth.jwt.jwks_url = {url:?} is not an http:// or https:// URL"
            ));
        }
        if self.claim.is_empty() {
            return fail("auth.jwt.claim must name a claim".into());
        }
        if self.algorithms.is_empty() {
            return fail("auth.jwt.algorithms must list at least one algorithm".into());
        }
        if let Some(bad) = self
            .algorithms
            .iter()
            .find(|a| !ASYMMETRIC_ALGORITHMS.contains(&a.as_str()))
        {
            return fail(format!(
                "auth.jwt.algorithms: {bad:?} is not accepted (only public-key algorithms: {}; \
                 never \"none\" or HS*, since the keys are public)",
                ASYMMETRIC_ALGORITHMS.join(", ")
            ));
        }
        if self.refetch_min_secs == 0 {
            // Zero would let every token with a made-up kid fetch the set.
            return fail("auth.jwt.refetch_min_secs must be greater than 0".into());
        }
        if self.refresh_secs < self.refetch_min_secs {
            return fail(format!(
                "auth.jwt.refresh_secs = {} must not be below refetch_min_secs = {}",
                self.refresh_secs, self.refetch_min_secs
            ));
        }
        Ok(())
    }
}

impl IntrospectionConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let fail = |msg: String| Err(ConfigError(msg));
        if !is_http_url(&self.endpoint) {
            return fail(format!(
                "auth.introspection.endpoint = {:?} is not an http:// or https:// URL",
                self.endpoint
            ));
        }
        if self.client_id.is_empty() {
            return fail("auth.introspection.client_id must not be empty".into());
        }
        match (&self.client_secret_file, &self.client_secret_env) {
            (Some(_), None) | (None, Some(_)) => {}
            _ => {
                return fail(
                    "auth.introspection: give exactly one of client_secret_file and \
                     client_secret_env (the secret itself never goes in this file)"
                        .into(),
                )
            }
        }
        if self.cache_entries == 0 || self.cache_max_secs == 0 {
            return fail(
                "auth.introspection.cache_entries and cache_max_secs must be greater than 0".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AuthConfig, ConfigError> {
        let config: AuthConfig = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn the_default_is_todays_token_digest() {
        let c = parse("").unwrap();
        assert_eq!(c.principal, PrincipalMode::Token);
        assert_eq!(c.header, "x-authenticated-user");
    }

    #[test]
    fn jwt_takes_its_defaults_and_needs_an_issuer() {
        let c = parse("principal = \"jwt\"\n[jwt]\nissuer = \"https://as.example\"\n").unwrap();
        let jwt = c.jwt.unwrap();
        assert_eq!(jwt.claim, "sub");
        assert_eq!(jwt.algorithms, ["RS256", "ES256", "EdDSA"]);
        assert_eq!((jwt.refetch_min_secs, jwt.leeway_secs), (60, 30));
        assert_eq!(jwt.refresh_secs, 900);
        let err = parse("principal = \"jwt\"\n").unwrap_err();
        assert!(err.0.contains("[auth.jwt]"), "{err}");
        let err = parse("principal = \"jwt\"\n[jwt]\njwks_url = \"https://a/\"\n").unwrap_err();
        assert!(err.0.contains("issuer"), "{err}");
    }

    #[test]
    fn symmetric_and_none_algorithms_are_refused_by_name() {
        for alg in ["HS256", "none"] {
            let text = format!(
                "principal = \"jwt\"\n[jwt]\nissuer = \"https://a\"\nalgorithms = [\"{alg}\"]\n"
            );
            let err = parse(&text).unwrap_err();
            assert!(
                err.0.contains("auth.jwt.algorithms") && err.0.contains(alg),
                "{err}"
            );
        }
    }

    #[test]
    fn introspection_needs_exactly_one_secret_source() {
        let base = "principal = \"introspection\"\n[introspection]\n\
                    endpoint = \"https://as/introspect\"\nclient_id = \"proxy\"\n";
        let err = parse(base).unwrap_err();
        assert!(err.0.contains("client_secret_file"), "{err}");
        let c = parse(&format!("{base}client_secret_env = \"S\"\n")).unwrap();
        let i = c.introspection.unwrap();
        assert_eq!((i.cache_entries, i.cache_max_secs), (10_000, 300));
        let both = format!("{base}client_secret_env = \"S\"\nclient_secret_file = \"f\"\n");
        assert!(parse(&both).is_err());
        let err = parse(&format!("{base}client_secret = \"x\"\n")).unwrap_err();
        assert!(err.0.contains("client_secret"), "{err}");
    }

    #[test]
    fn wrong_values_name_their_key() {
        let err = parse("principal = \"header\"\nheader = \"a b\"\n").unwrap_err();
        assert!(err.0.contains("auth.header"), "{err}");
        let err = parse("principal = \"jwt\"\n[jwt]\nissuer = \"ftp://x\"\n").unwrap_err();
        assert!(err.0.contains("auth.jwt.issuer"), "{err}");
        let err =
            parse("principal = \"jwt\"\n[jwt]\nissuer = \"https://a\"\nrefetch_min_secs = 0\n")
                .unwrap_err();
        assert!(err.0.contains("auth.jwt.refetch_min_secs"), "{err}");
        let err = parse("principal = \"jwt\"\n[jwt]\nissuer = \"https://a\"\nrefresh_secs = 5\n")
            .unwrap_err();
        assert!(err.0.contains("auth.jwt.refresh_secs"), "{err}");
        let err = parse("principal = \"oauth\"\n").unwrap_err();
        assert!(err.0.contains("principal"), "{err}");
    }
}
