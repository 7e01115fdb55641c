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
pub fn serve(mut reader: Reader, how: Presentation) -> Body {
    let (tx, body) = reply::streamed(8);
    tokio::spawn(async move {
        let stream = reader.stream();
        let mut out = BytesMut::new();
        // Without a priming event, `retry:` rides on the first real event.
        let mut retry = how.retry_ms;
        if how.priming {
            let id = how.keyring.event_id(how.session, stream, reader.cursor());
            crate::sse::encode_priming(&mut out, &id, retry.take());
            if tx.send(out.split().freeze()).await.is_err() {
                return;
            }
        }
        loop {
            let chunk = match reader.next(how.keepalive).await {
                Ok(Next::Entries(entries)) => {
                    for entry in &entries {
                        if let Some(ms) = retry.take() {
                            crate::sse::encode_retry_field(&mut out, ms);
                        }
                        let id = how.keyring.event_id(how.session, stream, entry.seq);
                        crate::sse::encode_event(&mut out, Some(&id), &entry.message);
                    }
                    out.split().freeze()
                }
                Ok(Next::Idle) => Bytes::from_static(crate::sse::KEEP_ALIVE),
                Ok(Next::End(_) | Next::Gone | Next::Replaced) => return,
                Err(e) => {
                    tracing::error!(stream = %stream, error = %e, "cannot read stream; closing the client's connection");
                    return;
                }
            };
            if tx.send(chunk).await.is_err() {
                // The client went away. The stream stays in the log for the
                // client to resume with Last-Event-ID.
                return;
            }
        }
    });
    body
}
