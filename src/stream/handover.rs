//! Hand-over: what this process just appended to a stream, given to the
//! stream's reader here without reading it back from the store.
//!
//! A call's answer is appended and then, most of the time, read at once by
//! the reader attached to the same stream in the same process. Reading it
//! back cost a `pread` per call on the journal and a round trip on Redis,
//! and the final status one more metadata read. So every append leaves its
//! entries here, and the reader takes them when it follows its cursor.
//! Entries written ahead (a request's opening entries) are left here at
//! once, before they are durable: the reader takes only what the watermark
//! it woke for covers, so nothing shows before the store made it durable.
//!
//! This module must never be the only way to an entry: it holds entries
//! under the seqs the store gave them, and a reader that finds nothing
//! usable here reads the store as before. A missed, stale or overwritten
//! run costs a read, never an entry, and never repeats one. It holds one
//! run of consecutive entries per attached stream, at most [`MAX_HELD`]
//! long, so its memory is bounded by the readers attached.

use std::sync::Mutex;

use bytes::Bytes;

use crate::id::Seq;
use crate::store::{Entry, Finish};

/// The last entries appended to a stream by this process, while a reader
/// is attached to it here.
#[derive(Default)]
pub struct Handed(Mutex<Option<Batch>>);

/// Consecutive entries: appends that follow one another join one run.
struct Batch {
    first: Seq,
    messages: Vec<Bytes>,
    /// How the batch ended the stream.
    end: Option<Finish>,
}

/// The most entries held for one reader: a reader that falls behind a
/// stream appended faster than it reads gets the newest run and reads the
/// rest from the store.
pub const MAX_HELD: usize = 256;

impl Batch {
    fn last(&self) -> Seq {
        // `first` is at least 1 (seqs start at 1), so an empty batch — a
        // finish without entries — ends just before it.
        self.first + self.messages.len() as Seq - 1
    }
}

/// What a reader at some cursor takes from the hand-over.
#[derive(Default)]
pub struct Taken {
    /// The entries after the cursor (`None`: read the store).
    pub entries: Option<Vec<Entry>>,
    /// How the batch ended the stream, and the seq it ended at.
    pub end: Option<(Seq, Finish)>,
}

impl Handed {
    /// Leaves the entries just appended, ending at `last`: joined to the
    /// run held when they follow it, else in its place.
    pub fn put(&self, last: Seq, messages: &[Bytes], end: Option<Finish>) {
        let first = last + 1 - messages.len() as Seq;
        let mut slot = self.slot();
        if let Some(run) = slot.as_mut() {
            if run.last() + 1 == first && run.messages.len() + messages.len() <= MAX_HELD {
                run.messages.extend_from_slice(messages);
                run.end = end;
                return;
            }
        }
        *slot = Some(Batch {
            first,
            messages: messages.to_vec(),
            end,
        });
    }

    /// Takes what follows `cursor`, up to `upto` (what the store has made
    /// durable). A run that starts past `cursor + 1` stays: the entries
    /// before it are in the store only, and the reader takes the run on its
    /// next read. Entries past `upto` stay for the next read too.
    pub fn after(&self, cursor: Seq, upto: Seq) -> Taken {
        let mut slot = self.slot();
        let Some(mut run) = slot.take() else {
            return Taken::default();
        };
        if run.first > cursor + 1 {
            *slot = Some(run);
            return Taken::default();
        }
        let skip = (cursor + 1 - run.first) as usize;
        let through = run.last().min(upto);
        let take = (through + 1).saturating_sub(cursor + 1) as usize;
        let end = match run.end {
            Some(finish) if through == run.last() => Some((through, finish)),
            _ => None,
        };
        let drained = (skip + take).min(run.messages.len());
        let entries: Vec<Entry> = run
            .messages
            .drain(..drained)
            .skip(skip)
            .enumerate()
            .map(|(i, message)| Entry {
                seq: cursor + 1 + i as Seq,
                message,
            })
            .collect();
        if !run.messages.is_empty() {
            run.first += drained as Seq;
            *slot = Some(run);
        }
        Taken {
            entries: (!entries.is_empty()).then_some(entries),
            end,
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Batch>> {
        // A batch is replaced whole under the lock: a panic elsewhere
        // cannot leave half of one.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Outcome, StreamStatus};

    fn completed() -> Finish {
        Finish {
            status: StreamStatus::Completed,
            outcome: Some(Outcome::Result),
            at_ms: 1,
        }
    }

    fn numbered(range: std::ops::Range<u64>) -> Vec<Bytes> {
        range.map(|i| Bytes::from(i.to_string())).collect()
    }

    fn seqs(taken: &Taken) -> Vec<Seq> {
        let entries = taken.entries.as_deref().unwrap_or_default();
        entries.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn appends_that_follow_one_another_are_taken_in_one_read() {
        let handed = Handed::default();
        handed.put(2, &numbered(1..3), None);
        handed.put(3, &numbered(3..4), Some(completed()));
        let taken = handed.after(0, 3);
        assert_eq!(seqs(&taken), vec![1, 2, 3]);
        assert_eq!(taken.end, Some((3, completed())));
    }

    #[test]
    fn entries_past_the_durable_mark_wait_for_the_next_read() {
        let handed = Handed::default();
        handed.put(3, &numbered(1..4), Some(completed()));
        let first = handed.after(0, 2);
        assert_eq!(seqs(&first), vec![1, 2]);
        assert_eq!(first.end, None, "the end is not durable yet");
        assert!(handed.after(2, 2).entries.is_none(), "nothing durable left");
        let rest = handed.after(2, 3);
        assert_eq!(seqs(&rest), vec![3]);
        assert_eq!(rest.end, Some((3, completed())));
    }

    #[test]
    fn an_append_that_does_not_follow_replaces_the_run() {
        let handed = Handed::default();
        handed.put(5, &numbered(4..6), None);
        handed.put(3, &numbered(1..4), None);
        assert_eq!(seqs(&handed.after(0, 5)), vec![1, 2, 3]);
        assert!(
            handed.after(3, 5).entries.is_none(),
            "4..=5 are read from the store"
        );
    }

    #[test]
    fn a_run_never_holds_more_than_max_held_entries() {
        let handed = Handed::default();
        let max = MAX_HELD as u64;
        handed.put(max, &numbered(0..max), None);
        handed.put(max + 1, &numbered(max..max + 1), None);
        let taken = handed.after(0, max + 1);
        assert!(
            taken.entries.is_none(),
            "the newest run starts past the cursor"
        );
        assert_eq!(seqs(&handed.after(max, max + 1)), vec![max + 1]);
    }
}
