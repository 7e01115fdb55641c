//! A task as a client sees it, read from the log: the record, its current
//! leg's status and, once the leg ended, its one entry — nothing about a
//! task's outcome is stored twice. Also the one place a task changes:
//! compare-and-set on its record, retried when another writer (another
//! instance) came first.

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::dialect::tasks::{Answer, Detailed, TaskStatus};
use crate::id::TaskId;
use crate::jsonrpc::RequestId;
use crate::store::{now_ms, Result, StoreError, StreamStatus, TaskRecord};
use crate::stream::Log;
use crate::token::Keyring;

/// How long a task may name a leg not made yet before it counts as lost.
const LEG_IN_THE_MAKING_MS: u64 = 10_000;

/// Compare-and-set attempts before a change gives up (each loses only to
/// another writer's success, so this is never reached in practice).
const CAS_ATTEMPTS: usize = 16;

/// A task with what its current leg says.
pub struct Seen {
    pub record: TaskRecord,
    pub status: TaskStatus,
    /// The current leg's answer, once it ended with one.
    pub answer: Option<Answer>,
    /// The last change: to the record, or the current leg's end.
    pub updated_ms: u64,
}

/// Reads task `id`; `None` when it is unknown or expired.
pub async fn read(log: &Log, id: TaskId) -> Result<Option<Seen>> {
    let Some(record) = log.store().get_task(id).await? else {
        return Ok(None);
    };
    if record.expires_ms() <= now_ms() {
        return Ok(None);
    }
    let Some(leg) = record.current_leg() else {
        return Ok(None);
    };
    let Some(meta) = log.meta(leg).await? else {
        // The record names its next leg before the leg exists (a leg must
        // never be without its task): being made now, or lost to a crash
        // in between — then the task failed.
        let making = now_ms().saturating_sub(record.updated_ms) < LEG_IN_THE_MAKING_MS;
        let status = if making {
            TaskStatus::Working
        } else {
            TaskStatus::Failed
        };
        let updated_ms = record.updated_ms;
        return Ok(Some(Seen {
            record,
            status,
            answer: None,
            updated_ms,
        }));
    };
    let mut updated_ms = record.updated_ms.max(meta.finished_ms.unwrap_or(0));
    let answer = if meta.status.is_live() || meta.entries == 0 {
        None
    } else {
        let last = log.store().read_after(leg, meta.entries - 1, 1).await?;
        last.first().and_then(|e| Answer::of(&e.message))
    };
    let mut status = match (&meta.status, &answer) {
        (StreamStatus::Live, _) => TaskStatus::Working,
        (StreamStatus::Cancelled, _) => TaskStatus::Cancelled,
        (_, Some(Answer::Result(_))) => TaskStatus::Completed,
        (_, Some(Answer::InputRequired { .. })) => TaskStatus::InputRequired,
        (_, Some(Answer::Error(..)) | None) => TaskStatus::Failed,
    };
    if let Some(at) = record.cancelled_ms {
        // A cancellation wins over what was still open, never over an end
        // that came before it.
        if !status.is_terminal() {
            status = TaskStatus::Cancelled;
            updated_ms = updated_ms.max(at);
        }
    }
    Ok(Some(Seen {
        record,
        status,
        answer,
        updated_ms,
    }))
}

impl Seen {
    /// The round of MRTR the current leg is (1 for the call itself):
    /// surfaced input keys carry it, so they are unique over the task's
    /// life even when the upstream reuses its keys.
    pub fn round(&self) -> usize {
        self.record.legs.len()
    }

    /// The upstream's input requests still unanswered, under surfaced keys.
    fn open_requests(&self) -> Option<Box<RawValue>> {
        let Some(Answer::InputRequired { requests, .. }) = &self.answer else {
            return None;
        };
        let requests: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(requests.get()).ok()?;
        let answered = self.record.input.as_ref().map(|i| &i.answered);
        let open: serde_json::Map<String, serde_json::Value> = requests
            .into_iter()
            .filter(|(key, _)| !answered.is_some_and(|a| a.contains_key(key)))
            .map(|(key, request)| (surfaced(self.round(), &key), request))
            .collect();
        serde_json::value::to_raw_value(&open).ok()
    }

    /// The `tasks/get` answer.
    pub fn get_result(&self, keyring: &Keyring, id: &RequestId) -> Vec<u8> {
        let handle = handle(keyring, &self.record);
        let open = (self.status == TaskStatus::InputRequired)
            .then(|| self.open_requests())
            .flatten();
        let (result, error, message) = match (&self.status, &self.answer) {
            (TaskStatus::Completed, Some(Answer::Result(result))) => (Some(&**result), None, None),
            (TaskStatus::Failed, Some(Answer::Error(error, message))) => {
                (None, Some(&**error), Some(message.as_str()))
            }
            _ => (None, None, None),
        };
        let failed_unread = self.status == TaskStatus::Failed && error.is_none();
        let unreadable = unreadable_error();
        Detailed {
            task_id: &handle,
            status: self.status,
            created_ms: self.record.created_ms,
            updated_ms: self.updated_ms,
            ttl_ms: self.record.ttl_ms,
            poll_interval_ms: self.record.poll_interval_ms,
            status_message: message,
            result,
            error: if failed_unread {
                Some(&*unreadable)
            } else {
                error
            },
            input_requests: open.as_deref(),
        }
        .get_result(id)
    }
}

/// The key a client sees for upstream input key `key` of MRTR round `round`.
pub fn surfaced(round: usize, key: &str) -> String {
    format!("{round}.{key}")
}

/// The upstream key of a surfaced key of round `round`; `None` for a key of
/// another round or none of ours.
pub fn upstream_key(round: usize, surfaced: &str) -> Option<&str> {
    let (r, key) = surfaced.split_once('.')?;
    (r.parse::<usize>().ok()? == round).then_some(key)
}

fn unreadable_error() -> Box<RawValue> {
    RawValue::from_string(
        r#"{"code":-32603,"message":"the proxy holds no answer of the upstream for this task (it could not read one, or the request was lost)"}"#.into(),
    )
    .expect("a JSON literal")
}

/// The task's `taskId`.
pub fn handle(keyring: &Keyring, record: &TaskRecord) -> String {
    keyring.task_handle(&record.route, &record.principal, record.id)
}

/// The `CreateTaskResult` of a task just made.
pub fn create_result(keyring: &Keyring, record: &TaskRecord, id: &RequestId) -> Vec<u8> {
    let handle = handle(keyring, record);
    Detailed {
        task_id: &handle,
        status: TaskStatus::Working,
        created_ms: record.created_ms,
        updated_ms: record.updated_ms,
        ttl_ms: record.ttl_ms,
        poll_interval_ms: record.poll_interval_ms,
        status_message: None,
        result: None,
        error: None,
        input_requests: None,
    }
    .create_result(id)
}

/// Applies `change` to the stored record with compare-and-set, re-reading
/// and retrying when another writer came first. `change` returns `false`
/// to leave the record as it is. `None` when the task is gone.
pub async fn change(
    log: &Log,
    id: TaskId,
    mut change: impl FnMut(&mut TaskRecord) -> bool,
) -> Result<Option<TaskRecord>> {
    for _ in 0..CAS_ATTEMPTS {
        let Some(mut record) = log.store().get_task(id).await? else {
            return Ok(None);
        };
        if !change(&mut record) {
            return Ok(Some(record));
        }
        record.version += 1;
        record.updated_ms = now_ms();
        if log.store().update_task(&record).await? {
            return Ok(Some(record));
        }
    }
    Err(StoreError::Backend(format!(
        "task {id}: too many concurrent changes"
    )))
}

/// Cancels a task: marks its record and ends its current leg, which stops
/// the upstream request wherever it runs (the runner watches the leg).
pub async fn cancel(log: &Log, id: TaskId) -> Result<()> {
    let now = now_ms();
    let Some(record) = change(log, id, |r| {
        let first = r.cancelled_ms.is_none();
        r.cancelled_ms.get_or_insert(now);
        first
    })
    .await?
    else {
        return Ok(());
    };
    if let Some(leg) = record.current_leg() {
        if log.meta(leg).await?.is_some_and(|m| m.status.is_live()) {
            log.finish(leg, StreamStatus::Cancelled).await?;
        }
    }
    Ok(())
}

/// The raw JSON of an MRTR re-issue's params: the original params with the
/// answers and the upstream's request state (both at the top level).
pub fn reissue_params(
    request: &str,
    answers: &std::collections::BTreeMap<String, String>,
    request_state: Option<&str>,
) -> Option<String> {
    // Every value stays the raw text it came as: the upstream may bind its
    // request state to a digest of the arguments.
    type Raw = std::collections::BTreeMap<String, Box<RawValue>>;
    let mut params: Raw = serde_json::from_str(request).ok()?;
    let mut responses = Raw::new();
    for (key, answer) in answers {
        responses.insert(key.clone(), RawValue::from_string(answer.clone()).ok()?);
    }
    params.insert(
        "inputResponses".into(),
        serde_json::value::to_raw_value(&responses).ok()?,
    );
    match request_state {
        Some(state) => {
            params.insert(
                "requestState".into(),
                RawValue::from_string(state.into()).ok()?,
            );
        }
        None => {
            params.remove("requestState");
        }
    }
    serde_json::to_string(&params).ok()
}

/// The body of a re-issued request with JSON-RPC id `id`.
pub fn reissue_body(id: &RequestId, params: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{params}}}"#,
        id.as_json()
    ))
}

/// Whether a record names the principal and route a request comes from.
pub fn belongs(record: &TaskRecord, route: &str, principal: &str) -> bool {
    record.route == route && record.principal == principal
}
