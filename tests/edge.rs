//! The production edge, over real HTTP on loopback: an OAuth-protected MCP
//! server (the demo upstream behind a resource server that checks bearer
//! tokens, `common::guard`) used through the proxy as it is used direct —
//! discovery through the proxy's own URL, the upstream's authorization
//! paths, a refreshed token that keeps its session, browsers, and the
//! public URL an ingress names.

mod common;

use common::guard::Guard;
use common::*;
use http::{Method, StatusCode};
use mcp_resume_proxy::config::{Config, UpstreamConfig};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::Server;
use serde_json::{json, Value};

/// The demo upstream behind a guard, and a proxy in front of the guard.
struct Protected {
    guard: Guard,
    proxy: Server,
    _demo: DemoUpstream,
    _dir: tempfile::TempDir,
}

impl Protected {
    async fn start(tweak: impl FnOnce(&mut Config)) -> Protected {
        let demo = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
            .await
            .expect("demo upstream");
        let guard = Guard::start(demo.url()).await;
        guard.grant("alice-1", "alice");
        guard.grant("alice-2", "alice");
        guard.grant("bob-1", "bob");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config {
            listen: ([127, 0, 0, 1], 0).into(),
            data_dir: dir.path().to_path_buf(),
            upstream: vec![UpstreamConfig::new(guard.url())],
            shutdown_grace_secs: 1,
            ..Config::default()
        };
        tweak(&mut config);
        let proxy = Server::start(config).await.expect("proxy starts");
        Protected {
            guard,
            proxy,
            _demo: demo,
            _dir: dir,
        }
    }

    fn base(&self) -> String {
        format!("http://{}", self.proxy.addr)
    }

    fn client(&self, path: &str) -> McpClient {
        McpClient::new(format!("{}{path}", self.base()))
    }

    async fn session_of(&self, token: &str) -> String {
        let mcp = self.client("/mcp");
        let init = Call::post(&initialize(V_LATEST)).header("authorization", &bearer(token));
        let res = mcp.send(init).await;
        assert_eq!(res.status(), StatusCode::OK);
        let session = session_id(res.headers()).expect("session id");
        read_all(res).await;
        session
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn plain_get() -> Call {
    Call {
        method: Method::GET,
        headers: vec![],
        body: Default::default(),
    }
}

fn ping(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"ping"})
}

#[tokio::test]
async fn a_401_names_the_proxys_metadata_url_and_the_metadata_the_proxys_resource() {
    let p = Protected::start(|_| {}).await;
    let res = p
        .client("/mcp")
        .send(Call::post(&initialize(V_LATEST)))
        .await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let challenge = res.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_owned();
    let metadata_url = format!("{}/.well-known/oauth-protected-resource/mcp", p.base());
    assert!(
        challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")),
        "{challenge}"
    );
    assert!(
        challenge.starts_with("Bearer error=\"invalid_token\""),
        "{challenge}"
    );

    let res = McpClient::new(metadata_url).send(plain_get()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let metadata = body_json(res).await;
    assert_eq!(metadata["resource"], format!("{}/mcp", p.base()));
    assert_eq!(
        metadata["authorization_servers"],
        json!(["http://localhost:9/"])
    );
}

#[tokio::test]
async fn the_root_metadata_reaches_the_only_upstream() {
    let p = Protected::start(|_| {}).await;
    let res = p
        .client("/.well-known/oauth-protected-resource")
        .send(plain_get())
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        body_json(res).await["resource"],
        format!("{}/mcp", p.base())
    );
}

#[tokio::test]
async fn an_upstream_that_names_the_public_url_passes_untouched() {
    let p = Protected::start(|_| {}).await;
    p.guard
        .with(|s| s.resource = Some("https://mcp.example.com/mcp".into()));
    let res = p
        .client("/.well-known/oauth-protected-resource/mcp")
        .send(plain_get())
        .await;
    assert_eq!(
        body_json(res).await["resource"],
        "https://mcp.example.com/mcp"
    );
}

#[tokio::test]
async fn a_listed_pass_through_path_reaches_the_upstream_with_its_query() {
    let p = Protected::start(|c| c.upstream[0].passthrough = vec!["/token".into()]).await;
    let res = p
        .client("/token?grant_type=refresh_token")
        .send(Call::raw_post("x=1"))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(body_json(res).await["token_type"], "Bearer");
    let seen = p.guard.with(|s| s.paths.clone());
    assert!(
        seen.iter().any(|p| p == "/token?grant_type=refresh_token"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn paths_not_listed_or_spelled_to_escape_reach_nothing() {
    let p = Protected::start(|c| c.upstream[0].passthrough = vec!["/token".into()]).await;
    for path in [
        "/register",
        "/token/../admin",
        "/%2e%2e/token",
        "/.well-known/oauth-protected-resource/%2e%2e/admin",
        "/.well-known/oauth-protected-resource/other",
        "/token%2F..%2Fadmin",
    ] {
        let res = p.client(path).send(plain_get()).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let seen = p.guard.with(|s| s.paths.clone());
    assert!(seen.is_empty(), "reached the upstream: {seen:?}");
}

#[tokio::test]
async fn an_absolute_form_target_cannot_reach_another_server() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = Protected::start(|c| c.upstream[0].passthrough = vec!["/token".into()]).await;
    let mut socket = tokio::net::TcpStream::connect(p.proxy.addr).await.unwrap();
    let head =
        "GET http://evil.example/token HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = p.guard.with(|s| s.paths.clone());
    assert_eq!(seen, vec!["/token".to_owned()]);
}

#[tokio::test]
async fn a_refreshed_token_keeps_the_session() {
    let p = Protected::start(|_| {}).await;
    let session = p.session_of("alice-1").await;
    p.guard.revoke("alice-1");
    let call = Call::post(&ping(7))
        .session(&session)
        .header("authorization", &bearer("alice-2"));
    let res = p.client("/mcp").send(call).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(session_id(res.headers()).as_deref(), Some(session.as_str()));
    assert_eq!(messages(res).await[0]["id"], 7);
    // The session now answers to the new token only.
    let old = Call::post(&ping(8))
        .session(&session)
        .header("authorization", &bearer("alice-1"));
    assert_eq!(
        p.client("/mcp").send(old).await.status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_token_that_did_not_change_costs_no_extra_upstream_request() {
    let p = Protected::start(|_| {}).await;
    let session = p.session_of("alice-1").await;
    for id in 1..=3 {
        let call = Call::post(&ping(id))
            .session(&session)
            .header("authorization", &bearer("alice-1"));
        messages(p.client("/mcp").send(call).await).await;
    }
    // The client's three pings, and none of the proxy's own.
    assert_eq!(p.guard.with(|s| s.pings), 3);
}

#[tokio::test]
async fn another_users_token_on_a_session_gets_404() {
    let p = Protected::start(|_| {}).await;
    let session = p.session_of("alice-1").await;
    let call = Call::post(&ping(1))
        .session(&session)
        .header("authorization", &bearer("bob-1"));
    let res = p.client("/mcp").send(call).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    // And the session still belongs to alice.
    let call = Call::post(&ping(2))
        .session(&session)
        .header("authorization", &bearer("alice-1"));
    assert_eq!(p.client("/mcp").send(call).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_unknown_token_on_a_session_gets_404() {
    let p = Protected::start(|_| {}).await;
    let session = p.session_of("alice-1").await;
    let call = Call::post(&ping(1))
        .session(&session)
        .header("authorization", &bearer("forged"));
    assert_eq!(
        p.client("/mcp").send(call).await.status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_call_cut_under_one_token_resumes_under_the_next_with_every_event_once() {
    let p = Protected::start(|_| {}).await;
    let session = p.session_of("alice-1").await;
    let mcp = p.client("/mcp");
    let call = Call::post(&slow_call(5, 4, 150))
        .session(&session)
        .header("authorization", &bearer("alice-1"));
    let mut reader = SseReader::new(mcp.send(call).await);
    let (first_id, first) = loop {
        if let Some((Some(id), message)) = reader.next_message().await {
            break (id, message);
        }
    };
    drop(reader); // the connection is cut after the first event
    p.guard.revoke("alice-1");
    let resume = Call::get()
        .session(&session)
        .header("authorization", &bearer("alice-2"))
        .header("last-event-id", &first_id);
    let res = mcp.send(resume).await;
    assert_eq!(res.status(), StatusCode::OK);
    let rest = messages(res).await;
    let mut all = vec![first];
    all.extend(rest);
    assert_eq!(progress_values(&all), vec![1, 2, 3, 4]);
    let results: Vec<_> = all.iter().filter(|m| m["id"] == 5).collect();
    assert_eq!(results.len(), 1, "{all:?}");
}

#[tokio::test]
async fn a_trusted_ingress_names_the_public_url_and_its_host_is_allowed() {
    let p = Protected::start(|c| c.trusted_proxies = vec!["127.0.0.1".into()]).await;
    let call = Call::post(&initialize(V_LATEST))
        .header("host", "mcp_resume_proxy")
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "mcp.example.com");
    let res = p.client("/mcp").send(call).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let challenge = res.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        challenge.contains("resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\""),
        "{challenge}"
    );
}

#[tokio::test]
async fn forwarding_headers_from_an_untrusted_peer_are_ignored() {
    let p = Protected::start(|_| {}).await;
    let call = Call::post(&initialize(V_LATEST)).header("x-forwarded-host", "evil.example");
    let res = p.client("/mcp").send(call).await;
    let challenge = res.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(!challenge.contains("evil.example"), "{challenge}");
    assert!(challenge.contains(&p.base()), "{challenge}");
}

#[tokio::test]
async fn a_configured_public_url_is_named_and_allowed_as_host() {
    let p = Protected::start(|c| c.public_url = Some("https://mcp.example.com".into())).await;
    let call = Call::post(&initialize(V_LATEST)).header("host", "mcp.example.com");
    let res = p.client("/mcp").send(call).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let challenge = res.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        challenge.contains("https://mcp.example.com/.well-known/"),
        "{challenge}"
    );
    let other = Call::post(&initialize(V_LATEST)).header("host", "other.example");
    assert_eq!(
        p.client("/mcp").send(other).await.status(),
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn a_huge_or_malformed_challenge_passes_unrewritten() {
    let p = Protected::start(|_| {}).await;
    let huge = format!(
        "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\", x=\"{}\"",
        p.guard.url().trim_end_matches("/mcp"),
        "a".repeat(9000)
    );
    for challenge in [
        huge,
        "Bearer resource_metadata=\"http://localhost:1/unterminated".to_owned(),
    ] {
        p.guard.with(|s| s.challenge = Some(challenge.clone()));
        let res = p
            .client("/mcp")
            .send(Call::post(&initialize(V_LATEST)))
            .await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(res.headers()["www-authenticate"], challenge.as_str());
    }
}

#[tokio::test]
async fn oversized_metadata_is_refused_and_malformed_metadata_passes_as_it_is() {
    let p = Protected::start(|_| {}).await;
    let url = "/.well-known/oauth-protected-resource/mcp";
    p.guard
        .with(|s| s.metadata = Some(vec![b' '; 2 * 1024 * 1024]));
    let res = p.client(url).send(plain_get()).await;
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    p.guard
        .with(|s| s.metadata = Some(b"{\"resource\": nope".to_vec()));
    let res = p.client(url).send(plain_get()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(&body_bytes(res).await[..], b"{\"resource\": nope");
}

fn preflight_call() -> Call {
    Call {
        method: Method::OPTIONS,
        headers: vec![
            ("origin".into(), b"http://localhost:5173".to_vec()),
            ("access-control-request-method".into(), b"POST".to_vec()),
            (
                "access-control-request-headers".into(),
                b"content-type,mcp-session-id".to_vec(),
            ),
        ],
        body: Default::default(),
    }
}

#[tokio::test]
async fn without_cors_config_a_preflight_is_the_upstreams_answer() {
    let p = Protected::start(|_| {}).await;
    let res = p.client("/mcp").send(preflight_call()).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "http://localhost:5173"
    );
    assert!(res.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .contains("mcp-session-id"));
}

#[tokio::test]
async fn without_cors_config_the_proxys_own_answers_carry_the_upstreams_grant() {
    let p = Protected::start(|_| {}).await;
    let init = Call::post(&initialize(V_LATEST))
        .header("authorization", &bearer("alice-1"))
        .header("origin", "http://localhost:5173");
    let res = p.client("/mcp").send(init).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "http://localhost:5173"
    );
    let exposed = res.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(exposed.contains("mcp-session-id"), "{exposed}");
}

#[tokio::test]
async fn with_cors_config_the_proxy_answers_preflights_and_decorates_every_answer() {
    let p = Protected::start(|c| {
        c.cors = Some(mcp_resume_proxy::edge::cors::CorsConfig {
            allowed_origins: vec!["https://app.example".into()],
            ..Default::default()
        })
    })
    .await;
    let mut preflight = preflight_call();
    preflight.headers[0].1 = b"https://app.example".to_vec();
    let res = p.client("/mcp").send(preflight).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    assert!(
        p.guard.with(|s| s.paths.is_empty()),
        "the preflight went upstream"
    );
    // The proxy's own 404 carries them too.
    let res = p
        .client("/nowhere")
        .send(plain_get().header("origin", "https://app.example"))
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "https://app.example"
    );
}

#[tokio::test]
async fn a_preflight_from_an_origin_not_allowed_gets_no_cors_headers_and_requests_stay_refused() {
    let p = Protected::start(|c| {
        c.cors = Some(mcp_resume_proxy::edge::cors::CorsConfig {
            allowed_origins: vec!["https://app.example".into()],
            ..Default::default()
        })
    })
    .await;
    let mut preflight = preflight_call();
    preflight.headers[0].1 = b"https://evil.example".to_vec();
    let res = p.client("/mcp").send(preflight).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(res.headers().get("access-control-allow-origin").is_none());
    let post = Call::post(&initialize(V_LATEST)).header("origin", "https://evil.example");
    assert_eq!(
        p.client("/mcp").send(post).await.status(),
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn after_kill9_a_call_resumes_upstream_with_the_credential_its_client_comes_back_with() {
    use common::process::{free_addr, ProxyProcess};
    let demo = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream");
    let guard = Guard::start(demo.url()).await;
    guard.grant("alice-1", "alice");
    guard.grant("alice-2", "alice");
    let dir = tempfile::tempdir().expect("temp dir");
    let addr = free_addr();
    let url = guard.url();
    let args = ["--upstream", url.as_str()];
    let mut proxy = ProxyProcess::start(&args, dir.path(), addr, &[]).await;
    let mcp = McpClient::new(format!("http://{addr}/mcp"));
    let init = Call::post(&initialize(V_LATEST)).header("authorization", &bearer("alice-1"));
    let res = mcp.send(init).await;
    let session = session_id(res.headers()).expect("session id");
    read_all(res).await;
    let call = Call::post(&slow_call(9, 6, 200))
        .session(&session)
        .header("authorization", &bearer("alice-1"));
    let mut reader = SseReader::new(mcp.send(call).await);
    let (first_id, first) = loop {
        if let Some((Some(id), message)) = reader.next_message().await {
            break (id, message);
        }
    };
    drop(reader);
    proxy.kill9();
    guard.revoke("alice-1");
    // The restarted proxy knows no credential: the upstream refuses its
    // resume until the client is back with one.
    let _proxy = ProxyProcess::start(&args, dir.path(), addr, &[]).await;
    let resume = Call::get()
        .session(&session)
        .header("authorization", &bearer("alice-2"))
        .header("last-event-id", &first_id);
    let res = mcp.send(resume).await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut all = vec![first];
    all.extend(messages(res).await);
    assert_eq!(
        progress_values(&all),
        (1..=6).collect::<Vec<_>>(),
        "{all:?}"
    );
    let results: Vec<_> = all.iter().filter(|m| m["id"] == 9).collect();
    assert_eq!(results.len(), 1, "{all:?}");
    assert!(results[0]["result"].is_object(), "{all:?}");
}

/// A JWT-shaped token (unsigned: only its shape and claims matter here).
fn jwt_of(sub: &str, jti: &str) -> String {
    use base64::Engine;
    let b64 = |s: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let payload = json!({"iss": "https://as.example", "sub": sub, "jti": jti});
    format!(
        "{}.{}.c2ln",
        b64(r#"{"alg":"ES256"}"#.into()),
        b64(payload.to_string())
    )
}

#[tokio::test]
async fn a_jwt_naming_another_subject_is_refused_even_where_the_upstream_takes_it() {
    let p = Protected::start(|_| {}).await;
    let (alice_1, alice_2, bob) = (
        jwt_of("alice", "1"),
        jwt_of("alice", "2"),
        jwt_of("bob", "1"),
    );
    p.guard.grant(&alice_1, "alice");
    p.guard.grant(&alice_2, "alice");
    p.guard.grant(&bob, "bob");
    p.guard.with(|s| s.sessions_unbound = true);
    let session = p.session_of(&alice_1).await;
    let call = Call::post(&ping(1))
        .session(&session)
        .header("authorization", &bearer(&bob));
    assert_eq!(
        p.client("/mcp").send(call).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(p.guard.with(|s| s.pings), 0, "the upstream was not asked");
    // Alice's refreshed token, naming her, is still taken.
    let call = Call::post(&ping(2))
        .session(&session)
        .header("authorization", &bearer(&alice_2));
    assert_eq!(p.client("/mcp").send(call).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_opaque_token_is_judged_by_the_upstream_alone() {
    let p = Protected::start(|_| {}).await;
    p.guard.with(|s| s.sessions_unbound = true);
    let session = p.session_of("alice-1").await;
    // This upstream takes any valid token on any session; so does the proxy.
    let call = Call::post(&ping(1))
        .session(&session)
        .header("authorization", &bearer("bob-1"));
    assert_eq!(p.client("/mcp").send(call).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn metadata_naming_the_upstreams_origin_names_the_proxys() {
    let p = Protected::start(|_| {}).await;
    let own = p.guard.url().trim_end_matches("/mcp").to_owned();
    p.guard.with(|s| s.resource = Some(own));
    let res = p
        .client("/.well-known/oauth-protected-resource")
        .send(plain_get())
        .await;
    assert_eq!(body_json(res).await["resource"], p.base());
}

#[tokio::test]
async fn metadata_at_a_path_of_the_upstreams_own_is_read_through_the_proxys_standard_url() {
    let p = Protected::start(|_| {}).await;
    p.guard
        .with(|s| s.metadata_at = Some("/custom/metadata/location.json".into()));
    let res = p
        .client("/mcp")
        .send(Call::post(&initialize(V_LATEST)))
        .await;
    let challenge = res.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_owned();
    let standard = format!("{}/.well-known/oauth-protected-resource/mcp", p.base());
    assert!(
        challenge.contains(&format!("resource_metadata=\"{standard}\"")),
        "{challenge}"
    );
    let res = McpClient::new(standard).send(plain_get()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        body_json(res).await["resource"],
        format!("{}/mcp", p.base())
    );
}
