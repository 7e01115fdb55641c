//! A real nginx in front of the instances, and the balancer that keeps its
//! `upstream` list to the ready ones: the nginx process (a prefix,
//! configuration and logs of its own in a temp dir, reloaded with SIGHUP),
//! the configuration it is given (around the list, the README's scale-out
//! example), and the balancer that probes each instance's `/readyz` and
//! publishes which instances nginx sends new requests to ([`Membership`]).
//! Why there is a balancer, and why it works this way, is in the crate's
//! doc ("How nginx learns of `/readyz`"). It must not stop or start
//! instances, nor judge calls: the tests do, from the membership it
//! publishes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use super::plan::in_ci;
use super::timeline::Timeline;
use crate::common::process::free_addr;
use crate::common::{Call, McpClient, LIMIT};

/// How often the balancer asks each instance's `/readyz`.
const PROBE_EVERY: Duration = Duration::from_millis(200);
/// Consecutive failed probes that take an instance out of nginx's list.
const FAILURE_THRESHOLD: u32 = 2;

/// Where `nginx` is; `None` (the test passes, saying why) outside CI.
pub fn nginx_program() -> Option<PathBuf> {
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

/// nginx in the foreground (`daemon off`) on a free loopback port, with a
/// prefix, temp paths, logs and pid file of its own in a temp dir; stopped
/// when dropped.
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
    /// The configuration now asked for: each reload counts one up, and
    /// nginx serves it at `/_balancer`.
    generation: u64,
}

impl Nginx {
    pub async fn start(program: &Path, backends: &[SocketAddr]) -> Nginx {
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
    pub fn url(&self) -> String {
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

    pub fn error_log_tail(&self) -> String {
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
pub struct Membership {
    pub backends: Vec<SocketAddr>,
    pub generation: u64,
}

/// Probes `/readyz` of each instance and keeps nginx's upstream list to the
/// ready ones (see the crate's doc).
pub struct Balancer {
    membership: watch::Receiver<Membership>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Nginx>,
}

impl Balancer {
    pub fn start(nginx: Nginx, instances: Vec<SocketAddr>, timeline: Timeline) -> Balancer {
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
    pub async fn until(
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
    pub async fn stop(self) -> Nginx {
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
