//! Chaos: slow tool calls (progress 1..=N, then the result) through a
//! loopback relay that cuts the client's connection at random byte positions
//! of the proxy's response — in the head, in a chunk, in an event — 0 to 3
//! times per call. After every cut the client comes back the way its dialect
//! says, until it holds the final response; every call must then have lost
//! nothing, duplicated nothing and kept its order, and have run upstream once.
//!
//! A client that was cut before it held any handle re-sends the call under
//! the same id (the proxy attaches it to the running call, replayed from its
//! start). `requests/resume` and `stream/resume` without a position are
//! at-least-once by design (README, "Delivery"): what they deliver again
//! comes with the event id it had, and the client drops it — a message under
//! a *new* event id would be a duplicate. About half of their resumes carry
//! the newest event id the client holds as `Last-Event-ID`; those, like a
//! GET with `Last-Event-ID`, are exactly once: any event id seen twice is a
//! duplicate. (The newest it holds, not the last it saw: an at-least-once
//! answer repeats older ids, so the client's position is the last id it had
//! not seen before.)
//!
//! Seeded: every test prints its seed; `CHAOS_SEED=<seed>` replays a run.
//! `CHAOS_CUTS=<n>` sets the cuts each test makes at least (default 100).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Instant;

use common::chaos::{cuts_wanted, seed, Relay, Rng};
use common::dialects::{initialize_declaring, request};
use common::*;
use http::StatusCode;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use serde_json::{json, Value};

const STEPS: u64 = 8;
const INTERVAL_MS: u64 = 10;
const DEFAULT_CUTS: u64 = 100;
const MAX_ATTEMPTS: u64 = 40;

/// How a cut client comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    /// GET with the last event id it holds.
    LastEventId,
    /// `requests/resume` with the policy's `resumeToken` (seed 002).
    RequestsResume,
    /// `stream/resume` with the `streamId` of `stream/create` (seed 003).
    StreamResume,
    /// The same call again with the latest `nextResumeToken` (seeds 000/001).
    ResumeToken,
}

impl Way {
    /// A POST resume, which may carry `Last-Event-ID` or not.
    fn posts_resumes(self) -> bool {
        matches!(self, Way::RequestsResume | Way::StreamResume)
    }
}

#[derive(Debug, Default)]
struct Tally {
    calls: u64,
    lost: u64,
    duplicated: u64,
    disordered: u64,
    /// At-least-once redeliveries the client dropped by event id.
    redelivered: u64,
    /// POST resumes sent with `Last-Event-ID` (exactly once) and without.
    exact_resumes: u64,
    plain_resumes: u64,
}

/// What one call's client holds.
#[derive(Default)]
struct Held {
    /// Event id → the message it carried.
    by_id: HashMap<String, Value>,
    /// Progress values and the final result, in the order they were kept.
    kept: Vec<Value>,
    duplicate_ids: u64,
    redelivered: u64,
    /// Last event id, resume token, stream handle or call token.
    handle: Option<String>,
    /// Every event id seen, priming events' too.
    seen: HashSet<String>,
    /// The newest event id held: the last one not seen before (POST
    /// resumes may send it).
    last_event_id: Option<String>,
    /// This attempt is a POST resume with `Last-Event-ID`: exactly once.
    exact: bool,
    done: bool,
    /// This attempt's answer was an interim (resume tokens): it ends there.
    interim: bool,
    transcript: Vec<String>,
}

struct Chaos {
    rig: Rig,
    relay: Relay,
    client: McpClient,
    session: String,
    way: Way,
    rng: Rng,
    seed: u64,
    name: &'static str,
    next_rpc: u64,
}

impl Chaos {
    async fn start(name: &'static str, way: Way) -> Chaos {
        let rig = Rig::with(DemoOptions::default(), |c| {
            c.upstream[0].resume_tokens.interim_after_ms = 30;
        })
        .await;
        let capabilities = match way {
            Way::LastEventId => json!({}),
            Way::RequestsResume => json!({"resumableRequests": {}}),
            Way::StreamResume => json!({"streams": {}}),
            Way::ResumeToken => json!({"resumeTokens": {}}),
        };
        let (session, _) = initialize_declaring(&rig.client, capabilities).await;
        let relay = Relay::start(rig.proxy.as_ref().expect("proxy").addr).await;
        let client = McpClient::unpooled(relay.url());
        let seed = seed();
        eprintln!("chaos {name}: seed {seed} (replay with CHAOS_SEED={seed})");
        Chaos {
            rig,
            relay,
            client,
            session,
            way,
            rng: Rng::new(seed),
            seed,
            name,
            next_rpc: 1_000_000,
        }
    }

    /// Runs calls until the relay has cut at least `CHAOS_CUTS` times; prints
    /// the summary and returns the tally.
    async fn run(mut self) -> Tally {
        let wanted = cuts_wanted(DEFAULT_CUTS);
        let started = Instant::now();
        let mut tally = Tally::default();
        // One uncut call measures how long an answer is: cuts fall anywhere
        // in it. The relay records the length when the connection closes,
        // which is after the client read the answer: wait for it, or every
        // cut would fall in the first 200 bytes (the head and the priming
        // event), where no client holds anything to resume with.
        self.call(1, 0, 1, &mut tally).await;
        let stats = self.relay.stats.clone();
        eventually("the relay measured an uncut answer", || {
            stats.last_uncut_len.load(Ordering::Relaxed) > 0
        })
        .await;
        let span = self
            .relay
            .stats
            .last_uncut_len
            .load(Ordering::Relaxed)
            .max(200);
        let mut id = 2;
        while self.relay.cuts() < wanted {
            assert!(
                id < 10 * wanted + 100,
                "seed {}: too few cuts land: {} after {} calls",
                self.seed,
                self.relay.cuts(),
                id
            );
            let planned = self.rng.below(4);
            self.call(id, planned, span, &mut tally).await;
            id += 1;
        }
        let upstream_calls = self
            .rig
            .upstream
            .stats
            .calls_started
            .load(Ordering::Relaxed);
        eprintln!(
            "chaos {}: cuts {}, calls {}, lost {}, duplicated {}, disordered {}, \
             redelivered-and-dropped {}, POST resumes exact {} / at-least-once {}, \
             upstream calls {}, {:.1}s, seed {}",
            self.name,
            self.relay.cuts(),
            tally.calls,
            tally.lost,
            tally.duplicated,
            tally.disordered,
            tally.redelivered,
            tally.exact_resumes,
            tally.plain_resumes,
            upstream_calls,
            started.elapsed().as_secs_f64(),
            self.seed,
        );
        assert_eq!(
            upstream_calls, tally.calls,
            "seed {}: every call ran upstream exactly once",
            self.seed
        );
        tally
    }

    /// One slow call, cut `planned` times at random positions in `0..span`,
    /// resumed until its final response.
    async fn call(&mut self, id: u64, planned: u64, span: u64, tally: &mut Tally) {
        let mut held = Held::default();
        let mut cuts_left = planned;
        let mut attempt = 0;
        while !held.done {
            attempt += 1;
            assert!(
                attempt <= MAX_ATTEMPTS,
                "seed {}: call {id} never finished: {:#?}",
                self.seed,
                held.transcript
            );
            let cut_at = (cuts_left > 0).then(|| self.rng.below(span) as usize);
            match cut_at {
                Some(at) => {
                    cuts_left -= 1;
                    self.relay.arm(at);
                }
                None => self.relay.disarm(),
            }
            let cuts_before = self.relay.cuts();
            held.interim = false;
            held.exact = self.way.posts_resumes()
                && held.handle.is_some()
                && held.last_event_id.is_some()
                && self.rng.below(2) == 0;
            if self.way.posts_resumes() && held.handle.is_some() {
                if held.exact {
                    tally.exact_resumes += 1;
                } else {
                    tally.plain_resumes += 1;
                }
            }
            let (call, rpc) = self.comeback(id, &held);
            held.transcript.push(format!(
                "attempt {attempt}: cut at {cut_at:?}, rpc {rpc}, exact {}",
                held.exact
            ));
            match self.client.try_send(call).await {
                Err(e) => held.transcript.push(format!("  no response head: {e}")),
                Ok(res) => {
                    assert_eq!(
                        res.status(),
                        StatusCode::OK,
                        "seed {}: call {id}: {:#?}",
                        self.seed,
                        held.transcript
                    );
                    let mut reader = SseReader::new(res);
                    while let Some(event) = reader.next().await {
                        self.take(id, rpc, event, &mut held);
                        if held.done {
                            break;
                        }
                    }
                }
            }
            if !held.done && !held.interim {
                assert!(
                    self.relay.cuts() > cuts_before,
                    "seed {}: call {id}: an uncut answer ended without the response: {:#?}",
                    self.seed,
                    held.transcript
                );
            }
        }
        if std::env::var_os("CHAOS_VERBOSE").is_some() {
            eprintln!("call {id}: {:#?}", held.transcript);
        }
        tally.calls += 1;
        tally.redelivered += held.redelivered;
        self.judge(id, &held, tally);
    }

    /// The request that brings the client back, and the id it carries.
    fn comeback(&mut self, id: u64, held: &Held) -> (Call, u64) {
        let call = slow_call(id, STEPS, INTERVAL_MS);
        let Some(handle) = &held.handle else {
            // Nothing held yet: the same call under the same id attaches.
            return (Call::post(&call).session(&self.session), id);
        };
        self.next_rpc += 1;
        let rpc = self.next_rpc;
        let body = match self.way {
            Way::LastEventId => {
                let get = Call::get()
                    .session(&self.session)
                    .header("last-event-id", handle);
                return (get, id);
            }
            Way::RequestsResume => {
                request(json!(id), "requests/resume", json!({"resumeToken": handle}))
            }
            Way::StreamResume => request(json!(rpc), "stream/resume", json!({"streamId": handle})),
            Way::ResumeToken => {
                let mut again = slow_call(rpc, STEPS, INTERVAL_MS);
                again["params"]["_meta"]["resumeToken"] = json!(handle);
                again
            }
        };
        let rpc = if self.way == Way::RequestsResume {
            id
        } else {
            rpc
        };
        let mut post = Call::post(&body).session(&self.session);
        if let (true, Some(last)) = (held.exact, &held.last_event_id) {
            post = post.header("last-event-id", last);
        }
        (post, rpc)
    }

    /// One event as the client sees it.
    fn take(&self, id: u64, rpc: u64, event: mcp_resume_proxy::reply::sse::Event, held: &mut Held) {
        if let Some(event_id) = &event.id {
            if self.way == Way::LastEventId {
                held.handle = Some(event_id.clone());
            }
            // An at-least-once resume delivers entries the client holds
            // again, and primes with the acknowledged position, under the
            // ids they had: taking those as its position would name an
            // older entry than the newest it holds.
            if held.seen.insert(event_id.clone()) {
                held.last_event_id = Some(event_id.clone());
            }
        }
        let Some(m) = message(&event) else { return };
        held.transcript.push(format!(
            "  {} {}",
            event
                .id
                .as_deref()
                .map(|i| &i[..40.min(i.len())])
                .unwrap_or("-"),
            m
        ));
        if let Some(event_id) = &event.id {
            if let Some(before) = held.by_id.get(event_id) {
                if self.way == Way::LastEventId || held.exact {
                    held.transcript.push("  ^ a duplicate".into());
                    held.duplicate_ids += 1;
                } else {
                    // A continuation carries progress on its own
                    // progressToken; the entry is the same.
                    let mut again = m.clone();
                    if self.way == Way::ResumeToken {
                        again["params"]["progressToken"] =
                            before["params"]["progressToken"].clone();
                    }
                    assert_eq!(
                        before, &again,
                        "seed {}: an event id came back with another message",
                        self.seed
                    );
                    held.redelivered += 1;
                    return;
                }
            }
            held.by_id.insert(event_id.clone(), m.clone());
        }
        let method = m["method"].as_str().unwrap_or_default();
        match (self.way, method) {
            (Way::RequestsResume, "notifications/requests/resumePolicy") => {
                held.handle = m["params"]["resumeToken"].as_str().map(str::to_owned);
            }
            (Way::StreamResume, "notifications/stream/create") => {
                held.handle = m["params"]["stream"]["streamId"]
                    .as_str()
                    .map(str::to_owned);
            }
            (_, "notifications/progress") => held.kept.push(m),
            _ if m.get("result").is_some() || m.get("error").is_some() => {
                let token = m["result"]["_meta"]["nextResumeToken"].as_str();
                if self.way == Way::ResumeToken && token.is_some() {
                    held.handle = token.map(str::to_owned);
                    held.interim = true;
                } else if m["id"] == json!(id) || (m["id"] == json!(rpc) && rpc != id) {
                    if self.way == Way::StreamResume && rpc != id && m["id"] == json!(rpc) {
                        return; // the resume's own `{}`
                    }
                    held.kept.push(m);
                    held.done = true;
                }
            }
            _ => {}
        }
    }

    /// Progress 1..=N exactly once, in order, then the result.
    fn judge(&self, id: u64, held: &Held, tally: &mut Tally) {
        let progress: Vec<u64> = held
            .kept
            .iter()
            .filter_map(|m| m["params"]["progress"].as_u64())
            .collect();
        let mut lost = 0;
        let mut duplicated = held.duplicate_ids;
        for step in 1..=STEPS {
            match progress.iter().filter(|p| **p == step).count() {
                0 => lost += 1,
                n => duplicated += n as u64 - 1,
            }
        }
        let last = held.kept.last().expect("the final response");
        let text = last["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        if !text.contains("slow done") {
            lost += 1;
        }
        let in_order = progress.windows(2).all(|w| w[0] < w[1])
            && held.kept[..held.kept.len() - 1]
                .iter()
                .all(|m| m["method"] == "notifications/progress");
        if lost + duplicated > 0 || !in_order {
            eprintln!(
                "chaos {}: seed {}: call {id}: lost {lost}, duplicated {duplicated}, \
                 in order {in_order}, progress {progress:?}\n{:#?}",
                self.name, self.seed, held.transcript
            );
        }
        tally.lost += lost;
        tally.duplicated += duplicated;
        tally.disordered += u64::from(!in_order);
    }
}

fn assert_clean(tally: &Tally) {
    assert_eq!(
        (tally.lost, tally.duplicated, tally.disordered),
        (0, 0, 0),
        "lost, duplicated, disordered: {tally:?}"
    );
}

/// A POST-resume run tried both ways back: with `Last-Event-ID` (exactly
/// once) and without (at-least-once).
fn assert_both_shares(tally: &Tally) {
    assert!(
        tally.exact_resumes > 0 && tally.plain_resumes > 0,
        "resumes with and without Last-Event-ID: {tally:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cuts_resumed_by_last_event_id_lose_and_duplicate_nothing() {
    let chaos = Chaos::start(
        "random_cuts_resumed_by_last_event_id_lose_and_duplicate_nothing",
        Way::LastEventId,
    )
    .await;
    assert_clean(&chaos.run().await);
}

/// Regression: a `requests/resume` cut after the proxy wrote the stream's
/// last entry used to count as "ran to the end" and acknowledge entries the
/// client never got (seen: progress 8 lost, seed 1795438254685767282).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cuts_resumed_by_requests_resume_lose_and_duplicate_nothing() {
    let chaos = Chaos::start(
        "random_cuts_resumed_by_requests_resume_lose_and_duplicate_nothing",
        Way::RequestsResume,
    )
    .await;
    let tally = chaos.run().await;
    assert_clean(&tally);
    assert_both_shares(&tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cuts_resumed_by_stream_resume_lose_and_duplicate_nothing() {
    let chaos = Chaos::start(
        "random_cuts_resumed_by_stream_resume_lose_and_duplicate_nothing",
        Way::StreamResume,
    )
    .await;
    let tally = chaos.run().await;
    assert_clean(&tally);
    assert_both_shares(&tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cuts_continued_with_resume_tokens_lose_and_duplicate_nothing() {
    let chaos = Chaos::start(
        "random_cuts_continued_with_resume_tokens_lose_and_duplicate_nothing",
        Way::ResumeToken,
    )
    .await;
    assert_clean(&chaos.run().await);
}
