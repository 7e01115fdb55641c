//! The demo upstream's `session_wide_replay` mode: resumption the way the
//! reference server `@modelcontextprotocol/server-everything` does it (its
//! `InMemoryEventStore` behind the TypeScript SDK's
//! `StreamableHTTPServerTransport`), so that the proxy can be tested against
//! a widely copied server that gets it wrong.
//!
//! This module owns the session's [`Journal`] — every event of every stream
//! of the session (POST streams, priming events, the standalone stream) in
//! the order it was logged, under random UUIDs that say nothing about the
//! stream — and [`replay`], the answer to GET + `Last-Event-ID`: everything
//! journaled after the named id, whichever stream it belongs to, then a
//! response that stays open and silent. The SDK files that response under
//! the last id it replayed instead of a stream id, so nothing live is ever
//! written to it; the tools keep running and logging all the same, and
//! asking again with the newest id gets what they said since.
//!
//! The per-stream [`StreamLog`](super::stream_log::StreamLog)s still serve
//! the live POST and standalone streams; they take their ids from here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};

use crate::reply::sse;
use crate::reply::{self, Body};

/// How often an idle standalone GET stream gets a comment, so that
/// intermediaries do not time the connection out.
pub(crate) const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(15);

/// What the SDK stores for a priming event, and so what a replay sends for
/// one: a message event with data `{}` (live it had empty data).
const PRIMING: &[u8] = b"{}";

/// One session's events, all streams together, in the order they were
/// logged; never pruned (the SDK's in-memory store is not either).
pub(crate) struct Journal {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// `(id, data as a replay sends it)`.
    events: Vec<(String, Bytes)>,
    /// Open replays by the key the SDK files them under (the last id they
    /// replayed), each with its number and the switch that ends it when
    /// dropped: filing a second replay under the same key ends the first.
    replays: HashMap<String, (u64, oneshot::Sender<()>)>,
    next_replay: u64,
    /// The session was deleted: its replays are over.
    closed: bool,
}

impl Journal {
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section is one push, lookup or map update.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Journals one event (`None`: a priming event) and returns its id.
    pub(crate) fn record(&self, data: Option<&Bytes>) -> String {
        let data = data.cloned().unwrap_or_else(|| Bytes::from_static(PRIMING));
        let mut inner = self.lock();
        let id = mint();
        inner.events.push((id.clone(), data));
        id
    }

    /// Ends every open replay (the session was deleted).
    pub(crate) fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.replays.clear();
    }

    /// Everything after `last` (nothing when `last` is unknown), and the
    /// replay filed under its key: the last id replayed, else `last`.
    fn start_replay(&self, last: &str) -> Replay {
        let mut inner = self.lock();
        let events = match inner.events.iter().position(|(id, _)| id == last) {
            Some(at) => inner.events[at + 1..].to_vec(),
            None => Vec::new(),
        };
        let key = events.last().map_or(last, |(id, _)| id.as_str()).to_owned();
        let number = inner.next_replay;
        inner.next_replay += 1;
        let (switch, ended) = oneshot::channel();
        if !inner.closed {
            // Replaces (and so ends) a replay already filed under this key.
            inner.replays.insert(key.clone(), (number, switch));
        }
        Replay {
            events,
            key,
            number,
            ended,
        }
    }

    /// Forgets a replay that ended, unless a later one took its key.
    fn finish_replay(&self, key: &str, number: u64) {
        let mut inner = self.lock();
        if inner.replays.get(key).is_some_and(|(n, _)| *n == number) {
            inner.replays.remove(key);
        }
    }
}

struct Replay {
    events: Vec<(String, Bytes)>,
    key: String,
    number: u64,
    /// Resolves (with an error) when the replay is to end.
    ended: oneshot::Receiver<()>,
}

/// The body of the answer to GET + `Last-Event-ID: last`: every event
/// journaled after `last`, then silence (keep-alive comments only) until the
/// client goes, a later replay takes the same key, or the session is deleted.
pub(crate) fn replay(journal: Arc<Journal>, last: &str) -> Body {
    let (tx, body) = reply::streamed(16);
    let mut replay = journal.start_replay(last);
    tokio::spawn(async move {
        let mut out = BytesMut::new();
        for (id, data) in &replay.events {
            sse::encode_event(&mut out, Some(id), data);
        }
        if out.is_empty() || tx.send(out.freeze()).await.is_ok() {
            stay_silent(&tx, &mut replay.ended).await;
        }
        journal.finish_replay(&replay.key, replay.number);
    });
    body
}

/// Holds a response open with nothing but keep-alive comments, every 15 s
/// like the SDK.
async fn stay_silent(tx: &mpsc::Sender<Bytes>, ended: &mut oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            _ = &mut *ended => return,
            () = tx.closed() => return,
            () = tokio::time::sleep(KEEP_ALIVE_EVERY) => {
                if tx.send(Bytes::from_static(sse::KEEP_ALIVE)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A random (version 4) UUID, as the SDK's `randomUUID()`.
fn mint() -> String {
    let mut raw = *crate::id::StreamId::random().as_bytes();
    raw[6] = (raw[6] & 0x0f) | 0x40;
    raw[8] = (raw[8] & 0x3f) | 0x80;
    let hex = crate::id::hex(&raw);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_version_4_uuids() {
        let journal = Journal::new();
        let id = journal.record(None);
        let parts: Vec<&str> = id.split('-').collect();
        let lengths: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        assert_eq!(lengths, [8, 4, 4, 4, 12], "{id}");
        assert!(id.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()));
        assert!(parts[2].starts_with('4'), "{id}");
        assert_ne!(journal.record(None), id);
    }
}
