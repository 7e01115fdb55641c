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
mod rolling_restart {
    pub mod clients;
    pub mod instances;
    pub mod nginx;
    pub mod plan;
    pub mod slow_start;
    pub mod timeline;
}

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{slow_call, Call, McpClient, LIMIT, V_LATEST};
use mcp_resume_proxy::demo::upstream::{DemoOptions, DemoUpstream};
use rolling_restart::clients::{
    check_calls, join_clients, start_clients, summary, CallRecord, Route,
};
use rolling_restart::instances::{exited_cleanly, Instance};
use rolling_restart::nginx::{nginx_program, Balancer, Nginx};
use rolling_restart::plan::{plan, private_redis};
use rolling_restart::slow_start::SlowStart;
use rolling_restart::timeline::Timeline;
use tokio::time::{sleep, Instant};

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
