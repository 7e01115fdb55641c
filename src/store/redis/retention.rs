//! The retention index: which finished streams are due for deletion when.
//! A finished stream is an entry of `P:retention`, a Redis Stream whose
//! entry ids are `<window>-<n>`, the window being the second its finish
//! falls in, with fields `s` (the stream's 16 bytes) and `d` (the finish's
//! offset in the window, in ms): some 30 bytes a stream, where a member of
//! a sorted set took some 150. The append script adds it and keeps `n` in
//! the stream's value, so that a deletion or a re-opening removes it.
//!
//! A finish that comes after one in a later window (another instance's
//! clock, a slow script) cannot join the Redis Stream, whose ids only grow:
//! it goes to `P:finished`, the sorted set by `finished_ms` the previous
//! layout kept for every stream (and still holds its streams). A query
//! reads both, so it answers exactly whichever holds a stream. (A Redis
//! older than 7.0 refuses the `<window>-*` id: there every finish goes to
//! the sorted set, as with the previous layout.)
//!
//! It owns the reading of the index; the scripts write it (`retain` and
//! `unretain` in `scripts.rs`).

use super::record::backend;
use super::scripts::RETENTION_WINDOW;
use super::RedisStore;
use crate::id::StreamId;
use crate::store::Result;

/// One entry of the retention stream.
struct Retained {
    entry: String,
    stream: StreamId,
    finished_ms: u64,
}

/// An entry of the retention stream, read; `None` for one that is not
/// whole (never written so: it is skipped).
fn retained(mut entry: redis::streams::StreamId) -> Option<Retained> {
    let window: u64 = entry.id.split_once('-')?.0.parse().ok()?;
    let raw: Vec<u8> = redis::from_redis_value(entry.map.remove("s")?).ok()?;
    let offset: u64 = redis::from_redis_value(entry.map.remove("d")?).ok()?;
    Some(Retained {
        entry: entry.id,
        stream: StreamId(raw.try_into().ok()?),
        finished_ms: window.saturating_add(offset),
    })
}

impl RedisStore {
    /// Finished streams that finished at or before `at_ms`: the retention
    /// stream's entries up to `at_ms`'s window (those of that window
    /// filtered by their offset) and the sorted set's, in one round trip.
    /// An entry whose stream is gone (its keys expired by their TTL before
    /// a sweeper came) is removed instead of handed out.
    pub(super) async fn finished_due(&self, at_ms: u64) -> Result<Vec<StreamId>> {
        let window = at_ms - at_ms % RETENTION_WINDOW;
        let (range, sorted): (redis::streams::StreamRangeReply, Vec<String>) = redis::pipe()
            .cmd("XRANGE")
            .arg(self.global_key("retention"))
            .arg("-")
            .arg(window)
            .cmd("ZRANGEBYSCORE")
            .arg(self.global_key("finished"))
            .arg("-inf")
            .arg(at_ms)
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let due: Vec<Retained> = range
            .ids
            .into_iter()
            .filter_map(retained)
            .filter(|r| r.finished_ms <= at_ms)
            .collect();
        let mut streams = self.still_there(due).await?;
        streams.extend(super::ids::<StreamId>(sorted));
        // Oldest first, once each (a stream is in one index at a time).
        let mut seen = std::collections::HashSet::new();
        streams.retain(|s| seen.insert(*s));
        Ok(streams)
    }

    /// The streams of `due` that exist; the entries of those that do not
    /// leave the index.
    async fn still_there(&self, due: Vec<Retained>) -> Result<Vec<StreamId>> {
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for r in &due {
            pipe.cmd("EXISTS").arg(self.stream_key(r.stream, "stream"));
        }
        let exists: Vec<bool> = pipe.query_async(&mut self.conn()).await.map_err(backend)?;
        let (there, gone): (Vec<_>, Vec<_>) = due.into_iter().zip(exists).partition(|(_, e)| *e);
        if !gone.is_empty() {
            redis::cmd("XDEL")
                .arg(self.global_key("retention"))
                .arg(
                    gone.iter()
                        .map(|(r, _)| r.entry.as_str())
                        .collect::<Vec<_>>(),
                )
                .query_async::<()>(&mut self.conn())
                .await
                .map_err(backend)?;
        }
        Ok(there.into_iter().map(|(r, _)| r.stream).collect())
    }
}
