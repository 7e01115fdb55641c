//! Whose a bearer token *says* it is, unverified: with `principal =
//! "token"` the proxy holds no keys, but most access tokens are JWTs that
//! name their subject. A session created with such a token remembers the
//! digest of its `iss` and `sub`, and a refreshed token is taken as its
//! owner's only if it names the same ones — on top of the upstream
//! accepting it, never instead: an unverified claim can only refuse.
//!
//! Nothing here verifies or trusts a token; opaque tokens have no hint.

use base64::Engine;
use http::HeaderMap;
use serde::Deserialize;

use super::{bearer_token, prefixed_digest};

/// The most of a token's payload read for a hint.
const MAX_PAYLOAD: usize = 16 * 1024;

#[derive(Deserialize)]
struct Named {
    #[serde(default)]
    iss: Option<String>,
    sub: String,
}

/// `hint:` + the digest of the `iss` and `sub` a JWT-shaped bearer token
/// names; `None` for any other credential.
pub fn subject_hint(headers: &HeaderMap) -> Option<String> {
    let token = bearer_token(headers).ok()?;
    let mut parts = token.split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if payload.len() > MAX_PAYLOAD {
        return None;
    }
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let named: Named = serde_json::from_slice(&json).ok()?;
    Some(prefixed_digest(
        "hint:",
        named.iss.as_deref().unwrap_or(""),
        &named.sub,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", format!("Bearer {token}").parse().unwrap());
        h
    }

    fn jwt(payload: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", b64(r#"{"alg":"ES256"}"#), b64(payload))
    }

    #[test]
    fn two_tokens_of_one_subject_have_one_hint_and_another_subject_another() {
        let a1 = subject_hint(&bearer(&jwt(r#"{"iss":"as","sub":"alice","jti":"1"}"#)));
        let a2 = subject_hint(&bearer(&jwt(r#"{"iss":"as","sub":"alice","jti":"2"}"#)));
        let b = subject_hint(&bearer(&jwt(r#"{"iss":"as","sub":"bob"}"#)));
        assert!(a1.is_some());
        assert_eq!(a1, a2);
        assert_ne!(a1, b);
    }

    #[test]
    fn opaque_or_malformed_tokens_have_no_hint() {
        for token in [
            "opaque",
            "a.b",
            "a.b.c.d",
            &jwt(r#"{"iss":"as"}"#),
            &jwt("not json"),
        ] {
            assert_eq!(subject_hint(&bearer(token)), None, "{token}");
        }
        assert_eq!(subject_hint(&HeaderMap::new()), None);
    }
}
