//! Streams over the log: opening them, appending to them, finishing them,
//! their status, and reading them — replay after a cursor, then follow live —
//! with exactly-once, in-order delivery to whichever reader is attached.
//!
//! Every dialect reads through [`Reader`]; none of them touches the store's
//! entries directly. A stream has at most one *exclusive* reader at a time:
//! the spec forbids sending one message on two connections, and a client that
//! comes back usually does so because its previous connection is half-dead.
//! So a new exclusive reader takes the stream over and the old one ends
//! ([`Next::Replaced`]). Status checks and waits that deliver nothing use a
//! *watching* reader, which never takes a stream over.
//!
//! The acknowledged cursor, touch times and the status words every dialect
//! maps from live here too ([`Status`]); which words a dialect says is the
//! dialect's business, not this module's.
//!
//! The log also carries the process's [`Metrics`]: every path that needs to
//! count something already holds the log, and appends are counted here,
//! where every append passes.
//!
//! `reader.rs` holds the [`Reader`]; `handover.rs` what an append of this
//! process leaves for the stream's reader here, so that an answer is not
//! read back from the store right after it was written.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

mod handover;
mod reader;

use handover::Handed;
use reader::Exclusive;
pub use reader::{keep_latest_progress, Next, Reader};

use crate::id::{IdDashMap, Seq, StreamId, TaskId};
use crate::jsonrpc::{self, RequestId};
use crate::metrics::{LiveStreams, Metrics};
use crate::store::{
    now_ms, Along, Change, Finish, Outcome, Prior, Result, SharedStore, StoreError, StreamMeta,
    StreamStatus,
};

/// The log as the rest of the proxy sees it.
pub struct Log {
    store: SharedStore,
    /// The attachment of each stream with an exclusive reader.
    readers: IdDashMap<StreamId, Attachment>,
    metrics: Metrics,
    /// For the `streams_live` gauge.
    live: LiveStreams,
    /// When an answer last ran to a finished stream's end: a write, not
    /// proof the client read it (see [`Log::written_to_end`]).
    written: IdDashMap<StreamId, u64>,
    /// Endings the store refused when they happened (it was away): written
    /// again by [`Log::settle`] until they land, so that no stream stays
    /// live, silent, for want of them.
    owed: IdDashMap<StreamId, Owed>,
}

/// An ending still to be written.
enum Owed {
    /// Error entries for the requests the log holds no answer to.
    Fail(Box<StreamMeta>, String),
    /// A status change.
    Finish(StreamStatus),
}

/// What a stream's exclusive reader is attached by.
struct Attachment {
    /// The reader generation: bumping it retires the previous reader.
    generation: watch::Sender<u64>,
    /// The entries this process appended last, handed to the reader.
    handed: Arc<Handed>,
}

/// How many `written` marks are kept before old ones are dropped.
const WRITTEN_MARKS: usize = 65_536;
/// How old a `written` mark may be when marks are dropped.
const WRITTEN_KEPT_MS: u64 = 3_600_000;

/// Where a stream stands, in the terms every dialect maps its words from.
/// Read from the stream's metadata alone: O(1), no entries touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub state: StreamStatus,
    pub outcome: Option<Outcome>,
    /// The stream's highest seq.
    pub entries: Seq,
    pub acked: Seq,
    pub last_request: Seq,
}

impl Status {
    pub fn of(meta: &StreamMeta) -> Self {
        Self {
            state: meta.status,
            outcome: meta.outcome,
            entries: meta.entries,
            acked: meta.acked,
            last_request: meta.last_request,
        }
    }

    /// Entries the client has not acknowledged.
    pub fn pending(&self) -> bool {
        self.entries > self.acked
    }

    /// A server-to-client request the client has not acknowledged.
    pub fn has_request(&self) -> bool {
        self.last_request > self.acked
    }

    /// The unacknowledged entries end with an error response.
    pub fn has_error(&self) -> bool {
        self.pending() && self.failed()
    }

    /// The request ended without a result: an error response, a failure,
    /// or a cancellation.
    pub fn failed(&self) -> bool {
        match self.state {
            StreamStatus::Live => false,
            StreamStatus::Completed => self.outcome == Some(Outcome::Error),
            StreamStatus::Failed | StreamStatus::Cancelled => true,
        }
    }
}

impl Log {
    /// The log over `store`, with a fresh metrics registry whose flush
    /// histogram the store's group commit reports to.
    pub fn new(store: SharedStore) -> Arc<Self> {
        let metrics = Metrics::new();
        store.observe_flushes(metrics.flush_observer());
        Arc::new(Self {
            store,
            readers: IdDashMap::default(),
            metrics,
            live: LiveStreams::default(),
            written: IdDashMap::default(),
            owed: IdDashMap::default(),
        })
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Streams this process opened that are still live (for the gauge).
    pub fn live_streams(&self) -> usize {
        self.live.count(|id| self.finished(id))
    }

    /// The streams this process opened that are still live.
    pub fn live_ids(&self) -> Vec<StreamId> {
        self.live.ids(|id| self.finished(id))
    }

    /// Whether the store says `stream` left `Live` (or is gone), as far as
    /// this process knows without asking (the gauge's bookkeeping runs
    /// under a lock: a stream a shared log knows nothing of here counts as
    /// live until this process ends or deletes it).
    fn finished(&self, stream: StreamId) -> bool {
        self.store.peek(stream).is_some_and(|w| w.finished)
    }

    /// Creates a stream from its (new, live) metadata.
    pub async fn open(&self, meta: StreamMeta) -> Result<StreamMeta> {
        self.create(&meta, &[]).await?;
        Ok(meta)
    }

    /// As [`Log::open`], for a caller that keeps the metadata, with the
    /// stream's `opening` entries written in the same step (see
    /// [`crate::store::Store::create_with`]).
    pub async fn create(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<()> {
        self.store.create_with(meta, opening).await?;
        self.opened(meta, opening);
        Ok(())
    }

    /// Opens a call's stream, with its `opening` entries, unless the call
    /// has a prior (a client re-sending it; see
    /// [`crate::store::Store::create_call`]), which it returns instead,
    /// having opened nothing.
    pub async fn open_call(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<Option<Prior>> {
        let prior = self.store.create_call(meta, opening).await?;
        if prior.is_none() {
            self.opened(meta, opening);
        }
        Ok(prior)
    }

    /// Counts a new stream live, and hands its opening entries to the
    /// reader attached already (the reader takes them once the watermark
    /// covers them, as it does entries written ahead).
    fn opened(&self, meta: &StreamMeta, opening: &[Bytes]) {
        if meta.status.is_live() {
            self.live.opened(meta.id, |id| self.finished(id));
        }
        if !opening.is_empty() {
            self.appended(meta.id, opening.len() as Seq, opening, None);
        }
    }

    pub async fn append(&self, stream: StreamId, messages: &[Bytes]) -> Result<Seq> {
        self.write(stream, messages, Along::default()).await
    }

    /// Appends with what goes along (see [`Along`]), hands the messages to
    /// the stream's reader here, and keeps the live set in step with the
    /// status it carries.
    pub async fn write(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        along: Along<'_>,
    ) -> Result<Seq> {
        let last = self.store.write(stream, messages, along).await?;
        self.appended(stream, last, messages, along.end);
        if let Some(end) = along.end {
            self.left_live(stream, end.status);
        }
        Ok(last)
    }

    /// Counts an append and hands it to the stream's reader here.
    fn appended(&self, stream: StreamId, last: Seq, messages: &[Bytes], end: Option<Finish>) {
        self.metrics.appended(messages);
        if let Some(attached) = self.readers.get(&stream) {
            attached.handed.put(last, messages, end);
        }
    }

    /// Appends a stream's last messages and finishes it, durable together.
    pub async fn append_final(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        status: StreamStatus,
        outcome: Option<Outcome>,
    ) -> Result<Seq> {
        let end = Finish::new(status, outcome);
        self.write(stream, messages, Along::ending(end)).await
    }

    /// Keeps the live set in step with a status change.
    fn left_live(&self, stream: StreamId, status: StreamStatus) {
        if !status.is_live() {
            self.live.ended(stream);
        }
    }

    /// Ends a stream as failed: one JSON-RPC error response per request in
    /// `pending` (in the client's order), so a client reading it learns its
    /// request failed instead of waiting on silence; durable with the status.
    /// When the store refuses, the failure is owed (see [`Log::settle`]).
    pub async fn fail<'a>(
        &self,
        stream: &StreamMeta,
        pending: impl IntoIterator<Item = &'a RequestId>,
        why: &str,
    ) -> Result<()> {
        let pending: HashSet<&RequestId> = pending.into_iter().collect();
        let errors: Vec<Bytes> = stream
            .origin_ids
            .iter()
            .filter(|id| pending.contains(id))
            .map(|id| {
                Bytes::from(jsonrpc::error_response(
                    Some(id),
                    jsonrpc::code::INTERNAL_ERROR,
                    why,
                ))
            })
            .collect();
        let failed = self
            .append_final(
                stream.id,
                &errors,
                StreamStatus::Failed,
                Some(Outcome::Error),
            )
            .await;
        if let Err(e) = &failed {
            self.owe(e, stream.id, || {
                Owed::Fail(Box::new(stream.clone()), why.to_owned())
            });
        }
        failed.map(|_| ())
    }

    /// Fails a stream for every request the log holds no answer to. When
    /// the store refuses, the failure is owed (see [`Log::settle`]).
    pub async fn fail_unanswered(&self, stream: &StreamMeta, why: &str) -> Result<()> {
        let failed = async {
            let answered = self.answered(stream.id).await?;
            let pending = stream
                .origin_ids
                .iter()
                .filter(|id| !answered.contains(*id));
            self.fail(stream, pending, why).await
        };
        let failed = failed.await;
        if let Err(e) = &failed {
            self.owe(e, stream.id, || {
                Owed::Fail(Box::new(stream.clone()), why.to_owned())
            });
        }
        failed
    }

    /// Remembers an ending the store refused, unless the refusal means the
    /// stream is not this process's to end any more.
    fn owe(&self, e: &StoreError, stream: StreamId, owed: impl FnOnce() -> Owed) {
        if matches!(e, StoreError::Backend(_)) {
            self.owed.insert(stream, owed());
        }
    }

    /// Writes the endings the store refused earlier; returns how many are
    /// still owed. Run every second or so: when the store is back, every
    /// stream it cut short ends with its error entry.
    pub async fn settle(&self) -> usize {
        let streams: Vec<StreamId> = self.owed.iter().map(|o| *o.key()).collect();
        for stream in streams {
            let Some((_, owed)) = self.owed.remove(&stream) else {
                continue;
            };
            let live = match self.store.stream_meta(stream).await {
                Ok(meta) => meta.is_some_and(|m| m.status.is_live()),
                Err(e @ StoreError::Backend(_)) => {
                    tracing::debug!(%stream, error = %e, "the log is still away");
                    self.owed.insert(stream, owed);
                    continue;
                }
                Err(e) => {
                    tracing::error!(%stream, error = %e, "an owed ending cannot be written");
                    continue;
                }
            };
            if !live {
                continue;
            }
            let settled = match &owed {
                Owed::Fail(meta, why) => self.fail_unanswered(meta, why).await,
                Owed::Finish(status) => self.finish(stream, *status).await,
            };
            match settled {
                Ok(()) => tracing::info!(%stream, "wrote an ending the log had refused"),
                // `fail_unanswered` and `finish` owe it again themselves.
                Err(e) => tracing::debug!(%stream, error = %e, "ending still owed"),
            }
        }
        self.owed.len()
    }

    /// The request ids the stream's logged responses answer.
    pub async fn answered(&self, stream: StreamId) -> Result<HashSet<RequestId>> {
        let mut answered = HashSet::new();
        let mut cursor = 0;
        loop {
            let entries = self.store.read_after(stream, cursor, 1024).await?;
            let Some(last) = entries.last() else {
                return Ok(answered);
            };
            cursor = last.seq;
            for entry in &entries {
                answered.extend(jsonrpc::response_ids(&entry.message));
            }
        }
    }

    /// Changes a stream's status; when the store refuses, the change is
    /// owed (see [`Log::settle`]).
    pub async fn finish(&self, stream: StreamId, status: StreamStatus) -> Result<()> {
        let set = self
            .store
            .set_status(stream, Finish::new(status, None))
            .await;
        if let Err(e) = &set {
            self.owe(e, stream, || Owed::Finish(status));
            return set;
        }
        self.left_live(stream, status);
        Ok(())
    }

    pub async fn meta(&self, stream: StreamId) -> Result<Option<StreamMeta>> {
        self.store.stream_meta(stream).await
    }

    pub async fn status(&self, stream: StreamId) -> Result<Option<Status>> {
        Ok(self.meta(stream).await?.as_ref().map(Status::of))
    }

    /// Records that the client holds every entry up to `seq`.
    pub async fn ack(&self, stream: StreamId, seq: Seq) -> Result<()> {
        self.store.update_stream(stream, Change::Ack(seq)).await
    }

    /// Records that a client asked about the stream now (re-arms
    /// abandonment).
    pub async fn touch(&self, stream: StreamId) -> Result<()> {
        self.store
            .update_stream(stream, Change::Touch { at_ms: now_ms() })
            .await
    }

    /// Where a resume of `stream` that names no position of its own (no
    /// `Last-Event-ID`) starts: after the acknowledged cursor (at-least-once:
    /// the cursor moves only on evidence). With `keep_last`,
    /// never past the final entry of a finished stream, so the resume ends
    /// with the request's response even when the client acknowledged it (a
    /// lost response can be asked for again).
    pub async fn resume_point(&self, stream: &StreamMeta, keep_last: bool) -> Seq {
        let end = self.end(stream.id).await;
        if keep_last && !stream.status.is_live() && stream.acked >= end {
            end.saturating_sub(1)
        } else {
            stream.acked.min(end)
        }
    }

    /// The durable end of the stream right now: where a reader that wants
    /// only new entries starts.
    pub async fn end(&self, stream: StreamId) -> Seq {
        self.store.subscribe(stream).await.borrow().seq
    }

    /// Notes that an answer just ran to the end of the finished `stream`.
    /// Not an acknowledgement (a connection cut after the write loses what
    /// was in flight): it only times how long a finished call's final answer
    /// stays fetchable by token. Kept in memory and bounded; a mark that is
    /// lost (restart, or dropped when old) makes the answer stay fetchable
    /// longer, never shorter.
    pub fn wrote_to_end(&self, stream: StreamId) {
        let now = crate::store::now_ms();
        if self.written.len() >= WRITTEN_MARKS {
            self.written
                .retain(|_, at| now.saturating_sub(*at) < WRITTEN_KEPT_MS);
            // All young (a busy hour): forget them all rather than scan the
            // full map again on every call from now on — losing marks is
            // safe, and the next scan is WRITTEN_MARKS calls away.
            if self.written.len() > WRITTEN_MARKS / 2 {
                self.written.clear();
            }
        }
        self.written.insert(stream, now);
    }

    /// When an answer last ran to the end of `stream`, if one did.
    pub fn written_to_end(&self, stream: StreamId) -> Option<u64> {
        self.written.get(&stream).map(|at| *at)
    }

    pub async fn delete(&self, stream: StreamId) -> Result<()> {
        self.forget(stream);
        self.store.delete_stream(stream).await
    }

    /// Deletes a task and its legs (see [`crate::store::Store::delete_task`]),
    /// forgetting what this process keeps about each leg, as
    /// [`Log::delete`] does for one stream.
    pub async fn delete_task(&self, task: TaskId) -> Result<()> {
        if let Some(record) = self.store.get_task(task).await? {
            for leg in &record.legs {
                self.forget(*leg);
            }
        }
        self.store.delete_task(task).await
    }

    /// Drops this process's bookkeeping of a stream being deleted: its
    /// written mark, its exclusive reader, its place in the live gauge.
    fn forget(&self, stream: StreamId) {
        self.written.remove(&stream);
        self.retire(stream);
        self.live.ended(stream);
    }

    /// Ends whichever exclusive reader is attached to `stream`.
    fn retire(&self, stream: StreamId) {
        if let Some((_, attached)) = self.readers.remove(&stream) {
            attached.generation.send_modify(|g| *g += 1);
        }
    }

    /// Whether a client is reading the stream right now.
    pub fn is_read(&self, stream: StreamId) -> bool {
        self.readers.contains_key(&stream)
    }

    /// Attaches a reader that yields every entry after `after`, taking the
    /// stream over from any earlier exclusive reader.
    pub fn attach(self: &Arc<Self>, stream: StreamId, after: Seq) -> Reader {
        let exclusive = {
            let attached = self.readers.entry(stream).or_insert_with(|| Attachment {
                generation: watch::Sender::new(0),
                handed: Arc::default(),
            });
            attached.generation.send_modify(|g| *g += 1);
            Exclusive::new(attached.generation.subscribe(), attached.handed.clone())
        };
        Reader::new(self.clone(), stream, after, Some(exclusive))
    }

    /// A reader that never takes the stream over and is never replaced: for
    /// status checks and waits that must not cut a live reader.
    pub fn watch(self: &Arc<Self>, stream: StreamId, after: Seq) -> Reader {
        Reader::new(self.clone(), stream, after, None)
    }
}

#[cfg(test)]
mod tests;
