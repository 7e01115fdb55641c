//! The soak (issue 36), long and off by default: unless `SOAK_SECS` is set
//! the test returns at once. With it, the proxy binary cargo built for this
//! test (`cargo test --release --test soak` for the release one) runs with
//! the default configuration in front of the load harness's fast upstream
//! (`benches/support/fast_upstream.rs`, on a thread and runtime of its own),
//! and `SOAK_CONCURRENCY` clients (32), each a session on a connection of its
//! own, call `tools/call` back to back for `SOAK_SECS` seconds in
//! `SOAK_SEGMENTS` segments (8). The table and the bounds are the harness's
//! `soak` scenario's (`benches/support/soak_figures.rs`): the test fails when
//! RSS grows more than 25 MiB per 100k calls from segment 2 on, when the last
//! segment runs under 90 % of the first's throughput, or when a call fails.
//! `SOAK_PROXY_TOML` goes at the head of the configuration, to soak a bound
//! (`$'[limits]\nmax_retained_streams = 100000'`).
//!
//! `SOAK_SECS=240 cargo test --release --test soak -- --nocapture`
//!
//! The proxy is a child process under a guard (killed when the test ends or
//! fails); the upstream's thread is stopped and joined before the test ends.

mod common;

#[path = "../benches/support/fast_upstream.rs"]
mod fast_upstream;
#[path = "../benches/support/soak_figures.rs"]
mod soak_figures;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::process::{free_addr, ProxyProcess};
use common::{Call, McpClient, LIMIT};
use http::StatusCode;
use http_body_util::BodyExt;
use soak_figures::{dir_bytes, header, row, start_row, Sample, Summary};
use tokio::time::Instant;

/// The revision the harness speaks: legacy, so the proxy's answers are the
/// same as in the harness's soak.
const PROTOCOL: &str = "2025-06-18";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?}")))
        .unwrap_or(default)
}

/// The fast upstream on a thread and runtime of its own (the harness runs
/// it in a process of its own), so the clients' runtime does not serve it.
/// Dropping it stops the runtime and joins the thread.
struct Upstream {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("upstream runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                tokio::select! {
                    () = fast_upstream::serve(listener) => {}
                    _ = stopped => {}
                }
            });
        });
        Upstream {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `initialize` and `notifications/initialized` under [`PROTOCOL`]; the
/// session id.
async fn open_session(client: &McpClient) -> String {
    let init = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{{\
         \"protocolVersion\":\"{PROTOCOL}\",\"capabilities\":{{}},\
         \"clientInfo\":{{\"name\":\"soak\",\"version\":\"1\"}}}}}}"
    );
    let res = client.send(Call::raw_post(init)).await;
    assert_eq!(res.status(), StatusCode::OK, "initialize");
    let session = common::session_id(res.headers()).expect("a session id");
    common::body_bytes(res).await;
    let note = Call::raw_post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", PROTOCOL);
    assert_eq!(client.send(note).await.status(), StatusCode::ACCEPTED);
    session
}

/// One `tools/call` of the fast upstream's `echo`, read to its answer (the
/// harness's body); why not, when it did not end with a result.
async fn call(client: &McpClient, session: &str, id: u64) -> Result<(), String> {
    let body = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\
         \"name\":\"echo\",\"arguments\":{{}},\"_meta\":{{\"progressToken\":{id}}}}}}}"
    );
    let call = Call::raw_post(body)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", PROTOCOL);
    let res = client.try_send(call).await.map_err(|e| e.to_string())?;
    let status = res.status();
    let body: Bytes = tokio::time::timeout(LIMIT, res.into_body().collect())
        .await
        .map_err(|_| "the answer did not end in time".to_owned())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    if status != StatusCode::OK || !text.contains("\"result\"") {
        return Err(format!("{status}: {text}"));
    }
    Ok(())
}

/// What the clients count, and the flag that stops them.
#[derive(Default)]
struct Counts {
    calls: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
}

/// `concurrency` clients (each with a pool of its own: one connection),
/// each with a session open.
async fn open_clients(url: &str, concurrency: u64) -> Vec<(McpClient, String)> {
    let mut clients = Vec::new();
    for _ in 0..concurrency {
        let client = McpClient::new(url.to_owned());
        let session = open_session(&client).await;
        clients.push((client, session));
    }
    clients
}

/// Sets every client calling, back to back, until `counts.stop`.
fn start_load(
    clients: Vec<(McpClient, String)>,
    counts: &Arc<Counts>,
) -> Vec<tokio::task::JoinHandle<()>> {
    clients
        .into_iter()
        .map(|(client, session)| {
            let counts = counts.clone();
            tokio::spawn(async move {
                let mut id = 1;
                while !counts.stop.load(Ordering::Relaxed) {
                    match call(&client, &session, id).await {
                        Ok(()) => counts.calls.fetch_add(1, Ordering::Relaxed),
                        Err(e) if counts.errors.fetch_add(1, Ordering::Relaxed) == 0 => {
                            eprintln!("soak: call {id}: {e}");
                            0
                        }
                        Err(_) => 0,
                    };
                    id += 1;
                }
            })
        })
        .collect()
}

/// The proxy binary on the default configuration, `SOAK_PROXY_TOML` at its
/// head, in front of `upstream`; its data in `dir/data`.
async fn start_proxy(upstream: SocketAddr, dir: &Path) -> ProxyProcess {
    let config = dir.join("proxy.toml");
    let extra = std::env::var("SOAK_PROXY_TOML").unwrap_or_default();
    let text = format!("{extra}\n[[upstream]]\nurl = \"http://{upstream}/mcp\"\n");
    std::fs::write(&config, text).expect("proxy.toml");
    let args = ["--config", config.to_str().expect("a UTF-8 path")];
    ProxyProcess::start(&args, &dir.join("data"), free_addr(), &[]).await
}

/// The load for `segments` segments of `segment`, a sample at the start and
/// at each segment's end, each row printed as it comes.
async fn run_segments(
    proxy: &ProxyProcess,
    data: &Path,
    clients: Vec<(McpClient, String)>,
    segments: usize,
    segment: Duration,
) -> Vec<Sample> {
    let pid = proxy.pid();
    println!("{}", header("data dir"));
    let mut samples = vec![Sample::take(pid, 0, 0, 0.0, dir_bytes(data))];
    println!("{}", start_row(&samples[0]));
    let counts = Arc::new(Counts::default());
    let load = start_load(clients, &counts);
    let t0 = Instant::now();
    for n in 1..=segments {
        tokio::time::sleep_until(t0 + segment * n as u32).await;
        let calls = counts.calls.load(Ordering::Relaxed);
        let errors = counts.errors.load(Ordering::Relaxed);
        let secs = t0.elapsed().as_secs_f64();
        samples.push(Sample::take(pid, calls, errors, secs, dir_bytes(data)));
        println!("{}", row(n, &samples[n - 1], &samples[n]));
    }
    counts.stop.store(true, Ordering::Relaxed);
    for client in load {
        client.abort();
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_holds_its_memory_and_pace_under_sustained_load() {
    let Ok(secs) = std::env::var("SOAK_SECS") else {
        println!("soak: skipped (set SOAK_SECS to run it)");
        return;
    };
    let secs: f64 = secs.parse().expect("SOAK_SECS is a number of seconds");
    let segments = env_number("SOAK_SEGMENTS", 8).max(3) as usize;
    let segment = Duration::from_secs_f64(secs / segments as f64);
    let concurrency = env_number("SOAK_CONCURRENCY", 32);
    println!(
        "soak: {}, {concurrency} clients, {segments} segments x {:.1} s",
        env!("CARGO_BIN_EXE_mcp-resume-proxy"),
        segment.as_secs_f64()
    );
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let proxy = start_proxy(upstream.addr, dir.path()).await;
    let clients = open_clients(&proxy.client().url, concurrency).await;
    let data = dir.path().join("data");
    let samples = run_segments(&proxy, &data, clients, segments, segment).await;
    drop(proxy);
    drop(upstream);

    let summary = Summary::of(&samples);
    println!("\n{}", summary.lines("data dir"));
    let why = summary.failures();
    assert!(why.is_empty(), "the soak failed: {}", why.join("; "));
}
