//! Opening a POST's request stream, before anything goes upstream: admitted
//! under the session, principal and disk caps, deduplicated against a call
//! the client re-sends, and written with the first entries the session's
//! dialects author (the resume policy, `stream/create`) in one step with the
//! stream. Owns only the opening: it must not reach the upstream nor answer
//! the client.
//!
//! The opening entries are shown once a flush covers them: the answer's,
//! for a call answered within a few milliseconds, or else one of their own.
//! (They used to be flushed before the request went upstream: a second
//! flush per call for a client that negotiated dialects; and then written on
//! their own: a second write, and a second Redis round trip.)

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::post::Post;
use super::{quota, Rejection, Route};
use crate::dialect::resume_token::{self, Call};
use crate::dialect::{Context, Negotiated};
use crate::id::StreamId;
use crate::jsonrpc::{self, Body as Message};
use crate::store::{now_ms, Prior, StreamKind, StreamMeta};
use crate::stream::{Log, Reader};

/// How a POST's stream opened.
// Returned once per call and taken apart at once: boxing `New` would cost
// every call an allocation to save stack space on the rare `Repeat`.
#[allow(clippy::large_enum_variant)]
pub enum Opened {
    New(RequestStream),
    /// The call repeats one the session has a stream for: the client gets
    /// that stream from its start, and nothing goes upstream.
    Repeat(StreamMeta),
}

/// A request stream, new in the log.
pub struct RequestStream {
    /// Shared with the exchange's relay: one copy of the meta per call.
    pub meta: Arc<StreamMeta>,
    /// How a tool call that gets resume tokens is answered.
    pub call: Option<Call>,
    /// The answer's reader, attached when the stream opened: a resume the
    /// client sends while this request still waits on the upstream attaches
    /// later and takes the stream over, never the other way round.
    pub reader: Reader,
}

/// Opens the request stream of a POST: armed for abandonment and opened
/// with the entries the session's dialects author (written now, shown once
/// durable); its requests and progress tokens tracked. A call the session
/// has a stream for already opens nothing ([`Opened::Repeat`]).
pub async fn open(route: &Route, post: &Post) -> Result<Opened, Rejection> {
    let started = Instant::now();
    let cx = route.context(&post.session);
    let negotiated = Negotiated::of(&post.session);
    // A leg is answered by its task, never with resume tokens.
    let tool = (post.leg.is_none()
        && resume_token::possible(&cx.config.resume_tokens, &negotiated))
    .then(|| crate::jsonrpc::tool_name(&post.bytes))
    .flatten();
    let meta = describe(post, &cx, &negotiated, tool.as_deref());
    let opening = negotiated.opening(&cx, &meta);
    // Attached before the stream is created with its opening entries: the
    // log hands what it writes only to a reader already attached, and one
    // attached after would read them back from the store (two `pread`s per
    // dialect call). A call that opens nothing drops it again.
    let reader = route.shared.log.attach(meta.id, 0);
    if let Some(prior) = create(route, post, &meta, &opening).await? {
        return Ok(Opened::Repeat(prior));
    }
    let call = Call::start(&cx, &meta, tool.as_deref(), started);
    post.session.track(&meta);
    post.session.remember_headers(&post.headers);
    Ok(Opened::New(RequestStream {
        meta: Arc::new(meta),
        call,
        reader,
    }))
}

/// The stream a POST's requests open, armed as the session's dialects
/// want it (a leg's stream is the one its task's record names).
fn describe(
    post: &Post,
    cx: &Context<'_>,
    negotiated: &Negotiated,
    tool: Option<&str>,
) -> StreamMeta {
    let mut meta = StreamMeta::new(
        post.leg.map_or_else(
            || StreamId::random_beside(post.session.id.as_bytes()),
            |leg| leg.stream,
        ),
        post.session.id,
        StreamKind::Request,
        post.message.request_ids(),
        post.message.single_method().map(Arc::from),
        now_ms(),
    );
    meta.task = post.leg.map(|leg| leg.task);
    let tokens = resume_token::applies(&cx.config.resume_tokens, negotiated, tool);
    negotiated.arm(&mut meta, cx.config, tokens);
    if matches!(post.message, Message::Single(_)) {
        meta.params_digest = jsonrpc::params_digest(&post.bytes);
    }
    meta.progress = jsonrpc::request_progress_tokens(&post.bytes, &post.message);
    meta
}

/// Creates the stream of an admitted POST, with its opening entries. A call
/// the client may be re-sending finds its prior stream instead, which it
/// returns: the same call is not executed twice, even at the quota (it
/// opens nothing), and another call under its id is refused. Found through
/// the log, so it holds after a restart.
async fn create(
    route: &Route,
    post: &Post,
    meta: &StreamMeta,
    opening: &[Bytes],
) -> Result<Option<StreamMeta>, Rejection> {
    let shared = &route.shared;
    let admitted = quota::admit(
        &shared.config.limits,
        &shared.sessions,
        shared.log.store().as_ref(),
        &post.session,
        // Only a refusal answers with it: not copied for every request.
        || post.single_id(),
    );
    match (post.may_repeat(), admitted) {
        (false, admitted) => {
            admitted?;
            shared.log.create(meta, opening).await?;
            Ok(None)
        }
        (true, Ok(())) => open_call(&shared.log, meta, opening).await,
        (true, Err(refused)) => prior_or(&shared.log, meta, refused).await.map(Some),
    }
}

/// Creates the stream of an admitted call, unless the session has one for
/// it already.
async fn open_call(
    log: &Log,
    meta: &StreamMeta,
    opening: &[Bytes],
) -> Result<Option<StreamMeta>, Rejection> {
    let stream = match log.open_call(meta, opening).await? {
        Some(Prior::Same(stream)) => stream,
        Some(Prior::Other) => return Err(Rejection::reused_id(meta.call_id().cloned())),
        None => return Ok(None),
    };
    match log.meta(stream).await? {
        Some(prior) => Ok(Some(repeated(prior))),
        // Gone since (retention ran out in between): a new call after all.
        None => {
            log.create(meta, opening).await?;
            Ok(None)
        }
    }
}

/// The prior stream of a call that was refused admission: a re-sent call
/// still gets its stream; anything else gets the refusal.
async fn prior_or(
    log: &Log,
    meta: &StreamMeta,
    refused: Rejection,
) -> Result<StreamMeta, Rejection> {
    let stream = match log.store().prior_call(meta).await? {
        Some(Prior::Same(stream)) => stream,
        Some(Prior::Other) => return Err(Rejection::reused_id(meta.call_id().cloned())),
        None => return Err(refused),
    };
    log.meta(stream).await?.map(repeated).ok_or(refused)
}

fn repeated(prior: StreamMeta) -> StreamMeta {
    tracing::debug!(stream = %prior.id, "re-sent call attached to its stream");
    prior
}
