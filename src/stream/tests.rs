//! What the log promises its readers: exact replay from any cut, live
//! following, one exclusive reader, hand-over of this process's appends
//! without losing or repeating an entry, and the status words.

use std::time::Duration;

use super::*;
use crate::id::SessionId;
use crate::store::commit::SyncMode;
use crate::store::journal::Journal;

async fn log() -> (tempfile::TempDir, Arc<Log>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Journal::open(dir.path(), SyncMode::Batch).unwrap();
    (dir, Log::new(store))
}

const IDLE: Duration = Duration::from_secs(5);

async fn opened(log: &Arc<Log>) -> StreamMeta {
    log.open(crate::store::contract::meta(SessionId::random()))
        .await
        .unwrap()
}

async fn drain(reader: &mut Reader) -> (Vec<Bytes>, Next) {
    let mut got = Vec::new();
    loop {
        match reader.next(IDLE).await.unwrap() {
            Next::Entries(e) => got.extend(e.into_iter().map(|e| e.message)),
            other => return (got, other),
        }
    }
}

#[tokio::test]
async fn replay_from_every_cut_point_yields_exactly_the_missing_suffix() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let all: Vec<Bytes> = (0..20).map(|i| Bytes::from(format!("{i}"))).collect();
    log.append(meta.id, &all).await.unwrap();
    log.finish(meta.id, StreamStatus::Completed).await.unwrap();
    for cut in 0..=all.len() {
        let mut reader = log.attach(meta.id, cut as Seq);
        let (got, end) = drain(&mut reader).await;
        assert_eq!(got, all[cut..].to_vec(), "cut at {cut}");
        assert_eq!(end, Next::End(StreamStatus::Completed));
    }
}

#[tokio::test]
async fn reader_follows_live_appends_until_the_stream_finishes() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let mut reader = log.attach(meta.id, 0);
    let writer = {
        let log = log.clone();
        tokio::spawn(async move {
            for i in 0..50 {
                log.append(meta.id, &[Bytes::from(format!("{i}"))])
                    .await
                    .unwrap();
                if i % 10 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            log.finish(meta.id, StreamStatus::Completed).await.unwrap();
        })
    };
    let (got, end) = drain(&mut reader).await;
    writer.await.unwrap();
    let want: Vec<Bytes> = (0..50).map(|i| Bytes::from(format!("{i}"))).collect();
    assert_eq!(got, want);
    assert_eq!(end, Next::End(StreamStatus::Completed));
}

fn numbered(range: std::ops::Range<u32>) -> Vec<Bytes> {
    range.map(|i| Bytes::from(format!("{i}"))).collect()
}

#[tokio::test]
async fn a_reader_is_handed_what_its_process_just_appended() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let mut reader = log.attach(meta.id, 0);
    log.append(meta.id, &numbered(0..3)).await.unwrap();
    let handed = reader.handed(3).expect("the batch follows the cursor");
    let seqs: Vec<Seq> = handed.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(reader.handed(3), None, "a batch is handed once");
}

#[tokio::test]
async fn a_handed_batch_past_a_gap_waits_while_the_gap_is_read_from_the_store() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    // The first batch is appended before any reader is attached, so only
    // the second is handed: the reader at 0 must read 1..=3 from the
    // store, then take 4..=5 as handed.
    log.append(meta.id, &numbered(0..3)).await.unwrap();
    let mut reader = log.attach(meta.id, 0);
    log.append_final(meta.id, &numbered(3..5), StreamStatus::Completed, None)
        .await
        .unwrap();
    let (got, end) = drain(&mut reader).await;
    assert_eq!(got, numbered(0..5));
    assert_eq!(end, Next::End(StreamStatus::Completed));
}

#[tokio::test]
async fn a_reader_takes_only_the_part_of_a_handed_batch_after_its_cursor() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let _first = log.attach(meta.id, 0);
    log.append(meta.id, &numbered(0..4)).await.unwrap();
    // A reader that takes the stream over shares its hand-over.
    let mut second = log.attach(meta.id, 2);
    let Next::Entries(entries) = second.next(IDLE).await.unwrap() else {
        panic!("entries expected");
    };
    let seqs: Vec<Seq> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![3, 4]);
    let quiet = Duration::from_millis(20);
    assert_eq!(second.next(quiet).await.unwrap(), Next::Idle);
}

#[tokio::test]
async fn a_reader_past_a_final_handed_batch_ends_with_its_status() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let mut reader = log.attach(meta.id, 0);
    log.append_final(meta.id, &numbered(0..1), StreamStatus::Failed, None)
        .await
        .unwrap();
    let (got, end) = drain(&mut reader).await;
    assert_eq!(got, numbered(0..1));
    assert_eq!(end, Next::End(StreamStatus::Failed));
}

#[tokio::test]
async fn concurrent_appends_reach_a_live_reader_exactly_once_in_order() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let mut reader = log.attach(meta.id, 0);
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let log = log.clone();
            tokio::spawn(async move {
                for i in 0..25 {
                    let size = 1 + (w + i) % 3;
                    log.append(meta.id, &numbered(0..size)).await.unwrap();
                }
            })
        })
        .collect();
    let total: u32 = (0..4)
        .map(|w| (0..25).map(|i| 1 + (w + i) % 3).sum::<u32>())
        .sum();
    let mut seqs = Vec::new();
    while seqs.len() < total as usize {
        match reader.next(IDLE).await.unwrap() {
            Next::Entries(e) => seqs.extend(e.iter().map(|e| e.seq)),
            other => panic!("unexpected {other:?}"),
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    let want: Vec<Seq> = (1..=Seq::from(total)).collect();
    assert_eq!(seqs, want);
}

#[tokio::test]
async fn a_new_reader_replaces_the_old_one() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let mut first = log.attach(meta.id, 0);
    let _second = log.attach(meta.id, 0);
    assert_eq!(first.next(IDLE).await.unwrap(), Next::Replaced);
}

#[tokio::test]
async fn an_idle_live_stream_reports_idle() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let mut reader = log.attach(meta.id, 0);
    let next = reader.next(Duration::from_millis(20)).await.unwrap();
    assert_eq!(next, Next::Idle);
}

#[tokio::test]
async fn a_watcher_never_takes_a_stream_from_its_reader() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let mut reader = log.attach(meta.id, 0);
    let mut watcher = log.watch(meta.id, 0);
    log.append(meta.id, &[Bytes::from_static(b"x")])
        .await
        .unwrap();
    assert!(matches!(
        watcher.next(IDLE).await.unwrap(),
        Next::Entries(_)
    ));
    assert!(matches!(reader.next(IDLE).await.unwrap(), Next::Entries(_)));
    assert!(log.is_read(meta.id));
    drop(reader);
    assert!(!log.is_read(meta.id), "a watcher is not a reader");
}

#[tokio::test]
async fn a_coalesced_stream_replays_only_the_latest_progress_of_a_token() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let progress = |n: u32| {
        Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"t","progress":{n}}}}}"#
        ))
    };
    let result = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    log.append(
        meta.id,
        &[progress(1), progress(2), result.clone(), progress(3)],
    )
    .await
    .unwrap();
    log.store()
        .update_stream(meta.id, Change::Coalesced)
        .await
        .unwrap();
    log.finish(meta.id, StreamStatus::Completed).await.unwrap();
    let (got, _) = drain(&mut log.attach(meta.id, 0)).await;
    assert_eq!(got, vec![result, progress(3)]);
}

#[tokio::test]
async fn status_words_come_from_the_outcome_and_the_acknowledged_cursor() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    log.append(meta.id, &[Bytes::from_static(b"a")])
        .await
        .unwrap();
    let live = log.status(meta.id).await.unwrap().unwrap();
    assert!(live.pending() && !live.failed() && !live.has_error());
    log.append_final(
        meta.id,
        &[Bytes::from_static(b"e")],
        StreamStatus::Completed,
        Some(Outcome::Error),
    )
    .await
    .unwrap();
    let done = log.status(meta.id).await.unwrap().unwrap();
    assert!(done.failed() && done.has_error());
    log.ack(meta.id, 2).await.unwrap();
    let acked = log.status(meta.id).await.unwrap().unwrap();
    assert!(acked.failed() && !acked.has_error() && !acked.pending());
}

#[tokio::test]
async fn written_marks_stay_bounded_when_every_one_is_young() {
    let (_dir, log) = log().await;
    let marked: Vec<StreamId> = (0..WRITTEN_MARKS + 10)
        .map(|_| StreamId::random())
        .collect();
    for stream in &marked {
        log.wrote_to_end(*stream);
    }
    // The map was cleared once at the bound (instead of being scanned
    // on every later call); the newest marks are kept.
    assert_eq!(log.written.len(), 10);
    assert!(log.written_to_end(marked[WRITTEN_MARKS + 9]).is_some());
    assert!(
        log.written_to_end(marked[0]).is_none(),
        "a lost mark only lengthens the grace"
    );
}

#[tokio::test]
async fn deleting_a_stream_ends_its_reader() {
    let (_dir, log) = log().await;
    let meta = opened(&log).await;
    let mut reader = log.attach(meta.id, 0);
    log.store().delete_stream(meta.id).await.unwrap();
    assert_eq!(reader.next(IDLE).await.unwrap(), Next::Gone);
}

/// A new stream's metadata, not yet created.
fn unopened() -> StreamMeta {
    crate::store::contract::meta(SessionId::random())
}

#[tokio::test]
async fn opening_entries_take_the_first_seqs_and_show_once_durable() {
    let (_dir, log) = log().await;
    let meta = unopened();
    let mut reader = log.attach(meta.id, 0);
    log.create(&meta, &numbered(0..2)).await.unwrap();
    assert_eq!(reader.handed(0), None, "nothing unflushed is taken");
    let last = log
        .append_final(meta.id, &numbered(2..3), StreamStatus::Completed, None)
        .await
        .unwrap();
    assert_eq!(last, 3, "the opening entries hold seqs 1 and 2");
    let (got, end) = drain(&mut reader).await;
    assert_eq!(got, numbered(0..3));
    assert_eq!(end, Next::End(StreamStatus::Completed));
}

#[tokio::test]
async fn opening_entries_show_without_a_later_append() {
    let (_dir, log) = log().await;
    let meta = unopened();
    let mut reader = log.attach(meta.id, 0);
    log.create(&meta, &numbered(0..1)).await.unwrap();
    let Next::Entries(entries) = reader.next(IDLE).await.unwrap() else {
        panic!("the flush that covers them shows them");
    };
    assert_eq!(entries.len(), 1);
}

#[tokio::test]
async fn a_re_sent_call_opens_nothing_and_writes_no_opening_entries() {
    let (_dir, log) = log().await;
    let session = SessionId::random();
    let first = crate::store::contract::call(session, "1", Some("d"));
    assert_eq!(log.open_call(&first, &numbered(0..1)).await.unwrap(), None);
    let again = crate::store::contract::call(session, "1", Some("d"));
    assert_eq!(
        log.open_call(&again, &numbered(5..6)).await.unwrap(),
        Some(Prior::Same(first.id))
    );
    assert_eq!(log.store().stream_meta(again.id).await.unwrap(), None);
    let mut reader = log.attach(first.id, 0);
    let Next::Entries(entries) = reader.next(IDLE).await.unwrap() else {
        panic!("the first call's opening entry shows");
    };
    let got: Vec<Bytes> = entries.into_iter().map(|e| e.message).collect();
    assert_eq!(got, numbered(0..1), "the prior keeps its own opening only");
}
