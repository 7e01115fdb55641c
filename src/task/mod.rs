//! Tasks: a long `tools/call` made durable — for modern clients (the
//! 2026-07-28 extension, served over HTTP by `proxy::tasks`) and for
//! 2025-11-25 sessions (the experimental tasks, served on the session path
//! by `dialect::legacy_tasks`). This folder owns what both share and what
//! each shows on its wire; it does no HTTP and routes nothing, and imports
//! neither `proxy` nor `dialect` (they import it).
//!
//! A task's record is the store contract's (`store::task`, re-exported
//! here): the store keeps it and must not import this folder, which reads
//! the log.
//!
//! Layout: `status` (where a task stands, what its answer was); `state` (a
//! task read from its record and current leg, changed by compare-and-set,
//! cancelled); `wire` (a task as either revision shows it: one shape, two
//! names); `modern` (the 2026-07-28 extension's wire shapes); `legacy`
//! (the 2025-11-25 experimental tasks' wire shapes).

pub mod legacy;
pub mod modern;
mod state;
mod status;
pub mod wire;

pub use crate::store::{PendingInput, TaskRecord};
pub use state::{belongs, cancel, change, read, Leg, Seen};
pub use status::{Answer, TaskStatus};
