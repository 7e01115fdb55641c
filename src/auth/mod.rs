//! Who a request speaks for: the [`Authenticator`], built once at start-up
//! from `[auth]`, turns a request's headers into the *principal* its
//! sessions, streams and handles belong to — a digest of its credential
//! (`token`, today's rule), a trusted identity header (`header`), the
//! issuer and subject of a verified JWT (`jwt`) or of an introspected token
//! (`introspection`) — or into a [`Refusal`].
//!
//! It owns the verifiers, their caches and their counters and log lines.
//! It must not answer HTTP, end a session or decide what a refusal does to
//! one (the edge does), never logs or keeps a token (only digests), and
//! never does I/O for `token` and `header`. Principals of different modes
//! never collide: every mode but `token` prefixes its digest, and a client
//! certificate's principal ([`crate::tls::CertificatePrincipal`]) has a
//! prefix of its own.
//!
//! - [`config`]: `[auth]` as data, its defaults and validation.
//! - [`jwt`]: JWS header, signature and claims; verified tokens cached.
//! - [`jwks`]: the issuer's key set — fetched at first need, refetched on an
//!   unknown `kid` at most once per interval, one fetch at a time.
//! - [`introspection`]: RFC 7662 answers, cached until `exp`.
//! - [`cache`]: the bounded token-digest cache both use.
//! - [`fetch`]: the bounded HTTP client both use.
//! - [`hint`]: the subject a JWT-shaped token names, unverified, which
//!   `token` mode holds a refreshed token to.

pub mod cache;
pub mod fetch;
pub mod hint;
pub mod introspection;
pub mod jwks;
pub mod jwt;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName};
use ring::digest;

/// `[auth]` as data lives with the rest of the configuration.
pub use crate::config::auth as config;
pub use crate::config::auth::{AuthConfig, PrincipalMode};

use crate::config::Config;
use introspection::Introspector;
use jwt::JwtVerifier;

/// Who a request speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub principal: String,
    pub mode: PrincipalMode,
}

/// Why a request speaks for nobody.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No usable credential, or one that does not verify (forged, `alg:
    /// none`, wrong `iss`/`aud`, expired, inactive): the edge answers 401
    /// with [`Refusal::challenge`]. Carries the reason (for the log and the
    /// metric), never the token.
    Unauthenticated(RefusalReason),
    /// The verifier cannot be reached (JWKS or introspection down, and
    /// nothing cached decides): 503 with Retry-After. Never ends an open
    /// session.
    Unavailable(String),
}

impl Refusal {
    /// The `WWW-Authenticate` value of a 401: RFC 6750's `invalid_token`
    /// when a credential was sent, no error when none was (section 3.1).
    /// None for [`Refusal::Unavailable`], which is no 401.
    pub fn challenge(&self) -> Option<&'static str> {
        match self {
            Refusal::Unauthenticated(RefusalReason::Missing) => Some("Bearer"),
            Refusal::Unauthenticated(_) => Some("Bearer error=\"invalid_token\""),
            Refusal::Unavailable(_) => None,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unauthenticated(why) => write!(f, "unauthenticated: {}", why.as_str()),
            Refusal::Unavailable(why) => write!(f, "verifier unavailable: {why}"),
        }
    }
}

/// Why a credential was refused: the `reason` label of
/// `mcp_proxy_auth_refusals_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// No credential (no bearer token, no identity header).
    Missing,
    /// Not a bearer token, not a compact JWS, a claim of the wrong type.
    Malformed,
    Signature,
    Issuer,
    Audience,
    Expired,
    /// `nbf` is still ahead.
    NotYetValid,
    /// The introspection endpoint says the token is not active.
    Inactive,
    /// No key of the issuer's set matches the token's `kid`.
    UnknownKey,
    /// `none`, HS*, an algorithm not configured, or not the key's.
    Algorithm,
}

impl RefusalReason {
    pub const ALL: &'static [Self] = &[
        RefusalReason::Missing,
        RefusalReason::Malformed,
        RefusalReason::Signature,
        RefusalReason::Issuer,
        RefusalReason::Audience,
        RefusalReason::Expired,
        RefusalReason::NotYetValid,
        RefusalReason::Inactive,
        RefusalReason::UnknownKey,
        RefusalReason::Algorithm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Missing => "missing",
            RefusalReason::Malformed => "malformed",
            RefusalReason::Signature => "signature",
            RefusalReason::Issuer => "issuer",
            RefusalReason::Audience => "audience",
            RefusalReason::Expired => "expired",
            RefusalReason::NotYetValid => "not_yet_valid",
            RefusalReason::Inactive => "inactive",
            RefusalReason::UnknownKey => "unknown_key",
            RefusalReason::Algorithm => "algorithm",
        }
    }
}

/// How a verifier failed, before it is counted and logged.
#[derive(Debug)]
pub enum Failure {
    /// Refused, with a detail for the debug log.
    Refused(RefusalReason, &'static str),
    Unavailable(String),
}

pub struct Authenticator {
    mode: PrincipalMode,
    /// What `token` digests (`principal_header`).
    token_header: HeaderName,
    /// What `header` trusts (`auth.header`).
    identity_header: HeaderName,
    jwt: Option<JwtVerifier>,
    introspection: Option<Introspector>,
    /// Unix seconds of the last warning about an unreachable verifier.
    warned: AtomicU64,
}

/// At most one warning about an unreachable verifier per this many
/// seconds; the others go to debug (each is counted all the same).
const WARN_EVERY_SECS: u64 = 10;

impl Authenticator {
    /// Reads the secrets and builds the clients `[auth]` asks for; fetches
    /// nothing (keys come at first need).
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        let auth = &config.auth;
        auth.validate()?;
        let header = |key: &str, name: &str| {
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| anyhow::anyhow!("{key} = {name:?}: {e}"))
        };
        let mut this = Self {
            mode: auth.principal,
            token_header: header("principal_header", &config.principal_header)?,
            identity_header: header("auth.header", &auth.header)?,
            jwt: None,
            introspection: None,
            warned: AtomicU64::new(0),
        };
        match (auth.principal, &auth.jwt, &auth.introspection) {
            (PrincipalMode::Jwt, Some(jwt), _) => {
                this.jwt = Some(JwtVerifier::new(jwt, Arc::new(fetch::Fetcher::new()?))?);
            }
            (PrincipalMode::Introspection, _, Some(i)) => {
                let fetcher = Arc::new(fetch::Fetcher::new()?);
                this.introspection = Some(Introspector::new(i, fetcher)?);
            }
            _ => {}
        }
        Ok(this)
    }

    pub fn mode(&self) -> PrincipalMode {
        self.mode
    }

    /// Who the request speaks for. Never does I/O for `token`/`header`; for
    /// `jwt`, one verification per new token (keys cached; a fetch only on
    /// an unknown kid, rate-limited); for `introspection`, one call per new
    /// token, cached.
    pub async fn identify(&self, headers: &HeaderMap) -> Result<Caller, Refusal> {
        let found = match self.mode {
            PrincipalMode::Token => Ok(token_principal(headers, &self.token_header)),
            PrincipalMode::Header => self.header_principal(headers),
            PrincipalMode::Jwt | PrincipalMode::Introspection => self.bearer(headers).await,
        };
        let mode = self.mode;
        match found {
            Ok(principal) => Ok(Caller { principal, mode }),
            Err(Failure::Refused(reason, detail)) => {
                tracing::debug!(
                    mode = mode.as_str(),
                    reason = reason.as_str(),
                    detail,
                    "credential refused"
                );
                Err(Refusal::Unauthenticated(reason))
            }
            Err(Failure::Unavailable(why)) => {
                self.warn_unavailable(&why);
                Err(Refusal::Unavailable(why))
            }
        }
    }

    fn header_principal(&self, headers: &HeaderMap) -> Result<String, Failure> {
        let mut values = headers.get_all(&self.identity_header).iter();
        match (values.next(), values.next()) {
            (Some(v), None) if !v.is_empty() => Ok(prefixed_digest_of("header:", v.as_bytes())),
            (None, _) => Err(Failure::Refused(
                RefusalReason::Missing,
                "no identity header",
            )),
            _ => Err(Failure::Refused(
                RefusalReason::Malformed,
                "an empty or repeated identity header",
            )),
        }
    }

    async fn bearer(&self, headers: &HeaderMap) -> Result<String, Failure> {
        let token = bearer_token(headers)?;
        let now = unix_now();
        let vouched = match (&self.jwt, &self.introspection) {
            (Some(jwt), _) => jwt.principal(token, now).await?,
            (None, Some(introspection)) => introspection.principal(token, now).await?,
            (None, None) => return Err(Failure::Unavailable("no verifier was built".into())),
        };
        Ok(vouched.principal.to_string())
    }

    fn warn_unavailable(&self, why: &str) {
        let now = unix_now();
        let last = self.warned.load(Ordering::Relaxed);
        let due = now >= last.saturating_add(WARN_EVERY_SECS)
            && self
                .warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if due {
            tracing::warn!(
                mode = self.mode.as_str(),
                error = why,
                "cannot verify credentials: the verifier is unreachable"
            );
        } else {
            tracing::debug!(
                mode = self.mode.as_str(),
                error = why,
                "verifier unavailable"
            );
        }
    }
}

/// The principal of a request that sends no credential under `principal =
/// "token"` (the digest of nothing): every such client has it, so it tells
/// no client from another, and bounds per principal do not apply to it.
/// The other modes refuse a request without a credential.
pub const NO_CREDENTIAL: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Today's principal: the hex SHA-256 of the credential header's value, of
/// nothing when it is absent. Unchanged, so that sessions made before
/// `[auth]` existed keep their owner.
pub fn token_principal(headers: &HeaderMap, header: &HeaderName) -> String {
    let value = headers.get(header).map(|v| v.as_bytes()).unwrap_or(b"");
    crate::id::hex(digest::digest(&digest::SHA256, value).as_ref())
}

/// The token of `Authorization: Bearer <token>` (scheme in any case, RFC
/// 6750's token characters). Anything else is no bearer token.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, Failure> {
    const MALFORMED: Failure = Failure::Refused(RefusalReason::Malformed, "not one bearer token");
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Err(Failure::Refused(RefusalReason::Missing, "no Authorization")),
        (Some(v), None) => v.to_str().map_err(|_| MALFORMED)?,
        (Some(_), Some(_)) => return Err(MALFORMED),
    };
    let (scheme, token) = value.split_once(' ').ok_or(MALFORMED)?;
    let token = token.trim_matches(' ');
    let b64token = |c: char| c.is_ascii_alphanumeric() || "-._~+/".contains(c);
    let body = token.trim_end_matches('=');
    if !scheme.eq_ignore_ascii_case("bearer") || body.is_empty() || !body.chars().all(b64token) {
        return Err(MALFORMED);
    }
    Ok(token)
}

/// `prefix` + hex(SHA-256(`issuer` ‖ 0 ‖ `subject`)): the NUL keeps
/// ("ab", "c") and ("a", "bc") apart, and the prefix keeps modes apart.
pub fn prefixed_digest(prefix: &str, issuer: &str, subject: &str) -> String {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(issuer.as_bytes());
    ctx.update(&[0]);
    ctx.update(subject.as_bytes());
    format!("{prefix}{}", crate::id::hex(ctx.finish().as_ref()))
}

fn prefixed_digest_of(prefix: &str, value: &[u8]) -> String {
    let d = digest::digest(&digest::SHA256, value);
    format!("{prefix}{}", crate::id::hex(d.as_ref()))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_principals_differ_by_credential_and_hide_it() {
        let header = HeaderName::from_static("authorization");
        let of = |value: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("authorization", http::HeaderValue::from_static(value));
            token_principal(&h, &header)
        };
        assert_ne!(of("Bearer a"), of("Bearer b"));
        assert!(!of("Bearer a").contains("Bearer"));
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn refused(result: Result<impl std::fmt::Debug, Failure>) -> RefusalReason {
        match result {
            Err(Failure::Refused(why, _)) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_bearer_token_is_read_in_any_case_of_the_scheme() {
        for value in [
            "Bearer abc.DEF-_~+/=",
            "bearer abc.DEF-_~+/=",
            "BEARER  abc.DEF-_~+/= ",
        ] {
            let h = headers(&[("authorization", value)]);
            assert_eq!(bearer_token(&h).unwrap(), "abc.DEF-_~+/=", "{value}");
        }
    }

    #[test]
    fn anything_but_one_bearer_token_is_refused() {
        assert_eq!(refused(bearer_token(&headers(&[]))), RefusalReason::Missing);
        for value in [
            "Basic YTpi",
            "Bearer",
            "Bearer ",
            "Bearer a b",
            "Bearer ===",
            "Bearerabc",
        ] {
            let h = headers(&[("authorization", value)]);
            assert_eq!(
                refused(bearer_token(&h)),
                RefusalReason::Malformed,
                "{value}"
            );
        }
        let two = headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]);
        assert_eq!(refused(bearer_token(&two)), RefusalReason::Malformed);
    }

    #[test]
    fn a_request_without_a_credential_has_the_no_credential_principal() {
        let nothing = token_principal(&HeaderMap::new(), &http::header::AUTHORIZATION);
        assert_eq!(nothing, NO_CREDENTIAL);
    }

    #[test]
    fn principals_of_different_modes_never_collide() {
        let token = token_principal(
            &headers(&[("authorization", "x")]),
            &http::header::AUTHORIZATION,
        );
        assert_eq!(token.len(), 64);
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
        for p in [
            prefixed_digest("jwt:", "iss", "sub"),
            prefixed_digest("introspection:", "iss", "sub"),
            prefixed_digest_of("header:", b"x"),
        ] {
            assert!(p.contains(':') && !p.starts_with("x509"), "{p}");
        }
        assert_ne!(
            prefixed_digest("jwt:", "ab", "c"),
            prefixed_digest("jwt:", "a", "bc")
        );
    }

    #[test]
    fn the_authenticator_and_its_answer_can_cross_threads() {
        fn send_sync<T: Send + Sync>(_: &T) {}
        fn send<T: Send>(_: T) {}
        let auth = Authenticator::new(&Config::default()).unwrap();
        send_sync(&auth);
        send(auth.identify(&HeaderMap::new()));
    }

    #[test]
    fn a_challenge_names_invalid_token_only_when_a_token_was_sent() {
        let missing = Refusal::Unauthenticated(RefusalReason::Missing);
        assert_eq!(missing.challenge(), Some("Bearer"));
        let forged = Refusal::Unauthenticated(RefusalReason::Signature);
        assert_eq!(forged.challenge(), Some("Bearer error=\"invalid_token\""));
        assert_eq!(Refusal::Unavailable("down".into()).challenge(), None);
    }
}
