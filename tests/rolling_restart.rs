//! Rolling restarts under load (issue 38): every instance is sent SIGTERM in
//! turn and started again while clients run long tool calls, and no request
//! fails: every call ends with its result, once, its progress neither lost
//! nor repeated.
//!
//! - Behind nginx, two instances on one Redis (`backend = "redis"`, one token
//!   key file): a call cut by an instance's shutdown (its SSE answer ends with
//!   a `retry:`) is resumed with `Last-Event-ID` through nginx on the other
//!   instance, which took it over (it is *moved*).
//! - One instance on the embedded log (the journal), clients straight at it:
//!   a cut call is resumed on the same instance once it is back (not moved).
//!
//! **How nginx learns of `/readyz`.** Open-source nginx has no active
//! health checks. Its passive ones (`max_fails`, `proxy_next_upstream`) see
//! an instance fail only once it refuses connections, after its drain:
//! until then nginx goes on sending it new calls, `drain_delay_secs` buys
//! nothing, and a call that comes in the last moments before the listener
//! closes is caught by the stop (a connection still in the accept queue is
//! reset with the POST in it, which nginx may not send elsewhere; a call the
//! proxy took meets the bug below). So the test plays the part that a real
//! deployment gives to its orchestrator or service discovery (Kubernetes'
//! readiness probe and endpoints in front of ingress-nginx, consul-template
//! in front of plain nginx): a *balancer* probes `/readyz` of every instance
//! every 200 ms, and when the set of ready instances changes (an instance
//! leaves after two failed probes, comes back after one good one) it
//! rewrites nginx's `upstream` block and reloads nginx (SIGHUP, what
//! `nginx -s reload` sends), then waits until new connections meet the new
//! configuration (a generation number nginx serves). `drain_delay_secs` is
//! the time it has for that; the test checks that every instance was out of
//! nginx's list before its drain ended, and it waits for a restarted
//! instance to be back in the list before it stops the next one (one
//! instance unavailable at a time). Passive checks stay as the second line
//! (`proxy_next_upstream error timeout`, nginx's default, spelled out: a
//! connection refused is tried on the next server, which is safe even for a
//! POST since nothing was sent); `non_idempotent` stays off, so nginx never
//! sends a POST again that an instance may have received.
//!
//! The rest of nginx's configuration is the README's scale-out example
//! (`proxy_buffering off`, HTTP/1.1 to the instances, a long
//! `proxy_read_timeout`, the client's `Host`).
//!
//! Clients open a connection for each request. A reload makes nginx's old
//! worker close its client connections as their answers end, so a client
//! that reused one could send a request into a closing connection: that is
//! nginx's own race between keep-alive and reloads, not the proxy's, and
//! the same holds when the proxy itself closes idle keep-alive connections
//! at shutdown (the embedded-log test, without nginx). A client honours the
//! `retry:` a drained answer carries before it resumes, as SSE clients do.
//!
//! "No request failed": every request through nginx got a complete answer
//! with status 200 or 202 (no connection error, no 5xx, no answer cut short).
//! Without a balancer (the embedded log), while the only instance is down a
//! client's request finds nobody (connection refused or reset before any
//! answer); it is sent again (a GET resume is always safe, and a POST
//! re-sent under its id is attached to the call, never run twice: README, "No
//! double execution"), and those knocks are counted, not failures; every
//! request the proxy answered must still be complete with 200 or 202.
//!
//! **The graceful stop waits for calls not yet resumable**: a call that
//! reaches the upstream in the last milliseconds before the shutdown,
//! before the upstream's first event, could not be picked up by the next
//! start (no upstream event id of it was logged) and ended with `-32603 the
//! proxy restarted while the upstream was answering this request; its
//! outcome is unknown`, although the upstream ran it to its result. Found
//! here; the stop now waits (within `shutdown_grace_secs`) for such calls,
//! and `a_call_that_arrived_just_before_a_graceful_stop_ends_with_its_result`
//! holds it to that.
//!
//! The nginx test needs nginx and `redis-server`; where one is not
//! installed it says so and passes, except in CI (`CI` set), where both
//! must be (.ci/run installs them). A short run of each test is on by
//! default (one rolling restart, about 10 s, the two side by side).
//! `MCP_ROLLING=1` runs the long one (5 rounds, longer calls, about 70 s);
//! `MCP_ROLLING_ROUNDS=n` sets the rounds. Run with `-- --nocapture` for
//! the timeline and the summary.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::process::{free_addr, ProxyProcess};
use common::redis_server::{Persistence, RedisServer, MISSING};
use common::{message, slow_call, Call, McpClient, LIMIT, V_LATEST};
use http_body_util::BodyExt;
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use mcp_resume_proxy::reply::sse::Decoder;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

/// Concurrent clients, each a session running calls back to back.
const CLIENTS: usize = 8;
/// No call may take longer than this end to end, interruptions included.
const CALL_LIMIT: Duration = Duration::from_secs(60);
/// How often the balancer asks each instance's `/readyz`.
const PROBE_EVERY: Duration = Duration::from_millis(200);
/// Consecutive failed probes that take an instance out of nginx's list.
const FAILURE_THRESHOLD: u32 = 2;
/// How long a client waits before it sends a request again that found no
/// proxy (or failed).
const KNOCK_EVERY: Duration = Duration::from_millis(100);
/// The reconnection delay when a drained answer names none.
const DEFAULT_RETRY_MS: u64 = 1_000;

/// How long and how hard a run is.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Each round restarts every instance once.
    rounds: usize,
    drain_delay_secs: u64,
    /// Time between two restarts (after the previous instance is back).
    settle: Duration,
    /// Steps of a call (inclusive range) and the pause between them: calls
    /// of 1.5 to 5 s (2 to 9 s in the long run), most longer than the drain,
    /// so that shutdowns cut them (a drain lets shorter ones end where they
    /// began).
    steps: (u64, u64),
    interval_ms: (u64, u64),
}

fn plan() -> Plan {
    let long = std::env::var("MCP_ROLLING").is_ok_and(|v| !v.is_empty() && v != "0");
    let rounds = std::env::var("MCP_ROLLING_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if long { 5 } else { 1 });
    if long {
        Plan {
            rounds,
            drain_delay_secs: 3,
            settle: Duration::from_millis(2_500),
            steps: (20, 60),
            interval_ms: (100, 150),
        }
    } else {
        Plan {
            rounds,
            drain_delay_secs: 2,
            settle: Duration::from_millis(1_500),
            steps: (15, 35),
            interval_ms: (100, 140),
        }
    }
}

impl Plan {
    /// Call `id` of client `client`: its steps and interval, varied but
    /// reproducible.
    fn call(&self, client: usize, id: u64) -> (u64, u64) {
        let spread = |(lo, hi): (u64, u64), n: u64| lo + n % (hi - lo + 1);
        let c = client as u64;
        (
            spread(self.steps, c * 7 + id * 5),
            spread(self.interval_ms, c * 13 + id * 11),
        )
    }
}

/// Whether `CI` is set: then every program the tests use must be installed.
fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// Where `nginx` is; `None` (the test passes, saying why) outside CI.
fn nginx_program() -> Option<PathBuf> {
    let found = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    assert!(
        found.is_some() || !in_ci(),
        "nginx is not installed (.ci/run installs it)"
    );
    if found.is_none() {
        println!("skipped: nginx is not installed (Debian package nginx)");
    }
    found
}

/// A private `redis-server`; `None` (the test passes, saying why) when it
/// is not installed, outside CI.
fn private_redis() -> Option<RedisServer> {
    match RedisServer::start(Persistence::None) {
        Ok(server) => Some(server),
        Err(why) if why == MISSING && !in_ci() => {
            println!("skipped: {why}");
            None
        }
        Err(why) => panic!("{why}"),
    }
}

// ------------------------------------------------------------------ nginx

/// nginx in the foreground (`daemon off`) on a free loopback port, with a
/// prefix, temp paths, logs and pid file of its own in a temp dir; stopped
/// when dropped.
struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    /// The configuration now asked for: each reload counts one up, and
    /// nginx serves it at `/_balancer`.
    generation: u64,
}

impl Nginx {
    async fn start(program: &Path, backends: &[SocketAddr]) -> Nginx {
        let dir = tempfile::Builder::new()
            .prefix("mcp-resume-proxy-nginx-")
            .tempdir()
            .expect("temp dir");
        let addr = free_addr();
        write_config(dir.path(), addr, 1, backends);
        let conf = dir.path().join("nginx.conf");
        let test = Command::new(program)
            .args(args(dir.path()))
            .arg("-t")
            .output()
            .expect("nginx -t runs");
        assert!(
            test.status.success(),
            "nginx -t refused the configuration:\n{}\n---- {}\n{}",
            String::from_utf8_lossy(&test.stderr),
            conf.display(),
            std::fs::read_to_string(&conf).unwrap_or_default()
        );
        let mut cmd = Command::new(program);
        cmd.args(args(dir.path()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("stderr.log")).expect("log file"),
            ));
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only prctl, async-signal-safe.
            // If this test process dies without dropping us, nginx's master
            // gets SIGTERM and takes its workers down with it.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        }
        let mut nginx = Nginx {
            child: cmd.spawn().expect("nginx starts"),
            dir,
            addr,
            generation: 1,
        };
        nginx.serving(1).await;
        nginx
    }

    /// The URL of the MCP endpoint through nginx.
    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Points nginx at `backends`: a new configuration, then a reload (what
    /// `nginx -s reload` does: SIGHUP to the master). Returns once new
    /// connections meet it.
    async fn reconfigure(&mut self, backends: &[SocketAddr]) {
        self.generation += 1;
        write_config(self.dir.path(), self.addr, self.generation, backends);
        let pid = i32::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0, "SIGHUP sent");
        self.serving(self.generation).await;
    }

    /// Waits until a new connection to nginx is served by `generation`.
    async fn serving(&mut self, generation: u64) {
        let probe = McpClient::unpooled(format!("http://{}/_balancer", self.addr));
        let want = format!("generation {generation}\n");
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("nginx exited ({status}): {}", self.error_log_tail());
            }
            let answer = tokio::time::timeout(Duration::from_secs(1), async {
                let res = probe.try_send(Call::get()).await.ok()?;
                let body = res.into_body().collect().await.ok()?.to_bytes();
                Some(body)
            })
            .await;
            if let Ok(Some(body)) = answer {
                if body == want.as_bytes() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nginx never served generation {generation}: {}",
                self.error_log_tail()
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    fn error_log_tail(&self) -> String {
        let mut text = String::new();
        for name in ["stderr.log", "error.log"] {
            let log = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            text.push_str(&format!("\n---- nginx {name} (last lines)\n{tail}"));
        }
        text
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return; // reaped already: its pid may be another process's now
        }
        // SIGTERM: the master stops its workers (old ones too) and exits.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child (not reaped yet).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx's command line: the prefix, configuration and logs in `dir`, in
/// the foreground.
fn args(dir: &Path) -> Vec<String> {
    vec![
        "-p".into(),
        format!("{}/", dir.display()),
        "-c".into(),
        dir.join("nginx.conf").display().to_string(),
        "-e".into(),
        dir.join("error.log").display().to_string(),
        "-g".into(),
        "daemon off;".into(),
    ]
}

/// Writes nginx's configuration of `generation`, with `backends` as the
/// upstream servers (written aside, then renamed in place). Around the
/// upstream list, the README's scale-out example.
fn write_config(dir: &Path, addr: SocketAddr, generation: u64, backends: &[SocketAddr]) {
    let d = dir.display();
    // As root the workers would run as nobody, who cannot enter the
    // 0700 temp dir.
    // SAFETY: geteuid has no preconditions.
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root root;\n"
    } else {
        ""
    };
    let servers: String = backends
        .iter()
        .map(|a| format!("        server {a} max_fails=1 fail_timeout=2s;\n"))
        .collect();
    let text = format!(
        "# generation {generation}: the ready instances, as the balancer saw them\n\
         {user}worker_processes 1;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log info;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
         \x20   log_format served '$msec $request_method $request_uri $status '\n\
         \x20                     'upstream=$upstream_addr upstream_status=$upstream_status '\n\
         \x20                     'last_event_id=$http_last_event_id';\n\
         \x20   access_log {d}/access.log served;\n\
         \x20   client_body_temp_path {d}/client_body;\n\
         \x20   proxy_temp_path {d}/proxy_temp;\n\
         \x20   fastcgi_temp_path {d}/fastcgi_temp;\n\
         \x20   uwsgi_temp_path {d}/uwsgi_temp;\n\
         \x20   scgi_temp_path {d}/scgi_temp;\n\
         \x20   upstream mcp_resume_proxy {{\n\
         {servers}\
         \x20   }}\n\
         \x20   server {{\n\
         \x20       listen {addr};\n\
         \x20       location = /_balancer {{ return 200 \"generation {generation}\\n\"; }}\n\
         \x20       location / {{\n\
         \x20           proxy_pass http://mcp_resume_proxy;\n\
         \x20           proxy_http_version 1.1;\n\
         \x20           proxy_set_header Connection \"\";\n\
         \x20           proxy_set_header Host $http_host;\n\
         \x20           proxy_set_header Forwarded 'proto=$scheme;host=\"$http_host\"';\n\
         \x20           proxy_buffering off;\n\
         \x20           proxy_read_timeout 1h;\n\
         \x20           proxy_next_upstream error timeout;\n\
         \x20           add_header X-Served-By $upstream_addr always;\n\
         \x20       }}\n\
         \x20   }}\n\
         }}\n",
    );
    let aside = dir.join("nginx.conf.next");
    std::fs::write(&aside, text).expect("nginx.conf written");
    std::fs::rename(&aside, dir.join("nginx.conf")).expect("nginx.conf in place");
}

// ------------------------------------------------------------------ the balancer

/// Which instances nginx sends new requests to, once it does.
#[derive(Clone, Debug)]
struct Membership {
    backends: Vec<SocketAddr>,
    generation: u64,
}

/// Probes `/readyz` of each instance and keeps nginx's upstream list to the
/// ready ones (see the module's doc).
struct Balancer {
    membership: watch::Receiver<Membership>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Nginx>,
}

impl Balancer {
    fn start(nginx: Nginx, instances: Vec<SocketAddr>, timeline: Timeline) -> Balancer {
        let (tx, membership) = watch::channel(Membership {
            backends: instances.clone(),
            generation: nginx.generation,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(balance(nginx, instances, tx, stop.clone(), timeline));
        Balancer {
            membership,
            stop,
            task,
        }
    }

    /// Waits (bounded by `within`) until nginx's list satisfies `check`.
    async fn until(
        &mut self,
        what: &str,
        within: Duration,
        check: impl Fn(&Membership) -> bool,
    ) -> Result<Membership, String> {
        let waited = tokio::time::timeout(within, async {
            self.membership
                .wait_for(|m| check(m))
                .await
                .map(|m| m.clone())
        })
        .await;
        match waited {
            Ok(Ok(m)) => Ok(m),
            Ok(Err(_)) => Err(format!("the balancer stopped before {what}")),
            Err(_) => Err(format!(
                "not within {within:?}: {what} (nginx's list: {:?})",
                self.membership.borrow().backends
            )),
        }
    }

    /// Stops probing; nginx goes with the returned value.
    async fn stop(self) -> Nginx {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("balancer task")
    }
}

async fn balance(
    mut nginx: Nginx,
    instances: Vec<SocketAddr>,
    tx: watch::Sender<Membership>,
    stop: Arc<AtomicBool>,
    timeline: Timeline,
) -> Nginx {
    let probes: Vec<McpClient> = instances
        .iter()
        .map(|a| McpClient::unpooled(format!("http://{a}/readyz")))
        .collect();
    let mut failures = vec![0u32; instances.len()];
    let mut listed = instances.clone();
    while !stop.load(Ordering::Relaxed) {
        for (i, probe) in probes.iter().enumerate() {
            let ready = tokio::time::timeout(Duration::from_secs(1), probe.try_send(Call::get()))
                .await
                .is_ok_and(|r| r.is_ok_and(|res| res.status() == http::StatusCode::OK));
            failures[i] = if ready { 0 } else { failures[i] + 1 };
        }
        let ready: Vec<SocketAddr> = instances
            .iter()
            .zip(&failures)
            .filter(|(addr, &failed)| {
                failed == 0 || (failed < FAILURE_THRESHOLD && listed.contains(addr))
            })
            .map(|(addr, _)| *addr)
            .collect();
        // nginx needs one server at least; with none ready, the last list
        // stays (it would fail either way).
        if ready != listed && !ready.is_empty() {
            nginx.reconfigure(&ready).await;
            listed = ready;
            timeline.note(format!(
                "balancer: nginx generation {} sends to {}",
                nginx.generation,
                timeline.names(&listed)
            ));
            tx.send_replace(Membership {
                backends: listed.clone(),
                generation: nginx.generation,
            });
        }
        sleep(PROBE_EVERY).await;
    }
    nginx
}

// ------------------------------------------------------------------ timeline

/// What happened when, for the summary and for failure messages.
#[derive(Clone)]
struct Timeline {
    start: Instant,
    lines: Arc<Mutex<Vec<String>>>,
    names: Arc<BTreeMap<SocketAddr, &'static str>>,
}

impl Timeline {
    fn new(names: &[(SocketAddr, &'static str)]) -> Self {
        Timeline {
            start: Instant::now(),
            lines: Arc::default(),
            names: Arc::new(names.iter().copied().collect()),
        }
    }

    fn ms(&self) -> u128 {
        self.start.elapsed().as_millis()
    }

    fn note(&self, line: String) {
        let line = format!("+{:>6} ms  {line}", self.ms());
        self.lines.lock().unwrap().push(line);
    }

    fn name(&self, addr: &str) -> String {
        let addr = addr.rsplit(", ").next().unwrap_or(addr);
        self.names
            .iter()
            .find(|(a, _)| a.to_string() == addr)
            .map_or_else(|| addr.to_owned(), |(_, n)| (*n).to_owned())
    }

    fn names(&self, addrs: &[SocketAddr]) -> String {
        let names: Vec<String> = addrs.iter().map(|a| self.name(&a.to_string())).collect();
        names.join(" and ")
    }

    fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

// ------------------------------------------------------------------ clients

/// One HTTP request of a client and how it went.
#[derive(Debug, Clone)]
struct Exchange {
    at_ms: u128,
    /// `POST` (the call), `GET` (a resume).
    method: &'static str,
    /// nginx's `X-Served-By` (which instance; two when nginx tried the
    /// next one), or "direct".
    served_by: String,
    status: Option<u16>,
    /// No answer: the connection failed before a response head.
    unanswered: Option<String>,
    /// The connection was refused: the request never left.
    refused: bool,
    /// The answer's body broke off (not a clean end).
    broke: Option<String>,
    /// A clean end of an SSE answer before the call's result: with the
    /// `retry:` it carried, if any.
    ended_early: Option<Option<u64>>,
    /// Messages it delivered.
    messages: usize,
}

impl Exchange {
    /// A complete answer with 200 or 202 (an SSE answer ended by a drain,
    /// with its `retry:`, is complete).
    fn answered_well(&self) -> bool {
        matches!(self.status, Some(200 | 202))
            && self.broke.is_none()
            && !matches!(self.ended_early, Some(None))
    }
}

#[derive(Debug)]
struct CallRecord {
    client: usize,
    id: u64,
    steps: u64,
    /// Every message with its event id, in the order they came.
    seen: Vec<(Option<String>, Value)>,
    result: Option<Value>,
    exchanges: Vec<Exchange>,
}

impl CallRecord {
    /// Problems with what the client got: anything but progress 1..=steps
    /// once each in order, then the result; an event id twice.
    fn delivery_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let token = format!("p{}", self.id);
        let mut progress = Vec::new();
        for (_, m) in &self.seen {
            if m["method"] == "notifications/progress" && m["params"]["progressToken"] == token {
                progress.push(m["params"]["progress"].as_u64().unwrap_or(0));
            } else if m["id"] != self.id {
                problems.push(format!("a message of something else: {m}"));
            }
        }
        if progress != (1..=self.steps).collect::<Vec<_>>() {
            problems.push(format!("progress {progress:?}, not 1..={}", self.steps));
        }
        match &self.result {
            None => problems.push("no final response".into()),
            Some(r) => {
                let want = format!("slow done after {} steps", self.steps);
                if r["result"]["content"][0]["text"] != want.as_str() {
                    problems.push(format!("not its result: {r}"));
                }
            }
        }
        let finals = self.seen.iter().filter(|(_, m)| m["id"] == self.id).count();
        if finals != 1 {
            problems.push(format!("{finals} final responses"));
        }
        let ids: Vec<&String> = self.seen.iter().filter_map(|(id, _)| id.as_ref()).collect();
        if ids.iter().collect::<HashSet<_>>().len() != ids.len() {
            problems.push("an event id delivered twice".into());
        }
        problems
    }

    /// Its SSE answers were cut short (by a drain) at least once.
    fn interrupted(&self) -> bool {
        self.exchanges.iter().any(|e| e.ended_early.is_some())
    }

    /// Instances that delivered messages of it.
    fn instances(&self, timeline: &Timeline) -> BTreeSet<String> {
        self.exchanges
            .iter()
            .filter(|e| e.messages > 0)
            .map(|e| timeline.name(&e.served_by))
            .collect()
    }

    fn trace(&self, timeline: &Timeline) -> String {
        let steps: Vec<String> = self
            .exchanges
            .iter()
            .map(|e| {
                let how = match (&e.status, &e.unanswered) {
                    (Some(s), _) => s.to_string(),
                    (None, Some(why)) if e.refused => format!("refused ({why})"),
                    (None, Some(why)) => format!("no answer ({why})"),
                    (None, None) => "?".into(),
                };
                let end = match (&e.broke, &e.ended_early) {
                    (Some(why), _) => format!(", body broke: {why}"),
                    (None, Some(Some(ms))) => format!(", ended, retry {ms} ms"),
                    (None, Some(None)) => ", ended without its result or a retry:".into(),
                    (None, None) => String::new(),
                };
                format!(
                    "+{}ms {} on {} -> {how} ({} messages{end})",
                    e.at_ms,
                    e.method,
                    timeline.name(&e.served_by),
                    e.messages
                )
            })
            .collect();
        format!(
            "client {} call {} ({} steps): {}",
            self.client,
            self.id,
            self.steps,
            steps.join("; ")
        )
    }
}

/// What a client does when a request found no proxy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Through nginx: every request must be answered.
    Nginx,
    /// Straight at the only instance: while it is down requests find
    /// nobody, and are sent again.
    Direct,
}

/// Runs one slow call to its final response: POST, and after an answer cut
/// short, GET with `Last-Event-ID` once the `retry:` it carried has passed
/// (or the POST again under the same id when no event id came yet).
async fn run_call(
    client: &McpClient,
    client_no: usize,
    sid: &str,
    id: u64,
    (steps, interval_ms): (u64, u64),
    timeline: &Timeline,
) -> CallRecord {
    let mut record = CallRecord {
        client: client_no,
        id,
        steps,
        seen: Vec::new(),
        result: None,
        exchanges: Vec::new(),
    };
    let deadline = Instant::now() + CALL_LIMIT;
    let mut last_id: Option<String> = None;
    while record.result.is_none() && Instant::now() < deadline {
        let (method, call) = match &last_id {
            None => (
                "POST",
                Call::post(&slow_call(id, steps, interval_ms)).session(sid),
            ),
            Some(last) => (
                "GET",
                Call::get().session(sid).header("last-event-id", last),
            ),
        };
        let mut exchange = Exchange {
            at_ms: timeline.ms(),
            method,
            served_by: "direct".into(),
            status: None,
            unanswered: None,
            refused: false,
            broke: None,
            ended_early: None,
            messages: 0,
        };
        let sent = tokio::time::timeout_at(deadline, client.try_send(call)).await;
        let res = match sent {
            Err(_) => break,
            Ok(Err(e)) => {
                exchange.refused = e.is_connect();
                exchange.unanswered = Some(mcp_resume_proxy::tls::outbound::error_chain(&e));
                record.exchanges.push(exchange);
                sleep(KNOCK_EVERY).await;
                continue;
            }
            Ok(Ok(res)) => res,
        };
        exchange.status = Some(res.status().as_u16());
        if let Some(by) = res.headers().get("x-served-by") {
            exchange.served_by = by.to_str().unwrap_or("?").to_owned();
        }
        if res.status() != http::StatusCode::OK {
            let body = tokio::time::timeout(LIMIT, res.into_body().collect()).await;
            let body = match body {
                Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                _ => "(no body)".into(),
            };
            exchange.broke = Some(format!(
                "body: {}",
                body.chars().take(200).collect::<String>()
            ));
            record.exchanges.push(exchange);
            sleep(KNOCK_EVERY).await;
            continue;
        }
        let mut body = res.into_body();
        let mut decoder = Decoder::new();
        let mut retry = None;
        let retry_ms = 'read: loop {
            while let Some(event) = decoder.next_event() {
                retry = event.retry.or(retry);
                if let Some(event_id) = &event.id {
                    last_id = Some(event_id.clone());
                }
                let Some(m) = message(&event) else { continue };
                exchange.messages += 1;
                let is_final =
                    m["id"] == id && (m.get("result").is_some() || m.get("error").is_some());
                record.seen.push((event.id, m.clone()));
                if is_final {
                    record.result = Some(m);
                    break 'read None;
                }
            }
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => break 'read None,
                Ok(None) => {
                    exchange.ended_early = Some(retry);
                    break 'read Some(retry.unwrap_or(DEFAULT_RETRY_MS));
                }
                Ok(Some(Err(e))) => {
                    exchange.broke = Some(mcp_resume_proxy::tls::outbound::error_chain(&e));
                    break 'read Some(KNOCK_EVERY.as_millis() as u64);
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        decoder.push(&data);
                    }
                }
            }
        };
        record.exchanges.push(exchange);
        if let Some(ms) = retry_ms {
            sleep(Duration::from_millis(ms)).await;
        }
    }
    record
}

/// One client: a session, then slow calls back to back until `stop`.
async fn client_loop(
    url: String,
    client_no: usize,
    plan: Plan,
    stop: Arc<AtomicBool>,
    timeline: Timeline,
) -> Vec<CallRecord> {
    let client = McpClient::unpooled(url);
    let sid = client.initialize(V_LATEST).await;
    let mut calls = Vec::new();
    let mut id = 0;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        let record = run_call(
            &client,
            client_no,
            &sid,
            id,
            plan.call(client_no, id),
            &timeline,
        )
        .await;
        let hung = record.result.is_none();
        calls.push(record);
        if hung {
            break;
        }
    }
    calls
}

fn start_clients(
    url: &str,
    plan: Plan,
    stop: &Arc<AtomicBool>,
    timeline: &Timeline,
) -> Vec<tokio::task::JoinHandle<Vec<CallRecord>>> {
    (0..CLIENTS)
        .map(|n| {
            tokio::spawn(client_loop(
                url.to_owned(),
                n,
                plan,
                stop.clone(),
                timeline.clone(),
            ))
        })
        .collect()
}

async fn join_clients(clients: Vec<tokio::task::JoinHandle<Vec<CallRecord>>>) -> Vec<CallRecord> {
    let mut calls = Vec::new();
    for client in clients {
        let joined = tokio::time::timeout(CALL_LIMIT + LIMIT, client).await;
        calls.extend(joined.expect("clients end").expect("client task"));
    }
    calls
}

// ------------------------------------------------------------------ instances

/// A proxy process whose address and data dir outlive it, started again
/// on both after each stop; each start logs to a file of its own.
struct Instance {
    name: &'static str,
    proxy: Option<ProxyProcess>,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    args: Vec<String>,
    logs: PathBuf,
    starts: usize,
}

impl Instance {
    async fn start(name: &'static str, args: Vec<String>, logs: &Path) -> Instance {
        let mut instance = Instance {
            name,
            proxy: None,
            dir: tempfile::tempdir().expect("temp dir"),
            addr: free_addr(),
            args,
            logs: logs.to_owned(),
            starts: 0,
        };
        instance.restart().await;
        instance
    }

    async fn restart(&mut self) {
        self.starts += 1;
        let log = self.logs.join(format!("{}-{}.log", self.name, self.starts));
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.proxy =
            Some(ProxyProcess::start_logged(&args, self.dir.path(), self.addr, &[], &log).await);
    }

    fn proxy(&mut self) -> &mut ProxyProcess {
        self.proxy.as_mut().expect("running")
    }

    /// What each start of it logged (warnings and errors).
    fn logged(&self) -> String {
        let mut text = String::new();
        for n in 1..=self.starts {
            let log = self.logs.join(format!("{}-{n}.log", self.name));
            let log = std::fs::read_to_string(log).unwrap_or_default();
            if !log.trim().is_empty() {
                text.push_str(&format!("\n---- instance {} start {n}\n{log}", self.name));
            }
        }
        text
    }
}

/// Waits (bounded) for the instance to exit after its SIGTERM, cleanly.
async fn exited_cleanly(instance: &mut Instance, timeline: &Timeline) {
    let status = instance.proxy().exited().await;
    timeline.note(format!("instance {} exited ({status})", instance.name));
    assert!(status.success(), "instance {}: {status}", instance.name);
}

// ------------------------------------------------------------------ figures

/// Everything the clients saw, checked; panics with the evidence.
fn check_calls(calls: &[CallRecord], route: Route, timeline: &Timeline, context: &str) {
    let mut problems = Vec::new();
    for call in calls {
        let mut bad: Vec<String> = call.delivery_problems();
        for e in &call.exchanges {
            let tolerated = route == Route::Direct && e.unanswered.is_some();
            if !e.answered_well() && !tolerated {
                bad.push(format!("a request failed at +{} ms", e.at_ms));
            }
        }
        if !bad.is_empty() {
            problems.push(format!("{}\n    {}", bad.join("; "), call.trace(timeline)));
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} calls went wrong:\n{}\n\ntimeline:\n{}\n{context}",
        problems.len(),
        calls.len(),
        problems.join("\n"),
        timeline.text()
    );
}

fn summary(calls: &[CallRecord], timeline: &Timeline) -> String {
    let requests: usize = calls.iter().map(|c| c.exchanges.len()).sum();
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for e in calls.iter().flat_map(|c| &c.exchanges) {
        let key = match (&e.status, e.refused) {
            (Some(_), _) => timeline.name(&e.served_by),
            (None, true) => "refused".into(),
            (None, false) => "unanswered".into(),
        };
        *by.entry(key).or_default() += 1;
    }
    let retried_by_nginx = calls
        .iter()
        .flat_map(|c| &c.exchanges)
        .filter(|e| e.served_by.contains(", "))
        .count();
    let interrupted = calls.iter().filter(|c| c.interrupted()).count();
    let moved = calls
        .iter()
        .filter(|c| c.instances(timeline).len() > 1)
        .count();
    format!(
        "{} calls, {requests} requests ({by:?}; {retried_by_nginx} passed on by nginx), \
         {interrupted} calls cut by a drain and resumed, {moved} of them moved to another instance",
        calls.len()
    )
}

// ------------------------------------------------------------------ the tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_behind_nginx_fails_no_request_and_every_call_ends_with_its_result() {
    let Some(nginx_program) = nginx_program() else {
        return;
    };
    let Some(redis) = private_redis() else {
        return;
    };
    let plan = plan();
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    let shared = tempfile::tempdir().expect("temp dir");
    let key = shared.path().join("token.key");
    std::fs::write(&key, mcp_resume_proxy::id::random_key().repeat(2)).expect("key file");
    let config = shared.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "trusted_proxies = [\"127.0.0.1\"]\n\
             drain_delay_secs = {}\n\
             shutdown_grace_secs = 2\n\
             [store]\nbackend = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"rolling\"\n\
             [tokens]\nkey_file = \"{}\"\n\
             [[upstream]]\nurl = \"{}\"\n",
            plan.drain_delay_secs,
            redis.url(),
            key.display(),
            upstream.url()
        ),
    )
    .expect("config file");
    let args = vec!["--config".to_owned(), config.display().to_string()];
    let mut instances = [
        Instance::start("A", args.clone(), shared.path()).await,
        Instance::start("B", args, shared.path()).await,
    ];
    let addrs: Vec<SocketAddr> = instances.iter().map(|i| i.addr).collect();
    let timeline = Timeline::new(&[(addrs[0], "A"), (addrs[1], "B")]);
    let nginx = Nginx::start(&nginx_program, &addrs).await;
    let url = nginx.url();
    timeline.note(format!("nginx on {} sends to A and B", nginx.addr));
    let mut balancer = Balancer::start(nginx, addrs.clone(), timeline.clone());

    let stop = Arc::new(AtomicBool::new(false));
    let clients = start_clients(&url, plan, &stop, &timeline);
    let drain = Duration::from_secs(plan.drain_delay_secs);
    let mut late = Vec::new();
    for round in 1..=plan.rounds {
        for instance in instances.iter_mut() {
            let addr = instance.addr;
            balancer
                .until("every instance is in nginx's list", LIMIT, |m| {
                    addrs.iter().all(|a| m.backends.contains(a))
                })
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", timeline.text()));
            sleep(plan.settle).await;
            timeline.note(format!("round {round}: SIGTERM to {}", instance.name));
            let sent = Instant::now();
            instance.proxy().signal(libc::SIGTERM);
            let out = balancer
                .until("the stopped instance is out", LIMIT, |m| {
                    !m.backends.contains(&addr)
                })
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", timeline.text()));
            if sent.elapsed() >= drain {
                late.push(format!(
                    "{} left nginx's list (generation {}) {:?} after its SIGTERM, after its drain",
                    instance.name,
                    out.generation,
                    sent.elapsed()
                ));
            }
            exited_cleanly(instance, &timeline).await;
            instance.restart().await;
            timeline.note(format!("instance {} started again", instance.name));
        }
    }
    balancer
        .until("every instance is back in nginx's list", LIMIT, |m| {
            addrs.iter().all(|a| m.backends.contains(a))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", timeline.text()));
    sleep(plan.settle).await;
    stop.store(true, Ordering::Relaxed);
    timeline.note("clients finish their calls".into());
    let calls = join_clients(clients).await;
    timeline.note("clients done".into());
    let nginx = balancer.stop().await;

    let logged: String = instances.iter().map(Instance::logged).collect();
    let context = format!("{}{logged}", nginx.error_log_tail());
    check_calls(&calls, Route::Nginx, &timeline, &context);
    println!("timeline:\n{}", timeline.text());
    println!(
        "rolling restart behind nginx: {}",
        summary(&calls, &timeline)
    );
    assert!(late.is_empty(), "{}\n{}", late.join("\n"), timeline.text());
    // Every call ran upstream once: none was started again by a resume, a
    // takeover or a re-sent POST.
    let stats = &upstream.stats;
    assert_eq!(
        stats.calls_started.load(Ordering::Relaxed),
        calls.len() as u64,
        "tools/call sent upstream"
    );
    let interrupted = calls.iter().filter(|c| c.interrupted()).count();
    let moved = calls
        .iter()
        .filter(|c| c.instances(&timeline).len() > 1)
        .count();
    assert!(interrupted > 0, "no drain cut a call: nothing was proved");
    assert!(moved > 0, "no call moved to the other instance");
    assert!(
        stats.resumed_gets.load(Ordering::Relaxed) > 0,
        "no call was taken over and resumed upstream"
    );
    drop(nginx);
    drop(instances);
    drop(redis);
}

/// One instance on the journal, SIGTERM and started again on its data dir
/// while the clients call straight at it: every call is resumed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_the_embedded_log_resumes_every_call() {
    embedded_log_restart().await;
}

async fn embedded_log_restart() {
    let plan = plan();
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    let shared = tempfile::tempdir().expect("temp dir");
    let config = shared.path().join("proxy.toml");
    // No balancer to wait for: a drain of a second, so that the restart
    // passes through it as it would behind one.
    std::fs::write(
        &config,
        format!(
            "drain_delay_secs = 1\nshutdown_grace_secs = 2\n\
             [store]\nbackend = \"journal\"\n\
             [[upstream]]\nurl = \"{}\"\n",
            upstream.url()
        ),
    )
    .expect("config file");
    let args = vec!["--config".to_owned(), config.display().to_string()];
    let mut instance = Instance::start("J", args, shared.path()).await;
    let timeline = Timeline::new(&[(instance.addr, "J")]);
    let url = format!("http://{}/mcp", instance.addr);

    let stop = Arc::new(AtomicBool::new(false));
    let clients = start_clients(&url, plan, &stop, &timeline);
    for round in 1..=plan.rounds {
        sleep(plan.settle).await;
        timeline.note(format!("round {round}: SIGTERM to J"));
        instance.proxy().signal(libc::SIGTERM);
        exited_cleanly(&mut instance, &timeline).await;
        instance.restart().await;
        timeline.note("instance J started again on its data dir".into());
    }
    sleep(plan.settle).await;
    stop.store(true, Ordering::Relaxed);
    timeline.note("clients finish their calls".into());
    let calls = join_clients(clients).await;
    timeline.note("clients done".into());

    let stats = &upstream.stats;
    let started = stats.calls_started.load(Ordering::Relaxed);
    let context = format!(
        "{} calls, {started} started upstream{}",
        calls.len(),
        instance.logged()
    );
    check_calls(&calls, Route::Direct, &timeline, &context);
    println!("timeline:\n{}", timeline.text());
    println!(
        "restart on the embedded log: {}",
        summary(&calls, &timeline)
    );
    // Every call ran upstream exactly once.
    let calls_n = calls.len() as u64;
    assert_eq!(
        started, calls_n,
        "tools/call sent upstream for {calls_n} calls"
    );
    assert!(
        calls.iter().any(CallRecord::interrupted),
        "no restart cut a call: nothing was proved"
    );
    assert!(
        stats.resumed_gets.load(Ordering::Relaxed) > 0,
        "no call was resumed upstream after the restart"
    );
}

/// A TCP relay in front of the upstream that, while held, keeps what the
/// upstream sends for [`SlowStart::HOLD`] before it passes it on: an
/// upstream slow to begin its answer (a server that authorizes, or loads
/// something first), which widens to a second the few milliseconds between
/// a call reaching the upstream and the upstream's first event.
struct SlowStart {
    addr: SocketAddr,
    hold: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowStart {
    const HOLD: Duration = Duration::from_millis(1_000);

    async fn start(target: SocketAddr) -> SlowStart {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("relay binds");
        let addr = listener.local_addr().expect("relay address");
        let hold = Arc::new(AtomicBool::new(false));
        let held = hold.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let held = held.clone();
                tokio::spawn(async move {
                    let Ok(upstream) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_upstream, mut to_upstream) = upstream.into_split();
                    let up = async {
                        let _ = tokio::io::copy(&mut from_client, &mut to_upstream).await;
                        let _ = to_upstream.shutdown().await;
                    };
                    let down = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n @ 1..) = from_upstream.read(&mut buf).await {
                            if held.load(Ordering::Relaxed) {
                                sleep(Self::HOLD).await;
                            }
                            if to_client.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = to_client.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        SlowStart { addr, hold, task }
    }

    fn hold(&self, on: bool) {
        self.hold.store(on, Ordering::Relaxed);
    }
}

impl Drop for SlowStart {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The bug the embedded-log test meets now and then, made certain: a call
/// the proxy took (200, its priming event id) and forwarded (the upstream
/// runs it) just before a graceful stop is not picked up by the next start,
/// since no upstream event of it was logged yet; it ends with the restart
/// error although the upstream ran it to its result. The README says of a
/// shutdown "Requests the upstream is still answering are picked up again
/// by the next start"; with a grace of 5 s the stop could have waited the
/// second this upstream took to begin its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_arrived_just_before_a_graceful_stop_ends_with_its_result() {
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .expect("demo upstream starts");
    let relay = SlowStart::start(upstream.addr).await;
    let shared = tempfile::tempdir().expect("temp dir");
    let config = shared.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "shutdown_grace_secs = 5\n[store]\nbackend = \"journal\"\n\
             [[upstream]]\nurl = \"http://{}/mcp\"\n",
            relay.addr
        ),
    )
    .expect("config file");
    let args = vec!["--config".to_owned(), config.display().to_string()];
    let mut instance = Instance::start("J", args, shared.path()).await;
    let timeline = Timeline::new(&[(instance.addr, "J")]);
    let client = McpClient::unpooled(format!("http://{}/mcp", instance.addr));
    let sid = client.initialize(V_LATEST).await;

    relay.hold(true);
    let res = client
        .send(Call::post(&slow_call(1, 5, 50)).session(&sid))
        .await;
    assert_eq!(res.status(), http::StatusCode::OK);
    let stats = upstream.stats.clone();
    common::eventually("the call reached the upstream", || {
        stats.calls_started.load(Ordering::Relaxed) == 1
    })
    .await;
    timeline.note("the call reached the upstream; SIGTERM".into());
    instance.proxy().signal(libc::SIGTERM);
    let before = common::read_all(res).await;
    exited_cleanly(&mut instance, &timeline).await;
    let last_id = before
        .iter()
        .rev()
        .find_map(|e| e.id.clone())
        .expect("the answer's priming event id");
    assert!(
        before.iter().any(|e| e.retry.is_some()),
        "the answer ended with a retry:"
    );
    relay.hold(false);
    instance.restart().await;
    timeline.note("instance J started again".into());

    let res = client
        .send(Call::get().session(&sid).header("last-event-id", &last_id))
        .await;
    assert_eq!(res.status(), http::StatusCode::OK);
    let after = common::messages(res).await;
    common::eventually("the upstream completed the call", || {
        stats.calls_completed.load(Ordering::Relaxed) == 1
    })
    .await;
    let last = after.last().expect("a final response");
    assert_eq!(
        last["result"]["content"][0]["text"],
        "slow done after 5 steps",
        "the call the upstream completed ended for its client with {last}\n{}",
        timeline.text()
    );
    assert_eq!(common::progress_values(&after), [1, 2, 3, 4, 5]);
}
