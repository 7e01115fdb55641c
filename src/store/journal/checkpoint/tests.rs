//! A checkpoint saves start-up time and nothing else: what the journal
//! recovers from one and the records after its cut is what it recovers from
//! every segment, and a checkpoint that cannot be trusted is not used.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::super::Journal;
use super::*;
use crate::id::{SessionId, StreamId, TaskId};
use crate::jsonrpc::RequestId;
use crate::store::commit::SyncMode;
use crate::store::contract::{meta, session as session_record, task};
use crate::store::journal::index::Index;
use crate::store::journal::retired::{Kept, Place, Retired};
use crate::store::{now_ms, Change, Finish, Outcome, Store, StreamMeta, StreamStatus};

fn message(i: u32) -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{i},"result":{{"n":{i}}}}}"#
    ))
}

fn done() -> Finish {
    Finish::new(StreamStatus::Completed, Some(Outcome::Result))
}

fn open(dir: &Path) -> Arc<Journal> {
    Journal::open(dir, SyncMode::Batch).unwrap()
}

fn journal_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("journal")
}

/// A call of `session` answering request `request`, with `n` entries.
async fn call(j: &Journal, session: SessionId, request: &str, n: u32, finish: bool) -> StreamMeta {
    let m = StreamMeta {
        origin_ids: vec![RequestId(request.into())],
        ..meta(session)
    };
    j.create_stream(&m).await.unwrap();
    let messages: Vec<Bytes> = (1..=n).map(message).collect();
    if finish {
        j.append_final(m.id, &messages, done()).await.unwrap();
    } else {
        j.append(m.id, &messages).await.unwrap();
    }
    m
}

/// Everything the journal answers, in an order that does not depend on its
/// hash tables: sessions, tasks, each stream's metadata, entries and
/// watermark, which stream answers each request, and which segments it
/// keeps.
async fn everything(j: &Journal) -> String {
    let mut out = Vec::new();
    let mut sessions = j.list_sessions().await.unwrap();
    sessions.sort_by_key(|s| s.id);
    out.push(format!("{sessions:?}"));
    let mut tasks: Vec<_> = j.lock().index.tasks.values().cloned().collect();
    tasks.sort_by_key(|t| t.id);
    out.push(format!("{tasks:?}"));
    let mut streams = j.list_streams().await.unwrap();
    streams.sort_by_key(|m| m.id);
    for m in &streams {
        let entries = j.read_after(m.id, 0, usize::MAX).await.unwrap();
        let answering: Vec<_> = {
            let mut ids = Vec::new();
            for request in &m.origin_ids {
                ids.push(j.stream_of_request(m.session, request).await.unwrap());
            }
            ids
        };
        out.push(format!(
            "{m:?} {entries:?} {:?} {answering:?}",
            j.peek(m.id)
        ));
    }
    let inner = j.lock();
    let mut retired: Vec<_> = inner.index.retired.ids();
    retired.sort();
    out.push(format!("retired {retired:?}"));
    // Each start opens a segment of its own: the ones before it are
    // compared.
    let mut kept: Vec<_> = inner.files.keys().copied().collect();
    kept.retain(|&no| no != inner.writer.no && inner.index.in_use(no));
    kept.sort_unstable();
    out.push(format!("segments in use {kept:?}"));
    out.join("\n")
}

/// Two recoveries' answers are the same, line by line (the first lines that
/// differ are shown, not the whole of both).
fn assert_same(got: &str, want: &str) {
    let differ: Vec<_> = got
        .lines()
        .zip(want.lines())
        .filter(|(g, w)| g != w)
        .take(2)
        .collect();
    assert!(differ.is_empty(), "differs: {differ:#?}");
    assert_eq!(got.lines().count(), want.lines().count(), "as many lines");
}

/// What the journal in `dir` recovers, and the log bytes it replayed to.
async fn recovered(dir: &Path) -> (String, u64) {
    let j = open(dir);
    let state = everything(&j).await;
    (state, j.replayed())
}

/// Sessions, tasks, whole and retired streams, a reused request id and a
/// deletion of each kind, some before `cut` is taken and some after.
async fn a_busy_log(j: &Journal, cut: impl Fn(&Journal)) {
    let (a, b) = (SessionId::random(), SessionId::random());
    for s in [a, b] {
        j.put_session(&session_record(s)).await.unwrap();
    }
    let gone = SessionId::random();
    j.put_session(&session_record(gone)).await.unwrap();
    call(j, gone, "1", 2, true).await;
    let t = task(TaskId::random(), now_ms(), 60_000);
    j.put_task(&t).await.unwrap();
    let mut retired = Vec::new();
    for i in 0..20 {
        retired.push(call(j, a, &i.to_string(), 3, true).await);
    }
    let live = call(j, b, "live", 4, false).await;
    j.retire_now();
    j.update_stream(retired[0].id, Change::Ack(2))
        .await
        .unwrap();
    j.delete_stream(retired[1].id).await.unwrap();
    cut(j);
    // After the cut: a reused request id, a retired stream changed and one
    // deleted, a live stream finished, new ones, a task and a session gone.
    let again = call(j, a, "2", 1, true).await;
    j.update_stream(retired[3].id, Change::Touch { at_ms: now_ms() })
        .await
        .unwrap();
    j.delete_stream(retired[4].id).await.unwrap();
    j.append_final(live.id, &[message(9)], done())
        .await
        .unwrap();
    call(j, b, "late", 2, false).await;
    j.delete_task(t.id).await.unwrap();
    j.delete_session(gone).await.unwrap();
    j.retire_now();
    assert!(j.is_retired(again.id));
}

#[tokio::test]
async fn start_up_from_a_checkpoint_recovers_what_replaying_every_segment_does() {
    let dir = tempfile::tempdir().unwrap();
    a_busy_log(&open(dir.path()), |j| j.checkpoint_now()).await;
    let (from_checkpoint, replayed_after_cut) = recovered(dir.path()).await;
    remove(&journal_dir(dir.path())).unwrap();
    let (from_every_segment, replayed_all) = recovered(dir.path()).await;
    assert_same(&from_checkpoint, &from_every_segment);
    assert!(
        replayed_after_cut < replayed_all,
        "{replayed_after_cut} of {replayed_all} bytes replayed"
    );
}

#[tokio::test]
async fn start_up_replays_only_the_records_after_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let after_cut = {
        let j = open(dir.path());
        a_busy_log(&j, |_| {}).await;
        j.checkpoint_now();
        let session = SessionId::random();
        let before = j.lock().since_checkpoint;
        assert_eq!(before, 0, "a checkpoint was just taken");
        call(&j, session, "after", 2, true).await;
        let after = j.lock().since_checkpoint;
        after
    };
    let j = open(dir.path());
    assert_eq!(j.replayed(), after_cut);
}

#[tokio::test]
async fn a_checkpoint_older_than_the_last_one_still_recovers_the_same() {
    // A stale checkpoint (a crash between taking one and the next) only
    // means more of the log to replay.
    let dir = tempfile::tempdir().unwrap();
    let jdir = journal_dir(dir.path());
    let first_cut = Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let keep = first_cut.clone();
        let j = open(dir.path());
        a_busy_log(&j, |j| {
            j.checkpoint_now();
            *keep.lock().unwrap() = std::fs::read(jdir.join(FILE)).unwrap();
        })
        .await;
        j.checkpoint_now();
    }
    let newest = recovered(dir.path()).await.0;
    std::fs::write(jdir.join(FILE), &*first_cut.lock().unwrap()).unwrap();
    assert_same(&recovered(dir.path()).await.0, &newest);
}

#[tokio::test]
async fn a_damaged_checkpoint_is_ignored_and_every_segment_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let jdir = journal_dir(dir.path());
    a_busy_log(&open(dir.path()), |j| j.checkpoint_now()).await;
    let (want, replayed_all) = {
        let mut bytes = std::fs::read(jdir.join(FILE)).unwrap();
        remove(&jdir).unwrap();
        let whole = recovered(dir.path()).await;
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        std::fs::write(jdir.join(FILE), bytes).unwrap();
        whole
    };
    let (got, replayed) = recovered(dir.path()).await;
    assert_same(&got, &want);
    assert!(replayed >= replayed_all, "every segment replayed");
}

#[tokio::test]
async fn a_checkpoint_whose_cut_is_past_the_log_is_ignored() {
    // A checkpoint restored without its segments (or beside other ones)
    // must not describe a log that is not there.
    let dir = tempfile::tempdir().unwrap();
    let jdir = journal_dir(dir.path());
    let m = {
        let j = open(dir.path());
        let m = call(&j, SessionId::random(), "1", 2, true).await;
        let index = Index::default();
        let cut = Cut {
            segment: j.lock().writer.no,
            offset: 1 << 30,
            at_ms: now_ms(),
        };
        take(&index, cut)
            .publish(&jdir, &Frozen::default())
            .unwrap();
        m
    };
    let j = open(dir.path());
    assert_eq!(j.read_after(m.id, 0, 10).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_checkpoint_a_crash_left_half_written_is_removed_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let jdir = journal_dir(dir.path());
    let m = {
        let j = open(dir.path());
        call(&j, SessionId::random(), "1", 1, true).await
    };
    std::fs::write(jdir.join("checkpoint.tmp"), b"MCPRC\0\0\x01 half").unwrap();
    let j = open(dir.path());
    assert!(!jdir.join("checkpoint.tmp").exists());
    assert_eq!(j.read_after(m.id, 0, 10).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_journal_takes_a_checkpoint_on_its_own_once_enough_log_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let jdir = journal_dir(dir.path());
    let j = Journal::open(dir.path(), SyncMode::Never).unwrap();
    j.checkpoint_every(64 * 1024);
    let session = SessionId::random();
    let mut n = 0;
    while !jdir.join(FILE).exists() {
        call(&j, session, &n.to_string(), 50, true).await;
        n += 1;
        assert!(n < 5_000, "no checkpoint after {n} calls");
        if n % 10 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    assert!(read(&jdir).unwrap().is_some(), "a whole checkpoint");
}

fn retired(session: SessionId) -> Retired {
    Retired {
        session,
        summary: Place {
            segment: 7,
            offset: 4096,
            len: 180,
        },
        first_segment: 5,
        entries: 3,
        finished_ms: Retired::split(1_790_000_000_123),
        requests: 1,
        coalesced: true,
    }
}

fn one_retired(id: StreamId, session: SessionId) -> Frozen {
    let kept = Kept {
        id,
        retired: retired(session),
        abandon_at: Some(42),
    };
    Frozen::build(vec![kept], vec![(99, id)])
}

#[test]
fn a_checkpoint_reads_back_what_was_encoded() {
    let index = Index::default();
    let (id, session) = (StreamId::random(), SessionId::random());
    let cut = Cut {
        segment: 9,
        offset: 1234,
        at_ms: 77,
    };
    let bytes = take(&index, cut).to_bytes(&one_retired(id, session));
    let read = Checkpoint::parse(bytes).expect("parses");
    assert_eq!(read.cut, cut);
    assert!(read.key == index.retired.key());
    assert_eq!(read.wholes().count(), 0);
    let frozen = read.into_frozen();
    let kept = frozen.get(&id).expect("kept");
    assert_eq!(
        (kept.retired, kept.abandon_at),
        (retired(session), Some(42))
    );
    assert_eq!(frozen.request(99), Some(id));
    assert_eq!(frozen.of_session(session), vec![id]);
    assert_eq!(
        frozen.segments().collect::<Vec<_>>(),
        vec![(5, 1), (6, 1), (7, 1)]
    );
}

#[test]
fn a_checkpoint_with_one_byte_changed_is_refused() {
    let index = Index::default();
    let cut = Cut {
        segment: 1,
        offset: 8,
        at_ms: 0,
    };
    let frozen = one_retired(StreamId::random(), SessionId::random());
    let bytes = take(&index, cut).to_bytes(&frozen);
    for at in [0, 12, bytes.len() / 2, bytes.len() - 1] {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x40;
        assert!(Checkpoint::parse(damaged).is_err(), "byte {at}");
    }
    assert!(Checkpoint::parse(bytes[..bytes.len() - 1].to_vec()).is_err());
}

#[tokio::test]
async fn a_journal_that_says_goodbye_replays_nothing_at_its_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let session = SessionId::random();
    let kept = {
        let j = open(dir.path());
        let mut kept = Vec::new();
        for n in 0..20 {
            kept.push(call(&j, session, &n.to_string(), 3, true).await);
        }
        j.retire().await.unwrap();
        kept
    };
    let j = open(dir.path());
    assert_eq!(j.replayed(), 0, "started from a checkpoint at the end");
    for m in kept {
        assert_eq!(j.read_after(m.id, 0, 10).await.unwrap().len(), 3);
    }
}

#[tokio::test]
async fn a_quiet_log_takes_a_checkpoint_so_a_crash_then_replays_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let jdir = journal_dir(dir.path());
    let session = SessionId::random();
    let j = open(dir.path());
    let mut n = 0;
    while j.lock().since_checkpoint < super::super::quiet_checkpoint_bytes(0) {
        call(&j, session, &n.to_string(), 50, true).await;
        n += 1;
    }
    assert!(!jdir.join(FILE).exists(), "below the size rule's bound");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while j.lock().since_checkpoint > 0 || j.checkpointing.load(Ordering::Acquire) {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint while quiet"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Dropped without a goodbye, as a crash leaves it.
    drop(j);
    let j = open(dir.path());
    assert_eq!(j.replayed(), 0, "started from the quiet checkpoint");
    assert_eq!(j.streams_of_session(session).await.unwrap().len(), n);
}

#[tokio::test]
async fn a_quiet_log_with_little_written_since_its_checkpoint_takes_none() {
    let dir = tempfile::tempdir().unwrap();
    let jdir = journal_dir(dir.path());
    let j = open(dir.path());
    call(&j, SessionId::random(), "1", 3, true).await;
    tokio::time::sleep(super::super::QUIET_AFTER * 3).await;
    assert!(
        !jdir.join(FILE).exists(),
        "a few calls are replayed, not checkpointed"
    );
    assert!(j.lock().since_checkpoint > 0);
}
