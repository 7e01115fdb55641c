//! One `tools/call` of a client that declared tasks. The call goes upstream
//! at once; what the client gets depends on when it ends:
//!
//! - within `task_after_ms`: the upstream's own answer, unchanged (status,
//!   headers, the messages of its body) — a fast call costs no write;
//! - later: a task. Its record and first leg are durable before the
//!   `CreateTaskResult` leaves, and from then on the upstream call runs
//!   detached from the client, to its final answer, which is logged as the
//!   leg's one entry (progress has nobody to go to: modern clients poll).
//!
//! Closing the response before the answer is cancellation in this revision,
//! and stays so: before the task exists, the upstream call is dropped; after
//! it exists but before its answer was handed to the connection, the task is
//! cancelled — no task is left that nobody can name.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::{HeaderMap, Method, Response};
use hyper::body::Incoming;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{check_header, Modern, Tasks};
use crate::id::{SessionId, StreamId, TaskId};
use crate::jsonrpc::{self, RequestId};
use crate::metrics::TaskEnd;
use crate::proxy::{Rejection, Route};
use crate::reply::{self, Body, BoxError};
use crate::store::{now_ms, Outcome, StoreError, StreamKind, StreamMeta, StreamStatus, Watermark};
use crate::stream::Log;
use crate::task::modern as wire;
use crate::task::{self, Answer, TaskRecord};
use crate::token::Keyring;
use crate::upstream::http::{carries_messages, within, HttpUpstream, Messages, UpstreamEvent};
use crate::upstream::replicas::Binding;
use crate::upstream::UpstreamError;

/// Why a task failed when its upstream stream ended without the answer.
const ENDED_EARLY: &str = "the upstream ended the stream before answering";

/// A declaring client's `tools/call`: answered by the upstream if it is
/// quick, else with a task. `None` for a call that passes through.
pub(super) async fn answer(
    route: &Route,
    upstream: &Arc<HttpUpstream>,
    request: &Modern<'_>,
) -> Result<Option<Response<Body>>, Rejection> {
    let name = crate::jsonrpc::tool_name(&request.body)
        .map(std::borrow::Cow::into_owned)
        .unwrap_or_default();
    check_header(request, &crate::upstream::headers::MCP_NAME, &name)?;
    let config = &upstream.config.tasks;
    if !wire::declared(&request.body) {
        if config.required_tools.contains(&name) {
            return Err(Rejection::tasks_not_declared(Some(request.id.clone())));
        }
        return Ok(None);
    }
    let principal = route.shared.caller(request.parts).await?;
    admit(route, &principal, &request.id)?;
    // Counted from now, not from when it becomes a task: a burst of calls
    // must not pass the cap while none of them is a task yet.
    let counted = Counted::new(&route.tasks, &principal);
    let mut headers = request.parts.headers.clone();
    let trace = crate::access::exchange(&mut headers, "POST");
    let call = Call {
        log: route.shared.log.clone(),
        keyring: route.shared.keyring.clone(),
        upstream: upstream.clone(),
        tasks: route.tasks.clone(),
        route: route.path.clone(),
        principal,
        headers,
        trace,
        id: request.id.clone(),
        params: raw_params(&request.body).unwrap_or_default(),
    };
    let (decide, decided) = oneshot::channel();
    tokio::spawn(call.run(request.body.clone(), decide, counted));
    match decided.await {
        Ok(Decision::Plain(res)) => Ok(Some(res)),
        Ok(Decision::Task(body, handed)) => {
            let mut res = Response::new(Handing::body(body, handed));
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Ok(Some(res))
        }
        Ok(Decision::Refused(rejection)) => Err(rejection),
        Err(_) => Err(Rejection::from(StoreError::Backend(
            "the task runner stopped".into(),
        ))),
    }
}

/// The per-principal cap (tasks count with the principal's streams) and the
/// log's disk quota, as for any new request.
fn admit(route: &Route, principal: &str, id: &RequestId) -> Result<(), Rejection> {
    let limits = &route.shared.config.limits;
    let streams = route.shared.sessions.by_principal.of(principal);
    if streams + route.tasks.running(principal) >= limits.streams_per_principal {
        return Err(Rejection::too_many_streams(
            Some(id.clone()),
            "this client",
            limits.streams_per_principal,
        ));
    }
    if let Some(quota) = limits.max_log_bytes {
        if route.shared.log.store().size_on_disk() >= quota {
            return Err(Rejection::log_full(Some(id.clone())));
        }
    }
    Ok(())
}

/// `params` of a request, as the raw JSON text it came as.
fn raw_params(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        params: Option<&'a serde_json::value::RawValue>,
    }
    let request: Request<'_> = serde_json::from_slice(body).ok()?;
    Some(request.params?.get().to_owned())
}

/// A call counted against its principal's cap while it runs.
struct Counted {
    tasks: Arc<Tasks>,
    principal: String,
}

impl Counted {
    fn new(tasks: &Arc<Tasks>, principal: &str) -> Self {
        tasks.started(principal);
        Self {
            tasks: tasks.clone(),
            principal: principal.to_owned(),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.tasks.ended(&self.principal);
    }
}

/// What the client is answered with.
enum Decision {
    /// The upstream answered first: its answer.
    Plain(Response<Body>),
    /// A task: the `CreateTaskResult`, and who learns whether it reached
    /// the connection.
    Task(Vec<u8>, oneshot::Sender<()>),
    Refused(Rejection),
}

/// Everything one call needs, owned: it outlives the client's request.
pub(super) struct Call {
    pub log: Arc<Log>,
    pub keyring: Keyring,
    pub upstream: Arc<HttpUpstream>,
    pub tasks: Arc<Tasks>,
    pub route: String,
    pub principal: String,
    /// The client's headers, sent upstream as they came (with tracing on,
    /// `traceparent` names `trace`).
    pub headers: HeaderMap,
    /// The span of the call's exchange upstream, ended with the call.
    pub trace: Option<Box<crate::traces::Exchange>>,
    /// The JSON-RPC id of the upstream request.
    pub id: RequestId,
    /// The call's `params`, raw: the template of the task's re-issues.
    pub params: String,
}

/// Where the upstream's answer stands.
enum Upstream {
    /// The head has not come yet.
    Head(BoxFuture<'static, Result<Response<Incoming>, UpstreamError>>),
    Body(Box<Messages>),
}

/// How a leg's upstream request ended.
enum Ending {
    /// Its answer (the JSON-RPC response, as the upstream sent it).
    Answered(Bytes),
    Failed(String),
    /// The task was cancelled (or its leg ended) elsewhere.
    Stopped,
}

impl Call {
    /// Sends the call, decides how the client is answered, and follows a
    /// task to its end.
    async fn run(self, request: Bytes, mut decide: oneshot::Sender<Decision>, _counted: Counted) {
        let after = Duration::from_millis(self.upstream.config.tasks.task_after_ms);
        let deadline = Instant::now() + after;
        let upstream = self.upstream.clone();
        let headers = self.headers.clone();
        let send: BoxFuture<'static, _> = Box::pin(async move {
            upstream
                .send(Method::POST, &headers, request, &Binding::NONE)
                .await
        });
        let pending = tokio::select! {
            // The client left before any answer: dropping the call is the
            // cancellation.
            _ = decide.closed() => return,
            pending = self.until(deadline, Upstream::Head(send)) => pending,
        };
        let pending = match pending {
            Early::Answer(decision) => {
                let _ = decide.send(decision);
                return;
            }
            Early::Running(pending) => pending,
        };
        let (record, leg) = match self.create().await {
            Ok(created) => created,
            Err(e) => {
                let _ = decide.send(Decision::Refused(e.into()));
                return;
            }
        };
        let (handed, handing) = oneshot::channel();
        let created = wire::create_result(&self.keyring, &record, &self.id);
        if decide.send(Decision::Task(created, handed)).is_err() {
            return self.cancelled_before_answer(&record, &leg).await;
        }
        let ending = self.follow(&leg, pending, Some(handing)).await;
        self.end(&leg, ending).await;
    }

    /// Follows a leg the proxy issued on its own (an MRTR re-issue).
    pub(super) async fn run_leg(self, leg: StreamMeta, request: Bytes) {
        let upstream = self.upstream.clone();
        let headers = self.headers.clone();
        let send: BoxFuture<'static, _> = Box::pin(async move {
            upstream
                .send(Method::POST, &headers, request, &Binding::NONE)
                .await
        });
        let _counted = Counted::new(&self.tasks, &self.principal);
        let ending = self.follow(&leg, Upstream::Head(send), None).await;
        self.end(&leg, ending).await;
    }

    /// Waits for the upstream until `deadline`: its whole answer if it comes
    /// in time, else where it stands.
    async fn until(&self, deadline: Instant, mut upstream: Upstream) -> Early {
        let mut head = None;
        let mut said = Vec::new();
        loop {
            upstream = match upstream {
                Upstream::Head(mut send) => {
                    let res = tokio::select! {
                        res = &mut send => res,
                        _ = tokio::time::sleep_until(deadline) => {
                            return Early::Running(Upstream::Head(send));
                        }
                    };
                    if let (Some(trace), Ok(res)) = (&self.trace, &res) {
                        trace.answered(res.status().as_u16());
                    }
                    match res {
                        Err(e) => return Early::Answer(Decision::Refused(e.into())),
                        Ok(res) if !carries_messages(&res) => {
                            return Early::Answer(Decision::Plain(pass_through(res)));
                        }
                        Ok(res) => {
                            head = Some((res.status(), res.headers().clone()));
                            Upstream::Body(Box::new(Messages::new(res)))
                        }
                    }
                }
                Upstream::Body(mut messages) => {
                    let next = tokio::select! {
                        next = messages.next_batch() => next,
                        _ = tokio::time::sleep_until(deadline) => {
                            return Early::Running(Upstream::Body(messages));
                        }
                    };
                    let ended = !matches!(next, Some(Ok(_)));
                    for event in next.and_then(Result::ok).unwrap_or_default() {
                        said.push(event);
                    }
                    let answered = said.iter().any(|e| self.answers(&e.message));
                    if answered || ended {
                        let sse = messages.is_sse();
                        let (status, headers) = head.take().unwrap_or_default();
                        return Early::Answer(Decision::Plain(replay(status, &headers, sse, said)));
                    }
                    Upstream::Body(messages)
                }
            };
        }
    }

    /// Whether `message` is the response to this call's request.
    fn answers(&self, message: &[u8]) -> bool {
        jsonrpc::response_ids(message).contains(&self.id)
    }

    /// The task's record and first leg, durable.
    async fn create(&self) -> Result<(TaskRecord, StreamMeta), StoreError> {
        let config = &self.upstream.config.tasks;
        let id = TaskId::random();
        let now = now_ms();
        let leg = leg_meta(id, self.id.clone(), now);
        let record = TaskRecord {
            id,
            route: self.route.clone(),
            principal: self.principal.clone(),
            session: None,
            created_ms: now,
            updated_ms: now,
            ttl_ms: config.ttl_ms,
            poll_interval_ms: config.poll_interval_ms,
            request: self.params.clone(),
            headers: routing_headers(&self.headers),
            legs: vec![leg.id],
            input: None,
            cancelled_ms: None,
            version: 1,
        };
        // The record first: retention leaves legs to their task, so a leg
        // must never exist without one (a crash between the two writes
        // leaves a record naming no stream, which reads as unknown and
        // expires like any task).
        self.log.store().put_task(&record).await?;
        let leg = match self.log.open(leg).await {
            Ok(leg) => leg,
            Err(e) => {
                let _ = self.log.store().delete_task(id).await;
                return Err(e);
            }
        };
        self.log.metrics().task_created();
        Ok((record, leg))
    }

    /// The client left before its `CreateTaskResult` reached the
    /// connection: the call is cancelled, like any call whose response
    /// stream closed.
    async fn cancelled_before_answer(&self, record: &TaskRecord, leg: &StreamMeta) {
        tracing::debug!(task = %record.id, "client left before its task was named; cancelled");
        if let Err(e) = task::cancel(&self.log, record.id).await {
            tracing::warn!(task = %record.id, error = %e, "cannot cancel a task nobody can name");
        }
        let _ = leg;
        self.log.metrics().task_ended(TaskEnd::Cancelled);
    }

    /// Follows a leg's upstream request to its end: the answer, a failure,
    /// or the leg ending elsewhere (a cancellation), which drops the
    /// upstream request — the modern way to cancel it.
    async fn follow(
        &self,
        leg: &StreamMeta,
        mut upstream: Upstream,
        mut handing: Option<oneshot::Receiver<()>>,
    ) -> Ending {
        let mut ended = self.log.store().subscribe(leg.id).await;
        let mut heard_at = Instant::now();
        loop {
            let patience = self.upstream.patience(leg.created_ms, heard_at.elapsed());
            let heard = tokio::select! {
                _ = finished(&mut ended) => return Ending::Stopped,
                handed = async { handing.as_mut()?.await.ok() }, if handing.is_some() => {
                    if handed.is_none() {
                        // The answer never reached the connection: nobody
                        // can name this task.
                        tracing::debug!(stream = %leg.id, "a task's answer was never handed over; cancelled");
                        let _ = self.cancel_leg(leg).await;
                        return Ending::Stopped;
                    }
                    handing = None;
                    continue;
                }
                heard = within(patience, listen(&mut upstream)) => heard,
            };
            heard_at = Instant::now();
            match heard {
                Err(why) => {
                    if let Upstream::Body(messages) = &upstream {
                        self.upstream.went_silent(messages.replica(), why);
                    }
                    return Ending::Failed(why.to_owned());
                }
                Ok(Heard::Head(Err(e))) => return Ending::Failed(e.to_string()),
                Ok(Heard::Head(Ok(res))) if carries_messages(&res) => {
                    upstream = Upstream::Body(Box::new(Messages::new(res)));
                }
                Ok(Heard::Head(Ok(res))) => return refused(res).await,
                Ok(Heard::Body(Some(Ok(said)))) => {
                    if let Some(answer) = said.into_iter().find(|e| self.answers(&e.message)) {
                        return Ending::Answered(answer.message);
                    }
                }
                Ok(Heard::Body(Some(Err(e)))) => return Ending::Failed(e.to_string()),
                Ok(Heard::Body(None)) => return Ending::Failed(ENDED_EARLY.into()),
            }
        }
    }

    async fn cancel_leg(&self, leg: &StreamMeta) -> Result<(), StoreError> {
        self.log.finish(leg.id, StreamStatus::Cancelled).await
    }

    /// Logs how a leg ended: its answer as the leg's one entry, or an error
    /// entry (never silence).
    async fn end(&self, leg: &StreamMeta, ending: Ending) {
        let logged = match &ending {
            Ending::Answered(message) => {
                let (outcome, end) = match Answer::of(message) {
                    Some(Answer::Error(..)) => (Outcome::Error, TaskEnd::Failed),
                    Some(Answer::InputRequired { .. }) => (Outcome::Result, TaskEnd::InputRequired),
                    _ => (Outcome::Result, TaskEnd::Completed),
                };
                self.log.metrics().task_ended(end);
                self.log
                    .append_final(
                        leg.id,
                        std::slice::from_ref(message),
                        StreamStatus::Completed,
                        Some(outcome),
                    )
                    .await
                    .map(|_| ())
            }
            Ending::Failed(why) => {
                self.log.metrics().task_ended(TaskEnd::Failed);
                self.log.fail(leg, &leg.origin_ids, why).await
            }
            Ending::Stopped => {
                self.log.metrics().task_ended(TaskEnd::Cancelled);
                Ok(())
            }
        };
        if let Err(e) = logged {
            tracing::error!(stream = %leg.id, error = %e, "cannot log how a task's upstream request ended");
        }
    }
}

/// Where the upstream stood at the deadline, or its whole early answer.
enum Early {
    Answer(Decision),
    Running(Upstream),
}

/// What one wait on the upstream gave.
enum Heard {
    Head(Result<Response<Incoming>, UpstreamError>),
    Body(Option<Result<Vec<UpstreamEvent>, UpstreamError>>),
}

/// Waits for the upstream's next word; cancel-safe (a head future and a
/// body read both keep their place when the wait is dropped).
async fn listen(upstream: &mut Upstream) -> Heard {
    match upstream {
        Upstream::Head(send) => Heard::Head(send.await),
        Upstream::Body(messages) => Heard::Body(messages.next_batch().await),
    }
}

/// An upstream refusal arriving after the task exists: its JSON-RPC error
/// when the body is one (a request state the upstream no longer accepts),
/// else its status and body as the reason.
async fn refused(res: Response<Incoming>) -> Ending {
    use http_body_util::BodyExt;
    let status = res.status();
    let body = http_body_util::Limited::new(res.into_body(), 64 * 1024)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    if let Some(Answer::Error(..)) = Answer::of(&body) {
        return Ending::Answered(body);
    }
    Ending::Failed(format!(
        "upstream answered HTTP {status}: {}",
        String::from_utf8_lossy(&body)
    ))
}

/// Resolves once the leg is no longer live (cancelled elsewhere).
async fn finished(ended: &mut watch::Receiver<Watermark>) {
    if ended.wait_for(|w| w.finished).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A leg of task `task`: one upstream request, logged as a stream with no
/// session (tasks have none).
pub(super) fn leg_meta(task: TaskId, id: RequestId, now: u64) -> StreamMeta {
    let mut meta = StreamMeta::new(
        StreamId::random_beside(task.as_bytes()),
        SessionId::TASKS,
        StreamKind::Request,
        vec![id],
        Some("tools/call".into()),
        now,
    );
    meta.task = Some(task);
    meta
}

/// The call's `Mcp-Name` and `Mcp-Param-*` headers, for its re-issues.
fn routing_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| name.as_str() == "mcp-name" || name.as_str().starts_with("mcp-param-"))
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
        .collect()
}

/// An upstream answer passed to the client as it came.
fn pass_through(res: Response<Incoming>) -> Response<Body> {
    let (head, body) = res.into_parts();
    let mut out = Response::new(reply::passthrough(body));
    *out.status_mut() = head.status;
    *out.headers_mut() = crate::upstream::headers::to_client(&head.headers, None);
    out
}

/// An upstream answer the proxy read whole before the deadline, written
/// out again with the upstream's status and headers: the same messages, in
/// the same framing.
fn replay(
    status: http::StatusCode,
    headers: &HeaderMap,
    sse: bool,
    said: Vec<UpstreamEvent>,
) -> Response<Body> {
    let mut body = BytesMut::new();
    for event in &said {
        if sse {
            crate::reply::sse::encode_event(&mut body, event.id.as_deref(), &event.message);
        } else {
            body.extend_from_slice(&event.message);
        }
    }
    let mut out = Response::new(reply::full(body.freeze()));
    *out.status_mut() = status;
    let mut headers = crate::upstream::headers::to_client(headers, None);
    headers.remove(http::header::CONTENT_LENGTH);
    *out.headers_mut() = headers;
    out
}

/// A `CreateTaskResult` body that tells its task whether it was handed to
/// the connection: dropped unpolled (the client went away first), the task
/// is cancelled.
struct Handing {
    body: Option<Bytes>,
    handed: Option<oneshot::Sender<()>>,
}

impl Handing {
    fn body(body: Vec<u8>, handed: oneshot::Sender<()>) -> Body {
        use http_body_util::BodyExt;
        Handing {
            body: Some(Bytes::from(body)),
            handed: Some(handed),
        }
        .boxed_unsync()
    }
}

impl http_body::Body for Handing {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let frame = self.body.take().map(|b| Ok(http_body::Frame::data(b)));
        if let Some(handed) = self.handed.take() {
            let _ = handed.send(());
        }
        Poll::Ready(frame)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let len = self.body.as_ref().map_or(0, |b| b.len() as u64);
        http_body::SizeHint::with_exact(len)
    }
}
