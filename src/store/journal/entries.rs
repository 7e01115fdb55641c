//! A stream's entries: creating a stream with its opening entries,
//! appending (the final status along), moving the watermark readers follow
//! once what it covers is durable, and reading entries back from the
//! segment files.
//!
//! It must not move a watermark before the entries below it are durable;
//! the write and what follows it are `writing.rs`'s.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::watch;

use super::index::{Index, StreamState};
use super::segment::{Loc, SegmentNo};
use super::{io, record, Inner, Journal, RECORD_TARGET};
use crate::id::{Seq, StreamId};
use crate::store::{
    Along, Entry, Finish, Prior, Result, StoreError, StreamMeta, TaskRecord, UpstreamMark,
    Watermark,
};

impl Journal {
    /// Creates a stream, with its `opening` entries in the same record
    /// write, unless `prior`, asked under the same lock, finds the one it
    /// repeats. Not synced on its own: the first append's sync covers it
    /// (the journal is sequential), and a stream without entries that a
    /// crash loses was never shown to anyone. The opening entries are
    /// written ahead ([`Store::create_with`]): shown once a flush covers
    /// them.
    /// Encoded before the lock: every request creates a stream, and they
    /// all share the lock.
    pub(super) fn create_unless(
        &self,
        meta: &StreamMeta,
        opening: &[Bytes],
        prior: impl FnOnce(&Inner) -> Result<Option<Prior>>,
    ) -> Result<Option<Prior>> {
        let mut encoded = Vec::with_capacity(512);
        record::stream(&mut encoded, meta);
        let placed = encode_entries(&mut encoded, meta.id, 1, opening);
        let state = StreamState::new(meta.clone(), Vec::new());
        let watermark = state.watermark.clone();
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            if let Some(prior) = prior(inner)? {
                return Ok(Some(prior));
            }
            inner.buf.extend_from_slice(&encoded);
            let (no, at) = self.write(inner)?;
            inner.index.add_stream(state, no);
            if !placed.is_empty() {
                inner.index.push_locs(meta.id, &locate(placed, no, at));
            }
            self.wrote(inner);
        }
        if !opening.is_empty() {
            self.show_when_durable(watermark, opening.len() as Seq);
        }
        Ok(None)
    }

    /// Writes entries (and the final status) for one stream, waits once for
    /// durability, then moves the watermark readers follow.
    pub(super) async fn append_inner(
        &self,
        stream: StreamId,
        messages: &[Bytes],
        along: Along<'_>,
    ) -> Result<Seq> {
        let (finish, upstream) = (along.end, along.upstream_event);
        let (last, watermark) = {
            let mut guard = self.lock();
            let inner = &mut *guard;
            // A finished stream appended to (or made live) is whole again.
            self.thaw(inner, stream)?;
            let state = inner
                .index
                .streams
                .get(&stream)
                .ok_or(StoreError::NoSuchStream(stream))?;
            if let Some(caps) = along.caps {
                if !caps.admit(state.meta.entries, state.meta.bytes, messages) {
                    return Err(StoreError::OverCaps(stream));
                }
            }
            let watermark = state.watermark.clone();
            let first = state.locs.len() as Seq + 1;
            let last = first + messages.len() as Seq - 1;
            let placed = encode_entries(&mut inner.buf, stream, first, messages);
            // After the entries it covers, in the same write: a torn write
            // can lose the mark and keep entries (their replay is then
            // recognised), never the other way round.
            let mark = upstream.map(|event_id| UpstreamMark {
                event_id: event_id.to_owned(),
                seq: last,
            });
            if let Some(mark) = &mark {
                record::upstream(&mut inner.buf, stream, mark);
            }
            if let Some(end) = &finish {
                record::status(&mut inner.buf, stream, end);
            }
            let (no, at) = self.write(inner)?;
            inner.index.push_locs(stream, &locate(placed, no, at));
            if let Some(mark) = mark {
                inner.index.set_upstream(stream, mark);
            }
            if let Some(end) = &finish {
                inner.index.set_status(stream, end);
            }
            self.wrote(inner);
            (last, watermark)
        };
        self.durable().await?;
        advance(&watermark, last, finish);
        #[cfg(test)]
        self.retire_if_eager();
        Ok(last)
    }
}

impl Journal {
    /// Moves the watermark over entries written ahead (a new stream's
    /// opening entries, [`Store::create_with`]) once they are durable:
    /// after [`AHEAD_GRACE`], by a flush of their own unless one that
    /// covers them moved it meanwhile (a call answered within the grace
    /// pays one flush for its opening entries and its answer). A failed
    /// flush leaves them unseen: the stream's next append waits for a flush
    /// that covers them too.
    pub(super) fn show_when_durable(&self, watermark: Arc<watch::Sender<Watermark>>, last: Seq) {
        let later = self.commit.later();
        tokio::spawn(async move {
            tokio::time::sleep(AHEAD_GRACE).await;
            if watermark.borrow().seq >= last {
                return;
            }
            if later.durable().await.is_ok() {
                advance(&watermark, last, None);
            }
        });
    }
}

/// How long entries written ahead wait for a flush someone else asks for:
/// a request's opening entries matter to a client whose call runs long,
/// and a fast call's answer is flushed within it anyway.
const AHEAD_GRACE: Duration = Duration::from_millis(5);

/// Moves a stream's watermark to `last` (and its end) once they are
/// durable. Concurrent appends to one stream were written in seq order, so
/// a flush covering this one covers every lower seq too.
fn advance(watermark: &watch::Sender<Watermark>, last: Seq, finish: Option<Finish>) {
    watermark.send_if_modified(|w| {
        let mut moved = false;
        if last > w.seq {
            w.seq = last;
            moved = true;
        }
        if let Some(end) = finish {
            let finished = !end.status.is_live();
            moved |= w.finished != finished;
            w.finished = finished;
        }
        moved
    });
}

impl Journal {
    /// The stream's watermark channel, or for a stream with none (retired,
    /// or one the log lacks) the watermark it ended at.
    pub(super) fn watermark(
        &self,
        stream: StreamId,
    ) -> std::result::Result<Arc<watch::Sender<Watermark>>, Watermark> {
        let index = &self.lock().index;
        if let Some(state) = index.streams.get(&stream) {
            return Ok(state.watermark.clone());
        }
        Err(index
            .retired
            .get(&stream)
            .map_or(crate::store::NO_SUCH_STREAM, |r| Watermark {
                seq: Seq::from(r.entries),
                finished: true,
                coalesced: r.coalesced,
            }))
    }

    /// The metadata of `ids` (whole, or read from their summaries after the
    /// lock); ids gone meanwhile are left out.
    pub(super) fn metas_of(&self, ids: &[StreamId]) -> Result<Vec<StreamMeta>> {
        let mut metas = Vec::with_capacity(ids.len());
        let mut reads = Vec::new();
        {
            let inner = self.lock();
            for id in ids {
                match inner.index.streams.get(id) {
                    Some(state) => metas.push(state.visible()),
                    None => reads.extend(inner.retired_read(id)),
                }
            }
        }
        for read in reads {
            metas.push(read.meta(&self.recent)?);
        }
        Ok(metas)
    }

    /// Writes one metadata record of stream `id` (`encode`), applies it to
    /// the index (`apply`) and waits for durability; returns the stream's
    /// watermark, for the caller to move once readers may see the change.
    /// A retired stream has its summary written again with `edit` applied
    /// instead (and no watermark to move), unless `thaw` asks for it whole.
    pub(super) async fn edit_stream(
        &self,
        id: StreamId,
        encode: impl FnOnce(&mut Vec<u8>),
        apply: impl FnOnce(&mut Index),
        edit: impl FnOnce(&mut StreamMeta),
        thaw: bool,
    ) -> Result<Option<Arc<watch::Sender<Watermark>>>> {
        let watermark = {
            let mut guard = self.lock();
            let inner = &mut *guard;
            if thaw {
                self.thaw(inner, id)?;
            }
            if inner.index.retired.contains(&id) {
                self.resummarize(inner, id, edit)?;
                self.wrote(inner);
                None
            } else {
                let state = inner.index.streams.get(&id);
                let watermark = state.ok_or(StoreError::NoSuchStream(id))?.watermark.clone();
                encode(&mut inner.buf);
                self.write(inner)?;
                apply(&mut inner.index);
                self.wrote(inner);
                Some(watermark)
            }
        };
        self.durable().await?;
        Ok(watermark)
    }
}

impl Journal {
    /// Writes a task record and puts it in the index, if `admit` accepts
    /// the record stored now (`None`: there is none); waits for durability
    /// only when it wrote. Returns whether it wrote.
    pub(super) async fn write_task(
        &self,
        task: &TaskRecord,
        admit: impl FnOnce(Option<&TaskRecord>) -> bool,
    ) -> Result<bool> {
        {
            let mut inner = self.lock();
            // Decided under the lock that orders the journal's writes: two
            // updates of one version cannot both pass.
            if !admit(inner.index.tasks.get(&task.id)) {
                return Ok(false);
            }
            record::task(&mut inner.buf, task);
            let (no, _) = self.write(&mut inner)?;
            inner.index.put_task(task.clone(), no);
            self.wrote(&mut inner);
        }
        self.durable().await?;
        Ok(true)
    }
}

/// Encodes `messages` as entries `first..` of `stream` (split into records
/// of a bounded size); returns where each message sits in `buf`.
pub(super) fn encode_entries(
    buf: &mut Vec<u8>,
    stream: StreamId,
    first: Seq,
    messages: &[Bytes],
) -> Vec<(u64, u32)> {
    let mut placed = Vec::with_capacity(messages.len());
    let mut seq = first;
    for chunk in chunks(messages) {
        placed.extend(record::entries(buf, stream, seq, chunk));
        seq += chunk.len() as Seq;
    }
    placed
}

/// Turns positions in an encoded buffer into entry locations, once the
/// buffer was written to segment `no` at offset `at`.
pub(super) fn locate(placed: Vec<(u64, u32)>, no: SegmentNo, at: u64) -> Vec<Loc> {
    placed
        .into_iter()
        .map(|(offset, len)| Loc {
            segment: no,
            len,
            offset: at + offset,
        })
        .collect()
}

/// Splits a batch into runs small enough for one record each.
fn chunks(messages: &[Bytes]) -> impl Iterator<Item = &[Bytes]> {
    let mut rest = messages;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut size = 0;
        let mut n = 0;
        while n < rest.len() && (n == 0 || size + rest[n].len() <= RECORD_TARGET) {
            size += rest[n].len() + 4;
            n += 1;
        }
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}

/// Reads the message bytes at `locs`, one positioned read per run of
/// neighbouring entries (a batch's entries sit back to back, separated only
/// by their 4-byte length prefixes).
pub(super) fn read_locs(
    file_of: impl Fn(SegmentNo) -> Option<Arc<File>>,
    first: Seq,
    locs: &[Loc],
) -> Result<Vec<Entry>> {
    const NEAR: u64 = 64;
    let mut out = Vec::with_capacity(locs.len());
    let mut i = 0;
    while i < locs.len() {
        let start = locs[i];
        let mut end = start.offset + start.len as u64;
        let mut j = i + 1;
        while j < locs.len()
            && locs[j].segment == start.segment
            && locs[j].offset >= end
            && locs[j].offset - end <= NEAR
        {
            end = locs[j].offset + locs[j].len as u64;
            j += 1;
        }
        let file = file_of(start.segment)
            .ok_or_else(|| StoreError::Corrupt(format!("segment {} is gone", start.segment)))?;
        let mut buf = BytesMut::zeroed((end - start.offset) as usize);
        file.read_exact_at(&mut buf, start.offset).map_err(io)?;
        let span = buf.freeze();
        for (k, loc) in locs[i..j].iter().enumerate() {
            let from = (loc.offset - start.offset) as usize;
            out.push(Entry {
                seq: first + (i + k) as Seq,
                message: span.slice(from..from + loc.len as usize),
            });
        }
        i = j;
    }
    Ok(out)
}
