//! Crash loop: the proxy, a real process, is `kill -9`ed at random moments
//! and restarted on the same data dir and address, again and again, while
//! clients keep running slow tool calls through it. Each client resumes with
//! GET + `Last-Event-ID` whenever its connection drops. Every call must see
//! its progress exactly once, in order, then its final response; everything
//! a client saw must be served again after a restart; and a call interrupted
//! by a kill ends with its result when the upstream can be resumed, with a
//! JSON-RPC error when it cannot — never with silence.
//!
//! `CRASH_KILLS=100` runs the long mode; `CRASH_SEED=n` replays a run (the
//! seed is printed). Run with `-- --nocapture` to see the summary line.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::process::{free_addr, ProxyProcess};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use serde_json::Value;
use tokio::time::{sleep, Instant};

/// No call may take longer than this end to end, interruptions included.
const CALL_LIMIT: Duration = Duration::from_secs(60);
/// The proxy's error for a call it could not resume after a restart
/// because no upstream event id of it had been logged.
const RESTARTED: &str =
    "the proxy restarted while the upstream was answering this request; its outcome is unknown";
/// How often a client knocks while the proxy is down.
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// xorshift64*: deterministic, seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // Never zero (xorshift's fixed point); splitmix the seed a little.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn seed() -> u64 {
    std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            now.as_nanos() as u64
        })
}

fn kills(default: usize) -> usize {
    std::env::var("CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Result,
    Error,
}

/// What one client saw of one call, across all its connections.
#[derive(Debug)]
struct CallRecord {
    client: usize,
    sid: String,
    id: u64,
    steps: u64,
    /// Every event that carried a message, with its event id, in the order
    /// the client got them.
    seen: Vec<(Option<String>, Value)>,
    /// The first event id the client got for this call (the priming event).
    first_id: Option<String>,
    /// The connection dropped (or a request failed after it may have been
    /// sent) at least once before the final response.
    interrupted: bool,
    outcome: Outcome,
    /// The requests and connections it took: `P` POST, `G` GET, `c`
    /// refused, `x` failed, `.` an event.
    trace: String,
}

/// How one call's delivery compares with exactly-once, in order.
#[derive(Debug, Default)]
struct Delivery {
    lost: u64,
    duplicated: u64,
    out_of_order: u64,
}

impl CallRecord {
    fn final_response(&self) -> &Value {
        &self.seen.last().expect("a final response").1
    }

    /// Progress must be 1..=N without gap or duplicate, then the final
    /// response. A call that ended with an error may stop early (the rest
    /// was never logged), but not skip.
    fn delivery(&self) -> Delivery {
        let mut d = Delivery::default();
        let (_, progress) = self.seen.split_last().expect("a final response");
        let token = format!("p{}", self.id);
        let mut values = Vec::new();
        for (_, m) in progress {
            assert_eq!(m["method"], "notifications/progress", "{self:?}");
            assert_eq!(m["params"]["progressToken"], token.as_str(), "{self:?}");
            values.push(m["params"]["progress"].as_u64().expect("progress"));
        }
        let mut distinct = values.clone();
        distinct.sort_unstable();
        distinct.dedup();
        d.duplicated = (values.len() - distinct.len()) as u64;
        d.out_of_order = values.windows(2).filter(|w| w[0] >= w[1]).count() as u64;
        let reached = match self.outcome {
            Outcome::Result => self.steps,
            Outcome::Error => distinct.last().copied().unwrap_or(0),
        };
        d.lost = reached
            - distinct
                .iter()
                .filter(|v| (1..=reached).contains(*v))
                .count() as u64;
        // Event ids, too, are each delivered once.
        let mut ids: Vec<_> = self.seen.iter().filter_map(|(id, _)| id.clone()).collect();
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        d.duplicated = d.duplicated.max((n - ids.len()) as u64);
        d
    }

    /// The messages a GET with `Last-Event-ID: first_id` must serve again.
    fn expected_replay(&self) -> Vec<Value> {
        let first = self.first_id.as_deref();
        let skip = self
            .seen
            .iter()
            .position(|(id, _)| id.as_deref() == first)
            .map_or(0, |i| i + 1);
        self.seen[skip..].iter().map(|(_, m)| m.clone()).collect()
    }
}

/// Runs one slow call to its final response, reconnecting with GET +
/// `Last-Event-ID` (or re-sending the POST under the same id while it has no
/// event id yet) whenever the connection drops or the proxy is down.
async fn run_call(
    client: &McpClient,
    client_no: usize,
    sid: &str,
    id: u64,
    steps: u64,
    interval_ms: u64,
) -> CallRecord {
    let deadline = Instant::now() + CALL_LIMIT;
    let mut record = CallRecord {
        client: client_no,
        sid: sid.to_owned(),
        id,
        steps,
        seen: Vec::new(),
        first_id: None,
        interrupted: false,
        outcome: Outcome::Error,
        trace: String::new(),
    };
    let mut last_id: Option<String> = None;
    let mut trace = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "call {id} of client {client_no} never ended: {record:?}"
        );
        let call = match &last_id {
            None => Call::post(&slow_call(id, steps, interval_ms)).session(sid),
            Some(last) => Call::get().session(sid).header("last-event-id", last),
        };
        trace.push_str(if last_id.is_some() { "G" } else { "P" });
        let res = match client.try_send(call).await {
            Ok(res) => res,
            Err(e) => {
                trace.push_str(if e.is_connect() { "c" } else { "x" });
                // Refused: the proxy is down, the request never left.
                // Anything else may have reached the proxy.
                record.interrupted |= !e.is_connect();
                sleep(RETRY_EVERY).await;
                continue;
            }
        };
        if res.status().is_server_error() {
            record.interrupted = true;
            sleep(RETRY_EVERY).await;
            continue;
        }
        if res.status() != StatusCode::OK {
            let status = res.status();
            let body = body_bytes(res).await;
            panic!("call {id} of client {client_no}: {status} {body:?}; {record:?}");
        }
        let mut reader = SseReader::new(res);
        while let Some(event) = reader.next().await {
            trace.push('.');
            if let Some(event_id) = &event.id {
                last_id = Some(event_id.clone());
                record.first_id.get_or_insert_with(|| event_id.clone());
            }
            let Some(m) = message(&event) else { continue };
            let is_final = m["id"] == id && (m.get("result").is_some() || m.get("error").is_some());
            record.seen.push((event.id, m));
            if is_final {
                record.trace = trace;
                let m = record.final_response();
                record.outcome = if m.get("result").is_some() {
                    Outcome::Result
                } else {
                    assert_eq!(m["error"]["code"], -32603, "{m}");
                    Outcome::Error
                };
                return record;
            }
        }
        // The connection dropped before the final response.
        record.interrupted = true;
        sleep(RETRY_EVERY).await;
    }
}

/// One client: slow calls in a loop until `stop`, each to its final response.
async fn client_loop(
    url: String,
    client_no: usize,
    sid: String,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Vec<CallRecord> {
    let client = McpClient::new(url);
    let mut rng = Rng::new(seed);
    let mut calls = Vec::new();
    let mut id = 0;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        let steps = rng.range(8, 24);
        let interval_ms = rng.range(20, 60);
        calls.push(run_call(&client, client_no, &sid, id, steps, interval_ms).await);
    }
    calls
}

struct Figures {
    kills: usize,
    calls: usize,
    interrupted: usize,
    interrupted_results: usize,
    /// Interrupted calls the proxy could not resume because the kill came
    /// before the upstream's first event id was logged: they end with the
    /// proxy's restart error and no progress (an inherent window of about
    /// one upstream round trip and one fsync at the start of every call).
    killed_before_first_upstream_event: usize,
    results: usize,
    errors: usize,
    lost: u64,
    duplicated: u64,
    out_of_order: u64,
    replay_mismatches: usize,
}

/// The crash loop: `clients` clients calling through the proxy while it is
/// killed `kills` times at random moments, then killed and restarted once
/// more, after which every call is read again from its first event id.
async fn crash_loop(options: DemoOptions, clients: usize, kills: usize) -> Figures {
    let seed = seed();
    println!("crash loop: seed {seed} (CRASH_SEED={seed} replays it)");
    let mut rng = Rng::new(seed);
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), options)
        .await
        .expect("demo upstream starts");
    let upstream_url = upstream.url();
    let args = ["--upstream", upstream_url.as_str()];
    let dir = tempfile::tempdir().expect("temp dir");
    let addr = free_addr();
    let mut proxy = ProxyProcess::start(&args, dir.path(), addr, &[]).await;

    let url = proxy.client().url;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for n in 0..clients {
        let sid = proxy.client().initialize(V_LATEST).await;
        let client_seed = rng.next();
        tasks.push(tokio::spawn(client_loop(
            url.clone(),
            n,
            sid.clone(),
            client_seed,
            stop.clone(),
        )));
    }

    for _ in 0..kills {
        sleep(Duration::from_millis(rng.range(200, 1500))).await;
        proxy.kill9();
        sleep(Duration::from_millis(rng.range(0, 300))).await;
        proxy = ProxyProcess::start(&args, dir.path(), addr, &[]).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    for task in tasks {
        calls.extend(task.await.expect("client task"));
    }

    // Everything any client saw is served again by a restarted proxy.
    proxy.kill9();
    let proxy = ProxyProcess::start(&args, dir.path(), addr, &[]).await;
    let client = proxy.client();
    let mut replay_mismatches = 0;
    for call in &calls {
        let Some(first) = &call.first_id else {
            continue;
        };
        let res = client
            .send(
                Call::get()
                    .session(&call.sid)
                    .header("last-event-id", first),
            )
            .await;
        assert_eq!(res.status(), StatusCode::OK, "replay of {call:?}");
        let again = messages(res).await;
        if again != call.expected_replay() {
            replay_mismatches += 1;
            eprintln!("replay differs for {call:?}: {again:?}");
        }
    }

    let mut figures = Figures {
        kills,
        calls: calls.len(),
        interrupted: 0,
        interrupted_results: 0,
        killed_before_first_upstream_event: 0,
        results: 0,
        errors: 0,
        lost: 0,
        duplicated: 0,
        out_of_order: 0,
        replay_mismatches,
    };
    for call in &calls {
        let d = call.delivery();
        if d.lost + d.duplicated + d.out_of_order > 0 {
            eprintln!("{d:?} in {call:?}");
        }
        figures.lost += d.lost;
        figures.duplicated += d.duplicated;
        figures.out_of_order += d.out_of_order;
        match call.outcome {
            Outcome::Result => figures.results += 1,
            Outcome::Error => figures.errors += 1,
        }
        if call.interrupted {
            figures.interrupted += 1;
            if call.outcome == Outcome::Result {
                figures.interrupted_results += 1;
            } else {
                let message = &call.final_response()["error"]["message"];
                if call.seen.len() == 1 && message == RESTARTED {
                    figures.killed_before_first_upstream_event += 1;
                }
                eprintln!(
                    "client {} call {} ({} steps, trace {}): error after {} progress: {message}",
                    call.client,
                    call.id,
                    call.steps,
                    call.trace,
                    call.seen.len() - 1,
                );
            }
        } else {
            assert_eq!(
                call.outcome,
                Outcome::Result,
                "an uninterrupted call ends with its result: {call:?}"
            );
        }
    }
    println!(
        "crash loop: kills={} calls={} interrupted={} (then result {}, then error {}, \
         of which killed before the first upstream event {}) results={} errors={} lost={} \
         duplicated={} out_of_order={} replay_mismatches={}",
        figures.kills,
        figures.calls,
        figures.interrupted,
        figures.interrupted_results,
        figures.interrupted - figures.interrupted_results,
        figures.killed_before_first_upstream_event,
        figures.results,
        figures.errors,
        figures.lost,
        figures.duplicated,
        figures.out_of_order,
        figures.replay_mismatches,
    );
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_a_kill9_loop_exactly_once_and_end_with_their_results() {
    let f = crash_loop(DemoOptions::default(), 8, kills(9)).await;
    assert!(f.interrupted > 0, "the kills interrupted no call");
    assert_eq!(f.lost, 0, "lost entries");
    assert_eq!(f.duplicated, 0, "duplicated entries");
    assert_eq!(f.out_of_order, 0, "entries out of order");
    assert_eq!(f.replay_mismatches, 0, "calls not served again as seen");
    // A call killed before the upstream's first event id was logged cannot
    // be resumed (the proxy says so); every other interrupted call can.
    let resumable = f.interrupted - f.killed_before_first_upstream_event;
    assert!(
        f.interrupted_results * 100 >= resumable * 99,
        "only {} of {resumable} resumable interrupted calls ended with their result",
        f.interrupted_results,
    );
    // The start window is one upstream round trip plus one fsync, so its
    // share of the kills depends on the machine's disk (5–10 % here): only a
    // loose sanity bound. The regression guard for it is deterministic, in
    // tests/crash.rs (a kill right after the upstream's priming event).
    assert!(
        f.killed_before_first_upstream_event * 4 <= f.interrupted,
        "{} of {} interrupted calls lost before the upstream's first event",
        f.killed_before_first_upstream_event,
        f.interrupted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_interrupted_by_kill9_end_with_an_error_when_the_upstream_gives_no_event_ids() {
    let options = DemoOptions {
        no_event_ids: true,
        ..DemoOptions::default()
    };
    let f = crash_loop(options, 4, kills(4).min(6)).await;
    assert!(f.interrupted > 0, "the kills interrupted no call");
    assert!(f.errors > 0, "no interrupted call ended with an error");
    assert_eq!(f.lost, 0, "lost entries");
    assert_eq!(f.duplicated, 0, "duplicated entries");
    assert_eq!(f.out_of_order, 0, "entries out of order");
    assert_eq!(f.replay_mismatches, 0, "calls not served again as seen");
}
