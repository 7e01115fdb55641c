//! Readers: replay after a cursor, then follow live, until the stream ends,
//! is taken over or is deleted.
//!
//! A reader owns its cursor and nothing else: it reads through the store,
//! or takes what this process just appended from the hand-over
//! (`handover.rs`), and never writes an entry. An *exclusive* reader can be
//! replaced by a newer one (a generation per stream, kept by [`Log`]); a
//! *watching* one never takes a stream over.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::handover::Handed;
use super::Log;
use crate::id::{Seq, StreamId};
use crate::jsonrpc;
use crate::store::{Entry, Finish, Outcome, ReaderLease, Result, StoreError, StreamStatus};

/// How many entries a reader takes from the store at once.
const READ_BATCH: usize = 256;

/// What a reader found.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The next entries, in order; the cursor has moved past them.
    Entries(Vec<Entry>),
    /// Nothing arrived within the idle time (time for a keep-alive).
    Idle,
    /// Every entry was delivered and the stream is no longer live.
    End(StreamStatus),
    /// Another reader attached to the stream.
    Replaced,
    /// The stream was deleted (session ended or retention ran out).
    Gone,
}

pub struct Reader {
    log: Arc<Log>,
    stream: StreamId,
    cursor: Seq,
    exclusive: Option<Exclusive>,
    /// How a handed batch ended the stream, and its last seq: a reader
    /// past it knows the end without asking the store.
    ended: Option<(Seq, Finish)>,
    /// How the stream's request ended, once this reader reached the end.
    outcome: Option<Outcome>,
    /// For an exclusive reader, once it first waited: its hold on the stream
    /// against readers of other processes sharing the log.
    lease: Option<ReaderLease>,
    /// When this reader last re-armed the stream's abandonment.
    touched: Option<tokio::time::Instant>,
}

/// What makes a reader exclusive.
pub(super) struct Exclusive {
    /// The stream's reader generation, and the one this reader was
    /// attached as.
    generation: watch::Receiver<u64>,
    mine: u64,
    /// Where this process's appends are handed to the reader.
    handed: Arc<Handed>,
}

impl Exclusive {
    pub(super) fn new(generation: watch::Receiver<u64>, handed: Arc<Handed>) -> Self {
        let mine = *generation.borrow();
        Self {
            generation,
            mine,
            handed,
        }
    }
}

/// How often a reader on a shared log tells the other instances it still
/// reads (see `Reader::still_reading`).
const TOUCH_WHILE_READING: Duration = Duration::from_secs(10);

impl Reader {
    pub(super) fn new(
        log: Arc<Log>,
        stream: StreamId,
        after: Seq,
        exclusive: Option<Exclusive>,
    ) -> Self {
        Self {
            log,
            stream,
            cursor: after,
            // Whoever attaches has just opened, resumed or polled the
            // stream; a watcher touches nothing.
            touched: exclusive.is_some().then(tokio::time::Instant::now),
            exclusive,
            ended: None,
            outcome: None,
            lease: None,
        }
    }

    pub fn stream(&self) -> StreamId {
        self.stream
    }

    pub fn cursor(&self) -> Seq {
        self.cursor
    }

    /// How the stream's request ended (a result or a JSON-RPC error), once
    /// [`Reader::next`] said `End`.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Notes that this reader's answer ran to the stream's end (see
    /// [`Log::wrote_to_end`]).
    pub fn wrote_to_end(&self) {
        self.log.wrote_to_end(self.stream);
    }

    fn replaced(&self) -> bool {
        let here = self.exclusive.as_ref().is_some_and(|e| {
            e.generation.has_changed().is_err() || *e.generation.borrow() != e.mine
        });
        here || self.lease.as_ref().is_some_and(ReaderLease::lost)
    }

    pub async fn next(&mut self, idle: Duration) -> Result<Next> {
        let deadline = tokio::time::Instant::now() + idle;
        if self.exclusive.is_some() && self.lease.is_none() {
            // A reader replaced before it ever read must not claim the
            // stream from a newer one elsewhere.
            if self.replaced() {
                return Ok(Next::Replaced);
            }
            self.lease = Some(self.log.store.hold_reader(self.stream).await?);
        }
        loop {
            if self.replaced() {
                return Ok(Next::Replaced);
            }
            // Subscribe before reading, so an append landing between the read
            // and the wait still wakes us.
            let mut appended = self.log.store.subscribe(self.stream).await;
            let mark = *appended.borrow_and_update();
            if mark.seq > self.cursor {
                if let Some(entries) = self.take(mark.seq, mark.coalesced).await? {
                    self.still_reading().await;
                    return Ok(Next::Entries(entries));
                }
            }
            if mark.finished {
                // A stream leaves `Live` only after its last append, so a
                // finished watermark at or below the cursor means the reader
                // has seen everything.
                if let Some((last, end)) = self.ended {
                    if last <= self.cursor {
                        self.outcome = end.outcome;
                        return Ok(Next::End(end.status));
                    }
                }
                return Ok(match self.log.store.stream_meta(self.stream).await? {
                    Some(meta) => {
                        self.outcome = meta.outcome;
                        Next::End(meta.status)
                    }
                    None => Next::Gone,
                });
            }
            if self.log.store.flush_failed() {
                // Nothing will move any more: what was durable was read. (The
                // store wakes every stream's readers when it stops.)
                return Err(StoreError::Stopped);
            }
            let replaced = async {
                match self.exclusive.as_mut() {
                    Some(exclusive) => {
                        let _ = exclusive.generation.changed().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let taken = async {
                match self.lease.as_mut() {
                    Some(lease) => lease.taken().await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                changed = appended.changed() => {
                    if changed.is_err() && self.log.store.stream_meta(self.stream).await?.is_none() {
                        return Ok(Next::Gone);
                    }
                }
                _ = replaced => return Ok(Next::Replaced),
                _ = taken => return Ok(Next::Replaced),
                _ = tokio::time::sleep_until(deadline) => {
                    self.still_reading().await;
                    return Ok(Next::Idle);
                }
            }
        }
    }

    /// An exclusive reader on a log other instances share re-arms the
    /// stream's abandonment every [`TOUCH_WHILE_READING`]: their sweepers
    /// cannot see that it is read here (this process's own sweeper can,
    /// [`Log::is_read`]).
    async fn still_reading(&mut self) {
        if self.exclusive.is_none() || !self.log.store.shared() {
            return;
        }
        let now = tokio::time::Instant::now();
        if self
            .touched
            .is_some_and(|at| now - at < TOUCH_WHILE_READING)
        {
            return;
        }
        self.touched = Some(now);
        if let Err(e) = self.log.touch(self.stream).await {
            tracing::debug!(stream = %self.stream, error = %e, "cannot touch a stream being read");
        }
    }

    async fn take(&mut self, durable: Seq, coalesced: bool) -> Result<Option<Vec<Entry>>> {
        let mut entries = match self.handed(durable) {
            Some(entries) => entries,
            None => {
                self.log
                    .store
                    .read_after(self.stream, self.cursor, READ_BATCH)
                    .await?
            }
        };
        let Some(last) = entries.last().map(|e| e.seq) else {
            return Ok(None);
        };
        self.cursor = last;
        if coalesced {
            keep_latest_progress(&mut entries, |e| &e.message);
        }
        Ok(Some(entries))
    }
}

impl Reader {
    /// The entries after the cursor, up to `durable`, that this process
    /// just appended, if the run handed over follows the cursor (`None`:
    /// read the store).
    pub(super) fn handed(&mut self, durable: Seq) -> Option<Vec<Entry>> {
        let taken = self.exclusive.as_ref()?.handed.after(self.cursor, durable);
        if taken.end.is_some() {
            self.ended = taken.end;
        }
        taken.entries
    }
}

/// Keeps only the latest progress notification of each token among
/// `items` (what `message` reads from each); everything else stays, in
/// order. A stream past its caps coalesces progress with it twice: when a
/// batch is appended, and when a range is replayed (seqs stay where they are:
/// the gaps are skips, not holes in the log).
pub fn keep_latest_progress<T>(items: &mut Vec<T>, message: impl Fn(&T) -> &[u8]) {
    let tokens: Vec<Option<String>> = items
        .iter()
        .map(|item| jsonrpc::progress_of(message(item)))
        .collect();
    let mut seen: HashSet<&String> = HashSet::new();
    let mut keep = vec![true; items.len()];
    for (i, token) in tokens.iter().enumerate().rev() {
        if let Some(token) = token {
            keep[i] = seen.insert(token);
        }
    }
    let mut keep = keep.into_iter();
    items.retain(|_| keep.next().unwrap_or(true));
}

impl Drop for Reader {
    fn drop(&mut self) {
        // Forget the generation channel once nobody reads the stream, unless a
        // newer reader has taken it.
        if let Some(exclusive) = &self.exclusive {
            let mine = exclusive.mine;
            self.log
                .readers
                .remove_if(&self.stream, |_, a| *a.generation.borrow() == mine);
        }
    }
}
