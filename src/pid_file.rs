//! The running proxy's process id, in `data_dir/mcp-resume-proxy.pid`, so
//! that `mcp-resume-proxy reload` finds the process to send SIGHUP to.
//! Written once the proxy serves and removed when it stops; a file that a
//! killed process left behind is told apart from a running proxy by what
//! runs under its pid now.

use std::path::{Path, PathBuf};

/// The file's name in the data directory.
pub const NAME: &str = "mcp-resume-proxy.pid";

/// The pid file of this process; removed when dropped.
pub struct PidFile(PathBuf);

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes this process's id into `data_dir`.
pub fn write(data_dir: &Path) -> std::io::Result<PidFile> {
    let path = data_dir.join(NAME);
    std::fs::write(&path, format!("{}\n", std::process::id()))?;
    Ok(PidFile(path))
}

/// Sends SIGHUP to the proxy running on `data_dir`; its pid, or why not.
pub fn signal_reload(data_dir: &Path) -> Result<u32, String> {
    let path = data_dir.join(NAME);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "no running proxy on {} ({}: {e})",
            data_dir.display(),
            path.display()
        )
    })?;
    let pid: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{} holds no process id: {text:?}", path.display()))?;
    if !is_a_proxy(pid) {
        return Err(format!(
            "no running proxy on {}: process {pid} ({}) is gone or is another program",
            data_dir.display(),
            path.display()
        ));
    }
    let pid_t = libc::pid_t::try_from(pid).map_err(|_| format!("pid {pid} is out of range"))?;
    // SAFETY: kill(2) has no memory effects; the pid was checked above.
    if unsafe { libc::kill(pid_t, libc::SIGHUP) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("cannot signal process {pid}: {e}"));
    }
    Ok(pid)
}

/// Whether `pid` runs the same program as this one (Linux: its `exe`);
/// elsewhere, whether it runs at all.
fn is_a_proxy(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
    match (exe, std::env::current_exe()) {
        (Ok(theirs), Ok(ours)) => program(&theirs) == program(&ours),
        _ => libc::pid_t::try_from(pid)
            // SAFETY: signal 0 only checks that the process exists.
            .is_ok_and(|pid| unsafe { libc::kill(pid, 0) } == 0),
    }
}

/// A program's file name, as `/proc` shows it: an executable replaced on
/// disk since it started (an upgrade) reads `NAME (deleted)`.
fn program(exe: &Path) -> Option<String> {
    let name = exe.file_name()?.to_string_lossy();
    Some(name.trim_end_matches(" (deleted)").to_owned())
}
