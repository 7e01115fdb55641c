//! The 2025-11-25 experimental tasks (SEP-1686), served by the proxy to
//! sessions of that revision whose upstream declares no `capabilities.tasks`
//! (opt-in per upstream, `[upstream.tasks] legacy`): a `tools/call` with
//! `params.task` is answered at once with a `CreateTaskResult`, and runs on
//! upstream as an ordinary request stream of the session — a *leg*, logged,
//! resumed upstream after a cut or a restart like any other — under an id
//! of the proxy's own, so the client may reuse its id at once.
//!
//! `tasks/get`, `tasks/list` and `tasks/cancel` are answered from the task's
//! record and leg (`crate::task`); `tasks/result` replays the leg — the
//! upstream's progress and its requests to the client, which the client
//! answers as usual — and ends with the leg's answer under the `tasks/result`
//! id, tagged with the related task. The session's `initialize` result gains
//! `capabilities.tasks` and its `tools/list` results mark every tool that says
//! nothing of tasks `optional`; both only on the wire (the log keeps the
//! upstream's bytes).
//!
//! A task belongs to the session that made it: another session's task, an
//! expired one and a forged id all read as unknown (-32602).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::tasks::{Answer as Outcome, TaskStatus};
use super::{response, string_param, Answer, Context, Refusal, Replay};
use crate::config::TasksConfig;
use crate::id::{StreamId, TaskId};
use crate::jsonrpc::{self, Kind, RequestId};
use crate::metrics::TaskEnd;
use crate::session::{ReadAs, Session};
use crate::store::{now_ms, rfc3339, StoreError, StreamMeta, TaskRecord};
use crate::stream::Log;
use crate::task::{self, Leg, Seen};
use crate::token::Keyring;

pub const GET: &str = "tasks/get";
pub const RESULT: &str = "tasks/result";
pub const LIST: &str = "tasks/list";
pub const CANCEL: &str = "tasks/cancel";
pub const METHODS: [&str; 4] = [GET, RESULT, LIST, CANCEL];

/// The revision that has these tasks.
const REVISION: &str = "2025-11-25";

/// The `_meta` key tying a message to its task.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

const UNKNOWN_TASK: &str = "unknown or expired task";

/// Why a `tasks/result` has no answer to give (-32603, as native servers).
const NO_ANSWER: &str = "the proxy holds no answer of the upstream for this task";
const CANCELLED: &str = "the task was cancelled before it answered";

/// The shortest `ttl` a task is kept for, whatever the client asked.
const MIN_TTL_MS: u64 = 1_000;

/// Whether a session opening with `initialize` is offered tasks: the route
/// serves them and the client speaks their revision.
pub fn offered(config: &TasksConfig, initialize: &[u8]) -> bool {
    config.legacy && jsonrpc::protocol_version(initialize).as_deref() == Some(REVISION)
}

/// Whether the proxy serves tasks to a session whose upstream answered its
/// `initialize` with `result`: an upstream with tasks of its own keeps them
/// all. (An upstream that agreed an older revision still gets them: the
/// client asked for theirs, and SDK clients use them on either.)
pub fn served(result: &[u8]) -> bool {
    let Ok(message) = serde_json::from_slice::<Value>(result) else {
        return false;
    };
    message["result"]["capabilities"]
        .as_object()
        .is_some_and(|capabilities| !capabilities.contains_key("tasks"))
}

/// Adds what the proxy serves to an `initialize` result's capabilities.
pub(super) fn advertise(capabilities: &mut Map<String, Value>) {
    capabilities.insert(
        "tasks".into(),
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
    );
}

/// A `tools/list` result with every tool that says nothing of tasks marked
/// `execution.taskSupport: "optional"`; `None` when nothing changes.
pub fn tools_offered(message: &[u8]) -> Option<Bytes> {
    let mut value: Value = serde_json::from_slice(message).ok()?;
    let tools = value.pointer_mut("/result/tools")?.as_array_mut()?;
    let mut changed = false;
    for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
        let execution = tool.entry("execution").or_insert_with(|| json!({}));
        if let Some(execution) = execution.as_object_mut() {
            if !execution.contains_key("taskSupport") {
                execution.insert("taskSupport".into(), json!("optional"));
                changed = true;
            }
        }
    }
    changed
        .then(|| serde_json::to_vec(&value).ok().map(Bytes::from))
        .flatten()
}

/// A task as the wire of this revision shows it.
#[derive(Serialize)]
struct Task<'a> {
    #[serde(rename = "taskId")]
    task_id: &'a str,
    status: &'static str,
    #[serde(rename = "statusMessage", skip_serializing_if = "Option::is_none")]
    status_message: Option<&'a str>,
    #[serde(rename = "createdAt")]
    created_at: String,
    #[serde(rename = "lastUpdatedAt")]
    last_updated_at: String,
    ttl: u64,
    #[serde(rename = "pollInterval")]
    poll_interval: u64,
}

/// A task with the status this revision gives it.
struct Shown {
    handle: String,
    status: TaskStatus,
    message: Option<String>,
    seen: Seen,
}

impl Shown {
    fn task(&self) -> Task<'_> {
        let record = &self.seen.record;
        Task {
            task_id: &self.handle,
            status: self.status.as_str(),
            status_message: self.message.as_deref(),
            created_at: rfc3339(record.created_ms),
            last_updated_at: rfc3339(self.seen.updated_ms),
            ttl: record.ttl_ms,
            poll_interval: record.poll_interval_ms,
        }
    }

    fn value(&self) -> Value {
        serde_json::to_value(self.task()).unwrap_or(Value::Null)
    }
}

/// Reads a task and gives it this revision's status: a live leg whose last
/// entry is a request of the upstream to the client waits for the client's
/// answer (`input_required`: the client should call `tasks/result`, which
/// brings the request).
async fn show(log: &Log, keyring: &Keyring, id: TaskId) -> Result<Option<Shown>, StoreError> {
    let Some(seen) = task::read(log, id).await? else {
        return Ok(None);
    };
    let mut status = seen.status;
    let message = match &seen.answer {
        Some(Outcome::Error(_, message)) => Some(message.clone()),
        None if status == TaskStatus::Failed => Some("the upstream request was lost".to_owned()),
        _ => None,
    };
    if status == TaskStatus::InputRequired {
        // An MRTR answer is no question of this revision: the call ended.
        status = TaskStatus::Completed;
    }
    if status == TaskStatus::Completed && seen.answer.as_ref().is_some_and(is_tool_error) {
        // As native servers of this revision report a tool's error; its
        // result is still what `tasks/result` answers.
        status = TaskStatus::Failed;
    }
    if status == TaskStatus::Working && asks_the_client(log, &seen).await? {
        status = TaskStatus::InputRequired;
    }
    let handle = keyring.task_handle(&seen.record.route, &seen.record.principal, seen.record.id);
    Ok(Some(Shown {
        handle,
        status,
        message,
        seen,
    }))
}

/// Whether an answer is a tool's result with `isError: true`.
fn is_tool_error(answer: &Outcome) -> bool {
    #[derive(serde::Deserialize)]
    struct ToolResult {
        #[serde(rename = "isError", default)]
        is_error: bool,
    }
    let Outcome::Result(result) = answer else {
        return false;
    };
    serde_json::from_str::<ToolResult>(result.get()).is_ok_and(|r| r.is_error)
}

/// Whether the task's current leg last logged a request to the client.
async fn asks_the_client(log: &Log, seen: &Seen) -> Result<bool, StoreError> {
    let Some(leg) = seen.record.current_leg() else {
        return Ok(false);
    };
    let Some(meta) = log.meta(leg).await? else {
        return Ok(false);
    };
    if meta.entries == 0 {
        return Ok(false);
    }
    let last = log.store().read_after(leg, meta.entries - 1, 1).await?;
    Ok(last
        .first()
        .and_then(|e| jsonrpc::classify(&e.message).ok())
        .is_some_and(|e| e.kind == Kind::Request))
}

impl Context<'_> {
    /// The caller's task a handle names; unknown, expired, forged and
    /// another session's alike are `UNKNOWN_TASK`.
    async fn own_task(&self, id: &RequestId, handle: &str) -> Result<Shown, Refusal> {
        let unknown = || Refusal::InvalidParams {
            id: id.clone(),
            message: UNKNOWN_TASK,
        };
        let record = self.session.record();
        let task = self
            .keyring
            .open_task_handle(&record.route, &record.principal, handle)
            .ok_or_else(unknown)?;
        let shown = show(self.log, self.keyring, task)
            .await?
            .ok_or_else(unknown)?;
        if shown.seen.record.session != Some(self.session.id) {
            return Err(unknown());
        }
        Ok(shown)
    }
}

/// `tools/call` with `params.task`: becomes a task at once.
#[derive(Debug)]
pub struct Create {
    id: RequestId,
    /// The call's params digest (as for every call: no double execution).
    digest: Option<String>,
    /// `params.task.ttl`, if the client asked for one.
    ttl_ms: Option<u64>,
    /// The call's params without `task`, raw.
    params: String,
}

/// Whether a `tools/call` asks for a task (`params.task` is an object).
pub fn asks_for_task(bytes: &[u8]) -> bool {
    memchr::memmem::find(bytes, b"\"task\"").is_some()
        && serde_json::from_slice::<Value>(bytes)
            .ok()
            .is_some_and(|v| v.pointer("/params/task").is_some_and(Value::is_object))
}

impl Create {
    pub fn parse(id: RequestId, bytes: &[u8]) -> Result<Self, Refusal> {
        #[derive(serde::Deserialize)]
        struct Call<'a> {
            #[serde(borrow)]
            params: &'a RawValue,
        }
        #[derive(serde::Deserialize)]
        struct TaskMetadata {
            ttl: Option<u64>,
        }
        // Every other param stays the raw text it came as.
        type Raw = std::collections::BTreeMap<String, Box<RawValue>>;
        let invalid = || Refusal::InvalidParams {
            id: id.clone(),
            message: "params.task must be an object",
        };
        let mut params: Raw = serde_json::from_slice::<Call<'_>>(bytes)
            .ok()
            .and_then(|call| serde_json::from_str(call.params.get()).ok())
            .ok_or_else(invalid)?;
        let metadata = params.remove("task").ok_or_else(invalid)?;
        let metadata: TaskMetadata = serde_json::from_str(metadata.get()).map_err(|_| invalid())?;
        let params = serde_json::to_string(&params).map_err(|_| invalid())?;
        Ok(Self {
            id,
            digest: jsonrpc::params_digest(bytes),
            ttl_ms: metadata.ttl,
            params,
        })
    }

    /// The task this call makes: named by the session, the call's id and
    /// its params, so that the same call sent again (a client retrying
    /// after a cut) names the same task instead of running twice — as any
    /// call re-sent under its id attaches to its stream.
    fn task_id(&self, cx: &Context<'_>) -> TaskId {
        match &self.digest {
            Some(digest) => TaskId::derived(&[
                cx.session.id.as_bytes(),
                self.id.as_json().as_bytes(),
                digest.as_bytes(),
            ]),
            None => TaskId::random(),
        }
    }

    /// Records the task (durably, naming its leg before the leg exists, as
    /// every task does) and hands the leg to the exchange; a call sent
    /// again is answered with the task it made.
    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let task = self.task_id(cx);
        if let Some(made) = show(cx.log, cx.keyring, task).await? {
            if made.seen.record.session == Some(cx.session.id) {
                let created = json!({ "task": made.value() });
                return Ok(Answer::Response(response(&self.id, &created)));
            }
        }
        let config = &cx.config.tasks;
        let session = cx.session.record();
        let leg = StreamId::random();
        let now = now_ms();
        let record = TaskRecord {
            id: task,
            route: session.route,
            principal: session.principal,
            session: Some(cx.session.id),
            created_ms: now,
            updated_ms: now,
            // A receiver may shorten what was asked, and says what it keeps
            // (never less than a second: a task must outlive its answer).
            ttl_ms: self.ttl_ms.map_or(config.ttl_ms, |t| {
                t.clamp(MIN_TTL_MS, config.ttl_ms.max(MIN_TTL_MS))
            }),
            poll_interval_ms: config.poll_interval_ms,
            request: self.params,
            headers: Vec::new(),
            legs: vec![leg],
            input: None,
            cancelled_ms: None,
            version: 1,
        };
        cx.log.store().put_task(&record).await?;
        cx.log.metrics().task_created();
        let handle = cx
            .keyring
            .task_handle(&record.route, &record.principal, record.id);
        let task = Task {
            task_id: &handle,
            status: TaskStatus::Working.as_str(),
            status_message: None,
            created_at: rfc3339(now),
            last_updated_at: rfc3339(now),
            ttl: record.ttl_ms,
            poll_interval: record.poll_interval_ms,
        };
        Ok(Answer::Start(Box::new(Start {
            leg: Leg {
                task: record.id,
                stream: leg,
            },
            upstream: upstream_call(record.id, &record.request),
            answer: response(&self.id, &json!({ "task": task })),
        })))
    }
}

/// The `tools/call` a task's leg sends upstream: the client's params
/// without `task`, under the proxy's id.
fn upstream_call(task: TaskId, params: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{params}}}"#,
        upstream_id(task).as_json()
    ))
}

/// The id a task's leg has upstream: the proxy's own, so the client may
/// reuse the id of its `tools/call` once it has the task.
fn upstream_id(task: TaskId) -> RequestId {
    RequestId(format!("\"mcp-resume-proxy-task-{task}\""))
}

/// A task to start: its leg goes upstream (the proxy's exchange), then the
/// client gets `answer`.
#[derive(Debug)]
pub struct Start {
    pub leg: Leg,
    /// The `tools/call` the upstream gets: the proxy's id, no `params.task`.
    pub upstream: Bytes,
    /// The `CreateTaskResult`.
    pub answer: Bytes,
}

/// `tasks/get`, `tasks/result`, `tasks/cancel`: one task named.
#[derive(Debug)]
pub struct Named {
    id: RequestId,
    task: String,
}

impl Named {
    pub fn parse(id: RequestId, params: &Value) -> Result<Self, Refusal> {
        let task = string_param(&id, params, "taskId", "params.taskId must be a string")?;
        Ok(Self { id, task })
    }

    /// `tasks/get`: the task as it stands.
    pub async fn get(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let shown = cx.own_task(&self.id, &self.task).await?;
        Ok(Answer::Response(response(&self.id, &shown.value())))
    }

    /// `tasks/cancel`: a task still running is cancelled (upstream too: the
    /// proxy tells it, see [`Answer::Cancel`]); an ended one cannot be.
    pub async fn cancel(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let shown = cx.own_task(&self.id, &self.task).await?;
        if shown.status.is_terminal() {
            return Err(Refusal::InvalidParams {
                id: self.id,
                message: "the task has already ended",
            });
        }
        let leg = shown.seen.record.current_leg();
        task::cancel(cx.log, shown.seen.record.id).await?;
        let after = show(cx.log, cx.keyring, shown.seen.record.id)
            .await?
            .unwrap_or(shown);
        let leg = match leg {
            Some(leg) => cx.log.meta(leg).await?,
            None => None,
        };
        let answer = response(&self.id, &after.value());
        Ok(Answer::Cancel(answer, leg.map(Box::new)))
    }

    /// `tasks/result`: the leg from its start — what the upstream said to
    /// the client on the way — ending with the task's answer under this
    /// request's id, once the task ended.
    pub async fn result(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let shown = cx.own_task(&self.id, &self.task).await?;
        let leg = shown.seen.record.current_leg();
        let meta = match leg {
            Some(leg) => cx.log.meta(leg).await?,
            None => None,
        };
        let no_answer = |why| {
            let error = jsonrpc::error_response(Some(&self.id), jsonrpc::code::INTERNAL_ERROR, why);
            Ok(Answer::Response(Bytes::from(error)))
        };
        let Some(stream) = meta else {
            return no_answer(NO_ANSWER);
        };
        match shown.status {
            TaskStatus::Cancelled => return no_answer(CANCELLED),
            // An ended task is answered with its answer alone: what the
            // upstream said on the way was delivered by an earlier
            // `tasks/result` (native servers hand each message out once).
            status if status.is_terminal() => {
                let last = match stream.entries.checked_sub(1) {
                    Some(at) => cx.log.store().read_after(stream.id, at, 1).await?,
                    None => Vec::new(),
                };
                let answer = last
                    .first()
                    .and_then(|e| as_result_of(&e.message, &self.id, &shown.handle));
                return match answer {
                    Some(answer) => Ok(Answer::Response(answer)),
                    None => no_answer(NO_ANSWER),
                };
            }
            _ => {}
        }
        let waiter = cx
            .waiters
            .enter(cx.config.tasks.result_waiters)
            .ok_or_else(|| Refusal::Busy(self.id.clone()))?;
        let upstream = stream
            .origin_ids
            .first()
            .cloned()
            .unwrap_or_else(|| self.id.clone());
        Ok(Answer::Replay(Box::new(Replay {
            reader: cx.log.watch(stream.id, 0),
            stream,
            closing: Vec::new(),
            call: None,
            task: Some(Fetched {
                upstream,
                client: self.id,
                handle: shown.handle,
                answered: false,
                _waiter: Some(waiter),
            }),
        })))
    }
}

/// Tasks per `tasks/list` page.
const PAGE: usize = 50;

/// `tasks/list`: the session's tasks, oldest first, a page at a time; the
/// cursor is the handle of the last task of the page before.
#[derive(Debug)]
pub struct List {
    id: RequestId,
    cursor: Option<String>,
}

impl List {
    pub fn parse(id: RequestId, params: &Value) -> Result<Self, Refusal> {
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(cursor)) => Some(cursor.clone()),
            Some(_) => {
                return Err(Refusal::InvalidParams {
                    id,
                    message: "params.cursor must be a string",
                })
            }
        };
        Ok(Self { id, cursor })
    }

    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let streams = cx.log.store().streams_of_session(cx.session.id).await?;
        let mut ids: Vec<(u64, TaskId)> = streams
            .iter()
            .filter_map(|m| Some((m.created_ms, m.task?)))
            .collect();
        ids.sort();
        ids.dedup_by_key(|(_, id)| *id);
        if let Some(cursor) = &self.cursor {
            let record = cx.session.record();
            let after = cx
                .keyring
                .open_task_handle(&record.route, &record.principal, cursor)
                .and_then(|last| ids.iter().position(|(_, id)| *id == last))
                .ok_or_else(|| Refusal::InvalidParams {
                    id: self.id.clone(),
                    message: "unknown cursor",
                })?;
            ids.drain(..=after);
        }
        let mut tasks = Vec::new();
        let mut last = None;
        let more = ids.len() > PAGE;
        for (_, id) in ids.into_iter().take(PAGE) {
            if let Some(shown) = show(cx.log, cx.keyring, id).await? {
                if shown.seen.record.session == Some(cx.session.id) {
                    tasks.push(shown.value());
                    last = Some(shown.handle);
                }
            }
        }
        let mut result = json!({ "tasks": tasks });
        if let (true, Some(last)) = (more, last) {
            result["nextCursor"] = json!(last);
        }
        Ok(Answer::Response(response(&self.id, &result)))
    }
}

/// Tells the session when a task ends: a `notifications/tasks/status` on
/// its standalone stream (when one is open; the notification is a
/// courtesy — clients poll), and the task's end in the metrics. Runs while
/// this process lives; a task that ends after a restart is only polled.
pub async fn announce_end(log: Arc<Log>, keyring: Keyring, session: Arc<Session>, leg: Leg) {
    let mut watermark = log.store().subscribe(leg.stream);
    tokio::select! {
        // A closed subscription is a stream this process no longer
        // follows: what the log says decides.
        _ = watermark.wait_for(|w| w.finished) => {}
        _ = session.ended.cancelled() => return,
    }
    drop(watermark);
    let Ok(Some(shown)) = show(&log, &keyring, leg.task).await else {
        return;
    };
    if !shown.status.is_terminal() {
        return;
    }
    log.metrics().task_ended(match shown.status {
        TaskStatus::Completed => TaskEnd::Completed,
        TaskStatus::Cancelled => TaskEnd::Cancelled,
        _ => TaskEnd::Failed,
    });
    let Some(standalone) = session.standalone() else {
        return;
    };
    if !matches!(log.meta(standalone).await, Ok(Some(m)) if m.status.is_live()) {
        return;
    }
    let notification = super::notification("notifications/tasks/status", shown.value());
    if let Err(e) = log.append(standalone, &[notification]).await {
        tracing::debug!(task = %leg.task, error = %e, "cannot announce a task's end");
    }
}

/// How many `tasks/result` requests wait at once on this instance.
#[derive(Debug, Default)]
pub struct Waiters(Arc<AtomicUsize>);

impl Waiters {
    /// A place among the waiters, if one of `cap` is free.
    fn enter(&self, cap: usize) -> Option<Waiter> {
        let taken = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            });
        taken.ok().map(|_| Waiter(self.0.clone()))
    }
}

/// One waiting `tasks/result`; its place frees when its answer ends.
#[derive(Debug)]
struct Waiter(Arc<AtomicUsize>);

impl Drop for Waiter {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A leg's answer as the answer of `tasks/result` request `client`: its
/// id, and the related task in the result's `_meta`.
fn as_result_of(message: &[u8], client: &RequestId, handle: &str) -> Option<Bytes> {
    let mut value: Map<String, Value> = serde_json::from_slice(message).ok()?;
    if !value.contains_key("result") && !value.contains_key("error") {
        return None;
    }
    value.insert("id".into(), serde_json::from_str(client.as_json()).ok()?);
    if let Some(result) = value.get_mut("result").and_then(Value::as_object_mut) {
        let meta = result.entry("_meta").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(RELATED_TASK.into(), json!({ "taskId": handle }));
        }
    }
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

/// A leg shown as the answer of a `tasks/result`.
#[derive(Debug)]
pub struct Fetched {
    /// The id the leg's request had upstream.
    upstream: RequestId,
    /// The `tasks/result` request's id.
    client: RequestId,
    handle: String,
    answered: bool,
    /// A fresh `tasks/result` holds a place among the waiters; a resume of
    /// one does not take another.
    _waiter: Option<Waiter>,
}

impl Fetched {
    /// A `tasks/result` answer resumed (GET with `Last-Event-ID`), shown as
    /// it was: `stream` is the leg, `read_as` the request it answers.
    pub fn resumed(stream: &StreamMeta, read_as: ReadAs) -> Self {
        Self {
            upstream: stream
                .origin_ids
                .first()
                .cloned()
                .unwrap_or_else(|| read_as.client.clone()),
            client: read_as.client,
            handle: read_as.handle,
            answered: false,
            _waiter: None,
        }
    }

    /// The request this answer is for, to show a resume of it the same way.
    pub fn read_as(&self) -> ReadAs {
        ReadAs {
            client: self.client.clone(),
            handle: self.handle.clone(),
        }
    }

    /// One entry of the leg as the client sees it: the leg's answer becomes
    /// the `tasks/result` answer, tagged with its task; the rest as logged.
    pub fn entry(&mut self, message: Bytes) -> Option<Bytes> {
        if self.answered {
            return None;
        }
        if jsonrpc::response_ids(&message).contains(&self.upstream) {
            self.answered = true;
            return Some(self.answer(&message).unwrap_or(message));
        }
        let asks = jsonrpc::classify(&message).is_ok_and(|e| e.kind == Kind::Request);
        if asks {
            return Some(self.tagged_request(&message).unwrap_or(message));
        }
        Some(message)
    }

    /// A request of the upstream to the client, tagged with its task.
    fn tagged_request(&self, message: &[u8]) -> Option<Bytes> {
        let mut value: Map<String, Value> = serde_json::from_slice(message).ok()?;
        let params = value.entry("params").or_insert_with(|| json!({}));
        let meta = params
            .as_object_mut()?
            .entry("_meta")
            .or_insert_with(|| json!({}));
        meta.as_object_mut()?
            .insert(RELATED_TASK.into(), json!({ "taskId": self.handle }));
        serde_json::to_vec(&value).ok().map(Bytes::from)
    }

    fn answer(&self, message: &[u8]) -> Option<Bytes> {
        as_result_of(message, &self.client, &self.handle)
    }

    /// What ends a leg that ended without an answer (cancelled): the
    /// `tasks/result` must still be answered.
    pub fn closing(&mut self) -> Option<Bytes> {
        if self.answered {
            return None;
        }
        self.answered = true;
        Some(Bytes::from(jsonrpc::error_response(
            Some(&self.client),
            jsonrpc::code::INTERNAL_ERROR,
            CANCELLED,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_declaring_tasks_keeps_them() {
        let own = br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{"tasks":{}}}}"#;
        let none = br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}}}}"#;
        assert!(!served(own));
        assert!(served(none));
        assert!(!served(
            br#"{"jsonrpc":"2.0","id":0,"error":{"code":-32600,"message":"x"}}"#
        ));
    }

    #[test]
    fn tools_list_marks_only_tools_that_say_nothing_of_tasks() {
        let listed = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"},{"name":"b","execution":{"taskSupport":"forbidden"}}]}}"#;
        let shown: Value = serde_json::from_slice(&tools_offered(listed).unwrap()).unwrap();
        assert_eq!(
            shown["result"]["tools"][0]["execution"]["taskSupport"],
            "optional"
        );
        assert_eq!(
            shown["result"]["tools"][1]["execution"]["taskSupport"],
            "forbidden"
        );
        let all_said = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"b","execution":{"taskSupport":"required"}}]}}"#;
        assert!(tools_offered(all_said).is_none());
    }

    #[test]
    fn the_upstream_call_has_the_proxys_id_and_no_task_and_keeps_every_other_param_verbatim() {
        let call = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{"n":1.50},"task":{"ttl":5000},"_meta":{"progressToken":"p"}}}"#;
        let create = Create::parse(RequestId("7".into()), call).unwrap();
        assert_eq!(create.ttl_ms, Some(5000));
        let task = TaskId::random();
        let upstream = upstream_call(task, &create.params);
        let sent: Value = serde_json::from_slice(&upstream).unwrap();
        assert_eq!(sent["id"], format!("mcp-resume-proxy-task-{task}"));
        assert!(sent["params"].get("task").is_none());
        assert_eq!(sent["params"]["_meta"]["progressToken"], "p");
        assert!(std::str::from_utf8(&upstream)
            .unwrap()
            .contains(r#""arguments":{"n":1.50}"#));
    }

    #[test]
    fn a_task_that_is_no_object_is_invalid_params() {
        let call =
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","task":5}}"#;
        assert!(!asks_for_task(call));
        assert!(matches!(
            Create::parse(RequestId("7".into()), call),
            Err(Refusal::InvalidParams { .. })
        ));
    }

    #[test]
    fn the_legs_answer_becomes_the_tasks_result_answer_tagged_with_its_task() {
        let waiters = Waiters::default();
        let mut fetched = Fetched {
            upstream: upstream_id(TaskId::random()),
            client: RequestId("9".into()),
            handle: "H".into(),
            answered: false,
            _waiter: waiters.enter(1),
        };
        assert!(waiters.enter(1).is_none(), "one waiter of one");
        let progress = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}"#);
        assert_eq!(fetched.entry(progress.clone()), Some(progress));
        let asked = br#"{"jsonrpc":"2.0","id":"s1","method":"elicitation/create","params":{"message":"?"}}"#;
        let asked: Value =
            serde_json::from_slice(&fetched.entry(Bytes::from_static(asked)).unwrap()).unwrap();
        assert_eq!(asked["params"]["_meta"][RELATED_TASK]["taskId"], "H");
        let answer = format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[]}}}}"#,
            fetched.upstream.as_json()
        );
        let shown: Value =
            serde_json::from_slice(&fetched.entry(Bytes::from(answer)).unwrap()).unwrap();
        assert_eq!(shown["id"], 9);
        assert_eq!(shown["result"]["_meta"][RELATED_TASK]["taskId"], "H");
        assert_eq!(fetched.closing(), None, "answered once");
        drop(fetched);
        assert!(waiters.enter(1).is_some(), "the place is free again");
    }
}
