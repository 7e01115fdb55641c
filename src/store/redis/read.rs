//! Reading streams in either layout: a stream is one value (`:stream`, see
//! `packed.rs`), or, when the previous layout wrote it and no script has
//! written to it since, a metadata hash (`:meta`) with its entries in a log
//! (`:log`). Each read asks for both in one round trip: a stream has only
//! one of them.
//!
//! It owns the reads of streams and of the session indexes that name them
//! (the requests hash, whose values are 16-byte stream ids or, from the
//! previous layout, `"<created_ms> <stream id>"`); it must not write.

use std::collections::HashMap;

use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::{Pipeline, Value};

use super::cluster::{around_id, tag};
use super::packed::{decode, Entries};
use super::record::{backend, meta_from_hash};
use super::{stream_key, RedisStore};
use crate::id::{SessionId, StreamId};
use crate::store::{Entry, Result, StoreError, StreamMeta};

/// Adds to `pipe` the two reads that find stream `id`'s metadata.
fn ask(pipe: &mut Pipeline, prefix: &str, id: StreamId) {
    pipe.cmd("GET").arg(stream_key(prefix, id, "stream"));
    pipe.cmd("HGETALL").arg(stream_key(prefix, id, "meta"));
}

/// Stream `id`'s metadata from the answers to [`ask`].
fn answer(id: StreamId, value: Value, hash: Value) -> Result<Option<StreamMeta>> {
    let value: Option<Vec<u8>> = redis::from_redis_value(value).map_err(backend)?;
    if let Some(value) = value {
        return decode(id, &value).map(|(meta, _)| Some(meta));
    }
    let hash: HashMap<String, Vec<u8>> = redis::from_redis_value(hash).map_err(backend)?;
    meta_from_hash(hash)
}

/// The reads that find the metadata of streams `ids` under `prefix`.
fn ask_all(prefix: &str, ids: &[StreamId]) -> Pipeline {
    let mut pipe = redis::pipe();
    for id in ids {
        ask(&mut pipe, prefix, *id);
    }
    pipe
}

/// The metadata of streams `ids` from the answers to [`ask_all`], in
/// order: `None` for one that does not exist, an error for one unreadable.
fn answers(ids: &[StreamId], answers: Vec<Value>) -> Vec<Result<Option<StreamMeta>>> {
    let mut answers = answers.into_iter();
    let mut metas = Vec::with_capacity(ids.len());
    for id in ids {
        let (Some(value), Some(hash)) = (answers.next(), answers.next()) else {
            break;
        };
        metas.push(answer(*id, value, hash));
    }
    metas
}

/// The metadata of streams `ids` under `prefix`, in order, in one round
/// trip on `conn` (the feed's, which shows nothing to a client).
pub(super) async fn metas_on<C: ConnectionLike>(
    conn: &mut C,
    prefix: &str,
    ids: &[StreamId],
) -> redis::RedisResult<Vec<Result<Option<StreamMeta>>>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let asked: Vec<Value> = ask_all(prefix, ids).query_async(conn).await?;
    Ok(answers(ids, asked))
}

/// The stream a requests hash value names.
pub(super) fn named(held: &[u8]) -> Option<StreamId> {
    if let Ok(raw) = <[u8; 16]>::try_from(held) {
        return Some(StreamId(raw));
    }
    let text = std::str::from_utf8(held).ok()?;
    text.rsplit(' ').next()?.parse().ok()
}

/// An entry of a stream's log.
fn logged(mut entry: redis::streams::StreamId) -> Result<Entry> {
    let id = entry.id;
    let seq = id
        .strip_prefix("0-")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| StoreError::Corrupt(format!("log entry id {id}")))?;
    let message = entry
        .map
        .remove("m")
        .and_then(|v| redis::from_redis_value::<Vec<u8>>(v).ok())
        .ok_or_else(|| StoreError::Corrupt(format!("log entry {id} has no message")))?;
    Ok(Entry {
        seq,
        message: Bytes::from(message),
    })
}

impl RedisStore {
    /// The metadata of streams `ids`, as shown (`replicas.rs`).
    async fn shown_metas(&self, ids: &[StreamId]) -> Result<Vec<Result<Option<StreamMeta>>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let asked: Vec<Value> = self.run_read(ask_all(&self.prefix, ids)).await?;
        Ok(answers(ids, asked))
    }

    /// The metadata of the streams `ids` that exist.
    pub(super) async fn metas(&self, ids: &[StreamId]) -> Result<Vec<StreamMeta>> {
        let metas = self.shown_metas(ids).await?;
        let mut found = Vec::with_capacity(metas.len());
        for meta in metas {
            found.extend(meta?);
        }
        Ok(found)
    }

    pub(super) async fn meta(&self, id: StreamId) -> Result<Option<StreamMeta>> {
        let mut metas = self.shown_metas(&[id]).await?;
        metas.pop().unwrap_or(Ok(None))
    }

    /// Entries after `after`, at most `limit`: from the stream's value
    /// while they are in it, else from its log (both asked at once; the
    /// move to the log is one-way, so either answer is whole).
    pub(super) async fn entries_after(
        &self,
        stream: StreamId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Entry>> {
        let mut range = redis::cmd("XRANGE");
        range
            .arg(self.stream_key(stream, "log"))
            .arg(format!("0-{}", after.saturating_add(1)))
            .arg("+");
        // Redis takes a signed 64-bit count; a larger one means "all".
        if let Ok(count) = i64::try_from(limit) {
            range.arg("COUNT").arg(count);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(self.stream_key(stream, "stream"))
            .add_command(range);
        let (value, logged_entries): (Option<Vec<u8>>, redis::streams::StreamRangeReply) =
            self.run_read(pipe).await?;
        if let Some(value) = value {
            if let (_, Entries::Inline(inline)) = decode(stream, &value)? {
                let first = usize::try_from(after).unwrap_or(usize::MAX);
                return Ok((first.saturating_add(1)..)
                    .zip(inline.iter().skip(first))
                    .take(limit)
                    .map(|(seq, message)| Entry {
                        seq: seq as u64,
                        message: Bytes::copy_from_slice(message),
                    })
                    .collect());
            }
        }
        logged_entries.ids.into_iter().map(logged).collect()
    }

    /// The streams of a session: those its requests hash names and those
    /// in its set (see `REQUESTS` in `scripts.rs`).
    pub(super) async fn session_streams(&self, session: SessionId) -> Result<Vec<StreamMeta>> {
        let (held, listed): (Vec<Vec<u8>>, Vec<String>) = redis::pipe()
            .cmd("HVALS")
            .arg(self.session_key(session, "requests"))
            .cmd("SMEMBERS")
            .arg(self.session_key(session, "streams"))
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let mut ids: Vec<StreamId> = held.iter().filter_map(|h| named(h)).collect();
        ids.extend(super::ids::<StreamId>(listed));
        ids.sort_unstable();
        ids.dedup();
        self.metas(&ids).await
    }

    /// Every stream, in either layout: found by scanning the key space
    /// (for `streams list`; nothing on a request's path asks).
    pub(super) async fn every_stream(&self) -> Result<Vec<StreamMeta>> {
        let mut ids = Vec::new();
        for what in ["stream", "meta"] {
            let pattern = format!("{}:{what}", tag(&glob_escaped(&self.prefix), "*"));
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut self.conn())
                    .await
                    .map_err(backend)?;
                ids.extend(keys.iter().filter_map(|k| self.id_in(k, what)));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        ids.sort_unstable();
        ids.dedup();
        self.metas(&ids).await
    }

    /// The stream whose `what` key is `key`.
    fn id_in(&self, key: &str, what: &str) -> Option<StreamId> {
        let (head, tail) = around_id(&self.prefix, what);
        key.strip_prefix(&head)?.strip_suffix(&tail)?.parse().ok()
    }
}

/// `text` with what a `SCAN MATCH` pattern reads as a wildcard escaped.
fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_value_names_its_stream_in_either_layout() {
        let id = StreamId::random();
        assert_eq!(named(id.as_bytes()), Some(id));
        assert_eq!(named(format!("1700000000000 {id}").as_bytes()), Some(id));
        assert_eq!(named(b"1700000000000 nonsense"), None);
    }

    #[test]
    fn a_prefix_matches_itself_only() {
        assert_eq!(glob_escaped("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
