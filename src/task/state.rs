//! A task as the log holds it, for every dialect that serves tasks (the
//! 2026-07-28 extension in `proxy::tasks`, the 2025-11-25 experimental tasks
//! in `dialect::legacy_tasks`): its record and its current leg read into one
//! status and answer — nothing about a task's outcome is stored twice — and
//! the one place a task changes: compare-and-set on its record, retried
//! when another writer (another instance) came first. How a status is shown
//! on the wire is each revision's own (`modern`, `legacy`).

use super::status::{Answer, TaskStatus};
use crate::id::{StreamId, TaskId};
use crate::store::{now_ms, Result, StoreError, StreamStatus, TaskRecord};
use crate::stream::Log;

/// A leg about to be opened: the task it serves, and the stream id its
/// record already names (a leg never exists without its task).
#[derive(Clone, Copy, Debug)]
pub struct Leg {
    pub task: TaskId,
    pub stream: StreamId,
}

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
        // A cancellation wins over what was still open and over an end that
        // came after it (an upstream may answer a call it was told to stop:
        // the task was cancelled, and said so), never over an end before it.
        let ended_after = meta.finished_ms.is_some_and(|end| end >= at);
        if !status.is_terminal() || ended_after {
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

/// Whether a record names the principal and route a request comes from.
pub fn belongs(record: &TaskRecord, route: &str, principal: &str) -> bool {
    // A 2025-11-25 task belongs to its session, never to a modern request.
    record.route == route && record.principal == principal && record.session.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{SessionId, StreamId};
    use crate::jsonrpc::RequestId;
    use crate::store::commit::SyncMode;
    use crate::store::journal::Journal;
    use crate::store::{StreamKind, StreamMeta};
    use bytes::Bytes;

    async fn log() -> (tempfile::TempDir, std::sync::Arc<Log>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Journal::open(dir.path(), SyncMode::Never).unwrap();
        (dir, Log::new(store))
    }

    /// A task whose one leg is open, live.
    async fn running(log: &Log) -> (TaskId, StreamId) {
        let (id, leg) = (TaskId::random(), StreamId::random());
        let mut record = crate::store::contract::task(id, now_ms(), 60_000);
        record.legs = vec![leg];
        log.store().put_task(&record).await.unwrap();
        let mut meta = StreamMeta::new(
            leg,
            SessionId::TASKS,
            StreamKind::Request,
            vec![RequestId("1".into())],
            Some("tools/call".into()),
            now_ms(),
        );
        meta.task = Some(id);
        log.open(meta).await.unwrap();
        (id, leg)
    }

    const ANSWER: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;

    #[tokio::test]
    async fn an_answer_that_came_after_the_cancellation_leaves_the_task_cancelled() {
        let (_dir, log) = log().await;
        let (id, leg) = running(&log).await;
        cancel(&log, id).await.unwrap();
        // The upstream answered the call it was told to stop.
        let _ = log
            .append_final(
                leg,
                &[Bytes::from_static(ANSWER)],
                StreamStatus::Completed,
                None,
            )
            .await;
        let seen = read(&log, id).await.unwrap().unwrap();
        assert_eq!(seen.status, TaskStatus::Cancelled);
    }

    #[tokio::test]
    async fn an_end_before_the_cancellation_stands() {
        let (_dir, log) = log().await;
        let (id, leg) = running(&log).await;
        log.append_final(
            leg,
            &[Bytes::from_static(ANSWER)],
            StreamStatus::Completed,
            None,
        )
        .await
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        change(&log, id, |r| {
            r.cancelled_ms = Some(now_ms());
            true
        })
        .await
        .unwrap();
        let seen = read(&log, id).await.unwrap().unwrap();
        assert_eq!(seen.status, TaskStatus::Completed);
    }
}
