//! Crash loop: the proxy, a real process, is `kill -9`ed at random moments
//! and restarted on the same data dir and address, again and again, while
//! clients keep running slow tool calls through it. Each client resumes with
//! GET + `Last-Event-ID` whenever its connection drops. Every call must see
//! its progress exactly once, in order, then its final response; everything
//! a client saw must be served again after a restart; and a call interrupted
//! by a kill ends with its result when the upstream can be resumed, with a
//! JSON-RPC error when it cannot — never with silence (a call without its
//! final response after a minute counts as hung).
//!
//! The same loop runs in front of the demo upstream in three modes: plain,
//! without event ids, and resuming as server-everything does (every event of
//! the session after the id, then a stream that stays silent for good).
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

/// No call may take longer than this end to end, interruptions included; a
/// call still without its final response then is counted as hung (reading
/// is bounded by it too: a silent stream with keep-alive comments would
/// otherwise hold a client for ever).
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
    /// No final response within [`CALL_LIMIT`].
    Hung,
}

/// What one client saw of one call, across all its connections.
#[derive(Debug)]
struct CallRecord {
    client: usize,
    sid: String,
    id: u64,
    steps: u64,
    /// Every event that carried a message, with its event id, in the order
    /// the client got them; the final response last, if one came.
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
    /// Messages that are neither this call's progress nor its final
    /// response: another stream's, leaked onto this one.
    foreign: u64,
}

impl CallRecord {
    /// The final response; none for a hung call.
    fn final_response(&self) -> Option<&Value> {
        match self.outcome {
            Outcome::Hung => None,
            Outcome::Result | Outcome::Error => self.seen.last().map(|(_, m)| m),
        }
    }

    /// Progress must be 1..=N without gap or duplicate, then the final
    /// response. A call that ended with an error (or hung) may stop early
    /// (the rest was never logged, or never came), but not skip.
    fn delivery(&self) -> Delivery {
        let mut d = Delivery::default();
        let progress = match self.final_response() {
            Some(_) => &self.seen[..self.seen.len() - 1],
            None => &self.seen[..],
        };
        let token = format!("p{}", self.id);
        let mut values = Vec::new();
        for (_, m) in progress {
            if m["method"] != "notifications/progress" || m["params"]["progressToken"] != token {
                d.foreign += 1;
                continue;
            }
            values.push(m["params"]["progress"].as_u64().expect("progress"));
        }
        let mut distinct = values.clone();
        distinct.sort_unstable();
        distinct.dedup();
        d.duplicated = (values.len() - distinct.len()) as u64;
        d.out_of_order = values.windows(2).filter(|w| w[0] >= w[1]).count() as u64;
        let reached = match self.outcome {
            Outcome::Result => self.steps,
            Outcome::Error | Outcome::Hung => distinct.last().copied().unwrap_or(0),
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
/// event id yet) whenever the connection drops or the proxy is down; gives
/// up as hung after [`CALL_LIMIT`].
async fn run_call(
    client: &McpClient,
    client_no: usize,
    sid: &str,
    id: u64,
    steps: u64,
    interval_ms: u64,
) -> CallRecord {
    let mut record = CallRecord {
        client: client_no,
        sid: sid.to_owned(),
        id,
        steps,
        seen: Vec::new(),
        first_id: None,
        interrupted: false,
        outcome: Outcome::Hung,
        trace: String::new(),
    };
    let attempts = attempt_call(client, &mut record, interval_ms);
    if tokio::time::timeout(CALL_LIMIT, attempts).await.is_err() {
        record.outcome = Outcome::Hung;
    }
    record
}

/// The requests of [`run_call`], until the final response.
async fn attempt_call(client: &McpClient, record: &mut CallRecord, interval_ms: u64) {
    let (id, sid) = (record.id, record.sid.clone());
    let mut last_id: Option<String> = None;
    loop {
        let call = match &last_id {
            None => Call::post(&slow_call(id, record.steps, interval_ms)).session(&sid),
            Some(last) => Call::get().session(&sid).header("last-event-id", last),
        };
        record
            .trace
            .push_str(if last_id.is_some() { "G" } else { "P" });
        let res = match client.try_send(call).await {
            Ok(res) => res,
            Err(e) => {
                record
                    .trace
                    .push_str(if e.is_connect() { "c" } else { "x" });
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
            panic!(
                "call {id} of client {}: {status} {body:?}; {record:?}",
                record.client
            );
        }
        let mut reader = SseReader::new(res);
        while let Some(event) = reader.next().await {
            record.trace.push('.');
            if let Some(event_id) = &event.id {
                last_id = Some(event_id.clone());
                record.first_id.get_or_insert_with(|| event_id.clone());
            }
            let Some(m) = message(&event) else { continue };
            let is_final = m["id"] == id && (m.get("result").is_some() || m.get("error").is_some());
            let outcome = if m.get("result").is_some() {
                Outcome::Result
            } else {
                Outcome::Error
            };
            if is_final && outcome == Outcome::Error {
                assert_eq!(m["error"]["code"], -32603, "{m}");
            }
            record.seen.push((event.id, m));
            if is_final {
                record.outcome = outcome;
                return;
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
    /// Calls whose replay answered as expired: released by the bound on
    /// retained streams.
    released: usize,
    calls: usize,
    interrupted: usize,
    interrupted_results: usize,
    interrupted_errors: usize,
    /// Interrupted calls the proxy could not resume because the kill came
    /// before the upstream's first event id was logged: they end with the
    /// proxy's restart error and no progress (an inherent window of about
    /// one upstream round trip and one fsync at the start of every call).
    killed_before_first_upstream_event: usize,
    results: usize,
    errors: usize,
    /// Calls without a final response after [`CALL_LIMIT`].
    hung: usize,
    lost: u64,
    duplicated: u64,
    out_of_order: u64,
    /// Other streams' messages delivered on a call's stream.
    foreign: u64,
    /// Calls not served again as seen (or not in time).
    replay_mismatches: usize,
}

/// The crash loop: `clients` clients calling through the proxy while it is
/// killed `kills` times at random moments, then killed and restarted once
/// more, after which every call is read again from its first event id.
async fn crash_loop(options: DemoOptions, clients: usize, kills: usize) -> Figures {
    crash_loop_bounded(options, clients, kills, None).await
}

/// The crash loop with `[limits] max_retained_streams` set to `bound`: a
/// replay of a released call then answers as an expired one (400), and is
/// counted apart; every other replay must be exact.
async fn crash_loop_bounded(
    options: DemoOptions,
    clients: usize,
    kills: usize,
    bound: Option<usize>,
) -> Figures {
    let seed = seed();
    println!("crash loop: seed {seed} (CRASH_SEED={seed} replays it)");
    let mut rng = Rng::new(seed);
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), options)
        .await
        .expect("demo upstream starts");
    let upstream_url = upstream.url();
    let config_dir = tempfile::tempdir().expect("temp dir");
    let config = config_dir.path().join("proxy.toml");
    let limits = bound.map_or(String::new(), |n| format!("max_retained_streams = {n}\n"));
    std::fs::write(&config, format!("[limits]\n{limits}")).expect("config written");
    let config = config.to_str().expect("UTF-8 path").to_owned();
    let args = [
        "--config",
        config.as_str(),
        "--upstream",
        upstream_url.as_str(),
    ];
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

    // Everything any client saw is served again by a restarted proxy: each
    // call that ended, read again from its first event id (a hung call has
    // no whole answer to compare, and its replay could hang as well). The
    // phase as a whole is bounded.
    proxy.kill9();
    let proxy = ProxyProcess::start(&args, dir.path(), addr, &[]).await;
    let client = proxy.client();
    let replays_due = Instant::now() + CALL_LIMIT;
    let mut replay_mismatches = 0;
    let mut released = Vec::new();
    for call in calls.iter().filter(|c| c.outcome != Outcome::Hung) {
        let Some(first) = &call.first_id else {
            continue;
        };
        let get = Call::get()
            .session(&call.sid)
            .header("last-event-id", first);
        let again = tokio::time::timeout_at(replays_due, async {
            let res = client.send(get).await;
            if bound.is_some() && res.status() == StatusCode::BAD_REQUEST {
                return None;
            }
            assert_eq!(res.status(), StatusCode::OK, "replay of {call:?}");
            Some(messages(res).await)
        })
        .await;
        match again {
            Ok(None) => released.push(call),
            Ok(Some(again)) if again == call.expected_replay() => {}
            Ok(Some(again)) => {
                replay_mismatches += 1;
                eprintln!("replay differs for {call:?}: {again:?}");
            }
            Err(_) => {
                replay_mismatches += 1;
                eprintln!("replay did not end in time for {call:?}");
            }
        }
    }

    // Nothing released comes back, whatever a restart recovers.
    drop(client);
    let mut proxy = proxy;
    proxy.kill9();
    let proxy = ProxyProcess::start(&args, dir.path(), addr, &[]).await;
    for call in &released {
        let first = call.first_id.as_deref().unwrap_or_default();
        let get = Call::get()
            .session(&call.sid)
            .header("last-event-id", first);
        let res = proxy.client().send(get).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{call:?} came back");
    }

    let mut figures = Figures {
        released: released.len(),
        kills,
        calls: calls.len(),
        interrupted: 0,
        interrupted_results: 0,
        interrupted_errors: 0,
        killed_before_first_upstream_event: 0,
        results: 0,
        errors: 0,
        hung: 0,
        lost: 0,
        duplicated: 0,
        out_of_order: 0,
        foreign: 0,
        replay_mismatches,
    };
    for call in &calls {
        let d = call.delivery();
        if d.lost + d.duplicated + d.out_of_order + d.foreign > 0 {
            eprintln!("{d:?} in {call:?}");
        }
        figures.lost += d.lost;
        figures.duplicated += d.duplicated;
        figures.out_of_order += d.out_of_order;
        figures.foreign += d.foreign;
        let progress = call.seen.len() - usize::from(call.final_response().is_some());
        match call.final_response() {
            None => {
                figures.hung += 1;
                eprintln!(
                    "client {} call {} ({} steps, trace {}): hung after {progress} progress",
                    call.client, call.id, call.steps, call.trace,
                );
            }
            Some(_) if call.outcome == Outcome::Result => {
                figures.results += 1;
                figures.interrupted_results += usize::from(call.interrupted);
            }
            Some(m) => {
                figures.errors += 1;
                assert!(
                    call.interrupted,
                    "an uninterrupted call ends with its result: {call:?}"
                );
                figures.interrupted_errors += 1;
                let message = &m["error"]["message"];
                if progress == 0 && message == RESTARTED {
                    figures.killed_before_first_upstream_event += 1;
                }
                eprintln!(
                    "client {} call {} ({} steps, trace {}): error after {progress} progress: \
                     {message}",
                    call.client, call.id, call.steps, call.trace,
                );
            }
        }
        figures.interrupted += usize::from(call.interrupted);
    }
    println!(
        "crash loop: kills={} calls={} interrupted={} (then result {}, then error {}, \
         of which killed before the first upstream event {}) results={} errors={} hung={} \
         lost={} duplicated={} out_of_order={} foreign={} replay_mismatches={} released={}",
        figures.kills,
        figures.calls,
        figures.interrupted,
        figures.interrupted_results,
        figures.interrupted_errors,
        figures.killed_before_first_upstream_event,
        figures.results,
        figures.errors,
        figures.hung,
        figures.lost,
        figures.duplicated,
        figures.out_of_order,
        figures.foreign,
        figures.replay_mismatches,
        figures.released,
    );
    figures
}

impl Figures {
    /// Every call ended, and every client saw each of its entries once, in
    /// order, nothing of another call's, and the same again after a restart.
    fn assert_exactly_once(&self) {
        assert_eq!(self.hung, 0, "calls without a final response");
        assert_eq!(self.lost, 0, "lost entries");
        assert_eq!(self.duplicated, 0, "duplicated entries");
        assert_eq!(self.out_of_order, 0, "entries out of order");
        assert_eq!(self.foreign, 0, "other streams' messages delivered");
        assert_eq!(self.replay_mismatches, 0, "calls not served again as seen");
    }

    /// Every call interrupted after the upstream's first event id ended
    /// with its result (those killed before it end with the proxy's restart
    /// error, counted apart).
    fn assert_every_resumable_call_ended_with_its_result(&self) {
        let resumable = self.interrupted - self.killed_before_first_upstream_event;
        assert_eq!(
            self.interrupted_results, resumable,
            "of {resumable} interrupted calls resumable upstream, {} ended with their result",
            self.interrupted_results,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_a_kill9_loop_exactly_once_and_end_with_their_results() {
    let f = crash_loop(DemoOptions::default(), 8, kills(9)).await;
    assert!(f.interrupted > 0, "the kills interrupted no call");
    f.assert_exactly_once();
    // A call killed before the upstream's first event id was logged cannot
    // be resumed (the proxy says so); every other interrupted call is.
    f.assert_every_resumable_call_ended_with_its_result();
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
    f.assert_exactly_once();
}

/// In front of an upstream that resumes as server-everything does
/// (`session_wide_replay`): a resumed upstream stream brings what the call
/// said since the id, and other streams' events, then nothing more, ever,
/// while the call runs on. To end each interrupted call with its result the
/// proxy has to ask the upstream again, and keep only the call's own events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_a_kill9_loop_in_front_of_an_upstream_that_replays_session_wide() {
    let options = DemoOptions {
        session_wide_replay: true,
        ..DemoOptions::default()
    };
    let f = crash_loop(options, 8, kills(9)).await;
    assert!(f.interrupted > 0, "the kills interrupted no call");
    f.assert_exactly_once();
    // Killed before the upstream's first event id: the proxy's restart
    // error (counted apart). Killed after it: the result, every time.
    f.assert_every_resumable_call_ended_with_its_result();
}

/// With a small bound on retained streams, releases of old finished calls
/// run all through the kills: calls in progress still end exactly once
/// with their results, every call still retained replays exactly, and a
/// released one answers as expired, before and after one more restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_at_the_bound_on_retained_streams_loses_nothing_retained_and_brings_nothing_back() {
    let f = crash_loop_bounded(DemoOptions::default(), 8, kills(9), Some(24)).await;
    assert!(f.interrupted > 0, "the kills interrupted no call");
    assert!(
        f.released > 0,
        "the bound released nothing in {} calls",
        f.calls
    );
    f.assert_exactly_once();
    f.assert_every_resumable_call_ended_with_its_result();
}
