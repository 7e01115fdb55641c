//! A read-only view of a journal, for operators (`streams list|show`) while
//! the proxy that owns it runs, or after it died.
//!
//! It reads the segment files the way recovery does (`recover.rs`'s scan:
//! metadata replayed from every segment in order, entries from every segment)
//! but it must never write: it takes no lock, creates, truncates and deletes
//! nothing. A torn or half-written record — a crash's tail, or a write the
//! running proxy is making right now — is simply where reading that segment
//! stops. A running proxy also rolls segments over and deletes old ones
//! underneath the reader, so files are read through descriptors held open
//! (a deleted file stays readable), and the directory is listed again after
//! the scan: if the set of segments changed meanwhile, the scan starts over.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use super::index::StreamState;
use super::recover::{self, Metadata, Slots};
use super::retire;
use super::segment;
use super::segment::{Loc, SegmentNo, MAGIC};
use crate::id::{IdMap, Seq, SessionId, StreamId};
use crate::store::{Entry, Result, SessionRecord, StoreError, StreamMeta};

/// Scans before giving up on a directory whose segments keep changing (a
/// rollover takes far less time than a scan of a few segments, so more than
/// a couple of retries means a pathological rollover rate).
const ATTEMPTS: usize = 5;

fn io(e: std::io::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// What a journal held when it was read.
pub struct JournalView {
    pub sessions: IdMap<SessionId, SessionRecord>,
    streams: IdMap<StreamId, (StreamMeta, Vec<Loc>)>,
    /// Every segment read, kept open so entries can be read after a running
    /// proxy deleted the file.
    files: HashMap<SegmentNo, Arc<File>>,
    /// What the operator should know about the reading (damage found in a
    /// sealed segment, a directory that would not hold still).
    pub notes: Vec<String>,
}

impl JournalView {
    /// Reads the journal under `data_dir/journal`.
    pub fn open(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join("journal");
        let mut numbers = list(&dir)?;
        if numbers.is_empty() {
            return Err(StoreError::Backend(format!(
                "no journal segments in {}",
                dir.display()
            )));
        }
        for _ in 1..ATTEMPTS {
            let view = Self::read(&dir, &numbers)?;
            let now = list(&dir)?;
            if let Some(view) = view.filter(|_| now == numbers) {
                return Ok(view);
            }
            numbers = now;
        }
        // Last try: a segment that vanishes now is read as absent, and the
        // operator is told the view may be inconsistent.
        let mut view = Self::read(&dir, &numbers)?.unwrap_or_else(Self::empty);
        view.notes.push(format!(
            "the segments in {} kept changing while being read; this view may miss entries",
            dir.display()
        ));
        Ok(view)
    }

    fn empty() -> Self {
        Self {
            sessions: IdMap::default(),
            streams: IdMap::default(),
            files: HashMap::new(),
            notes: Vec::new(),
        }
    }

    /// One scan of segments `numbers`; `None` if one of them vanished (the
    /// proxy deleted it after the listing: the caller lists again).
    fn read(dir: &Path, numbers: &[SegmentNo]) -> Result<Option<Self>> {
        let mut view = Self::empty();
        let mut entries = Slots::default();
        let mut metadata = Metadata::default();
        let mut bytes = Vec::new();
        for (i, &no) in numbers.iter().enumerate() {
            let is_last = i + 1 == numbers.len();
            let path = segment::path(dir, no);
            let file = match File::open(&path) {
                Ok(f) => Arc::new(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io(e)),
            };
            // Too short for its header: being created right now (or a crash
            // did that); it holds nothing yet.
            if !segment::read_open(&file, dir, no, &mut bytes).map_err(io)? {
                continue;
            }
            let scanned =
                recover::scan_segment(&bytes, no, MAGIC.len(), &mut entries, &mut metadata);
            if let (Some(why), false) = (&scanned.torn, is_last) {
                // In the newest segment this is a write in progress or a
                // crash's tail; in a sealed one it is damage, worth a word.
                view.notes.push(format!(
                    "{}: reading stopped at byte {}: {why}",
                    path.display(),
                    scanned.end
                ));
            }
            view.files.insert(no, file);
        }
        view.sessions = metadata.sessions;
        for (meta, locs) in recover::streams(metadata.streams, entries) {
            // Counted from the entries found, as the journal counts them.
            let state = StreamState::new(meta, locs);
            view.streams.insert(state.meta.id, (state.meta, state.locs));
        }
        let retired = &metadata.retired;
        for (id, place) in retired
            .ids()
            .into_iter()
            .filter_map(|id| Some((id, retired.get(&id)?.summary)))
        {
            let Some(file) = view.files.get(&place.segment) else {
                continue;
            };
            match retire::read_summary(file, place) {
                Ok(summary) => {
                    view.streams.insert(id, (summary.meta, summary.locs));
                }
                Err(e) => view.notes.push(format!("stream {id}: {e}")),
            }
        }
        Ok(Some(view))
    }

    /// Every stream, in no particular order.
    pub fn streams(&self) -> impl Iterator<Item = &StreamMeta> {
        self.streams.values().map(|(meta, _)| meta)
    }

    pub fn stream(&self, id: StreamId) -> Option<&StreamMeta> {
        self.streams.get(&id).map(|(meta, _)| meta)
    }

    /// The stream's last `n` entries, oldest first (none for an unknown
    /// stream).
    pub fn last_entries(&self, id: StreamId, n: usize) -> Result<Vec<Entry>> {
        let Some((_, locs)) = self.streams.get(&id) else {
            return Ok(Vec::new());
        };
        let start = locs.len().saturating_sub(n);
        let file_of = |no| self.files.get(&no).cloned();
        super::entries::read_locs(file_of, start as Seq + 1, &locs[start..])
    }
}

/// The segments in `dir`; a missing directory is a clear error, not "no
/// such file".
fn list(dir: &Path) -> Result<Vec<SegmentNo>> {
    segment::list(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            StoreError::Backend(format!("no journal in {}", dir.display()))
        }
        _ => io(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::commit::SyncMode;
    use crate::store::contract::meta;
    use crate::store::journal::Journal;
    use crate::store::{Finish, Outcome, Store, StreamStatus};
    use bytes::Bytes;
    use std::path::PathBuf;

    fn segment_files(dir: &Path) -> Vec<(PathBuf, u64)> {
        let dir = dir.join("journal");
        let mut out: Vec<_> = segment::list(&dir)
            .unwrap()
            .into_iter()
            .map(|no| {
                let path = segment::path(&dir, no);
                let len = std::fs::metadata(&path).unwrap().len();
                (path, len)
            })
            .collect();
        out.sort();
        out
    }

    #[tokio::test]
    async fn a_running_journal_is_read_without_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        let session = crate::id::SessionId::random();
        let (live, done) = (meta(session), meta(session));
        for m in [&live, &done] {
            journal.create_stream(m).await.unwrap();
        }
        journal
            .append(live.id, &[Bytes::from_static(b"{\"a\":1}")])
            .await
            .unwrap();
        let end = Finish::new(StreamStatus::Completed, Some(Outcome::Result));
        journal
            .append_final(
                done.id,
                &[Bytes::from_static(b"1"), Bytes::from_static(b"22")],
                end,
            )
            .await
            .unwrap();

        let view = JournalView::open(dir.path()).unwrap();
        let live_seen = view.stream(live.id).unwrap();
        assert_eq!(
            (live_seen.status, live_seen.entries),
            (StreamStatus::Live, 1)
        );
        let done_seen = view.stream(done.id).unwrap();
        assert_eq!(
            (done_seen.status, done_seen.entries, done_seen.bytes),
            (StreamStatus::Completed, 2, 3)
        );
        let last = view.last_entries(done.id, 1).unwrap();
        assert_eq!(
            last,
            vec![Entry {
                seq: 2,
                message: Bytes::from_static(b"22")
            }]
        );
        // The journal is still the one writer: it keeps appending.
        journal
            .append(live.id, &[Bytes::from_static(b"2")])
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_torn_tail_is_where_reading_stops_and_is_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let journal = Journal::open(dir.path(), SyncMode::Batch).unwrap();
            let m = meta(crate::id::SessionId::random());
            journal.create_stream(&m).await.unwrap();
            journal
                .append(m.id, &[Bytes::from_static(b"kept")])
                .await
                .unwrap();
            m.id
        };
        // A half-written record after the last good one: a length and a
        // checksum that promise more than follows.
        let (path, _) = segment_files(dir.path()).pop().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
        let mut torn = bytes.clone();
        torn[end..end + 9].copy_from_slice(&[40, 0, 0, 0, 1, 2, 3, 4, 5]);
        std::fs::write(&path, &torn).unwrap();
        let before = segment_files(dir.path());

        let view = JournalView::open(dir.path()).unwrap();
        assert_eq!(view.stream(id).unwrap().entries, 1);
        assert_eq!(
            view.last_entries(id, 5).unwrap()[0].message,
            Bytes::from_static(b"kept")
        );
        assert_eq!(segment_files(dir.path()), before, "nothing cut or removed");
        assert_eq!(std::fs::read(&path).unwrap(), torn);
    }

    #[test]
    fn a_directory_without_a_journal_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = JournalView::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("no journal in"), "{err}");
    }
}
