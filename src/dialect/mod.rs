//! Dialects: the ways a client can come back for what it missed, and the seam
//! they plug into. Each dialect is a thin adapter over the core's append /
//! read-after-cursor / status (`stream.rs`); logic two dialects would share
//! belongs in the core or in this file, never in both dialect files.
//!
//! The seam has three places a dialect acts, in the order of a request:
//! - **router** — [`Command::parse`] (`router.rs`) claims a message the
//!   proxy answers itself, from the log ([`Command::apply`]): one type per
//!   thing a client can ask, parsed once, applied in one place;
//! - **exchange** — [`Negotiated::opening`] authors the stream's first entries
//!   (the policy, `stream/create`), written before the request goes upstream
//!   and shown once durable, so a client holds an event id before any cut
//!   of a call that outlives one flush;
//! - **present** — [`Presenter`] (`presenter.rs`) rewrites the relayed
//!   `initialize` result to advertise what was negotiated, and closes a
//!   stream with what a dialect says after the last entry.
//!
//! Before all three, [`negotiate`] (`negotiation.rs`) reads what a client
//! asks for in `initialize`; the session record keeps the answer, so a
//! restarted proxy speaks the same dialects. This file owns the types every
//! dialect shares and must not grow a dialect's own rules.
//!
//! A client's own position in a stream — a `Last-Event-ID`, on a GET or with
//! a seed's POST resume — is read in one place for all of them,
//! `Context::after_event`: it names an entry of one of the caller's streams,
//! the resume starts after it, and naming it acknowledges it.
//!
//! The dialects: [`last_event_id`] (the SSE standard's resumption, on a GET
//! or a POST's answer), [`resume_token`] (seeds 000/001),
//! [`resumable_request`] (seed 002), [`streams`] (seed 003) and
//! [`legacy_tasks`] (the 2025-11-25 experimental tasks, served on the
//! session path).

pub mod last_event_id;
pub mod legacy_tasks;
mod negotiation;
mod presenter;
pub mod resumable_request;
pub mod resume_token;
mod router;
pub mod streams;

pub use negotiation::{kept_after_initialize, negotiate};
pub use presenter::Presenter;
pub use router::Command;

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::config::{DialectsConfig, ResumeTokensMode};
use crate::id::{Seq, StreamId};
use crate::jsonrpc::{code, RequestId};
use crate::session::Session;
use crate::store::{StoreError, StreamKind, StreamMeta};
use crate::stream::{Log, Reader};
use crate::token::Keyring;

/// A resumability dialect a client can negotiate in `initialize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// Seed 002: `resumableRequests`.
    ResumableRequests,
    /// Seed 003: `streams`.
    Streams,
    /// Seeds 000/001: `resumeTokens`.
    ResumeTokens,
    /// The 2025-11-25 experimental tasks, for an upstream without them.
    /// Not asked for by the client (its `capabilities.tasks` is its own
    /// and goes upstream): the route offers it to sessions of that
    /// revision, and the upstream's `initialize` answer confirms it.
    Tasks,
}

/// What negotiation does with a dialect's capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Offer {
    /// The proxy speaks it: consumed, recorded, advertised.
    Speak,
    /// Nobody speaks it: removed before the upstream sees it.
    Withhold,
    /// The upstream may speak it: left for the upstream.
    Leave,
}

impl Dialect {
    pub const ALL: [Dialect; 4] = [
        Dialect::ResumableRequests,
        Dialect::Streams,
        Dialect::ResumeTokens,
        Dialect::Tasks,
    ];

    /// The capability name on the wire (and on the session record).
    pub fn name(self) -> &'static str {
        match self {
            Dialect::ResumableRequests => "resumableRequests",
            Dialect::Streams => "streams",
            Dialect::ResumeTokens => "resumeTokens",
            Dialect::Tasks => "tasks",
        }
    }

    pub fn named(name: &str) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| d.name() == name)
    }

    fn offer(self, config: &DialectsConfig) -> Offer {
        let enabled = |on: bool| if on { Offer::Speak } else { Offer::Leave };
        match self {
            Dialect::ResumableRequests => enabled(config.resumable_requests.enabled),
            Dialect::Streams => enabled(config.streams.enabled),
            Dialect::ResumeTokens => match config.resume_tokens.mode {
                ResumeTokensMode::Proxy => Offer::Speak,
                ResumeTokensMode::Passthrough => Offer::Leave,
                ResumeTokensMode::Off => Offer::Withhold,
            },
            // Never read from the client's capabilities: see `Dialect::Tasks`.
            Dialect::Tasks => Offer::Leave,
        }
    }

    /// What the proxy advertises under `capabilities.experimental`; `None`
    /// for tasks, advertised as `capabilities.tasks` (see `negotiation`).
    fn settings(self, config: &DialectsConfig) -> Option<Value> {
        match self {
            Dialect::ResumableRequests => Some(resumable_request::settings(config)),
            Dialect::Streams => Some(streams::settings(config)),
            Dialect::ResumeTokens => Some(resume_token::settings(config)),
            Dialect::Tasks => None,
        }
    }

    /// How long a stream this dialect announced may go untouched.
    fn abandon_after_ms(self, config: &DialectsConfig) -> u64 {
        match self {
            Dialect::ResumableRequests => config.resumable_requests.max_wait_ms,
            Dialect::Streams => config.streams.max_ms,
            Dialect::ResumeTokens => config.resume_tokens.idle_expiry_ms,
            // A task keeps its leg for its own ttl.
            Dialect::Tasks => config.tasks.ttl_ms,
        }
    }

    /// The proxy-authored first entry of a stream this dialect announces.
    fn opening(self, cx: &Context<'_>, stream: &StreamMeta, request: &RequestId) -> Option<Bytes> {
        match self {
            Dialect::ResumableRequests => Some(resumable_request::policy(cx, stream, request)),
            Dialect::Streams => Some(streams::create(cx, stream)),
            // A token travels in an answer, not in the stream; a task is
            // named in the answer to its call.
            Dialect::ResumeTokens | Dialect::Tasks => None,
        }
    }
}

/// The dialects one session negotiated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Negotiated(Vec<Dialect>);

impl Negotiated {
    pub fn of(session: &Session) -> Self {
        session.with_dialects(Self::from_names)
    }

    fn from_dialects(dialects: Vec<Dialect>) -> Self {
        Self(dialects)
    }

    fn dialects(&self) -> &[Dialect] {
        &self.0
    }

    pub fn from_names(names: &[String]) -> Self {
        Self(names.iter().filter_map(|n| Dialect::named(n)).collect())
    }

    pub fn has(&self, dialect: Dialect) -> bool {
        self.0.contains(&dialect)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|d| d.name().to_owned()).collect()
    }

    /// Adds a dialect the route offers without the client asking.
    pub fn add(&mut self, dialect: Dialect) {
        if !self.has(dialect) {
            self.0.push(dialect);
        }
    }

    /// The dialects that announce `stream`: request streams answering one
    /// request other than `initialize`. (A batch has no single id to resume.)
    /// Resume tokens announce nothing in the stream (see
    /// [`resume_token::Call`]), and a task's leg is resumed as a task.
    pub fn announcing(&self, stream: &StreamMeta) -> Vec<Dialect> {
        let announced = stream.kind == StreamKind::Request
            && stream.origin_ids.len() == 1
            && stream.method.as_deref() != Some("initialize")
            && stream.task.is_none();
        if announced {
            self.0
                .iter()
                .copied()
                .filter(|d| !matches!(d, Dialect::ResumeTokens | Dialect::Tasks))
                .collect()
        } else {
            Vec::new()
        }
    }

    /// Arms abandonment on a stream about to be opened, if any dialect
    /// announces it (or `tokens`: its call answers with resume tokens): the
    /// longest wait any of them promised.
    pub fn arm(&self, stream: &mut StreamMeta, config: &DialectsConfig, tokens: bool) {
        let after = self
            .announcing(stream)
            .into_iter()
            .chain(tokens.then_some(Dialect::ResumeTokens))
            .map(|d| d.abandon_after_ms(config))
            .max();
        if let Some(after) = after {
            stream.abandon_after_ms = Some(after);
            stream.abandon_at_ms = Some(stream.touched_ms.saturating_add(after));
        }
    }

    /// The first entries of `stream`, authored by the proxy.
    pub fn opening(&self, cx: &Context<'_>, stream: &StreamMeta) -> Vec<Bytes> {
        let Some(request) = stream.origin_ids.first() else {
            return Vec::new();
        };
        self.announcing(stream)
            .into_iter()
            .filter_map(|d| d.opening(cx, stream, request))
            .collect()
    }
}

/// What a dialect needs to answer from the log.
pub struct Context<'a> {
    pub log: &'a Arc<Log>,
    pub keyring: &'a Keyring,
    pub session: &'a Session,
    pub config: &'a DialectsConfig,
    /// The route's `tasks/result` requests waiting now.
    pub waiters: &'a legacy_tasks::Waiters,
}

impl Context<'_> {
    /// A client came back for a stream with `dialect`: counted, and noted
    /// on its request.
    pub fn replayed(&self, dialect: crate::metrics::Replayed) {
        self.log.metrics().replayed(dialect);
        crate::access::note_replayed(dialect);
    }
}

/// Where the client of a resume says it is: the `Last-Event-ID` it sent
/// with the command, if any. Carried by the commands that resume, so the
/// dialects pass it on without reading it: what it means is decided in one
/// place, `Context::after_event`.
#[derive(Debug, Default)]
pub struct Position(Option<String>);

impl Position {
    pub fn of(last_event_id: Option<&str>) -> Self {
        Self(last_event_id.map(str::to_owned))
    }
}

impl Context<'_> {
    /// A dialect's resume of `stream`, followed live to its end, then
    /// `closing`. A client that names its position (`Last-Event-ID`) gets
    /// exactly the entries after it; one that does not gets every entry not
    /// acknowledged — the last one too when `keep_last` — which is
    /// at-least-once, since the cursor moves only on evidence.
    async fn replay(
        &self,
        stream: StreamMeta,
        position: &Position,
        keep_last: bool,
        closing: Vec<Bytes>,
    ) -> Result<Answer, Refusal> {
        let after = match &position.0 {
            Some(last_event_id) => self.after_event(last_event_id, Some(stream.id)).await?.1,
            None => self.log.resume_point(&stream, keep_last).await,
        };
        Ok(Answer::Replay(Box::new(Replay {
            reader: self.log.attach(stream.id, after),
            stream,
            closing,
            call: None,
            task: None,
        })))
    }

    /// The position a client's `Last-Event-ID` names: one of the caller's
    /// streams — the one the client also named another way (a resume's
    /// token or `streamId`), when `within` says which — and the seq of an
    /// entry in it, after which the client resumes. The client holds that
    /// entry and all before it, so naming it is the evidence that moves the
    /// stream's acknowledged cursor; this is the one place a client's own
    /// position is read, for a GET and for every dialect's resume alike.
    ///
    /// An id this proxy did not seal for this session (garbage, tampered,
    /// another session's), one of another stream than `within`, and one
    /// whose stream is gone all get the same [`Refusal::UnknownEventId`].
    async fn after_event(
        &self,
        last_event_id: &str,
        within: Option<StreamId>,
    ) -> Result<(StreamMeta, Seq), Refusal> {
        let (stream, seq) = self
            .keyring
            .open_event_id(self.session.id, last_event_id)
            .filter(|(stream, _)| within.is_none_or(|w| w == *stream))
            .ok_or(Refusal::UnknownEventId)?;
        let meta = self.own(stream).await?.ok_or(Refusal::UnknownEventId)?;
        if seq > meta.acked {
            self.log.ack(stream, seq).await?;
        }
        Ok((meta, seq))
    }

    /// The stream if it exists and belongs to the caller's session.
    async fn own(&self, stream: StreamId) -> Result<Option<StreamMeta>, Refusal> {
        Ok(self
            .log
            .meta(stream)
            .await?
            .filter(|m| m.session == self.session.id))
    }

    /// The caller's stream that an opened handle names. A handle that opened
    /// to nothing (unknown, tampered, foreign, of another kind) and one whose
    /// stream is gone (abandoned, expired) get the same `unknown` answer.
    async fn named(
        &self,
        opened: Option<StreamId>,
        id: &RequestId,
        unknown: &'static str,
    ) -> Result<StreamMeta, Refusal> {
        let refuse = || Refusal::InvalidParams {
            id: id.clone(),
            message: unknown,
        };
        let stream = opened.ok_or_else(refuse)?;
        self.own(stream).await?.ok_or_else(refuse)
    }
}

/// A string parameter a command requires.
fn string_param(
    id: &RequestId,
    params: &Value,
    name: &str,
    missing: &'static str,
) -> Result<String, Refusal> {
    params[name]
        .as_str()
        .map(str::to_owned)
        .ok_or(Refusal::InvalidParams {
            id: id.clone(),
            message: missing,
        })
}

/// Why a dialect refused a message. Mapped to a response by the request
/// path's one error type.
#[derive(Debug)]
pub enum Refusal {
    /// JSON-RPC `-32602` with the given message, for the request `id`.
    InvalidParams {
        id: RequestId,
        message: &'static str,
    },
    /// A dialect method inside a batch (`-32600`).
    Batched,
    /// A `Last-Event-ID` this proxy did not issue in this session, whose
    /// stream is gone, or — sent with a resume — of another stream than the
    /// one resumed.
    UnknownEventId,
    /// Too many `tasks/result` wait on this instance already (for the
    /// request `id`).
    Busy(RequestId),
    /// The log failed.
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        Refusal::Store(e)
    }
}

impl Refusal {
    pub fn code(&self) -> i64 {
        match self {
            Refusal::InvalidParams { .. } => code::INVALID_PARAMS,
            Refusal::Batched => code::INVALID_REQUEST,
            Refusal::UnknownEventId | Refusal::Busy(_) => code::SERVER_ERROR,
            Refusal::Store(_) => code::INTERNAL_ERROR,
        }
    }
}

/// How the proxy answers a command.
pub enum Answer {
    /// One JSON-RPC response, whole.
    Response(Bytes),
    /// A stream read to the client, then `closing` after its end.
    Replay(Box<Replay>),
    /// A task to start: its leg goes upstream, then the answer.
    Start(Box<legacy_tasks::Start>),
    /// A task cancelled: the answer, once the upstream was told to stop
    /// the leg's request.
    Cancel(Bytes, Option<Box<StreamMeta>>),
}

/// A stream served from the log by a dialect.
pub struct Replay {
    pub stream: StreamMeta,
    pub reader: Reader,
    /// Messages after the stream's last entry (end notification, the
    /// command's own response).
    pub closing: Vec<Bytes>,
    /// A tool call shown under a resume token.
    pub call: Option<resume_token::Call>,
    /// A task's leg shown as the answer of `tasks/result`.
    pub task: Option<legacy_tasks::Fetched>,
}

/// A successful JSON-RPC response carrying `result`.
pub fn response(id: &RequestId, result: &Value) -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{}}}"#,
        id.as_json(),
        result
    ))
}

/// A notification the proxy authors.
fn notification(method: &str, params: Value) -> Bytes {
    Bytes::from(json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string())
}

/// Milliseconds as the seeds' whole seconds.
fn seconds(ms: u64) -> u64 {
    ms / 1000
}
