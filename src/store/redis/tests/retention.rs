//! The retention index (`retention.rs`): exact whatever order finishes
//! come in, left by a stream that re-opens or is deleted, and rid of the
//! entries of streams whose keys expired.

use super::*;
use crate::store::StreamStatus;

fn done_at(at_ms: u64) -> Finish {
    Finish {
        status: StreamStatus::Completed,
        outcome: None,
        at_ms,
    }
}

fn retained(prefix: &str) -> usize {
    redis::cmd("XLEN")
        .arg(format!("{prefix}:retention"))
        .query(&mut connection())
        .unwrap()
}

fn sorted(mut ids: Vec<StreamId>) -> Vec<StreamId> {
    ids.sort();
    ids
}

#[tokio::test]
async fn a_finish_older_than_the_newest_window_is_still_due_exactly() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let session = SessionId::random();
    let (late, early, same) = (
        crate::store::contract::meta(session),
        crate::store::contract::meta(session),
        crate::store::contract::meta(session),
    );
    // `early` is finished after `late`, at a time of an earlier window;
    // `same` in `late`'s window, a little before it.
    for (m, at) in [(&late, 5_000_500), (&early, 4_000_000), (&same, 5_000_100)] {
        store.create_stream(m).await.unwrap();
        store.set_status(m.id, done_at(at)).await.unwrap();
    }
    assert_eq!(retained(&prefix), 2, "`early` is in the sorted set");
    assert!(store.finished_by(3_999_999).await.unwrap().is_empty());
    assert_eq!(store.finished_by(4_000_000).await.unwrap(), vec![early.id]);
    assert_eq!(
        sorted(store.finished_by(5_000_499).await.unwrap()),
        sorted(vec![early.id, same.id])
    );
    assert_eq!(
        sorted(store.finished_by(5_000_500).await.unwrap()),
        sorted(vec![early.id, same.id, late.id])
    );
    for m in [&late, &early, &same] {
        store.delete_stream(m.id).await.unwrap();
    }
    assert_eq!(retained(&prefix), 0);
    assert!(store.finished_by(u64::MAX).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_stream_that_is_live_again_or_finished_again_is_due_by_its_last_finish() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let m = crate::store::contract::meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    store.set_status(m.id, done_at(1_000)).await.unwrap();
    let live = Finish {
        status: StreamStatus::Live,
        outcome: None,
        at_ms: 1_500,
    };
    store.set_status(m.id, live).await.unwrap();
    assert!(store.finished_by(u64::MAX).await.unwrap().is_empty());
    assert_eq!(retained(&prefix), 0);
    store.set_status(m.id, done_at(2_000)).await.unwrap();
    store.set_status(m.id, done_at(3_000)).await.unwrap();
    assert!(store.finished_by(2_999).await.unwrap().is_empty());
    assert_eq!(store.finished_by(3_000).await.unwrap(), vec![m.id]);
    assert_eq!(retained(&prefix), 1);
}

#[tokio::test]
async fn a_stream_whose_keys_expired_is_not_handed_out_and_leaves_the_index() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let (gone, kept) = (
        crate::store::contract::meta(SessionId::random()),
        crate::store::contract::meta(SessionId::random()),
    );
    for m in [&gone, &kept] {
        store.create_stream(m).await.unwrap();
        store.set_status(m.id, done_at(1_000)).await.unwrap();
    }
    // What a TTL does when no sweeper came in time.
    redis::cmd("DEL")
        .arg(format!("{{{prefix}:{}}}:stream", gone.id))
        .query::<()>(&mut connection())
        .unwrap();
    assert_eq!(store.finished_by(1_000).await.unwrap(), vec![kept.id]);
    assert_eq!(retained(&prefix), 1);
}
