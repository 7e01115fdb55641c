//! The writes: each is one script (`scripts.rs`), whose keys and arguments
//! are made here from what the store was asked, and whose answer moves the
//! watermark of this instance's readers — creating a stream (and checking
//! for a call's prior), appending to it and finishing it, deleting it, and
//! writing a task record. All but the deletion are run by `replicas.rs`,
//! which waits for the replicas when `min_replicas` asks it to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::follow::Tail;
use super::record::{backend, encode};
use super::{cluster, packed, replicas, sentinel, ttl, RedisStore};
use crate::id::{Seq, StreamId};
use crate::store::{now_ms, Along, Finish, Prior, Result, StoreError, StreamMeta, TaskRecord};

/// What an append that went unanswered had sent.
struct Sent {
    /// The entry count before it, as this instance's writes left it.
    before: Option<Seq>,
    count: Seq,
    finish: Option<Finish>,
}

/// An optional number as a script argument: `''` for none.
fn optional(value: Option<u64>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

impl RedisStore {
    /// Creates a stream in one script, checking first (`prior`) for the
    /// call's prior, in which case nothing is created.
    pub(super) async fn create(
        &self,
        meta: &StreamMeta,
        opening: &[Bytes],
        prior: bool,
    ) -> Result<Option<Prior>> {
        let invocation = self.create_invocation(meta, opening, prior);
        let (found, stream): (i64, String) = self.run_write(&invocation).await?;
        match found {
            0 => {}
            1 => {
                let stream = stream
                    .parse()
                    .map_err(|()| backend(format!("the create script named {stream:?}")))?;
                return Ok(Some(Prior::Same(stream)));
            }
            _ => return Ok(Some(Prior::Other)),
        }
        // Its creator knows the new stream's watermark exactly: the reader
        // that attaches next needs no round trip to learn it.
        let mut watermark = meta.watermark();
        watermark.seq = opening.len() as Seq;
        self.follow
            .tails
            .entry(meta.id)
            .or_insert_with(|| Arc::new(Tail::created(watermark)));
        Ok(None)
    }

    /// The create script's keys and arguments for `meta` (see `CREATE` in
    /// `scripts.rs`).
    fn create_invocation(
        &self,
        meta: &StreamMeta,
        opening: &[Bytes],
        prior: bool,
    ) -> redis::ScriptInvocation<'_> {
        let owner = meta.status.is_live().then_some(self.instance.as_str());
        let mut invocation = self.scripts.create.prepare_invoke();
        invocation
            .key(self.stream_key(meta.id, "stream"))
            .key(self.session_key(meta.session, "streams"))
            .key(self.global_key("abandon"))
            .key(self.global_key("finished"))
            .key(self.session_key(meta.session, "requests"))
            .key(self.owned_key(&self.instance))
            .key(self.global_key("instances"))
            .key(self.stream_key(meta.id, "log"))
            .key(self.global_key("retention"));
        if let Some(task) = meta.task {
            invocation.key(self.task_key(task));
        }
        let digest = meta.params_digest.as_deref();
        invocation
            .arg(meta.id.to_string())
            .arg(meta.id.as_bytes())
            .arg(meta.created_ms)
            .arg(optional(meta.abandon_at_ms))
            .arg(optional(meta.finished_ms))
            .arg(&self.instance)
            .arg(self.lease.as_millis() as u64)
            .arg(if prior { "1" } else { "0" })
            .arg(digest.map(packed::digest).unwrap_or_default())
            .arg(digest.unwrap_or_default())
            .arg(&self.prefix)
            .arg(packed::encode(meta, owner, opening))
            .arg(if packed::fits_inline(opening) {
                "0"
            } else {
                "1"
            })
            .arg(opening.len());
        for message in opening {
            invocation.arg(message.as_ref());
        }
        for id in &meta.origin_ids {
            invocation.arg(id.as_json());
        }
        invocation
    }

    /// Runs the append script (entries, counts, mark and status in one
    /// atomic step), then moves the watermark of this instance's readers.
    pub(super) async fn append_inner(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        along: Along<'_>,
    ) -> Result<Seq> {
        let finish = along.end;
        let invocation = self.append_invocation(stream, messages, along, self.append_token());
        let before = self.follow.tails.get(&stream).and_then(|t| t.written());
        let answer = match self.run_write::<i64>(&invocation).await {
            Err(StoreError::Backend(why)) if sentinel::unanswered_message(&why) => {
                let sent = Sent {
                    before,
                    count: messages.len() as Seq,
                    finish,
                };
                self.settle_unanswered(stream, &invocation, sent, why)
                    .await?
            }
            answered => answered?,
        };
        let seq = match answer {
            -2 => {
                self.written_elsewhere(stream).await;
                return Err(StoreError::NotOwner(stream));
            }
            -3 => return Err(StoreError::OverCaps(stream)),
            seq => Seq::try_from(seq).map_err(|_| {
                // Deleted by another instance: its line went to a shard
                // this one may not read (it writes the stream itself).
                self.follow.gone(stream);
                StoreError::NoSuchStream(stream)
            })?,
        };
        // Redis answered: the write is as durable as this backend makes it.
        // A stream with no tail here has no reader here to wake; a tail made
        // later reads this write from Redis.
        if let Some(tail) = self.follow.tails.get(&stream) {
            tail.wrote(seq);
            tail.watermark.send_modify(|w| {
                w.seq = w.seq.max(seq);
                if let Some(end) = finish {
                    w.finished = !end.status.is_live();
                }
            });
        }
        Ok(seq)
    }

    /// The append script's invocation: `token` names this append on a
    /// cluster (`''` elsewhere), see [`RedisStore::append_token`].
    pub(super) fn append_invocation(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        along: Along<'_>,
        token: String,
    ) -> redis::ScriptInvocation<'_> {
        let (finish, upstream) = (along.end, along.upstream_event);
        let mut invocation = self.scripts.append.prepare_invoke();
        invocation
            .key(self.stream_key(stream, "stream"))
            .key(self.stream_key(stream, "meta"))
            .key(self.stream_key(stream, "log"))
            .key(self.global_key("finished"))
            .key(self.feed_of(stream))
            .key(self.global_key("retention"))
            .arg(stream.to_string())
            .arg(stream.as_bytes())
            .arg(if upstream.is_some() { "1" } else { "0" })
            .arg(upstream.unwrap_or(""));
        match &finish {
            Some(end) => {
                let live = end.status.is_live();
                invocation
                    .arg(packed::status_arg(end.status))
                    .arg(optional((!live).then_some(end.at_ms)))
                    .arg(optional(end.outcome.map(packed::outcome_code)));
            }
            None => {
                invocation.arg("").arg("").arg("");
            }
        }
        invocation
            .arg(&self.instance)
            .arg(&self.prefix)
            .arg(self.expire_after.finished_stream.as_millis() as u64);
        match along.caps {
            Some(caps) => invocation.arg(caps.entries).arg(caps.bytes),
            None => invocation.arg("").arg(""),
        };
        invocation.arg(token);
        for message in messages {
            invocation.arg(message.as_ref());
        }
        invocation
    }

    /// A name for one append, on a cluster: the cluster client sends a
    /// command again by itself when the connection it went on broke, and
    /// the old primary may have run it (and its replica received it)
    /// before it went away; the script applies an append whose name the
    /// stream holds already only once. Elsewhere none (`''`): `sentinel.rs`
    /// sends nothing again that may have run, and `settle_unanswered`
    /// settles an append.
    fn append_token(&self) -> String {
        static APPENDS: AtomicU64 = AtomicU64::new(0);
        if !cluster::is_one_slot(&self.prefix) {
            return String::new();
        }
        let n = APPENDS.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.instance)
    }

    /// Settles an append the primary went away without answering (a
    /// failover; `sentinel.rs` already follows the new primary): the new
    /// primary holds it whole or not at all (one script), which its entry
    /// count tells, against the count this instance's last answered write
    /// left. Written again when it is not there; an error saying so when
    /// that count is not known here or the log moved otherwise.
    async fn settle_unanswered(
        &self,
        stream: StreamId,
        invocation: &redis::ScriptInvocation<'_>,
        sent: Sent,
        why: String,
    ) -> Result<i64> {
        let Some(before) = sent.before else {
            return Err(StoreError::Backend(format!(
                "{why}: this instance does not know where the stream stood, so the write is \
                 not sent again; it may or may not be in the log"
            )));
        };
        let meta = self
            .meta(stream)
            .await?
            .ok_or(StoreError::NoSuchStream(stream))?;
        let ended = sent.finish.is_some_and(|end| meta.status == end.status);
        let landed = match sent.count {
            0 => ended,
            count => meta.entries == before + count,
        };
        if landed {
            tracing::warn!(%stream, entries = meta.entries, "an append the old primary did not answer is on the new one");
            return i64::try_from(meta.entries).map_err(|_| StoreError::NoSuchStream(stream));
        }
        if meta.entries != before {
            return Err(StoreError::Backend(format!(
                "{why}: the log holds {} entries where this instance wrote {before}, so the \
                 write is not sent again",
                meta.entries
            )));
        }
        tracing::warn!(%stream, "an append the old primary did not answer is not on the new one: sent again");
        self.run_write(invocation).await
    }

    /// Runs the task script: writes `task`, over a stored record of version
    /// `expected` only, if one is named. Returns whether it wrote.
    pub(super) async fn write_task(
        &self,
        task: &TaskRecord,
        expected: Option<u64>,
    ) -> Result<bool> {
        let ttl = ttl::task(task.expires_ms(), now_ms());
        let mut invocation = self.scripts.task.prepare_invoke();
        invocation
            .key(self.task_key(task.id))
            .key(self.global_key("tasks"))
            .arg(task.id.to_string())
            .arg(expected.map(|v| v.to_string()).unwrap_or_default())
            .arg(task.version.to_string())
            .arg(encode(task)?)
            .arg(task.expires_ms())
            .arg(ttl.as_millis() as u64)
            .arg(&self.prefix);
        for leg in &task.legs {
            invocation.arg(leg.to_string());
        }
        let wrote: i64 = self.run_write(&invocation).await?;
        Ok(wrote == 1)
    }

    pub(super) async fn delete_meta(&self, meta: &StreamMeta) -> Result<()> {
        let mut invocation = self.scripts.delete.prepare_invoke();
        invocation
            .key(self.stream_key(meta.id, "stream"))
            .key(self.stream_key(meta.id, "meta"))
            .key(self.stream_key(meta.id, "log"))
            .key(self.session_key(meta.session, "streams"))
            .key(self.global_key("streams"))
            .key(self.global_key("abandon"))
            .key(self.global_key("finished"))
            .key(self.session_key(meta.session, "requests"))
            .key(self.feed_of(meta.id))
            .key(self.global_key("retention"))
            .arg(meta.id.to_string())
            .arg(meta.id.as_bytes())
            .arg(&self.instance)
            .arg(&self.prefix);
        for id in &meta.origin_ids {
            invocation.arg(id.as_json());
        }
        replicas::invoke::<i64>(&invocation, &mut self.conn()).await?;
        self.follow.gone(meta.id);
        Ok(())
    }
}
