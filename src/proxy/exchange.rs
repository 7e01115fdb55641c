//! The exchange of a client POST that carries requests — the request path's
//! pipeline once the session is settled: open the stream (admitted,
//! deduplicated, written with its opening entries; [`opening`]) → send to the
//! target (an HTTP upstream, a stdio child; [`Target::send`]) → present the
//! answer from the log (`present.rs`). Owns the order of the steps and what
//! a refused exchange leaves behind; it must not know which kind of upstream
//! it talks to, nor how a stream is admitted or shown.
//!
//! [`opening`]: super::opening

use std::sync::Arc;

use http::Response;

use super::opening::{self, Opened, RequestStream};
use super::post::Post;
use super::send::{Sent, Target, Waiting};
use super::{present, Rejection, Route};
use crate::dialect::resume_token::Call;
use crate::reply::Body;
use crate::store::StreamMeta;

/// Exchanges a POST carrying requests with the session's upstream, and
/// answers the client from the request's stream.
pub async fn run(
    route: &Route,
    target: Target<'_>,
    post: Post,
) -> Result<Response<Body>, Rejection> {
    let stream = match opening::open(route, &post).await? {
        Opened::New(stream) => stream,
        Opened::Repeat(prior) => {
            return route
                .answer_again(&post.session, &post.headers, &prior)
                .await
        }
    };
    let waiting = Waiting::Client {
        deadline: stream.call.as_ref().map(Call::deadline),
    };
    match target.send(route, &post, &stream.meta, waiting).await? {
        Sent::Logged => answer(route, &post, stream).await,
        Sent::Refused(res) => {
            withdraw(route, &post, &stream.meta).await;
            let session = (!post.opens_session).then_some(post.session.id);
            Ok(present::pass_through(res, session))
        }
        Sent::Unreachable(e) => {
            withdraw(route, &post, &stream.meta).await;
            Err(e.into())
        }
    }
}

/// Starts a task's leg: its stream opened (durable, and named by its task
/// already) and its request on its way upstream, in an exchange nobody
/// waits for — the task answers the client.
pub async fn start_leg(
    route: &Route,
    target: Target<'_>,
    post: Post,
) -> Result<StreamMeta, Rejection> {
    let stream = match opening::open(route, &post).await? {
        Opened::New(stream) => stream.meta,
        // Never: a leg's stream is the task's, not a call the client re-sends.
        Opened::Repeat(prior) => return Ok(prior),
    };
    // Nobody waits: whatever the upstream says ends up in the leg's stream.
    target.send(route, &post, &stream, Waiting::Nobody).await?;
    Ok(Arc::unwrap_or_clone(stream))
}

/// Answers the client from its stream, persisting a session the POST opened
/// first, so the session exists before the client learns its id. Persisting
/// here is idempotent with the exchange's update and covers a head that
/// came late.
async fn answer(
    route: &Route,
    post: &Post,
    stream: RequestStream,
) -> Result<Response<Body>, Rejection> {
    if post.opens_session {
        route.shared.sessions.persist(&post.session).await?;
    }
    route
        .answer(
            &post.session,
            &post.headers,
            &stream.meta,
            stream.call,
            stream.reader,
        )
        .await
}

/// Removes what an exchange created when its upstream refused it: the
/// client is told, so nothing may remain to resume.
async fn withdraw(route: &Route, post: &Post, stream: &StreamMeta) {
    let session = &post.session;
    session.release(stream);
    if let Err(e) = route.shared.log.delete(stream.id).await {
        tracing::warn!(stream = %stream.id, error = %e, "cannot delete refused stream");
    }
    if post.opens_session {
        route.shared.sessions.discard(session.id);
    }
}
