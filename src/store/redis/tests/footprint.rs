//! What a retained call costs Redis: short `tools/call` streams written the
//! way the proxy writes them, counted in Redis' own `used_memory` and in the
//! `MEMORY USAGE` of each kind of key. Measured on a quiet `redis-server` of
//! its own (never `REDIS_URL`: other tests' keys would count), so it is slow
//! and off the default run:
//!
//! ```sh
//! cargo test --lib store::redis::tests::footprint -- --ignored --nocapture
//! ```
//!
//! `FOOTPRINT_CALLS` (default 20,000), `FOOTPRINT_SESSIONS` (default 20)
//! and `FOOTPRINT_PROGRESS_EVERY` (default 4) change the load. The feed (`P:feed` and its shards) is capped whatever the load, so it
//! is reported apart and not counted per call.

use std::collections::BTreeMap;

use super::redis_server::{Persistence, RedisServer};
use super::*;
use crate::store::{Outcome, StreamKind, StreamStatus};

/// A `tools/call` answer of about 300 bytes.
const ANSWER: &str = r#"{"jsonrpc":"2.0","id":ID,"result":{"content":[{"type":"text","text":"The forecast for Lisbon on Tuesday: sunny spells with a light breeze from the north-west, highs of 24 C and lows of 16 C; the chance of rain stays under ten per cent all day."}],"structuredContent":{"high":24,"low":16,"rain":0.1},"isError":false}}"#;
/// The progress notification some calls send first.
const PROGRESS: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok-ID","progress":50,"total":100,"message":"half-way"}}"#;
/// One call in this many (`FOOTPRINT_PROGRESS_EVERY`) gets a progress
/// notification first; 1: every call.
const PROGRESS_EVERY: usize = 4;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn used_memory(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory names used_memory")
}

/// The kind of a key of `prefix`: its last part, with ids taken out.
fn kind_of(key: &str, prefix: &str) -> String {
    match key.strip_prefix(&format!("{{{prefix}:")) {
        Some(tagged) => match tagged.split_once("}:") {
            Some((_, what)) => format!("{{P:<id>}}:{what}"),
            None => key.to_owned(),
        },
        None => key.replacen(prefix, "P", 1),
    }
}

/// `MEMORY USAGE` (every element counted) summed by kind of key: (keys,
/// bytes).
fn usage_by_kind(conn: &mut redis::Connection, prefix: &str) -> BTreeMap<String, (u64, u64)> {
    let keys = keys_of(conn, prefix);
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0);
    }
    let sizes: Vec<Option<u64>> = pipe.query(conn).unwrap();
    let mut kinds = BTreeMap::new();
    for (key, size) in keys.iter().zip(sizes) {
        let kind: &mut (u64, u64) = kinds.entry(kind_of(key, prefix)).or_default();
        kind.0 += 1;
        kind.1 += size.unwrap_or(0);
    }
    kinds
}

/// One call as the proxy makes it: its stream created with the call, one
/// progress notification for some, then the answer that finishes it.
async fn one_call(store: &RedisStore, session: SessionId, n: usize, progress_every: usize) {
    let mut meta = StreamMeta::new(
        StreamId::random(),
        session,
        StreamKind::Request,
        vec![RequestId(n.to_string().into())],
        Some("tools/call".into()),
        now_ms(),
    );
    let digest = crate::id::hex(&StreamId::random().0).repeat(2);
    meta.params_digest = Some(digest.into());
    let progress = n % progress_every == 0;
    if progress {
        meta.progress = vec![format!("\"tok-{n}\"").into()];
    }
    assert_eq!(store.create_call(&meta, &[]).await.unwrap(), None);
    if progress {
        let note = Bytes::from(PROGRESS.replace("ID", &n.to_string()));
        store.append(meta.id, &[note]).await.unwrap();
    }
    let answer = Bytes::from(ANSWER.replace("ID", &n.to_string()));
    let end = Finish::new(StreamStatus::Completed, Some(Outcome::Result));
    store.append_final(meta.id, &[answer], end).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: measures Redis memory per retained call on a server of its own"]
async fn footprint_of_a_retained_call() {
    let calls = env_or("FOOTPRINT_CALLS", 20_000);
    let sessions = env_or("FOOTPRINT_SESSIONS", 20).max(1);
    let progress_every = env_or("FOOTPRINT_PROGRESS_EVERY", PROGRESS_EVERY).max(1);
    let server = RedisServer::start(Persistence::None).unwrap();
    let prefix = "mcp-resume-proxy";
    let store = Arc::new(RedisStore::new(&server.url(), prefix, TEST_LEASE).unwrap());
    let mut conn = redis_server::connect(&server.url()).unwrap();
    let ids: Vec<SessionId> = (0..sessions).map(|_| SessionId::random()).collect();
    for id in &ids {
        let s = crate::store::contract::session(*id);
        store.put_session(&s).await.unwrap();
    }
    let before = used_memory(&mut conn);
    let workers: Vec<_> = (0..sessions)
        .map(|w| {
            let (store, session) = (store.clone(), ids[w]);
            tokio::spawn(async move {
                for n in (w..calls).step_by(sessions) {
                    one_call(&store, session, n, progress_every).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let with_feed = used_memory(&mut conn);
    let kinds = usage_by_kind(&mut conn, prefix);
    let mut feeds = redis::cmd("DEL");
    feeds.arg(format!("{prefix}:feed"));
    for shard in 0..super::super::shards::SHARDS {
        feeds.arg(format!("{prefix}:feed:{shard}"));
    }
    feeds.query::<()>(&mut conn).unwrap();
    let after = used_memory(&mut conn);
    let per_call = |bytes: u64| bytes as f64 / calls as f64;
    println!(
        "{calls} calls in {sessions} sessions, one in {progress_every} with a progress notification"
    );
    println!(
        "used_memory per call: {:.0} B without the feed ({:.0} B with it)",
        per_call(after.saturating_sub(before)),
        per_call(with_feed.saturating_sub(before))
    );
    println!(
        "{:<28} {:>8} {:>12} {:>10} {:>10}",
        "key", "keys", "bytes", "per key", "per call"
    );
    for (kind, (keys, bytes)) in &kinds {
        println!(
            "{kind:<28} {keys:>8} {bytes:>12} {:>10.0} {:>10.0}",
            *bytes as f64 / *keys as f64,
            per_call(*bytes)
        );
    }
}
