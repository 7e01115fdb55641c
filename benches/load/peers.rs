//! The `peers` scenario (only with `--peers`): the `small` load through other
//! MCP proxies — the Rust `mcp-proxy` crate and the PyPI `mcp-persist` — and
//! through the floor and nginx (`nginx`), beside this proxy (`batch` and
//! `never`) and the upstream reached directly. The MCP peers are installed on
//! first use under `procs::PEERS_DIR`, never in the repository, and reused
//! across runs; a peer that cannot be installed is skipped with a note rather
//! than failing the scenario.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Result};

use crate::client::Target;
use crate::procs::{cargo, free_port, run_bounded, start_floor, start_stand, Proc, PEERS_DIR};
use crate::{nginx, small, Opts};

/// The Rust `mcp-proxy` 0.6.0 binary, installed with cargo when missing.
fn rmp_bin(limit: Duration) -> Result<PathBuf> {
    let dir = Path::new(PEERS_DIR);
    let bin = dir.join("rmp/bin/mcp-proxy");
    if bin.exists() {
        return Ok(bin);
    }
    std::fs::create_dir_all(dir)?;
    eprintln!("load: installing mcp-proxy 0.6.0 into {PEERS_DIR}/rmp (took ~10 min here before)");
    let mut cmd = cargo();
    cmd.args(["install", "mcp-proxy@0.6.0", "--locked", "--root"])
        .arg(dir.join("rmp"))
        .env("CARGO_TARGET_DIR", dir.join("target"));
    if !run_bounded(cmd, limit, &dir.join("install-rmp.log"))? || !bin.exists() {
        bail!("cargo install mcp-proxy did not finish within {limit:?}");
    }
    Ok(bin)
}

/// `mcp-persist-proxy` 2.2.0 in a venv, installed with pip when missing.
fn persist_bin(limit: Duration) -> Result<PathBuf> {
    let dir = Path::new(PEERS_DIR);
    let venv = dir.join("venv-persist");
    let bin = venv.join("bin/mcp-persist-proxy");
    if bin.exists() {
        return Ok(bin);
    }
    std::fs::create_dir_all(dir)?;
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "venv"]).arg(&venv);
    if !run_bounded(cmd, limit, &dir.join("venv.log"))? {
        bail!("python3 -m venv failed");
    }
    let mut cmd = Command::new(venv.join("bin/pip"));
    cmd.args(["install", "mcp-persist[sqlite]==2.2.0"]);
    if !run_bounded(cmd, limit, &dir.join("install-persist.log"))? || !bin.exists() {
        bail!("pip install mcp-persist did not finish within {limit:?}");
    }
    Ok(bin)
}

/// The Rust `mcp-proxy` in front of `upstream`, its config and log in
/// `scratch`.
async fn start_rmp(upstream: SocketAddr, scratch: &Path) -> Result<(Proc, Target)> {
    let rmp = rmp_bin(Duration::from_secs(900))?;
    let port = free_port()?;
    let conf = scratch.join("rmp.toml");
    std::fs::write(
        &conf,
        format!(
            "[proxy]\nname = \"rmp-load\"\nseparator = \"/\"\n\n[proxy.listen]\nhost = \"127.0.0.1\"\n\
             port = {port}\n\n[[backends]]\nname = \"fast\"\ntransport = \"http\"\n\
             url = \"http://{upstream}/mcp\"\n\n[observability]\nlog_level = \"info\"\n"
        ),
    )?;
    let mut cmd = Command::new(rmp);
    cmd.arg("--config")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(scratch.join("rmp.log"))?);
    let (p, addr) =
        Proc::spawn_listening("mcp-proxy", cmd, None, port, Duration::from_secs(30)).await?;
    let target = Target::new("mcp-proxy", addr, "/", "fast/echo", Some(p.pid()));
    Ok((p, target))
}

/// `mcp-persist` in front of `upstream`, its SQLite file and log in
/// `scratch`.
async fn start_persist(upstream: SocketAddr, scratch: &Path) -> Result<(Proc, Target)> {
    let persist = persist_bin(Duration::from_secs(300))?;
    let port = free_port()?;
    let mut cmd = Command::new(persist);
    cmd.arg("--upstream")
        .arg(format!("http://{upstream}"))
        .args(["--backend", "sqlite", "--url"])
        .arg(scratch.join("persist.db"))
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(scratch.join("persist.log"))?);
    let (p, addr) =
        Proc::spawn_listening("mcp-persist", cmd, None, port, Duration::from_secs(30)).await?;
    let target = Target::new("mcp-persist", addr, "/mcp", "echo", Some(p.pid()));
    Ok((p, target))
}

/// Direct, this proxy (`batch`, then `never`), the floor, the MCP peers and
/// nginx, all in front of one fast upstream. A peer that cannot be installed
/// or started leaves a note under the table instead of failing the scenario.
pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let modes = ["batch".to_owned(), "never".to_owned()];
    let mut stand = start_stand(bin, &modes, o.upstream).await?;
    let up = stand.targets[0].addr;
    stand.targets[1].name = "resume batch".into();
    stand.targets[2].name = "resume never".into();
    let scratch = tempfile::Builder::new()
        .prefix("mcp-resume-proxy-peers-")
        .tempdir()?;
    let dir = scratch.path();
    let (floor, target) = start_floor(up).await?;
    stand.proxies.push(floor);
    stand.targets.push(target);
    let mut notes = String::new();
    let peers = [
        ("mcp-proxy (Rust)", start_rmp(up, dir).await),
        ("mcp-persist", start_persist(up, dir).await),
        ("nginx", nginx::start(up).await),
    ];
    for (name, started) in peers {
        match started {
            Ok((p, target)) => {
                stand.proxies.push(p);
                stand.targets.push(target);
            }
            Err(e) => writeln!(notes, "{name} skipped: {e:#}")?,
        }
    }
    let mut out = small::table("peers", &stand.targets, o).await?;
    out.push_str(&notes);
    Ok(out)
}
