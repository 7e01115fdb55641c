//! Criterion micro-benchmarks of the proxy's hot paths, through the crate's
//! public API only: SSE framing (`reply::sse::encode_event`,
//! `reply::sse::Decoder`), envelope classification (`jsonrpc::classify`, `jsonrpc::parse_body`),
//! sealed event ids (`token::Keyring`) and both log backends, the journal
//! (default) and sled (`append` with `sync = "never"` and `"batch"`, one
//! stream and 16 concurrent streams, and `read_after`), and one sweep of the
//! lifetime sweeper over a journal retaining 100,000 streams of 10,000
//! sessions, none due (beside listing every session, the scan the sweeper
//! used to make) — and, with `REDIS_URL` set, one sweep over 10,000 Redis
//! sessions, none due, beside the listing. Every message is one of two sizes seen on the wire: a
//! ~200-byte progress notification and a ~10 KB tool result.
//!
//! Each group is kept short (0.5 s warm-up, 3 s measurement, 20 samples) so the
//! whole suite runs in under two minutes: these numbers are for spotting
//! regressions and for locating cost, the load harness (`benches/load/`)
//! gives the end-to-end figures.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mcp_resume_proxy::config::StoreConfig;
use mcp_resume_proxy::id::{SessionId, StreamId};
use mcp_resume_proxy::jsonrpc;
use mcp_resume_proxy::lifetime::{sweep, Canceller};
use mcp_resume_proxy::reply::sse::{encode_event, Decoder};
use mcp_resume_proxy::session::Sessions;
use mcp_resume_proxy::store::commit::SyncMode;
use mcp_resume_proxy::store::journal::Journal;
use mcp_resume_proxy::store::redis::RedisStore;
use mcp_resume_proxy::store::sled::SledStore;
use mcp_resume_proxy::store::{
    now_ms, Finish, SessionRecord, SharedStore, StreamKind, StreamMeta, StreamStatus,
};
use mcp_resume_proxy::stream::Log;
use mcp_resume_proxy::token::Keyring;

#[path = "support/redis_keys.rs"]
mod redis_keys;

/// A `notifications/progress` of about 200 bytes.
fn small_message() -> Bytes {
    let mut m = String::from(
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"tok-123456\",\
         \"progress\":42,\"total\":100,\"message\":\"",
    );
    while m.len() < 196 {
        m.push('x');
    }
    m.push_str("\"}}");
    Bytes::from(m)
}

/// A `tools/call` result of about 10 KB.
fn large_message() -> Bytes {
    let mut m = String::from(
        "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"",
    );
    while m.len() < 10_000 {
        m.push_str("lorem ipsum dolor sit amet ");
    }
    m.push_str("\"}],\"isError\":false}}");
    Bytes::from(m)
}

fn sizes() -> [(&'static str, Bytes); 2] {
    [("200B", small_message()), ("10KB", large_message())]
}

fn sse(c: &mut Criterion) {
    let mut g = c.benchmark_group("sse");
    let id = Keyring::from_secret(b"bench").event_id(SessionId::random(), StreamId::random(), 42);
    for (name, msg) in sizes() {
        g.throughput(Throughput::Bytes(msg.len() as u64));
        let mut out = BytesMut::with_capacity(msg.len() + 128);
        g.bench_function(format!("encode_event/{name}"), |b| {
            b.iter(|| {
                out.clear();
                encode_event(&mut out, Some(&id), black_box(&msg));
                black_box(out.len())
            })
        });
        let mut wire = BytesMut::new();
        encode_event(&mut wire, Some(&id), &msg);
        let wire = wire.freeze();
        g.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| {
                let mut d = Decoder::new();
                d.push(black_box(&wire));
                black_box(d.next_event())
            })
        });
        // The same bytes arriving in 1,460-byte TCP segments.
        g.bench_function(format!("decode_segmented/{name}"), |b| {
            b.iter(|| {
                let mut d = Decoder::new();
                let mut n = 0;
                for chunk in wire.chunks(1460) {
                    d.push(black_box(chunk));
                    while d.next_event().is_some() {
                        n += 1;
                    }
                }
                black_box(n)
            })
        });
    }
    g.finish();
}

fn json(c: &mut Criterion) {
    let mut g = c.benchmark_group("jsonrpc");
    for (name, msg) in sizes() {
        g.throughput(Throughput::Bytes(msg.len() as u64));
        g.bench_function(format!("classify/{name}"), |b| {
            b.iter(|| jsonrpc::classify(black_box(&msg)).is_ok())
        });
    }
    let request = Bytes::from_static(
        b"{\"jsonrpc\":\"2.0\",\"id\":17,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\
          \"arguments\":{\"text\":\"hello\"},\"_meta\":{\"progressToken\":17}}}",
    );
    g.throughput(Throughput::Bytes(request.len() as u64));
    g.bench_function("parse_body/tools_call", |b| {
        b.iter(|| jsonrpc::parse_body(black_box(&request)).is_ok())
    });
    let mut batch = b"[".to_vec();
    for i in 0..10 {
        if i > 0 {
            batch.push(b',');
        }
        batch.extend_from_slice(&request);
    }
    batch.push(b']');
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("parse_body/batch_of_10", |b| {
        b.iter(|| jsonrpc::parse_body(black_box(&batch)).is_ok())
    });
    g.finish();
}

fn token(c: &mut Criterion) {
    let mut g = c.benchmark_group("token");
    let keys = Keyring::from_secret(b"0123456789abcdef0123456789abcdef");
    let (session, stream) = (SessionId::random(), StreamId::random());
    let mut seq = 0u64;
    g.bench_function("event_id", |b| {
        b.iter(|| {
            seq += 1;
            keys.event_id(session, stream, black_box(seq))
        })
    });
    let id = keys.event_id(session, stream, 123_456);
    g.bench_function("open_event_id", |b| {
        b.iter(|| keys.open_event_id(session, black_box(&id)))
    });
    g.finish();
}

/// The two worker threads the proxy runs on here.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A `tools/call` request stream of `session`, created at `at_ms`.
fn call_meta(session: SessionId, at_ms: u64) -> StreamMeta {
    StreamMeta::new(
        StreamId::random(),
        session,
        StreamKind::Request,
        Vec::new(),
        Some("tools/call".into()),
        at_ms,
    )
}

fn open_stream(rt: &tokio::runtime::Runtime, store: &SharedStore, session: SessionId) -> StreamId {
    let meta = call_meta(session, now_ms());
    rt.block_on(store.create_stream(&meta))
        .expect("create stream");
    meta.id
}

type Backend = fn(&std::path::Path, SyncMode) -> SharedStore;

fn open_journal(dir: &std::path::Path, sync: SyncMode) -> SharedStore {
    Journal::open(dir, sync).expect("open journal")
}

fn open_sled(dir: &std::path::Path, sync: SyncMode) -> SharedStore {
    Arc::new(SledStore::open(dir, sync).expect("open sled"))
}

fn store(c: &mut Criterion) {
    let rt = runtime();
    let msg = small_message();
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));
    let backends: [(&str, Backend); 2] = [("journal", open_journal), ("sled", open_sled)];
    for ((backend, open), (mode_name, mode)) in backends.iter().flat_map(|b| {
        [
            (b, ("never", SyncMode::Never)),
            (b, ("batch", SyncMode::Batch)),
        ]
    }) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = rt.block_on(async { open(dir.path(), mode) });
        let session = SessionId::random();
        let one = open_stream(&rt, &store, session);
        g.bench_function(format!("{backend}/append_200B/{mode_name}/1_stream"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        store
                            .append(one, std::slice::from_ref(&msg))
                            .await
                            .expect("append");
                    }
                    start.elapsed()
                })
            })
        });
        // 16 writers on 16 streams at once: what group commit is for. The
        // time reported is per append (elapsed / total appends).
        let streams: Vec<StreamId> = (0..16).map(|_| open_stream(&rt, &store, session)).collect();
        g.bench_function(
            format!("{backend}/append_200B/{mode_name}/16_streams"),
            |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let per_task = iters.div_ceil(16);
                        let start = Instant::now();
                        let tasks: Vec<_> = streams
                            .iter()
                            .map(|&s| {
                                let store = store.clone();
                                let msg = msg.clone();
                                tokio::spawn(async move {
                                    for _ in 0..per_task {
                                        store
                                            .append(s, std::slice::from_ref(&msg))
                                            .await
                                            .expect("append");
                                    }
                                })
                            })
                            .collect();
                        for t in tasks {
                            t.await.expect("append task");
                        }
                        // Scale back to `iters` appends.
                        start
                            .elapsed()
                            .mul_f64(iters as f64 / (per_task * 16) as f64)
                    })
                })
            },
        );
    }
    // read_after on a stream of 10,000 entries: the replay path.
    g.throughput(Throughput::Elements(100));
    for (backend, open) in backends {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = rt.block_on(async { open(dir.path(), SyncMode::Never) });
        let stream = open_stream(&rt, &store, SessionId::random());
        rt.block_on(async {
            let batch: Vec<Bytes> = (0..100).map(|_| msg.clone()).collect();
            for _ in 0..100 {
                store.append(stream, &batch).await.expect("append");
            }
        });
        g.bench_function(format!("{backend}/read_after/100_of_10k"), |b| {
            b.iter(|| {
                rt.block_on(store.read_after(stream, black_box(5_000), 100))
                    .expect("read")
                    .len()
            })
        });
    }
    g.finish();
}

/// The sweeper's canceller when no upstream is behind the log.
struct NoUpstream;

#[async_trait::async_trait]
impl Canceller for NoUpstream {
    async fn cancel(&self, _stream: &StreamMeta, _why: &str) {}
}

/// A journal retaining `per_session` finished streams for each of
/// `sessions` sessions, all seen just now.
async fn retained(store: &SharedStore, sessions: usize, per_session: usize) {
    for _ in 0..sessions {
        let now = now_ms();
        let session = SessionRecord {
            upstream_session: Some("up".into()),
            protocol_version: Some("2025-11-25".into()),
            ..SessionRecord::new(SessionId::random(), "/mcp", "p", now)
        };
        store.put_session(&session).await.expect("put session");
        for _ in 0..per_session {
            let meta = call_meta(session.id, now);
            store.create_stream(&meta).await.expect("create stream");
            let end = Finish::new(StreamStatus::Completed, None);
            store
                .append_final(meta.id, &[small_message()], end)
                .await
                .expect("answer");
        }
    }
}

fn sweeper(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_journal(dir.path(), SyncMode::Never);
    rt.block_on(retained(&store, 10_000, 10));
    let mut g = c.benchmark_group("sweep");
    bench_sweep(&mut g, &rt, "journal/100k_streams_10k_sessions", &store);
    if let Ok(url) = std::env::var("REDIS_URL") {
        // Sessions only: the idle-session index is what differs; streams
        // are due through sorted sets either way.
        let prefix = format!("mcp-resume-proxy-micro:{}", std::process::id());
        let redis: SharedStore = rt.block_on(async {
            Arc::new(RedisStore::new(&url, &prefix, Duration::from_secs(10)).expect("redis"))
        });
        rt.block_on(retained(&redis, 10_000, 0));
        bench_sweep(&mut g, &rt, "redis/10k_sessions", &redis);
        redis_keys::delete_prefix(&url, &prefix);
    }
    g.finish();
}

/// One sweep of `store` with nothing due, beside listing every session
/// (the scan a sweep used to make), under `name`.
fn bench_sweep(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: &SharedStore,
) {
    let log = Log::new(store.clone());
    // (On a shared log it follows other instances' changes from a task.)
    let sessions = rt.block_on(async { Sessions::new(store.clone()) });
    let config = StoreConfig::default();
    g.bench_function(format!("{name}/none_due"), |b| {
        b.iter(|| {
            rt.block_on(sweep(&log, &sessions, &config, &NoUpstream))
                .expect("sweep")
        })
    });
    g.bench_function(format!("{name}/list_all"), |b| {
        b.iter(|| rt.block_on(store.list_sessions()).expect("list"))
    });
}

criterion_group! {
    name = micro;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = sse, json, token, store, sweeper
}
criterion_main!(micro);
