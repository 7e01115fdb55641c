//! The Redis that tests run against, and the `redis-server` processes they
//! start: `REDIS_URL` when it is set, else one private `redis-server` per
//! test process (free loopback port, no persistence, started by the first
//! test that asks, shared by the rest, gone when the process ends), plus the
//! servers a test owns outright so it can kill and restart them, stop and
//! continue them (`SIGSTOP`, `SIGCONT`), or run as a replica of another.
//! Nothing here looks at 127.0.0.1:6379: that port may be someone else's.
//!
//! One file, included with `#[path]` by the library's unit tests
//! (`src/store/redis/tests.rs`), the integration tests (`tests/common`) and
//! the load harness (`benches/load`), rather than a `pub mod` of the
//! library: the integration tests only see the library as it ships, so a
//! module of it would have to ship (or hide behind a feature `cargo test`
//! does not turn on). It therefore uses only what all three have: std,
//! libc, redis and tempfile.
#![allow(dead_code)]

use std::io;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

/// What a Redis test says, and all it says, when there is no Redis to use.
pub const MISSING: &str = "Redis tests need `redis-server` on PATH \
                           (Debian package redis-server) or REDIS_URL=redis://host:port";

/// How long a server may take to answer PING after it was started.
const STARTUP: Duration = Duration::from_secs(10);

/// The URL of the Redis this process's tests share. Panics with one line
/// when there is none (see [`shared`]).
pub fn shared_url() -> String {
    shared().unwrap_or_else(|why| panic!("{why}"))
}

/// The URL of the Redis this process's tests share: `REDIS_URL` once it
/// answered PING, else that of the private server, started on first use.
/// The outcome is kept, so that without Redis every test fails with the
/// same one line instead of each trying again.
pub fn shared() -> Result<String, String> {
    // Never dropped (statics are not): the server goes with the process,
    // through `spawn_tied`, not through `RedisServer`'s `Drop`.
    static SHARED: OnceLock<Result<(String, Option<RedisServer>), String>> = OnceLock::new();
    let shared = SHARED.get_or_init(|| match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => match connect(&url) {
            Ok(_) => Ok((url, None)),
            Err(e) => Err(format!(
                "REDIS_URL={url} did not answer PING ({e}); \
                 unset REDIS_URL to let the tests start their own redis-server"
            )),
        },
        _ => {
            let mut server = RedisServer::start(Persistence::None)?;
            // Its data dir would outlive the process (the static is never
            // dropped); without persistence Redis writes nothing there, so
            // the dir goes now (a stray SAVE then fails instead of leaving
            // a file behind).
            if let Some(dir) = server.dir.take() {
                let _ = dir.close();
            }
            Ok((server.url(), Some(server)))
        }
    });
    shared
        .as_ref()
        .map(|(url, _)| url.clone())
        .map_err(Clone::clone)
}

/// A connection to `url` that answered PING, or why not.
pub fn connect(url: &str) -> Result<redis::Connection, String> {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    redis::cmd("PING")
        .query::<String>(&mut conn)
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// A connection to the shared Redis; panics with one line without one.
pub fn shared_connection() -> redis::Connection {
    let url = shared_url();
    connect(&url).unwrap_or_else(|e| panic!("the tests' Redis at {url} stopped answering: {e}"))
}

/// What a server keeps on disk.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Persistence {
    /// Nothing (`--save '' --appendonly no`): the shared server.
    None,
    /// An append-only file synced on every write, so that what it
    /// acknowledged survives a `kill -9`: for tests that kill and restart it.
    Aof,
}

/// A `redis-server` of this process on a free loopback port, its files in
/// a temp dir. Killed when dropped, and when this process ends however it
/// ends (see `spawn_tied`).
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: Option<tempfile::TempDir>,
    persistence: Persistence,
    /// With TLS: the port it serves TLS on, and what it is run with.
    tls: Option<Tls>,
    /// For a replica: the port of its primary (on loopback).
    primary: Option<u16>,
    /// For a sentinel: its configuration file (which it rewrites).
    sentinel: Option<std::path::PathBuf>,
    /// A node of a Redis Cluster (`--cluster-enabled`, see `redis_cluster.rs`).
    cluster: bool,
}

/// A server's TLS: its port, its certificate and key files, and ACL users
/// (name, password) besides `default`.
#[derive(Clone)]
pub struct Tls {
    pub port: u16,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub ca: std::path::PathBuf,
    pub users: Vec<(String, String)>,
    /// Clients must present a certificate from `ca` (`tls-auth-clients`).
    pub client_certificates: bool,
}

impl RedisServer {
    /// A server not started yet, in a temp dir of its own named for
    /// `what`: plain, without persistence, on its own; each way to start
    /// one changes what it needs of that, then makes its first run.
    fn unstarted(what: &str) -> Result<RedisServer, String> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("mcp-resume-proxy-{what}-"))
            .tempdir()
            .map_err(|e| format!("a temp dir for redis-server: {e}"))?;
        Ok(RedisServer {
            child: None,
            port: 0,
            dir: Some(dir),
            persistence: Persistence::None,
            tls: None,
            primary: None,
            sentinel: None,
            cluster: false,
        })
    }

    /// Starts one and waits until it answers PING. Errs with [`MISSING`]
    /// when `redis-server` is not installed.
    pub fn start(persistence: Persistence) -> Result<RedisServer, String> {
        let mut server = Self::unstarted("redis")?;
        server.persistence = persistence;
        server.first_run()?;
        Ok(server)
    }

    /// Starts an empty node of a Redis Cluster, not yet in one (no
    /// persistence; its `nodes.conf` in its temp dir), quick to count a
    /// silent peer as failed (1 s) so that a replica takes over soon.
    pub fn start_cluster_node() -> Result<RedisServer, String> {
        let mut server = Self::unstarted("redis-cluster")?;
        server.cluster = true;
        server.first_run()?;
        Ok(server)
    }

    /// Starts an empty node of a Redis Cluster as [`start_cluster_node`]
    /// does, serving TLS on `tls.port` (chosen here) with its ACL users,
    /// its cluster bus and its replication over TLS too (`tls-cluster`,
    /// `tls-replication`); the plain port stays, on loopback, for the
    /// rig's own checks, as [`start_tls`]'s does.
    ///
    /// [`start_cluster_node`]: RedisServer::start_cluster_node
    /// [`start_tls`]: RedisServer::start_tls
    pub fn start_cluster_node_tls(tls: Tls) -> Result<RedisServer, String> {
        let mut server = Self::unstarted("redis-cluster-tls")?;
        server.tls = Some(tls);
        server.cluster = true;
        server.first_run()?;
        Ok(server)
    }

    /// The port it serves TLS on, if it does.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|t| t.port)
    }

    /// Starts a sentinel (`redis-server <conf> --sentinel`, the program
    /// Debian's `redis-sentinel` is) watching `primary` as `name`, with
    /// `quorum`, quick to call it down (500 ms) and to fail over; with
    /// `tls`, serving TLS too (on `tls.port`, chosen here), still watching
    /// `primary` in plain.
    pub fn start_sentinel(
        primary: &RedisServer,
        name: &str,
        quorum: u32,
        tls: Option<Tls>,
    ) -> Result<RedisServer, String> {
        let dir = tempfile::Builder::new()
            .prefix("mcp-resume-proxy-sentinel-")
            .tempdir()
            .map_err(|e| format!("a temp dir for a sentinel: {e}"))?;
        let conf = dir.path().join("sentinel.conf");
        let text = format!(
            "sentinel monitor {name} 127.0.0.1 {port} {quorum}\n\
             sentinel down-after-milliseconds {name} 500\n\
             sentinel failover-timeout {name} 2000\n\
             sentinel parallel-syncs {name} 1\n",
            port = primary.port
        );
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        let tls = match tls {
            Some(tls) => Some(Tls {
                port: free_port()?,
                ..tls
            }),
            None => None,
        };
        let mut sentinel = RedisServer {
            child: None,
            port: 0,
            dir: Some(dir),
            persistence: Persistence::None,
            tls,
            primary: None,
            sentinel: Some(conf),
            cluster: false,
        };
        sentinel.first_run()?;
        Ok(sentinel)
    }

    /// The port of the primary this sentinel names for `name` now.
    pub fn primary_named(&self, name: &str) -> Option<u16> {
        let mut conn = connect(&self.url()).ok()?;
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .query(&mut conn)
            .ok()?;
        addr?.1.parse().ok()
    }

    /// Starts a replica of `primary` (`--replicaof`, no persistence) and
    /// waits until its link to the primary is up (`master_link_status:up`,
    /// the first sync done) and it acknowledges the primary's writes (a
    /// `WAIT` on the primary counts it: not before its first
    /// acknowledgement, up to a second after the sync). The primary is told
    /// to sync at once, not after the few seconds a diskless sync waits for
    /// more replicas by default, and its command statistics are reset after
    /// (so a test counts only its own commands).
    pub fn start_replica_of(primary: &RedisServer) -> Result<RedisServer, String> {
        let mut conn = connect(&primary.url())?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg(0)
            .query::<()>(&mut conn)
            .map_err(|e| format!("CONFIG SET on the primary: {e}"))?;
        let mut replica = Self::unstarted("redis-replica")?;
        replica.primary = Some(primary.port);
        replica.first_run()?;
        replica.wait_for_replication(|line| line == "master_link_status:up")?;
        acknowledged(&mut conn)?;
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query::<()>(&mut conn)
            .map_err(|e| format!("CONFIG RESETSTAT on the primary: {e}"))?;
        Ok(replica)
    }

    /// Waits (within [`STARTUP`]) until a line of this server's `INFO
    /// replication` is as `wanted` says.
    fn wait_for_replication(&self, wanted: impl Fn(&str) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP;
        let mut conn = connect(&self.url())?;
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut conn)
                .map_err(|e| format!("INFO replication: {e}"))?;
            if info.lines().any(|l| wanted(l.trim())) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "replication on port {} did not come up within {STARTUP:?}: {info}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts one serving TLS too (on `tls.port`, chosen here), with its
    /// ACL users; the plain port stays, for the readiness check.
    pub fn start_tls(mut tls: Tls) -> Result<RedisServer, String> {
        tls.port = free_port()?;
        let mut server = Self::unstarted("redis-tls")?;
        server.tls = Some(tls);
        server.first_run()?;
        Ok(server)
    }

    /// The URL of its TLS port, by the name its certificate holds.
    pub fn tls_url(&self) -> String {
        let port = self.tls.as_ref().map_or(0, |t| t.port);
        format!("rediss://localhost:{port}/0")
    }

    fn first_run(&mut self) -> Result<(), String> {
        let server = self;
        // The free port is free when asked, not necessarily when Redis binds
        // it (another process may take it in between): a few fresh tries.
        let mut tries = 0;
        loop {
            server.port = free_port()?;
            // A cluster node's bus is on its client port (the TLS one, with
            // `tls-cluster`) plus 10000, which a high port leaves no room
            // for: that port too is chosen again on each try.
            if let (true, Some(tls)) = (server.cluster, server.tls.as_mut()) {
                tls.port = free_port()?;
            }
            match server.run() {
                Ok(()) => return Ok(()),
                Err(Start::Exited(_)) if tries < 4 => tries += 1,
                Err(Start::Exited(why) | Start::Failed(why)) => return Err(why),
            }
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn run(&mut self) -> Result<(), Start> {
        let dir = self.dir.as_ref().expect("a server that runs has its dir");
        let mut cmd = Command::new("redis-server");
        if let Some(conf) = &self.sentinel {
            cmd.arg(conf).arg("--sentinel");
        }
        cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", ""])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match self.persistence {
            Persistence::None => cmd.args(["--appendonly", "no"]),
            Persistence::Aof => cmd.args(["--appendonly", "yes", "--appendfsync", "always"]),
        };
        if self.cluster {
            // A replica syncs at once rather than after the 5 s a diskless
            // sync waits for more replicas by default: one that never
            // synced refuses to take over ("disconnected from master for
            // longer than allowed").
            cmd.args(["--repl-diskless-sync-delay", "0"]);
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
                .arg("--cluster-config-file")
                .arg(dir.path().join("nodes.conf"));
        }
        if let Some(primary) = self.primary {
            cmd.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
        }
        if let Some(tls) = &self.tls {
            cmd.args(["--tls-port", &tls.port.to_string()])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .arg("--tls-auth-clients")
                .arg(if tls.client_certificates { "yes" } else { "no" });
            if self.cluster {
                cmd.args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
            }
            for (user, password) in &tls.users {
                let password = format!(">{password}");
                cmd.args(["--user", user, "on", &password, "~*", "&*", "+@all"]);
            }
        }
        let child = spawn_tied(cmd).map_err(|e| {
            Start::Failed(if e.kind() == io::ErrorKind::NotFound {
                MISSING.to_owned()
            } else {
                format!("redis-server did not start: {e}")
            })
        })?;
        self.child = Some(child);
        let url = self.url();
        let deadline = Instant::now() + STARTUP;
        loop {
            if connect(&url).is_ok() {
                return Ok(());
            }
            let child = self.child.as_mut().expect("just spawned");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(Start::Exited(format!(
                    "redis-server on port {} exited at start ({status}): {}",
                    self.port,
                    self.last_log_line()
                )));
            }
            if Instant::now() > deadline {
                self.kill9();
                return Err(Start::Failed(format!(
                    "redis-server on port {} did not answer PING within {STARTUP:?}: {}",
                    self.port,
                    self.last_log_line()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last line Redis logged (why it did not start), if any.
    fn last_log_line(&self) -> String {
        self.dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.path().join("redis.log")).ok())
            .and_then(|log| log.lines().last().map(str::to_owned))
            .unwrap_or_else(|| "no log".to_owned())
    }

    /// kill -9: Redis is gone at once, mid-whatever.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `SIGSTOP`: the process stays, answering nothing (a replica stopped
    /// so acknowledges nothing, while its primary still counts it as
    /// connected until `repl-timeout`). Undone by [`RedisServer::resume`];
    /// dropping a stopped server kills it all the same.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// `SIGCONT`: a paused server goes on where it stopped.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("a running server");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid");
        // SAFETY: kill(2) on our own child's pid, which stays ours (not
        // reaped) until `kill9` waits for it.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "signal {signal} to redis-server {pid}");
    }

    /// Starts it again on the same port and data; panics when it does not
    /// come back.
    pub fn restart(&mut self) {
        self.kill9();
        if let Err(Start::Exited(why) | Start::Failed(why)) = self.run() {
            panic!("{why}");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits (within [`STARTUP`]) until a write on `primary` is acknowledged
/// by a replica.
fn acknowledged(primary: &mut redis::Connection) -> Result<(), String> {
    let deadline = Instant::now() + STARTUP;
    loop {
        let acked: i64 = redis::pipe()
            .cmd("INCR")
            .arg("redis-rig:replicated")
            .ignore()
            .cmd("WAIT")
            .arg(1)
            .arg(100)
            .query::<(i64,)>(primary)
            .map_err(|e| format!("WAIT on the primary: {e}"))?
            .0;
        if acked >= 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no replica acknowledged a write within {STARTUP:?}"
            ));
        }
    }
}

/// Why a start failed: `Exited` may be a port taken in the meantime (worth
/// another port), `Failed` will not get better.
enum Start {
    Exited(String),
    Failed(String),
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Spawns `cmd` so that the kernel kills it when this process ends, however
/// it ends — statics are never dropped, and a test binary may die of a
/// signal or `exit`, so no destructor can be relied on.
///
/// The mechanism is `PR_SET_PDEATHSIG`, already how the proxy ties its stdio
/// children to itself; it needs no helper process (a `sh` watching a pipe
/// would itself be one more thing to orphan) and holds against `kill -9`.
/// Its catch: "parent" means the *thread* that forked, and the test harness
/// ends a test's thread when the test ends, which would kill a server shared
/// by later tests. So every server is forked by one keeper thread that lives
/// as long as the process.
fn spawn_tied(mut cmd: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static KEEPER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id();
        // SAFETY: between fork and exec the closure calls only prctl and
        // getppid (async-signal-safe) and builds an error that does not
        // allocate.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The parent may have died before the prctl: then the signal
                // never comes, so do not become an orphan at all.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    let keeper = KEEPER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("redis-server keeper".into())
            .spawn(move || {
                // Runs until the process ends: the sender is in a static.
                for (mut cmd, reply) in queue {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("the keeper thread starts");
        jobs
    });
    let (reply, answer) = mpsc::channel();
    keeper
        .send((cmd, reply))
        .map_err(|_| io::Error::other("the keeper thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the keeper thread is gone"))?
}
