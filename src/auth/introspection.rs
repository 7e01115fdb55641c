//! `principal = "introspection"`: the authorization server is asked about a
//! bearer token (RFC 7662, with the proxy's client credentials), once per
//! token; an active answer is cached by the token's digest until its `exp`,
//! at most `cache_max_secs`, so a cached answer still decides while the
//! endpoint is down. Requests that bring the same new token at once (a
//! client's first requests on a session often do) share one call.
//!
//! It decides whether a token stands for a person and which; it does not
//! log, count or answer HTTP (the [`Authenticator`] does), and it never
//! keeps a token or the client secret anywhere but in the request it sends
//! (the credentials live in a header value marked sensitive).
//!
//! [`Authenticator`]: super::Authenticator

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine;
use http::{HeaderValue, Uri};
use serde_json::Value;

use super::cache::{token_key, TokenCache, TokenKey, Vouched};
use super::config::IntrospectionConfig;
use super::fetch::{form_encode, Fetcher};
use super::{prefixed_digest, Failure, RefusalReason as Why};

pub struct Introspector {
    fetcher: Arc<Fetcher>,
    endpoint: Uri,
    /// `Basic` with the client id and secret.
    credentials: HeaderValue,
    cache: TokenCache,
    cache_max_secs: u64,
    /// The member naming the person (`claim`); unset: `sub`, else `username`.
    claim: Option<String>,
    /// Tokens being asked about: later requests with one wait their turn
    /// and then find the answer cached. An entry lives while a request
    /// holds it ([`Flight`] removes it).
    in_flight: Mutex<HashMap<TokenKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// A request's place in the queue of one token's requests.
struct Flight<'a> {
    map: &'a Mutex<HashMap<TokenKey, Arc<tokio::sync::Mutex<()>>>>,
    key: TokenKey,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl<'a> Flight<'a> {
    fn join(map: &'a Mutex<HashMap<TokenKey, Arc<tokio::sync::Mutex<()>>>>, key: TokenKey) -> Self {
        let mut flights = map.lock().unwrap_or_else(|e| e.into_inner());
        let gate = flights.entry(key).or_default().clone();
        Self { map, key, gate }
    }
}

impl Drop for Flight<'_> {
    /// The last request of a token removes its entry, also when it was
    /// cancelled while waiting.
    fn drop(&mut self) {
        let mut flights = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // The map's reference and this one: nobody else waits.
        if Arc::strong_count(&self.gate) <= 2 {
            flights.remove(&self.key);
        }
    }
}

impl Introspector {
    pub fn new(config: &IntrospectionConfig, fetcher: Arc<Fetcher>) -> anyhow::Result<Self> {
        let endpoint = config.endpoint.parse().map_err(|e| {
            anyhow::anyhow!("auth.introspection.endpoint = {:?}: {e}", config.endpoint)
        })?;
        let secret = read_secret(config)?;
        // RFC 6749 section 2.3.1: both form-encoded before Basic encoding.
        let pair = format!(
            "{}:{}",
            form_encode(&config.client_id),
            form_encode(&secret)
        );
        let basic = base64::engine::general_purpose::STANDARD.encode(pair);
        let mut credentials = HeaderValue::from_str(&format!("Basic {basic}"))?;
        credentials.set_sensitive(true);
        Ok(Self {
            fetcher,
            endpoint,
            credentials,
            cache: TokenCache::new(config.cache_entries),
            cache_max_secs: config.cache_max_secs,
            claim: config.claim.clone(),
            in_flight: Mutex::default(),
        })
    }

    /// Whom `token` stands for at `now` (Unix seconds).
    pub async fn principal(&self, token: &str, now: u64) -> Result<Vouched, Failure> {
        let digest = token_key(token);
        if let Some(vouched) = self.cache.get(&digest, now) {
            return Ok(vouched);
        }
        let flight = Flight::join(&self.in_flight, digest);
        let _turn = flight.gate.lock().await;
        // The request before this one may have asked already.
        if let Some(vouched) = self.cache.get(&digest, now) {
            return Ok(vouched);
        }
        let form = format!("token={}&token_type_hint=access_token", form_encode(token));
        let answer = self
            .fetcher
            .post_form(&self.endpoint, &self.credentials, form)
            .await
            .map_err(|e| Failure::Unavailable(format!("introspection: {e}")))?;
        let endpoint = self.endpoint.to_string();
        let vouched = interpret(
            &answer,
            &endpoint,
            self.claim.as_deref(),
            now,
            self.cache_max_secs,
        )?;
        self.cache.insert(digest, vouched.clone());
        Ok(vouched)
    }
}

/// The client secret, from its file (one line; the line end is not part of
/// it) or its environment variable.
fn read_secret(config: &IntrospectionConfig) -> anyhow::Result<String> {
    let secret = match (&config.client_secret_file, &config.client_secret_env) {
        (Some(file), _) => std::fs::read_to_string(file).map_err(|e| {
            anyhow::anyhow!(
                "auth.introspection.client_secret_file = {}: {e}",
                file.display()
            )
        })?,
        (None, Some(var)) => std::env::var(var)
            .map_err(|e| anyhow::anyhow!("auth.introspection.client_secret_env = {var:?}: {e}"))?,
        (None, None) => anyhow::bail!("auth.introspection needs a client secret"),
    };
    let secret = secret.trim_end_matches(['\r', '\n']).to_owned();
    if secret.is_empty() {
        anyhow::bail!("auth.introspection: the client secret is empty");
    }
    Ok(secret)
}

/// What an introspection answer says about its token: active, whose (`sub`,
/// else `username`) and until when (`exp`, bounded by `max_secs` from now).
/// The principal is bound to the answer's `iss`, or to the endpoint when
/// the server names none.
pub fn interpret(
    answer: &Value,
    endpoint: &str,
    claim: Option<&str>,
    now: u64,
    max_secs: u64,
) -> Result<Vouched, Failure> {
    if answer.get("active").and_then(Value::as_bool) != Some(true) {
        return Err(Failure::Refused(Why::Inactive, "the token is not active"));
    }
    let text = |name: &str| {
        answer
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let person = match claim {
        Some(claim) => text(claim),
        None => text("sub").or_else(|| text("username")),
    };
    let Some(person) = person else {
        return Err(Failure::Refused(
            Why::Malformed,
            "active, but the claim naming the person is missing",
        ));
    };
    let until = now.saturating_add(max_secs);
    let until = match answer.get("exp").map(Value::as_f64) {
        None => until,
        Some(Some(exp)) if exp > now as f64 => until.min(exp as u64),
        Some(Some(_)) => return Err(Failure::Refused(Why::Expired, "active, but exp has passed")),
        Some(None) => return Err(Failure::Refused(Why::Malformed, "exp is not a number")),
    };
    let issuer = text("iss").unwrap_or(endpoint);
    Ok(Vouched {
        principal: prefixed_digest("introspection:", issuer, person).into(),
        until,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reason(result: Result<Vouched, Failure>) -> Why {
        match result {
            Err(Failure::Refused(why, _)) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn an_active_answer_names_its_subject_until_its_exp_at_most_the_cap() {
        let e = "https://as/introspect";
        let a = interpret(
            &json!({"active": true, "sub": "ann", "exp": 1100}),
            e,
            None,
            1000,
            300,
        );
        let a = a.unwrap();
        assert_eq!(a.until, 1100);
        assert!(a.principal.starts_with("introspection:"));
        let capped = interpret(
            &json!({"active": true, "sub": "ann", "exp": 9999}),
            e,
            None,
            1000,
            300,
        );
        assert_eq!(
            capped.unwrap(),
            Vouched {
                until: 1300,
                ..a.clone()
            }
        );
        let by_name = interpret(
            &json!({"active": true, "username": "ann"}),
            e,
            None,
            1000,
            300,
        );
        let by_client = interpret(
            &json!({"active": true, "sub": "x", "client_id": "ann"}),
            e,
            Some("client_id"),
            1000,
            300,
        );
        assert_eq!(
            by_client.unwrap().principal,
            by_name.as_ref().unwrap().principal,
            "a configured claim names the person"
        );
        assert_eq!(
            by_name.unwrap().principal,
            a.principal,
            "username stands in for sub"
        );
        let other_as = interpret(
            &json!({"active": true, "sub": "ann", "iss": "x"}),
            e,
            None,
            1000,
            300,
        );
        assert_ne!(other_as.unwrap().principal, a.principal);
    }

    #[test]
    fn a_token_leaves_the_flights_with_its_last_request() {
        let map = Mutex::default();
        let first = Flight::join(&map, [1; 32]);
        let second = Flight::join(&map, [1; 32]);
        assert!(Arc::ptr_eq(&first.gate, &second.gate));
        drop(first);
        assert_eq!(map.lock().unwrap().len(), 1);
        drop(second);
        assert!(map.lock().unwrap().is_empty());
    }

    #[test]
    fn inactive_or_unnamed_or_expired_answers_refuse() {
        let e = "https://as/introspect";
        assert_eq!(
            reason(interpret(&json!({"active": false}), e, None, 0, 300)),
            Why::Inactive
        );
        assert_eq!(
            reason(interpret(&json!({"sub": "a"}), e, None, 0, 300)),
            Why::Inactive
        );
        assert_eq!(
            reason(interpret(&json!({"active": "true"}), e, None, 0, 300)),
            Why::Inactive
        );
        assert_eq!(
            reason(interpret(&json!({"active": true}), e, None, 0, 300)),
            Why::Malformed
        );
        let late = json!({"active": true, "sub": "a", "exp": 10});
        assert_eq!(reason(interpret(&late, e, None, 10, 300)), Why::Expired);
    }
}
