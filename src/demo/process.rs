//! The demo's upstream as a process of its own, so that it outlives a
//! `kill -9` of the demo as a real upstream outlives its proxy: the demo
//! started again on the same data directory adopts it, and a call the kill
//! cut carries on to its result (the walkthrough's step 3). In the demo's
//! own process the upstream would die with the proxy, and every resumed call
//! would end with "the upstream lost the session".
//!
//! `data_dir/demo-upstream` holds `<upstream pid> <address> <owner pid>`. A
//! demo adopts the upstream the file names when that one still answers and
//! its owner is gone; otherwise it starts a new one. The upstream exits when
//! its owner stops it (Ctrl-C of the demo), and when for [`ORPHAN_GRACE`] the
//! file has named no live owner of it (a demo killed and not started again),
//! so nothing is left running for good.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::upstream::{DemoOptions, DemoUpstream};

/// How long an upstream whose demo was killed waits to be adopted.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(60);
/// The hidden subcommand that runs the upstream process.
pub const SUBCOMMAND: &str = "demo-upstream";
const FILE: &str = "demo-upstream";
/// How often the upstream looks for its owner.
const OWNER_CHECK: Duration = Duration::from_secs(1);

/// What `data_dir/demo-upstream` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    pid: u32,
    addr: SocketAddr,
    owner: u32,
}

impl Record {
    /// The record in `file`, if there is a whole one.
    fn read(file: &Path) -> Option<Record> {
        let text = std::fs::read_to_string(file).ok()?;
        let mut words = text.split_whitespace();
        let record = Record {
            pid: words.next()?.parse().ok()?,
            addr: words.next()?.parse().ok()?,
            owner: words.next()?.parse().ok()?,
        };
        words.next().is_none().then_some(record)
    }

    /// Written whole or not at all: the upstream reads it while it changes.
    fn write(&self, file: &Path) -> std::io::Result<()> {
        let temp = file.with_extension("new");
        std::fs::write(
            &temp,
            format!("{} {} {}\n", self.pid, self.addr, self.owner),
        )?;
        std::fs::rename(temp, file)
    }
}

/// Whether a process with this id runs (a zombie, dead but not yet reaped,
/// does not).
fn alive(pid: u32) -> bool {
    let Ok(id) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(id, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the command name, which is in parentheses.
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|s| s == "Z")
        })
        .unwrap_or(false);
    exists && !zombie
}

async fn answers(addr: SocketAddr) -> bool {
    let connect = tokio::net::TcpStream::connect(addr);
    matches!(
        tokio::time::timeout(Duration::from_secs(1), connect).await,
        Ok(Ok(_))
    )
}

/// The demo's upstream process, as its owner sees it.
#[derive(Debug)]
pub struct UpstreamProcess {
    pid: u32,
    addr: SocketAddr,
    file: PathBuf,
    /// Set when this demo started it (and so reaps it).
    child: Option<tokio::process::Child>,
}

impl UpstreamProcess {
    /// Adopts the upstream a killed demo left in `data_dir`, or starts one.
    pub async fn adopt_or_start(data_dir: &Path) -> anyhow::Result<UpstreamProcess> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let file = data_dir.join(FILE);
        let me = std::process::id();
        if let Some(left) = Record::read(&file) {
            if alive(left.pid) && !alive(left.owner) && answers(left.addr).await {
                Record { owner: me, ..left }.write(&file)?;
                return Ok(UpstreamProcess {
                    pid: left.pid,
                    addr: left.addr,
                    file,
                    child: None,
                });
            }
        }
        let exe = std::env::current_exe().context("cannot find the demo's own program")?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg(SUBCOMMAND)
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Not in the terminal's foreground group: Ctrl-C reaches the
            // demo, which stops its upstream itself.
            .process_group(0);
        let mut child = command.spawn().context("cannot start the demo upstream")?;
        let pid = child.id().context("the demo upstream exited at once")?;
        let stdout = child.stdout.take().context("the demo upstream's stdout")?;
        let mut line = String::new();
        let mut stdout = BufReader::new(stdout);
        tokio::time::timeout(Duration::from_secs(20), stdout.read_line(&mut line))
            .await
            .context("the demo upstream did not say its address")??;
        let addr: SocketAddr = line
            .trim()
            .parse()
            .with_context(|| format!("the demo upstream said {line:?}, not its address"))?;
        Record {
            pid,
            addr,
            owner: me,
        }
        .write(&file)?;
        Ok(UpstreamProcess {
            pid,
            addr,
            file,
            child: Some(child),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Ends the upstream (SIGTERM) and forgets it.
    pub async fn stop(mut self) {
        let _ = std::fs::remove_file(&self.file);
        if let Ok(pid) = libc::pid_t::try_from(self.pid) {
            // SAFETY: kill(2) on the upstream this demo started or adopted.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        if let Some(child) = &mut self.child {
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
    }
}

/// The upstream process: serves the demo upstream on a free loopback port,
/// prints its address on stdout, and runs until SIGTERM or SIGINT, or until
/// `file` has named no live owner of it for [`ORPHAN_GRACE`].
pub async fn serve(file: &Path) -> anyhow::Result<()> {
    // Modern requests too, so that step 5 (tasks) has a modern upstream.
    let options = DemoOptions {
        modern: true,
        ..DemoOptions::default()
    };
    let upstream = DemoUpstream::spawn(([127, 0, 0, 1], 0).into(), options).await?;
    println!("{}", upstream.addr);
    let me = std::process::id();
    let owned = || Record::read(file).is_some_and(|r| r.pid == me && alive(r.owner));
    let orphaned = async {
        let mut unowned = Duration::ZERO;
        while unowned < ORPHAN_GRACE {
            tokio::time::sleep(OWNER_CHECK).await;
            unowned = if owned() {
                Duration::ZERO
            } else {
                unowned + OWNER_CHECK
            };
        }
    };
    tokio::select! {
        () = crate::shutdown_signal() => {}
        () = orphaned => {}
    }
    upstream.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_read_back_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(FILE);
        let record = Record {
            pid: 12,
            addr: "127.0.0.1:4000".parse().unwrap(),
            owner: 34,
        };
        record.write(&file).unwrap();
        assert_eq!(Record::read(&file), Some(record));
        std::fs::write(&file, "12 127.0.0.1:4000").unwrap();
        assert_eq!(Record::read(&file), None);
        std::fs::write(&file, "12 127.0.0.1:4000 34 56").unwrap();
        assert_eq!(Record::read(&file), None);
    }

    #[test]
    fn this_process_is_alive_and_a_pid_beyond_the_limit_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX));
    }
}
