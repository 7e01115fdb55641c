//! The idle-session index: two sorted sets, `P:sessions:seen` (session ids
//! by `last_seen_ms`) and `P:sessions:closed` (closed sessions by
//! `closed_ms`), kept in the same atomic step as the session record, so a
//! sweep reads only the sessions that are due instead of every session of
//! every instance.
//!
//! It owns those two keys and nothing else. The record stays the truth: a
//! sweep decides on the records it reads (`SessionRecord::idle_by`), so an
//! index entry that lags its record costs a read, never a wrong sweep.
//!
//! Sessions a version without the index wrote are not in it (a rolling
//! upgrade has both for a while): a process's first sweep, and one an hour
//! after, lists every session (what every sweep used to do) and indexes
//! them, never lowering a score a newer write set (`ZADD GT`).

use std::time::{Duration, Instant};

use redis::Pipeline;

use super::record::backend;
use super::RedisStore;
use crate::id::SessionId;
use crate::store::{Result, SessionRecord};

/// How often a sweep lists every session anyway (see the module docs).
const REINDEX_EVERY: Duration = Duration::from_secs(3600);

impl RedisStore {
    fn seen_key(&self) -> String {
        self.global_key("sessions:seen")
    }

    fn closed_key(&self) -> String {
        self.global_key("sessions:closed")
    }

    /// Adds to `pipe` what indexes `session`: as its record now says when
    /// written with it, or, when `Indexing::Backfill`, without lowering a
    /// score a newer write set or reopening a closed session.
    pub(super) fn index_session(
        &self,
        pipe: &mut Pipeline,
        session: &SessionRecord,
        how: Indexing,
    ) {
        let id = session.id.to_string();
        let seen = pipe.cmd("ZADD").arg(self.seen_key());
        if how == Indexing::Backfill {
            seen.arg("GT");
        }
        seen.arg(session.last_seen_ms).arg(&id).ignore();
        match (session.closed_ms, how) {
            (Some(at), Indexing::WithRecord) => {
                pipe.cmd("ZADD").arg(self.closed_key()).arg(at).arg(&id)
            }
            (Some(at), Indexing::Backfill) => pipe
                .cmd("ZADD")
                .arg(self.closed_key())
                .arg("NX")
                .arg(at)
                .arg(&id),
            (None, Indexing::WithRecord) => pipe.cmd("ZREM").arg(self.closed_key()).arg(&id),
            (None, Indexing::Backfill) => return,
        }
        .ignore();
    }

    /// Adds to `pipe` what takes session `id` out of the index.
    pub(super) fn unindex_session(&self, pipe: &mut Pipeline, id: SessionId) {
        for key in [self.seen_key(), self.closed_key()] {
            pipe.cmd("ZREM").arg(key).arg(id.to_string()).ignore();
        }
    }

    /// Sessions last seen at or before `seen_by_ms` or closed at or before
    /// `closed_by_ms`, decided on their records: those the index names, or
    /// every session when it is time to list them all (see the module docs).
    pub(super) async fn sessions_due(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        let mut sessions = if self.index_is_stale() {
            self.index_every_session().await?
        } else {
            self.indexed_due(seen_by_ms, closed_by_ms).await?
        };
        sessions.retain(|s| s.idle_by(seen_by_ms, closed_by_ms));
        Ok(sessions)
    }

    /// The records of the sessions the index has due: two range reads, then
    /// those records only. An entry whose record is gone (expired by its
    /// TTL, no sweeper having run in time) leaves the index.
    async fn indexed_due(&self, seen_by_ms: u64, closed_by_ms: u64) -> Result<Vec<SessionRecord>> {
        let (seen, closed): (Vec<String>, Vec<String>) = redis::pipe()
            .cmd("ZRANGEBYSCORE")
            .arg(self.seen_key())
            .arg("-inf")
            .arg(seen_by_ms)
            .cmd("ZRANGEBYSCORE")
            .arg(self.closed_key())
            .arg("-inf")
            .arg(closed_by_ms)
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let mut due: Vec<SessionId> = super::ids(seen);
        due.extend(super::ids::<SessionId>(closed));
        due.sort_unstable();
        due.dedup();
        let records = self.session_records(&due).await?;
        let mut found = Vec::with_capacity(records.len());
        let mut vanished = redis::pipe();
        for (id, record) in due.iter().zip(records) {
            match record {
                Some(record) => found.push(record),
                None => self.unindex_session(&mut vanished, *id),
            }
        }
        if found.len() < due.len() {
            vanished
                .query_async::<()>(&mut self.conn())
                .await
                .map_err(backend)?;
        }
        Ok(found)
    }

    /// Every session, listed and indexed (`Indexing::Backfill`).
    async fn index_every_session(&self) -> Result<Vec<SessionRecord>> {
        use crate::store::Store;
        let sessions = self.list_sessions().await?;
        if !sessions.is_empty() {
            let mut pipe = redis::pipe();
            for session in &sessions {
                self.index_session(&mut pipe, session, Indexing::Backfill);
            }
            pipe.query_async::<()>(&mut self.conn())
                .await
                .map_err(backend)?;
        }
        *self.indexed_at() = Some(Instant::now());
        Ok(sessions)
    }

    fn index_is_stale(&self) -> bool {
        self.indexed_at()
            .is_none_or(|at| at.elapsed() >= REINDEX_EVERY)
    }

    fn indexed_at(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.sessions_indexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// How [`RedisStore::index_session`] writes a session's entries.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Indexing {
    /// In the same step as the session record: exactly as it says.
    WithRecord,
    /// From a listing (see the module docs): never lowering a score a
    /// newer write set, never reopening a session.
    Backfill,
}
