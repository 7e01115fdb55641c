//! Which stream an upstream message belongs to. An upstream stream is
//! supposed to carry only its request's messages, but resumed streams often
//! carry more: server-everything's example event store, copied by many
//! servers, replays every event of the session after the named id, other
//! requests' responses and progress included, and polled replays overlap.
//! Seed 004 forbids misrouting, so before anything is logged:
//!
//! - a response to one of the stream's own requests, and progress of one of
//!   its own tokens, stay; so does everything that names no request
//!   (server-to-client requests, other notifications: today's routing);
//! - a response to another live request of the session, or progress of its
//!   token, is handed to that request's stream;
//! - anything else foreign is dropped and counted;
//! - an upstream event id already taken for the stream is never taken again,
//!   nor is progress no later than the latest the stream holds for its token
//!   (a stray may be a replay of what its stream logged before a restart).
//!
//! This module decides; it neither logs nor forwards.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::id::StreamId;
use crate::jsonrpc::{self, RequestId};
use crate::metrics::Dropped;
use crate::session::Session;
use crate::store::StreamMeta;
use crate::upstream::http::UpstreamEvent;

/// Upstream event ids remembered per stream: far more than one replay
/// overlaps with another.
const SEEN_IDS: usize = 4096;

/// Where one upstream message goes.
#[derive(Debug, PartialEq)]
pub enum Belongs {
    /// Into the stream it arrived on.
    Here,
    /// Into another live stream of the session; counted as `otherwise`
    /// when that stream's relay cannot take it.
    There {
        stream: StreamId,
        otherwise: Dropped,
    },
    /// Nowhere.
    Nowhere(Dropped),
}

/// What a stream has taken in, for telling its own new messages from
/// replays and strays.
pub struct Sorter {
    stream: StreamId,
    requests: HashSet<RequestId>,
    tokens: HashSet<String>,
    seen: Seen,
    /// The latest progress value logged per own token.
    progress: HashMap<String, f64>,
}

impl Sorter {
    pub fn new(stream: &StreamMeta) -> Self {
        Self {
            stream: stream.id,
            requests: stream.origin_ids.iter().cloned().collect(),
            tokens: stream.progress.iter().cloned().collect(),
            seen: Seen::default(),
            progress: HashMap::new(),
        }
    }

    /// Where a message that arrived on this stream's upstream connection
    /// belongs.
    pub fn sort(&mut self, session: &Session, event: &UpstreamEvent) -> Belongs {
        if event.id.as_ref().is_some_and(|id| self.seen.has(id)) {
            return Belongs::Nowhere(Dropped::DuplicateEvent);
        }
        let message = &event.message[..];
        let answers = jsonrpc::response_ids(message);
        let owner = if let Some(id) = answers.first() {
            if answers.iter().all(|id| self.requests.contains(id)) {
                None
            } else {
                Some((session.stream_of(id), Dropped::ForeignResponse))
            }
        } else if let Some(token) = jsonrpc::progress_of(message) {
            if self.tokens.contains(&token) {
                None
            } else {
                Some((session.progress_stream(&token), Dropped::ForeignProgress))
            }
        } else {
            None
        };
        match owner {
            None => self.take(event),
            Some((Some(stream), otherwise)) if stream != self.stream => {
                Belongs::There { stream, otherwise }
            }
            // Named by the session as this stream's: it is.
            Some((Some(_), _)) => self.take(event),
            Some((None, why)) => Belongs::Nowhere(why),
        }
    }

    /// Whether a message another stream handed over is new here: neither an
    /// event id taken before nor progress this stream already moved past.
    pub fn welcome(&mut self, event: &UpstreamEvent) -> Belongs {
        if event.id.as_ref().is_some_and(|id| self.seen.has(id)) {
            return Belongs::Nowhere(Dropped::DuplicateEvent);
        }
        if let Some(token) = jsonrpc::progress_of(&event.message) {
            let value = jsonrpc::progress_value(&event.message);
            let latest = self.progress.get(&token);
            if let (Some(value), Some(latest)) = (value, latest) {
                if value <= *latest {
                    return Belongs::Nowhere(Dropped::StaleProgress);
                }
            }
        }
        self.take(event)
    }

    /// Notes a logged entry of this stream (one a previous run wrote), so
    /// that a replay of it is recognised.
    pub fn logged(&mut self, message: &[u8]) {
        self.note_progress(message);
    }

    fn take(&mut self, event: &UpstreamEvent) -> Belongs {
        if let Some(id) = &event.id {
            self.seen.add(id.clone());
        }
        self.note_progress(&event.message);
        Belongs::Here
    }

    fn note_progress(&mut self, message: &[u8]) {
        let Some(token) = jsonrpc::progress_of(message) else {
            return;
        };
        if let Some(value) = jsonrpc::progress_value(message) {
            let latest = self.progress.entry(token).or_insert(value);
            *latest = latest.max(value);
        }
    }
}

/// A bounded set of upstream event ids: the newest `SEEN_IDS`.
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    fn has(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    fn add(&mut self, id: String) {
        if !self.ids.insert(id.clone()) {
            return;
        }
        self.order.push_back(id);
        if self.order.len() > SEEN_IDS {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
    }
}
