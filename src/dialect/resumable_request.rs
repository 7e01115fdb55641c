//! Resumable requests (seed 002, SEP-975): a client that declared
//! `resumableRequests` gets `notifications/requests/resumePolicy` first on
//! each request's stream, asks `requests/getStatus` without receiving
//! anything, and comes back with `requests/resume` — the original JSON-RPC id
//! and the `resumeToken` — for every entry it did not acknowledge, then the
//! rest live, ending with the original response. That is at-least-once; a
//! resume that also carries a `Last-Event-ID` naming an entry of the
//! request's stream (seed 003's Streamable HTTP considerations) starts right
//! after it and acknowledges it, as a GET would: exactly once.
//!
//! Reusing the original id is allowed only because the proxy answers
//! `requests/resume` itself: the upstream never sees a reused id. The token is
//! a sealed handle bound to the session and principal; a token that is
//! unknown, foreign, of another kind, or names an abandoned request gets one
//! identical error.

use serde_json::{json, Value};

use super::{notification, response, seconds, string_param, Answer, Context, Position, Refusal};
use crate::config::DialectsConfig;
use crate::jsonrpc::RequestId;
use crate::store::StreamMeta;
use crate::stream::Status;

pub const GET_STATUS: &str = "requests/getStatus";
pub const RESUME: &str = "requests/resume";
pub const METHODS: &[&str] = &[GET_STATUS, RESUME];

const POLICY: &str = "notifications/requests/resumePolicy";

/// Said for every token that does not name a request of the caller's.
const UNKNOWN: &str = "Invalid params: unknown or expired resumeToken";

/// `capabilities.experimental.resumableRequests` in the `initialize` result.
pub fn settings(config: &DialectsConfig) -> Value {
    let c = &config.resumable_requests;
    json!({"minWait": seconds(c.min_wait_ms), "maxWait": seconds(c.max_wait_ms)})
}

/// The policy entry that opens a request's stream.
pub fn policy(cx: &Context<'_>, stream: &StreamMeta, request: &RequestId) -> bytes::Bytes {
    let c = &cx.config.resumable_requests;
    notification(
        POLICY,
        json!({
            "requestId": id_value(request),
            "resumeToken": token(cx, stream),
            "minWait": seconds(c.min_wait_ms),
            "maxWait": seconds(c.max_wait_ms),
        }),
    )
}

fn token(cx: &Context<'_>, stream: &StreamMeta) -> String {
    cx.keyring
        .resume_token(cx.session.id, cx.session.principal(), stream.id)
}

fn id_value(id: &RequestId) -> Value {
    serde_json::from_str(id.as_json()).unwrap_or(Value::Null)
}

/// The caller's request the token names, or the one error for all others.
async fn request(cx: &Context<'_>, id: &RequestId, token: &str) -> Result<StreamMeta, Refusal> {
    let opened = cx
        .keyring
        .open_resume_token(cx.session.id, cx.session.principal(), token);
    cx.named(opened, id, UNKNOWN).await
}

fn token_param(id: &RequestId, params: &Value) -> Result<String, Refusal> {
    string_param(
        id,
        params,
        "resumeToken",
        "Invalid params: resumeToken (a string) is required",
    )
}

/// `requests/getStatus {requestId, resumeToken}`.
#[derive(Debug)]
pub struct GetStatus {
    id: RequestId,
    request_id: Value,
    token: String,
}

impl GetStatus {
    pub fn parse(id: RequestId, params: &Value) -> Result<Self, Refusal> {
        let token = token_param(&id, params)?;
        let request_id = params["requestId"].clone();
        if !(request_id.is_string() || request_id.is_number()) {
            return Err(Refusal::InvalidParams {
                id,
                message: "Invalid params: requestId (a string or number) is required",
            });
        }
        Ok(Self {
            id,
            request_id,
            token,
        })
    }

    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let stream = request(cx, &self.id, &self.token).await?;
        if !stream
            .origin_ids
            .iter()
            .any(|o| id_value(o) == self.request_id)
        {
            return Err(Refusal::InvalidParams {
                id: self.id,
                message: UNKNOWN,
            });
        }
        cx.log.touch(stream.id).await?;
        let status = Status::of(&stream);
        let word = if status.state.is_live() {
            "processing"
        } else if status.failed() {
            "failed"
        } else {
            "completed"
        };
        Ok(Answer::Response(response(
            &self.id,
            &json!({
                "requestId": self.request_id,
                "status": word,
                "hasPendingMessage": status.pending(),
                "hasInputRequest": status.has_request(),
            }),
        )))
    }
}

/// `requests/resume {resumeToken}` with the original request's id, and the
/// client's `Last-Event-ID` if it sent one.
#[derive(Debug)]
pub struct Resume {
    id: RequestId,
    token: String,
    position: Position,
}

impl Resume {
    pub fn parse(id: RequestId, params: &Value, position: Position) -> Result<Self, Refusal> {
        let token = token_param(&id, params)?;
        Ok(Self {
            id,
            token,
            position,
        })
    }

    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let stream = request(cx, &self.id, &self.token).await?;
        if !stream.origin_ids.contains(&self.id) {
            return Err(Refusal::InvalidParams {
                id: self.id,
                message:
                    "Invalid params: requests/resume must carry the id of the request it resumes",
            });
        }
        cx.log.touch(stream.id).await?;
        // Without a position, always end with the response, even when the
        // client acknowledged it: a resume of a finished request is how a
        // lost answer is fetched again. A client that names the response's
        // own event id says it holds it, and gets nothing twice.
        cx.replay(stream, &self.position, true, Vec::new()).await
    }
}
