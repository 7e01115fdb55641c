//! The embedded default backend: sled trees under the data directory.
//!
//! Layout (one tree per concern, never one per session — sled's space
//! reclamation degrades with many trees):
//! - `sessions`: session id → JSON `SessionRecord`
//! - `streams`: stream id → JSON `StreamMeta`
//! - `session_streams`: session id ‖ stream id → () (index for deletion)
//! - `entries`: stream id ‖ seq (big-endian) → the message bytes
//!
//! sled keeps recent inserts in process memory until a flush, so durability is
//! the group commit's job (`commit.rs`). Appends to one stream are serialized
//! and the stream's watermark moves only after the covering flush: a reader is
//! never shown an entry that `kill -9` could take back (except in
//! `sync = "never"`, which says so).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::{watch, Mutex};

use super::commit::{GroupCommit, SyncMode};
use super::{
    Entry, Result, SessionRecord, Store, StoreError, StreamMeta, StreamStatus, Subscription,
    Watermark,
};
use crate::id::{Seq, SessionId, StreamId};

/// The write end of one stream: serializes its appends and publishes its
/// durable watermark to subscribed readers.
struct Tail {
    append: Mutex<()>,
    watermark: watch::Sender<Watermark>,
}

pub struct SledStore {
    db: sled::Db,
    sessions: sled::Tree,
    streams: sled::Tree,
    session_streams: sled::Tree,
    entries: sled::Tree,
    commit: GroupCommit,
    tails: DashMap<StreamId, Arc<Tail>>,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn entry_key(stream: StreamId, seq: Seq) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(stream.as_bytes());
    key[16..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn pair_key(session: SessionId, stream: StreamId) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(session.as_bytes());
    key[16..].copy_from_slice(stream.as_bytes());
    key
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(backend)
}

impl SledStore {
    /// Opens (or creates) the log under `dir/log`.
    pub fn open(dir: &Path, sync: SyncMode) -> Result<Self> {
        let db = sled::Config::new()
            .path(dir.join("log"))
            // The background flusher bounds what `sync = "never"` can lose.
            .flush_every_ms(Some(200))
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                    StoreError::Backend(format!("{} is in use by another process", dir.display()))
                }
                other => backend(other),
            })?;
        let flusher = db.clone();
        let commit = GroupCommit::new(
            sync,
            Arc::new(move || flusher.flush().map(|_| ()).map_err(std::io::Error::other)),
        );
        Ok(Self {
            sessions: db.open_tree("sessions").map_err(backend)?,
            streams: db.open_tree("streams").map_err(backend)?,
            session_streams: db.open_tree("session_streams").map_err(backend)?,
            entries: db.open_tree("entries").map_err(backend)?,
            db,
            commit,
            tails: DashMap::new(),
        })
    }

    /// Bytes the log occupies on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }

    async fn durable(&self) -> Result<()> {
        self.commit.durable().await.map_err(backend)
    }

    fn last_seq(&self, stream: StreamId) -> Result<Seq> {
        match self.entries.scan_prefix(stream.as_bytes()).next_back() {
            None => Ok(0),
            Some(item) => {
                let (key, _) = item.map_err(backend)?;
                let seq: [u8; 8] = key[16..24]
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("entry key length".into()))?;
                Ok(u64::from_be_bytes(seq))
            }
        }
    }

    /// The stream's tail; `None` for a stream that does not exist (so that
    /// asking about a deleted stream does not bring its tail back).
    fn tail(&self, stream: StreamId) -> Result<Option<Arc<Tail>>> {
        if let Some(tail) = self.tails.get(&stream) {
            return Ok(Some(tail.clone()));
        }
        let Some(meta) = self.streams.get(stream.as_bytes()).map_err(backend)? else {
            return Ok(None);
        };
        let meta: StreamMeta = decode("stream", &meta)?;
        let mark = Watermark {
            seq: self.last_seq(stream)?,
            finished: !meta.status.is_live(),
        };
        Ok(Some(
            self.tails
                .entry(stream)
                .or_insert_with(|| {
                    Arc::new(Tail {
                        append: Mutex::new(()),
                        watermark: watch::Sender::new(mark),
                    })
                })
                .clone(),
        ))
    }

    /// Inserts entries (and the final status), waits once for durability,
    /// then moves the watermark readers follow.
    async fn append_inner(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        finish: Option<(StreamStatus, u64)>,
    ) -> Result<Seq> {
        let tail = self.tail(stream)?.ok_or(StoreError::NoSuchStream(stream))?;
        let _serial = tail.append.lock().await;
        let mut seq = tail.watermark.borrow().seq;
        if !messages.is_empty() {
            let mut batch = sled::Batch::default();
            for message in messages {
                seq += 1;
                batch.insert(&entry_key(stream, seq)[..], message.as_ref());
            }
            self.entries.apply_batch(batch).map_err(backend)?;
        }
        if let Some((status, at_ms)) = finish {
            let mut meta: StreamMeta = match self.streams.get(stream.as_bytes()).map_err(backend)? {
                Some(bytes) => decode("stream", &bytes)?,
                None => return Err(StoreError::NoSuchStream(stream)),
            };
            meta.status = status;
            meta.finished_ms = (!status.is_live()).then_some(at_ms);
            self.streams
                .insert(stream.as_bytes(), encode(&meta)?)
                .map_err(backend)?;
        }
        self.durable().await?;
        tail.watermark.send_modify(|w| {
            w.seq = seq;
            if let Some((status, _)) = finish {
                w.finished = !status.is_live();
            }
        });
        Ok(seq)
    }

    /// Tells readers of a deleted stream that it will say nothing more.
    fn finish_tail(&self, stream: StreamId) {
        if let Some((_, tail)) = self.tails.remove(&stream) {
            tail.watermark.send_modify(|w| w.finished = true);
        }
    }

    fn remove_stream_data(&self, session: SessionId, stream: StreamId) -> Result<()> {
        let mut batch = sled::Batch::default();
        for key in self.entries.scan_prefix(stream.as_bytes()).keys() {
            batch.remove(key.map_err(backend)?);
        }
        self.entries.apply_batch(batch).map_err(backend)?;
        self.streams.remove(stream.as_bytes()).map_err(backend)?;
        self.session_streams
            .remove(pair_key(session, stream))
            .map_err(backend)?;
        self.finish_tail(stream);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for SledStore {
    async fn put_session(&self, session: &SessionRecord) -> Result<()> {
        self.sessions
            .insert(session.id.as_bytes(), encode(session)?)
            .map_err(backend)?;
        self.durable().await
    }

    async fn get_session(&self, id: SessionId) -> Result<Option<SessionRecord>> {
        match self.sessions.get(id.as_bytes()).map_err(backend)? {
            Some(bytes) => decode("session", &bytes).map(Some),
            None => Ok(None),
        }
    }

    async fn list_sessions(&self) -> Result<Vec<SessionRecord>> {
        self.sessions
            .iter()
            .values()
            .map(|v| decode("session", &v.map_err(backend)?))
            .collect()
    }

    async fn delete_session(&self, id: SessionId) -> Result<()> {
        for key in self.session_streams.scan_prefix(id.as_bytes()).keys() {
            let key = key.map_err(backend)?;
            let stream = StreamId(
                key[16..32]
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("session stream key".into()))?,
            );
            self.remove_stream_data(id, stream)?;
        }
        self.sessions.remove(id.as_bytes()).map_err(backend)?;
        self.durable().await
    }

    async fn create_stream(&self, meta: &StreamMeta) -> Result<()> {
        // Not flushed on its own: the first append's flush covers it, and a
        // stream without entries that a crash loses was never shown to anyone.
        self.streams
            .insert(meta.id.as_bytes(), encode(meta)?)
            .map_err(backend)?;
        self.session_streams
            .insert(pair_key(meta.session, meta.id), &[])
            .map_err(backend)?;
        Ok(())
    }

    async fn stream_meta(&self, id: StreamId) -> Result<Option<StreamMeta>> {
        match self.streams.get(id.as_bytes()).map_err(backend)? {
            Some(bytes) => decode("stream", &bytes).map(Some),
            None => Ok(None),
        }
    }

    async fn list_streams(&self) -> Result<Vec<StreamMeta>> {
        self.streams
            .iter()
            .values()
            .map(|v| decode("stream", &v.map_err(backend)?))
            .collect()
    }

    async fn streams_of_session(&self, session: SessionId) -> Result<Vec<StreamMeta>> {
        let mut out = Vec::new();
        for key in self.session_streams.scan_prefix(session.as_bytes()).keys() {
            let key = key.map_err(backend)?;
            if let Some(bytes) = self.streams.get(&key[16..32]).map_err(backend)? {
                out.push(decode("stream", &bytes)?);
            }
        }
        Ok(out)
    }

    async fn set_status(&self, id: StreamId, status: StreamStatus, at_ms: u64) -> Result<()> {
        let mut meta = self
            .stream_meta(id)
            .await?
            .ok_or(StoreError::NoSuchStream(id))?;
        meta.status = status;
        meta.finished_ms = (!status.is_live()).then_some(at_ms);
        self.streams
            .insert(id.as_bytes(), encode(&meta)?)
            .map_err(backend)?;
        self.durable().await?;
        if let Some(tail) = self.tails.get(&id) {
            tail.watermark
                .send_modify(|w| w.finished = !status.is_live());
        }
        Ok(())
    }

    async fn delete_stream(&self, id: StreamId) -> Result<()> {
        if let Some(meta) = self.stream_meta(id).await? {
            self.remove_stream_data(meta.session, id)?;
        }
        Ok(())
    }

    async fn append(&self, stream: StreamId, messages: &[Bytes]) -> Result<Seq> {
        self.append_inner(stream, messages, None).await
    }

    async fn append_final(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        status: StreamStatus,
        at_ms: u64,
    ) -> Result<Seq> {
        self.append_inner(stream, messages, Some((status, at_ms)))
            .await
    }

    async fn read_after(&self, stream: StreamId, after: Seq, limit: usize) -> Result<Vec<Entry>> {
        let watermark = match self.tails.get(&stream) {
            Some(tail) => tail.watermark.borrow().seq,
            None => self.last_seq(stream)?,
        };
        if after >= watermark {
            return Ok(Vec::new());
        }
        let range = entry_key(stream, after + 1)..=entry_key(stream, watermark);
        self.entries
            .range(range)
            .take(limit)
            .map(|item| {
                let (key, value) = item.map_err(backend)?;
                let seq = u64::from_be_bytes(
                    key[16..24]
                        .try_into()
                        .map_err(|_| StoreError::Corrupt("entry key length".into()))?,
                );
                Ok(Entry {
                    seq,
                    // Share sled's reference-counted buffer instead of copying
                    // every replayed message.
                    message: Bytes::from_owner(value),
                })
            })
            .collect()
    }

    fn subscribe(&self, stream: StreamId) -> Subscription {
        match self.tail(stream) {
            Ok(Some(tail)) => tail.watermark.subscribe(),
            // No such stream (or a broken tree): a closed channel that says
            // "finished"; the reader's next look at the store tells which.
            _ => watch::Sender::new(Watermark {
                seq: 0,
                finished: true,
            })
            .subscribe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::Churn;

    crate::store::contract::contract_tests!(|dir: &Path, sync| -> crate::store::SharedStore {
        Arc::new(SledStore::open(dir, sync).unwrap())
    });

    #[tokio::test]
    async fn the_log_stays_bounded_when_streams_are_deleted_as_fast_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SyncMode::Batch).unwrap();
        let mut churn = Churn::new(100);
        let progress = Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}"#,
        );
        let mut sizes = Vec::new();
        for i in 1..=10_000u32 {
            churn.step(&store, progress.clone()).await;
            if i % 2000 == 0 {
                sizes.push(store.size_on_disk());
            }
        }
        // sled fills its segments before reclaiming them, then plateaus (its
        // reclamation runs in the background, so allow it a segment or so of
        // lag). Without the deletions this load adds ~1.5 MiB per sample.
        let allowance = 1024 * 1024;
        assert!(
            sizes[4] <= sizes[1] + allowance,
            "log kept growing: {sizes:?}"
        );
    }
}
