//! Resume tokens (seeds 000 and 001): a `tools/call` still running after
//! `interim_after_ms` is answered early with a valid `CallToolResult` that
//! says so and carries `nextResumeToken` (in `_meta`, at the result root, or
//! both); the client continues it by re-sending the same call with
//! `resumeToken`, under any id, on any connection, until an answer comes
//! without a token — the upstream's own result, byte for byte but for the id.
//!
//! The upstream knows nothing of this: it is called once, never sees a token,
//! and its output is in the log. A token is a sealed handle naming the stream
//! and how far the client got, bound to the session, the principal and the
//! call's params digest, with an expiry; interims are synthesized from it and
//! never logged, so they survive a restart. Continuations read the stream
//! with a watcher: two of them with one token both get answers, and neither
//! cuts a live reader.

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

use super::{response, Answer, Context, Dialect, Negotiated, Refusal, Replay};
use crate::config::{DialectsConfig, Placement, ResumeTokensConfig, ResumeTokensMode};
use crate::id::{Seq, SessionId, StreamId};
use crate::jsonrpc::{self, RequestId};
use crate::store::{now_ms, StreamMeta};
use crate::token::{CallToken, Keyring};

/// Said for every token that cannot continue a call of the caller's: unknown,
/// tampered, expired, foreign, of another kind, presented with other params,
/// or replayed after the final answer's grace.
const UNKNOWN: &str = "Invalid params: unknown or expired resumeToken";

/// `capabilities.experimental.resumeTokens` in the `initialize` result.
pub fn settings(config: &DialectsConfig) -> Value {
    let c = &config.resume_tokens;
    let placement = match c.placement {
        Placement::Meta => "meta",
        Placement::Root => "root",
        Placement::Both => "both",
    };
    json!({
        "interimAfterMs": c.interim_after_ms,
        "idleExpiryMs": c.idle_expiry_ms,
        "placement": placement,
        "tools": c.tools,
    })
}

/// Whether a request answers with tokens in this session: a `tools/call` of
/// `tool` (`None`: not a tool call) that the settings and the client's
/// opt-in cover.
pub fn applies(config: &ResumeTokensConfig, negotiated: &Negotiated, tool: Option<&str>) -> bool {
    let Some(tool) = tool else {
        return false;
    };
    if config.mode != ResumeTokensMode::Proxy {
        return false;
    }
    if config.tools.is_empty() {
        negotiated.has(Dialect::ResumeTokens)
    } else {
        config.tools.iter().any(|listed| listed == tool)
    }
}

/// Whether any call of this session could get tokens (before looking at
/// the call: most sessions never need its tool's name).
pub fn possible(config: &ResumeTokensConfig, negotiated: &Negotiated) -> bool {
    config.mode == ResumeTokensMode::Proxy
        && (!config.tools.is_empty() || negotiated.has(Dialect::ResumeTokens))
}

/// What progress an answer under a token delivers.
#[derive(Clone, Debug)]
enum Progress {
    /// As the upstream sent it (the call that started the stream).
    AsLogged,
    /// On the token the continuation carries (rewritten if it changed).
    On(String),
    /// None: the continuation asked for no progress.
    Skip,
}

/// How a `tools/call` answer is shown to a client that gets tokens: entries
/// until the final result or until the deadline, then an interim.
#[derive(Clone, Debug)]
pub struct Call {
    /// The id this answer goes out under (a continuation's own id).
    answer_id: RequestId,
    /// The id the stream's final response carries.
    origin_id: RequestId,
    progress: Progress,
    deadline: Instant,
    seal: Seal,
    /// The latest progress the client was shown, for the interim's text.
    last_progress: Option<Value>,
    /// The final response went into this answer: the deadline no longer
    /// applies (an interim after it would carry a token past the end).
    answered: bool,
}

/// What sealing the next token needs.
#[derive(Clone)]
struct Seal {
    keyring: Keyring,
    session: SessionId,
    principal: String,
    digest: String,
    stream: StreamId,
    placement: Placement,
    idle_expiry_ms: u64,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal")
            .field("stream", &self.stream)
            .finish()
    }
}

impl Call {
    /// The presentation of a call that just started (`started` is when it
    /// arrived), if the call gets tokens.
    pub fn start(
        cx: &Context<'_>,
        stream: &StreamMeta,
        tool: Option<&str>,
        started: Instant,
    ) -> Option<Call> {
        let config = &cx.config.resume_tokens;
        if !applies(config, &Negotiated::of(cx.session), tool) {
            return None;
        }
        let origin_id = stream.origin_ids.first()?.clone();
        Some(Call {
            answer_id: origin_id.clone(),
            origin_id,
            progress: Progress::AsLogged,
            deadline: started + Duration::from_millis(config.interim_after_ms),
            seal: Seal::new(cx, stream)?,
            last_progress: None,
            answered: false,
        })
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the final response is in this answer already.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// One entry as this answer shows it; `None` skips it.
    pub fn entry(&mut self, message: Bytes) -> Option<Bytes> {
        // One look at the entry serves both questions below.
        let glance = jsonrpc::glance(&message).ok();
        if let Some(token) = glance.as_ref().and_then(|g| g.progress.as_ref()) {
            let token = &token.token;
            let mut note: Value = serde_json::from_slice(&message).ok()?;
            self.last_progress = Some(note["params"].clone());
            return match &self.progress {
                Progress::AsLogged => Some(message),
                Progress::Skip => None,
                Progress::On(wanted) if wanted == token => Some(message),
                Progress::On(wanted) => {
                    note["params"]["progressToken"] = serde_json::from_str(wanted).ok()?;
                    Some(Bytes::from(note.to_string()))
                }
            };
        }
        let answers_origin = glance.is_some_and(|g| {
            g.envelope.kind == jsonrpc::Kind::Response
                && g.envelope.id.as_ref() == Some(&self.origin_id)
        });
        self.answered |= answers_origin;
        if answers_origin && self.answer_id != self.origin_id {
            return jsonrpc::with_id(&message, &self.answer_id).or(Some(message));
        }
        Some(message)
    }

    /// The interim result for a client that got everything up to `cursor`.
    pub fn interim(&self, cursor: Seq) -> Bytes {
        let token = self.seal.token(cursor);
        let progress = match &self.last_progress {
            Some(p) => {
                let total = p.get("total").map(|t| format!("/{t}")).unwrap_or_default();
                let text = p["message"]
                    .as_str()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default();
                format!(" (progress {}{total}{text})", p["progress"])
            }
            None => String::new(),
        };
        let mut result = json!({
            "content": [{
                "type": "text",
                "text": format!(
                    "The tool is still running{progress}. Call it again with the same \
                     arguments and this resumeToken to continue."
                ),
            }],
            "isError": false,
        });
        if matches!(self.seal.placement, Placement::Meta | Placement::Both) {
            result["_meta"] = json!({ "nextResumeToken": token });
        }
        if matches!(self.seal.placement, Placement::Root | Placement::Both) {
            result["nextResumeToken"] = json!(token);
        }
        response(&self.answer_id, &result)
    }
}

impl Seal {
    fn new(cx: &Context<'_>, stream: &StreamMeta) -> Option<Seal> {
        let config = &cx.config.resume_tokens;
        Some(Seal {
            keyring: cx.keyring.clone(),
            session: cx.session.id,
            principal: cx.session.principal().to_owned(),
            digest: stream.params_digest.as_deref()?.to_owned(),
            stream: stream.id,
            placement: config.placement,
            idle_expiry_ms: config.idle_expiry_ms,
        })
    }

    fn token(&self, cursor: Seq) -> String {
        let token = CallToken {
            stream: self.stream,
            cursor,
            expires_ms: now_ms().saturating_add(self.idle_expiry_ms),
        };
        self.keyring.call_token(
            self.session,
            &self.principal,
            self.digest.as_bytes(),
            &token,
        )
    }
}

/// A `tools/call` re-sent with `resumeToken`: continues the call the token
/// names.
#[derive(Debug)]
pub struct Continue {
    id: RequestId,
    token: String,
    digest: Option<String>,
    progress_token: Option<String>,
}

impl Continue {
    pub fn parse(id: RequestId, bytes: &[u8], token: String) -> Self {
        Self {
            id,
            token,
            digest: jsonrpc::params_digest(bytes).map(|d| d.to_string()),
            progress_token: jsonrpc::progress_token(bytes),
        }
    }

    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let unknown = || Refusal::InvalidParams {
            id: self.id.clone(),
            message: UNKNOWN,
        };
        let digest = self.digest.as_deref().ok_or_else(unknown)?;
        let opened = cx.keyring.open_call_token(
            cx.session.id,
            cx.session.principal(),
            digest.as_bytes(),
            &self.token,
        );
        let token = opened
            .filter(|t| t.expires_ms > now_ms())
            .ok_or_else(unknown)?;
        let stream = cx.named(Some(token.stream), &self.id, UNKNOWN).await?;
        let grace = cx.config.resume_tokens.final_grace_ms;
        // The final answer stays fetchable for the grace after the client
        // last asked, once an answer carried it to its end (a client cut
        // while reading it comes back within the grace). Until one did, it
        // is always fetchable: the client may never have seen it.
        let answered_long_ago = !stream.status.is_live()
            && cx.log.written_to_end(stream.id).is_some()
            && now_ms().saturating_sub(stream.touched_ms) > grace;
        if answered_long_ago {
            return Err(unknown());
        }
        cx.log.touch(stream.id).await?;
        let call = Call {
            answer_id: self.id.clone(),
            origin_id: stream.origin_ids.first().cloned().ok_or_else(unknown)?,
            progress: match self.progress_token {
                Some(t) => Progress::On(t),
                None => Progress::Skip,
            },
            deadline: Instant::now()
                + Duration::from_millis(cx.config.resume_tokens.interim_after_ms),
            seal: Seal::new(cx, &stream).ok_or_else(unknown)?,
            last_progress: None,
            answered: false,
        };
        Ok(Answer::Replay(Box::new(Replay {
            reader: cx.log.watch(stream.id, token.cursor),
            stream,
            closing: Vec::new(),
            call: Some(call),
            task: None,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn continuation() -> Call {
        Call {
            answer_id: RequestId("7".into()),
            origin_id: RequestId("2".into()),
            progress: Progress::Skip,
            deadline: Instant::now(),
            seal: Seal {
                keyring: Keyring::from_secret(&[1; 32]),
                session: SessionId::random(),
                principal: "p".into(),
                digest: "d".into(),
                stream: StreamId::random(),
                placement: Placement::Meta,
                idle_expiry_ms: 1_000,
            },
            last_progress: None,
            answered: false,
        }
    }

    /// Under load the deadline can pass right after the final response was
    /// written: an interim then would carry a token past the stream's end,
    /// which fetches nothing.
    #[test]
    fn an_answer_holding_the_final_response_is_answered_and_takes_no_interim() {
        let mut call = continuation();
        let progress = Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}"#,
        );
        assert!(call.entry(progress).is_none(), "skipped: not asked for");
        assert!(!call.answered());
        let last = call
            .entry(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":2,"result":{}}"#,
            ))
            .unwrap();
        assert!(call.answered());
        assert_eq!(jsonrpc::response_ids(&last), [RequestId("7".into())]);
    }
}
