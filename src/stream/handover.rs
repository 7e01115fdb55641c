//! Hand-over: what this process just appended to a stream, given to the
//! stream's reader here without reading it back from the store.
//!
//! A call's answer is appended and then, most of the time, read at once by
//! the reader attached to the same stream in the same process. Reading it
//! back cost a `pread` per call on the journal and a round trip on Redis,
//! and the final status one more metadata read. So every durable append
//! leaves its batch here, and the reader takes it when it follows its
//! cursor.
//!
//! This module must never be the only way to an entry: it holds only
//! entries the store has made durable, under the seqs the store gave them,
//! and a reader that finds nothing usable here reads the store as before.
//! A missed, stale or overwritten batch costs a read, never an entry, and
//! never repeats one. It holds one batch per attached stream, so its memory
//! is bounded by the readers attached.

use std::sync::Mutex;

use bytes::Bytes;

use crate::id::Seq;
use crate::store::{Entry, StreamStatus};

/// The last batch appended to a stream by this process, while a reader is
/// attached to it here.
#[derive(Default)]
pub struct Handed(Mutex<Option<Batch>>);

struct Batch {
    first: Seq,
    messages: Vec<Bytes>,
    /// The status the batch ended the stream with.
    end: Option<StreamStatus>,
}

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
    /// The status the batch ended the stream with, and the seq it ended at.
    pub end: Option<(Seq, StreamStatus)>,
}

impl Handed {
    /// Leaves the batch that the store just made durable, ending at `last`.
    pub fn put(&self, last: Seq, messages: &[Bytes], end: Option<StreamStatus>) {
        let batch = Batch {
            first: last + 1 - messages.len() as Seq,
            messages: messages.to_vec(),
            end,
        };
        *self.slot() = Some(batch);
    }

    /// Takes what follows `cursor`. A batch that starts past `cursor + 1`
    /// stays: the entries before it are in the store only, and the reader
    /// takes the batch on its next read.
    pub fn after(&self, cursor: Seq) -> Taken {
        let mut slot = self.slot();
        let Some(batch) = slot.take() else {
            return Taken::default();
        };
        let end = batch.end.map(|status| (batch.last(), status));
        if batch.first > cursor + 1 {
            *slot = Some(batch);
            return Taken { entries: None, end };
        }
        let first = batch.first;
        let skip = (cursor + 1 - first) as usize;
        let entries: Vec<Entry> = batch
            .messages
            .into_iter()
            .enumerate()
            .skip(skip)
            .map(|(i, message)| Entry {
                seq: first + i as Seq,
                message,
            })
            .collect();
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
