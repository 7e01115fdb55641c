//! Streams over the log: opening them, appending to them, finishing them, and
//! reading them — replay after a cursor, then follow live — with exactly-once,
//! in-order delivery to whichever reader is attached.
//!
//! Every dialect reads through [`Reader`]; none of them touches the store's
//! entries directly. A stream has at most one reader at a time: the spec
//! forbids sending one message on two connections, and a client that comes
//! back usually does so because its previous connection is half-dead. So a new
//! reader takes the stream over and the old one ends ([`Next::Replaced`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::watch;

use crate::id::{Seq, SessionId, StreamId};
use crate::jsonrpc::RequestId;
use crate::store::{now_ms, Entry, Result, SharedStore, StreamKind, StreamMeta, StreamStatus};

/// How many entries a reader takes from the store at once.
const READ_BATCH: usize = 256;

/// The log as the rest of the proxy sees it.
pub struct Log {
    store: SharedStore,
    /// Reader generation per stream with an attached reader; bumping it
    /// retires the previous reader.
    readers: DashMap<StreamId, watch::Sender<u64>>,
}

impl Log {
    pub fn new(store: SharedStore) -> Arc<Self> {
        Arc::new(Self {
            store,
            readers: DashMap::new(),
        })
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    pub async fn open(
        &self,
        session: SessionId,
        kind: StreamKind,
        origin_ids: Vec<RequestId>,
        method: Option<String>,
    ) -> Result<StreamMeta> {
        let meta = StreamMeta {
            id: StreamId::random(),
            session,
            kind,
            origin_ids,
            method,
            status: StreamStatus::Live,
            created_ms: now_ms(),
            finished_ms: None,
        };
        self.store.create_stream(&meta).await?;
        Ok(meta)
    }

    pub async fn append(&self, stream: StreamId, messages: &[Bytes]) -> Result<Seq> {
        self.store.append(stream, messages).await
    }

    /// Appends a stream's last messages and finishes it, durable together.
    pub async fn append_final(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        status: StreamStatus,
    ) -> Result<Seq> {
        self.store
            .append_final(stream, messages, status, now_ms())
            .await
    }

    /// Ends a stream as failed: one JSON-RPC error response per request in
    /// `pending` (in the client's order), so a client reading it learns its
    /// request failed instead of waiting on silence; durable with the status.
    pub async fn fail<'a>(
        &self,
        stream: &StreamMeta,
        pending: impl IntoIterator<Item = &'a RequestId>,
        why: &str,
    ) -> Result<()> {
        let pending: std::collections::HashSet<&RequestId> = pending.into_iter().collect();
        let errors: Vec<Bytes> = stream
            .origin_ids
            .iter()
            .filter(|id| pending.contains(id))
            .map(|id| {
                Bytes::from(crate::jsonrpc::error_response(
                    Some(id),
                    crate::jsonrpc::code::INTERNAL_ERROR,
                    why,
                ))
            })
            .collect();
        self.append_final(stream.id, &errors, StreamStatus::Failed)
            .await
            .map(|_| ())
    }

    pub async fn finish(&self, stream: StreamId, status: StreamStatus) -> Result<()> {
        self.store.set_status(stream, status, now_ms()).await
    }

    pub async fn meta(&self, stream: StreamId) -> Result<Option<StreamMeta>> {
        self.store.stream_meta(stream).await
    }

    /// The durable end of the stream right now: where a reader that wants
    /// only new entries starts.
    pub fn end(&self, stream: StreamId) -> Seq {
        self.store.subscribe(stream).borrow().seq
    }

    pub async fn delete(&self, stream: StreamId) -> Result<()> {
        self.retire(stream);
        self.store.delete_stream(stream).await
    }

    /// Ends whichever reader is attached to `stream`.
    pub fn retire(&self, stream: StreamId) {
        if let Some((_, generation)) = self.readers.remove(&stream) {
            generation.send_modify(|g| *g += 1);
        }
    }

    /// Attaches a reader that yields every entry after `after`, taking the
    /// stream over from any earlier reader.
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
            generation,
            mine,
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
    generation: watch::Receiver<u64>,
    /// The generation this reader was attached as.
    mine: u64,
}

impl Reader {
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    pub fn cursor(&self) -> Seq {
        self.cursor
    }

    pub async fn next(&mut self, idle: Duration) -> Result<Next> {
        let deadline = tokio::time::Instant::now() + idle;
        loop {
            if self.generation.has_changed().is_err() || *self.generation.borrow() != self.mine {
                return Ok(Next::Replaced);
            }
            // Subscribe before reading, so an append landing between the read
            // and the wait still wakes us.
            let mut appended = self.log.store.subscribe(self.stream);
            let mark = *appended.borrow_and_update();
            if mark.seq > self.cursor {
                if let Some(entries) = self.take().await? {
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
            tokio::select! {
                changed = appended.changed() => {
                    if changed.is_err() && self.log.store.stream_meta(self.stream).await?.is_none() {
                        return Ok(Next::Gone);
                    }
                }
                _ = self.generation.changed() => return Ok(Next::Replaced),
                _ = tokio::time::sleep_until(deadline) => return Ok(Next::Idle),
            }
        }
    }

    async fn take(&mut self) -> Result<Option<Vec<Entry>>> {
        let entries = self
            .log
            .store
            .read_after(self.stream, self.cursor, READ_BATCH)
            .await?;
        Ok(entries.last().map(|last| last.seq).map(|seq| {
            self.cursor = seq;
            entries
        }))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // Forget the generation channel once nobody reads the stream, unless a
        // newer reader has taken it.
        let mine = self.mine;
        self.log
            .readers
            .remove_if(&self.stream, |_, g| *g.borrow() == mine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::commit::SyncMode;
    use crate::store::journal::Journal;

    async fn log() -> (tempfile::TempDir, Arc<Log>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        (dir, Log::new(store))
    }

    const IDLE: Duration = Duration::from_secs(5);

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
        let meta = log
            .open(SessionId::random(), StreamKind::Request, vec![], None)
            .await
            .unwrap();
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
        let meta = log
            .open(SessionId::random(), StreamKind::Request, vec![], None)
            .await
            .unwrap();
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
        let meta = log
            .open(SessionId::random(), StreamKind::Request, vec![], None)
            .await
            .unwrap();
        let mut first = log.attach(meta.id, 0);
        let _second = log.attach(meta.id, 0);
        assert_eq!(first.next(IDLE).await.unwrap(), Next::Replaced);
    }

    #[tokio::test]
    async fn an_idle_live_stream_reports_idle() {
        let (_dir, log) = log().await;
        let meta = log
            .open(SessionId::random(), StreamKind::Request, vec![], None)
            .await
            .unwrap();
        let mut reader = log.attach(meta.id, 0);
        let next = reader.next(Duration::from_millis(20)).await.unwrap();
        assert_eq!(next, Next::Idle);
    }

    #[tokio::test]
    async fn deleting_a_stream_ends_its_reader() {
        let (_dir, log) = log().await;
        let meta = log
            .open(SessionId::random(), StreamKind::Request, vec![], None)
            .await
            .unwrap();
        let mut reader = log.attach(meta.id, 0);
        log.store().delete_stream(meta.id).await.unwrap();
        assert_eq!(reader.next(IDLE).await.unwrap(), Next::Gone);
    }
}
