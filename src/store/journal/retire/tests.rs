//! Retired streams read, change, come back and go exactly as whole ones do.

use std::path::Path;

use bytes::Bytes;

use super::super::{Journal, SegmentNo};
use crate::id::{SessionId, StreamId};
use crate::jsonrpc::RequestId;
use crate::store::commit::SyncMode;
use crate::store::contract::{meta, session as session_record};
use crate::store::{Change, Finish, Outcome, Prior, Store, StreamMeta, StreamStatus, Watermark};

fn message(i: u32) -> Bytes {
    Bytes::from(format!(r#"{{"jsonrpc":"2.0","id":{i},"result":{{}}}}"#))
}

fn done() -> Finish {
    Finish::new(StreamStatus::Completed, Some(Outcome::Result))
}

fn open(dir: &Path) -> std::sync::Arc<Journal> {
    Journal::open(dir, SyncMode::Batch).unwrap()
}

/// A call of `session` with `n` entries, finished and retired.
async fn retired_call(j: &Journal, session: SessionId, n: u32) -> StreamMeta {
    let m = meta(session);
    j.create_stream(&m).await.unwrap();
    let messages: Vec<Bytes> = (1..=n).map(message).collect();
    let (last, rest) = messages.split_last().unwrap();
    j.append(m.id, rest).await.unwrap();
    j.append_final(m.id, std::slice::from_ref(last), done())
        .await
        .unwrap();
    j.retire_now();
    assert!(j.is_retired(m.id), "retired");
    m
}

async fn everything(j: &Journal, id: StreamId) -> Vec<Bytes> {
    let entries = j.read_after(id, 0, usize::MAX).await.unwrap();
    entries.into_iter().map(|e| e.message).collect()
}

#[tokio::test]
async fn a_retired_stream_reads_back_exactly_as_it_did_whole() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path());
    let m = meta(SessionId::random());
    j.create_stream(&m).await.unwrap();
    j.append(m.id, &[message(1), message(2)]).await.unwrap();
    j.append_final(m.id, &[message(3)], done()).await.unwrap();
    let (meta_whole, entries_whole) = (
        j.stream_meta(m.id).await.unwrap(),
        everything(&j, m.id).await,
    );
    let tail_whole = j.read_after(m.id, 1, 1).await.unwrap();
    j.retire_now();
    assert!(j.is_retired(m.id));
    assert_eq!(j.stream_meta(m.id).await.unwrap(), meta_whole);
    assert_eq!(everything(&j, m.id).await, entries_whole);
    assert_eq!(j.read_after(m.id, 1, 1).await.unwrap(), tail_whole);
    assert!(j.read_after(m.id, 3, 10).await.unwrap().is_empty());
    let end = Watermark {
        seq: 3,
        finished: true,
        coalesced: false,
    };
    assert_eq!(j.peek(m.id), Some(end));
    assert_eq!(*j.subscribe(m.id).await.borrow(), end);
}

#[tokio::test]
async fn a_live_stream_and_a_task_leg_never_retire() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path());
    let live = meta(SessionId::random());
    j.create_stream(&live).await.unwrap();
    j.append(live.id, &[message(1)]).await.unwrap();
    let leg = crate::store::contract::leg(crate::id::TaskId::random());
    j.create_stream(&leg).await.unwrap();
    j.append_final(leg.id, &[message(1)], done()).await.unwrap();
    j.retire_now();
    assert!(!j.is_retired(live.id) && !j.is_retired(leg.id));
}

#[tokio::test]
async fn a_retired_stream_is_recovered_retired_with_all_it_held() {
    let dir = tempfile::tempdir().unwrap();
    let (m, want, meta_before) = {
        let j = open(dir.path());
        let m = retired_call(&j, SessionId::random(), 4).await;
        (
            m.clone(),
            everything(&j, m.id).await,
            j.stream_meta(m.id).await.unwrap(),
        )
    };
    let j = open(dir.path());
    assert!(j.is_retired(m.id), "recovered into the compact tier");
    assert_eq!(j.stream_meta(m.id).await.unwrap(), meta_before);
    assert_eq!(everything(&j, m.id).await, want);
}

#[tokio::test]
async fn a_change_to_a_retired_stream_keeps_it_retired_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let j = open(dir.path());
        let m = retired_call(&j, SessionId::random(), 3).await;
        j.update_stream(m.id, Change::Ack(2)).await.unwrap();
        j.update_stream(
            m.id,
            Change::Touch {
                at_ms: u64::MAX / 4,
            },
        )
        .await
        .unwrap();
        assert!(j.is_retired(m.id));
        assert_eq!(j.stream_meta(m.id).await.unwrap().unwrap().acked, 2);
        m.id
    };
    let j = open(dir.path());
    let got = j.stream_meta(id).await.unwrap().unwrap();
    assert_eq!((got.acked, got.touched_ms), (2, u64::MAX / 4));
    assert_eq!(everything(&j, id).await.len(), 3);
}

#[tokio::test]
async fn appending_to_a_retired_stream_takes_it_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let j = open(dir.path());
        let m = retired_call(&j, SessionId::random(), 2).await;
        assert_eq!(j.append(m.id, &[message(9)]).await.unwrap(), 3);
        assert!(!j.is_retired(m.id), "whole again");
        m.id
    };
    let j = open(dir.path());
    let got = everything(&j, id).await;
    assert_eq!(got, vec![message(1), message(2), message(9)]);
}

#[tokio::test]
async fn a_retired_stream_made_live_again_is_whole_and_live() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path());
    let m = retired_call(&j, SessionId::random(), 1).await;
    j.set_status(m.id, Finish::new(StreamStatus::Live, None))
        .await
        .unwrap();
    assert!(!j.is_retired(m.id));
    let got = j.stream_meta(m.id).await.unwrap().unwrap();
    assert_eq!(got.status, StreamStatus::Live);
    j.retire_now();
    assert!(!j.is_retired(m.id), "a live stream does not retire");
}

#[tokio::test]
async fn a_resent_call_finds_its_retired_prior_before_and_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let session = SessionId::random();
    let mut call = meta(session);
    call.origin_ids = vec![RequestId("17".into())];
    call.params_digest = Some("same".into());
    {
        let j = open(dir.path());
        assert_eq!(j.create_call(&call, &[]).await.unwrap(), None);
        j.append_final(call.id, &[message(17)], done())
            .await
            .unwrap();
        j.retire_now();
        assert!(j.is_retired(call.id));
    }
    let j = open(dir.path());
    let mut again = meta(session);
    again.origin_ids = call.origin_ids.clone();
    again.params_digest = Some("same".into());
    assert_eq!(
        j.create_call(&again, &[]).await.unwrap(),
        Some(Prior::Same(call.id))
    );
    again.params_digest = Some("other".into());
    assert_eq!(
        j.create_call(&again, &[]).await.unwrap(),
        Some(Prior::Other)
    );
    let other_session = SessionId::random();
    assert_eq!(
        j.stream_of_request(other_session, &call.origin_ids[0])
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn a_newer_stream_under_a_reused_id_wins_over_a_retired_one() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path());
    let session = SessionId::random();
    let request = RequestId("5".into());
    let mut old = meta(session);
    old.origin_ids = vec![request.clone()];
    j.create_stream(&old).await.unwrap();
    j.append_final(old.id, &[message(5)], done()).await.unwrap();
    j.retire_now();
    let mut new = meta(session);
    new.origin_ids = vec![request.clone()];
    new.created_ms += 1;
    j.create_stream(&new).await.unwrap();
    assert_eq!(
        j.stream_of_request(session, &request).await.unwrap(),
        Some(new.id)
    );
    j.delete_stream(new.id).await.unwrap();
    assert_eq!(
        j.stream_of_request(session, &request).await.unwrap(),
        None,
        "the older stream lost the id to the newer one"
    );
}

#[tokio::test]
async fn retention_and_session_deletion_reach_retired_streams() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path());
    let session = SessionId::random();
    j.put_session(&session_record(session)).await.unwrap();
    let a = retired_call(&j, session, 1).await;
    let b = retired_call(&j, session, 1).await;
    let due = j.finished_by(u64::MAX).await.unwrap();
    assert!(due.contains(&a.id) && due.contains(&b.id), "{due:?}");
    assert_eq!(j.streams_of_session(session).await.unwrap().len(), 2);
    j.delete_session(session).await.unwrap();
    assert_eq!(j.stream_meta(a.id).await.unwrap(), None);
    assert!(everything(&j, b.id).await.is_empty());
    assert!(j.finished_by(u64::MAX).await.unwrap().is_empty());
}

#[tokio::test]
async fn past_the_bound_the_oldest_finished_streams_go_first_and_stay_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (ids, live) = {
        let j = open(dir.path());
        j.set_retained_bound(3);
        let live = meta(SessionId::random());
        j.create_stream(&live).await.unwrap();
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(retired_call(&j, SessionId::random(), 2).await.id);
        }
        assert_eq!(j.released_early(), 2);
        (ids, live.id)
    };
    let j = open(dir.path());
    for gone in &ids[..2] {
        assert_eq!(j.stream_meta(*gone).await.unwrap(), None, "released");
        assert!(everything(&j, *gone).await.is_empty());
    }
    for kept in &ids[2..] {
        assert_eq!(everything(&j, *kept).await.len(), 2);
    }
    assert!(j.stream_meta(live).await.unwrap().is_some(), "live stays");
}

#[tokio::test]
async fn segments_retired_streams_held_are_deleted_once_they_go() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open_with(dir.path(), SyncMode::Never, 64 * 1024).unwrap();
    let mut ids = Vec::new();
    for _ in 0..600 {
        ids.push(retired_call(&j, SessionId::random(), 3).await.id);
    }
    let held = segments(dir.path());
    assert!(held.len() > 4, "{held:?}");
    for id in ids {
        j.delete_stream(id).await.unwrap();
    }
    // Rolls over once more so that the emptied files can go.
    for _ in 0..300 {
        retired_call(&j, SessionId::random(), 3).await;
    }
    let left = segments(dir.path());
    assert!(left.first() > held.last(), "{held:?} then {left:?}");
}

fn segments(dir: &Path) -> Vec<SegmentNo> {
    super::super::segment::list(&dir.join("journal")).unwrap()
}
