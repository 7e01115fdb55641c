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
//! - anything else foreign is dropped and counted, and so is a JSON object
//!   that is no JSON-RPC message (a priming event replayed as `data: {}`);
//! - an upstream event id already taken for the stream is never taken again,
//!   nor is progress no later than the latest the stream holds for its token
//!   (a stray may be a replay of what its stream logged before a restart).
//!
//! This module decides; it neither logs nor forwards.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::id::StreamId;
use crate::jsonrpc::{self, Glance, Kind, ParseError, Progress, RequestId};
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
    /// The stream's requests not answered yet.
    unanswered: HashSet<RequestId>,
    tokens: HashSet<Arc<str>>,
    seen: Seen,
    /// The latest progress value logged per own token.
    progress: HashMap<String, f64>,
}

impl Sorter {
    /// A sorter for `stream`, whose requests in `unanswered` still wait for
    /// their responses.
    pub fn new(stream: &StreamMeta, unanswered: HashSet<RequestId>) -> Self {
        Self {
            stream: stream.id,
            requests: stream.origin_ids.iter().cloned().collect(),
            unanswered,
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
        // One look at the message; a batch or anything unparsable stays
        // where it arrived, as it always did.
        let glance = match jsonrpc::glance(&event.message) {
            Ok(glance) => glance,
            // An object that is no JSON-RPC message: server-everything
            // replays its priming events as `data: {}`.
            Err(ParseError::Shape(_)) => return Belongs::Nowhere(Dropped::NotAMessage),
            Err(ParseError::Json(_)) => return self.take(event, None),
        };
        let owner = match (&glance.envelope, &glance.progress) {
            (envelope, _) if envelope.kind == Kind::Response => match &envelope.id {
                Some(id) if !self.requests.contains(id) => {
                    Some((session.stream_of(id), Dropped::ForeignResponse))
                }
                _ => None,
            },
            (_, Some(progress)) if !self.tokens.contains(progress.token.as_str()) => Some((
                session.progress_stream(&progress.token),
                Dropped::ForeignProgress,
            )),
            _ => None,
        };
        match owner {
            None => self.take(event, Some(glance)),
            Some((Some(stream), otherwise)) if stream != self.stream => {
                Belongs::There { stream, otherwise }
            }
            // Named by the session as this stream's: it is.
            Some((Some(_), _)) => self.take(event, Some(glance)),
            Some((None, why)) => Belongs::Nowhere(why),
        }
    }

    /// Whether a message another stream handed over is new here: neither an
    /// event id taken before nor progress this stream already moved past.
    pub fn welcome(&mut self, event: &UpstreamEvent) -> Belongs {
        if event.id.as_ref().is_some_and(|id| self.seen.has(id)) {
            return Belongs::Nowhere(Dropped::DuplicateEvent);
        }
        let glance = jsonrpc::glance(&event.message).ok();
        if let Some(progress) = glance.as_ref().and_then(|g| g.progress.as_ref()) {
            let latest = self.progress.get(&progress.token);
            if let (Some(value), Some(latest)) = (progress.value, latest) {
                if value <= *latest {
                    return Belongs::Nowhere(Dropped::StaleProgress);
                }
            }
        }
        self.take(event, glance)
    }

    /// Notes a logged entry of this stream (one a previous run wrote), so
    /// that a replay of it is recognised.
    pub fn logged(&mut self, message: &[u8]) {
        let progress = jsonrpc::glance(message).ok().and_then(|g| g.progress);
        self.note_progress(progress);
    }

    /// The stream's requests still waiting for their responses.
    pub fn unanswered(&self) -> &HashSet<RequestId> {
        &self.unanswered
    }

    /// Takes a message into the stream: its event id is seen, its progress
    /// noted, the request it answers answered (`glance` is `None` for what
    /// is no single message, such as a batch of responses).
    fn take(&mut self, event: &UpstreamEvent, glance: Option<Glance>) -> Belongs {
        if let Some(id) = &event.id {
            self.seen.add(id);
        }
        match glance {
            Some(glance) => {
                if glance.envelope.kind == Kind::Response {
                    if let Some(id) = &glance.envelope.id {
                        self.unanswered.remove(id);
                    }
                }
                self.note_progress(glance.progress);
            }
            None => {
                for id in jsonrpc::response_ids(&event.message) {
                    self.unanswered.remove(&id);
                }
            }
        }
        Belongs::Here
    }

    fn note_progress(&mut self, progress: Option<Progress>) {
        let Some(Progress {
            token,
            value: Some(value),
        }) = progress
        else {
            return;
        };
        let latest = self.progress.entry(token).or_insert(value);
        *latest = latest.max(value);
    }
}

/// A bounded set of upstream event ids: the newest `SEEN_IDS`, kept as
/// 64-bit digests under keys of its own (no allocation per event; a false
/// match among 4,096 ids is about one in 10^12, and an upstream cannot aim
/// for one without the keys).
#[derive(Default)]
struct Seen {
    keys: std::collections::hash_map::RandomState,
    ids: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Seen {
    fn digest(&self, id: &str) -> u64 {
        use std::hash::BuildHasher;
        self.keys.hash_one(id)
    }

    fn has(&self, id: &str) -> bool {
        self.ids.contains(&self.digest(id))
    }

    fn add(&mut self, id: &str) {
        let digest = self.digest(id);
        if !self.ids.insert(digest) {
            return;
        }
        self.order.push_back(digest);
        if self.order.len() > SEEN_IDS {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::session::Sessions;

    /// A session with two live calls: `1` (token "a") and `2` (token "b").
    struct Rig {
        _dir: tempfile::TempDir,
        session: Arc<Session>,
        one: StreamMeta,
        two: StreamMeta,
    }

    fn rig() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let store =
            crate::store::journal::Journal::open(dir.path(), crate::store::commit::SyncMode::Never)
                .unwrap();
        let session = Sessions::new(store)
            .mint("/mcp", "p".into(), b"{}", Vec::new())
            .expect("a place");
        let call = |id: &str, token: &str| {
            let mut stream = crate::store::contract::meta(session.id);
            stream.origin_ids = vec![RequestId(id.into())];
            stream.progress = vec![format!("\"{token}\"").into()];
            session.track(&stream);
            stream
        };
        let one = call("1", "a");
        let two = call("2", "b");
        Rig {
            _dir: dir,
            session,
            one,
            two,
        }
    }

    fn event(id: &str, message: String) -> UpstreamEvent {
        UpstreamEvent {
            id: Some(id.into()),
            message: Bytes::from(message),
        }
    }

    fn progress(token: &str, n: u32) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"{token}","progress":{n}}}}}"#
        )
    }

    fn result(id: u32) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[]}}}}"#)
    }

    #[test]
    fn a_streams_own_response_and_progress_stay_on_it() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.one, HashSet::new());
        for e in [event("e1", progress("a", 1)), event("e2", result(1))] {
            assert_eq!(sorter.sort(&rig.session, &e), Belongs::Here);
        }
    }

    #[test]
    fn another_live_requests_response_goes_to_its_stream() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.one, HashSet::new());
        let belongs = sorter.sort(&rig.session, &event("e9", result(2)));
        assert_eq!(
            belongs,
            Belongs::There {
                stream: rig.two.id,
                otherwise: Dropped::ForeignResponse
            }
        );
    }

    #[test]
    fn another_live_requests_progress_goes_to_its_stream() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.one, HashSet::new());
        let belongs = sorter.sort(&rig.session, &event("e9", progress("b", 3)));
        assert_eq!(
            belongs,
            Belongs::There {
                stream: rig.two.id,
                otherwise: Dropped::ForeignProgress
            }
        );
    }

    #[test]
    fn a_response_to_no_live_request_is_dropped() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.one, HashSet::new());
        let ping = event("e3", result(3));
        assert_eq!(
            sorter.sort(&rig.session, &ping),
            Belongs::Nowhere(Dropped::ForeignResponse)
        );
        rig.session.release(&rig.two);
        assert_eq!(
            sorter.sort(&rig.session, &event("e4", result(2))),
            Belongs::Nowhere(Dropped::ForeignResponse)
        );
    }

    #[test]
    fn progress_of_no_live_request_is_dropped() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.one, HashSet::new());
        assert_eq!(
            sorter.sort(&rig.session, &event("e5", progress("zz", 1))),
            Belongs::Nowhere(Dropped::ForeignProgress)
        );
    }

    #[test]
    fn server_requests_and_other_notifications_stay_where_they_arrived() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.one, HashSet::new());
        let log = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#;
        let ask = r#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}}"#;
        for e in [event("e6", log.into()), event("e7", ask.into())] {
            assert_eq!(sorter.sort(&rig.session, &e), Belongs::Here);
        }
    }

    #[test]
    fn an_object_that_is_no_json_rpc_message_is_dropped() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.one, HashSet::new());
        assert_eq!(
            sorter.sort(&rig.session, &event("p1", "{}".into())),
            Belongs::Nowhere(Dropped::NotAMessage)
        );
    }

    #[test]
    fn an_upstream_event_id_is_taken_once() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.one, HashSet::new());
        let e = event("e1", progress("a", 1));
        assert_eq!(sorter.sort(&rig.session, &e), Belongs::Here);
        assert_eq!(
            sorter.sort(&rig.session, &e),
            Belongs::Nowhere(Dropped::DuplicateEvent)
        );
        assert_eq!(
            sorter.welcome(&e),
            Belongs::Nowhere(Dropped::DuplicateEvent)
        );
    }

    #[test]
    fn a_stray_is_welcome_once_and_only_ahead_of_the_streams_progress() {
        let rig = rig();
        let mut sorter = Sorter::new(&rig.two, HashSet::new());
        sorter.logged(progress("b", 4).as_bytes());
        assert_eq!(
            sorter.welcome(&event("x3", progress("b", 3))),
            Belongs::Nowhere(Dropped::StaleProgress)
        );
        assert_eq!(
            sorter.welcome(&event("x4", progress("b", 4))),
            Belongs::Nowhere(Dropped::StaleProgress)
        );
        let five = event("x5", progress("b", 5));
        assert_eq!(sorter.welcome(&five), Belongs::Here);
        assert_eq!(
            sorter.welcome(&five),
            Belongs::Nowhere(Dropped::DuplicateEvent)
        );
        assert_eq!(sorter.welcome(&event("x9", result(2))), Belongs::Here);
    }
}
