//! The journal as the [`Store`] the proxy uses: each operation of the
//! contract (`store/mod.rs`), composed of the journal's own steps —
//! encode, write under the lock, update the index, wait for durability.
//!
//! Nothing here decides an order of I/O of its own: that is `writing.rs`'s
//! and `entries.rs`'s.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

use super::entries::read_locs;
use super::index::StreamState;
use super::segment::SegmentNo;
use super::{io, record, Journal};
use crate::id::{Seq, SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
use crate::store::commit::FlushObserver;
use crate::store::{
    Along, Change, Entry, Finish, Prior, Result, SessionRecord, Store, StoreError, StreamMeta,
    Subscription, TaskRecord, Watermark,
};

#[async_trait::async_trait]
impl Store for Journal {
    async fn put_session(&self, session: &SessionRecord) -> Result<()> {
        {
            let mut inner = self.lock();
            record::session(&mut inner.buf, session);
            let (no, _) = self.write(&mut inner)?;
            inner.index.put_session(session.clone(), no);
            self.wrote(&mut inner);
        }
        self.durable().await
    }

    async fn get_session(&self, id: SessionId) -> Result<Option<SessionRecord>> {
        Ok(self.lock().index.sessions.get(&id).cloned())
    }

    async fn list_sessions(&self) -> Result<Vec<SessionRecord>> {
        Ok(self.lock().index.sessions.values().cloned().collect())
    }

    async fn sessions_idle_by(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        Ok(self.lock().index.sessions_idle_by(seen_by_ms, closed_by_ms))
    }

    async fn delete_session(&self, id: SessionId) -> Result<()> {
        {
            let mut inner = self.lock();
            let streams = inner.index.streams_of(id);
            for stream in &streams {
                record::stream_gone(&mut inner.buf, *stream);
            }
            record::session_gone(&mut inner.buf, id);
            self.write(&mut inner)?;
            inner.index.remove_session(id);
            self.forget_streams(&mut inner, &streams)?;
            self.wrote(&mut inner);
        }
        self.durable().await
    }

    async fn create_with(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<()> {
        self.create_unless(meta, opening, |_| Ok(None)).map(|_| ())
    }

    async fn create_call(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<Option<Prior>> {
        self.create_unless(meta, opening, |inner| {
            let index = &inner.index;
            let Some(call) = meta.call_id() else {
                return Ok(None);
            };
            let Some(stream) = index.stream_of_request(meta.session, call) else {
                return Ok(None);
            };
            let digest = match index.streams.get(&stream) {
                Some(state) => state.meta.params_digest.clone(),
                None => inner
                    .retired_summary(&stream)?
                    .and_then(|s| s.meta.params_digest),
            };
            Ok(Prior::judge(meta, stream, digest.as_deref()))
        })
    }

    async fn stream_meta(&self, id: StreamId) -> Result<Option<StreamMeta>> {
        let read = {
            let inner = self.lock();
            if let Some(state) = inner.index.streams.get(&id) {
                return Ok(Some(state.visible()));
            }
            inner.retired_read(&id)
        };
        read.map(|r| r.meta(&self.recent)).transpose()
    }

    async fn list_streams(&self) -> Result<Vec<StreamMeta>> {
        let ids: Vec<StreamId> = {
            let inner = self.lock();
            let index = &inner.index;
            let whole = index.streams.keys().copied();
            whole.chain(index.retired.ids()).collect()
        };
        self.metas_of(&ids)
    }

    async fn streams_of_session(&self, session: SessionId) -> Result<Vec<StreamMeta>> {
        let ids = self.lock().index.streams_of(session);
        self.metas_of(&ids)
    }

    async fn set_status(&self, id: StreamId, end: Finish) -> Result<()> {
        let watermark = self
            .edit_stream(
                id,
                |buf| record::status(buf, id, &end),
                |index| index.set_status(id, &end),
                |meta| meta.finish(&end),
                end.status.is_live(),
            )
            .await?;
        if let Some(watermark) = watermark {
            watermark.send_modify(|w| w.finished = !end.status.is_live());
        }
        #[cfg(test)]
        self.retire_if_eager();
        Ok(())
    }

    async fn update_stream(&self, id: StreamId, change: Change) -> Result<()> {
        let watermark = self
            .edit_stream(
                id,
                |buf| record::change(buf, id, &change),
                |index| index.apply(id, &change),
                |meta| meta.apply(&change),
                false,
            )
            .await?;
        if let (Some(watermark), Change::Coalesced) = (watermark, change) {
            watermark.send_modify(|w| w.coalesced = true);
        }
        Ok(())
    }

    async fn stream_of_request(
        &self,
        session: SessionId,
        id: &RequestId,
    ) -> Result<Option<StreamId>> {
        Ok(self.lock().index.stream_of_request(session, id))
    }

    async fn abandoned_by(&self, now_ms: u64) -> Result<Vec<StreamId>> {
        Ok(self.lock().index.abandoned_by(now_ms))
    }

    async fn finished_by(&self, at_ms: u64) -> Result<Vec<StreamId>> {
        Ok(self.lock().index.finished_by(at_ms))
    }

    async fn delete_stream(&self, id: StreamId) -> Result<()> {
        let mut inner = self.lock();
        if !inner.index.has_stream(&id) {
            return Ok(());
        }
        record::stream_gone(&mut inner.buf, id);
        self.write(&mut inner)?;
        self.forget_streams(&mut inner, &[id])?;
        self.wrote(&mut inner);
        Ok(())
    }

    async fn put_task(&self, task: &TaskRecord) -> Result<()> {
        self.write_task(task, |_| true).await.map(|_| ())
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        Ok(self.lock().index.tasks.get(&id).cloned())
    }

    async fn update_task(&self, task: &TaskRecord) -> Result<bool> {
        let follows = |stored: Option<&TaskRecord>| {
            stored.is_some_and(|s| Some(s.version) == task.version.checked_sub(1))
        };
        self.write_task(task, follows).await
    }

    async fn delete_task(&self, id: TaskId) -> Result<()> {
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            let Some(task) = inner.index.tasks.get(&id) else {
                return Ok(());
            };
            let legs: Vec<StreamId> = task
                .legs
                .iter()
                .copied()
                .filter(|leg| inner.index.streams.contains_key(leg))
                .collect();
            for leg in &legs {
                record::stream_gone(&mut inner.buf, *leg);
            }
            // After its legs' tombstones, in the same write: a torn write can
            // keep the task and lose tombstones (the next sweep deletes it
            // again), never keep legs whose task is gone — retention does
            // not delete legs, so nothing else would.
            record::task_gone(&mut inner.buf, id);
            self.write(inner)?;
            inner.index.remove_task(id);
            self.forget_streams(inner, &legs)?;
            self.wrote(inner);
        }
        self.durable().await
    }

    async fn tasks_expired_by(&self, now_ms: u64) -> Result<Vec<TaskId>> {
        Ok(self.lock().index.tasks_expired_by(now_ms))
    }

    fn size_on_disk(&self) -> u64 {
        let inner = self.lock();
        inner
            .files
            .values()
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    async fn orphans(&self) -> Result<Vec<StreamMeta>> {
        // Only the live ones are copied: at start the index may hold
        // hundreds of thousands of finished streams retention keeps.
        let live = async {
            Ok(self
                .lock()
                .index
                .streams
                .values()
                .filter(|s| s.meta.status.is_live())
                .map(StreamState::visible)
                .collect())
        };
        self.orphans.take(live).await
    }

    async fn flush(&self) -> Result<()> {
        tokio::task::spawn_blocking(self.active_sync())
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?
            .map_err(io)
    }

    /// A last checkpoint, at the end of the log, so that the next start
    /// replays nothing (a restart for a rollout is then as quick as a
    /// start on an empty log, however many streams are retained).
    async fn retire(&self) -> Result<()> {
        self.final_checkpoint().await
    }

    async fn write(&self, stream: StreamId, messages: &[Bytes], along: Along<'_>) -> Result<Seq> {
        self.append_inner(stream, messages, along).await
    }

    async fn read_after(&self, stream: StreamId, after: Seq, limit: usize) -> Result<Vec<Entry>> {
        let (locs, files) = {
            let inner = self.lock();
            let Some(state) = inner.index.streams.get(&stream) else {
                let Some(read) = inner.retired_read(&stream) else {
                    return Ok(Vec::new());
                };
                drop(inner);
                return read.entries(after, limit, &self.recent);
            };
            let durable = state.watermark.borrow().seq;
            if after >= durable {
                return Ok(Vec::new());
            }
            let end = durable.min(after.saturating_add(limit as Seq)) as usize;
            let locs = state.locs[after as usize..end].to_vec();
            // A read usually spans one segment, rarely two: a short list,
            // not a map, per read.
            let mut files: Vec<(SegmentNo, Arc<File>)> = Vec::new();
            for loc in &locs {
                if !files.iter().any(|(no, _)| *no == loc.segment) {
                    if let Some(f) = inner.files.get(&loc.segment) {
                        files.push((loc.segment, f.clone()));
                    }
                }
            }
            (locs, files)
        };
        // Outside the lock: a read of a deleted segment still works on the
        // open file, and writers never wait for readers' I/O.
        let file_of = |segment| {
            files
                .iter()
                .find(|(no, _)| *no == segment)
                .map(|(_, f)| f.clone())
        };
        read_locs(file_of, after + 1, &locs)
    }

    async fn subscribe(&self, stream: StreamId) -> Subscription {
        match self.watermark(stream) {
            Ok(whole) => whole.subscribe(),
            // Nothing will move: a closed channel saying where it ended.
            Err(ended) => watch::Sender::new(ended).subscribe(),
        }
    }

    fn peek(&self, stream: StreamId) -> Option<Watermark> {
        Some(match self.watermark(stream) {
            Ok(whole) => *whole.borrow(),
            Err(ended) => ended,
        })
    }

    fn set_retained_bound(&self, max: usize) {
        self.bound.set(max);
    }

    fn released_early(&self) -> u64 {
        self.bound.released()
    }

    fn retained_count(&self) -> Option<usize> {
        Some(self.lock().index.retired.len())
    }

    fn observe_flushes(&self, observer: FlushObserver) {
        self.commit.observe(observer);
    }

    fn flush_failed(&self) -> bool {
        self.commit.failed()
    }

    fn health(&self) -> std::result::Result<(), String> {
        self.commit.health()
    }
}
