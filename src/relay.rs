//! The write path: carries one upstream response into its stream in the log,
//! and ends the stream with the truth — completed, cancelled, or failed with
//! a JSON-RPC error entry for every request left unanswered, never silence.
//!
//! A relay runs as its own task, detached from the client connection that
//! caused it: under the legacy protocols a client disconnect is not
//! cancellation, so the upstream keeps running and its output keeps being
//! logged for the client to replay. Relays stop when their stream ends or
//! their session does. Nothing here writes to clients; readers do that.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::mpsc;

use crate::config::LimitsConfig;
use crate::ingest::{self, Batch, Recorded};
use crate::jsonrpc::{self, RequestId};
use crate::metrics::ResumedAfter;
use crate::session::{Session, Sessions};
use crate::store::{StreamKind, StreamMeta, StreamStatus, UpstreamMark};
use crate::stream::Log;
use crate::upstream::http::{carries_messages, within, HttpUpstream, Messages};

/// Longest pause before reconnecting to an upstream stream, whatever its
/// `retry:` says.
const MAX_RESUME_DELAY: Duration = Duration::from_secs(5);

/// Batches read ahead of the log at most (backpressure on the upstream).
const FEED_DEPTH: usize = 256;

/// What the reading half of a relay hands the writing half.
enum Feed {
    /// Upstream messages; `complete` when they answer the last request.
    Messages(Batch),
    /// The upstream stream ended (for good) with these requests unanswered.
    Ended {
        pending: HashSet<RequestId>,
        why: &'static str,
    },
}

/// Why a stream failed when its upstream stream ended without the answer.
const ENDED_EARLY: &str = "upstream ended the stream before responding";

/// Why a stream failed when a restarted proxy could not resume it.
pub const NOT_RESUMED: &str =
    "the proxy restarted while the upstream was answering this request, and the upstream could not be resumed; its outcome is unknown";

/// Why a stream failed when the upstream no longer knew its session.
const SESSION_LOST: &str =
    "the upstream lost the session (it restarted?) while answering this request; its outcome is unknown";

/// Longest upstream event id the proxy records (longer ones are followed but
/// not logged: a restart then cannot resume that stream).
const MAX_EVENT_ID: usize = 1024;

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
        let pending = self.stream.origin_ids.iter().cloned().collect();
        self.supervise(
            Source::Open(Box::new(messages)),
            pending,
            Replayed::default(),
        )
        .await
    }

    /// Carries on a stream a previous process was relaying when it died:
    /// re-attaches to the upstream after the last event it logged, skips
    /// the replay of entries logged after that mark, and fails the stream
    /// (never silence) when the upstream cannot be resumed.
    pub async fn resume_after_restart(self, mark: UpstreamMark) {
        let logged = (self.log.store())
            .read_after(self.stream.id, mark.seq, usize::MAX)
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
        let replayed = Replayed(logged.into_iter().map(|e| e.message).collect());
        self.supervise(Source::Resume(mark.event_id), pending, replayed)
            .await
    }

    async fn supervise(self, source: Source, pending: HashSet<RequestId>, replayed: Replayed) {
        let session = self.session.clone();
        let id = self.stream.id;
        tokio::select! {
            _ = self.pump(source, pending, replayed) => {}
            _ = session.ended.cancelled() => {
                tracing::debug!(stream = %id, "session ended; relay stopped");
            }
        }
    }

    /// Reads the upstream and writes the log concurrently: while one batch
    /// waits for its flush, the next one accumulates, so a fast upstream costs
    /// a flush per batch rather than per message. (hyper reads a response
    /// body only as fast as it is polled, so reading must not wait on the log.)
    async fn pump(&self, source: Source, pending: HashSet<RequestId>, replayed: Replayed) {
        let (feed, fed) = mpsc::channel(FEED_DEPTH);
        tokio::join!(
            self.read_upstream(source, pending, replayed, feed),
            self.write_log(fed)
        );
    }

    /// The reading half: upstream messages in order, resuming the upstream
    /// stream when it is cut before its last response.
    async fn read_upstream(
        &self,
        source: Source,
        mut pending: HashSet<RequestId>,
        mut replayed: Replayed,
        feed: mpsc::Sender<Feed>,
    ) {
        let mut resumes_left = self.upstream.config.resume_attempts;
        let (mut messages, mut why) = match source {
            Source::Open(messages) => (*messages, ENDED_EARLY),
            Source::Resume(last) => {
                match (self.resume_upstream(&last, None, &mut resumes_left, ResumedAfter::Restart))
                    .await
                {
                    Ok(messages) => (messages, ENDED_EARLY),
                    Err(refused) => {
                        let why = refused.unwrap_or(NOT_RESUMED);
                        let _ = feed.send(Feed::Ended { pending, why }).await;
                        return;
                    }
                }
            }
        };
        loop {
            let patience = match self.stream.kind {
                StreamKind::Request => self.upstream.patience(self.stream.created_ms),
                // A standalone stream is quiet by nature.
                StreamKind::Standalone => None,
            };
            let next = match within(patience, messages.next_batch()).await {
                Ok(next) => next,
                Err(why) => {
                    tracing::info!(stream = %self.stream.id, why, "upstream timed out");
                    self.cancel_upstream(why).await;
                    let _ = feed.send(Feed::Ended { pending, why }).await;
                    return;
                }
            };
            match next {
                Some(Ok(mut batch)) => {
                    replayed.skip(&mut batch);
                    for message in &batch {
                        for id in jsonrpc::response_ids(message) {
                            pending.remove(&id);
                        }
                    }
                    // The last response in means the stream is complete: the
                    // upstream SHOULD end it now, and nothing after it belongs
                    // to the client.
                    let complete = self.stream.kind == StreamKind::Request && pending.is_empty();
                    let batch = Batch {
                        messages: batch,
                        complete,
                        upstream_event: messages
                            .last_event_id
                            .clone()
                            .filter(|id| id.len() <= MAX_EVENT_ID),
                    };
                    if feed.send(Feed::Messages(batch)).await.is_err() || complete {
                        return;
                    }
                }
                ended => {
                    if let Some(Err(e)) = &ended {
                        tracing::info!(stream = %self.stream.id, error = %e, "upstream stream broke");
                        self.log.metrics().upstream_error(e);
                    }
                    let resumed = match (&messages.last_event_id, self.stream.kind) {
                        (Some(last), StreamKind::Request) if messages.is_sse() => {
                            self.resume_upstream(
                                last,
                                messages.retry_ms,
                                &mut resumes_left,
                                ResumedAfter::Cut,
                            )
                            .await
                        }
                        _ => Err(None),
                    };
                    match resumed {
                        Ok(next) => messages = next,
                        Err(refused) => {
                            let why = refused.unwrap_or(why);
                            let _ = feed.send(Feed::Ended { pending, why }).await;
                            return;
                        }
                    }
                    why = ENDED_EARLY;
                }
            }
        }
    }

    /// The writing half: appends whatever has been read since the last
    /// flush as one batch, and finishes the stream.
    async fn write_log(&self, mut fed: mpsc::Receiver<Feed>) {
        let learn_version = self.stream.method.as_deref() == Some("initialize");
        while let Some(first) = fed.recv().await {
            let (mut batch, mut ended) = match first {
                Feed::Messages(batch) => (batch, None),
                Feed::Ended { pending, why } => (Batch::default(), Some((pending, why))),
            };
            while !batch.complete && ended.is_none() {
                match fed.try_recv() {
                    Ok(Feed::Messages(more)) => batch.extend(more),
                    Ok(Feed::Ended { pending, why }) => ended = Some((pending, why)),
                    Err(_) => break,
                }
            }
            if learn_version {
                for message in &batch.messages {
                    self.sessions.learn_version(&self.session, message).await;
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
                    return self.release();
                }
                Recorded::Lost => return self.release(),
            }
            if complete {
                return self.release();
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
    pub async fn cancel_upstream(&self, why: &str) {
        if self.stream.kind != StreamKind::Request
            || self.stream.method.as_deref() == Some("initialize")
        {
            return;
        }
        let upstream_session = self.session.upstream_session();
        for id in &self.stream.origin_ids {
            self.upstream
                .cancel(&self.client_headers, upstream_session.as_deref(), id, why)
                .await;
        }
    }

    /// Reconnects with the upstream's own `Last-Event-ID`, waiting as its
    /// `retry:` says (bounded), while attempts are left. An error names the
    /// reason when the upstream's refusal says more than "not resumed".
    async fn resume_upstream(
        &self,
        last: &str,
        retry_ms: Option<u64>,
        attempts_left: &mut u32,
        after: ResumedAfter,
    ) -> Result<Messages, Option<&'static str>> {
        let delay = retry_ms
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_millis(100))
            .min(MAX_RESUME_DELAY);
        while *attempts_left > 0 {
            *attempts_left -= 1;
            tokio::time::sleep(delay).await;
            let upstream_session = self.session.upstream_session();
            match self
                .upstream
                .resume(&self.client_headers, upstream_session.as_deref(), last)
                .await
            {
                Ok(res) if carries_messages(&res) => {
                    tracing::debug!(stream = %self.stream.id, "resumed upstream stream");
                    self.log.metrics().upstream_resumed(after);
                    return Ok(Messages::new(res));
                }
                Ok(res) => {
                    // A refusal is an answer: asking again changes nothing.
                    tracing::info!(stream = %self.stream.id, status = %res.status(), "upstream refused to resume its stream");
                    self.log.metrics().upstream_status(res.status());
                    let lost =
                        res.status() == http::StatusCode::NOT_FOUND && upstream_session.is_some();
                    return Err(lost.then_some(SESSION_LOST));
                }
                Err(e) => {
                    tracing::info!(stream = %self.stream.id, error = %e, "cannot resume upstream stream");
                    self.log.metrics().upstream_error(&e);
                }
            }
        }
        Err(None)
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

/// Where a relay's upstream messages come from.
enum Source {
    /// The response to the request the proxy just forwarded.
    Open(Box<Messages>),
    /// The upstream's stream, to be re-attached after this event id.
    Resume(String),
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
