//! The one-byte codes of a stream's status and outcome, shared by the
//! journal's records (`record.rs`) and its stream summaries (`summary.rs`):
//! written on disk, so a code never changes meaning once written.

use crate::store::{Outcome, StreamStatus};

pub fn status_byte(s: StreamStatus) -> u8 {
    match s {
        StreamStatus::Live => 0,
        StreamStatus::Completed => 1,
        StreamStatus::Failed => 2,
        StreamStatus::Cancelled => 3,
    }
}

pub fn status_of(b: u8) -> Option<StreamStatus> {
    Some(match b {
        0 => StreamStatus::Live,
        1 => StreamStatus::Completed,
        2 => StreamStatus::Failed,
        3 => StreamStatus::Cancelled,
        _ => return None,
    })
}

pub fn outcome_byte(o: Option<Outcome>) -> u8 {
    match o {
        None => 0,
        Some(Outcome::Result) => 1,
        Some(Outcome::Error) => 2,
    }
}

pub fn outcome_of(b: u8) -> Option<Option<Outcome>> {
    Some(match b {
        0 => None,
        1 => Some(Outcome::Result),
        2 => Some(Outcome::Error),
        _ => return None,
    })
}
