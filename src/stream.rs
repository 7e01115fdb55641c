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

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::watch;

use crate::id::{Seq, StreamId, TaskId};
use crate::jsonrpc::{self, RequestId};
use crate::metrics::{LiveStreams, Metrics};
use crate::store::{
    now_ms, Change, Entry, Finish, Outcome, ReaderLease, Result, SharedStore, StoreError,
    StreamMeta, StreamStatus,
};

/// How many entries a reader takes from the store at once.
const READ_BATCH: usize = 256;

/// The log as the rest of the proxy sees it.
pub struct Log {
    store: SharedStore,
    /// Reader generation per stream with an attached exclusive reader;
    /// bumping it retires the previous reader.
    readers: DashMap<StreamId, watch::Sender<u64>>,
    metrics: Metrics,
    /// For the `streams_live` gauge.
    live: LiveStreams,
    /// When an answer last ran to a finished stream's end: a write, not
    /// proof the client read it (see [`Log::written_to_end`]).
    written: DashMap<StreamId, u64>,
    /// Endings the store refused when they happened (it was away): written
    /// again by [`Log::settle`] until they land, so that no stream stays
    /// live, silent, for want of them.
    owed: DashMap<StreamId, Owed>,
}

/// An ending still to be written.
enum Owed {
    /// Error entries for the requests the log holds no answer to.
    Fail(Box<StreamMeta>, String),
    /// A status change.
    Finish(StreamStatus),
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
            readers: DashMap::new(),
            metrics,
            live: LiveStreams::default(),
            written: DashMap::new(),
            owed: DashMap::new(),
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

    /// Whether the store says `stream` left `Live` (or is gone), as far as
    /// this process knows without asking (the gauge's bookkeeping runs
    /// under a lock: a stream a shared log knows nothing of here counts as
    /// live until this process ends or deletes it).
    fn finished(&self, stream: StreamId) -> bool {
        self.store.peek(stream).is_some_and(|w| w.finished)
    }

    /// Creates a stream from its (new, live) metadata.
    pub async fn open(&self, meta: StreamMeta) -> Result<StreamMeta> {
        self.store.create_stream(&meta).await?;
        if meta.status.is_live() {
            self.live.opened(meta.id, |id| self.finished(id));
        }
        Ok(meta)
    }

    pub async fn append(&self, stream: StreamId, messages: &[Bytes]) -> Result<Seq> {
        let last = self.store.append(stream, messages).await?;
        self.metrics.appended(messages);
        Ok(last)
    }

    /// Appends messages read from an upstream SSE stream with the
    /// upstream's event id they ended at (see [`crate::store::UpstreamMark`]).
    pub async fn append_upstream(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        event_id: &str,
    ) -> Result<Seq> {
        let last = self
            .store
            .append_upstream(stream, messages, event_id)
            .await?;
        self.metrics.appended(messages);
        Ok(last)
    }

    /// Appends a stream's last messages and finishes it, durable together.
    pub async fn append_final(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        status: StreamStatus,
        outcome: Option<Outcome>,
    ) -> Result<Seq> {
        let last = self
            .store
            .append_final(stream, messages, Finish::new(status, outcome))
            .await?;
        self.metrics.appended(messages);
        self.left_live(stream, status);
        Ok(last)
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
    pub fn resume_point(&self, stream: &StreamMeta, keep_last: bool) -> Seq {
        let end = self.end(stream.id);
        if keep_last && !stream.status.is_live() && stream.acked >= end {
            end.saturating_sub(1)
        } else {
            stream.acked.min(end)
        }
    }

    /// The durable end of the stream right now: where a reader that wants
    /// only new entries starts.
    pub fn end(&self, stream: StreamId) -> Seq {
        self.store.subscribe(stream).borrow().seq
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
        if let Some((_, generation)) = self.readers.remove(&stream) {
            generation.send_modify(|g| *g += 1);
        }
    }

    /// Whether a client is reading the stream right now.
    pub fn is_read(&self, stream: StreamId) -> bool {
        self.readers.contains_key(&stream)
    }

    /// Attaches a reader that yields every entry after `after`, taking the
    /// stream over from any earlier exclusive reader.
    pub fn attach(self: &Arc<Self>, stream: StreamId, after: Seq) -> Reader {
        let (generation, mine) = {
            let sender = self
                .readers
                .entry(stream)
                .or_insert_with(|| watch::Sender::new(0));
            sender.send_modify(|g| *g += 1);
            let rx = sender.subscribe();
            let mine = *rx.borrow();
            (rx, mine)
        };
        Reader {
            log: self.clone(),
            stream,
            cursor: after,
            exclusive: Some((generation, mine)),
            lease: None,
            // Whoever attaches has just opened, resumed or polled the stream.
            touched: Some(tokio::time::Instant::now()),
        }
    }

    /// A reader that never takes the stream over and is never replaced: for
    /// status checks and waits that must not cut a live reader.
    pub fn watch(self: &Arc<Self>, stream: StreamId, after: Seq) -> Reader {
        Reader {
            log: self.clone(),
            stream,
            cursor: after,
            exclusive: None,
            lease: None,
            touched: None,
        }
    }
}

/// What a reader found.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The next entries, in order; the cursor has moved past them.
    Entries(Vec<Entry>),
    /// Nothing arrived within the idle time (time for a keep-alive).
    Idle,
    /// Every entry was delivered and the stream is no longer live.
    End(StreamStatus),
    /// Another reader attached to the stream.
    Replaced,
    /// The stream was deleted (session ended or retention ran out).
    Gone,
}

pub struct Reader {
    log: Arc<Log>,
    stream: StreamId,
    cursor: Seq,
    /// For an exclusive reader: the generation channel and the generation
    /// it was attached as.
    exclusive: Option<(watch::Receiver<u64>, u64)>,
    /// For an exclusive reader, once it first waited: its hold on the stream
    /// against readers of other processes sharing the log.
    lease: Option<ReaderLease>,
    /// When this reader last re-armed the stream's abandonment.
    touched: Option<tokio::time::Instant>,
}

/// How often a reader on a shared log tells the other instances it still
/// reads (see `Reader::still_reading`).
const TOUCH_WHILE_READING: Duration = Duration::from_secs(10);

impl Reader {
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    pub fn cursor(&self) -> Seq {
        self.cursor
    }

    /// Notes that this reader's answer ran to the stream's end (see
    /// [`Log::wrote_to_end`]).
    pub fn wrote_to_end(&self) {
        self.log.wrote_to_end(self.stream);
    }

    fn replaced(&self) -> bool {
        let here = self
            .exclusive
            .as_ref()
            .is_some_and(|(g, mine)| g.has_changed().is_err() || *g.borrow() != *mine);
        here || self.lease.as_ref().is_some_and(ReaderLease::lost)
    }

    pub async fn next(&mut self, idle: Duration) -> Result<Next> {
        let deadline = tokio::time::Instant::now() + idle;
        if self.exclusive.is_some() && self.lease.is_none() {
            // A reader replaced before it ever read must not claim the
            // stream from a newer one elsewhere.
            if self.replaced() {
                return Ok(Next::Replaced);
            }
            self.lease = Some(self.log.store.hold_reader(self.stream).await?);
        }
        loop {
            if self.replaced() {
                return Ok(Next::Replaced);
            }
            // Subscribe before reading, so an append landing between the read
            // and the wait still wakes us.
            let mut appended = self.log.store.subscribe(self.stream);
            let mark = *appended.borrow_and_update();
            if mark.seq > self.cursor {
                if let Some(entries) = self.take(mark.coalesced).await? {
                    self.still_reading().await;
                    return Ok(Next::Entries(entries));
                }
            }
            if mark.finished {
                // A stream leaves `Live` only after its last append, so a
                // finished watermark at or below the cursor means the reader
                // has seen everything.
                return Ok(match self.log.store.stream_meta(self.stream).await? {
                    Some(meta) => Next::End(meta.status),
                    None => Next::Gone,
                });
            }
            let replaced = async {
                match self.exclusive.as_mut() {
                    Some((generation, _)) => {
                        let _ = generation.changed().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let taken = async {
                match self.lease.as_mut() {
                    Some(lease) => lease.taken().await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                changed = appended.changed() => {
                    if changed.is_err() && self.log.store.stream_meta(self.stream).await?.is_none() {
                        return Ok(Next::Gone);
                    }
                }
                _ = replaced => return Ok(Next::Replaced),
                _ = taken => return Ok(Next::Replaced),
                _ = tokio::time::sleep_until(deadline) => {
                    self.still_reading().await;
                    return Ok(Next::Idle);
                }
            }
        }
    }

    /// An exclusive reader on a log other instances share re-arms the
    /// stream's abandonment every [`TOUCH_WHILE_READING`]: their sweepers
    /// cannot see that it is read here (this process's own sweeper can,
    /// [`Log::is_read`]).
    async fn still_reading(&mut self) {
        if self.exclusive.is_none() || !self.log.store.shared() {
            return;
        }
        let now = tokio::time::Instant::now();
        if self
            .touched
            .is_some_and(|at| now - at < TOUCH_WHILE_READING)
        {
            return;
        }
        self.touched = Some(now);
        if let Err(e) = self.log.touch(self.stream).await {
            tracing::debug!(stream = %self.stream, error = %e, "cannot touch a stream being read");
        }
    }

    async fn take(&mut self, coalesced: bool) -> Result<Option<Vec<Entry>>> {
        let mut entries = self
            .log
            .store
            .read_after(self.stream, self.cursor, READ_BATCH)
            .await?;
        let Some(last) = entries.last().map(|e| e.seq) else {
            return Ok(None);
        };
        self.cursor = last;
        if coalesced {
            keep_latest_progress(&mut entries, |e| &e.message);
        }
        Ok(Some(entries))
    }
}

/// Keeps only the latest progress notification of each token among
/// `items` (what `message` reads from each); everything else stays, in
/// order. A stream past its caps coalesces progress with it twice: when a
/// batch is appended, and when a range is replayed (seqs stay where they are:
/// the gaps are skips, not holes in the log).
pub fn keep_latest_progress<T>(items: &mut Vec<T>, message: impl Fn(&T) -> &[u8]) {
    let tokens: Vec<Option<String>> = items
        .iter()
        .map(|item| jsonrpc::progress_of(message(item)))
        .collect();
    let mut seen: HashSet<&String> = HashSet::new();
    let mut keep = vec![true; items.len()];
    for (i, token) in tokens.iter().enumerate().rev() {
        if let Some(token) = token {
            keep[i] = seen.insert(token);
        }
    }
    let mut keep = keep.into_iter();
    items.retain(|_| keep.next().unwrap_or(true));
}

impl Drop for Reader {
    fn drop(&mut self) {
        // Forget the generation channel once nobody reads the stream, unless a
        // newer reader has taken it.
        if let Some((_, mine)) = &self.exclusive {
            let mine = *mine;
            self.log
                .readers
                .remove_if(&self.stream, |_, g| *g.borrow() == mine);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::SessionId;
    use crate::store::commit::SyncMode;
    use crate::store::journal::Journal;

    async fn log() -> (tempfile::TempDir, Arc<Log>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        (dir, Log::new(store))
    }

    const IDLE: Duration = Duration::from_secs(5);

    async fn opened(log: &Arc<Log>) -> StreamMeta {
        log.open(crate::store::contract::meta(SessionId::random()))
            .await
            .unwrap()
    }

    async fn drain(reader: &mut Reader) -> (Vec<Bytes>, Next) {
        let mut got = Vec::new();
        loop {
            match reader.next(IDLE).await.unwrap() {
                Next::Entries(e) => got.extend(e.into_iter().map(|e| e.message)),
                other => return (got, other),
            }
        }
    }

    #[tokio::test]
    async fn replay_from_every_cut_point_yields_exactly_the_missing_suffix() {
        let (_dir, log) = log().await;
        let meta = opened(&log).await;
        let all: Vec<Bytes> = (0..20).map(|i| Bytes::from(format!("{i}"))).collect();
        log.append(meta.id, &all).await.unwrap();
        log.finish(meta.id, StreamStatus::Completed).await.unwrap();
        for cut in 0..=all.len() {
            let mut reader = log.attach(meta.id, cut as Seq);
            let (got, end) = drain(&mut reader).await;
            assert_eq!(got, all[cut..].to_vec(), "cut at {cut}");
            assert_eq!(end, Next::End(StreamStatus::Completed));
        }
    }

    #[tokio::test]
    async fn reader_follows_live_appends_until_the_stream_finishes() {
        let (_dir, log) = log().await;
        let meta = opened(&log).await;
        let mut reader = log.attach(meta.id, 0);
        let writer = {
            let log = log.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    log.append(meta.id, &[Bytes::from(format!("{i}"))])
                        .await
                        .unwrap();
                    if i % 10 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                log.finish(meta.id, StreamStatus::Completed).await.unwrap();
            })
        };
        let (got, end) = drain(&mut reader).await;
        writer.await.unwrap();
        let want: Vec<Bytes> = (0..50).map(|i| Bytes::from(format!("{i}"))).collect();
        assert_eq!(got, want);
        assert_eq!(end, Next::End(StreamStatus::Completed));
    }

    #[tokio::test]
    async fn a_new_reader_replaces_the_old_one() {
        let (_dir, log) = log().await;
        let meta = opened(&log).await;
        let mut first = log.attach(meta.id, 0);
        let _second = log.attach(meta.id, 0);
        assert_eq!(first.next(IDLE).await.unwrap(), Next::Replaced);
    }

    #[tokio::test]
    async fn an_idle_live_stream_reports_idle() {
        let (_dir, log) = log().await;
        let meta = opened(&log).await;
        let mut reader = log.attach(meta.id, 0);
        let next = reader.next(Duration::from_millis(20)).await.unwrap();
        assert_eq!(next, Next::Idle);
    }

    #[tokio::test]
    async fn a_watcher_never_takes_a_stream_from_its_reader() {
        let (_dir, log) = log().await;
        let meta = opened(&log).await;
        let mut reader = log.attach(meta.id, 0);
        let mut watcher = log.watch(meta.id, 0);
        log.append(meta.id, &[Bytes::from_static(b"x")])
            .await
            .unwrap();
        assert!(matches!(
            watcher.next(IDLE).await.unwrap(),
            Next::Entries(_)
        ));
        assert!(matches!(reader.next(IDLE).await.unwrap(), Next::Entries(_)));
        assert!(log.is_read(meta.id));
        drop(reader);
        assert!(!log.is_read(meta.id), "a watcher is not a reader");
    }

    #[tokio::test]
    async fn a_coalesced_stream_replays_only_the_latest_progress_of_a_token() {
        let (_dir, log) = log().await;
        let meta = opened(&log).await;
        let progress = |n: u32| {
            Bytes::from(format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"t","progress":{n}}}}}"#
            ))
        };
        let result = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        log.append(
            meta.id,
            &[progress(1), progress(2), result.clone(), progress(3)],
        )
        .await
        .unwrap();
        log.store()
            .update_stream(meta.id, Change::Coalesced)
            .await
            .unwrap();
        log.finish(meta.id, StreamStatus::Completed).await.unwrap();
        let (got, _) = drain(&mut log.attach(meta.id, 0)).await;
        assert_eq!(got, vec![result, progress(3)]);
    }

    #[tokio::test]
    async fn status_words_come_from_the_outcome_and_the_acknowledged_cursor() {
        let (_dir, log) = log().await;
        let meta = opened(&log).await;
        log.append(meta.id, &[Bytes::from_static(b"a")])
            .await
            .unwrap();
        let live = log.status(meta.id).await.unwrap().unwrap();
        assert!(live.pending() && !live.failed() && !live.has_error());
        log.append_final(
            meta.id,
            &[Bytes::from_static(b"e")],
            StreamStatus::Completed,
            Some(Outcome::Error),
        )
        .await
        .unwrap();
        let done = log.status(meta.id).await.unwrap().unwrap();
        assert!(done.failed() && done.has_error());
        log.ack(meta.id, 2).await.unwrap();
        let acked = log.status(meta.id).await.unwrap().unwrap();
        assert!(acked.failed() && !acked.has_error() && !acked.pending());
    }

    #[tokio::test]
    async fn written_marks_stay_bounded_when_every_one_is_young() {
        let (_dir, log) = log().await;
        let marked: Vec<StreamId> = (0..WRITTEN_MARKS + 10)
            .map(|_| StreamId::random())
            .collect();
        for stream in &marked {
            log.wrote_to_end(*stream);
        }
        // The map was cleared once at the bound (instead of being scanned
        // on every later call); the newest marks are kept.
        assert_eq!(log.written.len(), 10);
        assert!(log.written_to_end(marked[WRITTEN_MARKS + 9]).is_some());
        assert!(
            log.written_to_end(marked[0]).is_none(),
            "a lost mark only lengthens the grace"
        );
    }

    #[tokio::test]
    async fn deleting_a_stream_ends_its_reader() {
        let (_dir, log) = log().await;
        let meta = opened(&log).await;
        let mut reader = log.attach(meta.id, 0);
        log.store().delete_stream(meta.id).await.unwrap();
        assert_eq!(reader.next(IDLE).await.unwrap(), Next::Gone);
    }
}
