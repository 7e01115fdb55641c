//! The demo upstream's SSE plumbing: the in-memory per-stream event log that
//! makes its streams resumable, and the pump that copies a log onto an HTTP
//! response (whose body is the proxy's own `reply::Body`).
//!
//! Every POST stream (and a session's standalone GET stream) is a [`StreamLog`].
//! The calls append to the log and never write to a socket themselves, so a
//! response can be cut (SEP-1699 polling) or the client can go away while the
//! call keeps running; a later GET with `Last-Event-ID` simply starts a second
//! pump on the same log further along. (In the `session_wide_replay` mode a
//! log takes its ids from the session's journal, which answers those GETs.)

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, watch};

use super::session_wide_replay::{Journal, KEEP_ALIVE_EVERY};
use crate::reply::sse;

/// One logged event. `data == None` is a priming event (id, empty data).
#[derive(Clone)]
struct LogEvent {
    id: String,
    data: Option<Bytes>,
}

#[derive(Default)]
struct LogInner {
    events: Vec<LogEvent>,
    /// Requests of this stream that have not finished yet.
    pending: usize,
    done: bool,
}

/// The events of one SSE stream, in order, with ids `"{key}-{index}"` (or
/// the journal's, when there is one).
pub(crate) struct StreamLog {
    key: String,
    journal: Option<Arc<Journal>>,
    inner: Mutex<LogInner>,
    /// Bumped on every change so that pumps can wait without polling.
    changed: watch::Sender<()>,
}

impl StreamLog {
    /// A log that is done once `pending` requests have called [`finish_one`].
    /// The standalone GET stream uses `usize::MAX`: it ends only by [`close`].
    /// With a `journal`, every event is also journaled, under the journal's id.
    ///
    /// [`finish_one`]: StreamLog::finish_one
    /// [`close`]: StreamLog::close
    pub(crate) fn new(key: String, pending: usize, journal: Option<Arc<Journal>>) -> Self {
        Self {
            key,
            journal,
            inner: Mutex::new(LogInner {
                pending,
                done: pending == 0,
                ..LogInner::default()
            }),
            changed: watch::channel(()).0,
        }
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogInner> {
        // A panic while holding this lock cannot leave the log half-written
        // (every mutation is a single push or flag), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn append(&self, data: Option<Bytes>) {
        let mut inner = self.lock();
        // Journaled under this log's lock, so the journal holds each
        // stream's events in the stream's own order.
        let id = match &self.journal {
            Some(journal) => journal.record(data.as_ref()),
            None => format!("{}-{}", self.key, inner.events.len()),
        };
        inner.events.push(LogEvent { id, data });
        drop(inner);
        self.changed.send_replace(());
    }

    pub(crate) fn push_priming(&self) {
        self.append(None);
    }

    pub(crate) fn push(&self, message: &serde_json::Value) {
        self.append(Some(Bytes::from(message.to_string())));
    }

    /// One request of the stream is over (answered or cancelled).
    pub(crate) fn finish_one(&self) {
        let mut inner = self.lock();
        inner.pending = inner.pending.saturating_sub(1);
        if inner.pending == 0 {
            inner.done = true;
        }
        drop(inner);
        self.changed.send_replace(());
    }

    /// Ends the stream whatever is still pending (session deleted).
    pub(crate) fn close(&self) {
        self.lock().done = true;
        self.changed.send_replace(());
    }

    /// Number of events logged so far.
    pub(crate) fn len(&self) -> usize {
        self.lock().events.len()
    }

    fn since(&self, cursor: usize) -> (Vec<LogEvent>, bool) {
        let inner = self.lock();
        let events = inner.events.get(cursor..).map(<[_]>::to_vec);
        (events.unwrap_or_default(), inner.done)
    }

    /// Waits until the stream is done, then encodes it (the `buffered_sse`
    /// mode, where the whole body is known before the response starts).
    pub(crate) async fn encode_when_done(&self, opts: &PumpOptions) -> Bytes {
        let mut rx = self.changed.subscribe();
        loop {
            if self.lock().done {
                break;
            }
            if rx.changed().await.is_err() {
                break;
            }
        }
        let (events, _) = self.since(0);
        let mut out = BytesMut::new();
        encode_until(&mut out, &events, opts, &mut 0);
        out.freeze()
    }
}

/// Encodes `events` until `limit` messages have been written in total
/// (`messages` counts across calls; priming does not count, so a limit of 0
/// still sends the priming event and its id). Returns how many events were
/// consumed and whether the limit is reached.
fn encode_until(
    out: &mut BytesMut,
    events: &[LogEvent],
    opts: &PumpOptions,
    messages: &mut usize,
) -> (usize, bool) {
    let full = |m: usize| opts.limit.is_some_and(|n| m >= n);
    let mut used = 0;
    for ev in events {
        if ev.data.is_some() && full(*messages) {
            break;
        }
        used += 1;
        if encode(out, ev, opts) {
            *messages += 1;
        }
    }
    (used, full(*messages))
}

/// Appends one log event; returns whether it was a message (not priming).
fn encode(out: &mut BytesMut, ev: &LogEvent, opts: &PumpOptions) -> bool {
    match &ev.data {
        Some(data) => {
            sse::encode_event(out, opts.ids.then_some(ev.id.as_str()), data);
            true
        }
        None => {
            if opts.ids {
                sse::encode_priming(out, &ev.id, opts.retry);
            }
            false
        }
    }
}

/// How a pump copies a log onto a response.
pub(crate) struct PumpOptions {
    /// End the response after this many message events (priming not counted).
    pub limit: Option<usize>,
    /// Send a keep-alive comment when idle (standalone GET streams).
    pub keep_alive: bool,
    /// `retry` field for priming events.
    pub retry: Option<u64>,
    /// Give events ids (a server without resumability gives none, and no
    /// priming event).
    pub ids: bool,
}

/// Copies `log` from `cursor` onto `tx` until the log is done, the limit is
/// reached or the response is gone. `on_sent` learns the cursor after every
/// write, which the standalone stream uses to know what was delivered.
pub(crate) async fn pump(
    log: &StreamLog,
    mut cursor: usize,
    tx: mpsc::Sender<Bytes>,
    opts: PumpOptions,
    mut on_sent: impl FnMut(usize),
) {
    // Subscribing before the first read means no append can slip in between
    // the read and the wait.
    let mut changed = log.changed.subscribe();
    let mut messages = 0usize;
    loop {
        let (events, done) = log.since(cursor);
        if !events.is_empty() {
            let mut out = BytesMut::new();
            let (used, reached) = encode_until(&mut out, &events, &opts, &mut messages);
            cursor += used;
            if tx.send(out.freeze()).await.is_err() {
                return;
            }
            on_sent(cursor);
            if reached {
                return;
            }
            continue;
        }
        if done {
            return;
        }
        tokio::select! {
            res = changed.changed() => if res.is_err() { return },
            () = tx.closed() => return,
            () = tokio::time::sleep(KEEP_ALIVE_EVERY), if opts.keep_alive => {
                if tx.send(Bytes::from_static(sse::KEEP_ALIVE)).await.is_err() {
                    return;
                }
            }
        }
    }
}
