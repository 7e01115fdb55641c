//! Lifetimes of what the log holds: recovery of streams orphaned by a crash,
//! retention of finished streams, and expiry of idle sessions.
//!
//! Recovery runs once before the proxy serves: a stream still `live` in the
//! log lost its relay with the previous process, so its unanswered requests
//! get a JSON-RPC error entry (a client must never wait on silence) and the
//! stream is finished. The sweeper then runs forever in the background.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::StoreConfig;
use crate::jsonrpc::{self, RequestId};
use crate::session::Sessions;
use crate::store::{now_ms, Result, StreamKind, StreamStatus};
use crate::stream::Log;

const RESTARTED: &str =
    "the proxy restarted while the upstream was answering this request; its outcome is unknown";

/// Finishes every stream a previous process left live. Returns how many.
pub async fn recover(log: &Log) -> Result<usize> {
    let mut recovered = 0;
    for meta in log.store().list_streams().await? {
        if !meta.status.is_live() {
            continue;
        }
        recovered += 1;
        let status = match meta.kind {
            StreamKind::Standalone => StreamStatus::Completed,
            StreamKind::Request => {
                let answered = answered_ids(log, &meta.id).await?;
                let pending: Vec<&RequestId> = meta
                    .origin_ids
                    .iter()
                    .filter(|id| !answered.contains(*id))
                    .collect();
                if pending.is_empty() {
                    StreamStatus::Completed
                } else {
                    log.fail(&meta, pending, RESTARTED).await?;
                    StreamStatus::Failed
                }
            }
        };
        if status != StreamStatus::Failed {
            log.finish(meta.id, status).await?;
        }
        tracing::info!(stream = %meta.id, ?status, "recovered stream left live by a previous run");
    }
    Ok(recovered)
}

async fn answered_ids(log: &Log, stream: &crate::id::StreamId) -> Result<HashSet<RequestId>> {
    let mut answered = HashSet::new();
    let mut cursor = 0;
    loop {
        let entries = log.store().read_after(*stream, cursor, 1024).await?;
        let Some(last) = entries.last() else {
            return Ok(answered);
        };
        cursor = last.seq;
        for entry in &entries {
            answered.extend(jsonrpc::response_ids(&entry.message));
        }
    }
}

/// Deletes finished streams past retention and sessions idle too long.
pub async fn sweep(log: &Log, sessions: &Sessions, config: &StoreConfig) -> Result<(usize, usize)> {
    let now = now_ms();
    let retention = config.retention_secs.saturating_mul(1000);
    let idle = config.session_idle_secs.saturating_mul(1000);
    let mut streams = 0;
    for meta in log.store().list_streams().await? {
        if meta
            .finished_ms
            .is_some_and(|at| !meta.status.is_live() && now.saturating_sub(at) >= retention)
        {
            log.delete(meta.id).await?;
            streams += 1;
        }
    }
    let mut expired = 0;
    for record in log.store().list_sessions().await? {
        let last_seen = sessions
            .cached(record.id)
            .map(|s| s.record().last_seen_ms)
            .unwrap_or(record.last_seen_ms);
        let closed_long_ago = record
            .closed_ms
            .is_some_and(|at| now.saturating_sub(at) >= retention);
        if closed_long_ago || now.saturating_sub(last_seen) >= idle {
            sessions.end(record.id).await?;
            expired += 1;
        }
    }
    Ok((streams, expired))
}

/// Runs [`sweep`] every `sweep_secs` until `stop` is cancelled.
pub fn spawn_sweeper(
    log: Arc<Log>,
    sessions: Arc<Sessions>,
    config: StoreConfig,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(config.sweep_secs));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            match sweep(&log, &sessions, &config).await {
                Ok((0, 0)) => {}
                Ok((streams, sessions)) => {
                    tracing::debug!(streams, sessions, "swept expired streams and sessions")
                }
                Err(e) => tracing::error!(error = %e, "sweep failed"),
            }
        }
    })
}
