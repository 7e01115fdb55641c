//! Bad input gets a clear status and a JSON-RPC error body, and disturbs
//! nothing else: a call running meanwhile still completes.

mod common;

use common::dialects::{initialize_declaring, read_to_end, request, resume_token, stream_handle};
use common::*;
use http::StatusCode;
use serde_json::json;

/// Sends `call` while a slow call runs; checks the answer and that the slow
/// call was not disturbed.
async fn rejected_without_harm(
    rig: &Rig,
    sid: &str,
    call: Call,
    status: StatusCode,
) -> serde_json::Value {
    let running = rig
        .client
        .send(Call::post(&slow_call(99, 4, 20)).session(sid))
        .await;
    let res = rig.client.send(call).await;
    assert_eq!(res.status(), status);
    let body = body_json(res).await;
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    assert!(body["error"]["code"].is_i64(), "{body}");
    let messages = messages(running).await;
    assert_eq!(
        messages.last().unwrap()["id"],
        99,
        "the running call completed"
    );
    body
}

#[tokio::test]
async fn malformed_json_is_a_parse_error() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let body = rejected_without_harm(
        &rig,
        &sid,
        Call::raw_post("{\"jsonrpc\":").session(&sid),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(body["error"]["code"], -32700);
}

#[tokio::test]
async fn json_that_is_not_json_rpc_is_an_invalid_request() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&json!({"hello":"world"})).session(&sid);
    let body = rejected_without_harm(&rig, &sid, call, StatusCode::BAD_REQUEST).await;
    assert_eq!(body["error"]["code"], -32600);
}

#[tokio::test]
async fn an_oversized_body_is_413() {
    let rig = Rig::with(Default::default(), |c| c.max_body = 64 * 1024).await;
    let sid = rig.client.initialize(V_LATEST).await;
    let big = tool_call(5, "echo", json!({"text": "x".repeat(100 * 1024)}));
    rejected_without_harm(
        &rig,
        &sid,
        Call::post(&big).session(&sid),
        StatusCode::PAYLOAD_TOO_LARGE,
    )
    .await;
}

#[tokio::test]
async fn a_wrong_content_type_is_415() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&tool_call(5, "echo", json!({"text":"x"})))
        .session(&sid)
        .header("content-type", "text/plain");
    rejected_without_harm(&rig, &sid, call, StatusCode::UNSUPPORTED_MEDIA_TYPE).await;
}

#[tokio::test]
async fn a_missing_session_header_is_400() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&tool_call(5, "echo", json!({"text":"x"})));
    rejected_without_harm(&rig, &sid, call, StatusCode::BAD_REQUEST).await;
}

#[tokio::test]
async fn an_unknown_session_is_404() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    for unknown in ["0123456789abcdef0123456789abcdef", "not-a-session"] {
        let call = Call::post(&tool_call(5, "echo", json!({"text":"x"}))).session(unknown);
        let body = rejected_without_harm(&rig, &sid, call, StatusCode::NOT_FOUND).await;
        assert_eq!(body["error"]["code"], -32001);
    }
}

#[tokio::test]
async fn a_disallowed_origin_is_403() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&tool_call(5, "echo", json!({"text":"x"})))
        .session(&sid)
        .header("origin", "https://evil.example");
    rejected_without_harm(&rig, &sid, call, StatusCode::FORBIDDEN).await;
}

#[tokio::test]
async fn a_get_that_does_not_accept_sse_is_406() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::get()
        .session(&sid)
        .header("accept", "application/json");
    rejected_without_harm(&rig, &sid, call, StatusCode::NOT_ACCEPTABLE).await;
}

#[tokio::test]
async fn a_session_the_upstream_ended_behind_the_proxys_back_is_renewed_not_a_404() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    // End the upstream session behind the proxy's back (as an upstream that
    // expires sessions would).
    let theirs = session_id(&rig.upstream.stats.last_headers().unwrap()).unwrap();
    let direct = McpClient::new(rig.upstream.url());
    let res = direct
        .send(Call::delete().header("mcp-session-id", &theirs))
        .await;
    assert!(res.status().is_success());
    let res = rig
        .client
        .send(Call::post(&tool_call(5, "echo", json!({"text":"x"}))).session(&sid))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let answer = messages(res).await;
    assert_eq!(answer[0]["result"]["content"][0]["text"], "x");
}

#[tokio::test]
async fn healthz_answers_200() {
    let rig = Rig::start().await;
    let health = McpClient::new(rig.client.url.replace("/mcp", "/healthz"));
    let res = health.send(Call::get()).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_foreign_host_header_is_403_on_a_loopback_listener() {
    let rig = Rig::start().await;
    let sid = rig.client.initialize(V_LATEST).await;
    let call = Call::post(&tool_call(5, "echo", json!({"text":"x"})))
        .session(&sid)
        .header("host", "evil.example");
    rejected_without_harm(&rig, &sid, call, StatusCode::FORBIDDEN).await;
}

/// A session that speaks both seed dialects, with the handles of one
/// finished call of it (1) and event ids that a resume of that call must
/// refuse or accept; and a plain session to run the undisturbed call on.
struct Resumes {
    sid: String,
    plain: String,
    token: String,
    handle: String,
    /// An event id of call 1.
    mine: String,
    /// An event id of call 2, another stream of the same session.
    other_stream: String,
    /// An event id of a call in another session.
    other_session: String,
}

impl Resumes {
    async fn open(rig: &Rig) -> Resumes {
        let both = json!({"resumableRequests": {}, "streams": {}});
        let (sid, _) = initialize_declaring(&rig.client, both.clone()).await;
        let (elsewhere, _) = initialize_declaring(&rig.client, both).await;
        let call = |sid: &str, id: u64| {
            let post = Call::post(&slow_call(id, 2, 5)).session(sid);
            async move { read_to_end(rig.client.send(post).await).await }
        };
        let first = call(&sid, 1).await;
        let entry = |got: &[(Option<String>, serde_json::Value)]| {
            got.iter()
                .rev()
                .find_map(|(id, _)| id.clone())
                .expect("an event id")
        };
        let other_stream = entry(&call(&sid, 2).await);
        let other_session = entry(&call(&elsewhere, 1).await);
        Resumes {
            plain: rig.client.initialize(V_LATEST).await,
            token: resume_token(&first),
            handle: stream_handle(&first),
            mine: entry(&first),
            sid,
            other_stream,
            other_session,
        }
    }

    /// `requests/resume` and `stream/resume` of call 1 carrying
    /// `last_event_id`.
    fn resumes(&self, last_event_id: &[u8]) -> [Call; 2] {
        let requests = request(
            json!(1),
            "requests/resume",
            json!({"resumeToken": self.token}),
        );
        let stream = request(json!(9), "stream/resume", json!({"streamId": self.handle}));
        [requests, stream].map(|body| {
            Call::post(&body)
                .session(&self.sid)
                .header_bytes("last-event-id", last_event_id)
        })
    }

    /// What a GET with an event id the proxy never issued gets.
    async fn bad_get(&self, rig: &Rig) -> serde_json::Value {
        let get = Call::get()
            .session(&self.sid)
            .header("last-event-id", "not-an-event-id");
        rejected_without_harm(rig, &self.plain, get, StatusCode::BAD_REQUEST).await
    }

    /// Both resumes with `last_event_id` get exactly what a bad GET gets,
    /// and disturb nothing else.
    async fn refused_like_a_bad_get(&self, rig: &Rig, last_event_id: &[u8]) {
        let bad_get = self.bad_get(rig).await;
        for resume in self.resumes(last_event_id) {
            let body =
                rejected_without_harm(rig, &self.plain, resume, StatusCode::BAD_REQUEST).await;
            assert_eq!(body, bad_get);
        }
    }
}

#[tokio::test]
async fn a_post_resume_with_a_last_event_id_of_another_stream_is_refused_like_a_bad_get() {
    let rig = Rig::start().await;
    let resumes = Resumes::open(&rig).await;
    resumes
        .refused_like_a_bad_get(&rig, resumes.other_stream.as_bytes())
        .await;
}

#[tokio::test]
async fn a_post_resume_with_a_last_event_id_of_another_session_is_refused_like_a_bad_get() {
    let rig = Rig::start().await;
    let resumes = Resumes::open(&rig).await;
    resumes
        .refused_like_a_bad_get(&rig, resumes.other_session.as_bytes())
        .await;
}

#[tokio::test]
async fn a_post_resume_with_a_tampered_last_event_id_is_refused_like_a_bad_get() {
    let rig = Rig::start().await;
    let resumes = Resumes::open(&rig).await;
    let mut tampered = resumes.mine.clone().into_bytes();
    let at = tampered.len() / 2;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    resumes.refused_like_a_bad_get(&rig, &tampered).await;
}

#[tokio::test]
async fn a_post_resume_with_a_garbage_last_event_id_is_refused_like_a_bad_get() {
    let rig = Rig::start().await;
    let resumes = Resumes::open(&rig).await;
    resumes
        .refused_like_a_bad_get(&rig, b"not-an-event-id")
        .await;
}

/// Bytes that are not text cannot be an id the proxy issued: refused, not
/// taken for no header (which would open a new stream on a GET, and
/// resume at-least-once on a POST).
#[tokio::test]
async fn a_last_event_id_that_is_not_text_is_refused_by_a_get_and_a_post_resume_alike() {
    let rig = Rig::start().await;
    let resumes = Resumes::open(&rig).await;
    let not_text = b"\xff\xfe";
    let get = Call::get()
        .session(&resumes.sid)
        .header_bytes("last-event-id", not_text);
    let body = rejected_without_harm(&rig, &resumes.plain, get, StatusCode::BAD_REQUEST).await;
    assert_eq!(body, resumes.bad_get(&rig).await);
    resumes.refused_like_a_bad_get(&rig, not_text).await;
}

/// The control for the cases above: the same resumes with an event id of
/// the very call they resume are served.
#[tokio::test]
async fn a_post_resume_with_a_last_event_id_of_its_own_stream_is_served() {
    let rig = Rig::start().await;
    let resumes = Resumes::open(&rig).await;
    for resume in resumes.resumes(resumes.mine.as_bytes()) {
        let res = rig.client.send(resume).await;
        assert_eq!(res.status(), StatusCode::OK);
        read_all(res).await;
    }
}
