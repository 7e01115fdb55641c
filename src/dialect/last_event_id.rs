//! The Last-Event-ID dialect: how stock MCP clients (2025-03-26 … 2025-11-25)
//! see a stream — an SSE response whose every event carries an event id, a
//! priming event for clients that understand one, `retry:`, and keep-alive
//! comments while the upstream is silent. A GET with `Last-Event-ID` attaches
//! a reader after that id's entry; everything else is the core's.

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::id::{SessionId, StreamId};
use crate::reply::{self, Body};
use crate::stream::{Next, Reader};
use crate::token::Keyring;

/// How a stream is presented on the wire.
pub struct Presentation {
    pub session: SessionId,
    pub keyring: Keyring,
    /// Send a priming event (id + empty data) first.
    pub priming: bool,
    pub retry_ms: Option<u64>,
    pub keepalive: Duration,
}

/// Why a `Last-Event-ID` cannot be honoured.
#[derive(Debug, PartialEq, Eq)]
pub enum ResumeError {
    /// Not an id this proxy issued in this session (forged, tampered,
    /// another session's, or the stream expired).
    UnknownEventId,
}

/// Opens a client's `Last-Event-ID` in its session.
pub fn open(
    keyring: &Keyring,
    session: SessionId,
    last_event_id: &str,
) -> Result<(StreamId, u64), ResumeError> {
    keyring
        .open_event_id(session, last_event_id)
        .ok_or(ResumeError::UnknownEventId)
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
        primed: false,
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
    primed: bool,
}

impl Serving {
    /// The next bytes for the client; `None` ends the response.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        let stream = self.reader.stream();
        let how = &mut self.how;
        if !self.primed {
            self.primed = true;
            if how.priming {
                let id = how
                    .keyring
                    .event_id(how.session, stream, self.reader.cursor());
                crate::sse::encode_priming(&mut self.out, &id, how.retry_ms.take());
                return Some(self.out.split().freeze());
            }
        }
        match self.reader.next(how.keepalive).await {
            Ok(Next::Entries(entries)) => {
                for entry in &entries {
                    if let Some(ms) = how.retry_ms.take() {
                        crate::sse::encode_retry_field(&mut self.out, ms);
                    }
                    let id = how.keyring.event_id(how.session, stream, entry.seq);
                    crate::sse::encode_event(&mut self.out, Some(&id), &entry.message);
                }
                Some(self.out.split().freeze())
            }
            Ok(Next::Idle) => Some(Bytes::from_static(crate::sse::KEEP_ALIVE)),
            Ok(Next::End(_) | Next::Gone | Next::Replaced) => None,
            Err(e) => {
                tracing::error!(stream = %stream, error = %e, "cannot read stream; closing the client's connection");
                None
            }
        }
    }
}
