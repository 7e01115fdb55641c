//! The two lookups sled answers from trees of their own instead of a scan:
//! which stream answers a session's request id (the prior-call check every
//! call makes) and which streams are due (retention and abandonment
//! sweeps). Scanning every stream of a session per call made each call
//! cost more the longer the proxy ran, and brought every retained stream's
//! tail back into memory (BENCHMARKS.md, session 21).
//!
//! - `requests`: session id ‖ request id (its JSON text) → the newest
//!   stream answering it;
//! - `deadlines`: kind (`f`inished, `a`bandon) ‖ ms (big-endian) ‖ stream
//!   id → ().
//!
//! They are written outside the metadata's own write (sled has no cheap
//! transaction across trees), in an order that can leave a stale entry
//! after a crash but never miss one: a new entry before the metadata, the
//! old one removed after. Readers therefore check what an entry says
//! against the metadata; that is the caller's part (`mod.rs`), as is when
//! an entry is written. A data directory from before these trees is
//! indexed once when opened.

use sled::Tree;

use super::backend;
use crate::id::{SessionId, StreamId};
use crate::jsonrpc::RequestId;
use crate::store::{Result, StoreError, StreamMeta};

/// Which of a stream's deadlines a `deadlines` key is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// When it finished: retention counts from it (never a task leg's:
    /// legs go with their task).
    Finished,
    /// When it is abandoned unless a client asks about it.
    Abandon,
}

impl Deadline {
    const BOTH: [Deadline; 2] = [Deadline::Finished, Deadline::Abandon];

    fn tag(self) -> u8 {
        match self {
            Deadline::Finished => b'f',
            Deadline::Abandon => b'a',
        }
    }

    /// This deadline of `meta`, if it has one.
    pub fn of(self, meta: &StreamMeta) -> Option<u64> {
        match self {
            Deadline::Finished => meta.finished_ms.filter(|_| meta.task.is_none()),
            Deadline::Abandon => meta.abandon_at_ms,
        }
    }

    fn key(self, ms: u64, stream: StreamId) -> [u8; 25] {
        let mut key = [0u8; 25];
        key[0] = self.tag();
        key[1..9].copy_from_slice(&ms.to_be_bytes());
        key[9..].copy_from_slice(stream.as_bytes());
        key
    }
}

fn request_key(session: SessionId, request: &RequestId) -> Vec<u8> {
    let text = request.as_json();
    let mut key = Vec::with_capacity(16 + text.len());
    key.extend_from_slice(session.as_bytes());
    key.extend_from_slice(text.as_bytes());
    key
}

fn stream_id(bytes: &[u8]) -> Result<StreamId> {
    let id = bytes
        .try_into()
        .map_err(|_| StoreError::Corrupt("index entry's stream id".into()))?;
    Ok(StreamId(id))
}

/// The layout version the `layout` tree records once the indexes are built.
const INDEXED: &[u8] = b"indexes-1";

pub struct Indexes {
    requests: Tree,
    deadlines: Tree,
}

impl Indexes {
    /// Opens the index trees, building them from `streams` (metadata
    /// records) if this data directory predates them.
    pub fn open(db: &sled::Db, streams: &Tree) -> Result<Self> {
        let indexes = Self {
            requests: db.open_tree("requests").map_err(backend)?,
            deadlines: db.open_tree("deadlines").map_err(backend)?,
        };
        let layout = db.open_tree("layout").map_err(backend)?;
        if layout.get(INDEXED).map_err(backend)?.is_none() {
            for value in streams.iter().values() {
                let meta: StreamMeta = super::decode("stream", &value.map_err(backend)?)?;
                indexes.created(&meta)?;
            }
            layout.insert(INDEXED, &[]).map_err(backend)?;
        }
        Ok(indexes)
    }

    /// Indexes a new stream: it is the newest answering its request ids.
    /// Before its metadata is written.
    pub fn created(&self, meta: &StreamMeta) -> Result<()> {
        for request in &meta.origin_ids {
            self.requests
                .insert(request_key(meta.session, request), meta.id.as_bytes())
                .map_err(backend)?;
        }
        self.add_deadlines(meta)
    }

    /// Indexes the deadlines `meta` has; before it is written.
    pub fn add_deadlines(&self, meta: &StreamMeta) -> Result<()> {
        for kind in Deadline::BOTH {
            if let Some(ms) = kind.of(meta) {
                self.deadlines
                    .insert(kind.key(ms, meta.id), &[])
                    .map_err(backend)?;
            }
        }
        Ok(())
    }

    /// Drops the deadlines `before` had that `after` no longer has; after
    /// `after` is written.
    pub fn drop_old_deadlines(&self, before: &StreamMeta, after: &StreamMeta) -> Result<()> {
        for kind in Deadline::BOTH {
            if let Some(ms) = kind.of(before).filter(|&ms| kind.of(after) != Some(ms)) {
                self.deadlines
                    .remove(kind.key(ms, before.id))
                    .map_err(backend)?;
            }
        }
        Ok(())
    }

    /// Forgets a deleted stream; after its metadata is removed.
    pub fn removed(&self, meta: &StreamMeta) -> Result<()> {
        for request in &meta.origin_ids {
            // Only if it still names this stream: a newer one may answer it.
            let _ = self
                .requests
                .compare_and_swap(
                    request_key(meta.session, request),
                    Some(meta.id.as_bytes()),
                    None as Option<&[u8]>,
                )
                .map_err(backend)?;
        }
        for kind in Deadline::BOTH {
            if let Some(ms) = kind.of(meta) {
                self.deadlines
                    .remove(kind.key(ms, meta.id))
                    .map_err(backend)?;
            }
        }
        Ok(())
    }

    /// The stream the index names for `request` of `session` (which may be
    /// gone since: the caller checks).
    pub fn answering(&self, session: SessionId, request: &RequestId) -> Result<Option<StreamId>> {
        match self
            .requests
            .get(request_key(session, request))
            .map_err(backend)?
        {
            Some(id) => stream_id(&id).map(Some),
            None => Ok(None),
        }
    }

    /// Streams with a `kind` deadline at or before `at_ms`, soonest first,
    /// as the index has them (stale ones included: the caller checks).
    pub fn due(&self, kind: Deadline, at_ms: u64) -> Result<Vec<(u64, StreamId)>> {
        let (first, last) = (
            kind.key(0, StreamId([0; 16])),
            kind.key(at_ms, StreamId([0xff; 16])),
        );
        self.deadlines
            .range(first..=last)
            .keys()
            .map(|key| {
                let key = key.map_err(backend)?;
                let ms = key
                    .get(1..9)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| StoreError::Corrupt("deadline key".into()))?;
                Ok((ms, stream_id(key.get(9..).unwrap_or_default())?))
            })
            .collect()
    }

    /// Removes a stale deadline entry a reader found.
    pub fn forget_deadline(&self, kind: Deadline, ms: u64, stream: StreamId) -> Result<()> {
        self.deadlines
            .remove(kind.key(ms, stream))
            .map_err(backend)
            .map(|_| ())
    }
}
