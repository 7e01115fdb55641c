//! Streams the previous layout wrote (a metadata hash, a log, every index
//! entry it kept), as an instance upgraded in place in front of a live
//! Redis finds them: read as they are, taken over, written to (which moves
//! them into one value), due for retention and deleted whole.

use super::*;
use crate::store::{Outcome, StreamStatus};

/// A serde name (`live`, `result`) as the previous layout wrote it.
fn wire<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

/// Writes `meta` with `entries` as the previous layout's scripts did, owned
/// by `owner` while live.
fn put_legacy(prefix: &str, meta: &StreamMeta, entries: &[&str], owner: &str) {
    let tag = format!("{{{prefix}:{}}}", meta.id);
    let id = meta.id.to_string();
    let bytes: usize = entries.iter().map(|e| e.len()).sum();
    let mut fields = vec![
        ("record", serde_json::to_string(meta).unwrap()),
        ("entries", entries.len().to_string()),
        ("bytes", bytes.to_string()),
        ("status", wire(&meta.status)),
        ("acked", meta.acked.to_string()),
        ("touched_ms", meta.touched_ms.to_string()),
        ("last_request", meta.last_request.to_string()),
        ("coalesced", "0".to_owned()),
        ("owner", owner.to_owned()),
    ];
    if let Some(at) = meta.finished_ms {
        fields.push(("finished_ms", at.to_string()));
    }
    if let Some(outcome) = &meta.outcome {
        fields.push(("outcome", wire(outcome)));
    }
    let mut pipe = redis::pipe();
    pipe.cmd("HSET").arg(format!("{tag}:meta")).arg(&fields);
    for (seq, entry) in entries.iter().enumerate() {
        pipe.cmd("XADD")
            .arg(format!("{tag}:log"))
            .arg(format!("0-{}", seq + 1))
            .arg("m")
            .arg(*entry);
    }
    pipe.cmd("SADD")
        .arg(format!("{{{prefix}:{}}}:streams", meta.session))
        .arg(&id)
        .cmd("SADD")
        .arg(format!("{prefix}:streams"))
        .arg(&id);
    for request in &meta.origin_ids {
        pipe.cmd("HSET")
            .arg(format!("{{{prefix}:{}}}:requests", meta.session))
            .arg(request.as_json())
            .arg(format!("{} {id}", meta.created_ms));
    }
    match meta.finished_ms {
        Some(at) => pipe
            .cmd("ZADD")
            .arg(format!("{prefix}:finished"))
            .arg(at)
            .arg(&id)
            .cmd("PEXPIRE")
            .arg(format!("{tag}:meta"))
            .arg(4_500_000)
            .cmd("PEXPIRE")
            .arg(format!("{tag}:log"))
            .arg(4_500_000),
        None => pipe
            .cmd("SADD")
            .arg(format!("{prefix}:owned:{owner}"))
            .arg(&id),
    };
    pipe.query::<()>(&mut connection()).unwrap();
}

/// An instance of the previous version whose lease ran out long ago.
fn dead_instance(prefix: &str, name: &str) {
    redis::cmd("ZADD")
        .arg(format!("{prefix}:instances"))
        .arg(1)
        .arg(name)
        .query::<()>(&mut connection())
        .unwrap();
}

/// Whether any key of `prefix`, or any member of its indexes, still names
/// `id`.
fn named_anywhere(prefix: &str, session: SessionId, id: StreamId) -> Vec<String> {
    let mut conn = connection();
    let mut found: Vec<String> = keys_of(&mut conn, prefix)
        .into_iter()
        .filter(|k| k.contains(&id.to_string()))
        .collect();
    let id_text = id.to_string();
    for set in [
        format!("{{{prefix}:{session}}}:streams"),
        format!("{prefix}:streams"),
    ] {
        let member: bool = redis::cmd("SISMEMBER")
            .arg(&set)
            .arg(&id_text)
            .query(&mut conn)
            .unwrap();
        if member {
            found.push(set);
        }
    }
    let held: Vec<Vec<u8>> = redis::cmd("HVALS")
        .arg(format!("{{{prefix}:{session}}}:requests"))
        .query(&mut conn)
        .unwrap();
    if held.iter().any(|h| read::named(h) == Some(id)) {
        found.push("requests".into());
    }
    let scored: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("{prefix}:finished"))
        .arg(&id_text)
        .query(&mut conn)
        .unwrap();
    if scored.is_some() {
        found.push("finished".into());
    }
    let retained: usize = redis::cmd("XLEN")
        .arg(format!("{prefix}:retention"))
        .query(&mut conn)
        .unwrap();
    if retained > 0 {
        found.push("retention".into());
    }
    found
}

fn texts(entries: Vec<Entry>) -> Vec<(u64, String)> {
    entries
        .into_iter()
        .map(|e| (e.seq, String::from_utf8(e.message.to_vec()).unwrap()))
        .collect()
}

#[tokio::test]
async fn a_live_stream_of_the_previous_layout_is_read_taken_over_and_written_on() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let session = SessionId::random();
    let mut old = crate::store::contract::call(session, "7", Some("d1"));
    old.progress = vec!["\"p\"".into()];
    put_legacy(&prefix, &old, &["a", "bc"], "old-1");
    dead_instance(&prefix, "old-1");
    let mut want = old.clone();
    (want.entries, want.bytes) = (2, 3);
    assert_eq!(store.stream_meta(old.id).await.unwrap(), Some(want));
    let all = texts(store.read_after(old.id, 0, 10).await.unwrap());
    assert_eq!(all, vec![(1, "a".into()), (2, "bc".into())]);
    let seven = RequestId("7".into());
    assert_eq!(
        store.stream_of_request(session, &seven).await.unwrap(),
        Some(old.id)
    );
    let again = crate::store::contract::call(session, "7", Some("d1"));
    let other = crate::store::contract::call(session, "7", Some("d2"));
    assert_eq!(
        store.create_call(&again, &[]).await.unwrap(),
        Some(Prior::Same(old.id))
    );
    assert_eq!(
        store.create_call(&other, &[]).await.unwrap(),
        Some(Prior::Other)
    );
    let fresh = crate::store::contract::meta(session);
    store.create_stream(&fresh).await.unwrap();
    let mut listed: Vec<StreamId> = store
        .streams_of_session(session)
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    listed.sort();
    let mut both = vec![old.id, fresh.id];
    both.sort();
    assert_eq!(listed, both);
    let everywhere: Vec<StreamId> = store
        .list_streams()
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert!(everywhere.contains(&old.id) && everywhere.contains(&fresh.id));

    // The old owner is dead: this instance takes the stream over, and its
    // first write moves it into one value, its entries left in its log.
    let late = store.append(old.id, &[Bytes::from_static(b"x")]).await;
    assert!(matches!(late, Err(StoreError::NotOwner(_))), "{late:?}");
    let orphans: Vec<StreamId> = store
        .orphans()
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(orphans, vec![old.id]);
    assert_eq!(
        store
            .append(old.id, &[Bytes::from_static(b"d")])
            .await
            .unwrap(),
        3
    );
    let tag = format!("{{{prefix}:{}}}", old.id);
    assert_eq!(
        keys_of_stream(&mut connection(), &prefix, old.id),
        vec![format!("{tag}:log"), format!("{tag}:stream")]
    );
    let all = texts(store.read_after(old.id, 1, 10).await.unwrap());
    assert_eq!(all, vec![(2, "bc".into()), (3, "d".into())]);
    let end = Finish {
        status: StreamStatus::Completed,
        outcome: Some(Outcome::Result),
        at_ms: 5_000,
    };
    store
        .append_final(old.id, &[Bytes::from_static(b"r")], end)
        .await
        .unwrap();
    let now = store.stream_meta(old.id).await.unwrap().unwrap();
    assert_eq!(
        (
            now.entries,
            now.bytes,
            now.status,
            now.finished_ms,
            now.progress
        ),
        (
            4,
            5,
            StreamStatus::Completed,
            Some(5_000),
            old.progress.clone()
        )
    );
    assert_eq!(store.finished_by(5_000).await.unwrap(), vec![old.id]);
    store.delete_stream(old.id).await.unwrap();
    assert_eq!(
        named_anywhere(&prefix, session, old.id),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_finished_stream_of_the_previous_layout_is_due_and_keeps_its_ttl_when_moved() {
    let _cleanup = Cleanup;
    let (_dir, store, prefix) = one_store();
    let session = SessionId::random();
    let mut old = crate::store::contract::call(session, "1", Some("d"));
    old.finish(&Finish {
        status: StreamStatus::Failed,
        outcome: Some(Outcome::Error),
        at_ms: 3_000,
    });
    put_legacy(&prefix, &old, &["e"], "old-2");
    assert!(store.finished_by(2_999).await.unwrap().is_empty());
    assert_eq!(store.finished_by(3_000).await.unwrap(), vec![old.id]);
    store.update_stream(old.id, Change::Ack(1)).await.unwrap();
    let mut conn = connection();
    let tag = format!("{{{prefix}:{}}}", old.id);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("{tag}:stream"))
        .query(&mut conn)
        .unwrap();
    assert!((4_000_000..=4_500_000).contains(&ttl), "{ttl}");
    let moved = store.stream_meta(old.id).await.unwrap().unwrap();
    assert_eq!(
        (moved.acked, moved.status, moved.outcome, moved.finished_ms),
        (1, StreamStatus::Failed, Some(Outcome::Error), Some(3_000))
    );
    assert_eq!(store.finished_by(3_000).await.unwrap(), vec![old.id]);
    store.delete_session(session).await.unwrap();
    assert_eq!(
        named_anywhere(&prefix, session, old.id),
        Vec::<String>::new()
    );
}
