//! Waiting out a Redis Cluster failover ([`wait_out`]): a command to the
//! node serving the log's slot that fails as a failover makes commands
//! fail — the node gone (refused, cut, timed out), or answering
//! `CLUSTERDOWN`, `READONLY`, `TRYAGAIN`, `MASTERDOWN`, `LOADING`, a
//! redirection the client ran out of retries on — is sent again, after a
//! pause that doubles from 50 ms to 1 s, until it is answered, fails
//! otherwise, or [`FAILOVER_WAIT`] passed. It also keeps the outage
//! ([`Outage`]): one line in the log when it begins and one when it ends,
//! and its reason for `/readyz` meanwhile.
//!
//! Why a wait of our own: redis-rs' cluster client counts its retries
//! (`cluster.rs` gives it 20) rather than timing them, and sleeps only
//! before some: a connection refused or cut, or a write refused with
//! `READONLY`, is retried at once (after a reconnection or a slot-map
//! refresh). Between the kill of a primary and the moment the cluster
//! calls it failed (`cluster-node-timeout`) every node still names it for
//! the slot, so those retries can all be spent well within a second,
//! long before a replica is promoted.
//!
//! It must not decide what a write sent twice means; what may be sent
//! again is the cluster client's rule already (it sends a command again
//! by itself after a connection broke): an append carries a name so that
//! the script applies it once (`write.rs`), the other scripts are
//! idempotent but a task's compare-and-set, which refuses a second run.
//! It knows nothing of slots or connections: the caller sends.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tokio::time::Instant;

/// How long a command waits for the cluster to promote a replica of the
/// primary serving the log's slot, besides its own response time: the
/// cluster calls a silent primary failed after `cluster-node-timeout`
/// (15 s by default), then its replicas hold an election (0.5 to 1 s, plus
/// 1 s per replica ahead in replication) and the winner takes the slot.
/// 30 s is that twice over with the default, as a command waits for the
/// sentinels (`sentinel.rs`); a cluster whose `cluster-node-timeout` is
/// above some 25 s fails over slower than writes wait.
pub const FAILOVER_WAIT: Duration = Duration::from_secs(30);
/// The first pause before a command is sent again; doubled each time.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause: a promotion is seen within a second of it.
const LAST_PAUSE: Duration = Duration::from_secs(1);

/// An outage of the node serving the log's slot, while there is one.
#[derive(Default)]
pub(super) struct Outage {
    /// Whether there is one: read by every answered command, so without
    /// the lock.
    on: AtomicBool,
    /// When it began, and why.
    since: Mutex<Option<(Instant, String)>>,
}

impl Outage {
    /// Why the slot's node is away, while it is.
    pub fn failing(&self) -> Option<String> {
        let since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        since.as_ref().map(|(_, why)| why.clone())
    }

    /// A command failed as a failover makes it: said once per outage.
    fn began(&self, e: &RedisError, nodes: &str) {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if since.is_some() {
            return;
        }
        let why = format!("the Redis Cluster node serving the log's slot is away ({nodes}): {e}");
        tracing::warn!(error = %e, nodes, wait = ?FAILOVER_WAIT, "the Redis Cluster node serving the log's slot is away; commands wait for a failover");
        *since = Some((Instant::now(), why));
        self.on.store(true, Ordering::Relaxed);
    }

    /// A command was answered: the outage, if any, is over.
    fn ended(&self) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, _)) = since.take() {
            tracing::warn!(after = ?at.elapsed(), "the Redis Cluster serves the log's slot again");
        }
        self.on.store(false, Ordering::Relaxed);
    }
}

/// Whether `e` is how a command fails while the slot's primary is away or
/// being replaced (see the module's doc).
fn away(e: &RedisError) -> bool {
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => true,
        // A transaction a demoted primary refused: queued, never run.
        ErrorKind::Server(ServerErrorKind::ExecAbort) => e.to_string().contains("READONLY"),
        ErrorKind::ClusterConnectionNotFound | ErrorKind::Io => true,
        _ => false,
    }
}

/// Sends what `send` makes until it is answered, or fails with no sign of
/// a failover, or `wait` passed (the last try cut then), keeping `outage`
/// of the cluster at `nodes`. A store's commands wait [`FAILOVER_WAIT`]
/// plus their own response timeout, so that a slow answer is never cut.
pub(super) async fn wait_out<T, F, Fut>(
    outage: &Outage,
    nodes: &str,
    wait: Duration,
    mut send: F,
) -> RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let until = Instant::now() + wait;
    let mut pause = FIRST_PAUSE;
    loop {
        let e = match tokio::time::timeout_at(until, send()).await {
            Ok(Ok(answer)) => {
                outage.ended();
                return Ok(answer);
            }
            Ok(Err(e)) => e,
            Err(_) => return Err(too_long(outage, wait)),
        };
        if !away(&e) || Instant::now() + pause >= until {
            return Err(e);
        }
        outage.began(&e, nodes);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LAST_PAUSE);
    }
}

/// The error of a command cut at the end of `wait`: it may have run.
fn too_long(outage: &Outage, wait: Duration) -> RedisError {
    let why = outage.failing().unwrap_or_default();
    RedisError::from((
        ErrorKind::Io,
        "no answer from the Redis Cluster",
        format!("within {wait:?}: {why}"),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    /// Long enough for the pauses of a few tries, short for a test.
    const WAIT: Duration = Duration::from_millis(600);

    fn server(code: &str) -> RedisError {
        let reply = format!("-{code} something\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_gone_or_refusing_during_a_failover_is_waited_for() {
        for code in [
            "CLUSTERDOWN",
            "READONLY",
            "TRYAGAIN",
            "MASTERDOWN",
            "LOADING",
        ] {
            assert!(away(&server(code)), "{code}");
        }
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let cut = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(away(&refused) && away(&cut));
    }

    #[test]
    fn an_error_of_the_command_itself_is_not_waited_for() {
        for code in ["WRONGTYPE", "NOSCRIPT", "NOPERM", "CROSSSLOT", "ERR"] {
            assert!(!away(&server(code)), "{code}");
        }
    }

    #[tokio::test]
    async fn a_command_is_sent_again_until_the_new_primary_answers_and_the_outage_ends() {
        let outage = Outage::default();
        let sent = AtomicU32::new(0);
        let answer = wait_out(&outage, "n", WAIT, || async {
            match sent.fetch_add(1, Ordering::Relaxed) {
                0..=2 => Err(server("CLUSTERDOWN")),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(answer.ok(), Some(7));
        assert_eq!(sent.load(Ordering::Relaxed), 4);
        assert_eq!(outage.failing(), None);
    }

    #[tokio::test]
    async fn a_failover_longer_than_the_wait_fails_the_command_with_its_reason() {
        let outage = Outage::default();
        let answer: RedisResult<()> =
            wait_out(&outage, "n", WAIT, || async { Err(server("CLUSTERDOWN")) }).await;
        let e = answer.expect_err("no primary ever");
        assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::ClusterDown));
        let why = outage.failing().expect("the outage, for /readyz");
        assert!(why.contains("ClusterDown"), "{why}");
    }

    #[tokio::test]
    async fn an_error_of_the_command_fails_it_at_once() {
        let outage = Outage::default();
        let sent = AtomicU32::new(0);
        let answer: RedisResult<()> = wait_out(&outage, "n", WAIT, || async {
            sent.fetch_add(1, Ordering::Relaxed);
            Err(server("WRONGTYPE"))
        })
        .await;
        assert!(answer.is_err());
        assert_eq!(sent.load(Ordering::Relaxed), 1);
        assert_eq!(outage.failing(), None);
    }
}
