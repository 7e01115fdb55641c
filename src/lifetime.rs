//! Lifetimes of what the log holds: recovery of streams orphaned by a crash,
//! abandonment of streams a dialect announced and nobody came back for,
//! retention of finished streams, expiry of idle sessions and of sessions
//! never used since their `initialize`, and expiry of tasks, whose legs go with them (retention never deletes a task leg: a
//! task answers from its legs for as long as it lives).
//!
//! Recovery runs once before the proxy serves: a stream still `live` in the
//! log lost its relay with the previous process. A [`Resumer`] takes it over
//! when its upstream can be resumed from the last event logged; otherwise its
//! unanswered requests get a JSON-RPC error entry (a client must never wait
//! on silence) and the stream is finished. Which streams are orphans is the
//! store's call ([`crate::store::Store::orphans`]): with a log shared by
//! several instances, only those of instances whose lease ran out, and
//! recovery then runs again every so often while the proxy serves
//! ([`spawn_takeover`]), so another instance's death is noticed. The sweeper
//! runs forever in the background and finds what is due through the store's
//! deadline queries, never by reading every stream.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::StoreConfig;
use crate::id::TaskId;
use crate::metrics::SessionExpiry;
use crate::session::Sessions;
use crate::store::{now_ms, Result, StreamKind, StreamMeta, StreamStatus};
use crate::stream::Log;

const RESTARTED: &str =
    "the proxy restarted while the upstream was answering this request; its outcome is unknown";

/// Why the proxy cancels an abandoned request upstream.
pub const ABANDONED: &str = "abandoned: the client neither resumed nor polled it in time";

/// Who stops an upstream request the proxy gives up on.
#[async_trait::async_trait]
pub trait Canceller: Send + Sync {
    async fn cancel(&self, stream: &StreamMeta, why: &str);

    /// Tells the upstream that a session the proxy ended on its own (idle
    /// or unused) is over, as the client's DELETE would have: otherwise the
    /// upstream keeps it until its own expiry. Best effort.
    async fn end_session(&self, _session: &crate::store::SessionRecord) {}
}

/// How long the sweep waits for an upstream to take a session's end.
const END_SESSION_WAIT: Duration = Duration::from_secs(5);

/// Tells the upstream a session ended here, unless it ended there first.
async fn tell_upstream(canceller: &dyn Canceller, session: &crate::store::SessionRecord) {
    if session.closed_ms.is_none()
        && tokio::time::timeout(END_SESSION_WAIT, canceller.end_session(session))
            .await
            .is_err()
    {
        tracing::info!(session = %session.id, "upstream slow to take a session's end");
    }
}

/// Who can carry on a stream a previous process was relaying.
#[async_trait::async_trait]
pub trait Resumer: Send + Sync {
    /// Takes the stream over (its relay ends it later); `false` when it
    /// cannot be resumed here.
    async fn resume(&self, stream: &StreamMeta) -> bool;
}

/// What recovery did with the streams a previous process left live.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Handed to a relay that re-attached to the upstream.
    pub resumed: usize,
    /// Finished from the log alone (answered, or failed with an error entry).
    pub finished: usize,
}

/// Resumes or finishes every stream whose writer is gone (a previous
/// process, or a dead instance sharing the log).
pub async fn recover(log: &Log, resumer: &dyn Resumer) -> Result<Recovered> {
    let mut recovered = Recovered::default();
    for meta in log.store().orphans().await? {
        // The stream is this process's now: whatever goes wrong with one,
        // it must still end (an ending the log refuses is owed, see
        // `Log::settle`), and the others must still be seen to.
        match adopt(log, resumer, &meta).await {
            Ok(true) => recovered.resumed += 1,
            Ok(false) => recovered.finished += 1,
            Err(e) => {
                tracing::error!(stream = %meta.id, error = %e, "cannot recover a stream; failing it");
                let _ = log.fail_unanswered(&meta, RESTARTED).await;
                recovered.finished += 1;
            }
        }
    }
    Ok(recovered)
}

/// Resumes one orphan (`true`) or finishes it from the log alone.
async fn adopt(log: &Log, resumer: &dyn Resumer, meta: &StreamMeta) -> Result<bool> {
    match meta.kind {
        StreamKind::Standalone => log.finish(meta.id, StreamStatus::Completed).await?,
        StreamKind::Request => {
            let answered = log.answered(meta.id).await?;
            if meta.origin_ids.iter().all(|id| answered.contains(id)) {
                log.finish(meta.id, StreamStatus::Completed).await?;
            } else if resumer.resume(meta).await {
                tracing::info!(stream = %meta.id, "resuming upstream stream left live by a previous run");
                return Ok(true);
            } else {
                log.fail_unanswered(meta, RESTARTED).await?;
            }
        }
    }
    tracing::info!(stream = %meta.id, "finished stream left live by a previous run");
    Ok(false)
}

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub abandoned: usize,
    pub expired_streams: usize,
    pub expired_sessions: usize,
    /// Sessions ended for making no request since `initialize`.
    pub unused_sessions: usize,
    pub expired_tasks: usize,
}

/// Abandons streams past their deadline, deletes finished streams past
/// retention, sessions idle or unused too long and tasks past their expiry.
pub async fn sweep(
    log: &Log,
    sessions: &Sessions,
    config: &StoreConfig,
    canceller: &dyn Canceller,
) -> Result<Swept> {
    let now = now_ms();
    let mut swept = Swept::default();
    for stream in log.store().abandoned_by(now).await? {
        if abandon(log, stream, canceller).await? {
            swept.abandoned += 1;
        }
    }
    let retention = config.retention_secs.saturating_mul(1000);
    for stream in log
        .store()
        .finished_by(now.saturating_sub(retention))
        .await?
    {
        log.delete(stream).await?;
        swept.expired_streams += 1;
    }
    swept.expired_tasks = expire_tasks(log, now).await?;
    swept.expired_sessions = expire_idle_sessions(log, sessions, config, canceller, now).await?;
    swept.unused_sessions = expire_unused_sessions(sessions, canceller, now).await?;
    let metrics = log.metrics();
    metrics.sessions_expired(SessionExpiry::Idle, swept.expired_sessions);
    metrics.sessions_expired(SessionExpiry::Unused, swept.unused_sessions);
    Ok(swept)
}

/// Ends the sessions last seen longer than `session_idle_secs` ago, and the
/// closed ones past retention. Returns how many.
async fn expire_idle_sessions(
    log: &Log,
    sessions: &Sessions,
    config: &StoreConfig,
    canceller: &dyn Canceller,
    now: u64,
) -> Result<usize> {
    let mut ended = 0;
    let retention = config.retention_secs.saturating_mul(1000);
    let idle = config.session_idle_secs.saturating_mul(1000);
    let (seen_by, closed_by) = (now.saturating_sub(idle), now.saturating_sub(retention));
    for mut record in log.store().sessions_idle_by(seen_by, closed_by).await? {
        // The newer of what this process saw and what is stored: with a
        // shared log, another instance may have served the session since.
        if let Some(cached) = sessions.cached(record.id) {
            let seen = cached.record().last_seen_ms;
            record.last_seen_ms = record.last_seen_ms.max(seen);
        }
        if record.idle_by(seen_by, closed_by) {
            // Before the end, while this process still has its headers.
            tell_upstream(canceller, &record).await;
            sessions.end(record.id).await?;
            ended += 1;
        }
    }
    Ok(ended)
}

/// Ends the sessions that made no request for `unused_session_secs` after
/// their `initialize`, as idle ones are ended. Returns how many.
async fn expire_unused_sessions(
    sessions: &Sessions,
    canceller: &dyn Canceller,
    now: u64,
) -> Result<usize> {
    let mut ended = 0;
    for id in sessions.unused_long(now) {
        if let Some(record) = sessions.expire_unused(id).await? {
            tracing::info!(session = %id, "session ended: no request since its initialize");
            tell_upstream(canceller, &record).await;
            ended += 1;
        }
    }
    Ok(ended)
}

/// Deletes the tasks whose expiry passed, with their legs; a live leg's
/// readers learn it is gone, as with any deleted stream. Returns how many.
async fn expire_tasks(log: &Log, now: u64) -> Result<usize> {
    let expired: Vec<TaskId> = log.store().tasks_expired_by(now).await?;
    for task in &expired {
        log.delete_task(*task).await?;
        tracing::info!(%task, "task expired");
    }
    Ok(expired.len())
}

/// Abandons one stream whose deadline passed: the upstream is told to stop,
/// the stream is finished and deleted, so its handles open to nothing. A
/// stream a client is reading right now is not abandoned: its deadline
/// moves instead.
async fn abandon(
    log: &Log,
    stream: crate::id::StreamId,
    canceller: &dyn Canceller,
) -> Result<bool> {
    let Some(meta) = log.meta(stream).await? else {
        return Ok(false);
    };
    if log.is_read(stream) {
        log.touch(stream).await?;
        return Ok(false);
    }
    if meta.status.is_live() {
        log.finish(stream, StreamStatus::Cancelled).await?;
        canceller.cancel(&meta, ABANDONED).await;
    }
    log.delete(stream).await?;
    tracing::info!(%stream, "stream abandoned");
    Ok(true)
}

/// Runs [`recover`] every `every` until `stop` is cancelled, for a log other
/// instances write too: their dead's streams are taken over here.
pub fn spawn_takeover(
    log: Arc<Log>,
    resumer: Arc<dyn Resumer>,
    every: Duration,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            match recover(&log, resumer.as_ref()).await {
                Ok(taken) if taken == Recovered::default() => {}
                Ok(taken) => {
                    tracing::warn!(
                        resumed = taken.resumed,
                        finished = taken.finished,
                        "took over the streams of an instance whose lease ran out"
                    );
                    log.metrics().recovered(taken.resumed + taken.finished);
                }
                Err(e) => tracing::warn!(error = %e, "cannot look for streams to take over"),
            }
        }
    })
}

/// How often endings the store refused are tried again.
const SETTLE_EVERY: Duration = Duration::from_secs(1);

/// Runs [`sweep`] every `sweep_secs`, and writes owed endings every second
/// ([`Log::settle`]), until `stop` is cancelled.
pub fn spawn_sweeper(
    log: Arc<Log>,
    sessions: Arc<Sessions>,
    config: StoreConfig,
    canceller: Arc<dyn Canceller>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(config.sweep_secs));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut settle = tokio::time::interval(SETTLE_EVERY);
        settle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = settle.tick() => {
                    log.settle().await;
                    continue;
                }
                _ = stop.cancelled() => return,
            }
            match sweep(&log, &sessions, &config, canceller.as_ref()).await {
                Ok(swept) if swept == Swept::default() => {}
                Ok(swept) => tracing::debug!(?swept, "swept"),
                Err(e) => tracing::error!(error = %e, "sweep failed"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::SessionId;
    use crate::store::commit::SyncMode;
    use crate::store::contract::{leg, meta, task};
    use crate::store::journal::Journal;
    use crate::store::{Finish, SharedStore};

    struct NoUpstream;

    #[async_trait::async_trait]
    impl Canceller for NoUpstream {
        async fn cancel(&self, _stream: &StreamMeta, _why: &str) {}
    }

    /// A sweep over a fresh journal, with retention over as soon as a
    /// stream finished.
    async fn sweep_now(store: &SharedStore) -> Swept {
        let log = Log::new(store.clone());
        let sessions = Sessions::new(store.clone());
        let config = StoreConfig {
            retention_secs: 0,
            ..StoreConfig::default()
        };
        sweep(&log, &sessions, &config, &NoUpstream).await.unwrap()
    }

    async fn finished(store: &SharedStore, stream: &StreamMeta) {
        store.create_stream(stream).await.unwrap();
        let end = Finish::new(StreamStatus::Completed, None);
        store.append_final(stream.id, &[], end).await.unwrap();
    }

    #[tokio::test]
    async fn a_sweep_deletes_an_expired_task_with_its_legs() {
        let dir = tempfile::tempdir().unwrap();
        let store: SharedStore = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        let mut expired = task(TaskId::random(), now_ms() - 2_000, 1_000);
        let mut alive = task(TaskId::random(), now_ms(), 60_000);
        let (done, live, kept) = (leg(expired.id), leg(expired.id), leg(alive.id));
        finished(&store, &done).await;
        store.create_stream(&live).await.unwrap();
        store.create_stream(&kept).await.unwrap();
        expired.legs = vec![done.id, live.id];
        alive.legs = vec![kept.id];
        store.put_task(&expired).await.unwrap();
        store.put_task(&alive).await.unwrap();
        let swept = sweep_now(&store).await;
        assert_eq!((swept.expired_tasks, swept.expired_streams), (1, 0));
        assert_eq!(store.get_task(expired.id).await.unwrap(), None);
        for gone in [done.id, live.id] {
            assert_eq!(store.stream_meta(gone).await.unwrap(), None);
        }
        assert_eq!(store.get_task(alive.id).await.unwrap(), Some(alive));
        assert!(store.stream_meta(kept.id).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_sweep_past_retention_keeps_the_finished_legs_of_a_living_task() {
        let dir = tempfile::tempdir().unwrap();
        let store: SharedStore = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        let mut alive = task(TaskId::random(), now_ms(), 60_000);
        let (answered, plain) = (leg(alive.id), meta(SessionId::random()));
        finished(&store, &answered).await;
        finished(&store, &plain).await;
        alive.legs = vec![answered.id];
        store.put_task(&alive).await.unwrap();
        let swept = sweep_now(&store).await;
        assert_eq!((swept.expired_streams, swept.expired_tasks), (1, 0));
        assert_eq!(store.stream_meta(plain.id).await.unwrap(), None);
        assert!(store.stream_meta(answered.id).await.unwrap().is_some());
    }
}
