//! The MCP clients and what they saw: each client is a session running slow
//! calls back to back, resuming a call cut by a drain (with `Last-Event-ID`,
//! once its `retry:` has passed) and sending again a request that found no
//! proxy. Every request is kept as an [`Exchange`] of its call's
//! [`CallRecord`]; at the end the records are checked (every call's progress
//! and result delivered once, in order; every request answered well) and
//! summed up. It reaches the proxy only over HTTP, as a real client does: it
//! must not signal instances or nginx, nor read the upstream's counters.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use mcp_resume_proxy::reply::sse::Decoder;
use serde_json::Value;
use tokio::time::{sleep, Instant};

use super::plan::Plan;
use super::timeline::Timeline;
use crate::common::{message, slow_call, Call, McpClient, LIMIT, V_LATEST};

/// Concurrent clients, each a session running calls back to back.
const CLIENTS: usize = 8;
/// No call may take longer than this end to end, interruptions included.
const CALL_LIMIT: Duration = Duration::from_secs(60);
/// How long a client waits before it sends a request again that found no
/// proxy (or failed).
const KNOCK_EVERY: Duration = Duration::from_millis(100);
/// The reconnection delay when a drained answer names none.
const DEFAULT_RETRY_MS: u64 = 1_000;

/// One HTTP request of a client and how it went.
#[derive(Debug, Clone)]
struct Exchange {
    at_ms: u128,
    /// `POST` (the call), `GET` (a resume).
    method: &'static str,
    /// nginx's `X-Served-By` (which instance; two when nginx tried the
    /// next one), or "direct".
    served_by: String,
    status: Option<u16>,
    /// No answer: the connection failed before a response head.
    unanswered: Option<String>,
    /// The connection was refused: the request never left.
    refused: bool,
    /// The answer's body broke off (not a clean end).
    broke: Option<String>,
    /// A clean end of an SSE answer before the call's result: with the
    /// `retry:` it carried, if any.
    ended_early: Option<Option<u64>>,
    /// Messages it delivered.
    messages: usize,
}

impl Exchange {
    /// A complete answer with 200 or 202 (an SSE answer ended by a drain,
    /// with its `retry:`, is complete).
    fn answered_well(&self) -> bool {
        matches!(self.status, Some(200 | 202))
            && self.broke.is_none()
            && !matches!(self.ended_early, Some(None))
    }
}

#[derive(Debug)]
pub struct CallRecord {
    client: usize,
    id: u64,
    steps: u64,
    /// Every message with its event id, in the order they came.
    seen: Vec<(Option<String>, Value)>,
    result: Option<Value>,
    exchanges: Vec<Exchange>,
}

impl CallRecord {
    /// Problems with what the client got: anything but progress 1..=steps
    /// once each in order, then the result; an event id twice.
    fn delivery_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let token = format!("p{}", self.id);
        let mut progress = Vec::new();
        for (_, m) in &self.seen {
            if m["method"] == "notifications/progress" && m["params"]["progressToken"] == token {
                progress.push(m["params"]["progress"].as_u64().unwrap_or(0));
            } else if m["id"] != self.id {
                problems.push(format!("a message of something else: {m}"));
            }
        }
        if progress != (1..=self.steps).collect::<Vec<_>>() {
            problems.push(format!("progress {progress:?}, not 1..={}", self.steps));
        }
        match &self.result {
            None => problems.push("no final response".into()),
            Some(r) => {
                let want = format!("slow done after {} steps", self.steps);
                if r["result"]["content"][0]["text"] != want.as_str() {
                    problems.push(format!("not its result: {r}"));
                }
            }
        }
        let finals = self.seen.iter().filter(|(_, m)| m["id"] == self.id).count();
        if finals != 1 {
            problems.push(format!("{finals} final responses"));
        }
        let ids: Vec<&String> = self.seen.iter().filter_map(|(id, _)| id.as_ref()).collect();
        if ids.iter().collect::<HashSet<_>>().len() != ids.len() {
            problems.push("an event id delivered twice".into());
        }
        problems
    }

    /// Its SSE answers were cut short (by a drain) at least once.
    pub fn interrupted(&self) -> bool {
        self.exchanges.iter().any(|e| e.ended_early.is_some())
    }

    /// Instances that delivered messages of it.
    pub fn instances(&self, timeline: &Timeline) -> BTreeSet<String> {
        self.exchanges
            .iter()
            .filter(|e| e.messages > 0)
            .map(|e| timeline.name(&e.served_by))
            .collect()
    }

    fn trace(&self, timeline: &Timeline) -> String {
        let steps: Vec<String> = self
            .exchanges
            .iter()
            .map(|e| {
                let how = match (&e.status, &e.unanswered) {
                    (Some(s), _) => s.to_string(),
                    (None, Some(why)) if e.refused => format!("refused ({why})"),
                    (None, Some(why)) => format!("no answer ({why})"),
                    (None, None) => "?".into(),
                };
                let end = match (&e.broke, &e.ended_early) {
                    (Some(why), _) => format!(", body broke: {why}"),
                    (None, Some(Some(ms))) => format!(", ended, retry {ms} ms"),
                    (None, Some(None)) => ", ended without its result or a retry:".into(),
                    (None, None) => String::new(),
                };
                format!(
                    "+{}ms {} on {} -> {how} ({} messages{end})",
                    e.at_ms,
                    e.method,
                    timeline.name(&e.served_by),
                    e.messages
                )
            })
            .collect();
        format!(
            "client {} call {} ({} steps): {}",
            self.client,
            self.id,
            self.steps,
            steps.join("; ")
        )
    }
}

/// What a client does when a request found no proxy.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Through nginx: every request must be answered.
    Nginx,
    /// Straight at the only instance: while it is down requests find
    /// nobody, and are sent again.
    Direct,
}

/// Runs one slow call to its final response: POST, and after an answer cut
/// short, GET with `Last-Event-ID` once the `retry:` it carried has passed
/// (or the POST again under the same id when no event id came yet).
async fn run_call(
    client: &McpClient,
    client_no: usize,
    sid: &str,
    id: u64,
    (steps, interval_ms): (u64, u64),
    timeline: &Timeline,
) -> CallRecord {
    let mut record = CallRecord {
        client: client_no,
        id,
        steps,
        seen: Vec::new(),
        result: None,
        exchanges: Vec::new(),
    };
    let deadline = Instant::now() + CALL_LIMIT;
    let mut last_id: Option<String> = None;
    while record.result.is_none() && Instant::now() < deadline {
        let (method, call) = match &last_id {
            None => (
                "POST",
                Call::post(&slow_call(id, steps, interval_ms)).session(sid),
            ),
            Some(last) => (
                "GET",
                Call::get().session(sid).header("last-event-id", last),
            ),
        };
        let mut exchange = Exchange {
            at_ms: timeline.ms(),
            method,
            served_by: "direct".into(),
            status: None,
            unanswered: None,
            refused: false,
            broke: None,
            ended_early: None,
            messages: 0,
        };
        let sent = tokio::time::timeout_at(deadline, client.try_send(call)).await;
        let res = match sent {
            Err(_) => break,
            Ok(Err(e)) => {
                exchange.refused = e.is_connect();
                exchange.unanswered = Some(mcp_resume_proxy::tls::outbound::error_chain(&e));
                record.exchanges.push(exchange);
                sleep(KNOCK_EVERY).await;
                continue;
            }
            Ok(Ok(res)) => res,
        };
        exchange.status = Some(res.status().as_u16());
        if let Some(by) = res.headers().get("x-served-by") {
            exchange.served_by = by.to_str().unwrap_or("?").to_owned();
        }
        if res.status() != http::StatusCode::OK {
            let body = tokio::time::timeout(LIMIT, res.into_body().collect()).await;
            let body = match body {
                Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                _ => "(no body)".into(),
            };
            exchange.broke = Some(format!(
                "body: {}",
                body.chars().take(200).collect::<String>()
            ));
            record.exchanges.push(exchange);
            sleep(KNOCK_EVERY).await;
            continue;
        }
        let mut body = res.into_body();
        let mut decoder = Decoder::new();
        let mut retry = None;
        let retry_ms = 'read: loop {
            while let Some(event) = decoder.next_event() {
                retry = event.retry.or(retry);
                if let Some(event_id) = &event.id {
                    last_id = Some(event_id.clone());
                }
                let Some(m) = message(&event) else { continue };
                exchange.messages += 1;
                let is_final =
                    m["id"] == id && (m.get("result").is_some() || m.get("error").is_some());
                record.seen.push((event.id, m.clone()));
                if is_final {
                    record.result = Some(m);
                    break 'read None;
                }
            }
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => break 'read None,
                Ok(None) => {
                    exchange.ended_early = Some(retry);
                    break 'read Some(retry.unwrap_or(DEFAULT_RETRY_MS));
                }
                Ok(Some(Err(e))) => {
                    exchange.broke = Some(mcp_resume_proxy::tls::outbound::error_chain(&e));
                    break 'read Some(KNOCK_EVERY.as_millis() as u64);
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        decoder.push(&data);
                    }
                }
            }
        };
        record.exchanges.push(exchange);
        if let Some(ms) = retry_ms {
            sleep(Duration::from_millis(ms)).await;
        }
    }
    record
}

/// One client: a session, then slow calls back to back until `stop`.
async fn client_loop(
    url: String,
    client_no: usize,
    plan: Plan,
    stop: Arc<AtomicBool>,
    timeline: Timeline,
) -> Vec<CallRecord> {
    let client = McpClient::unpooled(url);
    let sid = client.initialize(V_LATEST).await;
    let mut calls = Vec::new();
    let mut id = 0;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        let record = run_call(
            &client,
            client_no,
            &sid,
            id,
            plan.call(client_no, id),
            &timeline,
        )
        .await;
        let hung = record.result.is_none();
        calls.push(record);
        if hung {
            break;
        }
    }
    calls
}

pub fn start_clients(
    url: &str,
    plan: Plan,
    stop: &Arc<AtomicBool>,
    timeline: &Timeline,
) -> Vec<tokio::task::JoinHandle<Vec<CallRecord>>> {
    (0..CLIENTS)
        .map(|n| {
            tokio::spawn(client_loop(
                url.to_owned(),
                n,
                plan,
                stop.clone(),
                timeline.clone(),
            ))
        })
        .collect()
}

pub async fn join_clients(
    clients: Vec<tokio::task::JoinHandle<Vec<CallRecord>>>,
) -> Vec<CallRecord> {
    let mut calls = Vec::new();
    for client in clients {
        let joined = tokio::time::timeout(CALL_LIMIT + LIMIT, client).await;
        calls.extend(joined.expect("clients end").expect("client task"));
    }
    calls
}

/// Everything the clients saw, checked; panics with the evidence.
pub fn check_calls(calls: &[CallRecord], route: Route, timeline: &Timeline, context: &str) {
    let mut problems = Vec::new();
    for call in calls {
        let mut bad: Vec<String> = call.delivery_problems();
        for e in &call.exchanges {
            let tolerated = route == Route::Direct && e.unanswered.is_some();
            if !e.answered_well() && !tolerated {
                bad.push(format!("a request failed at +{} ms", e.at_ms));
            }
        }
        if !bad.is_empty() {
            problems.push(format!("{}\n    {}", bad.join("; "), call.trace(timeline)));
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} calls went wrong:\n{}\n\ntimeline:\n{}\n{context}",
        problems.len(),
        calls.len(),
        problems.join("\n"),
        timeline.text()
    );
}

pub fn summary(calls: &[CallRecord], timeline: &Timeline) -> String {
    let requests: usize = calls.iter().map(|c| c.exchanges.len()).sum();
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for e in calls.iter().flat_map(|c| &c.exchanges) {
        let key = match (&e.status, e.refused) {
            (Some(_), _) => timeline.name(&e.served_by),
            (None, true) => "refused".into(),
            (None, false) => "unanswered".into(),
        };
        *by.entry(key).or_default() += 1;
    }
    let retried_by_nginx = calls
        .iter()
        .flat_map(|c| &c.exchanges)
        .filter(|e| e.served_by.contains(", "))
        .count();
    let interrupted = calls.iter().filter(|c| c.interrupted()).count();
    let moved = calls
        .iter()
        .filter(|c| c.instances(timeline).len() > 1)
        .count();
    format!(
        "{} calls, {requests} requests ({by:?}; {retried_by_nginx} passed on by nginx), \
         {interrupted} calls cut by a drain and resumed, {moved} of them moved to another instance",
        calls.len()
    )
}
