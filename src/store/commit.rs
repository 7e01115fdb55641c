//! Group commit: many concurrent writers share one flush.
//!
//! A writer that needs its inserts durable takes a ticket *after* inserting and
//! waits until a flush that started after its ticket has completed. At most
//! one flush runs at a time; every writer that arrived while it ran is covered
//! by the next one. Under load this turns N fsyncs into about one per flush
//! duration, while a lone writer pays exactly one flush.
//!
//! This module owns only the scheduling; what "flush" means is the backend's.

use std::sync::{Arc, Mutex};

use serde::Deserialize;
use tokio::sync::watch;

/// How hard `append` works before returning (`[store] sync`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Flush (fsync) once per append: the slowest, simplest guarantee.
    Always,
    /// Group commit: appends wait for a shared flush. Survives kill -9 and,
    /// as far as the disk honours fsync, power loss.
    #[default]
    Batch,
    /// Return at once; the backend flushes in the background. Entries of the
    /// last flush interval can be lost on kill -9.
    Never,
}

type FlushFn = dyn Fn() -> std::io::Result<()> + Send + Sync;

#[derive(Default)]
struct Queue {
    /// Tickets handed out so far.
    issued: u64,
    running: bool,
}

/// The outcome of finished flushes: every ticket up to `attempted` has seen a
/// flush finish, and every ticket up to `covered` is durable.
#[derive(Clone, Copy, Default)]
struct Done {
    attempted: u64,
    covered: u64,
}

pub struct GroupCommit {
    mode: SyncMode,
    flush: Arc<FlushFn>,
    queue: Mutex<Queue>,
    done: watch::Sender<Done>,
}

impl GroupCommit {
    pub fn new(mode: SyncMode, flush: Arc<FlushFn>) -> Arc<Self> {
        Arc::new(Self {
            mode,
            flush,
            queue: Mutex::new(Queue::default()),
            done: watch::Sender::new(Done::default()),
        })
    }

    /// Returns once everything inserted before the call is durable per the
    /// mode.
    pub async fn durable(self: &Arc<Self>) -> std::io::Result<()> {
        match self.mode {
            SyncMode::Never => Ok(()),
            SyncMode::Always => {
                let flush = self.flush.clone();
                tokio::task::spawn_blocking(move || flush())
                    .await
                    .map_err(std::io::Error::other)?
            }
            SyncMode::Batch => self.batched().await,
        }
    }

    async fn batched(self: &Arc<Self>) -> std::io::Result<()> {
        let mut done = self.done.subscribe();
        let (ticket, lead) = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.issued += 1;
            let lead = !q.running;
            q.running = true;
            (q.issued, lead)
        };
        if lead {
            tokio::spawn(self.clone().run());
        }
        let outcome = *done
            .wait_for(|d| d.attempted >= ticket)
            .await
            .map_err(|_| std::io::Error::other("group commit stopped"))?;
        if outcome.covered >= ticket {
            Ok(())
        } else {
            Err(std::io::Error::other("flush failed"))
        }
    }

    /// The flusher: flushes until no ticket is waiting, then stops. Runs as
    /// its own task so a cancelled writer cannot strand the others.
    async fn run(self: Arc<Self>) {
        loop {
            let target = self.queue.lock().unwrap_or_else(|p| p.into_inner()).issued;
            let flush = self.flush.clone();
            let result = tokio::task::spawn_blocking(move || flush()).await;
            let ok = matches!(result, Ok(Ok(())));
            if !ok {
                tracing::error!(?result, "log flush failed");
            }
            self.done.send_modify(|d| {
                d.attempted = target;
                if ok {
                    d.covered = target;
                }
            });
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.issued == target {
                q.running = false;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[tokio::test]
    async fn concurrent_writers_share_flushes() {
        let flushes = Arc::new(AtomicU64::new(0));
        let counter = flushes.clone();
        let commit = GroupCommit::new(
            SyncMode::Batch,
            Arc::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(5));
                Ok(())
            }),
        );
        let writers: Vec<_> = (0..50)
            .map(|_| {
                let c = commit.clone();
                tokio::spawn(async move { c.durable().await })
            })
            .collect();
        for w in writers {
            w.await.unwrap().unwrap();
        }
        let n = flushes.load(Ordering::SeqCst);
        assert!((1..50).contains(&n), "{n} flushes for 50 writers");
    }

    #[tokio::test]
    async fn never_mode_does_not_flush() {
        let commit = GroupCommit::new(SyncMode::Never, Arc::new(|| panic!("flushed")));
        commit.durable().await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_flush_is_reported_to_its_writers() {
        let commit = GroupCommit::new(
            SyncMode::Batch,
            Arc::new(|| Err(std::io::Error::other("disk full"))),
        );
        assert!(commit.durable().await.is_err());
    }
}
