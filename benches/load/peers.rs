//! The `peers` scenario (only with `--peers`): the `small` load through other
//! resumable MCP proxies — the Rust `mcp-proxy` crate and the PyPI
//! `mcp-persist` — beside this proxy and the upstream reached directly. The
//! peers are installed on first use under [`PEERS_DIR`], never in the
//! repository, and reused across runs; a peer that cannot be installed is
//! skipped with a note rather than failing the scenario.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Result};

use crate::client::Target;
use crate::procs::{cargo, free_port, run_bounded, start_floor, start_stand, Proc};
use crate::{small, Opts};

/// Where peers are installed: outside the repository, reused across runs.
const PEERS_DIR: &str = "/tmp/mcp-resume-proxy-peers";

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

pub async fn run(o: &Opts, bin: &Path) -> Result<String> {
    let mut stand = start_stand(bin, &["batch".to_owned()], o.upstream).await?;
    let up_addr = stand.targets[0].addr;
    stand.targets[1].name = "resume batch".into();
    let mut notes = String::new();
    let scratch = tempfile::Builder::new()
        .prefix("mcp-resume-proxy-peers-")
        .tempdir()?;
    match rmp_bin(Duration::from_secs(900)) {
        Ok(rmp) => {
            let port = free_port()?;
            let conf = scratch.path().join("rmp.toml");
            std::fs::write(
                &conf,
                format!(
                    "[proxy]\nname = \"rmp-load\"\nseparator = \"/\"\n\n[proxy.listen]\nhost = \"127.0.0.1\"\n\
                     port = {port}\n\n[[backends]]\nname = \"fast\"\ntransport = \"http\"\n\
                     url = \"http://{up_addr}/mcp\"\n\n[observability]\nlog_level = \"info\"\n"
                ),
            )?;
            let mut cmd = Command::new(rmp);
            cmd.arg("--config")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(scratch.path().join("rmp.log"))?);
            let (p, addr) =
                Proc::spawn_listening("mcp-proxy", cmd, None, port, Duration::from_secs(30))
                    .await?;
            stand.targets.push(Target::new(
                "mcp-proxy",
                addr,
                "/",
                "fast/echo",
                Some(p.pid()),
            ));
            stand.proxies.push(p);
        }
        Err(e) => writeln!(notes, "mcp-proxy (Rust) skipped: {e:#}")?,
    }
    match persist_bin(Duration::from_secs(300)) {
        Ok(persist) => {
            let port = free_port()?;
            let mut cmd = Command::new(persist);
            cmd.arg("--upstream")
                .arg(format!("http://{up_addr}"))
                .args(["--backend", "sqlite", "--url"])
                .arg(scratch.path().join("persist.db"))
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(scratch.path().join("persist.log"))?);
            let (p, addr) =
                Proc::spawn_listening("mcp-persist", cmd, None, port, Duration::from_secs(30))
                    .await?;
            stand.targets.push(Target::new(
                "mcp-persist",
                addr,
                "/mcp",
                "echo",
                Some(p.pid()),
            ));
            stand.proxies.push(p);
        }
        Err(e) => writeln!(notes, "mcp-persist skipped: {e:#}")?,
    }
    let (floor, target) = start_floor(up_addr).await?;
    stand.targets.push(target);
    stand.proxies.push(floor);
    let mut out = small::table("peers", &stand.targets, o).await?;
    out.push_str(&notes);
    Ok(out)
}
