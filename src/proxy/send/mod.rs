//! The upstream side of a session, as the request path sees it: one
//! [`Target::send`] for a request whose stream is open, one
//! [`Target::notify`] for what opens no stream, and the session's
//! standalone stream. Everything that differs between an HTTP upstream and
//! a stdio child is decided here and in [`http`] — the inline wait, the
//! timeout and the detach for HTTP; the write to the child's stdin — so the
//! pipeline never asks which one it has. It must not open, deduplicate or
//! present a request stream: it is handed one open.
//!
//! stdio: the stream is registered with the child's demultiplexer and the
//! message written to its stdin; the answer comes into the log through the
//! child's reader, and a child that cannot take the message ends the stream
//! with an error entry.

pub(super) mod http;

use std::sync::Arc;
use std::time::Instant;

use ::http::{HeaderMap, Method, Response};
use bytes::Bytes;
use hyper::body::Incoming;

use super::post::Post;
use super::{present, Rejection, Route};
use crate::id::StreamId;
use crate::reply::Body;
use crate::session::Session;
use crate::store::StreamMeta;
use crate::stream::Reader;
use crate::upstream::http::HttpUpstream;
use crate::upstream::replicas::Binding;
use crate::upstream::stdio::Child;
use crate::upstream::{Upstream, UpstreamError};

/// The upstream side of a session.
pub enum Target<'a> {
    Http(&'a Arc<HttpUpstream>),
    Stdio(Arc<Child>),
}

/// Who waits for the answer to a request sent upstream.
pub enum Waiting {
    /// The client's handler; a call that gets resume tokens is answered by
    /// its `deadline` at the latest (with its result, or an interim).
    Client { deadline: Option<Instant> },
    /// Nobody: a task's leg, whose task answers the client, so a refusal
    /// becomes the leg's error entry, which the task reports as its failure.
    Nobody,
}

/// What became of a request sent upstream, for whoever waited for it.
pub enum Sent {
    /// Its answer is in the log or on its way there (an SSE answer relayed
    /// by a task of its own, an exchange that outlived the wait, a stdio
    /// write, or an error entry that ends the stream).
    Logged,
    /// The upstream answered with something to pass through unchanged
    /// (clients detect protocol eras from 4xx bodies).
    Refused(Response<Incoming>),
    Unreachable(UpstreamError),
}

impl<'a> Target<'a> {
    /// A stdio session whose child is gone is gone too.
    pub fn of(route: &'a Route, session: &Session) -> Option<Target<'a>> {
        match &route.upstream {
            Upstream::Http(up) => Some(Target::Http(up)),
            Upstream::Stdio(stdio) => stdio.child(session.id).map(Target::Stdio),
        }
    }

    /// Sends a POST's requests upstream, their stream open.
    pub async fn send(
        &self,
        route: &Route,
        post: &Post,
        stream: &Arc<StreamMeta>,
        waiting: Waiting,
    ) -> Result<Sent, Rejection> {
        match self {
            Target::Http(up) => Ok(http::send(route, up, post, stream, waiting).await),
            Target::Stdio(child) => {
                write(route, child, post, stream).await?;
                Ok(Sent::Logged)
            }
        }
    }

    /// Forwards notifications and responses, answered with the upstream's
    /// own status (202 normally).
    pub async fn notify(
        &self,
        session: &Session,
        headers: &HeaderMap,
        bytes: Bytes,
    ) -> Result<Response<Body>, Rejection> {
        match self {
            Target::Http(up) => {
                let to = Binding::of(session);
                let headers = crate::access::traced(headers, "POST");
                let res = up.send(Method::POST, &headers, bytes, &to).await?;
                Ok(present::pass_through(res, Some(session.id)))
            }
            Target::Stdio(child) => {
                child.write(&bytes).await?;
                Ok(present::accepted(session.id))
            }
        }
    }

    /// Stops routing the messages of a stream the client cancelled to it:
    /// only a stdio child routes them (an HTTP answer carries its own).
    pub fn forget(&self, stream: StreamId) {
        if let Target::Stdio(child) = self {
            child.forget(stream);
        }
    }

    /// Attaches to the session's standalone stream: for HTTP, opening it
    /// upstream first when none is being relayed; an upstream refusal is
    /// returned as the response to pass through.
    pub async fn standalone(
        &self,
        route: &Route,
        session: &Arc<Session>,
        headers: &HeaderMap,
    ) -> Result<Reader, Box<Response<Body>>> {
        let log = &route.shared.log;
        match self {
            Target::Http(up) => http::standalone(route, up, session, headers).await,
            Target::Stdio(child) => {
                // The child's standalone stream exists from its start; the
                // first GET gets everything it said before anyone listened.
                let stream = child.standalone.id;
                let after = if child.first_standalone_attach() {
                    0
                } else {
                    log.end(stream).await
                };
                Ok(log.attach(stream, after))
            }
        }
    }
}

/// Hands a request to a stdio child for `stream`; a child that cannot take
/// it ends the stream with an error entry.
async fn write(
    route: &Route,
    child: &Child,
    post: &Post,
    stream: &StreamMeta,
) -> Result<(), Rejection> {
    child.expect(stream, stream.progress.clone());
    // With tracing on, its exchange's `traceparent` in `params._meta`.
    let traced = crate::access::traced_message(&post.bytes);
    if let Err(e) = child.write(traced.as_deref().unwrap_or(&post.bytes)).await {
        route.shared.log.metrics().upstream_error(&e);
        child.forget(stream.id);
        post.session.release(stream);
        route
            .shared
            .log
            .fail(stream, &stream.origin_ids, &e.to_string())
            .await?;
    }
    Ok(())
}
