//! The `session_wide_replay` mode: GET + `Last-Event-ID` answered the way
//! server-everything answers it (every event of the session after the id,
//! then silence), which is what the proxy has to cope with in front of it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{Method, Response, StatusCode};
use hyper::body::Incoming;
use mcp_resume_proxy::demo::upstream::DemoOptions;
use mcp_resume_proxy::reply::sse::Event;
use serde_json::{json, Value};

use super::{bounded, call, progress_of, Events, Harness};

/// Long enough for a loopback event to arrive, short enough to wait for
/// often: how long a stream must stay quiet to count as silent.
const QUIET: Duration = Duration::from_millis(300);

/// A demo upstream in the mode, and a 2025-11-25 session on it (so that
/// every POST stream starts with a priming event).
async fn session_wide() -> (Harness, String) {
    let opts = DemoOptions {
        session_wide_replay: true,
        ..DemoOptions::default()
    };
    let h = Harness::new(opts).await;
    let session = h.initialize("2025-11-25").await;
    (h, session)
}

async fn get_after(h: &Harness, session: &str, last: &str) -> Response<Incoming> {
    let headers = [("mcp-session-id", session), ("last-event-id", last)];
    h.send(Method::GET, &headers, None).await
}

async fn get_standalone(h: &Harness, session: &str) -> Response<Incoming> {
    h.send(Method::GET, &[("mcp-session-id", session)], None)
        .await
}

/// Every event of a response that ends.
async fn all_events(resp: Response<Incoming>) -> Vec<Event> {
    let mut events = Events::new(resp);
    let mut out = Vec::new();
    while let Some(event) = events.next().await {
        out.push(event);
    }
    out
}

/// The events that arrive until the stream stays quiet for [`QUIET`], and
/// whether it ended meanwhile.
async fn until_quiet(events: &mut Events) -> (Vec<Event>, bool) {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(QUIET, events.next()).await {
            Ok(Some(event)) => out.push(event),
            Ok(None) => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

fn json_of(event: &Event) -> Value {
    serde_json::from_slice(&event.data).unwrap()
}

fn is_uuid_v4(id: &str) -> bool {
    let parts: Vec<&str> = id.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
        && parts[2].starts_with('4')
}

#[tokio::test]
async fn session_wide_replay_ids_are_random_uuids_that_name_no_stream() {
    bounded(async {
        let (h, session) = session_wide().await;
        let echo = call(1, "echo", json!({"text": "a"}), None);
        let events = all_events(h.post(Some(&session), &echo).await).await;
        let ids: Vec<&str> = events.iter().filter_map(|e| e.id.as_deref()).collect();
        assert_eq!(ids.len(), 2, "priming and result: {events:?}");
        assert!(ids.iter().all(|id| is_uuid_v4(id)), "{ids:?}");
        assert_ne!(ids[0], ids[1]);
    })
    .await;
}

#[tokio::test]
async fn session_wide_replay_sends_other_streams_events_after_the_named_id() {
    bounded(async {
        let (h, session) = session_wide().await;
        let echo = call(1, "echo", json!({"text": "a"}), None);
        let echoed = all_events(h.post(Some(&session), &echo).await).await;
        let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        let pinged = all_events(h.post(Some(&session), &ping).await).await;
        // Logs on the standalone stream, which no GET is reading.
        let notify = call(3, "notify", json!({"text": "n"}), None);
        let notified = all_events(h.post(Some(&session), &notify).await).await;

        // Resume the echo's stream from its priming event.
        let resp = get_after(&h, &session, echoed[0].id.as_deref().unwrap()).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let mut replay = Events::new(resp);
        let (replayed, ended) = until_quiet(&mut replay).await;
        assert!(!ended, "the replay stays open");
        let ids: Vec<&str> = replayed.iter().map(|e| e.id.as_deref().unwrap()).collect();
        let messages: Vec<Value> = replayed.iter().map(json_of).collect();
        assert_eq!(messages.len(), 6, "{messages:?}");
        // The echo's own result, then the later streams in the order their
        // events were logged; priming events come back as `{}`.
        assert_eq!(ids[0], echoed[1].id.as_deref().unwrap());
        assert_eq!(messages[0]["result"]["content"][0]["text"], "a");
        assert_eq!(ids[1], pinged[0].id.as_deref().unwrap());
        assert_eq!(messages[1], json!({}));
        assert_eq!(ids[2], pinged[1].id.as_deref().unwrap());
        assert_eq!(
            messages[2],
            json!({"jsonrpc": "2.0", "id": 2, "result": {}})
        );
        assert_eq!(ids[3], notified[0].id.as_deref().unwrap());
        assert_eq!(messages[3], json!({}));
        assert_eq!(messages[4]["method"], "notifications/message");
        assert_eq!(messages[4]["params"]["data"], "n");
        assert_eq!(ids[5], notified[1].id.as_deref().unwrap());
        assert_eq!(messages[5]["result"]["content"][0]["text"], "queued");
    })
    .await;
}

#[tokio::test]
async fn session_wide_replay_never_re_attaches_live() {
    bounded(async {
        let (h, session) = session_wide().await;
        let args = json!({"steps": 3, "interval_ms": 150});
        let resp = h
            .post(Some(&session), &call(7, "slow", args, Some("t")))
            .await;
        let mut post = Events::new(resp);
        let (first, message) = post.next_message().await.unwrap();
        assert_eq!(progress_of(&message), 1);
        drop(post);

        let mut resumed = Events::new(get_after(&h, &session, &first.unwrap()).await);
        let (replayed, _) = until_quiet(&mut resumed).await;
        let stats = &h.upstream.stats;
        while stats.calls_completed.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The call ran to its end meanwhile, yet nothing more came, and the
        // stream stays open.
        let (later, ended) = until_quiet(&mut resumed).await;
        assert!(!ended, "the resumed stream closed");
        assert!(later.is_empty(), "events came live: {later:?}");
        let replayed: Vec<Value> = replayed.iter().map(json_of).collect();
        assert!(
            replayed.iter().all(|m| m.get("result").is_none()),
            "the result came live: {replayed:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn asking_again_after_silence_returns_what_the_tool_said_since() {
    bounded(async {
        let (h, session) = session_wide().await;
        let args = json!({"steps": 4, "interval_ms": 200});
        let resp = h
            .post(Some(&session), &call(8, "slow", args, Some("a")))
            .await;
        let mut post = Events::new(resp);
        let (mut last, message) = post.next_message().await.unwrap();
        assert_eq!(progress_of(&message), 1);
        drop(post);

        let mut seen = Vec::new();
        let mut gets = 0;
        while !seen.iter().any(|m: &Value| m["id"] == 8) {
            gets += 1;
            let resp = get_after(&h, &session, last.as_deref().unwrap()).await;
            let (events, ended) = until_quiet(&mut Events::new(resp)).await;
            assert!(!ended, "a resumed stream closed");
            for event in events {
                last = event.id.clone();
                seen.push(json_of(&event));
            }
        }
        let progress: Vec<u64> = seen[..seen.len() - 1].iter().map(progress_of).collect();
        assert_eq!(progress, [2, 3, 4], "{seen:?}");
        assert_eq!(
            seen[3]["result"]["content"][0]["text"],
            "slow done after 4 steps"
        );
        assert!(gets >= 2, "one GET got everything: no silence to ask after");
    })
    .await;
}

#[tokio::test]
async fn session_wide_replay_of_an_unknown_id_is_an_open_silent_stream() {
    bounded(async {
        let (h, session) = session_wide().await;
        let resp = get_after(&h, &session, "no-such-id").await;
        assert_eq!(resp.status(), StatusCode::OK);
        let (events, ended) = until_quiet(&mut Events::new(resp)).await;
        assert!(events.is_empty() && !ended, "{events:?} ended={ended}");
    })
    .await;
}

#[tokio::test]
async fn a_second_replay_to_the_same_last_id_ends_the_first() {
    bounded(async {
        let (h, session) = session_wide().await;
        let echo = call(1, "echo", json!({"text": "a"}), None);
        let echoed = all_events(h.post(Some(&session), &echo).await).await;
        let priming = echoed[0].id.as_deref().unwrap();

        let mut first = Events::new(get_after(&h, &session, priming).await);
        let (got, ended) = until_quiet(&mut first).await;
        assert_eq!((got.len(), ended), (1, false));
        // Both replays end on the echo's result, which is where the SDK files
        // them: the later one takes the place of the earlier.
        let mut second = Events::new(get_after(&h, &session, priming).await);
        assert!(first.next().await.is_none(), "the first replay goes on");
        let (got, ended) = until_quiet(&mut second).await;
        assert_eq!((got.len(), ended), (1, false));
    })
    .await;
}

#[tokio::test]
async fn session_wide_replays_do_not_conflict_with_the_standalone_get() {
    bounded(async {
        let (h, session) = session_wide().await;
        let standalone = get_standalone(&h, &session).await;
        assert_eq!(standalone.status(), StatusCode::OK);
        let resp = get_after(&h, &session, "no-such-id").await;
        assert_eq!(resp.status(), StatusCode::OK);
        let resp = get_after(&h, &session, "another-unknown-id").await;
        assert_eq!(resp.status(), StatusCode::OK);
        // The standalone stream itself is still one per session.
        let resp = get_standalone(&h, &session).await;
        assert_eq!(resp.status(), StatusCode::CONFLICT);
    })
    .await;
}

#[tokio::test]
async fn deleting_the_session_ends_its_silent_replays() {
    bounded(async {
        let (h, session) = session_wide().await;
        let mut replay = Events::new(get_after(&h, &session, "no-such-id").await);
        let (_, ended) = until_quiet(&mut replay).await;
        assert!(!ended);
        let resp = h
            .send(
                Method::DELETE,
                &[("mcp-session-id", session.as_str())],
                None,
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            replay.next().await.is_none(),
            "the replay outlived its session"
        );
    })
    .await;
}
