//! The router: which messages of a session the proxy answers itself — a
//! method of a dialect the session negotiated, a `tools/call` that asks for
//! a task or carries a resume token — parsed once into a [`Command`] and
//! applied in one place. Every dialect method has its own arm here, and
//! nothing else is claimed; a dialect's own rules (what its params mean,
//! how it answers) stay in the dialect's file.

use serde_json::Value;

use super::{
    legacy_tasks, resumable_request, resume_token, streams, Answer, Context, Dialect, Negotiated,
    Position, Refusal,
};
use crate::config::DialectsConfig;
use crate::jsonrpc::{self, Body as Message, RequestId};
use crate::metrics::Replayed;

/// Every method a dialect answers itself, with the dialect that must be
/// negotiated for the proxy to claim it. `Command::parse` claims nothing
/// else, and has one arm for each (a test holds the two together).
const METHODS: [(Dialect, &[&str]); 3] = [
    (Dialect::ResumableRequests, resumable_request::METHODS),
    (Dialect::Streams, streams::METHODS),
    (Dialect::Tasks, &legacy_tasks::METHODS),
];

/// Whether `method` is one the proxy answers itself.
fn is_dialect_method(method: &str) -> bool {
    // (A `tools/call` with a resume token is a call first: see
    // `Command::parse`.)
    METHODS.iter().any(|(_, methods)| methods.contains(&method))
}

/// Something a client asked the proxy itself, parsed once.
#[derive(Debug)]
pub enum Command {
    GetStatus(resumable_request::GetStatus),
    ResumeRequest(resumable_request::Resume),
    ResumeStream(streams::Resume),
    Poll(streams::Poll),
    PollAll(streams::PollAll),
    Continue(resume_token::Continue),
    CreateTask(legacy_tasks::Create),
    GetTask(legacy_tasks::Named),
    TaskResult(legacy_tasks::Named),
    ListTasks(legacy_tasks::List),
    CancelTask(legacy_tasks::Named),
}

impl Command {
    /// Claims a message for a negotiated dialect. `Ok(None)`: not a dialect
    /// method of this session, it goes upstream as it is. `last_event_id` is
    /// the header the message came with: a resume starts after it.
    pub fn parse(
        bytes: &[u8],
        message: &Message,
        negotiated: &Negotiated,
        config: &DialectsConfig,
        last_event_id: Option<&str>,
    ) -> Result<Option<Command>, Refusal> {
        let claimed = |method: &str| {
            METHODS
                .iter()
                .any(|(dialect, methods)| methods.contains(&method) && negotiated.has(*dialect))
        };
        match message {
            Message::Batch(items) => {
                let batched = items
                    .iter()
                    .filter_map(|e| e.method.as_deref())
                    .any(|m| claimed(m) || (is_dialect_method(m) && !negotiated.is_empty()));
                if batched {
                    return Err(Refusal::Batched);
                }
                Ok(None)
            }
            Message::Single(envelope) => {
                let (Some(method), Some(id)) = (envelope.method.as_deref(), &envelope.id) else {
                    return Ok(None);
                };
                if !envelope.is_request() {
                    return Ok(None);
                }
                if method == "tools/call"
                    && negotiated.has(Dialect::Tasks)
                    && legacy_tasks::asks_for_task(bytes)
                {
                    let create = legacy_tasks::Create::parse(id.clone(), bytes)?;
                    return Ok(Some(Command::CreateTask(create)));
                }
                if method == "tools/call" {
                    let Some(token) = jsonrpc::resume_token(bytes) else {
                        return Ok(None);
                    };
                    let tool = jsonrpc::tool_name(bytes);
                    if !resume_token::applies(&config.resume_tokens, negotiated, tool.as_deref()) {
                        return Ok(None);
                    }
                    let id = id.clone();
                    return Ok(Some(Command::Continue(resume_token::Continue::parse(
                        id, bytes, token,
                    ))));
                }
                if !claimed(method) {
                    return Ok(None);
                }
                let position = Position::of(last_event_id);
                Command::of_method(method, id.clone(), &params(bytes), position).transpose()
            }
        }
    }

    /// The command dialect method `method` asks for: one arm per method of
    /// every dialect's `METHODS`. `None` for any other method — it goes
    /// upstream as it came, never taken for another command.
    fn of_method(
        method: &str,
        id: RequestId,
        params: &Value,
        position: Position,
    ) -> Option<Result<Command, Refusal>> {
        let command = match method {
            resumable_request::GET_STATUS => {
                resumable_request::GetStatus::parse(id, params).map(Command::GetStatus)
            }
            resumable_request::RESUME => {
                resumable_request::Resume::parse(id, params, position).map(Command::ResumeRequest)
            }
            streams::RESUME => {
                streams::Resume::parse(id, params, position).map(Command::ResumeStream)
            }
            streams::POLL => streams::Poll::parse(id, params).map(Command::Poll),
            streams::POLL_ALL => streams::PollAll::parse(id, params).map(Command::PollAll),
            legacy_tasks::GET => legacy_tasks::Named::parse(id, params).map(Command::GetTask),
            legacy_tasks::RESULT => legacy_tasks::Named::parse(id, params).map(Command::TaskResult),
            legacy_tasks::LIST => legacy_tasks::List::parse(id, params).map(Command::ListTasks),
            legacy_tasks::CANCEL => legacy_tasks::Named::parse(id, params).map(Command::CancelTask),
            _ => return None,
        };
        Some(command)
    }

    pub async fn apply(self, cx: &Context<'_>) -> Result<Answer, Refusal> {
        let replay = self.replayed();
        let answer = match self {
            Command::GetStatus(c) => c.apply(cx).await,
            Command::ResumeRequest(c) => c.apply(cx).await,
            Command::ResumeStream(c) => c.apply(cx).await,
            Command::Poll(c) => c.apply(cx).await,
            Command::PollAll(c) => c.apply(cx).await,
            Command::Continue(c) => c.apply(cx).await,
            Command::CreateTask(c) => c.apply(cx).await,
            Command::GetTask(c) => c.get(cx).await,
            Command::TaskResult(c) => c.result(cx).await,
            Command::ListTasks(c) => c.apply(cx).await,
            Command::CancelTask(c) => c.cancel(cx).await,
        };
        if let (Some(dialect), Ok(Answer::Replay(_))) = (replay, &answer) {
            cx.replayed(dialect);
        }
        answer
    }

    /// The dialect a command resumes in, if it replays a stream (a status
    /// or poll answers with a response, not a replay).
    fn replayed(&self) -> Option<Replayed> {
        match self {
            Command::ResumeRequest(_) => Some(Replayed::ResumableRequests),
            Command::ResumeStream(_) => Some(Replayed::Streams),
            Command::Continue(_) => Some(Replayed::ResumeTokens),
            Command::TaskResult(_) => Some(Replayed::Tasks),
            Command::GetStatus(_)
            | Command::Poll(_)
            | Command::PollAll(_)
            | Command::CreateTask(_)
            | Command::GetTask(_)
            | Command::ListTasks(_)
            | Command::CancelTask(_) => None,
        }
    }
}

/// A command's `params`, or an empty object.
fn params(bytes: &[u8]) -> Value {
    #[derive(serde::Deserialize)]
    struct Envelope {
        #[serde(default)]
        params: Value,
    }
    serde_json::from_slice::<Envelope>(bytes)
        .map(|e| e.params)
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dialect_methods_in_a_batch_are_refused() {
        let bytes = br#"[{"jsonrpc":"2.0","id":1,"method":"stream/poll","params":{}}]"#;
        let body = crate::jsonrpc::parse_body(bytes).unwrap();
        let negotiated = Negotiated(vec![Dialect::Streams]);
        assert!(matches!(
            Command::parse(bytes, &body, &negotiated, &DialectsConfig::default(), None),
            Err(Refusal::Batched)
        ));
    }

    #[test]
    fn every_dialect_method_has_its_own_arm() {
        for (dialect, methods) in METHODS {
            for method in methods {
                let parsed = Command::of_method(
                    method,
                    RequestId("1".into()),
                    &json!({}),
                    Position::default(),
                );
                assert!(
                    parsed.is_some(),
                    "{method} ({dialect:?}) has no arm in Command::parse"
                );
            }
        }
        assert!(Command::of_method(
            "tasks/unknown",
            RequestId("1".into()),
            &json!({}),
            Position::default()
        )
        .is_none());
    }

    #[test]
    fn each_tasks_method_becomes_its_own_command() {
        let params = json!({"taskId": "T"});
        let parsed = |method| {
            Command::of_method(method, RequestId("1".into()), &params, Position::default())
        };
        assert!(matches!(
            parsed(legacy_tasks::GET),
            Some(Ok(Command::GetTask(_)))
        ));
        assert!(matches!(
            parsed(legacy_tasks::RESULT),
            Some(Ok(Command::TaskResult(_)))
        ));
        assert!(matches!(
            parsed(legacy_tasks::LIST),
            Some(Ok(Command::ListTasks(_)))
        ));
        assert!(matches!(
            parsed(legacy_tasks::CANCEL),
            Some(Ok(Command::CancelTask(_)))
        ));
    }

    #[test]
    fn dialect_methods_of_a_session_that_did_not_negotiate_go_upstream() {
        let bytes = br#"{"jsonrpc":"2.0","id":1,"method":"stream/poll","params":{}}"#;
        let body = crate::jsonrpc::parse_body(bytes).unwrap();
        assert!(Command::parse(
            bytes,
            &body,
            &Negotiated::default(),
            &DialectsConfig::default(),
            None
        )
        .unwrap()
        .is_none());
    }
}
