//! The demo MCP server over stdio: the same session, methods and tools as the
//! HTTP [`DemoUpstream`](super::upstream::DemoUpstream), spoken as
//! newline-delimited JSON-RPC on a reader/writer pair, the way stdio MCP
//! servers are launched by their clients. One process is one session. The
//! reader loop parses one message per line and starts every request as its
//! own task (so a slow call never holds up a ping or the answer to an `ask`);
//! every outgoing message goes through a single writer task, which writes it
//! as one line (serde_json never emits a raw newline) so that lines never
//! interleave. Nothing but MCP messages is written to the output; diagnostics
//! go to `tracing`, which the binary sends to stderr. End of input ends the
//! session: running calls are cancelled, queued output is flushed, and
//! [`serve`] returns.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio::time::Instant;

use super::session::{
    is_notification, is_request, is_response, on_notification, on_response, Call, Session, Sink,
};
use super::stats::DemoStats;
use super::upstream::negotiate;

/// Longest accepted line, as the HTTP mode's body limit.
const MAX_LINE: usize = 4 << 20;
/// Messages waiting for the writer before senders wait.
const OUT_QUEUE: usize = 64;
/// After end of input, how long cancelled calls and the writer get to finish
/// before they are dropped (a client that stopped reading must not keep the
/// process alive).
const WIND_DOWN: Duration = Duration::from_secs(2);

/// Serves one MCP session on `input`/`output` until `input` reaches end of
/// file (then returns `Ok` once running calls are cancelled and queued output
/// is written, or dropped after a short grace period) or writing fails (then
/// returns that error, e.g. a broken pipe when the client went away).
///
/// A read error ends the session like end of file does, and is returned.
///
/// With `tokio::io::stdin()` as `input`, a return because of a write error
/// leaves a blocking read on stdin behind, which dropping the runtime waits
/// for; the caller should then exit without waiting (for instance
/// `Runtime::shutdown_background` or `std::process::exit`).
pub async fn serve<R, W>(input: R, output: W, stats: Arc<DemoStats>) -> io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, queue) = mpsc::channel(OUT_QUEUE);
    let mut writer = tokio::spawn(write_lines(output, queue));
    let mut conn = Connection {
        stats,
        out,
        session: None,
        calls: JoinSet::new(),
    };
    let mut input = BufReader::new(input);
    let mut line = Vec::new();
    let read_error = loop {
        line.clear();
        let read = tokio::select! {
            read = read_line(&mut input, &mut line, MAX_LINE) => read,
            // The writer only stops by itself when the output broke.
            written = &mut writer => {
                // The calls see the closed queue and stop by themselves.
                conn.stop_calls(Instant::now() + WIND_DOWN).await;
                return match flatten(written) {
                    Ok(()) => Err(io::Error::other("stdio writer stopped")),
                    Err(e) => Err(e),
                };
            }
        };
        match read {
            Ok(Line::Complete) => conn.on_line(&line).await,
            Ok(Line::TooLong) => {
                let message = format!("Parse error: line longer than {MAX_LINE} bytes");
                conn.send(error(Value::Null, -32700, &message)).await;
            }
            Ok(Line::Eof) => break None,
            Err(e) => break Some(e),
        }
        conn.reap();
    };
    let written = conn.wind_down(writer).await;
    match read_error {
        Some(e) => Err(e),
        None => written,
    }
}

/// The state of one stdio session, owned by the reader loop.
struct Connection {
    stats: Arc<DemoStats>,
    /// The writer's queue; every call holds a clone in its [`Sink::Stdio`].
    out: mpsc::Sender<Value>,
    /// Set by `initialize`.
    session: Option<Arc<Session>>,
    calls: JoinSet<()>,
}

impl Connection {
    /// Queues a message; a failure means the writer is gone, which the reader
    /// loop notices on its own.
    async fn send(&self, message: Value) {
        let _ = self.out.send(message).await;
    }

    async fn on_line(&mut self, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let Ok(body) = serde_json::from_slice::<Value>(line) else {
            tracing::debug!(len = line.len(), "demo stdio: unparsable line");
            return self.send(error(Value::Null, -32700, "Parse error")).await;
        };
        let (batch, messages) = match body {
            Value::Array(items) => (true, items),
            other => (false, vec![other]),
        };
        let valid = |m: &Value| is_request(m) || is_notification(m) || is_response(m);
        if messages.is_empty() || !messages.iter().all(valid) {
            return self
                .send(error(Value::Null, -32600, "Invalid Request"))
                .await;
        }
        for message in &messages {
            match &self.session {
                Some(session) if is_notification(message) => on_notification(session, message),
                Some(session) if is_response(message) => on_response(session, message),
                _ => {}
            }
        }
        let requests: Vec<Value> = messages.into_iter().filter(is_request).collect();
        if requests.is_empty() {
            return;
        }
        if requests.iter().any(|m| m["method"] == "initialize") {
            if batch {
                let message = "Invalid Request: initialize must not be part of a batch";
                return self.send(error(Value::Null, -32600, message)).await;
            }
            return self.initialize(&requests[0]).await;
        }
        let Some(session) = self.session.clone() else {
            return self.before_initialize(requests, batch).await;
        };
        let start = |request: &Value| {
            let sink = Sink::Stdio(self.out.clone());
            Call::start(self.stats.clone(), Some(session.clone()), sink, request)
        };
        if batch {
            // One array answers the batch, once every request is done.
            let calls: Vec<(Call, Value)> = requests.into_iter().map(|r| (start(&r), r)).collect();
            let out = self.out.clone();
            self.calls.spawn(async move {
                let answers = calls.iter().map(|(call, request)| call.answer(request));
                let answers: Vec<Value> = futures_util::future::join_all(answers)
                    .await
                    .into_iter()
                    .flatten()
                    .collect();
                // Every request cancelled: nothing to answer.
                if !answers.is_empty() {
                    let _ = out.send(Value::Array(answers)).await;
                }
            });
        } else {
            for request in requests {
                let call = start(&request);
                self.calls.spawn(async move {
                    if let Some(answer) = call.answer(&request).await {
                        call.deliver(&answer).await;
                    }
                });
            }
        }
    }

    /// Opens the session; a second `initialize` is refused.
    async fn initialize(&mut self, request: &Value) {
        if self.session.is_some() {
            let message = "Invalid Request: Server already initialized";
            return self
                .send(error(request["id"].clone(), -32600, message))
                .await;
        }
        let session = Arc::new(Session::new(
            "stdio".to_owned(),
            negotiate(request).to_owned(),
            None,
        ));
        DemoStats::bump(&self.stats.sessions_created);
        self.session = Some(session.clone());
        let call = Call::start(
            self.stats.clone(),
            Some(session),
            Sink::Stdio(self.out.clone()),
            request,
        );
        if let Some(answer) = call.answer(request).await {
            call.deliver(&answer).await;
        }
    }

    /// Before `initialize` only `ping` is answered (as the lifecycle allows).
    async fn before_initialize(&self, requests: Vec<Value>, batch: bool) {
        let answers: Vec<Value> = requests
            .into_iter()
            .map(|request| {
                let id = request["id"].clone();
                if request["method"] == "ping" {
                    json!({"jsonrpc": "2.0", "id": id, "result": {}})
                } else {
                    error(id, -32600, "Invalid Request: Server not initialized")
                }
            })
            .collect();
        if batch {
            self.send(Value::Array(answers)).await;
        } else {
            for answer in answers {
                self.send(answer).await;
            }
        }
    }

    /// Forgets finished calls (logging the ones that panicked).
    fn reap(&mut self) {
        while let Some(joined) = self.calls.try_join_next() {
            log_panic(joined);
        }
    }

    /// Ends the session: cancels its running calls (as `notifications/cancelled`
    /// would) and waits for them until `deadline`, then drops the rest.
    async fn stop_calls(&mut self, deadline: Instant) {
        if let Some(session) = self.session.take() {
            for cancel in session.lock().in_flight.values() {
                cancel.send_replace(true);
            }
            DemoStats::bump(&self.stats.sessions_deleted);
        }
        let drained = tokio::time::timeout_at(deadline, async {
            while let Some(joined) = self.calls.join_next().await {
                log_panic(joined);
            }
        })
        .await;
        if drained.is_err() {
            tracing::debug!("demo stdio: calls still running at the end, dropped");
            self.calls.shutdown().await;
        }
    }

    /// End of input: cancels the running calls, lets them and the writer
    /// finish within [`WIND_DOWN`], and returns the writer's outcome.
    async fn wind_down(mut self, mut writer: JoinHandle<io::Result<()>>) -> io::Result<()> {
        let deadline = Instant::now() + WIND_DOWN;
        self.stop_calls(deadline).await;
        // The last sender: the writer sees the end of its queue, flushes and
        // shuts the output down.
        drop(self.out);
        match tokio::time::timeout_at(deadline, &mut writer).await {
            Ok(written) => flatten(written),
            Err(_) => {
                tracing::debug!("demo stdio: output not drained at end of input, dropped");
                writer.abort();
                Ok(())
            }
        }
    }
}

fn log_panic(joined: Result<(), JoinError>) {
    if let Err(e) = joined {
        if e.is_panic() {
            tracing::error!(error = %e, "demo stdio call panicked");
        }
    }
}

fn flatten(joined: Result<io::Result<()>, JoinError>) -> io::Result<()> {
    joined.unwrap_or_else(|e| Err(io::Error::other(e)))
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The single writer: one message per line, in queue order, flushed whenever
/// the queue runs empty. Ends when every sender is gone (after shutting the
/// output down) or on the first write error.
async fn write_lines<W>(output: W, mut queue: mpsc::Receiver<Value>) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut output = tokio::io::BufWriter::new(output);
    while let Some(message) = queue.recv().await {
        write_line(&mut output, &message).await?;
        while let Ok(message) = queue.try_recv() {
            write_line(&mut output, &message).await?;
        }
        output.flush().await?;
    }
    output.shutdown().await
}

async fn write_line<W>(output: &mut W, message: &Value) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    // Compact JSON escapes newlines inside strings, so this is one line.
    let mut line = match serde_json::to_string(message) {
        Ok(line) => line,
        Err(e) => {
            tracing::error!(error = %e, "demo stdio: unserializable message dropped");
            return Ok(());
        }
    };
    line.push('\n');
    output.write_all(line.as_bytes()).await
}

/// What [`read_line`] found.
#[derive(Debug, PartialEq)]
enum Line {
    /// A line (without its `\n`) is in the buffer; a last line without a
    /// newline counts too.
    Complete,
    /// A line longer than the limit was skipped.
    TooLong,
    Eof,
}

/// Reads one line into `line` (which must be empty), never buffering more
/// than `max` bytes of it.
async fn read_line<R>(input: &mut R, line: &mut Vec<u8>, max: usize) -> io::Result<Line>
where
    R: AsyncBufRead + Unpin,
{
    let mut too_long = false;
    loop {
        let chunk = input.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::Eof,
                (false, false) => Line::Complete,
            });
        }
        let (part, used, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (&chunk[..i], i + 1, true),
            None => (chunk, chunk.len(), false),
        };
        if !too_long {
            if line.len() + part.len() > max {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(part);
            }
        }
        input.consume(used);
        if done {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Complete
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<(Line, Vec<u8>)> {
        let mut input = BufReader::with_capacity(4, input);
        let mut out = Vec::new();
        loop {
            let mut line = Vec::new();
            let read = read_line(&mut input, &mut line, max).await.unwrap();
            if read == Line::Eof {
                return out;
            }
            out.push((read, line));
        }
    }

    #[tokio::test]
    async fn read_line_splits_skips_overlong_lines_and_keeps_a_last_unterminated_one() {
        let got = lines(b"ab\n\n0123456789\nxyz", 5).await;
        assert_eq!(
            got,
            vec![
                (Line::Complete, b"ab".to_vec()),
                (Line::Complete, vec![]),
                (Line::TooLong, vec![]),
                (Line::Complete, b"xyz".to_vec()),
            ]
        );
    }
}
