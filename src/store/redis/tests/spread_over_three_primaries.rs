//! A log spread over the partitions of a Redis Cluster of three primaries
//! (`spread.rs`, on the cluster `on_a_three_primary_cluster.rs` shares):
//! the whole contract suite, writes that land on every primary while each
//! session keeps to one slot, the count recorded and held to, and sessions
//! announced across instances whichever partition they are in.

use std::cell::RefCell;

use super::instances::PATIENCE;
use super::redis_cluster::{self, RedisCluster};
use super::*;

/// Two on each primary: enough to spread, few enough that each test's
/// stores (a blocked feed connection per partition) stay light.
const PARTITIONS: usize = 6;

fn cluster() -> &'static RedisCluster {
    redis_cluster::shared().unwrap_or_else(|why| panic!("{why}"))
}

thread_local! {
    /// Prefixes opened on the cluster by the test running on this thread.
    static OPENED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Every key of (configured) `prefix`: the count's, in `{P}`, and each
/// partition's, in `{P:<k>.<salt>}`.
fn patterns(prefix: &str) -> [String; 2] {
    [format!("{{{prefix}}}:*"), format!("{{{prefix}:*")]
}

/// Deletes the keys of every prefix the test opened on the cluster.
#[derive(Default)]
pub struct SpreadCleanup;

impl Drop for SpreadCleanup {
    fn drop(&mut self) {
        let prefixes = OPENED.with(|o| std::mem::take(&mut *o.borrow_mut()));
        let Ok(cluster) = redis_cluster::shared() else {
            return;
        };
        for prefix in prefixes {
            for pattern in patterns(&prefix) {
                let left = cluster.delete(&pattern);
                if !std::thread::panicking() {
                    assert_eq!(left, 0, "keys of {prefix} left on the cluster");
                }
            }
        }
    }
}

fn remember(prefix: &str) {
    OPENED.with(|o| {
        let mut o = o.borrow_mut();
        if !o.iter().any(|p| p == prefix) {
            o.push(prefix.to_owned());
        }
    });
}

fn open_spread(dir: &Path, _sync: SyncMode) -> SharedStore {
    Arc::new(spread(dir, PARTITIONS))
}

/// A spread store on the shared cluster, under the directory's prefix.
fn spread(dir: &Path, partitions: usize) -> Spread {
    let prefix = prefix_of(dir);
    remember(&prefix);
    Spread::clustered(&cluster().urls(), &prefix, partitions, TEST_LEASE).unwrap()
}

crate::store::contract::contract_tests!(open_spread, guard = SpreadCleanup::default);

fn endpoint(partitions: usize) -> endpoint::Endpoint {
    endpoint::Endpoint {
        cluster: cluster().urls(),
        partitions: Some(partitions),
        ..endpoint::Endpoint::default()
    }
}

fn tuning() -> Tuning {
    Tuning {
        lifetimes: Lifetimes::default(),
        replicas: Replicas::default(),
        workers: 1,
    }
}

/// Opens the log as the server does, with `partitions`.
async fn open_as_served(prefix: &str, partitions: usize) -> Result<SharedStore> {
    remember(prefix);
    open_log(&endpoint(partitions), prefix, TEST_LEASE, tuning()).await
}

#[tokio::test]
async fn sessions_and_their_calls_land_on_every_primary_each_session_in_one_slot() {
    let _cleanup = SpreadCleanup;
    let dir = tempfile::tempdir().unwrap();
    let store = open_spread(dir.path(), SyncMode::Batch);
    let mut sessions = Vec::new();
    // Two sessions in each partition, so in each primary.
    for k in 0..2 * PARTITIONS {
        let mut id = SessionId::random();
        id.0[0] = k as u8;
        let s = crate::store::contract::session(id);
        store.put_session(&s).await.unwrap();
        let call = crate::store::contract::meta(s.id);
        store.create_stream(&call).await.unwrap();
        store
            .append(call.id, &[Bytes::from_static(b"x")])
            .await
            .unwrap();
        sessions.push((s.id, call.id));
    }
    let prefix = prefix_of(dir.path());
    let held = cluster().keys(&patterns(&prefix)[1]);
    assert_eq!(held.len(), 3);
    assert!(held.iter().all(|(_, keys)| !keys.is_empty()), "{held:?}");
    for (session, call) in sessions {
        let tag = partition_of(&prefix, PARTITIONS, session.as_bytes());
        let keys: Vec<String> = held.iter().flat_map(|(_, k)| k.clone()).collect();
        for id in [session.to_string(), call.to_string()] {
            let key = keys.iter().find(|k| k.contains(&id)).expect("written");
            assert!(key.starts_with(&tag), "{key} outside {tag}");
        }
    }
}

#[tokio::test]
async fn a_stream_minted_outside_its_sessions_partition_is_refused_and_nothing_is_written() {
    let _cleanup = SpreadCleanup;
    let dir = tempfile::tempdir().unwrap();
    let store = open_spread(dir.path(), SyncMode::Batch);
    let session = SessionId::random();
    let mut stray = crate::store::contract::meta(session);
    stray.id.0[0] = session.0[0].wrapping_add(1);
    let err = store.create_stream(&stray).await.unwrap_err();
    assert!(err.to_string().contains("its session's"), "{err}");
    assert_eq!(store.stream_meta(stray.id).await.unwrap(), None);
}

#[tokio::test]
async fn the_count_is_recorded_by_the_first_start_and_another_is_refused() {
    let _cleanup = SpreadCleanup;
    let prefix = format!("spread-count:{}", StreamId::random());
    let first = open_as_served(&prefix, 4).await.expect("the first start");
    let again = open_as_served(&prefix, 4).await.expect("the same count");
    let err = match open_as_served(&prefix, 8).await {
        Ok(_) => panic!("a log spread over 4 opened as 8"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("is spread over 4"), "{err}");
    drop((first, again));
}

#[tokio::test]
async fn a_log_left_in_one_slot_is_refused_a_spread_and_kept_by_one_partition() {
    let _cleanup = SpreadCleanup;
    let prefix = format!("spread-earlier:{}", StreamId::random());
    remember(&prefix);
    let earlier = RedisStore::clustered(&cluster().urls(), &prefix, TEST_LEASE).unwrap();
    let s = crate::store::contract::session(SessionId::random());
    earlier.put_session(&s).await.unwrap();
    let err = match open_as_served(&prefix, DEFAULT_PARTITIONS).await {
        Ok(_) => panic!("a spread opened over a log in one slot"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("set partitions = 1"), "{err}");
    let kept = open_as_served(&prefix, 1).await.expect("one partition");
    assert_eq!(kept.get_session(s.id).await.unwrap(), Some(s));
}

#[tokio::test]
async fn a_session_stored_by_another_instance_in_any_partition_is_announced_here() {
    let _cleanup = SpreadCleanup;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        spread(dir.path(), PARTITIONS),
        spread(dir.path(), PARTITIONS),
    );
    let mut changes = b.session_changes().expect("a shared log announces changes");
    for _ in 0..PARTITIONS * 2 {
        let s = crate::store::contract::session(SessionId::random());
        // B's listeners start at each feed's end as they find it when
        // connected: A writes until B has heard.
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            a.put_session(&s).await.unwrap();
            let heard = tokio::time::timeout(Duration::from_millis(200), changes.recv()).await;
            if let Ok(news) = heard {
                assert_eq!(news.unwrap(), crate::store::SessionNews::Changed(s.id));
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "B never heard");
        }
    }
}

#[tokio::test]
async fn a_looker_finds_the_count_and_lists_every_partitions_streams() {
    let _cleanup = SpreadCleanup;
    let prefix = format!("spread-look:{}", StreamId::random());
    let served = open_as_served(&prefix, 4).await.expect("served");
    let mut made = Vec::new();
    for _ in 0..8 {
        let m = crate::store::contract::meta(SessionId::random());
        served.create_stream(&m).await.unwrap();
        made.push(m.id);
    }
    let at = endpoint::Endpoint {
        partitions: None,
        ..endpoint(4)
    };
    let looker = observe_log(&at, &prefix).await.expect("a looker");
    let mut listed: Vec<StreamId> = looker
        .list_streams()
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    listed.sort();
    made.sort();
    assert_eq!(listed, made);
}
