//! The durable log's contract: what every backend (the journal by default,
//! sled, Redis for several instances) must offer, and the records it keeps.
//! `contract.rs` states the contract as tests every backend runs.
//!
//! The store knows sessions, tasks, streams and entries, and nothing of
//! dialects, HTTP or JSON-RPC: an entry is opaque bytes (a task record keeps
//! raw JSON text it does not read). Its one promise that everything
//! else leans on: when `append` returns, the entries are as durable as the
//! configured `sync` mode says, and only then do readers see them (the
//! subscription's watermark never runs ahead of durability). Readers therefore
//! can never be shown an entry a crash could take back.

pub mod commit;
#[cfg(test)]
pub(crate) mod contract;
pub mod journal;
pub mod redis;
pub mod sled;
pub mod task;

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::id::{Seq, SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
pub use task::{PendingInput, TaskRecord};

/// Errors are the backend's (I/O, corruption); "not found" is `Ok(None)`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage backend: {0}")]
    Backend(String),
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    #[error("stream {0} does not exist")]
    NoSuchStream(StreamId),
    /// Another process holds the log (its directory is named).
    #[error("{0} is in use by another process")]
    InUse(String),
    /// Another instance took the stream over (its owner's lease had run
    /// out): only the owner logs upstream messages to it.
    #[error("stream {0} is owned by another instance now")]
    NotOwner(StreamId),
    /// The write would take the stream past its [`Caps`]: nothing of it
    /// was written.
    #[error("stream {0} would exceed its caps")]
    OverCaps(StreamId),
    /// A flush of the log failed: it takes no more writes, and its readers
    /// stop (see `commit.rs`).
    #[error("the log stopped after a failed flush: restart the proxy")]
    Stopped,
}

pub type Result<T> = std::result::Result<T, StoreError>;

impl From<commit::Stopped> for StoreError {
    fn from(_: commit::Stopped) -> Self {
        StoreError::Stopped
    }
}

/// What a legacy session maps to upstream. Persisted so a restarted proxy
/// still routes the client's `Mcp-Session-Id` to the same upstream session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionRecord {
    pub id: SessionId,
    /// The mount path of the upstream this session belongs to.
    pub route: String,
    /// The upstream's `Mcp-Session-Id`, if it issued one.
    pub upstream_session: Option<String>,
    /// The replica (its URL as configured) that holds the upstream
    /// session, so every instance sends the session's requests there.
    /// Absent from records written before replicas, and then chosen anew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_replica: Option<String>,
    /// Negotiated protocol version, once the `initialize` result was seen.
    pub protocol_version: Option<String>,
    /// Whom the session belongs to: a verified identity, or (with
    /// `principal = "token"`) the SHA-256 of the credential that created
    /// it (hex). Handles given out in the session are sealed with it, so it
    /// never changes.
    pub principal: String,
    /// With `principal = "token"`, the digest of the credential the session
    /// answers to now, once a refreshed token was accepted by the upstream
    /// on it; unset, it answers to `principal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// With `principal = "token"`, the unverified subject the creating
    /// token named (a JWT's `iss` and `sub`, digested): a refreshed token
    /// must name the same to take the session over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_hint: Option<String>,
    /// The original `initialize` request, to re-initialize an upstream that
    /// lost the session.
    pub initialize: Option<String>,
    pub created_ms: u64,
    pub last_seen_ms: u64,
    /// Set when the upstream side ended for good; the session then answers
    /// 404 and is deleted with its streams after retention.
    #[serde(default)]
    pub closed_ms: Option<u64>,
    /// The dialects the client negotiated in `initialize` (by wire name),
    /// so a restarted proxy keeps serving them.
    #[serde(default)]
    pub dialects: Vec<String>,
    /// Set from `initialize` until the client's first request or GET
    /// stream: a session still unused after `limits.unused_session_secs`
    /// is ended early. Written only while set, and false in records from
    /// before it existed, so an upgrade ends no session early.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unused: bool,
}

impl SessionRecord {
    /// A session of `principal` on `route`, opened and last seen at
    /// `at_ms`, nothing else known yet: no upstream session, protocol,
    /// `initialize`, credential or dialects.
    pub fn new(id: SessionId, route: &str, principal: impl Into<String>, at_ms: u64) -> Self {
        Self {
            id,
            route: route.to_owned(),
            upstream_session: None,
            upstream_replica: None,
            protocol_version: None,
            principal: principal.into(),
            credential: None,
            subject_hint: None,
            initialize: None,
            created_ms: at_ms,
            last_seen_ms: at_ms,
            closed_ms: None,
            dialects: Vec::new(),
            unused: false,
        }
    }

    /// Whether it was last seen at or before `seen_by_ms`, or closed at or
    /// before `closed_by_ms`.
    pub fn idle_by(&self, seen_by_ms: u64, closed_by_ms: u64) -> bool {
        self.last_seen_ms <= seen_by_ms || self.closed_ms.is_some_and(|at| at <= closed_by_ms)
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StreamStatus {
    Live,
    Completed,
    Failed,
    Cancelled,
}

impl StreamStatus {
    pub fn is_live(self) -> bool {
        self == StreamStatus::Live
    }
}

/// How a finished request ended: with a result, or with a JSON-RPC error
/// (an `isError: true` tool result is still a result).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Result,
    Error,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    /// The answer to one client POST carrying requests.
    Request,
    /// A session's standalone GET stream.
    Standalone,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StreamMeta {
    pub id: StreamId,
    pub session: SessionId,
    pub kind: StreamKind,
    /// Ids of the client requests whose responses end this stream.
    pub origin_ids: Vec<RequestId>,
    pub method: Option<Arc<str>>,
    /// Progress tokens of those requests, so that a restarted proxy still
    /// routes their progress here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub progress: Vec<Arc<str>>,
    pub status: StreamStatus,
    pub created_ms: u64,
    /// When the stream left `Live`; retention counts from here.
    pub finished_ms: Option<u64>,
    /// Digest of the request's method and canonical params (hex), for the
    /// dialects that must recognise a re-sent call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_digest: Option<Arc<str>>,
    /// The acknowledged cursor: every entry up to here reached the client,
    /// on evidence (a `Last-Event-ID` naming it, a resume that ran to its
    /// end). Shared by every dialect; it never moves back.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub acked: Seq,
    /// When a client last asked about the stream (status, poll, resume).
    #[serde(default)]
    pub touched_ms: u64,
    /// How long the stream may go untouched before it is abandoned; set by
    /// the dialect that negotiated it, `None` for streams with retention
    /// only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandon_after_ms: Option<u64>,
    /// When the stream is abandoned unless touched before: `touched_ms +
    /// abandon_after_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandon_at_ms: Option<u64>,
    /// How the request ended, once it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// Seq of the newest server-to-client request in the stream (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub last_request: Seq,
    /// Progress was coalesced because the stream reached its caps: readers
    /// skip progress that a later entry supersedes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub coalesced: bool,
    /// How far the upstream's own SSE stream had been logged: a restarted
    /// proxy resumes the upstream from here instead of failing the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamMark>,
    /// The task this stream is a leg of: kept as long as the task, not by
    /// retention, and deleted with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// Entries in the stream (its highest seq). Kept by the store, which
    /// counts them from the entries themselves: never written with the
    /// record.
    #[serde(default, skip_serializing)]
    pub entries: Seq,
    /// Bytes of all entries' messages. Kept by the store (as `entries`).
    #[serde(default, skip_serializing)]
    pub bytes: u64,
}

impl StreamMeta {
    /// The request id of a stream that answers one request (a batch's
    /// stream has none): what a re-sent call is recognised by.
    pub fn call_id(&self) -> Option<&RequestId> {
        match self.origin_ids.as_slice() {
            [id] => Some(id),
            _ => None,
        }
    }

    /// A new live stream with nothing in it yet.
    pub fn new(
        id: StreamId,
        session: SessionId,
        kind: StreamKind,
        origin_ids: Vec<RequestId>,
        method: Option<Arc<str>>,
        now_ms: u64,
    ) -> Self {
        Self {
            id,
            session,
            kind,
            origin_ids,
            method,
            progress: Vec::new(),
            status: StreamStatus::Live,
            created_ms: now_ms,
            finished_ms: None,
            params_digest: None,
            acked: 0,
            touched_ms: now_ms,
            abandon_after_ms: None,
            abandon_at_ms: None,
            outcome: None,
            last_request: 0,
            coalesced: false,
            upstream: None,
            task: None,
            entries: 0,
            bytes: 0,
        }
    }

    /// A session's new standalone stream.
    pub fn standalone(session: SessionId) -> Self {
        Self::new(
            StreamId::random_beside(session.as_bytes()),
            session,
            StreamKind::Standalone,
            Vec::new(),
            None,
            now_ms(),
        )
    }

    /// Applies a change the way every backend must.
    pub fn apply(&mut self, change: &Change) {
        match *change {
            Change::Ack(seq) => self.acked = self.acked.max(seq),
            Change::Touch { at_ms } => {
                self.touched_ms = self.touched_ms.max(at_ms);
                self.abandon_at_ms = self
                    .abandon_after_ms
                    .map(|after| self.touched_ms.saturating_add(after));
            }
            Change::Request(seq) => self.last_request = self.last_request.max(seq),
            Change::Coalesced => self.coalesced = true,
        }
    }

    /// The metadata as readers may see it: a status change shows once it is
    /// durable, as the entries it ends do (the watermark says so), so that a
    /// reader told "finished" can always read the final entry. Backends
    /// record the change at write time and answer with this.
    pub fn as_of(mut self, durable: &Watermark) -> Self {
        if !self.status.is_live() && !durable.finished {
            self.status = StreamStatus::Live;
            self.finished_ms = None;
            self.outcome = None;
        }
        self
    }

    /// How far the stream is, as its metadata says (`entries` as counted by
    /// the store).
    pub fn watermark(&self) -> Watermark {
        Watermark {
            seq: self.entries,
            finished: !self.status.is_live(),
            coalesced: self.coalesced,
        }
    }

    /// Records a status change (and the outcome it carries).
    pub fn finish(&mut self, end: &Finish) {
        self.status = end.status;
        self.finished_ms = (!end.status.is_live()).then_some(end.at_ms);
        if end.outcome.is_some() {
            self.outcome = end.outcome;
        }
    }
}

/// The upstream's SSE event id of the last event whose messages were logged,
/// and the seq of the stream's last entry when it was recorded. Written with
/// the entries it covers (same write, same durability wait). Only a crash
/// inside that one write can leave entries newer than the mark; the seq says
/// which, so the resuming side can recognise their replay.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct UpstreamMark {
    pub event_id: String,
    pub seq: Seq,
}

/// What a write carries along with its messages, in the same write and
/// durability wait.
#[derive(Clone, Copy, Debug, Default)]
pub struct Along<'a> {
    /// The upstream's SSE event id the messages ended at (the
    /// [`UpstreamMark`] is recorded at the last message's seq).
    pub upstream_event: Option<&'a str>,
    /// The stream leaves (or re-enters) `Live`.
    pub end: Option<Finish>,
    /// Refuse the write whole ([`StoreError::OverCaps`]) if it would take
    /// the stream past these: checked in the same atomic step as the
    /// write, so a shared log needs no read before it.
    pub caps: Option<Caps>,
}

impl<'a> Along<'a> {
    /// Carrying the upstream's event id the messages ended at (the
    /// [`UpstreamMark`]; an event that carried no message still moves it).
    pub fn upstream(event_id: &'a str) -> Self {
        Self {
            upstream_event: Some(event_id),
            ..Self::default()
        }
    }

    /// Taking the stream out of (or back into) `Live`.
    pub fn ending(end: Finish) -> Self {
        Self {
            end: Some(end),
            ..Self::default()
        }
    }
}

/// The most a stream may hold (`[limits] stream_max_entries` and
/// `stream_max_bytes` for request streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub entries: Seq,
    pub bytes: u64,
}

impl Caps {
    /// Whether `messages` fit on a stream holding `entries` and `bytes`.
    pub fn admit(&self, entries: Seq, bytes: u64, messages: &[Bytes]) -> bool {
        let adding: u64 = messages.iter().map(|m| m.len() as u64).sum();
        entries.saturating_add(messages.len() as Seq) <= self.entries
            && bytes.saturating_add(adding) <= self.bytes
    }
}

/// A small change to a stream's metadata. Changes commute with appends and
/// with each other (cursors and times only move forward), so a backend can
/// apply them without reading the stream first — one `HSET`-like write.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Change {
    /// The client holds every entry up to this seq.
    Ack(Seq),
    /// A client asked about the stream at this time: re-arms abandonment.
    Touch { at_ms: u64 },
    /// A server-to-client request was logged at this seq.
    Request(Seq),
    /// The stream reached its caps and progress is being coalesced.
    Coalesced,
}

/// A stream the session already has under a call's request id, found when
/// the call's stream is opened (see [`Store::create_call`]): a client
/// re-sending a call it never heard back from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prior {
    /// The same call (same params digest): it is not executed again; the
    /// client gets this stream.
    Same(StreamId),
    /// Another call under the same id (other params): refused.
    Other,
}

impl Prior {
    /// What `call` finds in `stream`, the session's stream under its
    /// request id, whose params digest is `digest`: a stream without a
    /// digest never counts.
    pub fn judge(call: &StreamMeta, stream: StreamId, digest: Option<&str>) -> Option<Prior> {
        let digest = digest?;
        Some(if Some(digest) == call.params_digest.as_deref() {
            Prior::Same(stream)
        } else {
            Prior::Other
        })
    }
}

/// A stream leaving (or re-entering) `Live`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finish {
    pub status: StreamStatus,
    pub outcome: Option<Outcome>,
    pub at_ms: u64,
}

impl Finish {
    pub fn new(status: StreamStatus, outcome: Option<Outcome>) -> Self {
        Self {
            status,
            outcome,
            at_ms: now_ms(),
        }
    }
}

/// One logged upstream message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub seq: Seq,
    pub message: Bytes,
}

/// How far a stream is: its highest durable seq, and whether it has left
/// `Live` (all appends happen before that, so a reader at `seq` of a finished
/// stream has seen everything).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watermark {
    pub seq: Seq,
    pub finished: bool,
    /// The stream coalesces progress (it reached its caps).
    pub coalesced: bool,
}

/// Wakes a reader when a stream got entries or changed status; readers need
/// no store access to learn that nothing is new.
pub type Subscription = watch::Receiver<Watermark>;

/// The subscription to a stream a backend does not have: a closed channel
/// that says "finished", so the reader's next look at the store tells it
/// the stream is gone.
pub fn no_such_stream() -> Subscription {
    watch::Sender::new(NO_SUCH_STREAM).subscribe()
}

/// What a backend tells of a stream it does not have: "finished", for the
/// same reason as [`no_such_stream`].
pub const NO_SUCH_STREAM: Watermark = Watermark {
    seq: 0,
    finished: true,
    coalesced: false,
};

/// The log. Object-safe so the backend is chosen at start-up.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates or replaces a session record; durable on return.
    async fn put_session(&self, session: &SessionRecord) -> Result<()>;
    async fn get_session(&self, id: SessionId) -> Result<Option<SessionRecord>>;
    async fn list_sessions(&self) -> Result<Vec<SessionRecord>>;
    /// Sessions last seen at or before `seen_by_ms`, or closed at or before
    /// `closed_by_ms`: what the sweeper may end. By default every session
    /// is listed and filtered; a backend with ordered indexes answers
    /// without reading the others.
    async fn sessions_idle_by(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        let mut sessions = self.list_sessions().await?;
        sessions.retain(|s| s.idle_by(seen_by_ms, closed_by_ms));
        Ok(sessions)
    }
    /// Deletes the session and every stream and entry it owns.
    async fn delete_session(&self, id: SessionId) -> Result<()>;

    /// Creates a stream from its (new) metadata, with no entries.
    async fn create_stream(&self, meta: &StreamMeta) -> Result<()> {
        self.create_with(meta, &[]).await
    }
    /// Creates a stream whose first entries (seqs `1..=opening.len()`) are
    /// written with it, in one step: one write and one lock in the
    /// journal, one round trip to Redis. They are written ahead: the
    /// caller does not wait for their durability (a request goes upstream
    /// without waiting for its opening entries, and the journal lets a fast
    /// answer's flush cover them too), and readers see them once a flush
    /// covers them (a backend that cannot part the two waits as usual).
    async fn create_with(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<()>;
    async fn stream_meta(&self, id: StreamId) -> Result<Option<StreamMeta>>;
    async fn list_streams(&self) -> Result<Vec<StreamMeta>>;
    async fn streams_of_session(&self, session: SessionId) -> Result<Vec<StreamMeta>>;
    /// Moves a stream out of (or back into) `Live` and wakes its readers.
    async fn set_status(&self, id: StreamId, end: Finish) -> Result<()>;
    /// Applies a [`Change`] to a stream's metadata; durable on return.
    async fn update_stream(&self, id: StreamId, change: Change) -> Result<()>;
    async fn delete_stream(&self, id: StreamId) -> Result<()>;

    /// The stream that carries the answer to request `id` of `session` —
    /// durable, so a cancellation or a resume after a restart finds it. When
    /// a client reused an id, the newest stream wins.
    async fn stream_of_request(
        &self,
        session: SessionId,
        id: &RequestId,
    ) -> Result<Option<StreamId>>;
    /// The prior of the call `meta` opens ([`Prior`]): a stream of the
    /// session under its single request id whose params digest is known.
    /// A batch has none, and a stream without a digest never counts.
    async fn prior_call(&self, meta: &StreamMeta) -> Result<Option<Prior>> {
        let Some(id) = meta.call_id() else {
            return Ok(None);
        };
        let Some(stream) = self.stream_of_request(meta.session, id).await? else {
            return Ok(None);
        };
        let digest = self
            .stream_meta(stream)
            .await?
            .and_then(|m| m.params_digest);
        Ok(Prior::judge(meta, stream, digest.as_deref()))
    }

    /// Creates a call's stream, with its `opening` entries as
    /// [`Store::create_with`] does, unless the call has a prior
    /// ([`Store::prior_call`]), which it returns instead, creating nothing.
    /// The journal decides and creates under one lock, Redis in one script
    /// (one round trip, and atomic across instances): two copies of a call
    /// re-sent at once are not both created.
    async fn create_call(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<Option<Prior>> {
        if let Some(prior) = self.prior_call(meta).await? {
            return Ok(Some(prior));
        }
        self.create_with(meta, opening).await?;
        Ok(None)
    }
    /// Streams whose abandonment deadline is at or before `now_ms`.
    async fn abandoned_by(&self, now_ms: u64) -> Result<Vec<StreamId>>;
    /// Finished streams that finished at or before `at_ms` (retention).
    /// Never a task leg: legs are deleted with their task.
    async fn finished_by(&self, at_ms: u64) -> Result<Vec<StreamId>>;

    /// Appends messages in order, with what goes along (the upstream's mark,
    /// the stream's end) in the same write and durability wait; returns the
    /// seq of the last one. Returns once it is all durable per the `sync`
    /// mode, and only then wakes readers. `messages` may be empty when
    /// something goes along. The one write every backend implements; the
    /// `append*` methods below name its uses.
    async fn write(&self, stream: StreamId, messages: &[Bytes], along: Along<'_>) -> Result<Seq>;

    async fn append(&self, stream: StreamId, messages: &[Bytes]) -> Result<Seq> {
        self.write(stream, messages, Along::default()).await
    }
    /// Appends the last messages of a stream and finishes it, with one
    /// durability wait for both (a call's final response costs one flush,
    /// not two).
    async fn append_final(&self, stream: StreamId, messages: &[Bytes], end: Finish) -> Result<Seq> {
        self.write(stream, messages, Along::ending(end)).await
    }
    /// Entries with `seq > after`, oldest first, at most `limit`, never past
    /// the durable watermark.
    async fn read_after(&self, stream: StreamId, after: Seq, limit: usize) -> Result<Vec<Entry>>;
    /// Subscribe *before* reading so that no append between the read and the
    /// wait is missed. Async because a shared log may first have to ask
    /// where a stream it has not followed yet stands (a round trip that
    /// must not hold up the other connections of the thread).
    async fn subscribe(&self, stream: StreamId) -> Subscription;

    /// The stream's watermark as far as this process knows it, without
    /// asking anyone (`None`: it does not know). For bookkeeping on hot or
    /// locked paths, where a round trip to a shared log must not happen.
    fn peek(&self, stream: StreamId) -> Option<Watermark>;

    /// Tells the backend whom to report each flush's duration to. A backend
    /// that does not flush through a group commit has nothing to report.
    fn observe_flushes(&self, _observer: commit::FlushObserver) {}

    /// Whether a flush of the log failed, which stops its writes until the
    /// process restarts (see `commit.rs`): `/healthz` reports it.
    fn flush_failed(&self) -> bool {
        false
    }

    /// Whether the log can be written now: `Err` says why not, in a few
    /// words, for `/readyz` ("log not writable: …", "redis unreachable for
    /// 12s"). By default a failed flush ([`Store::flush_failed`]); a
    /// backend that knows more (the flush's error, how long its server has
    /// been away) says so.
    fn health(&self) -> std::result::Result<(), String> {
        if self.flush_failed() {
            return Err("log not writable: a flush failed".into());
        }
        Ok(())
    }

    /// Sets the most finished streams the log keeps (`[limits]
    /// max_retained_streams`): past it the oldest are released before
    /// retention would have, a live stream never. A backend whose retained
    /// streams cost this process no memory (a shared log) ignores it.
    fn set_retained_bound(&self, _max: usize) {}

    /// Finished streams released by that bound so far.
    fn released_early(&self) -> u64 {
        0
    }

    /// Finished streams this process keeps in memory for retention (`None`:
    /// the backend keeps none of them in this process's memory).
    fn retained_count(&self) -> Option<usize> {
        None
    }

    /// Bytes the log occupies on disk (the disk quota is checked against it).
    fn size_on_disk(&self) -> u64;

    /// Makes everything written so far durable, whatever the `sync` mode:
    /// the last thing a proxy that shuts down does with its log.
    async fn flush(&self) -> Result<()>;

    /// Live streams whose writer is gone, handed to this process to resume
    /// or finish; each is handed out once, and belongs to this process from
    /// then on. A log only one process opens (journal, sled) has at most
    /// one crop: every stream left live when it was opened. A shared log
    /// (Redis) yields the streams of instances whose lease ran out, at any
    /// time, never those of a living instance.
    async fn orphans(&self) -> Result<Vec<StreamMeta>>;

    /// Whether other processes write this log too: then orphans keep
    /// turning up while the proxy runs, and the session records it caches
    /// can be changed elsewhere.
    fn shared(&self) -> bool {
        false
    }

    /// Takes the stream's reader lease for an exclusive reader of this
    /// process. The lease is lost when a reader of another process takes
    /// the stream later; the reader must then stop delivering. (Readers of
    /// one process replace each other through the [`crate::stream::Log`].)
    async fn hold_reader(&self, _stream: StreamId) -> Result<ReaderLease> {
        Ok(ReaderLease::sole())
    }

    /// Sessions another process changed or deleted, for a shared log (so
    /// cached records can be refreshed); `None` for a log nobody else
    /// writes.
    fn session_changes(&self) -> Option<tokio::sync::broadcast::Receiver<SessionNews>> {
        None
    }

    /// Creates (or replaces) a task record; durable on return. Any process
    /// sharing the log may read and update any task: tasks have no owner
    /// (their legs do, as every stream).
    async fn put_task(&self, task: &TaskRecord) -> Result<()>;
    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>>;
    /// Replaces a task record whose stored `version` is `task.version - 1`
    /// (compare-and-set); `false`, changing nothing, when it is not (another
    /// writer came first) or the task is gone. Durable on return.
    async fn update_task(&self, task: &TaskRecord) -> Result<bool>;
    /// Deletes a task record and every leg stream it names, with their
    /// entries and indexes; durable on return. Legs go first: a deletion
    /// cut short leaves the task to be deleted again, never legs without
    /// a task (retention does not delete legs).
    async fn delete_task(&self, id: TaskId) -> Result<()>;
    /// Tasks whose `expires_ms` is at or before `now_ms` (an index, no scan).
    async fn tasks_expired_by(&self, now_ms: u64) -> Result<Vec<TaskId>>;

    /// Says goodbye at a graceful shutdown: a shared log hands this
    /// process's live streams to the other instances now, rather than when
    /// its lease runs out.
    async fn retire(&self) -> Result<()> {
        Ok(())
    }
}

/// What a shared log says about sessions other processes wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionNews {
    /// This session changed (or was deleted).
    Changed(SessionId),
    /// Changes may have been missed (the log was away): any cached session
    /// may be stale.
    Unknown,
}

/// A reader's hold on a stream across processes: lost once a reader of
/// another process took the stream over after it.
#[derive(Clone, Debug)]
pub struct ReaderLease {
    /// The newest claim by another process, as an order in the log's
    /// shared history; the lease is lost when it passes `mine`.
    claims: Option<watch::Receiver<ClaimOrder>>,
    mine: ClaimOrder,
}

/// Where a reader claim stands in the order a shared log gave it (Redis:
/// the feed entry's id, milliseconds and sequence).
pub type ClaimOrder = (u64, u64);

impl ReaderLease {
    /// A lease nobody else can take: the log has one process.
    pub fn sole() -> Self {
        Self {
            claims: None,
            mine: (0, 0),
        }
    }

    /// A lease claimed at `mine`, lost when `claims` passes it.
    pub fn new(claims: watch::Receiver<ClaimOrder>, mine: ClaimOrder) -> Self {
        Self {
            claims: Some(claims),
            mine,
        }
    }

    pub fn lost(&self) -> bool {
        self.claims
            .as_ref()
            .is_some_and(|c| *c.borrow() > self.mine)
    }

    /// Resolves once the lease is lost (never for a sole lease).
    pub async fn taken(&mut self) {
        let Some(claims) = self.claims.as_mut() else {
            return std::future::pending().await;
        };
        let mine = self.mine;
        if claims.wait_for(|c| *c > mine).await.is_err() {
            std::future::pending::<()>().await
        }
    }
}

/// Hands out a single-process log's orphans once: the streams left live
/// when it was opened.
#[derive(Default)]
pub struct OrphansOnce(std::sync::atomic::AtomicBool);

impl OrphansOnce {
    /// The live streams among `all`, the first time; nothing afterwards.
    pub async fn take<F>(&self, all: F) -> Result<Vec<StreamMeta>>
    where
        F: std::future::Future<Output = Result<Vec<StreamMeta>>>,
    {
        if self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        let mut streams = all.await?;
        streams.retain(|m| m.status.is_live());
        Ok(streams)
    }
}

pub type SharedStore = Arc<dyn Store>;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Milliseconds since the Unix epoch: the store's clock for lifetimes.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `ms` since the epoch as RFC 3339 UTC, to the millisecond.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's algorithm): no date crate for one format.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_change_shows_only_once_the_watermark_says_it_is_durable() {
        let mut meta = StreamMeta::standalone(SessionId::random());
        meta.finish(&Finish::new(StreamStatus::Completed, Some(Outcome::Result)));
        let written = Watermark::default();
        let seen = meta.clone().as_of(&written);
        assert_eq!(
            (seen.status, seen.outcome, seen.finished_ms),
            (StreamStatus::Live, None, None)
        );
        let durable = Watermark {
            finished: true,
            ..written
        };
        assert_eq!(meta.clone().as_of(&durable), meta);
    }

    #[test]
    fn a_session_record_from_before_replicas_reads_with_no_replica() {
        let id = SessionId::random();
        let old = format!(
            r#"{{"id":"{id}","route":"/mcp","upstream_session":"u","protocol_version":null,
            "principal":"p","initialize":null,"created_ms":1,"last_seen_ms":2}}"#
        );
        let record: SessionRecord = serde_json::from_str(&old).unwrap();
        assert_eq!(record.upstream_session.as_deref(), Some("u"));
        assert_eq!(record.upstream_replica, None);
        let unbound = SessionRecord::new(id, "/mcp", "p", 1);
        let text = serde_json::to_string(&unbound).unwrap();
        assert!(!text.contains("upstream_replica"), "{text}");
    }
}
