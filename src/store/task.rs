//! What the store keeps of a task: the record that makes a long
//! `tools/call` durable — of a 2026-07-28 client (the tasks extension) or of
//! a 2025-11-25 session (the experimental tasks). A task is a chain of
//! upstream requests — the call, then one re-issue per answered
//! `input_required` round (MRTR) — each logged as an ordinary stream, a
//! *leg*; the record names the legs and holds what the chain needs to go on.
//!
//! The record knows nothing of JSON-RPC: requests and answers are kept as
//! the raw JSON text they arrived as. What a task's status is comes from the
//! record and its current leg (`crate::task`), never stored twice.
//!
//! The record is the store contract's, as a session's record and a stream's
//! meta are: every backend keeps it, so it lives below `crate::task` (which
//! reads the log) and is named from there as `task::TaskRecord`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::id::{SessionId, StreamId, TaskId};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: TaskId,
    /// The mount path of the upstream the task runs on.
    pub route: String,
    /// Whose task it is (a digest, as a session's principal): another
    /// principal's task is unknown to it.
    pub principal: String,
    /// The session of a 2025-11-25 task (its legs are streams of that
    /// session, and only that session sees it); none for a modern task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionId>,
    pub created_ms: u64,
    /// When the task last changed (a new leg, input asked or answered, a
    /// cancellation); the current leg's end counts too, read from the leg.
    pub updated_ms: u64,
    /// How long the task is kept from its creation; `ttlMs` on the wire.
    pub ttl_ms: u64,
    /// `pollIntervalMs` on the wire.
    pub poll_interval_ms: u64,
    /// The client's `tools/call` params as sent upstream (raw JSON): the
    /// template every re-issue starts from, so name and arguments stay
    /// byte-equal.
    pub request: String,
    /// The routing headers of the call (`Mcp-Name`, `Mcp-Param-*`), sent
    /// again with every re-issue: the upstream checks them against the
    /// arguments. Never credentials — those come with each client request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    /// One stream per upstream request, oldest first; the last is current.
    pub legs: Vec<StreamId>,
    /// The input the current leg's `input_required` answer asked for, while
    /// not all of it is answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<PendingInput>,
    /// When `tasks/cancel` (or the client leaving before its answer) ended
    /// the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_ms: Option<u64>,
    /// Bumped by every update: two writers never both win (compare-and-set).
    pub version: u64,
}

/// One MRTR round waiting for the client.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PendingInput {
    /// The upstream's `requestState`, verbatim (raw JSON), for the re-issue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_state: Option<String>,
    /// The keys of the upstream's `inputRequests` this round.
    pub asked: Vec<String>,
    /// Key → the client's response (raw JSON), as `tasks/update` brings them.
    #[serde(default)]
    pub answered: BTreeMap<String, String>,
}

impl TaskRecord {
    /// When the task expires and is deleted with its legs.
    pub fn expires_ms(&self) -> u64 {
        self.created_ms.saturating_add(self.ttl_ms)
    }

    /// The leg answering now.
    pub fn current_leg(&self) -> Option<StreamId> {
        self.legs.last().copied()
    }
}
