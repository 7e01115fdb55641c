//! nginx as a peer of `peers`: the plain reverse proxy a user would compare
//! an MCP proxy with. This module owns finding or installing it (Debian's
//! `nginx`, through apt, never into the repository), its generated
//! configuration and its process. It runs as one process in the foreground
//! (`daemon off; master_process off`): the [`Proc`] guard's pid is the one
//! that serves, so its CPU is what the figures read and its kill leaves no
//! orphaned worker behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::client::Target;
use crate::procs::{free_port, run_bounded, Proc, PEERS_DIR};

/// Where Debian's package puts the binary (`/usr/sbin` is not on every
/// user's `PATH`).
const DEBIAN_BIN: &str = "/usr/sbin/nginx";

/// The nginx binary: `/usr/sbin/nginx`, else one on `PATH`, else Debian's
/// package installed with apt-get (as root, or through `sudo -n`).
fn nginx_bin(limit: Duration) -> Result<PathBuf> {
    if let Some(bin) = find_bin() {
        return Ok(bin);
    }
    std::fs::create_dir_all(PEERS_DIR)?;
    let log = Path::new(PEERS_DIR).join("install-nginx.log");
    eprintln!(
        "load: installing nginx with apt-get (log: {})",
        log.display()
    );
    // A fresh machine may hold no package lists yet: update once and retry.
    if !run_bounded(apt(&["install", "-y", "-qq", "nginx"]), limit, &log)? {
        run_bounded(apt(&["update", "-qq"]), limit, &log)?;
        run_bounded(apt(&["install", "-y", "-qq", "nginx"]), limit, &log)?;
    }
    find_bin().ok_or_else(|| anyhow!("apt-get install nginx failed (see {})", log.display()))
}

fn find_bin() -> Option<PathBuf> {
    let debian = PathBuf::from(DEBIAN_BIN);
    if debian.exists() {
        return Some(debian);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("nginx"))
            .find(|bin| bin.exists())
    })
}

/// `apt-get ARGS`, through `sudo -n` unless this process is root.
fn apt(args: &[&str]) -> Command {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if root {
        Command::new("apt-get")
    } else {
        let mut sudo = Command::new("sudo");
        sudo.args(["-n", "apt-get"]);
        sudo
    };
    cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

/// The configuration the issue names: a plain `proxy_pass` with buffering
/// off and a keep-alive upstream pool, every path inside `dir`.
fn config(dir: &Path, port: u16, upstream: std::net::SocketAddr) -> String {
    let d = dir.display();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    # The default closes a connection after 1,000 requests, which the
    # harness would count as failed calls.
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    upstream fast {{
        server {upstream};
        keepalive 64;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://fast;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"#
    )
}

/// nginx in front of `upstream`, in a temporary directory of its own (gone
/// with the guard).
pub async fn start(upstream: std::net::SocketAddr) -> Result<(Proc, Target)> {
    let bin = nginx_bin(Duration::from_secs(300))?;
    let dir = tempfile::Builder::new()
        .prefix("mcp-resume-proxy-nginx-")
        .tempdir()?;
    let port = free_port()?;
    let conf = dir.path().join("nginx.conf");
    std::fs::write(&conf, config(dir.path(), port, upstream))?;
    let mut cmd = Command::new(&bin);
    cmd.arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&conf)
        // Without -e it first opens the compiled-in /var/log/nginx/error.log.
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr.log"))?);
    let (p, addr) =
        Proc::spawn_listening("nginx", cmd, Some(dir), port, Duration::from_secs(10)).await?;
    let target = Target::new("nginx", addr, "/mcp", "echo", Some(p.pid()));
    Ok((p, target))
}
