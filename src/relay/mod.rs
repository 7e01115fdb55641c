//! The write path: carries one upstream response into its stream in the log,
//! and ends the stream with the truth — completed, cancelled, or failed with
//! a JSON-RPC error entry for every request left unanswered, never silence.
//!
//! A relay runs as its own task, detached from the client connection that
//! caused it: under the legacy protocols a client disconnect is not
//! cancellation, so the upstream keeps running and its output keeps being
//! logged for the client to replay. Relays stop when their stream ends or
//! their session does. Nothing here writes to clients; readers do that.

mod feed;
mod read;
mod sort;

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::HeaderMap;

use crate::config::LimitsConfig;
use crate::dialect;
use crate::jsonrpc::RequestId;
use crate::session::{Session, Sessions};
use crate::store::{StreamKind, StreamMeta, StreamStatus, UpstreamMark};
use crate::stream::Log;
use crate::traces::Exchange;
use crate::upstream::http::{HttpUpstream, Messages};
use crate::upstream::ingest::{self, Batch, Recorded};
use crate::upstream::replicas::Binding;
use feed::{Fed, Feed};
use read::{Reading, Source};
use sort::Sorter;

/// Entries of a stream read back after a restart to learn the latest
/// progress it holds per token (progress makes up most of a stream).
const TAIL_READ_BACK: u64 = 64;

/// Why a stream failed when its upstream stream ended without the answer.
const ENDED_EARLY: &str = "upstream ended the stream before responding";

/// Why a stream failed when a restarted proxy could not resume it.
pub const NOT_RESUMED: &str =
    "the proxy restarted while the upstream was answering this request, and the upstream could not be resumed; its outcome is unknown";

/// Why a stream failed when the upstream no longer knew its session.
const SESSION_LOST: &str =
    "the upstream lost the session (it restarted?) while answering this request; its outcome is unknown";

pub struct Relay {
    pub log: Arc<Log>,
    pub sessions: Arc<Sessions>,
    pub upstream: Arc<HttpUpstream>,
    pub session: Arc<Session>,
    /// Shared with the handler that answers the client from it.
    pub stream: Arc<StreamMeta>,
    /// The client's end-to-end headers, reused to resume upstream (with
    /// tracing on, `traceparent` names `trace`).
    pub client_headers: Arc<HeaderMap>,
    pub limits: LimitsConfig,
    /// The span of the exchange this relay carries on (tracing on): ended
    /// when the relay is dropped; upstream resumes are its events.
    pub trace: Option<Box<Exchange>>,
}

impl Relay {
    /// The same relay, carrying on the exchange `trace` spans.
    pub fn traced(self, trace: Option<Box<Exchange>>) -> Self {
        Self { trace, ..self }
    }

    /// Logs every message of `messages` and then finishes the stream.
    pub fn run(self, messages: Messages) -> impl Future<Output = ()> + Send + 'static {
        // Boxed before the future is made (see "Memory per open stream" in
        // the crate docs): by value they cost an open stream about 5 KiB.
        let pending = self.stream.origin_ids.iter().cloned().collect();
        let reading = Reading::new(Replayed::default(), Sorter::new(&self.stream, pending));
        Box::new(self).supervise(Source::Open(Box::new(messages)), Box::new(reading))
    }

    /// Carries on a stream a previous process was relaying when it died:
    /// re-attaches to the upstream after the last event it logged, skips
    /// the replay of entries logged after that mark, and fails the stream
    /// (never silence) when the upstream cannot be resumed.
    pub fn resume_after_restart(
        self,
        mark: UpstreamMark,
    ) -> impl Future<Output = ()> + Send + 'static {
        Box::new(self).carry_on(mark)
    }

    /// [`Relay::resume_after_restart`], on the boxed relay.
    async fn carry_on(self: Box<Self>, mark: UpstreamMark) {
        let from = mark.seq.saturating_sub(TAIL_READ_BACK);
        let logged = (self.log.store())
            .read_after(self.stream.id, from, usize::MAX)
            .await;
        let answered = self.log.answered(self.stream.id).await;
        let (Ok(logged), Ok(answered)) = (logged, answered) else {
            tracing::error!(stream = %self.stream.id, "cannot read a stream to resume it");
            // Never silence: the stream fails now, or as soon as the log
            // takes the ending (it is owed until then).
            let _ = self.log.fail_unanswered(&self.stream, NOT_RESUMED).await;
            return self.release();
        };
        let pending = self
            .stream
            .origin_ids
            .iter()
            .filter(|id| !answered.contains(*id))
            .cloned()
            .collect();
        // Not kept in this future's state for the rest of the stream.
        drop(answered);
        // What the previous run logged teaches the sorter which progress is
        // old news; what it logged after the mark is skipped when replayed.
        let mut sorter = Sorter::new(&self.stream, pending);
        for entry in &logged {
            sorter.logged(&entry.message);
        }
        let replayed = Replayed(
            (logged.into_iter())
                .filter(|e| e.seq > mark.seq)
                .map(|e| e.message)
                .collect(),
        );
        let reading = Reading::new(replayed, sorter);
        self.supervise(Source::Resume(mark.event_id), Box::new(reading))
            .await
    }

    async fn supervise(self: Box<Self>, source: Source, reading: Box<Reading>) {
        let session = self.session.clone();
        let id = self.stream.id;
        tokio::select! {
            _ = self.pump(source, reading) => {}
            _ = session.ended.cancelled() => {
                tracing::debug!(stream = %id, "session ended; relay stopped");
            }
        }
        // However the relay ended (its stream finished, or the session did),
        // the session forgets the stream here, once.
        self.release();
    }

    /// Reads the upstream and writes the log concurrently: while one batch
    /// waits for its flush, the next one accumulates, so a fast upstream costs
    /// a flush per batch rather than per message. (hyper reads a response
    /// body only as fast as it is polled, so reading must not wait on the log.)
    /// Once the writing half is done the stream is over, and the reading
    /// half stops too, even in the middle of a wait on a silent upstream.
    async fn pump(&self, source: Source, reading: Box<Reading>) {
        let queue = feed::Queue::default();
        let (feeder, fed) = feed::ends(&queue);
        let strays = self.session.open_inlet(self.stream.id);
        let read = self.read_upstream(source, reading, strays, feeder);
        let write = self.write_log(fed);
        tokio::pin!(read, write);
        tokio::select! {
            _ = &mut write => {}
            _ = &mut read => write.await,
        }
    }

    /// The writing half: appends whatever has been read since the last
    /// flush as one batch, and finishes the stream.
    async fn write_log(&self, mut fed: Fed<'_>) {
        let learn_version = self.stream.method.as_deref() == Some("initialize");
        while let Some(first) = fed.recv().await {
            let (mut batch, mut ended) = match first {
                Feed::Messages(batch) => (batch, None),
                Feed::Ended { pending, why } => (Batch::default(), Some((pending, why))),
            };
            while !batch.complete && ended.is_none() {
                match fed.try_recv() {
                    Some(Feed::Messages(more)) => batch.extend(more),
                    Some(Feed::Ended { pending, why }) => ended = Some((pending, why)),
                    None => break,
                }
            }
            if learn_version {
                for message in &batch.messages {
                    self.sessions
                        .learn_initialize(&self.session, message, dialect::kept_after_initialize)
                        .await;
                }
            }
            let complete = batch.complete;
            let recorded =
                ingest::record(&self.log, &self.limits, &self.session, &self.stream, batch).await;
            match recorded {
                Recorded::Appended => {}
                Recorded::Ended(why) => {
                    // The stream ended with an error entry; the upstream
                    // must stop working for nobody.
                    self.cancel_upstream(why).await;
                    return;
                }
                Recorded::Lost => return,
            }
            if complete {
                return;
            }
            if let Some((pending, why)) = ended {
                let status = if self.stream.kind == StreamKind::Standalone || pending.is_empty() {
                    StreamStatus::Completed
                } else {
                    StreamStatus::Failed
                };
                return self.finish(status, &pending, why).await;
            }
        }
    }

    /// Tells the upstream to stop working on the stream's requests (never
    /// an `initialize`, which must not be cancelled).
    pub fn cancel_upstream<'a>(&'a self, why: &'a str) -> BoxFuture<'a, ()> {
        // Boxed: rare and large (see "Memory per open stream", crate docs).
        Box::pin(self.cancel_upstream_inner(why))
    }

    async fn cancel_upstream_inner(&self, why: &str) {
        if self.stream.kind != StreamKind::Request
            || self.stream.method.as_deref() == Some("initialize")
        {
            return;
        }
        let to = Binding::of(&self.session);
        for id in &self.stream.origin_ids {
            self.upstream
                .cancel(&self.client_headers, &to, id, why)
                .await;
        }
    }

    async fn finish(&self, status: StreamStatus, pending: &HashSet<RequestId>, why: &str) {
        // The client may have cancelled the request meanwhile (the proxy marks
        // the stream when it forwards `notifications/cancelled`).
        let cancelled = self
            .log
            .meta(self.stream.id)
            .await
            .ok()
            .flatten()
            .is_some_and(|m| m.status == StreamStatus::Cancelled);
        let status = if cancelled && status == StreamStatus::Failed {
            StreamStatus::Cancelled
        } else {
            status
        };
        let finished = if status == StreamStatus::Failed {
            self.log.fail(&self.stream, pending, why).await
        } else {
            self.log.finish(self.stream.id, status).await
        };
        if let Err(e) = finished {
            tracing::error!(stream = %self.stream.id, error = %e, "cannot finish stream");
        }
    }

    /// Forgets what the session tracked for this stream once it ended.
    fn release(&self) {
        self.session.release(&self.stream);
        if self.stream.kind == StreamKind::Standalone {
            self.session.clear_standalone(self.stream.id);
        }
    }
}

/// Entries a previous process logged after its last upstream mark (a crash
/// inside the write that carried them): the resumed upstream sends them
/// again, and they are recognised by their bytes, in order, and skipped.
#[derive(Default)]
struct Replayed(VecDeque<Bytes>);

impl Replayed {
    fn skip(&mut self, batch: &mut Vec<Bytes>) {
        if self.0.is_empty() {
            return;
        }
        batch.retain(|message| {
            if self.0.front() == Some(message) {
                self.0.pop_front();
                false
            } else {
                true
            }
        });
    }
}
