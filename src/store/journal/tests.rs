//! The journal's own behaviour beyond the store contract: segments,
//! rollover, copying forward, recovery from torn and damaged files.

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use super::entries::encode_entries;
use super::*;
use crate::id::{Seq, SessionId, StreamId, TaskId};
use crate::store::contract::{leg, meta, session, task, Churn};
use crate::store::{now_ms, Finish, SharedStore, Store};

crate::store::contract::contract_tests!(|dir: &Path, sync| -> SharedStore {
    Journal::open(dir, sync).unwrap()
});

/// The contract again, a checkpoint taken after every change: every
/// restart starts from one.
mod checkpointed {
    use super::*;

    crate::store::contract::contract_tests!(|dir: &Path, sync| -> SharedStore {
        let journal = Journal::open(dir, sync).unwrap();
        journal.retire_eagerly();
        journal.checkpoint_eagerly();
        journal
    });
}

/// The contract again, every finished stream retired the moment it can be.
mod retired {
    use super::*;

    crate::store::contract::contract_tests!(|dir: &Path, sync| -> SharedStore {
        let journal = Journal::open(dir, sync).unwrap();
        journal.retire_eagerly();
        journal
    });
}

const SMALL: u64 = 64 * 1024;

fn progress(i: u32) -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"p","progress":{i}}}}}"#
    ))
}

fn segments(dir: &Path) -> Vec<SegmentNo> {
    segment::list(&dir.join("journal")).unwrap()
}

#[tokio::test]
async fn a_stream_spanning_segments_reads_back_whole_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let m = meta(SessionId::random());
    let want: Vec<Bytes> = (0..2000).map(progress).collect();
    {
        let store = Journal::open_with(dir.path(), SyncMode::Batch, SMALL).unwrap();
        store.create_stream(&m).await.unwrap();
        for chunk in want.chunks(7) {
            store.append(m.id, chunk).await.unwrap();
        }
        assert!(store.lock().index.streams[&m.id].segments.len() > 2);
    }
    let store = Journal::open_with(dir.path(), SyncMode::Batch, SMALL).unwrap();
    let mut got = Vec::new();
    let mut after = 0;
    loop {
        let batch = store.read_after(m.id, after, 333).await.unwrap();
        let Some(last) = batch.last() else { break };
        after = last.seq;
        got.extend(batch.into_iter().map(|e| e.message));
    }
    assert_eq!(got, want);
}

#[tokio::test]
async fn segments_are_deleted_once_no_stream_has_entries_in_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Journal::open_with(dir.path(), SyncMode::Never, SMALL).unwrap();
    let mut churn = Churn::new(100);
    let mut sizes = Vec::new();
    for i in 1..=10_000u32 {
        churn.step(&*store, progress(i)).await;
        if i % 2000 == 0 {
            sizes.push(store.size_on_disk());
        }
    }
    // 10,000 streams write ~3 MiB of records; with deletions keeping 100
    // alive, the journal holds a few 64 KiB segments plus zero fill.
    assert!(
        sizes.iter().all(|&s| s < 3 * 1024 * 1024),
        "journal kept growing: {sizes:?}"
    );
    assert!(
        segments(dir.path()).len() < 10,
        "{:?}",
        segments(dir.path())
    );
}

#[tokio::test]
async fn a_long_lived_stream_does_not_pin_the_segments_it_wrote_to() {
    let dir = tempfile::tempdir().unwrap();
    let store = Journal::open_with(dir.path(), SyncMode::Never, SMALL).unwrap();
    // A GET stream that gets one message now and then, for the whole
    // run, while short calls come and go around it.
    let long = meta(SessionId::random());
    store.create_stream(&long).await.unwrap();
    let mut want = Vec::new();
    let mut churn = Churn::new(100);
    for i in 1..=10_000u32 {
        if i % 50 == 0 {
            want.push(progress(i));
            store.append(long.id, &[progress(i)]).await.unwrap();
        }
        churn.step(&*store, progress(i)).await;
    }
    // ~3 MiB written through 64 KiB segments; without copying forward
    // the long stream would keep nearly all of them.
    let count = segments(dir.path()).len();
    assert!(count < 10, "{count} segments kept");
    let read = |store: Arc<Journal>| async move {
        store
            .read_after(long.id, 0, 1000)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.message)
            .collect::<Vec<_>>()
    };
    assert_eq!(read(store.clone()).await, want);
    drop(store);
    let store = Journal::open_with(dir.path(), SyncMode::Never, SMALL).unwrap();
    assert_eq!(read(store.clone()).await, want);
    assert_eq!(
        store.append(long.id, &[progress(0)]).await.unwrap(),
        want.len() as Seq + 1
    );
}

#[tokio::test]
async fn an_append_that_fills_a_segment_stays_readable_across_the_rollover_it_causes() {
    let dir = tempfile::tempdir().unwrap();
    let big = Bytes::from(vec![b'x'; 100 * 1024]);
    let m = meta(SessionId::random());
    {
        let store = Journal::open_with(dir.path(), SyncMode::Batch, SMALL).unwrap();
        store.create_stream(&m).await.unwrap();
        store
            .append(m.id, std::slice::from_ref(&big))
            .await
            .unwrap();
        let got = store.read_after(m.id, 0, 10).await.unwrap();
        assert_eq!(got[0].message, big);
    }
    let store = Journal::open_with(dir.path(), SyncMode::Batch, SMALL).unwrap();
    assert_eq!(store.read_after(m.id, 0, 10).await.unwrap()[0].message, big);
}

#[tokio::test]
async fn a_torn_last_record_is_cut_off_and_everything_before_it_kept() {
    let dir = tempfile::tempdir().unwrap();
    let m = meta(SessionId::random());
    {
        let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        store.create_stream(&m).await.unwrap();
        store
            .append(m.id, &[progress(1), progress(2)])
            .await
            .unwrap();
        store.append(m.id, &[progress(3)]).await.unwrap();
        let inner = store.lock();
        // Tear the last record: keep all but its final 5 bytes.
        inner.writer.file.set_len(inner.writer.len - 5).unwrap();
    }
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    let got = store.read_after(m.id, 0, 10).await.unwrap();
    assert_eq!(
        got.into_iter().map(|e| e.message).collect::<Vec<_>>(),
        vec![progress(1), progress(2)]
    );
    assert_eq!(store.append(m.id, &[progress(9)]).await.unwrap(), 3);
    drop(store);
    // The cut is durable: opening again finds the same three entries.
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    assert_eq!(store.read_after(m.id, 0, 10).await.unwrap().len(), 3);
}

#[tokio::test]
async fn damage_followed_by_good_records_is_refused_with_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        store
            .put_session(&session(SessionId::random()))
            .await
            .unwrap();
        let m = meta(SessionId::random());
        store.create_stream(&m).await.unwrap();
        store.append(m.id, &[progress(1)]).await.unwrap();
    }
    // Damage the first record of segment 1 (the last one): records
    // follow it, so this is not a torn tail to cut off.
    let first = segment::path(&dir.path().join("journal"), 1);
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[segment::MAGIC.len() + 10] ^= 0xff;
    std::fs::write(&first, bytes).unwrap();
    let err = Journal::open(dir.path(), SyncMode::Batch)
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("0000000001.seg") && text.contains("checksum"),
        "{text}"
    );
}

#[tokio::test]
async fn a_foreign_file_named_like_a_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("journal")).unwrap();
    std::fs::write(
        segment::path(&dir.path().join("journal"), 1),
        b"not a journal at all",
    )
    .unwrap();
    let err = Journal::open(dir.path(), SyncMode::Batch)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not a journal segment"), "{err}");
}

#[tokio::test]
async fn a_second_process_cannot_open_the_same_journal() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    // flock is per open file description, so a second open in this
    // process conflicts just as another process would.
    let err = Journal::open(dir.path(), SyncMode::Batch)
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("in use by another process"),
        "{err}"
    );
}

#[tokio::test]
async fn a_crash_during_rollover_leaves_a_journal_that_opens() {
    let dir = tempfile::tempdir().unwrap();
    let m = meta(SessionId::random());
    {
        let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        store.create_stream(&m).await.unwrap();
        store.append(m.id, &[progress(1)]).await.unwrap();
    }
    // The next segment was created, and the crash came in the middle of
    // its first record: only part of it made it.
    let journal = dir.path().join("journal");
    let next = segments(dir.path()).last().unwrap() + 1;
    let mut partial = segment::MAGIC.to_vec();
    let mut snap = Vec::new();
    record::stream(&mut snap, &m);
    partial.extend_from_slice(&snap[..snap.len() / 2]);
    std::fs::write(segment::path(&journal, next), partial).unwrap();
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    let reopened = store.stream_meta(m.id).await.unwrap().unwrap();
    assert_eq!(
        (reopened.id, reopened.status, reopened.entries),
        (m.id, m.status, 1)
    );
    assert_eq!(store.read_after(m.id, 0, 10).await.unwrap().len(), 1);
}

#[tokio::test]
async fn concurrent_appends_to_one_stream_get_distinct_ordered_seqs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    let m = meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    let writers: Vec<_> = (0..8u32)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    store.append(m.id, &[progress(w * 1000 + i)]).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let got = store.read_after(m.id, 0, 1000).await.unwrap();
    assert_eq!(got.len(), 400);
    assert!(got.iter().zip(1..).all(|(e, s)| e.seq == s));
    assert_eq!(store.subscribe(m.id).await.borrow().seq, 400);
}

#[tokio::test]
async fn a_rollover_writes_nothing_again_for_the_streams_the_log_retains() {
    let dir = tempfile::tempdir().unwrap();
    let store = Journal::open_with(dir.path(), SyncMode::Never, 4096).unwrap();
    let session = SessionId::random();
    // Retained streams whose records alone outgrow a segment.
    for _ in 0..100 {
        let m = meta(session);
        store.create_stream(&m).await.unwrap();
        store.append(m.id, &[progress(1)]).await.unwrap();
    }
    let m = meta(session);
    store.create_stream(&m).await.unwrap();
    let before = segments(dir.path()).last().copied().unwrap();
    while segments(dir.path()).last().copied().unwrap() == before {
        store.append(m.id, &[progress(2)]).await.unwrap();
    }
    let fresh = store.lock().writer.len;
    assert_eq!(
        fresh,
        segment::MAGIC.len() as u64,
        "the new segment starts empty"
    );
}

#[tokio::test]
async fn a_deleted_stream_stays_deleted_while_an_older_segment_keeps_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let session = SessionId::random();
    let (gone, kept) = (meta(session), meta(session));
    {
        let store = Journal::open_with(dir.path(), SyncMode::Batch, SMALL).unwrap();
        store.create_stream(&gone).await.unwrap();
        store.create_stream(&kept).await.unwrap();
        // Enough of `kept` in segment 1 that it is not mostly dead.
        for i in 0..300 {
            store.append(kept.id, &[progress(i)]).await.unwrap();
        }
        let filler = meta(session);
        store.create_stream(&filler).await.unwrap();
        let fill_up = |store: Arc<Journal>| async move {
            let from = store.lock().writer.no;
            while store.lock().writer.no == from {
                store.append(filler.id, &[progress(0)]).await.unwrap();
            }
        };
        fill_up(store.clone()).await;
        // The tombstone goes to segment 2, which then holds nothing needed
        // once `filler` is gone: it must stay while segment 1 does.
        store.delete_stream(gone.id).await.unwrap();
        fill_up(store.clone()).await;
        store.delete_stream(filler.id).await.unwrap();
        assert!(segments(dir.path()).contains(&1));
        assert!(segments(dir.path()).contains(&2));
    }
    let store = Journal::open_with(dir.path(), SyncMode::Batch, SMALL).unwrap();
    assert_eq!(store.stream_meta(gone.id).await.unwrap(), None);
    assert_eq!(
        store.stream_meta(kept.id).await.unwrap().map(|m| m.entries),
        Some(300)
    );
}

#[tokio::test]
async fn a_session_record_outlives_the_segment_it_was_written_in() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(SessionId::random());
    {
        let store = Journal::open_with(dir.path(), SyncMode::Never, SMALL).unwrap();
        store.put_session(&s).await.unwrap();
        let mut churn = Churn::new(10);
        for i in 1..=2_000u32 {
            churn.step(&*store, progress(i)).await;
        }
        // Copied forward out of the oldest segment, so that it could go.
        assert!(!segments(dir.path()).contains(&1));
    }
    let store = Journal::open_with(dir.path(), SyncMode::Never, SMALL).unwrap();
    assert_eq!(store.get_session(s.id).await.unwrap(), Some(s));
}

#[tokio::test]
async fn a_journal_written_with_snapshots_recovers_the_newest_snapshots_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    let session = SessionId::random();
    let (kept, dropped) = (meta(session), meta(session));
    // As versions before replay-all recovery wrote it: every segment opens
    // with a snapshot, and `dropped` was deleted in a segment since gone.
    let mut first = segment::MAGIC_V1.to_vec();
    record::stream(&mut first, &kept);
    record::stream(&mut first, &dropped);
    record::snapshot_end(&mut first);
    let at = first.len() as u64;
    let placed = encode_entries(&mut first, kept.id, 1, &[progress(1)]);
    std::fs::write(segment::path(&journal, 1), &first).unwrap();
    let mut third = segment::MAGIC_V1.to_vec();
    record::stream(&mut third, &kept);
    record::snapshot_end(&mut third);
    std::fs::write(segment::path(&journal, 3), &third).unwrap();
    assert_eq!(placed.len(), 1, "one entry at {at}");
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    assert_eq!(store.stream_meta(dropped.id).await.unwrap(), None);
    let entries = store.read_after(kept.id, 0, 10).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].message, progress(1));
}

#[tokio::test]
async fn a_task_record_outlives_the_segment_it_was_written_in() {
    let dir = tempfile::tempdir().unwrap();
    let t = task(TaskId::random(), now_ms(), 60_000);
    {
        let store = Journal::open_with(dir.path(), SyncMode::Never, SMALL).unwrap();
        store.put_task(&t).await.unwrap();
        let mut churn = Churn::new(10);
        for i in 1..=2_000u32 {
            churn.step(&*store, progress(i)).await;
        }
        // Copied forward out of the oldest segment, so that it could go.
        assert!(!segments(dir.path()).contains(&1));
    }
    let store = Journal::open_with(dir.path(), SyncMode::Never, SMALL).unwrap();
    assert_eq!(store.get_task(t.id).await.unwrap(), Some(t.clone()));
    assert_eq!(store.tasks_expired_by(u64::MAX).await.unwrap(), vec![t.id]);
}

/// Cuts the last 5 bytes off the active segment: its last record is torn,
/// as a crash in the middle of its write leaves it.
fn tear_last_record(store: &Journal) {
    let inner = store.lock();
    inner.writer.file.set_len(inner.writer.len - 5).unwrap();
}

#[tokio::test]
async fn a_task_update_a_crash_tore_is_lost_whole_and_the_version_before_stays() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = task(TaskId::random(), now_ms(), 60_000);
    let before = t.clone();
    {
        let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        store.put_task(&t).await.unwrap();
        t.legs.push(StreamId::random());
        t.version += 1;
        assert!(store.update_task(&t).await.unwrap());
        tear_last_record(&store);
    }
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    assert_eq!(store.get_task(t.id).await.unwrap(), Some(before));
    // The next writer's compare-and-set goes on from there.
    assert!(store.update_task(&t).await.unwrap());
}

#[tokio::test]
async fn a_task_deletion_a_crash_tore_keeps_the_task_to_delete_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = task(TaskId::random(), now_ms(), 60_000);
    let leg = leg(t.id);
    t.legs.push(leg.id);
    {
        let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        store.create_stream(&leg).await.unwrap();
        store.append(leg.id, &[progress(1)]).await.unwrap();
        store.put_task(&t).await.unwrap();
        store.delete_task(t.id).await.unwrap();
        // The task's tombstone is the write's last record: torn, it goes,
        // and the legs' tombstones before it stay.
        tear_last_record(&store);
    }
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    assert_eq!(store.stream_meta(leg.id).await.unwrap(), None);
    assert_eq!(store.tasks_expired_by(u64::MAX).await.unwrap(), vec![t.id]);
    store.delete_task(t.id).await.unwrap();
    assert_eq!(store.get_task(t.id).await.unwrap(), None);
}

#[tokio::test]
async fn segments_written_now_carry_a_version_that_snapshot_reading_versions_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    let m = meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    store.flush().await.unwrap();
    let first = segments(dir.path())[0];
    let bytes = std::fs::read(segment::path(&dir.path().join("journal"), first)).unwrap();
    // Older versions take a segment without a snapshot for a torn one and
    // delete it: they must see a version they do not know instead.
    assert_eq!(&bytes[..8], segment::MAGIC);
    assert_ne!(&bytes[..8], segment::MAGIC_V1);
    // Versions before summaries would cut one off as a torn tail.
    assert_ne!(&bytes[..8], segment::MAGIC_V2);
}

#[tokio::test]
async fn a_journal_written_before_summaries_still_opens_and_retires_its_streams() {
    let dir = tempfile::tempdir().unwrap();
    let m = meta(SessionId::random());
    {
        let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
        store.create_stream(&m).await.unwrap();
        store
            .append_final(
                m.id,
                &[progress(1)],
                Finish::new(crate::store::StreamStatus::Completed, None),
            )
            .await
            .unwrap();
    }
    // Rewrites the header as version 2 wrote it (the records are the same).
    let journal = dir.path().join("journal");
    for no in segments(dir.path()) {
        let path = segment::path(&journal, no);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..8].copy_from_slice(segment::MAGIC_V2);
        std::fs::write(&path, bytes).unwrap();
    }
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    store.retire_now();
    assert!(store.is_retired(m.id));
    let got = store.read_after(m.id, 0, 10).await.unwrap();
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn a_stream_recovers_its_entries_up_to_the_first_missing_seq() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    let m = meta(SessionId::random());
    let mut bytes = segment::MAGIC.to_vec();
    record::stream(&mut bytes, &m);
    encode_entries(&mut bytes, m.id, 1, &[progress(1), progress(2)]);
    // Seq 3 never made it to disk; 4 and 5 did (damage, not a crash).
    encode_entries(&mut bytes, m.id, 4, &[progress(4), progress(5)]);
    std::fs::write(segment::path(&journal, 1), &bytes).unwrap();
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    let entries = store.read_after(m.id, 0, 10).await.unwrap();
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2]);
}

/// A journal on a disk whose flushes fail while told to, holding one
/// stream with one durable entry.
struct FailingDisk {
    dir: tempfile::TempDir,
    failing: Arc<AtomicBool>,
    store: Arc<Journal>,
    stream: StreamId,
}

impl FailingDisk {
    async fn with_one_entry() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let failing = Arc::new(AtomicBool::new(false));
        let store = Self::open(dir.path(), &failing);
        let m = meta(SessionId::random());
        store.create_stream(&m).await.unwrap();
        assert_eq!(store.append(m.id, &[progress(1)]).await.unwrap(), 1);
        Self {
            dir,
            failing,
            store,
            stream: m.id,
        }
    }

    fn open(dir: &Path, failing: &Arc<AtomicBool>) -> Arc<Journal> {
        let failing = failing.clone();
        let sync_file = move |file: &File| {
            if failing.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("injected write-back error"));
            }
            file.sync_data()
        };
        Journal::open_syncing(
            dir,
            SyncMode::Batch,
            DEFAULT_SEGMENT_BYTES,
            Arc::new(sync_file),
        )
        .unwrap()
    }

    fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    async fn append(&self, i: u32) -> Result<Seq> {
        self.store.append(self.stream, &[progress(i)]).await
    }

    /// A reader of the stream that has read its entry and waits for more
    /// (for a minute at most).
    async fn waiting_reader(&self) -> tokio::task::JoinHandle<Result<crate::stream::Next>> {
        let log = crate::stream::Log::new(self.store.clone());
        let mut reader = log.attach(self.stream, 0);
        let idle = Duration::from_secs(60);
        assert!(matches!(
            reader.next(idle).await.unwrap(),
            crate::stream::Next::Entries(_)
        ));
        tokio::spawn(async move { reader.next(idle).await })
    }
}

#[tokio::test]
async fn after_a_failed_flush_the_journal_shows_and_takes_nothing_more() {
    let disk = FailingDisk::with_one_entry().await;
    assert!(!disk.store.flush_failed());
    disk.fail(true);
    assert!(disk.append(2).await.is_err());
    // The disk answers again, but pages the failed flush lost may be
    // marked clean: nothing after it may count as durable.
    disk.fail(false);
    assert!(disk.store.flush_failed());
    assert!(matches!(disk.append(3).await, Err(StoreError::Stopped)));
    let other = meta(SessionId::random());
    assert!(disk.store.create_stream(&other).await.is_err());
    let shown = disk.store.read_after(disk.stream, 0, 10).await.unwrap();
    assert_eq!(shown.len(), 1, "only what a good flush covered shows");
    assert_eq!(disk.store.subscribe(disk.stream).await.borrow().seq, 1);
}

#[tokio::test]
async fn after_a_failed_flush_the_journals_health_names_the_error() {
    let disk = FailingDisk::with_one_entry().await;
    assert_eq!(disk.store.health(), Ok(()));
    disk.fail(true);
    assert!(disk.append(2).await.is_err());
    let why = disk.store.health().expect_err("not writable");
    assert!(why.starts_with("log not writable: "), "{why}");
    assert_ne!(
        why, "log not writable: a flush failed",
        "the flush's own error"
    );
}

#[tokio::test]
async fn a_restart_after_a_failed_flush_takes_writes_again() {
    let disk = FailingDisk::with_one_entry().await;
    disk.fail(true);
    assert!(disk.append(2).await.is_err());
    disk.fail(false);
    let FailingDisk {
        dir,
        failing,
        store,
        stream,
    } = disk;
    drop(store);
    let store = FailingDisk::open(dir.path(), &failing);
    assert!(!store.flush_failed());
    let n = store.stream_meta(stream).await.unwrap().unwrap().entries;
    assert_eq!(store.append(stream, &[progress(3)]).await.unwrap(), n + 1);
}

/// What `waiting` ended with, or a failure if it was left waiting.
async fn ended(waiting: tokio::task::JoinHandle<Result<crate::stream::Next>>) -> Result<()> {
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken, not left to its idle timeout")
        .unwrap()
        .map(|_| ())
}

#[tokio::test]
async fn a_reader_waiting_when_a_flush_fails_ends_with_the_log_stopped() {
    let disk = FailingDisk::with_one_entry().await;
    let waiting = disk.waiting_reader().await;
    disk.fail(true);
    assert!(disk.append(2).await.is_err());
    assert!(matches!(ended(waiting).await, Err(StoreError::Stopped)));
}

#[tokio::test]
async fn a_reader_waiting_when_the_journals_own_sync_fails_ends_too() {
    let disk = FailingDisk::with_one_entry().await;
    let waiting = disk.waiting_reader().await;
    disk.fail(true);
    assert!(disk.store.flush().await.is_err());
    assert!(matches!(ended(waiting).await, Err(StoreError::Stopped)));
}

#[tokio::test]
async fn a_failed_sync_outside_the_group_commit_stops_the_journal_too() {
    let disk = FailingDisk::with_one_entry().await;
    disk.fail(true);
    assert!(disk.store.flush().await.is_err());
    disk.fail(false);
    assert!(disk.store.flush_failed());
    assert!(matches!(disk.append(2).await, Err(StoreError::Stopped)));
}

#[tokio::test]
async fn a_long_retired_stream_read_in_pages_decodes_its_summary_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Journal::open(dir.path(), SyncMode::Never).unwrap();
    let m = meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    let want: Vec<Bytes> = (0..1000).map(progress).collect();
    store.append(m.id, &want).await.unwrap();
    store
        .set_status(
            m.id,
            Finish::new(crate::store::StreamStatus::Completed, None),
        )
        .await
        .unwrap();
    store.retire_now();
    assert!(store.is_retired(m.id));
    let mut got = Vec::new();
    let mut after = 0;
    loop {
        let page = store.read_after(m.id, after, 256).await.unwrap();
        let Some(last) = page.last() else { break };
        assert_eq!(page[0].seq, after + 1);
        after = last.seq;
        got.extend(page.into_iter().map(|e| e.message));
    }
    assert_eq!(got, want);
    assert_eq!(store.recent.len(), 1);
}
