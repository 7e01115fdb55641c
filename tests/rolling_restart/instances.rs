//! Proxy instances that outlive their processes: an instance keeps its
//! address and data dir across a stop and the next start, and each start
//! logs to a file of its own, read back for failure messages. It starts
//! processes and waits for their exit; it must not signal them or decide
//! when to restart them: the tests do.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::timeline::Timeline;
use crate::common::process::{free_addr, ProxyProcess};

/// A proxy process whose address and data dir outlive it, started again
/// on both after each stop; each start logs to a file of its own.
pub struct Instance {
    pub name: &'static str,
    proxy: Option<ProxyProcess>,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
    args: Vec<String>,
    logs: PathBuf,
    starts: usize,
}

impl Instance {
    pub async fn start(name: &'static str, args: Vec<String>, logs: &Path) -> Instance {
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

    pub async fn restart(&mut self) {
        self.starts += 1;
        let log = self.logs.join(format!("{}-{}.log", self.name, self.starts));
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.proxy =
            Some(ProxyProcess::start_logged(&args, self.dir.path(), self.addr, &[], &log).await);
    }

    pub fn proxy(&mut self) -> &mut ProxyProcess {
        self.proxy.as_mut().expect("running")
    }

    /// What each start of it logged (warnings and errors).
    pub fn logged(&self) -> String {
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
pub async fn exited_cleanly(instance: &mut Instance, timeline: &Timeline) {
    let status = instance.proxy().exited().await;
    timeline.note(format!("instance {} exited ({status})", instance.name));
    assert!(status.success(), "instance {}: {status}", instance.name);
}
