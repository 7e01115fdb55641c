//! A client POST that carries requests, as the request path hands it on
//! once its session is settled: what the pipeline's steps read, and whether
//! it may be a call the client re-sends. Holds no behaviour of its own: it
//! must not open a stream, nor reach the upstream.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use crate::jsonrpc::{self, Body as Message};
use crate::session::Session;
use crate::task::Leg;

/// A client POST that carries requests, checked and classified.
pub struct Post {
    pub session: Arc<Session>,
    /// An `initialize` that minted `session`: it is persisted only once the
    /// upstream took it.
    pub opens_session: bool,
    /// Shared with the relay that sends it upstream, not copied for it.
    pub headers: Arc<HeaderMap>,
    pub bytes: Bytes,
    pub message: Message,
    /// The task this request is a leg of (2025-11-25 tasks): its stream is
    /// the one the task's record names, and the task answers the client.
    pub leg: Option<Leg>,
}

impl Post {
    /// Whether this may re-send a call of the session under the id of a
    /// live or retained stream (a client retrying after a cut): the same
    /// call — same params digest — is then not executed again, the client
    /// gets the existing stream from its start; other params under that id
    /// are refused (see [`crate::store::Prior`]). A new id is never
    /// deduplicated; neither is a call carrying a resume token (its dialect,
    /// or the upstream in passthrough, continues it), an `initialize` that
    /// opens its session, or a task's leg.
    pub fn may_repeat(&self) -> bool {
        let Message::Single(envelope) = &self.message else {
            return false;
        };
        !self.opens_session
            && self.leg.is_none()
            && envelope.is_request()
            && envelope.id.is_some()
            && jsonrpc::resume_token(&self.bytes).is_none()
    }

    /// The id of a single request, which a refusal answers.
    pub fn single_id(&self) -> Option<jsonrpc::RequestId> {
        match &self.message {
            Message::Single(_) => self.message.request_ids().into_iter().next(),
            Message::Batch(_) => None,
        }
    }
}
