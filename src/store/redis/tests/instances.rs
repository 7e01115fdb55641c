//! Two instances on one Redis, as two proxy processes would be: what one
//! writes wakes the other's readers through the feed, leases decide who
//! owns a live stream, a reader claim ends another's, and tasks have no
//! owner.

use super::*;

/// Two instances on one Redis, as two proxy processes would be.
fn two_instances(dir: &Path) -> (SharedStore, SharedStore) {
    (
        open_store(dir, SyncMode::Batch),
        open_store(dir, SyncMode::Batch),
    )
}

pub(super) const PATIENCE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn an_append_by_another_instance_wakes_a_reader_here_through_the_feed() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_instances(dir.path());
    let m = crate::store::contract::meta(SessionId::random());
    a.create_stream(&m).await.unwrap();
    let mut seen_by_b = b.subscribe(m.id).await;
    assert_eq!(seen_by_b.borrow().seq, 0);
    a.append(m.id, &[Bytes::from_static(b"x")]).await.unwrap();
    tokio::time::timeout(PATIENCE, seen_by_b.wait_for(|w| w.seq == 1))
        .await
        .expect("B learns of A's append")
        .unwrap();
    a.append_final(
        m.id,
        &[Bytes::from_static(b"y")],
        Finish::new(crate::store::StreamStatus::Completed, None),
    )
    .await
    .unwrap();
    tokio::time::timeout(PATIENCE, seen_by_b.wait_for(|w| w.seq == 2 && w.finished))
        .await
        .expect("B learns that A finished the stream")
        .unwrap();
}

#[tokio::test]
async fn a_living_instances_streams_are_never_orphans() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_instances(dir.path());
    let m = crate::store::contract::meta(SessionId::random());
    a.create_stream(&m).await.unwrap();
    // Well past A's lease: A renews it.
    tokio::time::sleep(TEST_LEASE * 3).await;
    assert!(b.orphans().await.unwrap().is_empty());
    assert_eq!(
        a.append(m.id, &[Bytes::from_static(b"x")]).await.unwrap(),
        1
    );
}

#[tokio::test]
async fn a_retired_instances_live_streams_are_taken_over_at_once_and_it_may_not_log_to_them() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_instances(dir.path());
    let m = crate::store::contract::meta(SessionId::random());
    a.create_stream(&m).await.unwrap();
    a.retire().await.unwrap();
    let taken: Vec<StreamId> = b.orphans().await.unwrap().iter().map(|m| m.id).collect();
    assert_eq!(taken, vec![m.id]);
    let refused = a.append(m.id, &[Bytes::from_static(b"late")]).await;
    assert!(matches!(refused, Err(StoreError::NotOwner(id)) if id == m.id));
    assert_eq!(
        b.append(m.id, &[Bytes::from_static(b"b")]).await.unwrap(),
        1
    );
    assert!(a.orphans().await.unwrap().is_empty(), "handed out once");
}

#[tokio::test]
async fn a_reader_claim_by_another_instance_ends_the_lease_held_here() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_instances(dir.path());
    let m = crate::store::contract::meta(SessionId::random());
    a.create_stream(&m).await.unwrap();
    let mut held_on_a = a.hold_reader(m.id).await.unwrap();
    assert!(!held_on_a.lost());
    let held_on_b = b.hold_reader(m.id).await.unwrap();
    tokio::time::timeout(PATIENCE, held_on_a.taken())
        .await
        .expect("A's reader learns that B's took the stream");
    assert!(held_on_a.lost());
    assert!(!held_on_b.lost(), "the newest claim holds");
}

#[tokio::test]
async fn a_session_stored_by_another_instance_is_announced_here() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_instances(dir.path());
    let mut changes = b.session_changes().expect("a shared log announces changes");
    let s = crate::store::contract::session(SessionId::random());
    // B's listener starts at the feed's end as it finds it when connected:
    // A writes until B has heard (a write before that is not B's business).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let changed = loop {
        a.put_session(&s).await.unwrap();
        let heard = tokio::time::timeout(Duration::from_millis(200), changes.recv()).await;
        if let Ok(changed) = heard {
            break changed.unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "B never heard of A's session"
        );
    };
    assert_eq!(changed, crate::store::SessionNews::Changed(s.id));
}

#[tokio::test]
async fn another_instance_reads_and_compare_and_sets_the_same_task() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_instances(dir.path());
    let mut t = crate::store::contract::task(TaskId::random(), now_ms(), 60_000);
    a.put_task(&t).await.unwrap();
    assert_eq!(b.get_task(t.id).await.unwrap(), Some(t.clone()));
    // Both read version 1 and race to write version 2: B comes first.
    t.version = 2;
    let by_b = TaskRecord {
        cancelled_ms: Some(t.created_ms + 1),
        ..t.clone()
    };
    let by_a = TaskRecord {
        legs: vec![StreamId::random()],
        ..t.clone()
    };
    assert!(b.update_task(&by_b).await.unwrap());
    assert!(!a.update_task(&by_a).await.unwrap(), "A lost the race");
    assert_eq!(a.get_task(t.id).await.unwrap(), Some(by_b.clone()));
    // A goes on from what B wrote.
    let next = TaskRecord { version: 3, ..by_b };
    assert!(a.update_task(&next).await.unwrap());
    assert_eq!(b.get_task(t.id).await.unwrap(), Some(next));
}

#[tokio::test]
async fn another_instance_deletes_a_task_with_the_live_leg_this_one_owns() {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    let prefix = prefix_of(dir.path());
    let (a, b) = two_instances(dir.path());
    let mut t = crate::store::contract::task(TaskId::random(), now_ms(), 60_000);
    let leg = crate::store::contract::leg(t.id);
    t.legs.push(leg.id);
    a.create_stream(&leg).await.unwrap();
    a.append(leg.id, &[Bytes::from_static(b"x")]).await.unwrap();
    a.put_task(&t).await.unwrap();
    b.delete_task(t.id).await.unwrap();
    assert_eq!(a.stream_meta(leg.id).await.unwrap(), None);
    assert!(matches!(
        a.append(leg.id, &[Bytes::from_static(b"late")]).await,
        Err(StoreError::NoSuchStream(_))
    ));
    // Nothing of the task or its leg is left, its owner's set included.
    let mut conn = connection();
    let left: Vec<String> = keys_of(&mut conn, &prefix)
        .into_iter()
        .filter(|k| k.contains(&t.id.to_string()) || k.contains(&leg.id.to_string()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let owned: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:owned:*"))
        .query::<Vec<String>>(&mut conn)
        .unwrap()
        .into_iter()
        .flat_map(|key| {
            redis::cmd("SMEMBERS")
                .arg(key)
                .query::<Vec<String>>(&mut conn)
                .unwrap()
        })
        .collect();
    assert!(!owned.contains(&leg.id.to_string()), "{owned:?}");
}

/// Two instances as [`two_instances`], as the Redis store itself, to look
/// at what each reads of the feed; and a call `a` created.
struct CallOnA {
    a: Arc<RedisStore>,
    b: Arc<RedisStore>,
    call: StreamMeta,
    _cleanup: Cleanup,
    _dir: tempfile::TempDir,
}

async fn a_call_on_a() -> CallOnA {
    let _cleanup = Cleanup;
    let dir = tempfile::tempdir().unwrap();
    drop(open_store(dir.path(), SyncMode::Batch));
    let prefix = prefix_of(dir.path());
    let open = || Arc::new(RedisStore::new(&url(), &prefix, TEST_LEASE).unwrap());
    let (a, b) = (open(), open());
    let call = crate::store::contract::meta(SessionId::random());
    a.create_stream(&call).await.unwrap();
    CallOnA {
        a,
        b,
        call,
        _cleanup,
        _dir: dir,
    }
}

#[tokio::test]
async fn an_instance_serving_only_its_own_calls_reads_no_shard_of_the_feed() {
    let CallOnA {
        a,
        b,
        _cleanup,
        _dir,
        ..
    } = a_call_on_a().await;
    let mut readers = Vec::new();
    for _ in 0..32 {
        let m = crate::store::contract::meta(SessionId::random());
        a.create_stream(&m).await.unwrap();
        readers.push(a.subscribe(m.id).await);
        a.append(m.id, &[Bytes::from_static(b"x")]).await.unwrap();
    }
    assert!(
        readers.iter().all(|r| r.borrow().seq == 1),
        "A's own writes wake its readers"
    );
    assert!(a.follow.cursors.read().is_empty());
    assert!(b.follow.cursors.read().is_empty());
}

#[tokio::test]
async fn a_reader_here_reads_only_the_shard_of_its_stream() {
    let CallOnA {
        b,
        call: m,
        _cleanup,
        _dir,
        ..
    } = a_call_on_a().await;
    let _reading = b.subscribe(m.id).await;
    let read: Vec<usize> = b.follow.cursors.read().iter().map(|(n, _)| *n).collect();
    assert_eq!(read, vec![super::super::shards::shard_of(m.id)]);
}

#[tokio::test]
async fn a_change_on_the_one_feed_of_the_previous_version_still_wakes_a_reader() {
    let CallOnA {
        b,
        call: m,
        _dir: dir,
        _cleanup,
        ..
    } = a_call_on_a().await;
    let prefix = prefix_of(dir.path());
    let mut seen_by_b = b.subscribe(m.id).await;
    // What an instance of the previous version writes as it appends: the
    // line on `P:feed`, not on a shard. B listens from the feed's end as it
    // found it, so the line is written until B has heard.
    let mut conn = connection();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let _: String = redis::cmd("XADD")
            .arg(format!("{prefix}:feed"))
            .arg("*")
            .arg("i")
            .arg("old-instance")
            .arg("s")
            .arg(m.id.to_string())
            .arg("q")
            .arg(7)
            .query(&mut conn)
            .unwrap();
        let heard = tokio::time::timeout(
            Duration::from_millis(200),
            seen_by_b.wait_for(|w| w.seq == 7),
        )
        .await;
        if heard.is_ok() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "B never heard");
    }
}

#[tokio::test]
async fn a_call_taken_from_here_is_followed_once_a_write_here_is_refused() {
    let CallOnA {
        a,
        b,
        call: m,
        _cleanup,
        _dir,
    } = a_call_on_a().await;
    let mut seen_by_a = a.subscribe(m.id).await;
    a.retire().await.unwrap();
    assert_eq!(b.orphans().await.unwrap().len(), 1);
    let refused = a.append(m.id, &[Bytes::from_static(b"late")]).await;
    assert!(matches!(refused, Err(StoreError::NotOwner(_))));
    b.append(m.id, &[Bytes::from_static(b"b")]).await.unwrap();
    tokio::time::timeout(PATIENCE, seen_by_a.wait_for(|w| w.seq == 1))
        .await
        .expect("A's reader learns of B's append through the feed")
        .unwrap();
}

#[tokio::test]
async fn a_live_call_ended_by_another_instance_wakes_its_owners_reader() {
    let CallOnA {
        a,
        b,
        call: m,
        _cleanup,
        _dir,
    } = a_call_on_a().await;
    let mut seen_by_a = a.subscribe(m.id).await;
    let cancelled = Finish::new(crate::store::StreamStatus::Cancelled, None);
    b.set_status(m.id, cancelled).await.unwrap();
    tokio::time::timeout(PATIENCE, seen_by_a.wait_for(|w| w.finished))
        .await
        .expect("A, which reads no shard for its own call, hears of it")
        .unwrap();
    assert!(a.follow.cursors.read().is_empty());
}

#[tokio::test]
async fn a_live_call_deleted_by_another_instance_wakes_its_owners_reader() {
    let CallOnA {
        a,
        b,
        call: m,
        _cleanup,
        _dir,
    } = a_call_on_a().await;
    let mut seen_by_a = a.subscribe(m.id).await;
    b.delete_stream(m.id).await.unwrap();
    tokio::time::timeout(PATIENCE, seen_by_a.wait_for(|w| w.finished))
        .await
        .expect("A hears that its call is gone")
        .unwrap();
}
