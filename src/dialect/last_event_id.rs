//! The Last-Event-ID dialect: how stock MCP clients (2025-03-26 … 2025-11-25)
//! see a stream — an SSE response whose every event carries an event id, a
//! priming event for clients that understand one, `retry:`, and keep-alive
//! comments while the upstream is silent. A GET with `Last-Event-ID` attaches
//! a reader after that id's entry, and is the evidence that moves the
//! stream's acknowledged cursor. What an event id names is read in one place,
//! `Context::after_event`, shared with the seed dialects' POST resumes that
//! carry the header.
//!
//! Every dialect that answers with a stream answers in this framing (the
//! seeds' resumes keep the original event ids), so serving lives here; what a
//! dialect adds to a stream comes in through its [`Presenter`].

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::{Context, Presenter, Refusal};
use crate::access::Visit;
use crate::id::{Seq, SessionId};
use crate::metrics::Replayed;
use crate::reply::{self, Body};
use crate::store::{StreamKind, StreamMeta};
use crate::stream::{Next, Reader};
use crate::token::Keyring;

/// The reconnection delay a draining answer suggests once the configured
/// one was sent: soon, since a restarted or another instance serves it.
const DRAIN_RETRY_MS: u64 = 1_000;

/// What an event adds to its message on the wire: `id: ` and the 51
/// characters of an event id, `event: message`, `data: ` and the line ends.
const FRAMING: usize = 4 + 51 + 1 + 15 + 6 + 2;

/// How a stream is presented on the wire.
pub struct Presentation {
    pub session: SessionId,
    pub keyring: Keyring,
    /// Send a priming event (id + empty data) first.
    pub priming: bool,
    pub retry_ms: Option<u64>,
    pub keepalive: Duration,
    pub presenter: Presenter,
    /// The proxy is shutting down: end with a `retry:` hint.
    pub draining: tokio_util::sync::CancellationToken,
    /// The request this answers, told how the answer ended.
    pub visit: Option<Visit>,
}

/// Where a GET's `Last-Event-ID` resumes: the stream it names and the
/// cursor (naming an entry acknowledges it), or `None` when it names the end
/// of a standalone stream that is over (its upstream GET ended) — the client
/// then continues on the session's current one instead of reconnecting
/// forever to a stream that will never say more.
pub async fn resume(
    cx: &Context<'_>,
    last_event_id: &str,
) -> Result<Option<(StreamMeta, Seq)>, Refusal> {
    let (meta, seq) = cx.after_event(last_event_id, None).await?;
    let exhausted = meta.kind == StreamKind::Standalone
        && !meta.status.is_live()
        && seq >= cx.log.end(meta.id).await;
    if exhausted {
        return Ok(None);
    }
    cx.replayed(Replayed::LastEventId);
    Ok(Some((meta, seq)))
}

/// Streams `reader` to the client as SSE until the stream ends, the client
/// goes away, or another reader takes the stream over.
pub fn serve(reader: Reader, how: Presentation) -> Body {
    // The body is polled by the client connection's own task: an entry made
    // durable wakes that task directly, with no relay task or channel between
    // the log and the socket. Dropping the body (client gone) drops the
    // reader.
    let state = Serving {
        reader,
        how,
        out: BytesMut::new(),
        id: String::new(),
        primed: false,
        ended: false,
    };
    reply::polled(futures_util::stream::unfold(state, |mut s| async move {
        let chunk = s.next_chunk().await?;
        Some((chunk, s))
    }))
}

struct Serving {
    reader: Reader,
    how: Presentation,
    out: BytesMut,
    /// The event id being written, reused for every event of the answer.
    id: String,
    primed: bool,
    ended: bool,
}

impl Serving {
    /// The next bytes for the client; `None` ends the response.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        let stream = self.reader.stream();
        let how = &mut self.how;
        if !self.primed {
            self.primed = true;
            if how.priming {
                let id = how
                    .keyring
                    .event_id(how.session, stream, self.reader.cursor());
                crate::reply::sse::encode_priming(&mut self.out, &id, how.retry_ms.take());
                return Some(self.out.split().freeze());
            }
        }
        let mut wait = how.keepalive;
        if let Some(deadline) = how.presenter.deadline() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return self.interim();
            }
            wait = wait.min(left);
        }
        let next = tokio::select! {
            next = self.reader.next(wait) => next,
            () = self.how.draining.cancelled() => return self.drained(),
        };
        match next {
            Ok(Next::Entries(entries)) => {
                // The whole page is one chunk in one buffer, sized once:
                // grown event by event it was copied over again as it grew.
                let room: usize = entries.iter().map(|e| e.message.len() + FRAMING).sum();
                self.out.reserve(room);
                for entry in entries {
                    let Some(message) = self.how.presenter.entry(entry.message) else {
                        continue;
                    };
                    self.retry_first();
                    self.id.clear();
                    (self.how.keyring).push_event_id(
                        &mut self.id,
                        self.how.session,
                        stream,
                        entry.seq,
                    );
                    crate::reply::sse::encode_event(&mut self.out, Some(&self.id), &message);
                }
                Some(self.out.split().freeze())
            }
            // (At a deadline, the next chunk is the interim.)
            Ok(Next::Idle) => Some(Bytes::from_static(crate::reply::sse::KEEP_ALIVE)),
            Ok(Next::End(_)) => {
                // Not acknowledged: a write that reached the end of the
                // stream is no evidence the client read it (a connection cut
                // after the write loses what was in flight). Only the
                // client's own `Last-Event-ID` is.
                self.ended = true;
                self.reader.wrote_to_end();
                if let Some(visit) = &self.how.visit {
                    visit.note_outcome(self.reader.outcome());
                }
                let closing = self.how.presenter.closing();
                if closing.is_empty() {
                    return None;
                }
                for message in &closing {
                    self.retry_first();
                    crate::reply::sse::encode_event(&mut self.out, None, message);
                }
                Some(self.out.split().freeze())
            }
            Ok(Next::Gone | Next::Replaced) => None,
            Err(e) => {
                tracing::error!(stream = %stream, error = %e, "cannot read stream; closing the client's connection");
                None
            }
        }
    }

    /// Ends the answer with the interim result: the call goes on, and the
    /// client continues it with the token the interim carries.
    fn interim(&mut self) -> Option<Bytes> {
        self.ended = true;
        let interim = self.how.presenter.interim(self.reader.cursor())?;
        self.retry_first();
        crate::reply::sse::encode_event(&mut self.out, None, &interim);
        Some(self.out.split().freeze())
    }

    /// Ends the answer because the proxy shuts down: the client is told
    /// when to reconnect, and reconnects with its last event id (the
    /// entries it has not seen are in the log).
    fn drained(&mut self) -> Option<Bytes> {
        self.ended = true;
        let ms = self.how.retry_ms.take().unwrap_or(DRAIN_RETRY_MS);
        crate::reply::sse::encode_retry_field(&mut self.out, ms);
        self.out.extend_from_slice(b"\n");
        Some(self.out.split().freeze())
    }

    /// `retry:` goes with the first event a client sees.
    fn retry_first(&mut self) {
        if let Some(ms) = self.how.retry_ms.take() {
            crate::reply::sse::encode_retry_field(&mut self.out, ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Presenter;
    use crate::reply::sse::Decoder;
    use crate::store::commit::SyncMode;
    use crate::store::journal::Journal;
    use crate::store::StreamStatus;
    use crate::stream::Log;

    #[tokio::test]
    async fn a_replay_page_is_written_as_one_chunk_with_every_event_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::new(Journal::open(dir.path(), SyncMode::Never).unwrap());
        let session = SessionId::random();
        let meta = log
            .open(crate::store::contract::meta(session))
            .await
            .unwrap();
        let messages: Vec<Bytes> = (0..300)
            .map(|i| Bytes::from(format!("{{\"n\":{i}}}")))
            .collect();
        log.append(meta.id, &messages).await.unwrap();
        log.finish(meta.id, StreamStatus::Completed).await.unwrap();
        let keyring = Keyring::from_secret(&[7; 32]);
        let how = Presentation {
            session,
            keyring: keyring.clone(),
            priming: false,
            retry_ms: None,
            keepalive: Duration::from_secs(5),
            presenter: Presenter::plain(),
            draining: tokio_util::sync::CancellationToken::new(),
            visit: None,
        };
        let mut serving = Serving {
            reader: log.attach(meta.id, 0),
            how,
            out: BytesMut::new(),
            id: String::new(),
            primed: false,
            ended: false,
        };
        let mut per_chunk = Vec::new();
        let mut seq = 0;
        while let Some(chunk) = serving.next_chunk().await {
            let mut decoder = Decoder::new();
            decoder.push(&chunk);
            let mut events = 0;
            while let Some(event) = decoder.next_event() {
                seq += 1;
                events += 1;
                assert_eq!(event.id, Some(keyring.event_id(session, meta.id, seq)));
                assert_eq!(event.data, messages[seq as usize - 1]);
            }
            assert_eq!(decoder.buffered(), 0, "a chunk ends with a whole event");
            per_chunk.push(events);
        }
        // Pages of 256 entries, one chunk each.
        assert_eq!(per_chunk, [256, 44]);
    }
}
