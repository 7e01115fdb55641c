//! A log a test can make unwritable: a journal that, once [`Unwritable::stop`]
//! is called, reports what a journal whose flush failed reports
//! (`flush_failed`, and a `health` that names the failure). Everything else
//! goes to the journal unchanged, writes included: the tests that use it
//! look at what the proxy tells of the failure, not at the refused writes
//! (the group commit's and the journal's own tests cover those).
//!
//! A wrapper, because no journal flush can be made to fail from outside the
//! library short of a failing disk (`tests/faults/failing_disk.sh`, root).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use mcp_resume_proxy::id::{Seq, SessionId, StreamId, TaskId};
use mcp_resume_proxy::jsonrpc::RequestId;
use mcp_resume_proxy::store::commit::{FlushObserver, SyncMode};
use mcp_resume_proxy::store::journal::Journal;
use mcp_resume_proxy::store::{
    Along, Change, Entry, Finish, Prior, ReaderLease, Result, SessionNews, SessionRecord,
    SharedStore, Store, StreamMeta, Subscription, TaskRecord, Watermark,
};

/// What its `health` says once stopped.
pub const WHY: &str = "log not writable: the test stopped it";

pub struct Unwritable {
    inner: SharedStore,
    stopped: AtomicBool,
}

impl Unwritable {
    /// A journal in `dir`, writable until [`Unwritable::stop`].
    pub fn open(dir: &Path) -> Arc<Self> {
        let inner = Journal::open(dir, SyncMode::Batch).expect("journal opens");
        Arc::new(Self {
            inner,
            stopped: AtomicBool::new(false),
        })
    }

    /// From now on it reports a failed flush.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Store for Unwritable {
    fn flush_failed(&self) -> bool {
        self.stopped.load(Ordering::SeqCst) || self.inner.flush_failed()
    }

    fn health(&self) -> std::result::Result<(), String> {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(WHY.to_owned());
        }
        self.inner.health()
    }

    async fn put_session(&self, session: &SessionRecord) -> Result<()> {
        self.inner.put_session(session).await
    }
    async fn get_session(&self, id: SessionId) -> Result<Option<SessionRecord>> {
        self.inner.get_session(id).await
    }
    async fn list_sessions(&self) -> Result<Vec<SessionRecord>> {
        self.inner.list_sessions().await
    }
    async fn sessions_idle_by(
        &self,
        seen_by_ms: u64,
        closed_by_ms: u64,
    ) -> Result<Vec<SessionRecord>> {
        self.inner.sessions_idle_by(seen_by_ms, closed_by_ms).await
    }
    async fn delete_session(&self, id: SessionId) -> Result<()> {
        self.inner.delete_session(id).await
    }
    async fn create_stream(&self, meta: &StreamMeta) -> Result<()> {
        self.inner.create_stream(meta).await
    }
    async fn create_with(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<()> {
        self.inner.create_with(meta, opening).await
    }
    async fn stream_meta(&self, id: StreamId) -> Result<Option<StreamMeta>> {
        self.inner.stream_meta(id).await
    }
    async fn list_streams(&self) -> Result<Vec<StreamMeta>> {
        self.inner.list_streams().await
    }
    async fn streams_of_session(&self, session: SessionId) -> Result<Vec<StreamMeta>> {
        self.inner.streams_of_session(session).await
    }
    async fn set_status(&self, id: StreamId, end: Finish) -> Result<()> {
        self.inner.set_status(id, end).await
    }
    async fn update_stream(&self, id: StreamId, change: Change) -> Result<()> {
        self.inner.update_stream(id, change).await
    }
    async fn delete_stream(&self, id: StreamId) -> Result<()> {
        self.inner.delete_stream(id).await
    }
    async fn stream_of_request(
        &self,
        session: SessionId,
        id: &RequestId,
    ) -> Result<Option<StreamId>> {
        self.inner.stream_of_request(session, id).await
    }
    async fn prior_call(&self, meta: &StreamMeta) -> Result<Option<Prior>> {
        self.inner.prior_call(meta).await
    }
    async fn create_call(&self, meta: &StreamMeta, opening: &[Bytes]) -> Result<Option<Prior>> {
        self.inner.create_call(meta, opening).await
    }
    async fn abandoned_by(&self, now_ms: u64) -> Result<Vec<StreamId>> {
        self.inner.abandoned_by(now_ms).await
    }
    async fn finished_by(&self, at_ms: u64) -> Result<Vec<StreamId>> {
        self.inner.finished_by(at_ms).await
    }
    async fn write(&self, stream: StreamId, messages: &[Bytes], along: Along<'_>) -> Result<Seq> {
        self.inner.write(stream, messages, along).await
    }
    async fn append(&self, stream: StreamId, messages: &[Bytes]) -> Result<Seq> {
        self.inner.append(stream, messages).await
    }
    async fn append_final(&self, stream: StreamId, messages: &[Bytes], end: Finish) -> Result<Seq> {
        self.inner.append_final(stream, messages, end).await
    }
    async fn read_after(&self, stream: StreamId, after: Seq, limit: usize) -> Result<Vec<Entry>> {
        self.inner.read_after(stream, after, limit).await
    }
    async fn subscribe(&self, stream: StreamId) -> Subscription {
        self.inner.subscribe(stream).await
    }
    fn peek(&self, stream: StreamId) -> Option<Watermark> {
        self.inner.peek(stream)
    }
    fn observe_flushes(&self, observer: FlushObserver) {
        self.inner.observe_flushes(observer)
    }
    fn set_retained_bound(&self, max: usize) {
        self.inner.set_retained_bound(max)
    }
    fn released_early(&self) -> u64 {
        self.inner.released_early()
    }
    fn retained_count(&self) -> Option<usize> {
        self.inner.retained_count()
    }
    fn size_on_disk(&self) -> u64 {
        self.inner.size_on_disk()
    }
    async fn flush(&self) -> Result<()> {
        self.inner.flush().await
    }
    async fn orphans(&self) -> Result<Vec<StreamMeta>> {
        self.inner.orphans().await
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    async fn hold_reader(&self, stream: StreamId) -> Result<ReaderLease> {
        self.inner.hold_reader(stream).await
    }
    fn session_changes(&self) -> Option<tokio::sync::broadcast::Receiver<SessionNews>> {
        self.inner.session_changes()
    }
    async fn put_task(&self, task: &TaskRecord) -> Result<()> {
        self.inner.put_task(task).await
    }
    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        self.inner.get_task(id).await
    }
    async fn update_task(&self, task: &TaskRecord) -> Result<bool> {
        self.inner.update_task(task).await
    }
    async fn delete_task(&self, id: TaskId) -> Result<()> {
        self.inner.delete_task(id).await
    }
    async fn tasks_expired_by(&self, now_ms: u64) -> Result<Vec<TaskId>> {
        self.inner.tasks_expired_by(now_ms).await
    }
    async fn retire(&self) -> Result<()> {
        self.inner.retire().await
    }
}
