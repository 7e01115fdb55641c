//! A task's leg replayed as the answer of a `tasks/result`: its entries as
//! logged, its answer under the `tasks/result` id and tagged with the task
//! (the shapes are `task::legacy`'s), and the cap on the `tasks/result`
//! requests waiting at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashSet;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::CANCELLED;
use crate::jsonrpc::{self, Kind, RequestId};
use crate::session::ReadAs;
use crate::store::StreamMeta;
use crate::task::legacy::{as_result_of, tag};

/// How many `tasks/result` requests wait at once on this instance.
#[derive(Debug, Default)]
pub struct Waiters(Arc<AtomicUsize>);

impl Waiters {
    /// A place among the waiters, if one of `cap` is free.
    pub(super) fn enter(&self, cap: usize) -> Option<Waiter> {
        let taken = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            });
        taken.ok().map(|_| Waiter(self.0.clone()))
    }
}

/// One waiting `tasks/result`; its place frees when its answer ends.
#[derive(Debug)]
pub(super) struct Waiter(Arc<AtomicUsize>);

impl Drop for Waiter {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A leg shown as the answer of a `tasks/result`.
#[derive(Debug)]
pub struct Fetched {
    /// The id the leg's request had upstream.
    pub(super) upstream: RequestId,
    /// The `tasks/result` request's id.
    pub(super) client: RequestId,
    pub(super) handle: String,
    pub(super) answered: bool,
    /// The upstream's requests the client has answered already (in this
    /// process): a `tasks/result` asked again does not ask them again.
    pub(super) asked_before: Arc<DashSet<RequestId>>,
    /// A fresh `tasks/result` holds a place among the waiters; a resume of
    /// one does not take another.
    pub(super) _waiter: Option<Waiter>,
}

impl Fetched {
    /// A `tasks/result` answer resumed (GET with `Last-Event-ID`), shown as
    /// it was: `stream` is the leg, `read_as` the request it answers.
    pub fn resumed(
        stream: &StreamMeta,
        read_as: ReadAs,
        asked_before: Arc<DashSet<RequestId>>,
    ) -> Self {
        Self {
            upstream: stream
                .origin_ids
                .first()
                .cloned()
                .unwrap_or_else(|| read_as.client.clone()),
            client: read_as.client,
            handle: read_as.handle,
            answered: false,
            asked_before,
            _waiter: None,
        }
    }

    /// The request this answer is for, to show a resume of it the same way.
    pub fn read_as(&self) -> ReadAs {
        ReadAs {
            client: self.client.clone(),
            handle: self.handle.clone(),
        }
    }

    /// One entry of the leg as the client sees it: the leg's answer becomes
    /// the `tasks/result` answer, tagged with its task; the rest as logged.
    pub fn entry(&mut self, message: Bytes) -> Option<Bytes> {
        if self.answered {
            return None;
        }
        // One look at the envelope: a leg of this revision carries single
        // messages (batches ended with 2025-06-18).
        let Ok(envelope) = jsonrpc::classify(&message) else {
            return Some(message);
        };
        match (envelope.kind, envelope.id) {
            (Kind::Response, Some(id)) if id == self.upstream => {
                self.answered = true;
                Some(self.answer(&message).unwrap_or(message))
            }
            // Answered by the client already: not asked again.
            (Kind::Request, Some(id)) if self.asked_before.contains(&id) => None,
            (Kind::Request, _) => Some(self.tagged_request(&message).unwrap_or(message)),
            _ => Some(message),
        }
    }

    /// A request of the upstream to the client, tagged with its task.
    fn tagged_request(&self, message: &[u8]) -> Option<Bytes> {
        let mut value: Map<String, Value> = serde_json::from_slice(message).ok()?;
        let params = value.entry("params").or_insert_with(|| json!({}));
        tag(params.as_object_mut()?, &self.handle);
        serde_json::to_vec(&value).ok().map(Bytes::from)
    }

    fn answer(&self, message: &[u8]) -> Option<Bytes> {
        as_result_of(message, &self.client, &self.handle)
    }

    /// What ends a leg that ended without an answer (cancelled): the
    /// `tasks/result` must still be answered.
    pub fn closing(&mut self) -> Option<Bytes> {
        if self.answered {
            return None;
        }
        self.answered = true;
        Some(Bytes::from(jsonrpc::error_response(
            Some(&self.client),
            jsonrpc::code::INTERNAL_ERROR,
            CANCELLED,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::TaskId;
    use crate::task::legacy::{upstream_id, RELATED_TASK};

    #[test]
    fn the_legs_answer_becomes_the_tasks_result_answer_tagged_with_its_task() {
        let waiters = Waiters::default();
        let mut fetched = Fetched {
            upstream: upstream_id(TaskId::random()),
            client: RequestId("9".into()),
            handle: "H".into(),
            answered: false,
            asked_before: Arc::default(),
            _waiter: waiters.enter(1),
        };
        assert!(waiters.enter(1).is_none(), "one waiter of one");
        let progress = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}"#);
        assert_eq!(fetched.entry(progress.clone()), Some(progress));
        let asked = br#"{"jsonrpc":"2.0","id":"s1","method":"elicitation/create","params":{"message":"?"}}"#;
        let asked: Value =
            serde_json::from_slice(&fetched.entry(Bytes::from_static(asked)).unwrap()).unwrap();
        assert_eq!(asked["params"]["_meta"][RELATED_TASK]["taskId"], "H");
        let answer = format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[]}}}}"#,
            fetched.upstream.as_json()
        );
        let shown: Value =
            serde_json::from_slice(&fetched.entry(Bytes::from(answer)).unwrap()).unwrap();
        assert_eq!(shown["id"], 9);
        assert_eq!(shown["result"]["_meta"][RELATED_TASK]["taskId"], "H");
        assert_eq!(fetched.closing(), None, "answered once");
        drop(fetched);
        assert!(waiters.enter(1).is_some(), "the place is free again");
    }

    #[test]
    fn a_question_the_client_answered_is_not_asked_again() {
        let asked_before: Arc<DashSet<RequestId>> = Arc::default();
        asked_before.insert(RequestId("\"s1\"".into()));
        let mut fetched = Fetched {
            upstream: upstream_id(TaskId::random()),
            client: RequestId("9".into()),
            handle: "H".into(),
            answered: false,
            asked_before,
            _waiter: None,
        };
        let answered = br#"{"jsonrpc":"2.0","id":"s1","method":"elicitation/create","params":{}}"#;
        let open = br#"{"jsonrpc":"2.0","id":"s2","method":"elicitation/create","params":{}}"#;
        assert_eq!(fetched.entry(Bytes::from_static(answered)), None);
        assert!(fetched.entry(Bytes::from_static(open)).is_some());
    }
}
