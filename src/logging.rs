//! How the process's log lines reach stderr: each is formatted on the
//! thread that logs it and appended to one buffer in memory, which a thread
//! of its own writes out every [`FLUSH_EVERY`] — the way nginx buffers its
//! access log (`buffer=… flush=…`).
//!
//! A request's access line thus costs its formatting and a copy: no system
//! call and no thread woken per line (writing each line to stderr, or
//! handing each to a writer thread, cost a busy proxy 11 % of its
//! throughput). The price is that a line shows up to [`FLUSH_EVERY`] late,
//! and that a process killed with `SIGKILL` loses the lines of its last
//! [`FLUSH_EVERY`]; a graceful stop writes everything (the [`Flusher`]
//! guard). A buffer past [`WRITE_AT`] bytes is written out by the thread
//! that filled it, so memory stays bounded when stderr is slow: then the
//! logging thread waits, and nothing is dropped.
//!
//! A line whose fields are known ahead, the access line, may skip the
//! subscriber and be appended ready-spelled ([`direct`]): with colours off,
//! which is when its spelling and the subscriber's are the same bytes.
//!
//! It must not log itself (a failed write of the log has nowhere to go).

use std::cell::RefCell;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;

/// How often buffered lines are written out.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Past this many bytes buffered, the thread that logs writes them out.
pub const WRITE_AT: usize = 1 << 20;

/// Lines waiting to be written to stderr.
#[derive(Default)]
struct Pending {
    lines: Mutex<Buffer>,
    /// Wakes the flusher early, to stop.
    stop: Condvar,
}

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    stopping: bool,
}

impl Pending {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A buffer of bytes has no invariant a panic could break.
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes out what is buffered, the lock released while it writes.
    fn write_out(&self, spare: &mut Vec<u8>) {
        std::mem::swap(&mut self.lock().bytes, spare);
        if !spare.is_empty() {
            let _ = std::io::stderr().lock().write_all(spare);
            spare.clear();
        }
    }
}

/// Writes whatever is still buffered when dropped, and stops the thread
/// that writes the rest of the time.
pub struct Flusher {
    pending: Arc<Pending>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.pending.lock().stopping = true;
        self.pending.stop.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.pending.write_out(&mut Vec::new());
    }
}

/// The writer the subscriber formats each line into.
#[derive(Clone)]
struct Lines(Arc<Pending>);

/// One line's writer: appends to the shared buffer.
struct LineWriter<'a>(&'a Pending);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let full = {
            let mut lines = self.0.lock();
            lines.bytes.extend_from_slice(buf);
            (lines.bytes.len() >= WRITE_AT).then(|| std::mem::take(&mut lines.bytes))
        };
        if let Some(full) = full {
            std::io::stderr().lock().write_all(&full)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(&self.0)
    }
}

/// The process's log buffer, for lines spelled by their writer.
pub struct Direct {
    pending: Arc<Pending>,
    format: LogFormat,
}

/// Set by [`init`] when lines are written without colours.
static DIRECT: OnceLock<Direct> = OnceLock::new();

thread_local! {
    /// Where a line is spelled before it is appended: the buffer's lock
    /// is held for a copy, not for the spelling.
    static SPELLING: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The log buffer, when [`init`] set one up and lines are written in a
/// format a writer can spell itself; else lines go through the subscriber.
pub fn direct() -> Option<&'static Direct> {
    DIRECT.get()
}

impl Direct {
    /// Appends the line `spell` writes (in the log's format, newline
    /// included) to the buffer.
    pub fn append_with(&self, spell: impl FnOnce(&mut Vec<u8>, LogFormat)) {
        SPELLING.with_borrow_mut(|line| {
            line.clear();
            spell(line, self.format);
            // Writing to stderr can only fail as the process's stderr does.
            let _ = LineWriter(&self.pending).write(line);
        });
    }
}

/// Sets the process's subscriber: `RUST_LOG` (else `info`), in `format`,
/// to stderr through the buffer. Keep the guard until the end of `main`.
pub fn init(format: LogFormat) -> Flusher {
    let pending = Arc::new(Pending::default());
    let thread = {
        let pending = pending.clone();
        std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || flush_until_stopped(&pending))
            .ok()
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a terminal: a log file or journald gets plain text.
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(terminal)
        .with_writer(Lines(pending.clone()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    if !terminal {
        let direct = Direct {
            pending: pending.clone(),
            format,
        };
        let _ = DIRECT.set(direct);
    }
    Flusher { pending, thread }
}

fn flush_until_stopped(pending: &Pending) {
    let mut spare = Vec::new();
    loop {
        let stopping = {
            let lines = pending.lock();
            let (lines, _) = pending
                .stop
                .wait_timeout_while(lines, FLUSH_EVERY, |l| !l.stopping)
                .unwrap_or_else(|p| p.into_inner());
            lines.stopping
        };
        pending.write_out(&mut spare);
        if stopping {
            return;
        }
    }
}
