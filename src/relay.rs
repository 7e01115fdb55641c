//! The write path: carries one upstream response into its stream in the log,
//! and ends the stream with the truth — completed, cancelled, or failed with
//! a JSON-RPC error entry for every request left unanswered, never silence.
//!
//! A relay runs as its own task, detached from the client connection that
//! caused it: under the legacy protocols a client disconnect is not
//! cancellation, so the upstream keeps running and its output keeps being
//! logged for the client to replay. Relays stop when their stream ends or
//! their session does. Nothing here writes to clients; readers do that.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::mpsc;

use crate::config::LimitsConfig;
use crate::ingest::{self, Recorded};
use crate::jsonrpc::{self, RequestId};
use crate::metrics::ResumedAfter;
use crate::session::{Session, Sessions};
use crate::store::{StreamKind, StreamMeta, StreamStatus};
use crate::stream::Log;
use crate::upstream::http::{carries_messages, HttpUpstream, Messages};

/// Longest pause before reconnecting to an upstream stream, whatever its
/// `retry:` says.
const MAX_RESUME_DELAY: Duration = Duration::from_secs(5);

/// Batches read ahead of the log at most (backpressure on the upstream).
const FEED_DEPTH: usize = 256;

/// What the reading half of a relay hands the writing half.
enum Feed {
    /// Upstream messages; `complete` when they answer the last request.
    Messages { batch: Vec<Bytes>, complete: bool },
    /// The upstream stream ended (for good) with these requests unanswered.
    Ended { pending: HashSet<RequestId> },
}

pub struct Relay {
    pub log: Arc<Log>,
    pub sessions: Arc<Sessions>,
    pub upstream: Arc<HttpUpstream>,
    pub session: Arc<Session>,
    pub stream: StreamMeta,
    /// The client's end-to-end headers, reused to resume upstream.
    pub client_headers: HeaderMap,
    pub limits: LimitsConfig,
}

impl Relay {
    /// Logs every message of `messages` and then finishes the stream.
    pub async fn run(self, messages: Messages) {
        let session = self.session.clone();
        let id = self.stream.id;
        tokio::select! {
            _ = self.pump(messages) => {}
            _ = session.ended.cancelled() => {
                tracing::debug!(stream = %id, "session ended; relay stopped");
            }
        }
    }

    /// Reads the upstream and writes the log concurrently: while one batch
    /// waits for its flush, the next one accumulates, so a fast upstream costs
    /// a flush per batch rather than per message. (hyper reads a response
    /// body only as fast as it is polled, so reading must not wait on the log.)
    async fn pump(&self, messages: Messages) {
        let (feed, fed) = mpsc::channel(FEED_DEPTH);
        tokio::join!(self.read_upstream(messages, feed), self.write_log(fed));
    }

    /// The reading half: upstream messages in order, resuming the upstream
    /// stream when it is cut before its last response.
    async fn read_upstream(&self, mut messages: Messages, feed: mpsc::Sender<Feed>) {
        let mut pending: HashSet<RequestId> = self.stream.origin_ids.iter().cloned().collect();
        let mut resumes_left = self.upstream.config.resume_attempts;
        loop {
            match messages.next_batch().await {
                Some(Ok(batch)) => {
                    for message in &batch {
                        for id in jsonrpc::response_ids(message) {
                            pending.remove(&id);
                        }
                    }
                    // The last response in means the stream is complete: the
                    // upstream SHOULD end it now, and nothing after it belongs
                    // to the client.
                    let complete = self.stream.kind == StreamKind::Request && pending.is_empty();
                    if feed.send(Feed::Messages { batch, complete }).await.is_err() || complete {
                        return;
                    }
                }
                ended => {
                    if let Some(Err(e)) = &ended {
                        tracing::info!(stream = %self.stream.id, error = %e, "upstream stream broke");
                        self.log.metrics().upstream_error(e);
                    }
                    if self.stream.kind == StreamKind::Request && resumes_left > 0 {
                        if let Some(next) = self.resume_upstream(&messages).await {
                            resumes_left -= 1;
                            messages = next;
                            continue;
                        }
                    }
                    let _ = feed.send(Feed::Ended { pending }).await;
                    return;
                }
            }
        }
    }

    /// The writing half: appends whatever has been read since the last
    /// flush as one batch, and finishes the stream.
    async fn write_log(&self, mut fed: mpsc::Receiver<Feed>) {
        let learn_version = self.stream.method.as_deref() == Some("initialize");
        while let Some(first) = fed.recv().await {
            let (mut batch, mut complete, mut ended) = match first {
                Feed::Messages { batch, complete } => (batch, complete, None),
                Feed::Ended { pending } => (Vec::new(), false, Some(pending)),
            };
            while !complete && ended.is_none() {
                match fed.try_recv() {
                    Ok(Feed::Messages {
                        batch: more,
                        complete: last,
                    }) => {
                        batch.extend(more);
                        complete = last;
                    }
                    Ok(Feed::Ended { pending }) => ended = Some(pending),
                    Err(_) => break,
                }
            }
            if learn_version {
                for message in &batch {
                    self.sessions.learn_version(&self.session, message).await;
                }
            }
            let recorded = ingest::record(
                &self.log,
                &self.limits,
                &self.session,
                &self.stream,
                batch,
                complete,
            )
            .await;
            if let Recorded::Ended(why) = recorded {
                // The stream ended with an error entry; the upstream must
                // stop working for nobody.
                self.cancel_upstream(why).await;
                return self.release();
            }
            if complete {
                return self.release();
            }
            if let Some(pending) = ended {
                let status = if self.stream.kind == StreamKind::Standalone || pending.is_empty() {
                    StreamStatus::Completed
                } else {
                    StreamStatus::Failed
                };
                return self.finish(status, &pending).await;
            }
        }
    }

    async fn cancel_upstream(&self, why: &str) {
        if self.stream.kind != StreamKind::Request {
            return;
        }
        let upstream_session = self.session.upstream_session();
        for id in &self.stream.origin_ids {
            self.upstream
                .cancel(&self.client_headers, upstream_session.as_deref(), id, why)
                .await;
        }
    }

    /// Reconnects with the upstream's own `Last-Event-ID`, when it gave one.
    async fn resume_upstream(&self, cut: &Messages) -> Option<Messages> {
        let last = cut.last_event_id.as_deref()?;
        if !cut.is_sse() {
            return None;
        }
        let delay = cut
            .retry_ms
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_millis(100))
            .min(MAX_RESUME_DELAY);
        tokio::time::sleep(delay).await;
        let upstream_session = self.session.upstream_session();
        match self
            .upstream
            .resume(&self.client_headers, upstream_session.as_deref(), last)
            .await
        {
            Ok(res) if carries_messages(&res) => {
                tracing::debug!(stream = %self.stream.id, "resumed upstream stream");
                self.log.metrics().upstream_resumed(ResumedAfter::Cut);
                Some(Messages::new(res))
            }
            Ok(res) => {
                tracing::info!(stream = %self.stream.id, status = %res.status(), "upstream refused to resume its stream");
                self.log.metrics().upstream_status(res.status());
                None
            }
            Err(e) => {
                tracing::info!(stream = %self.stream.id, error = %e, "cannot resume upstream stream");
                self.log.metrics().upstream_error(&e);
                None
            }
        }
    }

    async fn finish(&self, status: StreamStatus, pending: &HashSet<RequestId>) {
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
            self.log
                .fail(
                    &self.stream,
                    pending,
                    "upstream ended the stream before responding",
                )
                .await
        } else {
            self.log.finish(self.stream.id, status).await
        };
        if let Err(e) = finished {
            tracing::error!(stream = %self.stream.id, error = %e, "cannot finish stream");
        }
        self.release();
    }

    /// Forgets what the session tracked for this stream once it ended.
    fn release(&self) {
        self.session.release(&self.stream);
        if self.stream.kind == StreamKind::Standalone {
            self.session.clear_standalone(self.stream.id);
        }
    }
}
