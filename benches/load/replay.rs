//! The `replay` scenario: one call logs a long SSE answer through the proxy,
//! then a `GET` with `Last-Event-ID` set to its first event id replays the
//! rest from the log — replay speed, against live delivery of the same call
//! directly and through the proxy, and against the client's own floor: the
//! same bytes served from memory.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use http::Method;
use http_body_util::Full;

use crate::client::{call, connect, open_session, read_reply, request, send, Target};
use crate::procs::{start_proxy, start_upstream};
use crate::Opts;

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let (_up, up_addr) = start_upstream(o.upstream).await?;
    let direct = Target::direct(up_addr);
    let (_proxy, proxied) = start_proxy(bin, up_addr, "batch").await?;
    let args = format!("{{\"delay_ms\":1,\"progress\":{}}}", o.replay_entries);
    let n = o.replay_entries as u64 + 1;
    let mut out = String::new();
    writeln!(
        out,
        "## replay: one call logging {} progress + result, then GET with Last-Event-ID = its first event id (sync=batch)",
        o.replay_entries
    )?;
    writeln!(
        out,
        "{:<34} {:>9} {:>14} {:>14} {:>12}",
        "run", "messages", "first msg ms", "last msg ms", "messages/s"
    )?;
    // Live delivery of the same call, direct and through the proxy, as the
    // yardstick for the replay.
    let mut first_id = None;
    let mut session_used = None;
    for t in [&direct, &proxied] {
        let mut conn = connect(t.addr).await?;
        let session = open_session(&mut conn, t).await?;
        let t0 = Instant::now();
        let reply = call(&mut conn, t, &session, 1, &args).await?;
        let total = t0.elapsed();
        if reply.messages != n {
            bail!("{}: {} messages, expected {n}", t.name, reply.messages);
        }
        row(
            &mut out,
            &format!("live call, {}", t.name),
            reply.messages,
            reply.first_message_at.map(|f| f - t0),
            total,
        )?;
        if t.pid.is_some() {
            first_id = reply.first_id;
            session_used = Some(session);
        }
    }
    let first_id = first_id.ok_or_else(|| anyhow!("the proxy sent no event id"))?;
    let session = session_used.expect("set with first_id");
    let logged = Logged {
        session,
        first_id,
        messages: n - 1,
    };
    for round in 1..=o.rounds {
        let (first, total) = logged.replay(&proxied).await?;
        row(
            &mut out,
            &format!("replay {round} (Last-Event-ID = 1st)"),
            logged.messages,
            first,
            total,
        )?;
    }
    // The client's own floor: the same replay's bytes served from memory,
    // read by the same client. A replay cannot be faster than this here.
    let body = logged.replay_bytes(&proxied).await?;
    let memory = serve_from_memory(body).await?;
    for round in 1..=o.rounds {
        let (first, total) = logged.replay(&memory).await?;
        row(
            &mut out,
            &format!("same bytes from memory {round}"),
            logged.messages,
            first,
            total,
        )?;
    }
    Ok(out)
}

/// A server in this process answering every request with `body` as one
/// SSE response: what the client needs to read a replay with no proxy
/// behind it.
async fn serve_from_memory(body: Bytes) -> Result<Target> {
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let body = body.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    let res = http::Response::builder()
                        .header(http::header::CONTENT_TYPE, "text/event-stream")
                        .body(Full::new(body.clone()));
                    async move { res }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Ok(Target::new("memory", addr, "/mcp", "echo", None))
}

/// A long answer in the proxy's log, ready to be replayed from its first
/// event id.
pub struct Logged {
    session: String,
    first_id: String,
    /// Messages after the first: what a replay must deliver.
    pub messages: u64,
}

impl Logged {
    /// Makes one call through `proxied` whose answer is `entries` progress
    /// notifications and the result.
    pub async fn call(proxied: &Target, entries: u32) -> Result<Logged> {
        let args = format!("{{\"delay_ms\":1,\"progress\":{entries}}}");
        let mut conn = connect(proxied.addr).await?;
        let session = open_session(&mut conn, proxied).await?;
        let reply = call(&mut conn, proxied, &session, 1, &args).await?;
        let first_id = reply
            .first_id
            .ok_or_else(|| anyhow!("the proxy sent no event id"))?;
        Ok(Logged {
            session,
            first_id,
            messages: u64::from(entries),
        })
    }

    /// Replays everything after the first event on a fresh connection: the
    /// time to the first and to the last message.
    pub async fn replay(&self, proxied: &Target) -> Result<(Option<Duration>, Duration)> {
        let mut conn = connect(proxied.addr).await?;
        let req = self.replay_request(proxied)?;
        let t0 = Instant::now();
        let reply = read_reply(send(&mut conn, req).await?).await?;
        let total = t0.elapsed();
        // Everything after the first entry: the rest of the progress and the
        // result.
        if reply.messages != self.messages || !reply.result {
            bail!(
                "replay: {} messages, expected {}",
                reply.messages,
                self.messages
            );
        }
        Ok((reply.first_message_at.map(|f| f - t0), total))
    }
}

impl Logged {
    /// The GET that replays everything after the first event.
    fn replay_request(&self, proxied: &Target) -> Result<http::Request<Full<Bytes>>> {
        request(
            proxied,
            Method::GET,
            Some(&self.session),
            Some(&self.first_id),
            Bytes::new(),
        )
    }

    /// The bytes of one replay, as the proxy sent them.
    async fn replay_bytes(&self, proxied: &Target) -> Result<Bytes> {
        use http_body_util::BodyExt;
        let mut conn = connect(proxied.addr).await?;
        let res = send(&mut conn, self.replay_request(proxied)?).await?;
        Ok(res.into_body().collect().await?.to_bytes())
    }
}

/// One line of the table: the time to the first and to the last message,
/// from the request on.
fn row(
    out: &mut String,
    name: &str,
    messages: u64,
    first: Option<Duration>,
    last: Duration,
) -> Result<()> {
    writeln!(
        out,
        "{:<34} {:>9} {:>14.3} {:>14.3} {:>12.0}",
        name,
        messages,
        first.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
        last.as_secs_f64() * 1e3,
        messages as f64 / last.as_secs_f64()
    )?;
    Ok(())
}
