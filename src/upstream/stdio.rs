//! stdio upstreams: one child process per proxy session, spoken to with
//! newline-delimited JSON-RPC, its stderr copied to the proxy's log.
//!
//! A child has one output pipe for everything, so this module owns the
//! demultiplexing that HTTP gives for free: a response goes to the stream of
//! its request, a progress notification to the stream whose request carried
//! its token, and anything else to the one request stream still open (the
//! messages a tool sends while it runs) or, when that is ambiguous, to the
//! session's standalone stream. Every message is logged before any client
//! sees it, exactly as for HTTP upstreams.
//!
//! Children never outlive their use: DELETE, session expiry and proxy
//! shutdown send SIGTERM, then SIGKILL after a grace period; and the kernel
//! sends SIGTERM should the proxy itself die (`PR_SET_PDEATHSIG`). A child
//! that exits ends every live stream of its session with a JSON-RPC error
//! entry and closes the session (404 on next use).

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{FutureExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child as Process, ChildStdin, Command};
use tokio_util::codec::{AnyDelimiterCodec, FramedRead};

use super::http::MAX_MESSAGE;
use super::ingest::{self, Batch, Recorded};
use super::UpstreamError;
use crate::config::{LimitsConfig, UpstreamConfig};
use crate::id::{IdDashMap, IdMap, SessionId, StreamId};
use crate::jsonrpc::{self, Kind, RequestId};
use crate::session::{Session, Sessions, Settle};
use crate::store::{StreamMeta, StreamStatus};
use crate::stream::Log;

/// A stdio MCP server program; spawns one child per session.
pub struct StdioUpstream {
    pub config: UpstreamConfig,
    limits: LimitsConfig,
    children: IdDashMap<SessionId, Arc<Child>>,
}

/// Where the child's messages go.
#[derive(Default)]
struct Routes {
    by_request: HashMap<RequestId, StreamId>,
    by_progress: HashMap<Arc<str>, StreamId>,
    open: IdMap<StreamId, OpenStream>,
}

struct OpenStream {
    meta: StreamMeta,
    pending: HashSet<RequestId>,
    progress: Vec<Arc<str>>,
}

/// One running child, serving one session.
pub struct Child {
    session: Arc<Session>,
    stdin: tokio::sync::Mutex<ChildStdin>,
    routes: Mutex<Routes>,
    /// The session's standalone stream: messages tied to no request.
    pub standalone: StreamMeta,
    /// Whether a client GET has attached to the standalone stream yet (the
    /// first one gets everything logged since the child started).
    standalone_attached: std::sync::atomic::AtomicBool,
}

impl StdioUpstream {
    pub fn new(config: &UpstreamConfig, limits: &LimitsConfig) -> Self {
        Self {
            config: config.clone(),
            limits: limits.clone(),
            children: IdDashMap::default(),
        }
    }

    /// The child serving `session`, if it is still running.
    pub fn child(&self, session: SessionId) -> Option<Arc<Child>> {
        self.children.get(&session).map(|c| c.clone())
    }

    /// Starts the child for a new session. `settle` is what the caller's
    /// dialects make of the child's `initialize` result (which of them the
    /// session keeps): the child only carries it to the session record.
    pub async fn spawn(
        self: &Arc<Self>,
        session: Arc<Session>,
        log: Arc<Log>,
        sessions: Arc<Sessions>,
        settle: Settle,
    ) -> Result<Arc<Child>, UpstreamError> {
        if self.children.len() >= self.config.max_children {
            return Err(UpstreamError::Busy(format!(
                "{} sessions are running (max_children)",
                self.children.len()
            )));
        }
        let argv = self.config.command.as_deref().unwrap_or_default();
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| UpstreamError::Connect("no command configured".into()))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(&self.config.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &self.config.cwd {
            command.current_dir(dir);
        }
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe and touches no memory of ours;
        // it only asks the kernel to SIGTERM the child if the proxy dies, so
        // even a kill -9 of the proxy leaves no orphan behind.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut process = command
            .spawn()
            .map_err(|e| UpstreamError::Connect(format!("cannot start {program:?}: {e}")))?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            return Err(UpstreamError::Connect("child has no pipes".into()));
        };
        let standalone = log
            .open(StreamMeta::standalone(session.id))
            .await
            .map_err(|e| UpstreamError::Broken(e.to_string()))?;
        let child = Arc::new(Child {
            session: session.clone(),
            stdin: tokio::sync::Mutex::new(stdin),
            routes: Mutex::new(Routes::default()),
            standalone,
            standalone_attached: false.into(),
        });
        self.children.insert(session.id, child.clone());
        tracing::info!(session = %session.id, pid = process.id(), "started stdio upstream");

        tokio::spawn(copy_stderr(session.id, stderr));
        let demux = tokio::spawn(demux(
            child.clone(),
            stdout,
            log.clone(),
            sessions.clone(),
            self.limits.clone(),
            settle,
        ));
        let grace = Duration::from_secs(self.config.kill_grace_secs);
        let upstream = self.clone();
        let watched = child.clone();
        tokio::spawn(async move {
            let ended_by_session = tokio::select! {
                status = process.wait() => {
                    tracing::info!(session = %session.id, ?status, "stdio upstream exited");
                    false
                }
                _ = session.ended.cancelled() => true,
            };
            if ended_by_session {
                terminate(&mut process, grace).await;
            }
            // Log every message the child wrote before it went away.
            let _ = demux.await;
            upstream.children.remove(&session.id);
            if !ended_by_session {
                watched.fail_open_streams(&log).await;
                if let Err(e) = sessions.close(session.id).await {
                    tracing::error!(session = %session.id, error = %e, "cannot close session");
                }
            }
        });
        Ok(child)
    }

    /// Stops every child (proxy shutdown).
    pub async fn shutdown(&self) {
        let grace = Duration::from_secs(self.config.kill_grace_secs);
        let stops: Vec<_> = self
            .children
            .iter()
            .map(|c| c.session.ended.clone())
            .collect();
        for stop in &stops {
            stop.cancel();
        }
        let deadline = tokio::time::Instant::now() + grace + Duration::from_secs(1);
        while !self.children.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// SIGTERM, then SIGKILL once the grace period is over.
async fn terminate(process: &mut Process, grace: Duration) {
    if let Some(pid) = process.id() {
        // SAFETY: plain syscall on a pid we own and have not reaped yet.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(grace, process.wait()).await.is_err() {
        tracing::warn!("stdio upstream ignored SIGTERM; killing it");
        let _ = process.kill().await;
    }
}

async fn copy_stderr(session: SessionId, stderr: tokio::process::ChildStderr) {
    let codec = AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), 64 * 1024);
    let mut lines = FramedRead::new(stderr, codec);
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => {
                let text = String::from_utf8_lossy(&line);
                tracing::info!(%session, "upstream stderr: {}", text.trim_end());
            }
            Err(_) => continue, // an over-long line: skip it, keep reading
        }
    }
}

/// Most lines routed and appended together.
const MAX_LINES: usize = 512;

/// Lines bound for one stream within a batch, and the stream they complete.
struct Group {
    stream: StreamId,
    lines: Vec<Bytes>,
    completes: Option<StreamMeta>,
}

/// Reads the child's stdout and logs each message into its stream. Lines
/// already read when a batch starts are routed and appended together, one
/// append per stream, so a chatty child costs a flush per batch rather than
/// per line.
async fn demux(
    child: Arc<Child>,
    stdout: tokio::process::ChildStdout,
    log: Arc<Log>,
    sessions: Arc<Sessions>,
    limits: LimitsConfig,
    settle: Settle,
) {
    let codec = AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), MAX_MESSAGE);
    let mut lines = FramedRead::new(stdout, codec);
    while let Some(first) = lines.next().await {
        let mut read = vec![first];
        while read.len() < MAX_LINES {
            match lines.next().now_or_never() {
                Some(Some(line)) => read.push(line),
                _ => break,
            }
        }
        let mut groups: Vec<Group> = Vec::new();
        let mut also_completed: Vec<StreamMeta> = Vec::new();
        for line in read {
            let line = match line {
                Ok(line) => trim(line),
                Err(e) => {
                    tracing::warn!(session = %child.session.id, error = %e, "unreadable line from stdio upstream skipped");
                    continue;
                }
            };
            if line.is_empty() {
                continue;
            }
            let Ok(body) = jsonrpc::parse_body(&line) else {
                tracing::warn!(session = %child.session.id, "stdio upstream wrote a line that is not JSON-RPC; ignored");
                continue;
            };
            let (stream, completed) = child.route(&line, &body);
            if completed
                .as_ref()
                .is_some_and(|d| d.method.as_deref() == Some("initialize"))
            {
                sessions
                    .learn_initialize(&child.session, &line, settle)
                    .await;
            }
            let at = match groups.iter().position(|g| g.stream == stream) {
                Some(at) => at,
                None => {
                    groups.push(Group {
                        stream,
                        lines: Vec::new(),
                        completes: None,
                    });
                    groups.len() - 1
                }
            };
            groups[at].lines.push(line);
            match completed {
                Some(done) if done.id == stream => groups[at].completes = Some(done),
                Some(other) => also_completed.push(other),
                None => {}
            }
        }
        for group in groups {
            let meta = match &group.completes {
                Some(done) => done.clone(),
                None => child.meta_of(group.stream),
            };
            let complete = group.completes.is_some();
            let recorded = ingest::record(
                &log,
                &limits,
                &child.session,
                &meta,
                Batch::new(group.lines, complete),
            )
            .await;
            if let Recorded::Ended(why) = recorded {
                child.abandon(&meta, why).await;
            } else if let Some(done) = group.completes {
                child.session.release(&done);
            }
        }
        // A batch answer can complete a stream other than the one it was
        // logged to (responses to requests of two POSTs in one line).
        for done in also_completed {
            if let Err(e) = log.finish(done.id, StreamStatus::Completed).await {
                tracing::error!(stream = %done.id, error = %e, "cannot finish stream");
            }
            child.session.release(&done);
        }
    }
}

fn trim(line: Bytes) -> Bytes {
    let end = line
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    line.slice(..end)
}

impl Child {
    /// Registers a request stream before its request is written, so that no
    /// answer can arrive unrouted.
    pub fn expect(&self, stream: &StreamMeta, progress: Vec<Arc<str>>) {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        for id in &stream.origin_ids {
            routes.by_request.insert(id.clone(), stream.id);
        }
        for token in &progress {
            routes.by_progress.insert(token.clone(), stream.id);
        }
        routes.open.insert(
            stream.id,
            OpenStream {
                meta: stream.clone(),
                pending: stream.origin_ids.iter().cloned().collect(),
                progress,
            },
        );
    }

    /// Writes one client message (or batch) as one line.
    pub async fn write(&self, message: &[u8]) -> Result<(), UpstreamError> {
        // Line breaks in valid JSON can only be whitespace between tokens
        // (inside strings they must be escaped), so blanking them keeps the
        // message intact without re-serializing it.
        let mut line = BytesMut::with_capacity(message.len() + 1);
        line.extend(
            message
                .iter()
                .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
        );
        line.extend_from_slice(b"\n");
        let mut stdin = self.stdin.lock().await;
        stdin
            .write_all(&line)
            .await
            .map_err(|e| UpstreamError::Broken(format!("stdio upstream stdin: {e}")))?;
        stdin
            .flush()
            .await
            .map_err(|e| UpstreamError::Broken(format!("stdio upstream stdin: {e}")))
    }

    /// Stops routing to a stream whose request the client cancelled: the
    /// child owes it no answer now.
    pub fn forget(&self, stream: StreamId) {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = routes.open.remove(&stream) {
            for id in &open.meta.origin_ids {
                routes.by_request.remove(id);
            }
            for token in &open.progress {
                routes.by_progress.remove(token);
            }
        }
    }

    /// The metadata of a stream the child writes to.
    fn meta_of(&self, stream: StreamId) -> StreamMeta {
        let routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        match routes.open.get(&stream) {
            Some(open) => open.meta.clone(),
            None => self.standalone.clone(),
        }
    }

    /// Stops a request the proxy gave up on (abandoned, overflowed): no more
    /// routing to its stream, and the child is told to stop working on it.
    pub async fn abandon(&self, stream: &StreamMeta, why: &str) {
        self.forget(stream.id);
        self.session.release(stream);
        for id in &stream.origin_ids {
            if let Err(e) = self.write(&jsonrpc::cancellation(id, why)).await {
                tracing::info!(stream = %stream.id, error = %e, "cannot cancel a stdio request");
            }
        }
    }

    /// Whether this is the first client GET on the standalone stream.
    pub fn first_standalone_attach(&self) -> bool {
        !self
            .standalone_attached
            .swap(true, std::sync::atomic::Ordering::SeqCst)
    }

    /// Picks the stream for one message of the child; returns the stream
    /// and, when the message answers the last pending request of a stream,
    /// that stream (to finish after the append).
    fn route(&self, line: &[u8], body: &jsonrpc::Body) -> (StreamId, Option<StreamMeta>) {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let responses: Vec<RequestId> = body
            .envelopes()
            .iter()
            .filter(|e| e.kind == Kind::Response)
            .filter_map(|e| e.id.clone())
            .collect();
        if !responses.is_empty() {
            let mut target = None;
            let mut completed = None;
            for id in responses {
                let Some(stream) = routes.by_request.remove(&id) else {
                    continue;
                };
                target.get_or_insert(stream);
                let done = routes.open.get_mut(&stream).is_some_and(|open| {
                    open.pending.remove(&id);
                    open.pending.is_empty()
                });
                if done {
                    if let Some(open) = routes.open.remove(&stream) {
                        for token in &open.progress {
                            routes.by_progress.remove(token);
                        }
                        completed = Some(open.meta);
                    }
                }
            }
            // A response to nothing we forwarded (late, or after a
            // cancellation) belongs to no request stream.
            return (target.unwrap_or(self.standalone.id), completed);
        }
        let progress = body
            .envelopes()
            .iter()
            .any(|e| e.is_method("notifications/progress"));
        if progress {
            // Progress goes where its token says, or nowhere: a late one must
            // not land on whichever request happens to be running (the log's
            // intake drops what no live request claims).
            let stream = jsonrpc::progress_token(line)
                .and_then(|token| routes.by_progress.get(token.as_str()).copied())
                .unwrap_or(self.standalone.id);
            return (stream, None);
        }
        // Requests and notifications of the child: with exactly one request
        // running, they are what that request's tool is doing.
        match routes.open.len() {
            1 => (
                routes
                    .open
                    .keys()
                    .next()
                    .copied()
                    .unwrap_or(self.standalone.id),
                None,
            ),
            _ => (self.standalone.id, None),
        }
    }

    /// Ends every stream still open when the child went away.
    async fn fail_open_streams(&self, log: &Log) {
        let open: Vec<OpenStream> = {
            let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
            routes.by_request.clear();
            routes.by_progress.clear();
            routes.open.drain().map(|(_, o)| o).collect()
        };
        for stream in open {
            let failed = log
                .fail(
                    &stream.meta,
                    &stream.pending,
                    "the stdio upstream exited before responding",
                )
                .await;
            if let Err(e) = failed {
                tracing::error!(stream = %stream.meta.id, error = %e, "cannot finish stream");
            }
            self.session.release(&stream.meta);
        }
        if let Err(e) = log
            .finish(self.standalone.id, StreamStatus::Completed)
            .await
        {
            tracing::error!(stream = %self.standalone.id, error = %e, "cannot finish stream");
        }
    }
}
