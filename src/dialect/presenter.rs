//! Presentation: how one stream is shown to one client — what the session's
//! dialects add to the upstream's messages on the way out. The log is never
//! rewritten: a rewritten `initialize` result or an end notification exists
//! only on the wire, so every reader of the same stream sees the same thing.

use std::time::Instant;

use bytes::Bytes;

use super::legacy_tasks::{self, Fetched};
use super::resume_token::Call;
use super::streams;
use super::{Context, Dialect, Negotiated};
use crate::config::DialectsConfig;
use crate::id::Seq;
use crate::store::StreamMeta;

/// How one stream is shown to one client: what the session's dialects add to
/// the upstream's messages.
pub struct Presenter {
    negotiated: Negotiated,
    /// For the stream that carries the `initialize` answer: the settings
    /// advertised in it. (Other streams need none: no copy per answer.)
    /// The rare parts are boxed: an open answer keeps its presenter, and
    /// most answers have none of them.
    advertise: Option<Box<DialectsConfig>>,
    /// Messages after the last entry of a stream that ended.
    closing: Vec<Bytes>,
    /// A tool call answered under a resume token: rewritten entries and an
    /// interim at the deadline.
    call: Option<Box<Call>>,
    /// A `tools/list` answer of a session served tasks: tools marked.
    tools_list: bool,
    /// A task's leg shown as the answer of `tasks/result`.
    task: Option<Box<Fetched>>,
}

impl Presenter {
    /// Shows a stream the way the session's dialects say.
    pub fn new(cx: &Context<'_>, stream: &StreamMeta, negotiated: Negotiated) -> Self {
        let mut closing = Vec::new();
        if negotiated.announcing(stream).contains(&Dialect::Streams) {
            closing.push(streams::end(cx, stream));
        }
        let initialize = stream.method.as_deref() == Some("initialize");
        let tools_list =
            negotiated.has(Dialect::Tasks) && stream.method.as_deref() == Some("tools/list");
        Self {
            advertise: (initialize && !negotiated.is_empty()).then(|| Box::new(cx.config.clone())),
            negotiated,
            closing,
            call: None,
            tools_list,
            task: None,
        }
    }

    /// Shows a stream exactly as the log holds it.
    pub fn plain() -> Self {
        Self {
            negotiated: Negotiated::default(),
            advertise: None,
            closing: Vec::new(),
            call: None,
            tools_list: false,
            task: None,
        }
    }

    /// Adds messages to send after the stream's end.
    pub fn then(mut self, closing: Vec<Bytes>) -> Self {
        self.closing.extend(closing);
        self
    }

    /// Shows a tool call the resume-token way.
    pub fn with_call(mut self, call: Option<Call>) -> Self {
        self.call = call.map(Box::new);
        self
    }

    /// Shows a task's leg as the answer of `tasks/result`.
    pub fn with_task(mut self, task: Option<Fetched>) -> Self {
        self.task = task.map(Box::new);
        self
    }

    /// One entry as the client sees it; `None` skips it.
    pub fn entry(&mut self, message: Bytes) -> Option<Bytes> {
        if let Some(call) = &mut self.call {
            return call.entry(message);
        }
        if let Some(task) = &mut self.task {
            return task.entry(message);
        }
        if self.tools_list {
            return Some(legacy_tasks::tools_offered(&message).unwrap_or(message));
        }
        let Some(config) = &self.advertise else {
            return Some(message);
        };
        Some(super::negotiation::advertise(&message, &self.negotiated, config).unwrap_or(message))
    }

    /// When the answer must end with an interim if the stream is not over.
    pub fn deadline(&self) -> Option<Instant> {
        self.call
            .as_ref()
            .filter(|call| !call.answered())
            .map(|call| call.deadline())
    }

    /// The interim that ends an answer at its deadline, for a client that
    /// got every entry up to `cursor`.
    pub fn interim(&self, cursor: Seq) -> Option<Bytes> {
        self.call.as_ref().map(|c| c.interim(cursor))
    }

    /// What follows the last entry of a stream that ended.
    pub fn closing(&mut self) -> Vec<Bytes> {
        let mut closing = std::mem::take(&mut self.closing);
        closing.extend(self.task.as_mut().and_then(|task| task.closing()));
        closing
    }
}
