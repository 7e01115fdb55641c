//! The Redis backend on a Redis Cluster of three primaries with a replica
//! each (`redis_cluster.rs`, one per test process): the whole contract
//! suite, every key of a deployment in one slot, writes that go on while
//! that slot moves to another primary (`MOVED`, `ASK`, `TRYAGAIN`), and an
//! append the cluster client sends again applied once.

use std::cell::RefCell;

use super::redis_cluster::{self, RedisCluster};
use super::*;

fn cluster() -> &'static RedisCluster {
    redis_cluster::shared().unwrap_or_else(|why| panic!("{why}"))
}

thread_local! {
    /// Prefixes opened on the cluster by the test running on this thread.
    static OPENED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The keys of (configured) `prefix` on the cluster.
fn pattern(prefix: &str) -> String {
    format!("{}:*", super::super::cluster::one_slot(prefix))
}

/// Deletes the keys of every prefix the test opened on the cluster.
#[derive(Default)]
pub struct ClusterCleanup;

impl Drop for ClusterCleanup {
    fn drop(&mut self) {
        let prefixes = OPENED.with(|o| std::mem::take(&mut *o.borrow_mut()));
        let Ok(cluster) = redis_cluster::shared() else {
            return;
        };
        for prefix in prefixes {
            let left = cluster.delete(&pattern(&prefix));
            if !std::thread::panicking() {
                assert_eq!(left, 0, "keys of {prefix} left on the cluster");
            }
        }
    }
}

fn open_clustered(dir: &Path, _sync: SyncMode) -> SharedStore {
    Arc::new(clustered(dir))
}

/// A store on the shared cluster, under the directory's prefix.
fn clustered(dir: &Path) -> RedisStore {
    let nodes = cluster().urls();
    let prefix = prefix_of(dir);
    OPENED.with(|o| {
        let mut o = o.borrow_mut();
        if !o.contains(&prefix) {
            o.push(prefix.clone());
        }
    });
    RedisStore::clustered(&nodes, &prefix, TEST_LEASE).unwrap()
}

crate::store::contract::contract_tests!(open_clustered, guard = ClusterCleanup::default);

/// A store on the shared cluster, its directory and configured prefix.
fn one_clustered() -> (tempfile::TempDir, SharedStore, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_clustered(dir.path(), SyncMode::Batch);
    let prefix = prefix_of(dir.path());
    (dir, store, prefix)
}

/// Writes a session, a live and a finished stream, and a task.
async fn a_bit_of_everything(store: &SharedStore) {
    let s = crate::store::contract::session(SessionId::random());
    store.put_session(&s).await.unwrap();
    let live = crate::store::contract::meta(s.id);
    store.create_stream(&live).await.unwrap();
    store
        .append(live.id, &[Bytes::from_static(b"x")])
        .await
        .unwrap();
    let done = crate::store::contract::meta(s.id);
    store.create_stream(&done).await.unwrap();
    let end = Finish::new(crate::store::StreamStatus::Completed, None);
    store
        .append_final(done.id, &[Bytes::from_static(b"y")], end)
        .await
        .unwrap();
    let task = crate::store::contract::task(TaskId::random(), now_ms(), 10_000_000);
    store.put_task(&task).await.unwrap();
}

#[tokio::test]
async fn every_key_of_a_deployment_sits_in_one_slot_on_one_primary() {
    let _cleanup = ClusterCleanup;
    let (_dir, store, prefix) = one_clustered();
    a_bit_of_everything(&store).await;
    let held: Vec<(u16, Vec<String>)> = cluster()
        .keys(&pattern(&prefix))
        .into_iter()
        .filter(|(_, keys)| !keys.is_empty())
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    let keys = &held[0].1;
    assert!(keys.len() >= 5, "{keys:?}");
    let mut conn = redis_server::connect(&format!("redis://127.0.0.1:{}", held[0].0)).unwrap();
    let slots: Vec<i64> = keys
        .iter()
        .map(|k| {
            redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(k)
                .query(&mut conn)
                .unwrap()
        })
        .collect();
    assert!(slots.iter().all(|s| *s == slots[0]), "{keys:?} {slots:?}");
}

#[tokio::test]
async fn open_names_the_cluster_nodes_that_do_not_answer() {
    // Port 9 (discard) has no Redis behind it.
    let at = endpoint::Endpoint {
        cluster: vec!["redis://127.0.0.1:9".into()],
        ..endpoint::Endpoint::default()
    };
    let err = match RedisStore::open_at(&at, "p", TEST_LEASE).await {
        Ok(_) => panic!("opened a store on a cluster with no node"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("redis cluster at redis://127.0.0.1:9"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_go_on_and_read_back_whole_while_the_slot_moves_to_another_primary() {
    let _cleanup = ClusterCleanup;
    let (_dir, store, prefix) = one_clustered();
    let m = crate::store::contract::meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    let id = m.id;
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..200u32 {
                let message = Bytes::from(format!("m{i}"));
                store.append(id, &[message]).await.unwrap();
            }
        })
    };
    let home = super::super::cluster::one_slot(&prefix);
    let moved = tokio::task::spawn_blocking(move || cluster().move_slot_of(&home));
    moved.await.unwrap().expect("the slot moved");
    writer.await.unwrap();
    let read = store.read_after(id, 0, 1_000).await.unwrap();
    let texts: Vec<String> = read
        .iter()
        .map(|e| String::from_utf8_lossy(&e.message).into_owned())
        .collect();
    let wanted: Vec<String> = (0..200).map(|i| format!("m{i}")).collect();
    assert_eq!(texts, wanted);
}

/// The cluster client sends a command again by itself when its connection
/// broke after sending it, which the old primary may have run: the second
/// run of an append, under the same name, changes nothing.
#[tokio::test]
async fn an_append_sent_again_under_its_name_is_applied_once() {
    let _cleanup = ClusterCleanup;
    let dir = tempfile::tempdir().unwrap();
    let store = clustered(dir.path());
    let m = crate::store::contract::meta(SessionId::random());
    store.create_stream(&m).await.unwrap();
    let once = [Bytes::from_static(b"once")];
    let sent = store.append_invocation(m.id, &once, Along::default(), "i-1:7".into());
    let first: i64 = store.run_write(&sent).await.unwrap();
    let again: i64 = store.run_write(&sent).await.unwrap();
    assert_eq!((first, again), (1, 1));
    let next = store.append_invocation(m.id, &once, Along::default(), "i-1:8".into());
    let second: i64 = store.run_write(&next).await.unwrap();
    assert_eq!(second, 2, "another name is another append");
    let read = store.read_after(m.id, 0, 10).await.unwrap();
    assert_eq!(read.len(), 2);
}
