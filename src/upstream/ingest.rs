//! What an upstream says, made fit for the log — the one step HTTP relays and
//! the stdio demultiplexer share before anything is appended:
//!
//! - messages in the namespaces the proxy authors itself
//!   (`notifications/requests/…`, `notifications/stream/…`) are dropped: an
//!   upstream must not speak for the proxy;
//! - progress naming no live request of the session is dropped (seed 004:
//!   only tokens of active requests; a late one must not land elsewhere);
//! - a stream past its caps coalesces progress of one token to the latest,
//!   and one that still overflows ends with a JSON-RPC error entry — its
//!   neighbours are untouched;
//! - server-to-client requests and the outcome of the final response are
//!   noted on the stream, so status answers stay O(1).
//!
//! Appending failures end the stream with an error entry when the log still
//! can: a stream never goes silent.
//!
//! It owns only this step: it does not read from an upstream (`http.rs`,
//! `stdio.rs` and the relay do) and does not decide which stream a message
//! belongs to (the relay's sorting and the stdio demultiplexer do).

use bytes::Bytes;

use crate::config::LimitsConfig;
use crate::jsonrpc::{self, Kind};
use crate::session::Session;
use crate::store::{
    Along, Caps, Change, Finish, Outcome, StoreError, StreamKind, StreamMeta, StreamStatus,
};
use crate::stream::{keep_latest_progress, Log};

/// What became of a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Appended (possibly fewer messages than given, after filtering).
    Appended,
    /// The stream is over and must not be appended to again: it overflowed
    /// its caps, or the log refused the batch (the stream ended with an error
    /// entry if the log allowed).
    Ended(&'static str),
    /// Another instance took the stream over (this one's lease had run
    /// out): it carries on the request upstream, so this writer stops
    /// without a word — no error entry, no cancellation.
    Lost,
}

/// Why a stream's upstream request should be cancelled.
pub const OVERFLOWED: &str = "the stream exceeded the proxy's per-stream limits";

/// What one batch holds, as the stream's status needs it.
#[derive(Default)]
struct Noted {
    /// Index of the last server-to-client request in the batch.
    last_request: Option<usize>,
    /// Outcome of the last response in the batch.
    outcome: Option<Outcome>,
}

/// What one read from an upstream gave for a stream.
#[derive(Debug, Default)]
pub struct Batch {
    /// Upstream messages, in order.
    pub messages: Vec<Bytes>,
    /// They answer the stream's last request: the stream ends with them.
    pub complete: bool,
    /// The upstream's SSE event id they ended at, when it gives ids: logged
    /// with them, so a restarted proxy can resume the upstream from there.
    pub upstream_event: Option<String>,
}

impl Batch {
    pub fn new(messages: Vec<Bytes>, complete: bool) -> Self {
        Self {
            messages,
            complete,
            upstream_event: None,
        }
    }

    /// Takes in the next batch read while this one waited for the log.
    pub fn extend(&mut self, next: Batch) {
        self.messages.extend(next.messages);
        self.complete = next.complete;
        if next.upstream_event.is_some() {
            self.upstream_event = next.upstream_event;
        }
    }
}

/// Appends what the upstream sent for `stream` — finishing it as completed
/// when the batch is `complete` — after the rules above.
pub async fn record(
    log: &Log,
    limits: &LimitsConfig,
    session: &Session,
    stream: &StreamMeta,
    batch: Batch,
) -> Recorded {
    let Batch {
        messages,
        complete,
        upstream_event,
    } = batch;
    let (mut batch, mut noted) = admit(session, stream, messages);
    if !complete && upstream_event.is_none() && batch.is_empty() {
        return Recorded::Appended;
    }
    let along = |noted: &Noted| Along {
        upstream_event: upstream_event.as_deref(),
        end: complete.then(|| {
            let outcome = noted.outcome.or(Some(Outcome::Result));
            Finish::new(StreamStatus::Completed, outcome)
        }),
        caps: (stream.kind == StreamKind::Request).then_some(Caps {
            entries: limits.stream_max_entries,
            bytes: limits.stream_max_bytes,
        }),
    };
    let logged = match log.write(stream.id, &batch, along(&noted)).await {
        // Rare: the batch changed, note it again.
        Err(StoreError::OverCaps(_)) => match coalesce(log, stream, &mut batch).await {
            Ok(()) => {
                noted = note(&batch);
                log.write(stream.id, &batch, along(&noted)).await
            }
            Err(e) => Err(e),
        },
        logged => logged,
    };
    // The failures are boxed: rare, and the largest states of this future
    // (see "Memory per open stream" in the crate docs).
    let last = match logged {
        Ok(last) => last,
        Err(StoreError::OverCaps(_)) => return Box::pin(fail(log, stream, OVERFLOWED)).await,
        Err(e) => return Box::pin(failed_append(log, stream, e)).await,
    };
    if let Some(i) = noted.last_request {
        let seq = last + 1 + i as u64 - batch.len() as u64;
        if let Err(e) = log
            .store()
            .update_stream(stream.id, Change::Request(seq))
            .await
        {
            tracing::warn!(stream = %stream.id, error = %e, "cannot note a server request");
        }
    }
    Recorded::Appended
}

/// Drops what must not reach the log, and notes what the rest holds — one
/// look at each message.
fn admit(session: &Session, stream: &StreamMeta, batch: Vec<Bytes>) -> (Vec<Bytes>, Noted) {
    let mut noted = Noted::default();
    let mut kept = Vec::with_capacity(batch.len());
    for message in batch {
        let Ok(envelope) = jsonrpc::classify(&message) else {
            kept.push(message); // batches and the like: relayed as they came
            continue;
        };
        let method = envelope.method.as_deref().unwrap_or_default();
        if envelope.kind == Kind::Notification && authored_by_proxy(method) {
            tracing::warn!(stream = %stream.id, method, "upstream spoke in the proxy's namespace; dropped");
            continue;
        }
        if method == "notifications/progress" {
            let live = jsonrpc::progress_token(&message)
                .is_some_and(|t| session.progress_stream(&t).is_some());
            if !live {
                tracing::debug!(stream = %stream.id, "progress for no live request dropped");
                continue;
            }
        }
        noted.see(kept.len(), &envelope);
        kept.push(message);
    }
    (kept, noted)
}

/// Makes a batch the store refused at the stream's caps smaller: progress
/// in it is coalesced per token to the latest, and the stream is marked
/// as coalescing (once). Whether it fits now is the store's call again.
async fn coalesce(
    log: &Log,
    stream: &StreamMeta,
    batch: &mut Vec<Bytes>,
) -> Result<(), StoreError> {
    keep_latest_progress(batch, |m| m);
    let marked = log.meta(stream.id).await?.is_some_and(|m| m.coalesced);
    if !marked {
        log.store()
            .update_stream(stream.id, Change::Coalesced)
            .await?;
    }
    Ok(())
}

impl Noted {
    /// Notes message `i` of the batch.
    fn see(&mut self, i: usize, envelope: &jsonrpc::Envelope) {
        match envelope.kind {
            Kind::Request => self.last_request = Some(i),
            Kind::Response => {
                self.outcome = Some(if envelope.error {
                    Outcome::Error
                } else {
                    Outcome::Result
                })
            }
            Kind::Notification => {}
        }
    }
}

fn note(batch: &[Bytes]) -> Noted {
    let mut noted = Noted::default();
    for (i, message) in batch.iter().enumerate() {
        if let Ok(envelope) = jsonrpc::classify(message) {
            noted.see(i, &envelope);
        }
    }
    noted
}

/// Ends a stream that must not grow: an error entry for every request the
/// log holds no answer to.
async fn fail(log: &Log, stream: &StreamMeta, why: &'static str) -> Recorded {
    if let Err(e) = log.fail_unanswered(stream, why).await {
        tracing::error!(stream = %stream.id, error = %e, "cannot end stream with an error entry");
    }
    Recorded::Ended(why)
}

async fn failed_append(log: &Log, stream: &StreamMeta, e: StoreError) -> Recorded {
    if matches!(e, StoreError::NotOwner(_)) {
        tracing::warn!(stream = %stream.id, "another instance took the stream over; this relay stops");
        return Recorded::Lost;
    }
    if matches!(e, StoreError::NoSuchStream(_)) {
        // Deleted under us (abandoned, session ended): nobody will read it.
        tracing::debug!(stream = %stream.id, "stream gone; upstream messages dropped");
        return Recorded::Ended("the stream is gone");
    }
    tracing::error!(stream = %stream.id, error = %e, "cannot log upstream messages; ending the stream");
    fail(
        log,
        stream,
        "the proxy could not record the upstream's answer",
    )
    .await
}

/// Upstream messages the proxy authors itself (the resumable-request and
/// stream dialects' notifications): an upstream that sends them would speak
/// for the proxy, so they are dropped before the log. Named here, where
/// they are dropped, so that the upstreams need not know the dialects.
fn authored_by_proxy(method: &str) -> bool {
    method.starts_with("notifications/requests/") || method.starts_with("notifications/stream/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(token: &str, n: u32) -> Bytes {
        Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{token}","progress":{n}}}}}"#
        ))
    }

    /// A log on a fresh journal, and a session minted in it.
    struct Fixture {
        _dir: tempfile::TempDir,
        log: std::sync::Arc<Log>,
        _sessions: std::sync::Arc<crate::session::Sessions>,
        session: std::sync::Arc<Session>,
    }

    fn journal_session() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store =
            crate::store::journal::Journal::open(dir.path(), crate::store::commit::SyncMode::Never)
                .unwrap();
        let log = Log::new(store.clone());
        let sessions = crate::session::Sessions::new(store);
        let session = sessions
            .mint("/mcp", "p".into(), b"{}", Vec::new())
            .expect("a place");
        Fixture {
            _dir: dir,
            log,
            _sessions: sessions,
            session,
        }
    }

    #[tokio::test]
    async fn progress_for_no_live_request_is_dropped_before_the_log() {
        let Fixture { session, .. } = &journal_session();
        let mut stream = crate::store::contract::meta(session.id);
        stream.progress = vec!["\"a\"".into()];
        session.track(&stream);
        let spoof = Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/stream/end","params":{"streamId":"x"}}"#,
        );
        let (kept, _) = admit(
            session,
            &stream,
            vec![progress("a", 1), progress("b", 1), spoof],
        );
        assert_eq!(kept, vec![progress("a", 1)]);
        session.release(&stream);
        assert!(admit(session, &stream, vec![progress("a", 2)]).0.is_empty());
    }

    #[tokio::test]
    async fn a_batch_past_the_caps_is_logged_with_its_progress_coalesced_when_that_fits() {
        let Fixture { log, session, .. } = &journal_session();
        let mut meta = crate::store::contract::meta(session.id);
        meta.origin_ids = vec![jsonrpc::RequestId("1".into())];
        meta.progress = vec!["\"a\"".into()];
        let stream = log.open(meta).await.unwrap();
        session.track(&stream);
        let limits = LimitsConfig {
            stream_max_entries: 3,
            ..LimitsConfig::default()
        };
        let answer = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        let mut messages: Vec<Bytes> = (1..=4).map(|n| progress("a", n)).collect();
        messages.push(answer.clone());
        let batch = Batch {
            messages,
            complete: true,
            upstream_event: None,
        };
        let recorded = record(log, &limits, session, &stream, batch).await;
        assert_eq!(recorded, Recorded::Appended);
        let logged = log.store().read_after(stream.id, 0, 10).await.unwrap();
        let logged: Vec<Bytes> = logged.into_iter().map(|e| e.message).collect();
        assert_eq!(logged, vec![progress("a", 4), answer]);
        let meta = log.meta(stream.id).await.unwrap().unwrap();
        assert!(
            meta.coalesced,
            "readers are told to skip superseded progress"
        );
        assert_eq!(
            (meta.status, meta.outcome),
            (StreamStatus::Completed, Some(Outcome::Result))
        );
    }

    #[test]
    fn upstream_messages_in_the_proxys_namespaces_are_recognised() {
        assert!(authored_by_proxy("notifications/requests/resumePolicy"));
        assert!(authored_by_proxy("notifications/stream/end"));
        assert!(!authored_by_proxy("notifications/progress"));
        assert!(!authored_by_proxy("requests/getStatus"));
    }

    #[test]
    fn coalescing_keeps_the_latest_progress_of_each_token_in_order() {
        let other = Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#,
        );
        let mut batch = vec![
            progress("a", 1),
            progress("b", 1),
            other.clone(),
            progress("a", 2),
            progress("a", 3),
        ];
        keep_latest_progress(&mut batch, |m| m);
        assert_eq!(batch, vec![progress("b", 1), other, progress("a", 3)]);
    }

    #[test]
    fn responses_note_their_outcome_and_requests_their_place() {
        let batch = [
            progress("a", 1),
            Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":9,"method":"sampling/createMessage","params":{}}"#,
            ),
            Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"x"}}"#),
        ];
        let noted = note(&batch);
        assert_eq!(noted.last_request, Some(1));
        assert_eq!(noted.outcome, Some(Outcome::Error));
    }
}
