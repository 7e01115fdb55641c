//! The reading half of a relay: upstream messages in order, each sorted to
//! the stream it belongs to, and the upstream stream kept going until its
//! request is answered.
//!
//! Upstreams are often only half resumable. A stream cut before its response
//! (or closed early, SEP-1699 polling) is resumed with the upstream's own
//! `Last-Event-ID`. A resumed stream may then replay and stay silent for ever
//! (server-everything's example event store re-attaches nothing live), so a
//! resumed stream that stays silent while its request is unanswered is asked
//! again — closing the previous GET first, one GET per stream — after
//! `resume_poll_ms`, doubling up to `resume_poll_max_ms`, back to the start
//! after any event. Asking again stops with the response, the stream's end
//! elsewhere (cancellation, abandonment), the request deadline, or a refusal.
//!
//! Nothing here writes to the log: batches go to the writing half.

use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::feed::{Feed, Feeder};
use super::sort::{Belongs, Sorter};
use super::{Relay, Replayed, ENDED_EARLY, NOT_RESUMED, SESSION_LOST};
use crate::upstream::ingest::Batch;

use crate::metrics::ResumedAfter;
use crate::session::stray::{Inlet, Stray};
use crate::store::{StreamKind, StreamStatus};
use crate::upstream::http::{carries_messages, within, Messages, UpstreamEvent};
use crate::upstream::replicas::Binding;
use crate::upstream::UpstreamError;
use opentelemetry::KeyValue;

/// Longest pause before reconnecting to an upstream stream, whatever its
/// `retry:` says.
const MAX_RESUME_DELAY: Duration = Duration::from_secs(5);

/// How long a relay the upstream refused for want of a credential waits
/// for its client to come back with one before the stream fails.
const CREDENTIAL_WAIT: Duration = Duration::from_secs(600);

/// Whether a refusal asks for a credential (RFC 9110 401, RFC 6750 403
/// `insufficient_scope` alike): a client with a fresh one can still resume.
fn wants_credentials(status: http::StatusCode) -> bool {
    matches!(
        status,
        http::StatusCode::UNAUTHORIZED | http::StatusCode::FORBIDDEN
    )
}

/// Longest upstream event id the proxy records (longer ones are followed but
/// not logged: a restart then cannot resume that stream).
const MAX_EVENT_ID: usize = 1024;

/// Why a silent stream stopped being asked again: its stream ended while
/// the relay waited (the client cancelled it).
const CANCELLED: &str = "the request was cancelled";

/// Where a relay's upstream messages come from.
pub enum Source {
    /// The response to the request the proxy just forwarded.
    Open(Box<Messages>),
    /// The upstream's stream, to be re-attached after this event id.
    Resume(String),
}

/// What the reading half knows of the upstream stream it follows.
pub struct Reading {
    /// Entries a previous run logged after its last mark (skipped once).
    replayed: Replayed,
    sorter: Sorter,
    /// The newest upstream event id among the stream's own messages: where
    /// a resume starts. Never another stream's id: with a per-stream event
    /// store that would re-attach to the wrong stream.
    mark: Option<String>,
    /// The upstream connection is a resume (a GET), not the POST's answer.
    resumed: bool,
    /// Resumes left before the stream fails; refilled by any event.
    resumes_left: u32,
    /// When a silent resumed stream is asked again, and the pause after.
    poll_at: Instant,
    poll_every: Duration,
    /// When the upstream last said anything (the idle timeout counts from
    /// there, across asks).
    heard_at: Instant,
}

/// What one wait on the upstream gave.
enum Heard {
    Upstream(Vec<UpstreamEvent>),
    /// A message of this stream that arrived on another stream.
    Stray(Stray),
    /// The connection ended cleanly (`None`) or broke.
    Ended(Option<UpstreamError>),
    /// A resumed stream stayed silent until its next ask.
    Silent,
    TimedOut(&'static str),
}

impl Reading {
    pub fn new(replayed: Replayed, sorter: Sorter) -> Self {
        let now = Instant::now();
        Self {
            replayed,
            sorter,
            mark: None,
            resumed: false,
            resumes_left: 0,
            poll_at: now,
            poll_every: Duration::ZERO,
            heard_at: now,
        }
    }

    /// The upstream said something: silence and failed resumes start over.
    fn heard(&mut self, relay: &Relay) {
        let config = &relay.upstream.config;
        self.heard_at = Instant::now();
        self.poll_every = Duration::from_millis(config.resume_poll_ms);
        self.poll_at = self.heard_at + self.poll_every;
        self.resumes_left = config.resume_attempts;
    }

    /// A silent stream was asked again: the next pause is twice as long.
    fn asked(&mut self, relay: &Relay) {
        let cap = Duration::from_millis(relay.upstream.config.resume_poll_max_ms);
        self.poll_every = (self.poll_every * 2).min(cap);
        self.poll_at = Instant::now() + self.poll_every;
    }
}

impl Relay {
    /// Reads the upstream until the stream's requests are answered or the
    /// upstream stream ends for good, feeding the writing half.
    pub(super) async fn read_upstream(
        &self,
        source: Source,
        mut reading: Box<Reading>,
        mut strays: Inlet,
        feed: Feeder<'_>,
    ) {
        reading.heard(self);
        let mut messages = match source {
            Source::Open(messages) => messages,
            Source::Resume(last) => {
                reading.mark = Some(last);
                match self.resume(&mut reading, None, ResumedAfter::Restart).await {
                    Ok(messages) => messages,
                    Err(why) => return self.ended(&reading, why, &feed).await,
                }
            }
        };
        loop {
            let batch = match self.listen(&mut messages, &mut strays, &reading).await {
                Heard::Upstream(events) => self.sort(&mut reading, &messages, events),
                Heard::Stray(stray) => self.welcome(&mut reading, stray),
                Heard::TimedOut(why) => {
                    tracing::info!(stream = %self.stream.id, why, "upstream timed out");
                    self.upstream.went_silent(messages.replica(), why);
                    self.cancel_upstream(why).await;
                    return self.ended(&reading, why, &feed).await;
                }
                Heard::Ended(broke) => {
                    if let Some(e) = &broke {
                        tracing::info!(stream = %self.stream.id, error = %e, "upstream stream broke");
                        self.log.metrics().upstream_error(e);
                    }
                    let resumable = messages.is_sse() && self.stream.kind == StreamKind::Request;
                    let retry_ms = messages.retry_ms;
                    drop(messages);
                    if !resumable || reading.mark.is_none() {
                        return self.ended(&reading, ENDED_EARLY, &feed).await;
                    }
                    match self.resume(&mut reading, retry_ms, ResumedAfter::Cut).await {
                        Ok(next) => messages = next,
                        Err(why) => return self.ended(&reading, why, &feed).await,
                    }
                    continue;
                }
                Heard::Silent => {
                    if let Some(ended) = self.ended_elsewhere().await {
                        // Cancelled: finished so. Finished or deleted by
                        // someone else: nothing to write, and the writing
                        // half ends when this half drops its feed.
                        if let Some(why) = ended {
                            self.ended(&reading, why, &feed).await;
                        }
                        return;
                    }
                    tracing::debug!(stream = %self.stream.id, "resumed upstream stream silent; asking again");
                    reading.asked(self);
                    drop(messages);
                    match self
                        .resume(&mut reading, Some(0), ResumedAfter::Silence)
                        .await
                    {
                        Ok(next) => messages = next,
                        Err(why) => return self.ended(&reading, why, &feed).await,
                    }
                    continue;
                }
            };
            let Some(batch) = batch else { continue };
            let complete = batch.complete;
            if feed.send(Feed::Messages(batch)).await.is_err() || complete {
                return;
            }
        }
    }

    /// Waits for the next thing the upstream (or a sibling stream) says.
    async fn listen(
        &self,
        messages: &mut Messages,
        strays: &mut Inlet,
        reading: &Reading,
    ) -> Heard {
        let (patience, polled) = match self.stream.kind {
            StreamKind::Request => (
                self.upstream
                    .patience(self.stream.created_ms, reading.heard_at.elapsed()),
                reading.resumed,
            ),
            // A standalone stream is quiet by nature.
            StreamKind::Standalone => (None, false),
        };
        tokio::select! {
            next = within(patience, messages.next_batch()) => match next {
                Err(why) => Heard::TimedOut(why),
                Ok(Some(Ok(events))) => Heard::Upstream(events),
                Ok(Some(Err(e))) => Heard::Ended(Some(e)),
                Ok(None) => Heard::Ended(None),
            },
            stray = strays.recv() => Heard::Stray(stray),
            _ = tokio::time::sleep_until(reading.poll_at), if polled => Heard::Silent,
        }
    }

    /// Keeps this stream's own messages of one read, hands other live
    /// streams theirs, and makes a batch of what stays (`None` when nothing
    /// is worth a write).
    fn sort(
        &self,
        reading: &mut Reading,
        messages: &Messages,
        events: Vec<UpstreamEvent>,
    ) -> Option<Batch> {
        reading.heard(self);
        let mut kept = Vec::with_capacity(events.len());
        let mut marked = false;
        if events.is_empty() && !reading.resumed {
            // A priming event on the POST's own answer: its id is this
            // stream's, and worth logging before any message comes.
            reading.mark.clone_from(&messages.priming_id);
            marked = true;
        }
        for event in events {
            match reading.sorter.sort(&self.session, &event) {
                Belongs::Here => {
                    if event.id.is_some() {
                        reading.mark = event.id;
                        marked = true;
                    }
                    kept.push(event.message);
                }
                Belongs::There { stream, otherwise } => {
                    let stray = Stray {
                        event: event.id,
                        message: event.message,
                    };
                    if !self.session.redirect(stream, stray) {
                        self.log.metrics().upstream_dropped(otherwise);
                    }
                }
                Belongs::Nowhere(why) => {
                    tracing::debug!(stream = %self.stream.id, reason = why.as_str(), "upstream message dropped");
                    self.log.metrics().upstream_dropped(why);
                }
            }
        }
        reading.replayed.skip(&mut kept);
        if kept.is_empty() && !marked {
            return None;
        }
        Some(self.batch(reading, kept))
    }

    /// Takes in a message of this stream that another stream's upstream
    /// connection carried, unless it is one this stream already holds.
    fn welcome(&self, reading: &mut Reading, stray: Stray) -> Option<Batch> {
        let event = UpstreamEvent {
            id: stray.event,
            message: stray.message,
        };
        match reading.sorter.welcome(&event) {
            Belongs::Nowhere(why) => {
                self.log.metrics().upstream_dropped(why);
                None
            }
            _ => {
                reading.heard(self);
                Some(self.batch(reading, vec![event.message]))
            }
        }
    }

    /// One batch for the writing half: complete when it answers the last
    /// pending request, and carrying the stream's upstream mark.
    fn batch(&self, reading: &mut Reading, messages: Vec<bytes::Bytes>) -> Batch {
        // The last response in means the stream is complete: the upstream
        // SHOULD end it now, and nothing after it belongs to the client.
        let complete =
            self.stream.kind == StreamKind::Request && reading.sorter.unanswered().is_empty();
        Batch {
            messages,
            complete,
            upstream_event: (reading.mark.clone()).filter(|id| id.len() <= MAX_EVENT_ID),
        }
    }

    /// Tells the writing half the upstream stream is over.
    async fn ended(&self, reading: &Reading, why: &'static str, feed: &Feeder<'_>) {
        let pending = reading.sorter.unanswered().clone();
        let _ = feed.send(Feed::Ended { pending, why }).await;
    }

    /// Whether the stream ended while its upstream was silent: `Some(Some)`
    /// cancelled (the writing half finishes it so), `Some(None)` finished
    /// or deleted by someone else (nothing left to write).
    async fn ended_elsewhere(&self) -> Option<Option<&'static str>> {
        match self.log.meta(self.stream.id).await {
            Ok(Some(meta)) if meta.status.is_live() => None,
            Ok(Some(meta)) if meta.status == StreamStatus::Cancelled => Some(Some(CANCELLED)),
            Ok(_) => Some(None),
            // The log cannot say: keep going, the next ask looks again.
            Err(_) => None,
        }
    }

    /// Reconnects with the stream's upstream mark as `Last-Event-ID`,
    /// waiting as the upstream's `retry:` says (bounded), while attempts are
    /// left. The error is why the stream fails.
    fn resume<'a>(
        &'a self,
        reading: &'a mut Reading,
        retry_ms: Option<u64>,
        after: ResumedAfter,
    ) -> BoxFuture<'a, Result<Box<Messages>, &'static str>> {
        // Boxed: rare and large (see "Memory per open stream", crate docs).
        Box::pin(self.resume_inner(reading, retry_ms, after))
    }

    async fn resume_inner(
        &self,
        reading: &mut Reading,
        retry_ms: Option<u64>,
        after: ResumedAfter,
    ) -> Result<Box<Messages>, &'static str> {
        let Some(last) = reading.mark.clone() else {
            return Err(ENDED_EARLY);
        };
        let delay = Duration::from_millis(retry_ms.unwrap_or(100)).min(MAX_RESUME_DELAY);
        let failed = if after == ResumedAfter::Restart {
            NOT_RESUMED
        } else {
            ENDED_EARLY
        };
        while reading.resumes_left > 0 {
            reading.resumes_left -= 1;
            tokio::time::sleep(delay).await;
            let to = Binding::of(&self.session);
            // Subscribed before the headers are read, so new ones sent
            // meanwhile wake the wait below.
            let changed = self.session.headers_changed();
            // The client's latest headers: its credential may have been
            // refreshed since the call began, or (after a restart) be known
            // only from its return.
            let mut remembered = self.session.remembered_headers();
            let headers = if remembered.is_empty() {
                &self.client_headers
            } else {
                // Their `traceparent` is the client's latest request's: the
                // resume is this relay's exchange.
                if let Some(trace) = &self.trace {
                    trace.stamp(&mut remembered);
                }
                &remembered
            };
            let answer = (self.upstream).resume(headers, &to, &last).await;
            match answer {
                Ok(res) if carries_messages(&res) => {
                    tracing::debug!(stream = %self.stream.id, "resumed upstream stream");
                    self.log.metrics().upstream_resumed(after);
                    if let Some(trace) = &self.trace {
                        let after = KeyValue::new("mcp.proxy.resumed_after", after.as_str());
                        trace.event("mcp.proxy.upstream_resume", vec![after]);
                    }
                    reading.resumed = true;
                    return Ok(Box::new(Messages::new(res)));
                }
                Ok(res) if wants_credentials(res.status()) => {
                    // No credential (a restart forgot it) or an expired one:
                    // the client's next request on the session brings one.
                    tracing::info!(stream = %self.stream.id, status = %res.status(), "upstream wants a credential to resume; waiting for the client");
                    if tokio::time::timeout(CREDENTIAL_WAIT, changed)
                        .await
                        .is_err()
                    {
                        return Err(failed);
                    }
                    reading.resumes_left += 1; // a wait is not a try
                }
                Ok(res) => {
                    // A refusal is an answer: asking again changes nothing.
                    tracing::info!(stream = %self.stream.id, status = %res.status(), "upstream refused to resume its stream");
                    self.log.metrics().upstream_status(res.status());
                    let lost = res.status() == http::StatusCode::NOT_FOUND && to.session.is_some();
                    return Err(if lost { SESSION_LOST } else { failed });
                }
                Err(e) => {
                    tracing::info!(stream = %self.stream.id, error = %e, "cannot resume upstream stream");
                    self.log.metrics().upstream_error(&e);
                }
            }
        }
        Err(failed)
    }
}
