//! The demo server's multi-round-trip input (MRTR, 2026-07-28 requests only):
//! the `confirm` tool and the `requestState` it seals. Round 1 answers
//! `input_required` with one `elicitation/create` input request (key
//! `confirm`) and a `requestState`; the client re-issues the same call with a
//! new id, `inputResponses` and that `requestState` at the top level of
//! `params`, and gets a normal result that echoes its answer.
//!
//! The state is sealed as the Python SDK seals it: an HMAC over the tool's
//! name and arguments under a key that lives as long as this server. So a
//! re-issue with other arguments, or one reaching a restarted server, is
//! refused with 400 / -32602 before any tool runs, which is what a proxy that
//! re-issues calls for its clients has to get right.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::{Response, StatusCode};
use ring::hmac;
use ring::rand::SystemRandom;
use serde_json::{json, Value};

use super::responses::{json_response, text_result, tool_error};
use crate::reply::Body;

/// The one input request key `confirm` asks under.
const KEY: &str = "confirm";
/// Prefix of every state this server mints; the rest is the base64url MAC.
const STATE_PREFIX: &str = "demo1.";

/// Seals and checks `requestState` for one server's lifetime.
pub(super) struct StateSeal(hmac::Key);

impl StateSeal {
    pub(super) fn generate(random: &SystemRandom) -> Option<StateSeal> {
        hmac::Key::generate(hmac::HMAC_SHA256, random)
            .ok()
            .map(StateSeal)
    }

    fn seal(&self, params: &Value) -> String {
        let mac = hmac::sign(&self.0, &bound(params));
        format!("{STATE_PREFIX}{}", URL_SAFE_NO_PAD.encode(mac.as_ref()))
    }

    fn opens(&self, params: &Value, state: &str) -> bool {
        let Some(mac) = state
            .strip_prefix(STATE_PREFIX)
            .and_then(|b64| URL_SAFE_NO_PAD.decode(b64).ok())
        else {
            return false;
        };
        hmac::verify(&self.0, &bound(params), &mac).is_ok()
    }

    /// The SDK's refusal of a `confirm` re-issue whose state this server
    /// did not seal for these arguments (or that has answers but no state);
    /// None for every other request, which goes on to run.
    pub(super) fn refusal(&self, request: &Value) -> Option<Response<Body>> {
        let params = &request["params"];
        let reissue =
            params.get("inputResponses").is_some() || params.get("requestState").is_some();
        if request["method"] != "tools/call" || params["name"] != "confirm" || !reissue {
            return None;
        }
        let valid = params["requestState"]
            .as_str()
            .is_some_and(|state| self.opens(params, state));
        (!valid).then(|| {
            let body = json!({"jsonrpc": "2.0", "id": request["id"], "error": {
                "code": -32602,
                "message": "Invalid or expired requestState",
                "data": {"reason": "invalid_request_state"},
            }});
            json_response(StatusCode::BAD_REQUEST, &body)
        })
    }
}

/// What a state is bound to: the tool and its arguments (canonical JSON, as
/// serde_json writes a map: keys sorted).
fn bound(params: &Value) -> Vec<u8> {
    let mut out = b"confirm\0".to_vec();
    out.extend_from_slice(params["arguments"].to_string().as_bytes());
    out
}

/// What the `confirm` tool answers, after how long a pause (the caller
/// pauses, so that a cancellation during it ends the call).
pub(super) struct Confirm {
    pub pause: Duration,
    pub answer: Value,
}

/// The `confirm` tool. Arguments: `text` (the question, default "Proceed?"),
/// `ask_after_ms` (pause before round 1 answers), `answer_after_ms` (pause
/// before the re-issue answers).
pub(super) fn confirm(seal: Option<&StateSeal>, params: &Value) -> Confirm {
    let Some(seal) = seal else {
        return Confirm {
            pause: Duration::ZERO,
            answer: tool_error("confirm asks through MRTR, which needs a 2026-07-28 request"),
        };
    };
    let args = &params["arguments"];
    let answer = params.pointer("/inputResponses/confirm");
    let pause = if answer.is_some() {
        "answer_after_ms"
    } else {
        "ask_after_ms"
    };
    let pause = Duration::from_millis(args[pause].as_u64().unwrap_or(0).min(60_000));
    let answer = match answer {
        Some(answer) => text_result(&format!("confirmed: {answer}")),
        // Round 1, or a re-issue that answered other keys only: ask (again).
        None => json!({
            "resultType": "input_required",
            "inputRequests": {KEY: {
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": args["text"].as_str().unwrap_or("Proceed?"),
                    "requestedSchema": {
                        "type": "object",
                        "properties": {"confirm": {"type": "boolean"}},
                        "required": ["confirm"],
                    },
                },
            }},
            "requestState": seal.seal(params),
        }),
    };
    Confirm { pause, answer }
}
