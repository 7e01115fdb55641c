//! The active health check of an HTTP upstream's replicas (`health_path`):
//! every `health_every_ms`, each replica is asked; a failed check (not a
//! 2xx, or no answer within the interval) counts toward its ejection
//! exactly as a failed request does, and a passing one puts an ejected
//! replica back at once instead of at the end of its back-off. Clients'
//! requests then seldom meet a replica that went bad between two of them.
//!
//! This owns the rhythm only: how a replica is asked is the caller's
//! (`http.rs`), and what a failure does to it is `replicas.rs`'s.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::replicas::{Replica, Replicas};

/// One check of one replica: `Err` says why it failed.
pub type Check = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Checks every replica every `every` (the first time at once), until
/// `stop` or until the replicas are dropped.
pub async fn check_every<C: Send + Sync + 'static>(
    replicas: Weak<Replicas<C>>,
    every: Duration,
    check: impl Fn(Arc<Replica<C>>) -> Check,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let Some(replicas) = replicas.upgrade() else {
            return;
        };
        let all = replicas.all();
        let checks = all.iter().map(|replica| {
            let replica = replica.clone();
            // A check gets the interval at most: the next one is due.
            let asked = tokio::time::timeout(every, check(replica.clone()));
            async move { (replica, asked.await) }
        });
        let outcomes = tokio::select! {
            () = stop.cancelled() => return,
            outcomes = futures_util::future::join_all(checks) => outcomes,
        };
        for (replica, outcome) in outcomes {
            match outcome {
                Ok(Ok(())) => replicas.succeeded(&replica),
                Ok(Err(why)) => replicas.failed(&replica, &format!("health check: {why}")),
                Err(_) => replicas.failed(&replica, "health check: no answer in time"),
            }
        }
    }
}
