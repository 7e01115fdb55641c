//! The durable log's contract: what every backend (the journal by default,
//! sled, Redis for several instances) must offer, and the records it keeps.
//! `contract.rs` states the contract as tests every backend runs.
//!
//! The store knows sessions, streams and entries, and nothing of dialects,
//! HTTP or JSON-RPC: an entry is opaque bytes. Its one promise that everything
//! else leans on: when `append` returns, the entries are as durable as the
//! configured `sync` mode says, and only then do readers see them (the
//! subscription's watermark never runs ahead of durability). Readers therefore
//! can never be shown an entry a crash could take back.

pub mod commit;
#[cfg(test)]
mod contract;
pub mod journal;
pub mod sled;

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::id::{Seq, SessionId, StreamId};
use crate::jsonrpc::RequestId;

/// Errors are the backend's (I/O, corruption); "not found" is `Ok(None)`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage backend: {0}")]
    Backend(String),
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
    #[error("stream {0} does not exist")]
    NoSuchStream(StreamId),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// What a legacy session maps to upstream. Persisted so a restarted proxy
/// still routes the client's `Mcp-Session-Id` to the same upstream session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionRecord {
    pub id: SessionId,
    /// The mount path of the upstream this session belongs to.
    pub route: String,
    /// The upstream's `Mcp-Session-Id`, if it issued one.
    pub upstream_session: Option<String>,
    /// Negotiated protocol version, once the `initialize` result was seen.
    pub protocol_version: Option<String>,
    /// SHA-256 of the client's credential (hex), so a session is usable only
    /// by the principal that created it.
    pub principal: String,
    /// The original `initialize` request, to re-initialize an upstream that
    /// lost the session.
    pub initialize: Option<String>,
    pub created_ms: u64,
    pub last_seen_ms: u64,
    /// Set when the upstream side ended for good; the session then answers
    /// 404 and is deleted with its streams after retention.
    #[serde(default)]
    pub closed_ms: Option<u64>,
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
    pub method: Option<String>,
    pub status: StreamStatus,
    pub created_ms: u64,
    /// When the stream left `Live`; retention counts from here.
    pub finished_ms: Option<u64>,
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
}

/// Wakes a reader when a stream got entries or changed status; readers need
/// no store access to learn that nothing is new.
pub type Subscription = watch::Receiver<Watermark>;

/// The log. Object-safe so the backend is chosen at start-up.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates or replaces a session record; durable on return.
    async fn put_session(&self, session: &SessionRecord) -> Result<()>;
    async fn get_session(&self, id: SessionId) -> Result<Option<SessionRecord>>;
    async fn list_sessions(&self) -> Result<Vec<SessionRecord>>;
    /// Deletes the session and every stream and entry it owns.
    async fn delete_session(&self, id: SessionId) -> Result<()>;

    async fn create_stream(&self, meta: &StreamMeta) -> Result<()>;
    async fn stream_meta(&self, id: StreamId) -> Result<Option<StreamMeta>>;
    async fn list_streams(&self) -> Result<Vec<StreamMeta>>;
    async fn streams_of_session(&self, session: SessionId) -> Result<Vec<StreamMeta>>;
    /// Moves a stream out of (or back into) `Live` and wakes its readers.
    async fn set_status(&self, id: StreamId, status: StreamStatus, at_ms: u64) -> Result<()>;
    async fn delete_stream(&self, id: StreamId) -> Result<()>;

    /// Appends messages in order; returns the seq of the last one. Returns
    /// once they are durable per the `sync` mode, and only then wakes readers.
    async fn append(&self, stream: StreamId, messages: &[Bytes]) -> Result<Seq>;
    /// Appends the last messages of a stream and finishes it, with one
    /// durability wait for both (a call's final response costs one flush,
    /// not two).
    async fn append_final(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        status: StreamStatus,
        at_ms: u64,
    ) -> Result<Seq> {
        let seq = self.append(stream, messages).await?;
        self.set_status(stream, status, at_ms).await?;
        Ok(seq)
    }
    /// Entries with `seq > after`, oldest first, at most `limit`, never past
    /// the durable watermark.
    async fn read_after(&self, stream: StreamId, after: Seq, limit: usize) -> Result<Vec<Entry>>;
    /// Subscribe *before* reading so that no append between the read and the
    /// wait is missed.
    fn subscribe(&self, stream: StreamId) -> Subscription;
}

pub type SharedStore = Arc<dyn Store>;

/// Milliseconds since the Unix epoch: the store's clock for lifetimes.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
