//! The tests' own Redis (`common::redis_server`): private, without
//! persistence, started once per test process, gone with it; and, with no
//! `redis-server` to start and no `REDIS_URL`, every Redis test fails with
//! the one line that says what to install.
//!
//! The last two are seen from outside: this binary runs itself again as a
//! child process (its own tests, chosen by name) with a changed
//! environment, and looks at what the child printed and left behind.

mod common;

use std::process::{Command, Output};

use common::redis_server::{self, MISSING};

/// This test binary run again with `tests` (exact names), `REDIS_URL`
/// unset and `PATH` set to `path`.
fn run_self(tests: &[&str], path: &str) -> Output {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "--include-ignored",
            "--test-threads",
            "1",
            "--nocapture",
        ])
        .args(tests)
        .env_remove("REDIS_URL")
        .env("PATH", path)
        .env("REDIS_RIG_CHILD", "1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("the test binary runs again")
}

fn is_child() -> bool {
    std::env::var_os("REDIS_RIG_CHILD").is_some()
}

#[test]
fn the_shared_server_is_private_keeps_nothing_and_is_started_once() {
    let url = redis_server::shared_url();
    assert_eq!(url, redis_server::shared_url(), "one server per process");
    if std::env::var_os("REDIS_URL").is_some() {
        return; // someone else's server: nothing more to say about it
    }
    assert!(url.starts_with("redis://127.0.0.1:"), "{url}");
    assert!(!url.contains(":6379/"), "never the usual port: {url}");
    let mut conn = redis_server::shared_connection();
    let config = |conn: &mut redis::Connection, key: &str| -> String {
        let pair: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(key)
            .query(conn)
            .unwrap();
        pair[1].clone()
    };
    assert_eq!(config(&mut conn, "save"), "");
    assert_eq!(config(&mut conn, "appendonly"), "no");
    assert_eq!(config(&mut conn, "bind"), "127.0.0.1");
}

/// Run by [`the_shared_server_goes_with_the_process`] in a child: prints the
/// pid of the child's shared server, then ends the process at once, as a
/// crashing test binary would (no destructor, no harness epilogue).
#[test]
#[ignore = "the child half of the_shared_server_goes_with_the_process, run by it"]
fn child_prints_its_servers_pid_and_exits() {
    if !is_child() {
        return;
    }
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut redis_server::shared_connection())
        .unwrap();
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("INFO server names the pid");
    println!("redis-server pid {pid}");
    std::process::exit(0);
}

#[test]
fn the_shared_server_goes_with_the_process() {
    if std::env::var_os("REDIS_URL").is_some() || is_child() {
        return; // the server is someone else's, or this is the child
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let out = run_self(&["child_prints_its_servers_pid_and_exits"], &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pid: u32 = stdout
        .lines()
        .find_map(|l| Some(l.split_once("redis-server pid ")?.1))
        .unwrap_or_else(|| {
            panic!(
                "the child printed no pid: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .trim()
        .parse()
        .expect("a pid");
    // The kernel signals the server as the child exits; give it a moment
    // to die. Dead is enough: whether init reaps it is init's business.
    let alive = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // `pid (comm) state ...`; a reused pid is some other program.
        stat.contains("(redis-server)")
            && !matches!(
                stat.rsplit(") ").next().and_then(|r| r.chars().next()),
                Some('Z' | 'X')
            )
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive() {
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server {pid} outlived its test process"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn without_redis_server_each_redis_test_fails_with_one_line_naming_the_package() {
    if is_child() {
        return;
    }
    // An empty directory for PATH: no redis-server anywhere on it.
    let empty = tempfile::tempdir().expect("temp dir");
    let tests = [
        "the_shared_server_is_private_keeps_nothing_and_is_started_once",
        "child_prints_its_servers_pid_and_exits",
    ];
    let out = run_self(&tests, &empty.path().display().to_string());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("2 failed"), "{stdout}{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("redis-server"))
        .collect();
    assert_eq!(lines, vec![MISSING; 2], "{stderr}");
}
