//! `[auth]`: the principal a request speaks for, found by a real
//! [`Authenticator`] against a real authorization server on loopback (RFC
//! 8414 metadata, a JWKS, RFC 7662 introspection) with tokens signed here.
//! One behaviour per test; each test's server stops when the test ends.

#[path = "auth/keys.rs"]
mod keys;
#[path = "auth/server.rs"]
mod server;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use keys::TestKey;
use mcp_resume_proxy::auth::config::{IntrospectionConfig, JwtConfig};
use mcp_resume_proxy::auth::{
    AuthConfig, Authenticator, Caller, PrincipalMode, Refusal, RefusalReason,
};
use mcp_resume_proxy::config::Config;
use mcp_resume_proxy::metrics::Metrics;
use serde_json::{json, Value};
use server::AuthServer;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn bearer(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let value = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
    headers.insert("authorization", value);
    headers
}

fn jwt_config(issuer: &str, jwks_url: Option<String>) -> JwtConfig {
    JwtConfig {
        issuer: issuer.into(),
        jwks_url,
        audience: Vec::new(),
        claim: "sub".into(),
        algorithms: ["RS256", "ES256", "EdDSA"].map(String::from).to_vec(),
        refetch_min_secs: 60,
        refresh_secs: 900,
        leeway_secs: 0,
    }
}

fn authenticator(auth: AuthConfig) -> Authenticator {
    let config = Config {
        auth,
        ..Config::default()
    };
    Authenticator::new(&config).expect("authenticator")
}

fn jwt_mode(jwt: JwtConfig) -> Authenticator {
    authenticator(AuthConfig {
        principal: PrincipalMode::Jwt,
        jwt: Some(jwt),
        ..AuthConfig::default()
    })
}

/// An authorization server publishing `key`, and an authenticator that
/// trusts it through `jwks_url`.
async fn jwt_rig(key: &TestKey, tweak: impl FnOnce(&mut JwtConfig)) -> (AuthServer, Authenticator) {
    let server = AuthServer::start().await;
    server.publish(&[key]);
    let mut config = jwt_config(&server.issuer(), Some(server.url("/jwks")));
    tweak(&mut config);
    (server, jwt_mode(config))
}

/// Claims of a good token of `sub` from `issuer`, valid for a minute.
fn claims(issuer: &str, sub: &str) -> Value {
    json!({"iss": issuer, "sub": sub, "iat": now(), "exp": now() + 60})
}

async fn identify(auth: &Authenticator, metrics: &Metrics, token: &str) -> Result<Caller, Refusal> {
    let outcome = auth.identify(&bearer(token)).await;
    metrics.auth_outcome(auth.mode(), &outcome);
    outcome
}

fn metric(metrics: &Metrics, series: &str) -> u64 {
    let text = metrics.render(0, 0);
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

async fn refused(auth: &Authenticator, token: &str, reason: RefusalReason) {
    let metrics = Metrics::new();
    let result = identify(auth, &metrics, token).await;
    assert_eq!(result, Err(Refusal::Unauthenticated(reason)));
    let series = format!(
        "mcp_proxy_auth_refusals_total{{mode=\"jwt\",reason=\"{}\"}}",
        reason.as_str()
    );
    assert_eq!(metric(&metrics, &series), 1);
}

#[tokio::test]
async fn a_refreshed_token_of_the_same_subject_has_the_same_principal() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let metrics = Metrics::new();
    let first = key.sign(&claims(&server.issuer(), "ann"));
    let mut later = claims(&server.issuer(), "ann");
    later["exp"] = json!(now() + 3600);
    later["jti"] = json!("refreshed");
    let second = key.sign(&later);
    assert_ne!(first, second);
    let a = identify(&auth, &metrics, &first).await.unwrap();
    let b = identify(&auth, &metrics, &second).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(a.mode, PrincipalMode::Jwt);
    assert!(a.principal.starts_with("jwt:"), "{}", a.principal);
}

#[tokio::test]
async fn another_subject_has_another_principal() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let metrics = Metrics::new();
    let ann = identify(&auth, &metrics, &key.sign(&claims(&server.issuer(), "ann"))).await;
    let bob = identify(&auth, &metrics, &key.sign(&claims(&server.issuer(), "bob"))).await;
    assert_ne!(ann.unwrap().principal, bob.unwrap().principal);
}

#[tokio::test]
async fn every_accepted_algorithm_verifies() {
    for key in [
        TestKey::es256("ec"),
        TestKey::ed25519("ed"),
        TestKey::rs256("rsa"),
    ] {
        let (server, auth) = jwt_rig(&key, |_| {}).await;
        let token = key.sign(&claims(&server.issuer(), "ann"));
        let caller = identify(&auth, &Metrics::new(), &token).await;
        assert!(caller.is_ok(), "{}: {caller:?}", key.alg());
    }
}

#[tokio::test]
async fn a_repeated_token_is_verified_once() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let token = key.sign(&claims(&server.issuer(), "ann"));
    let metrics = Metrics::new();
    for _ in 0..3 {
        identify(&auth, &metrics, &token).await.unwrap();
    }
    server.set_down(true);
    assert!(identify(&auth, &metrics, &token).await.is_ok());
    assert_eq!(server.hits("/jwks"), 1);
}

#[tokio::test]
async fn a_token_signed_with_an_unknown_key_is_refused() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let stranger = TestKey::es256("stranger");
    let token = stranger.sign(&claims(&server.issuer(), "ann"));
    refused(&auth, &token, RefusalReason::UnknownKey).await;
}

#[tokio::test]
async fn a_forged_signature_under_a_known_kid_is_refused() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let forger = TestKey::es256("k1");
    let token = forger.sign(&claims(&server.issuer(), "ann"));
    refused(&auth, &token, RefusalReason::Signature).await;
    // A good token with its claims swapped for another person's.
    let good = key.sign(&claims(&server.issuer(), "ann"));
    let mut parts: Vec<&str> = good.split('.').collect();
    let swapped = keys::b64(claims(&server.issuer(), "bob").to_string().as_bytes());
    parts[1] = &swapped;
    refused(&auth, &parts.join("."), RefusalReason::Signature).await;
}

#[tokio::test]
async fn alg_none_is_refused() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let token = keys::unsigned(&claims(&server.issuer(), "ann"));
    refused(&auth, &token, RefusalReason::Algorithm).await;
}

#[tokio::test]
async fn an_hs256_token_signed_with_the_public_key_is_refused() {
    let key = TestKey::rs256("rsa");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let token = keys::hs256("rsa", &key.public_der(), &claims(&server.issuer(), "ann"));
    refused(&auth, &token, RefusalReason::Algorithm).await;
    // Nor with the key's own algorithm swapped for another the key fits.
    let header = json!({"alg": "ES256", "kid": "rsa"});
    let token = key.sign_with(&header, &claims(&server.issuer(), "ann"));
    refused(&auth, &token, RefusalReason::Algorithm).await;
}

#[tokio::test]
async fn a_wrong_issuer_is_refused() {
    let key = TestKey::es256("k1");
    let (_server, auth) = jwt_rig(&key, |_| {}).await;
    let token = key.sign(&claims("https://another.example", "ann"));
    refused(&auth, &token, RefusalReason::Issuer).await;
}

#[tokio::test]
async fn a_wrong_audience_is_refused() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |c| {
        c.audience = vec!["https://mcp.example/mcp".into()]
    })
    .await;
    let metrics = Metrics::new();
    let mut good = claims(&server.issuer(), "ann");
    good["aud"] = json!(["https://other.example", "https://mcp.example/mcp"]);
    assert!(identify(&auth, &metrics, &key.sign(&good)).await.is_ok());
    let mut wrong = claims(&server.issuer(), "ann");
    wrong["aud"] = json!("https://other.example/mcp");
    refused(&auth, &key.sign(&wrong), RefusalReason::Audience).await;
    let none = claims(&server.issuer(), "ann");
    refused(&auth, &key.sign(&none), RefusalReason::Audience).await;
}

#[tokio::test]
async fn an_expired_token_is_refused() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let mut old = claims(&server.issuer(), "ann");
    old["exp"] = json!(now() - 5);
    refused(&auth, &key.sign(&old), RefusalReason::Expired).await;
}

#[tokio::test]
async fn a_token_not_yet_valid_is_refused() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |_| {}).await;
    let mut early = claims(&server.issuer(), "ann");
    early["nbf"] = json!(now() + 30);
    refused(&auth, &key.sign(&early), RefusalReason::NotYetValid).await;
}

#[tokio::test]
async fn a_rotated_key_is_picked_up_on_its_new_kid() {
    let old = TestKey::es256("2026-01");
    let (server, auth) = jwt_rig(&old, |c| c.refetch_min_secs = 1).await;
    let metrics = Metrics::new();
    let before = identify(&auth, &metrics, &old.sign(&claims(&server.issuer(), "ann"))).await;
    let new = TestKey::ed25519("2026-02");
    server.publish(&[&old, &new]);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let after = identify(&auth, &metrics, &new.sign(&claims(&server.issuer(), "ann"))).await;
    assert_eq!(before.unwrap(), after.unwrap());
    assert_eq!(server.hits("/jwks"), 2);
}

#[tokio::test]
async fn a_key_removed_from_the_set_stops_verifying_once_the_set_is_refreshed() {
    let old = TestKey::es256("old");
    let (server, auth) = jwt_rig(&old, |c| (c.refetch_min_secs, c.refresh_secs) = (1, 1)).await;
    let metrics = Metrics::new();
    identify(&auth, &metrics, &old.sign(&claims(&server.issuer(), "ann")))
        .await
        .unwrap();
    let new = TestKey::es256("new");
    server.publish(&[&new]);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // An old set still answers, and is fetched again behind the request.
    let bob = old.sign(&claims(&server.issuer(), "bob"));
    assert!(identify(&auth, &metrics, &bob).await.is_ok());
    // Once the fetch behind it is done, the old key is gone.
    let unknown = Err(Refusal::Unauthenticated(RefusalReason::UnknownKey));
    let mut result = Ok(None);
    for i in 0..100 {
        let token = old.sign(&claims(&server.issuer(), &format!("p{i}")));
        result = identify(&auth, &metrics, &token).await.map(Some);
        if result.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(result, unknown.map(Some));
    assert_eq!(server.hits("/jwks"), 2);
    let dave = new.sign(&claims(&server.issuer(), "dave"));
    assert!(identify(&auth, &metrics, &dave).await.is_ok());
}

#[tokio::test]
async fn an_unknown_kid_refetches_at_most_once_per_interval() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |c| c.refetch_min_secs = 1).await;
    let metrics = Metrics::new();
    identify(&auth, &metrics, &key.sign(&claims(&server.issuer(), "ann")))
        .await
        .unwrap();
    assert_eq!(server.hits("/jwks"), 1);
    let stranger = TestKey::es256("stranger");
    let token = stranger.sign(&claims(&server.issuer(), "ann"));
    let unknown = Err(Refusal::Unauthenticated(RefusalReason::UnknownKey));
    for _ in 0..5 {
        assert_eq!(identify(&auth, &metrics, &token).await, unknown);
    }
    assert_eq!(
        server.hits("/jwks"),
        1,
        "within the interval nothing is fetched"
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Many misses at once share one fetch.
    let misses = (0..8).map(|_| identify(&auth, &metrics, &token));
    for result in futures_util::future::join_all(misses).await {
        assert_eq!(result, unknown);
    }
    assert_eq!(server.hits("/jwks"), 2);
}

#[tokio::test]
async fn keys_come_from_the_issuer_metadata_when_no_jwks_url() {
    let key = TestKey::es256("k1");
    let server = AuthServer::start().await;
    server.publish(&[&key]);
    let auth = jwt_mode(jwt_config(&server.issuer(), None));
    let token = key.sign(&claims(&server.issuer(), "ann"));
    assert!(identify(&auth, &Metrics::new(), &token).await.is_ok());
    assert_eq!(server.hits("/.well-known/oauth-authorization-server"), 1);
    assert_eq!(server.hits("/jwks"), 1);
}

#[tokio::test]
async fn metadata_that_names_another_issuer_gives_no_keys() {
    let key = TestKey::es256("k1");
    let server = AuthServer::start().await;
    server.publish(&[&key]);
    let issuer = server.issuer();
    server.set_issuer("https://impostor.example");
    let auth = jwt_mode(jwt_config(&issuer, None));
    let token = key.sign(&claims(&issuer, "ann"));
    let result = identify(&auth, &Metrics::new(), &token).await;
    assert!(matches!(result, Err(Refusal::Unavailable(_))), "{result:?}");
    assert_eq!(server.hits("/jwks"), 0);
}

#[tokio::test]
async fn an_unreachable_key_set_is_unavailable_not_refused() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let issuer = "https://as.example";
    let auth = jwt_mode(jwt_config(issuer, Some(format!("http://{closed}/jwks"))));
    let key = TestKey::es256("k1");
    let metrics = Metrics::new();
    let result = identify(&auth, &metrics, &key.sign(&claims(issuer, "ann"))).await;
    assert!(matches!(result, Err(Refusal::Unavailable(_))), "{result:?}");
    assert_eq!(
        metric(&metrics, "mcp_proxy_auth_unavailable_total{mode=\"jwt\"}"),
        1
    );
    let text = metrics.render(0, 0);
    let refusals = text
        .lines()
        .filter(|l| l.starts_with("mcp_proxy_auth_refusals_total"));
    assert!(refusals.clone().count() > 0 && refusals.into_iter().all(|l| l.ends_with(" 0")));
}

#[tokio::test]
async fn cached_keys_keep_verifying_while_the_key_set_is_down() {
    let key = TestKey::es256("k1");
    let (server, auth) = jwt_rig(&key, |c| c.refetch_min_secs = 1).await;
    let metrics = Metrics::new();
    identify(&auth, &metrics, &key.sign(&claims(&server.issuer(), "ann")))
        .await
        .unwrap();
    server.set_down(true);
    let bob = key.sign(&claims(&server.issuer(), "bob"));
    assert!(identify(&auth, &metrics, &bob).await.is_ok());
    // A kid the kept set lacks, with the set down: nothing decides.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let stranger = TestKey::es256("k2").sign(&claims(&server.issuer(), "ann"));
    let result = identify(&auth, &metrics, &stranger).await;
    assert!(matches!(result, Err(Refusal::Unavailable(_))), "{result:?}");
    // The failed refetch kept the old set.
    let carol = key.sign(&claims(&server.issuer(), "carol"));
    assert!(identify(&auth, &metrics, &carol).await.is_ok());
}

fn introspection_mode(server: &AuthServer, cache_max_secs: u64) -> Authenticator {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, format!("{}\n", server::CLIENT_SECRET)).unwrap();
    authenticator(AuthConfig {
        principal: PrincipalMode::Introspection,
        introspection: Some(IntrospectionConfig {
            endpoint: server.url("/introspect"),
            client_id: server::CLIENT_ID.into(),
            client_secret_file: Some(secret),
            client_secret_env: None,
            cache_entries: 100,
            cache_max_secs,
            claim: None,
        }),
        ..AuthConfig::default()
    })
}

#[tokio::test]
async fn introspection_names_the_subject_with_the_clients_credentials() {
    let server = AuthServer::start().await;
    let auth = introspection_mode(&server, 300);
    let metrics = Metrics::new();
    server.answer_for(
        "tok-1",
        json!({"active": true, "sub": "ann", "exp": now() + 60}),
    );
    server.answer_for("tok+2/=", json!({"active": true, "sub": "ann"}));
    let a = identify(&auth, &metrics, "tok-1").await.unwrap();
    let b = identify(&auth, &metrics, "tok+2/=").await.unwrap();
    assert_eq!(a, b);
    assert!(a.principal.starts_with("introspection:"), "{}", a.principal);
}

#[tokio::test]
async fn concurrent_requests_with_one_new_token_share_one_introspection() {
    let server = AuthServer::start().await;
    let auth = introspection_mode(&server, 300);
    let metrics = Metrics::new();
    server.answer_for("fresh", json!({"active": true, "sub": "ann"}));
    let requests = (0..8).map(|_| identify(&auth, &metrics, "fresh"));
    let callers = futures_util::future::join_all(requests).await;
    assert!(callers.iter().all(|c| c.is_ok()), "{callers:?}");
    assert_eq!(server.hits("/introspect"), 1);
}

#[tokio::test]
async fn introspection_inactive_is_refused() {
    let server = AuthServer::start().await;
    let auth = introspection_mode(&server, 300);
    let metrics = Metrics::new();
    server.answer_for("revoked", json!({"active": false}));
    let result = identify(&auth, &metrics, "revoked").await;
    assert_eq!(
        result,
        Err(Refusal::Unauthenticated(RefusalReason::Inactive))
    );
    let series = "mcp_proxy_auth_refusals_total{mode=\"introspection\",reason=\"inactive\"}";
    assert_eq!(metric(&metrics, series), 1);
}

#[tokio::test]
async fn introspection_result_is_cached_until_exp() {
    let server = AuthServer::start().await;
    let auth = introspection_mode(&server, 300);
    let metrics = Metrics::new();
    server.answer_for(
        "short",
        json!({"active": true, "sub": "ann", "exp": now() + 2}),
    );
    for _ in 0..3 {
        identify(&auth, &metrics, "short").await.unwrap();
    }
    assert_eq!(server.hits("/introspect"), 1);
    server.answer_for("short", json!({"active": false}));
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let result = identify(&auth, &metrics, "short").await;
    assert_eq!(
        result,
        Err(Refusal::Unauthenticated(RefusalReason::Inactive))
    );
    assert_eq!(server.hits("/introspect"), 2);
}

#[tokio::test]
async fn introspection_down_is_unavailable() {
    let server = AuthServer::start().await;
    let auth = introspection_mode(&server, 300);
    let metrics = Metrics::new();
    server.answer_for("known", json!({"active": true, "sub": "ann"}));
    identify(&auth, &metrics, "known").await.unwrap();
    server.set_down(true);
    let result = identify(&auth, &metrics, "new").await;
    assert!(matches!(result, Err(Refusal::Unavailable(_))), "{result:?}");
    let series = "mcp_proxy_auth_unavailable_total{mode=\"introspection\"}";
    assert_eq!(metric(&metrics, series), 1);
    // What was cached still answers while the endpoint is down.
    assert!(identify(&auth, &metrics, "known").await.is_ok());
}

#[tokio::test]
async fn a_request_without_a_bearer_token_is_refused_as_missing() {
    let server = AuthServer::start().await;
    let auth = introspection_mode(&server, 300);
    let result = auth.identify(&HeaderMap::new()).await;
    assert_eq!(
        result,
        Err(Refusal::Unauthenticated(RefusalReason::Missing))
    );
    assert_eq!(result.unwrap_err().challenge(), Some("Bearer"));
    assert_eq!(server.hits("/introspect"), 0);
}

#[tokio::test]
async fn header_mode_without_the_header_is_refused() {
    let auth = authenticator(AuthConfig {
        principal: PrincipalMode::Header,
        ..AuthConfig::default()
    });
    let result = auth.identify(&bearer("whatever")).await;
    assert_eq!(
        result,
        Err(Refusal::Unauthenticated(RefusalReason::Missing))
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-authenticated-user",
        HeaderValue::from_static("ann@example.com"),
    );
    let ann = auth.identify(&headers).await.unwrap();
    assert!(ann.principal.starts_with("header:"), "{}", ann.principal);
    headers.insert("authorization", HeaderValue::from_static("Bearer other"));
    assert_eq!(auth.identify(&headers).await.unwrap(), ann);
}

#[tokio::test]
async fn token_mode_principal_is_todays_digest() {
    let auth = authenticator(AuthConfig::default());
    for headers in [bearer("abc"), HeaderMap::new()] {
        let mut request = http::Request::new(());
        *request.headers_mut() = headers.clone();
        let (parts, ()) = request.into_parts();
        // Today's rule, written out: the hex SHA-256 of the whole value.
        let value = parts
            .headers
            .get("authorization")
            .map_or(&b""[..], |v| v.as_bytes());
        let today =
            mcp_resume_proxy::id::hex(ring::digest::digest(&ring::digest::SHA256, value).as_ref());
        let caller = auth.identify(&headers).await.unwrap();
        assert_eq!(caller.principal, today);
        assert_eq!(caller.mode, PrincipalMode::Token);
    }
}
