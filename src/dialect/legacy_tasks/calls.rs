//! The commands a client of the 2025-11-25 tasks sends: a `tools/call`
//! with `params.task` (the task is made, its leg handed to the exchange),
//! `tasks/get`, `tasks/result`, `tasks/cancel` and `tasks/list`. How a task
//! reads and shows is `task::legacy`'s; how a leg is replayed as a
//! `tasks/result` answer is `fetched`'s.

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::fetched::Fetched;
use super::{CANCELLED, MIN_TTL_MS, NO_ANSWER};
use crate::dialect::{response, string_param, Answer, Context, Refusal, Replay};
use crate::id::{StreamId, TaskId};
use crate::jsonrpc::{self, Needle, RequestId};
use crate::store::now_ms;
use crate::task::legacy::{as_result_of, show, upstream_call};
use crate::task::wire::{Revision, Task};
use crate::task::{self, Leg, TaskRecord, TaskStatus};

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

static TASK: Needle = Needle::new(b"\"task\"");

/// Whether a `tools/call` asks for a task (`params.task` is an object).
pub fn asks_for_task(bytes: &[u8]) -> bool {
    TASK.found_in(bytes)
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
            digest: jsonrpc::params_digest(bytes).map(|d| d.to_string()),
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
            Some(digest) => TaskId::derived_beside(
                cx.session.id.as_bytes(),
                &[
                    cx.session.id.as_bytes(),
                    self.id.as_json().as_bytes(),
                    digest.as_bytes(),
                ],
            ),
            None => TaskId::random_beside(cx.session.id.as_bytes()),
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
        let leg = StreamId::random_beside(cx.session.id.as_bytes());
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
        let handle = crate::task::wire::handle(cx.keyring, &record);
        let task = Task::of(Revision::Legacy, &handle, TaskStatus::Working, &record, now);
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
                asked_before: cx.session.answered_by_client(),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
