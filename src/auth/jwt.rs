//! `principal = "jwt"`: a bearer token is a JWS the issuer signed. Its
//! header is read here (so that `none`, HS* and unknown algorithms are
//! refused before any key is looked at), its signature is checked by
//! jsonwebtoken with the key [`super::jwks`] names, its claims (`iss`,
//! `exp`, `nbf`, `aud`) here, and what it proved is cached by the token's
//! digest until its `exp`.
//!
//! It decides whether a token stands for a person and which; it does not
//! fetch keys, log, count or answer HTTP (the [`Authenticator`] does), and
//! never keeps a token, only its digest.
//!
//! [`Authenticator`]: super::Authenticator

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use jsonwebtoken::Algorithm;
use serde_json::{Map, Value};

use super::cache::{token_key, TokenCache, Vouched};
use super::fetch::Fetcher;
use super::jwks::{KeySource, Miss};
use super::{prefixed_digest, Failure, RefusalReason as Why};
use crate::config::auth::JwtConfig;

/// Most verified tokens remembered.
const VERIFIED_TOKENS: usize = 10_000;

pub struct JwtVerifier {
    issuer: String,
    audience: Vec<String>,
    claim: String,
    algorithms: Vec<Algorithm>,
    leeway: u64,
    keys: Arc<KeySource>,
    verified: TokenCache,
}

/// A token split into what is signed, its header, claims and signature.
struct Parts<'t> {
    signed: &'t str,
    signature: &'t str,
    alg: String,
    kid: Option<String>,
    claims: Map<String, Value>,
}

impl JwtVerifier {
    pub fn new(config: &JwtConfig, fetcher: Arc<Fetcher>) -> anyhow::Result<Self> {
        let algorithms = config
            .algorithms
            .iter()
            .map(|a| {
                Algorithm::from_str(a).map_err(|_| anyhow::anyhow!("auth.jwt.algorithms: {a:?}"))
            })
            .collect::<anyhow::Result<_>>()?;
        let jwks_url = match &config.jwks_url {
            Some(url) => Some(
                url.parse()
                    .map_err(|e| anyhow::anyhow!("auth.jwt.jwks_url = {url:?}: {e}"))?,
            ),
            None => None,
        };
        let refetch = Duration::from_secs(config.refetch_min_secs);
        let refresh = Duration::from_secs(config.refresh_secs);
        Ok(Self {
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            claim: config.claim.clone(),
            algorithms,
            leeway: config.leeway_secs,
            keys: Arc::new(KeySource::new(
                fetcher,
                config.issuer.clone(),
                jwks_url,
                refetch,
                refresh,
            )),
            verified: TokenCache::new(VERIFIED_TOKENS),
        })
    }

    /// Whom `token` stands for at `now` (Unix seconds).
    pub async fn principal(&self, token: &str, now: u64) -> Result<Vouched, Failure> {
        let digest = token_key(token);
        if let Some(vouched) = self.verified.get(&digest, now) {
            return Ok(vouched);
        }
        let parts = split(token)?;
        let alg = self.algorithm(&parts.alg)?;
        // The issuer is checked before any key is looked for: a token of
        // another issuer must not make this one's key set be fetched.
        let issuer = parts.claims.get("iss").and_then(Value::as_str);
        if issuer != Some(self.issuer.as_str()) {
            return Err(Failure::Refused(
                Why::Issuer,
                "iss is not the configured issuer",
            ));
        }
        self.verify_signature(&parts, alg).await?;
        let exp = self.check_claims(&parts.claims, now)?;
        let subject = match parts.claims.get(&self.claim) {
            Some(Value::String(s)) if !s.is_empty() => s.as_str(),
            _ => return Err(Failure::Refused(Why::Malformed, "no person claim")),
        };
        let vouched = Vouched {
            principal: prefixed_digest("jwt:", &self.issuer, subject).into(),
            until: exp.saturating_add(self.leeway),
        };
        self.verified.insert(digest, vouched.clone());
        Ok(vouched)
    }

    /// The signature, with the key the token names; the key must be of
    /// the algorithm's family (and the JWK's own `alg`, when it has one).
    async fn verify_signature(&self, parts: &Parts<'_>, alg: Algorithm) -> Result<(), Failure> {
        let key = self
            .keys
            .key(parts.kid.as_deref())
            .await
            .map_err(|miss| match miss {
                Miss::Unknown => {
                    Failure::Refused(Why::UnknownKey, "no key of the set matches the kid")
                }
                Miss::Unavailable(why) => Failure::Unavailable(format!("JWKS: {why}")),
            })?;
        if !key.kind.fits(alg) || key.alg.as_deref().is_some_and(|a| a != parts.alg) {
            return Err(Failure::Refused(
                Why::Algorithm,
                "the algorithm does not fit the key",
            ));
        }
        let valid = jsonwebtoken::crypto::verify(
            parts.signature,
            parts.signed.as_bytes(),
            &key.decoding,
            alg,
        );
        if !matches!(valid, Ok(true)) {
            return Err(Failure::Refused(
                Why::Signature,
                "the signature does not verify",
            ));
        }
        Ok(())
    }

    /// The token's algorithm, when it is one of the accepted ones (never
    /// `none` or HS*: the configuration cannot list them).
    fn algorithm(&self, name: &str) -> Result<Algorithm, Failure> {
        Algorithm::from_str(name)
            .ok()
            .filter(|alg| self.algorithms.contains(alg))
            .ok_or(Failure::Refused(
                Why::Algorithm,
                "the algorithm is not accepted",
            ))
    }

    /// `exp` (required), `nbf` and `aud` (when configured); the `exp`.
    fn check_claims(&self, claims: &Map<String, Value>, now: u64) -> Result<u64, Failure> {
        let time = |name: &str| {
            claims
                .get(name)
                .map(|v| v.as_f64().map(|t| t.max(0.0) as u64))
        };
        let exp = match time("exp") {
            Some(Some(exp)) => exp,
            _ => return Err(Failure::Refused(Why::Malformed, "no numeric exp")),
        };
        if now > exp.saturating_add(self.leeway) {
            return Err(Failure::Refused(Why::Expired, "exp has passed"));
        }
        match time("nbf") {
            None => {}
            Some(Some(nbf)) if nbf <= now.saturating_add(self.leeway) => {}
            Some(Some(_)) => return Err(Failure::Refused(Why::NotYetValid, "nbf is ahead")),
            Some(None) => return Err(Failure::Refused(Why::Malformed, "nbf is not a number")),
        }
        if !self.audience.is_empty() && !audience_matches(claims.get("aud"), &self.audience) {
            return Err(Failure::Refused(
                Why::Audience,
                "aud names none of the audiences",
            ));
        }
        Ok(exp)
    }
}

fn audience_matches(aud: Option<&Value>, wanted: &[String]) -> bool {
    match aud {
        Some(Value::String(one)) => wanted.contains(one),
        Some(Value::Array(many)) => many
            .iter()
            .filter_map(Value::as_str)
            .any(|a| wanted.iter().any(|w| w == a)),
        _ => false,
    }
}

/// `header.payload.signature`, with header and payload decoded. Only the
/// compact JWS form; a header with `crit` is refused, since no extension
/// is understood here (RFC 7515 section 4.1.11).
fn split(token: &str) -> Result<Parts<'_>, Failure> {
    const MALFORMED: Failure = Failure::Refused(Why::Malformed, "not a compact JWS");
    let (signed, signature) = token.rsplit_once('.').ok_or(MALFORMED)?;
    let (header, payload) = signed.split_once('.').ok_or(MALFORMED)?;
    if payload.contains('.') {
        return Err(MALFORMED);
    }
    let header = decode_object(header).ok_or(MALFORMED)?;
    let claims = decode_object(payload).ok_or(MALFORMED)?;
    if header.contains_key("crit") {
        return Err(Failure::Refused(Why::Malformed, "a crit header"));
    }
    let alg = match header.get("alg") {
        Some(Value::String(alg)) => alg.clone(),
        _ => return Err(Failure::Refused(Why::Algorithm, "no alg")),
    };
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(MALFORMED),
    };
    Ok(Parts {
        signed,
        signature,
        alg,
        kid,
        claims,
    })
}

fn decode_object(part: &str) -> Option<Map<String, Value>> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(v: &Value) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    }

    fn verifier(audience: &[&str]) -> JwtVerifier {
        let config = JwtConfig {
            issuer: "https://as".into(),
            jwks_url: Some("http://127.0.0.1:9/jwks".into()),
            audience: audience.iter().map(|a| a.to_string()).collect(),
            claim: "sub".into(),
            algorithms: vec!["ES256".into()],
            refetch_min_secs: 60,
            refresh_secs: 900,
            leeway_secs: 30,
        };
        JwtVerifier::new(&config, Arc::new(Fetcher::new().unwrap())).unwrap()
    }

    fn reason(result: Result<impl std::fmt::Debug, Failure>) -> Why {
        match result {
            Err(Failure::Refused(why, _)) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_token_splits_into_header_claims_and_signature() {
        let token = format!(
            "{}.{}.c2ln",
            b64(&json!({"alg": "ES256", "kid": "k1"})),
            b64(&json!({"sub": "ann"}))
        );
        let parts = split(&token).unwrap();
        assert_eq!(
            (parts.alg.as_str(), parts.kid.as_deref()),
            ("ES256", Some("k1"))
        );
        assert_eq!(parts.claims["sub"], "ann");
        assert_eq!(parts.signature, "c2ln");
        for bad in ["", "a.b", "a.b.c.d", "!.e30.c2ln", "W10.e30.c2ln"] {
            assert_eq!(reason(split(bad).map(|_| ())), Why::Malformed, "{bad}");
        }
        let crit = format!("{}.e30.c2ln", b64(&json!({"alg": "ES256", "crit": ["x"]})));
        assert_eq!(reason(split(&crit).map(|_| ())), Why::Malformed);
        // An unsigned token is refused for its algorithm, not its shape.
        assert_eq!(reason(split("e30.e30.").map(|_| ())), Why::Algorithm);
    }

    #[test]
    fn none_and_hmac_and_unlisted_algorithms_are_refused() {
        let v = verifier(&[]);
        for alg in ["none", "HS256", "RS256", "ES256K", ""] {
            assert_eq!(reason(v.algorithm(alg)), Why::Algorithm, "{alg}");
        }
        assert_eq!(v.algorithm("ES256").unwrap(), Algorithm::ES256);
    }

    #[test]
    fn claims_are_checked_with_leeway() {
        let v = verifier(&["https://mcp/mcp"]);
        let claims = |c: Value| c.as_object().cloned().unwrap();
        let ok = claims(json!({"exp": 1000, "nbf": 900, "aud": ["x", "https://mcp/mcp"]}));
        assert_eq!(v.check_claims(&ok, 1029).unwrap(), 1000);
        assert_eq!(reason(v.check_claims(&ok, 1031)), Why::Expired);
        assert_eq!(reason(v.check_claims(&ok, 800)), Why::NotYetValid);
        let other = claims(json!({"exp": 1000, "aud": "https://other"}));
        assert_eq!(reason(v.check_claims(&other, 900)), Why::Audience);
        let no_exp = claims(json!({"aud": "https://mcp/mcp"}));
        assert_eq!(reason(v.check_claims(&no_exp, 900)), Why::Malformed);
        let any_aud = verifier(&[]);
        assert!(any_aud.check_claims(&other, 900).is_ok());
    }
}
