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

use super::record::{backend, decode};
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

    /// Adds to `pipe` what indexes `session` as its record now says.
    pub(super) fn index_session(&self, pipe: &mut Pipeline, session: &SessionRecord) {
        let id = session.id.to_string();
        pipe.cmd("ZADD")
            .arg(self.seen_key())
            .arg(session.last_seen_ms)
            .arg(&id)
            .ignore();
        match session.closed_ms {
            Some(at) => pipe.cmd("ZADD").arg(self.closed_key()).arg(at).arg(&id),
            None => pipe.cmd("ZREM").arg(self.closed_key()).arg(&id),
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
    /// `closed_by_ms`: two range reads, then the records of those only.
    pub(super) async fn sessions_due(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        let indexed = *self
            .sessions_indexed
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if indexed.is_none_or(|at| at.elapsed() >= REINDEX_EVERY) {
            return self.index_every_session(seen_by_ms, closed_by_ms).await;
        }
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
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in &due {
            pipe.cmd("GET").arg(self.session_key(*id, "session"));
        }
        let raws: Vec<Option<Vec<u8>>> =
            pipe.query_async(&mut self.conn()).await.map_err(backend)?;
        let mut records = Vec::new();
        let mut vanished = redis::pipe();
        let mut any_vanished = false;
        for (id, raw) in due.into_iter().zip(raws) {
            match raw {
                Some(raw) => records.push(decode::<SessionRecord>("session", &raw)?),
                // Expired by its TTL (no sweeper ran in time): nothing to
                // sweep, and nothing to find again.
                None => {
                    self.unindex_session(&mut vanished, id);
                    any_vanished = true;
                }
            }
        }
        if any_vanished {
            vanished
                .query_async::<()>(&mut self.conn())
                .await
                .map_err(backend)?;
        }
        records.retain(|s| s.idle_by(seen_by_ms, closed_by_ms));
        Ok(records)
    }

    /// A sweep that lists every session (see the module docs): each is
    /// indexed, the due ones returned.
    async fn index_every_session(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        use crate::store::Store;
        let mut sessions = self.list_sessions().await?;
        if sessions.is_empty() {
            self.mark_indexed();
            return Ok(sessions);
        }
        let mut pipe = redis::pipe();
        for s in &sessions {
            let id = s.id.to_string();
            pipe.cmd("ZADD")
                .arg(self.seen_key())
                .arg("GT")
                .arg(s.last_seen_ms)
                .arg(&id)
                .ignore();
            if let Some(at) = s.closed_ms {
                pipe.cmd("ZADD")
                    .arg(self.closed_key())
                    .arg("NX")
                    .arg(at)
                    .arg(&id)
                    .ignore();
            }
        }
        pipe.query_async::<()>(&mut self.conn())
            .await
            .map_err(backend)?;
        self.mark_indexed();
        sessions.retain(|s| s.idle_by(seen_by_ms, closed_by_ms));
        Ok(sessions)
    }

    fn mark_indexed(&self) {
        *self
            .sessions_indexed
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
}
