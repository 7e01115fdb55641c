//! Resumable streams (seed 003): a client that declared `streams` gets
//! `notifications/stream/create {stream: {streamId, resumeInterval}}` first on
//! each request's stream and `notifications/stream/end` after its last
//! message; it comes back with `stream/resume` (the unacknowledged entries
//! with their original event ids, the end notification if the stream ended,
//! then an empty result), checks with `stream/poll`, or lists its streams
//! with `stream/poll/all`. A `stream/resume` is at-least-once, unless it
//! carries a `Last-Event-ID` naming an entry of that stream (the seed's
//! Streamable HTTP considerations): then it starts right after that entry
//! and acknowledges it, as a GET would — exactly once.
//!
//! `streamId` is a sealed handle bound to session and principal, never the
//! internal id; unknown, foreign and abandoned ids get one identical error.

use serde_json::{json, Value};

use super::{
    notification, response, seconds, string_param, Answer, Context, Dialect, Negotiated, Position,
    Refusal,
};
use crate::config::DialectsConfig;
use crate::id::StreamId;
use crate::jsonrpc::RequestId;
use crate::store::StreamMeta;
use crate::stream::Status;

pub const RESUME: &str = "stream/resume";
pub const POLL: &str = "stream/poll";
pub const POLL_ALL: &str = "stream/poll/all";
pub const METHODS: &[&str] = &[RESUME, POLL, POLL_ALL];

const CREATE: &str = "notifications/stream/create";
const END: &str = "notifications/stream/end";

/// Said for every `streamId` that does not name a stream of the caller's.
const UNKNOWN: &str = "Invalid params: unknown or abandoned streamId";

/// Most statuses one `stream/poll/all` page carries.
const PAGE: usize = 100;

/// `capabilities.experimental.streams` in the `initialize` result.
pub fn settings(config: &DialectsConfig) -> Value {
    json!({"resumeInterval": interval(config)})
}

fn interval(config: &DialectsConfig) -> Value {
    let c = &config.streams;
    json!({"min": seconds(c.min_ms), "max": seconds(c.max_ms)})
}

fn handle(cx: &Context<'_>, stream: StreamId) -> String {
    cx.keyring
        .stream_handle(cx.session.id, cx.session.principal(), stream)
}

/// The `stream/create` entry that opens a request's stream.
pub fn create(cx: &Context<'_>, stream: &StreamMeta) -> bytes::Bytes {
    notification(
        CREATE,
        json!({"stream": {"streamId": handle(cx, stream.id), "resumeInterval": interval(cx.config)}}),
    )
}

/// The `stream/end` that follows a finished stream's last message.
pub fn end(cx: &Context<'_>, stream: &StreamMeta) -> bytes::Bytes {
    notification(END, json!({"streamId": handle(cx, stream.id)}))
}

/// A command naming one stream by its `streamId`.
#[derive(Debug)]
pub struct Named {
    id: RequestId,
    stream: String,
}

impl Named {
    fn parse(id: RequestId, params: &Value) -> Result<Self, Refusal> {
        let stream = string_param(
            &id,
            params,
            "streamId",
            "Invalid params: streamId (a string) is required",
        )?;
        Ok(Self { id, stream })
    }

    /// The caller's stream it names (touched: the client came back), or
    /// the one error for all others.
    async fn stream(&self, cx: &Context<'_>) -> Result<StreamMeta, Refusal> {
        let opened =
            cx.keyring
                .open_stream_handle(cx.session.id, cx.session.principal(), &self.stream);
        let stream = cx.named(opened, &self.id, UNKNOWN).await?;
        cx.log.touch(stream.id).await?;
        Ok(stream)
    }
}

/// A `StreamPollResult` for one stream.
fn poll_result(cx: &Context<'_>, stream: &StreamMeta) -> Value {
    let status = Status::of(stream);
    json!({
        "streamId": handle(cx, stream.id),
        "status": if status.state.is_live() { "live" } else { "completed" },
        "pendingMessages": status.pending(),
        "hasRequest": status.has_request(),
        "hasError": status.has_error(),
    })
}

/// `stream/resume {streamId}`, and the client's `Last-Event-ID` if it sent
/// one.
#[derive(Debug)]
pub struct Resume(Named, Position);

impl Resume {
    pub fn parse(id: RequestId, params: &Value, position: Position) -> Result<Self, Refusal> {
        Ok(Resume(Named::parse(id, params)?, position))
    }

    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let stream = self.0.stream(cx).await?;
        let closing = vec![response(&self.0.id, &json!({}))];
        cx.replay(stream, &self.1, false, closing).await
    }
}

/// `stream/poll {streamId}`.
#[derive(Debug)]
pub struct Poll(Named);

impl Poll {
    pub fn parse(id: RequestId, params: &Value) -> Result<Self, Refusal> {
        Named::parse(id, params).map(Poll)
    }

    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let stream = self.0.stream(cx).await?;
        Ok(Answer::Response(response(
            &self.0.id,
            &poll_result(cx, &stream),
        )))
    }
}

/// `stream/poll/all {cursor?}`: the caller's session's streams, paged.
#[derive(Debug)]
pub struct PollAll {
    id: RequestId,
    cursor: Option<String>,
}

/// A stream's place in the listing: creation time, then id.
fn position(stream: &StreamMeta) -> [u8; 24] {
    let mut at = [0u8; 24];
    at[..8].copy_from_slice(&stream.created_ms.to_be_bytes());
    at[8..].copy_from_slice(stream.id.as_bytes());
    at
}

impl PollAll {
    pub fn parse(id: RequestId, params: &Value) -> Result<Self, Refusal> {
        let cursor = match &params["cursor"] {
            Value::Null => None,
            Value::String(c) => Some(c.clone()),
            _ => {
                return Err(Refusal::InvalidParams {
                    id,
                    message: "Invalid params: cursor must be a string",
                })
            }
        };
        Ok(Self { id, cursor })
    }

    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let after = match &self.cursor {
            None => None,
            Some(text) => Some(
                cx.keyring
                    .open_poll_cursor(cx.session.id, cx.session.principal(), text)
                    .ok_or(Refusal::InvalidParams {
                        id: self.id.clone(),
                        message: "Invalid params: unknown cursor",
                    })?,
            ),
        };
        let negotiated = Negotiated::of(cx.session);
        let mut streams: Vec<StreamMeta> = cx
            .log
            .store()
            .streams_of_session(cx.session.id)
            .await?
            .into_iter()
            .filter(|m| negotiated.announcing(m).contains(&Dialect::Streams))
            .filter(|m| after.is_none_or(|a| position(m) > a))
            .collect();
        streams.sort_by_key(position);
        let more = streams.len() > PAGE;
        streams.truncate(PAGE);
        // Together, so one group commit covers the page's touches rather
        // than one durability wait per stream.
        futures_util::future::try_join_all(streams.iter().map(|s| cx.log.touch(s.id))).await?;
        let statuses: Vec<Value> = streams.iter().map(|s| poll_result(cx, s)).collect();
        let mut result = json!({ "statuses": statuses });
        if let (true, Some(last)) = (more, streams.last()) {
            result["nextCursor"] = Value::String(cx.keyring.poll_cursor(
                cx.session.id,
                cx.session.principal(),
                &position(last),
            ));
        }
        Ok(Answer::Response(response(&self.id, &result)))
    }
}
