//! `principal = "jwt"` through the proxy: a session belongs to the person a
//! verified token names, not to one token. An authorization server on
//! loopback publishes the keys; tokens are signed here; the demo upstream
//! checks nothing, so the proxy is the only gate.

mod common;
#[path = "auth/keys.rs"]
#[allow(dead_code)]
mod keys;
#[path = "auth/server.rs"]
#[allow(dead_code)]
mod server;

use std::time::{SystemTime, UNIX_EPOCH};

use common::*;
use http::StatusCode;
use keys::TestKey;
use mcp_resume_proxy::auth::config::JwtConfig;
use mcp_resume_proxy::auth::{AuthConfig, PrincipalMode};
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::{json, Value};
use server::AuthServer;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(issuer: &str, sub: &str) -> Value {
    json!({"iss": issuer, "sub": sub, "aud": "mcp", "iat": now(), "exp": now() + 60})
}

/// The demo upstream behind a proxy that verifies JWTs of `server`.
async fn rig(server: &AuthServer) -> Rig {
    let jwt = JwtConfig {
        issuer: server.issuer(),
        jwks_url: Some(server.url("/jwks")),
        audience: vec!["mcp".into()],
        claim: "sub".into(),
        algorithms: ["RS256", "ES256", "EdDSA"].map(String::from).to_vec(),
        refetch_min_secs: 1,
        refresh_secs: 900,
        leeway_secs: 0,
    };
    Rig::with(DemoOptions::default(), |c| {
        c.auth = AuthConfig {
            principal: PrincipalMode::Jwt,
            jwt: Some(jwt),
            ..AuthConfig::default()
        }
    })
    .await
}

async fn started(key: &TestKey) -> (AuthServer, Rig) {
    let server = AuthServer::start().await;
    server.publish(&[key]);
    let rig = rig(&server).await;
    (server, rig)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn session_of(rig: &Rig, token: &str) -> String {
    let init = Call::post(&initialize(V_LATEST)).header("authorization", &bearer(token));
    let res = rig.client.send(init).await;
    assert_eq!(res.status(), StatusCode::OK);
    let session = session_id(res.headers()).expect("session id");
    read_all(res).await;
    session
}

fn ping(session: &str, token: &str) -> Call {
    Call::post(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .session(session)
        .header("authorization", &bearer(token))
}

#[tokio::test]
async fn a_refreshed_token_of_the_same_person_keeps_the_session() {
    let key = TestKey::es256("k1");
    let (server, rig) = started(&key).await;
    let first = key.sign(&claims(&server.issuer(), "alice"));
    let session = session_of(&rig, &first).await;
    let mut refreshed = claims(&server.issuer(), "alice");
    refreshed["jti"] = json!("second");
    let res = rig.client.send(ping(&session, &key.sign(&refreshed))).await;
    assert_eq!(res.status(), StatusCode::OK);
    // And the first token still works: both are alice's.
    assert_eq!(
        rig.client.send(ping(&session, &first)).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn another_persons_valid_token_on_a_session_gets_404() {
    let key = TestKey::es256("k1");
    let (server, rig) = started(&key).await;
    let session = session_of(&rig, &key.sign(&claims(&server.issuer(), "alice"))).await;
    let bob = key.sign(&claims(&server.issuer(), "bob"));
    assert_eq!(
        rig.client.send(ping(&session, &bob)).await.status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn tokens_that_do_not_verify_get_401_naming_the_proxys_metadata() {
    let key = TestKey::es256("k1");
    let stranger = TestKey::es256("k1");
    let (server, rig) = started(&key).await;
    let iss = server.issuer();
    let session = session_of(&rig, &key.sign(&claims(&iss, "alice"))).await;
    let mut expired = claims(&iss, "alice");
    expired["exp"] = json!(now() - 120);
    let mut other_audience = claims(&iss, "alice");
    other_audience["aud"] = json!("someone-else");
    let bad = [
        ("forged", stranger.sign(&claims(&iss, "alice"))),
        ("unsigned", keys::unsigned(&claims(&iss, "alice"))),
        (
            "hs256",
            keys::hs256("k1", &key.public_der(), &claims(&iss, "alice")),
        ),
        (
            "wrong issuer",
            key.sign(&claims("https://evil.example", "alice")),
        ),
        ("wrong audience", key.sign(&other_audience)),
        ("expired", key.sign(&expired)),
        ("not a jwt", "opaque".to_owned()),
    ];
    let metadata = format!(
        "resource_metadata=\"http://{}/.well-known/oauth-protected-resource/mcp\"",
        rig.proxy.as_ref().unwrap().addr
    );
    for (what, token) in bad {
        // The same answer with or without a session: it tells nothing of it.
        for call in [ping(&session, &token), ping("no-such-session", &token)] {
            let res = rig.client.send(call).await;
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{what}");
            let challenge = res.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .to_owned();
            assert!(
                challenge.starts_with("Bearer error=\"invalid_token\""),
                "{what}: {challenge}"
            );
            assert!(challenge.contains(&metadata), "{what}: {challenge}");
        }
    }
}

#[tokio::test]
async fn no_token_gets_a_plain_bearer_challenge() {
    let key = TestKey::es256("k1");
    let (_server, rig) = started(&key).await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let challenge = res.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        challenge.starts_with("Bearer resource_metadata="),
        "{challenge}"
    );
}

#[tokio::test]
async fn an_unreachable_key_set_gets_503_and_ends_no_session() {
    let key = TestKey::es256("k1");
    let (server, rig) = started(&key).await;
    let token = key.sign(&claims(&server.issuer(), "alice"));
    let session = session_of(&rig, &token).await;
    server.set_down(true);
    // Past the refetch interval, so the unknown key is asked for.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let rotated = TestKey::es256("k2");
    let res = rig
        .client
        .send(ping(
            &session,
            &rotated.sign(&claims(&server.issuer(), "alice")),
        ))
        .await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    // The session and its known key still serve.
    assert_eq!(
        rig.client.send(ping(&session, &token)).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_rotated_key_is_picked_up_and_the_session_kept() {
    let key = TestKey::es256("k1");
    let (server, rig) = started(&key).await;
    let session = session_of(&rig, &key.sign(&claims(&server.issuer(), "alice"))).await;
    let rotated = TestKey::ed25519("k2");
    server.publish(&[&key, &rotated]);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let res = rig
        .client
        .send(ping(
            &session,
            &rotated.sign(&claims(&server.issuer(), "alice")),
        ))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
}
