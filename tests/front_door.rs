//! The front door's limits, spoken to with raw sockets on loopback: request
//! heads are bounded in size and time, request bodies in time, and a client
//! that breaks a limit is answered (or dropped) without holding up others.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use mcp_resume_proxy::config::Config;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn rig(tweak: impl FnOnce(&mut Config)) -> (Rig, SocketAddr) {
    let rig = Rig::with(DemoOptions::default(), tweak).await;
    let addr = rig.proxy.as_ref().expect("proxy").addr;
    (rig, addr)
}

/// Everything the proxy sends until it closes the connection (or `LIMIT`).
async fn read_until_closed(socket: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(LIMIT, socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the proxy kept the connection open"),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// A POST head announcing a body of `length` bytes.
fn post_head(length: usize) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {length}\r\n\r\n"
    )
}

#[tokio::test]
async fn an_oversized_request_head_gets_431() {
    let (_rig, addr) = rig(|c| c.limits.max_header_bytes = 8192).await;
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: {}\r\n\r\n",
        "a".repeat(9000)
    );
    socket.write_all(head.as_bytes()).await.expect("send head");
    let answer = read_until_closed(&mut socket).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
}

#[tokio::test]
async fn a_request_head_within_the_limit_is_served() {
    let (_rig, addr) = rig(|c| c.limits.max_header_bytes = 16384).await;
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Padding: {}\r\n\r\n",
        "a".repeat(9000)
    );
    socket.write_all(head.as_bytes()).await.expect("send head");
    let answer = read_until_closed(&mut socket).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

#[tokio::test]
async fn a_client_that_trickles_its_head_is_disconnected_after_the_timeout() {
    let (_rig, addr) = rig(|c| c.limits.header_read_timeout_ms = 300).await;
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("send a partial head");
    trickle_until_closed(&mut socket).await;
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[tokio::test]
async fn a_kept_alive_connection_that_trickles_its_next_head_is_disconnected() {
    let (_rig, addr) = rig(|c| c.limits.header_read_timeout_ms = 300).await;
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("send a request");
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(LIMIT, socket.read(&mut buf))
        .await
        .expect("an answer in time")
        .expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let started = Instant::now();
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .expect("send a partial head");
    trickle_until_closed(&mut socket).await;
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

/// Sends one more header byte every 100 ms (never a complete head) until
/// the proxy hangs up; fails if it has not within `LIMIT`.
async fn trickle_until_closed(socket: &mut TcpStream) {
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if socket.write_all(b"x").await.is_err() {
                break;
            }
            let mut probe = [0u8; 256];
            match tokio::time::timeout(Duration::from_millis(1), socket.read(&mut probe)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                _ => {}
            }
        }
    };
    tokio::time::timeout(LIMIT, trickle)
        .await
        .expect("the proxy hangs up");
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_timeout() {
    let (_rig, addr) = rig(|c| c.limits.header_read_timeout_ms = 300).await;
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    let answer = read_until_closed(&mut socket).await;
    assert_eq!(answer, "");
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn a_stalled_body_gets_408_with_a_json_rpc_error() {
    let (_rig, addr) = rig(|c| c.limits.body_read_timeout_ms = 300).await;
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    let request = format!("{}{{\"jsonrpc\":", post_head(200));
    socket.write_all(request.as_bytes()).await.expect("send");
    let answer = read_until_closed(&mut socket).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("\"code\":-32600"), "{answer:?}");
    assert!(answer.contains("Request Timeout"), "{answer:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn a_stalled_body_does_not_hold_up_other_clients() {
    let (rig, addr) = rig(|c| c.limits.body_read_timeout_ms = 3_000).await;
    let mut stalled = TcpStream::connect(addr).await.expect("connect");
    let request = format!("{}{{\"jsonrpc\":", post_head(200));
    stalled.write_all(request.as_bytes()).await.expect("send");
    let session = rig.client.initialize(V_LATEST).await;
    assert!(!session.is_empty());
    // Ordering, not speed: the other client was served while the stalled
    // one still waits for its 408.
    let mut probe = [0u8; 64];
    let answered_yet = tokio::time::timeout(Duration::ZERO, stalled.read(&mut probe)).await;
    assert!(
        answered_yet.is_err(),
        "served only after the stalled body timed out"
    );
    let answer = read_until_closed(&mut stalled).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
}

#[tokio::test]
async fn an_answer_that_streams_longer_than_the_head_timeout_is_not_cut() {
    let (rig, _) = rig(|c| c.limits.header_read_timeout_ms = 300).await;
    let session = rig.client.initialize(V_LATEST).await;
    // Five progress steps 250 ms apart: over a second of streaming.
    let res = rig
        .client
        .send(Call::post(&slow_call(1, 5, 250)).session(&session))
        .await;
    let answers = messages(res).await;
    let result = answers.last().expect("a result");
    assert_eq!(result["id"], 1, "{result}");
    assert!(result["result"].is_object(), "{result}");
}
