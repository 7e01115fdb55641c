//! TLS on both sides of the proxy, over real loopback connections with
//! certificates made for the test: https for clients, client certificates
//! as principals (mutual TLS), and https upstreams with a private CA.

mod common;

use std::time::{Duration, Instant};

use common::tls::Pki;
use common::*;
use http::StatusCode;
use mcp_resume_proxy::config::Config;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::json;
use tokio::io::AsyncReadExt;

/// A proxy serving https with `pki`'s server certificate (and requiring its
/// client certificates when `mutual`).
async fn https_rig(pki: &Pki, mutual: bool) -> Rig {
    let tls = pki.proxy_tls(mutual);
    Rig::with(DemoOptions::default(), |c| c.tls = Some(tls)).await
}

fn https_url(rig: &Rig) -> String {
    let port = rig.proxy.as_ref().expect("proxy").addr.port();
    format!("https://localhost:{port}/mcp")
}

/// Puts an https relay with `pki`'s server certificate in front of the
/// rig's demo upstream and points the proxy at it.
fn upstream_over_https(config: &mut Config, pki: &Pki) {
    let plain = config.upstream[0].url.as_deref().expect("url");
    let addr = plain
        .trim_start_matches("http://")
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("upstream address");
    let relay = pki.https_relay(addr);
    config.upstream[0].url = Some(format!("https://127.0.0.1:{}/mcp", relay.port()));
}

/// An `echo` call through `client` answers with its text.
async fn echo(client: &McpClient, session: &str, id: u64) {
    let call = Call::post(&tool_call(id, "echo", json!({"text": "over tls"}))).session(session);
    let res = client.send(call).await;
    assert_eq!(res.status(), StatusCode::OK);
    let answers = messages(res).await;
    let result = answers.last().expect("a result");
    assert_eq!(result["id"], id, "{result}");
    assert_eq!(
        result["result"]["content"][0]["text"], "over tls",
        "{result}"
    );
}

#[tokio::test]
async fn an_mcp_session_and_a_tool_call_work_over_https() {
    let pki = Pki::new();
    let rig = https_rig(&pki, false).await;
    let client = McpClient::with_tls(https_url(&rig), pki.client_config(None));
    let session = client.initialize(V_LATEST).await;
    echo(&client, &session, 1).await;
}

#[tokio::test]
async fn alpn_gives_http2_to_clients_that_offer_it() {
    let pki = Pki::new();
    let rig = https_rig(&pki, false).await;
    let client = McpClient::with_tls(https_url(&rig), pki.client_config(None));
    let res = client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.version(), http::Version::HTTP_2);
}

#[tokio::test]
async fn an_http1_client_is_served_over_https() {
    let pki = Pki::new();
    let rig = https_rig(&pki, false).await;
    let client = McpClient::with_tls_http1(https_url(&rig), pki.client_config(None));
    let res = client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.version(), http::Version::HTTP_11);
}

#[tokio::test]
async fn plain_http_is_not_served_on_a_tls_listener() {
    let pki = Pki::new();
    let rig = https_rig(&pki, false).await;
    let plain = McpClient::new(rig.client.url.clone());
    let refused = plain.try_send(Call::post(&initialize(V_LATEST))).await;
    assert!(refused.is_err(), "a plain request was answered");
}

#[tokio::test]
async fn with_a_client_ca_a_client_without_a_certificate_is_refused() {
    let pki = Pki::new();
    let rig = https_rig(&pki, true).await;
    let anonymous = McpClient::with_tls(https_url(&rig), pki.client_config(None));
    let refused = anonymous.try_send(Call::post(&initialize(V_LATEST))).await;
    assert!(
        refused.is_err(),
        "a client without a certificate was answered"
    );
}

#[tokio::test]
async fn with_a_client_ca_a_certificate_from_another_ca_is_refused() {
    let pki = Pki::new();
    let stranger = Pki::new().client("stranger");
    let rig = https_rig(&pki, true).await;
    let client = McpClient::with_tls(https_url(&rig), pki.client_config(Some(&stranger)));
    let refused = client.try_send(Call::post(&initialize(V_LATEST))).await;
    assert!(refused.is_err(), "a foreign certificate was accepted");
}

#[tokio::test]
async fn a_client_certificate_from_the_client_ca_is_served() {
    let pki = Pki::new();
    let rig = https_rig(&pki, true).await;
    let alice = pki.client("alice");
    let client = McpClient::with_tls(https_url(&rig), pki.client_config(Some(&alice)));
    let session = client.initialize(V_LATEST).await;
    echo(&client, &session, 1).await;
}

#[tokio::test]
async fn two_client_certificates_are_two_principals() {
    let pki = Pki::new();
    let rig = https_rig(&pki, true).await;
    let (alice, bob) = (pki.client("alice"), pki.client("bob"));
    let alice = McpClient::with_tls(https_url(&rig), pki.client_config(Some(&alice)));
    let bob = McpClient::with_tls(https_url(&rig), pki.client_config(Some(&bob)));
    let session = alice.initialize(V_LATEST).await;
    // The same credential header does not make bob alice: the certificate
    // is the principal.
    let call = || {
        Call::post(&tool_call(2, "echo", json!({"text": "over tls"})))
            .session(&session)
            .header("authorization", "Bearer shared")
    };
    let res = bob.send(call()).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let body = body_json(res).await;
    assert_eq!(body["error"]["message"], "Session not found", "{body}");
    let res = alice.send(call()).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_client_that_never_finishes_its_tls_handshake_is_disconnected() {
    let pki = Pki::new();
    let rig = Rig::with(DemoOptions::default(), |c| {
        c.tls = Some(pki.proxy_tls(false));
        c.limits.header_read_timeout_ms = 300;
    })
    .await;
    let addr = rig.proxy.as_ref().expect("proxy").addr;
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf))
        .await
        .expect("the proxy hangs up within the limit");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn an_https_upstream_with_a_ca_file_is_trusted() {
    let pki = Pki::new();
    let rig = Rig::with(DemoOptions::default(), |c| {
        upstream_over_https(c, &pki);
        c.upstream[0].ca_file = Some(pki.ca_file.clone());
    })
    .await;
    let session = rig.client.initialize(V_LATEST).await;
    echo(&rig.client, &session, 1).await;
}

#[tokio::test]
async fn an_https_upstream_with_an_unknown_ca_is_a_bad_gateway() {
    let pki = Pki::new();
    let rig = Rig::with(DemoOptions::default(), |c| upstream_over_https(c, &pki)).await;
    let res = rig.client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn an_oversized_http2_request_head_gets_431_on_its_stream_only() {
    let pki = Pki::new();
    let tls = pki.proxy_tls(false);
    let rig = Rig::with(DemoOptions::default(), |c| {
        c.tls = Some(tls);
        c.limits.max_header_bytes = 16 * 1024;
    })
    .await;
    let client = McpClient::with_tls(https_url(&rig), pki.client_config(None));
    let big = "a".repeat(20 * 1024);
    let call = Call::post(&initialize(V_LATEST)).header("x-padding", &big);
    let res = client.send(call).await;
    assert_eq!(res.version(), http::Version::HTTP_2);
    assert_eq!(res.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    // Only that stream was refused: the client (its pooled HTTP/2
    // connection) is served next.
    let res = client.send(Call::post(&initialize(V_LATEST))).await;
    assert_eq!(res.status(), StatusCode::OK);
}
