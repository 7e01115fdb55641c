//! The replicas of one HTTP upstream (`urls`, or the one `url`): which one a
//! request goes to, and whether each is fit to take work. A session's
//! requests go to the replica that created its upstream session (named in
//! its record, so another instance or a restarted proxy sends them there
//! too); a request of no session yet goes to the least busy healthy
//! replica — fewest requests in flight, ties taken in turn. Health is
//! passive: `eject_after` consecutive failures (no connection, HTTP 502 to
//! 504, a timeout) take a replica out for `eject_ms`, doubled each time it
//! fails again on its return, and a success puts it back for good.
//!
//! This owns the choice and the counts only: it sends nothing, and moving a
//! session off a replica (re-initializing it on another) is `renew.rs`'s.
//! A replica is named by its URL as configured, which is what records keep
//! when there are several: a replica dropped from the configuration is one
//! a session must leave. A lone replica is never out, nor named.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Uri;

use crate::session::Session;
use crate::store::SessionRecord;

/// The longest ejection, in multiples of `eject_ms`.
const MAX_BACKOFF: u32 = 32;

/// Where a session's requests go upstream: the upstream's own session id
/// and the replica that issued it. Empty for a request of no session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    pub session: Option<String>,
    pub replica: Option<String>,
}

impl Binding {
    /// Bound to nothing: any healthy replica will do.
    pub const NONE: Binding = Binding {
        session: None,
        replica: None,
    };

    pub fn of(session: &Session) -> Self {
        session.read(Self::of_record)
    }

    pub fn of_record(record: &SessionRecord) -> Self {
        Self {
            session: record.upstream_session.clone(),
            replica: record.upstream_replica.clone(),
        }
    }
}

/// How failures take a replica out.
#[derive(Clone, Copy, Debug)]
pub struct Ejection {
    pub after: u32,
    pub base: Duration,
}

pub struct Replica {
    /// The URL as configured: the name session records keep.
    pub name: Arc<str>,
    pub url: Uri,
    in_flight: Arc<AtomicUsize>,
    /// Set while `health` holds a failure: every request reads it, and
    /// only a replica in trouble costs a lock.
    troubled: AtomicBool,
    health: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    /// Consecutive failures; kept through an ejection, so one more failure
    /// on return takes the replica out again at once.
    failures: u32,
    /// Ejections since the last success: each doubles the next.
    ejections: u32,
    out_until: Option<Instant>,
}

pub struct Replicas {
    replicas: Box<[Replica]>,
    ejection: Ejection,
    /// Where the search for the least busy starts, so ties take turns.
    turn: AtomicUsize,
}

impl Replicas {
    /// The replicas at `urls`; refuses an unparsable one (the configuration
    /// check names its key before this runs).
    pub fn new(urls: &[&str], ejection: Ejection) -> Result<Self, String> {
        if urls.is_empty() {
            return Err("an upstream needs at least one url".into());
        }
        let replicas = urls
            .iter()
            .map(|text| {
                let url: Uri = text
                    .parse()
                    .map_err(|e| format!("upstream url {text:?}: {e}"))?;
                Ok(Replica {
                    name: Arc::from(*text),
                    url,
                    in_flight: Arc::default(),
                    troubled: AtomicBool::new(false),
                    health: Mutex::default(),
                })
            })
            .collect::<Result<Box<[_]>, String>>()?;
        Ok(Self {
            replicas,
            ejection,
            turn: AtomicUsize::new(0),
        })
    }

    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    pub fn get(&self, i: usize) -> &Replica {
        &self.replicas[i % self.replicas.len()]
    }

    pub fn first(&self) -> &Replica {
        self.get(0)
    }

    /// What a session record keeps of replica `i`: its name, when there is
    /// a choice of replicas (with one `url`, records stay as they were, and
    /// a changed `url` is tried with the session before any renewal).
    pub fn name_of(&self, i: usize) -> Option<String> {
        (self.len() > 1).then(|| self.get(i).name.to_string())
    }

    /// The replica named `name`, if it is still configured.
    pub fn named(&self, name: &str) -> Option<usize> {
        self.replicas.iter().position(|r| &*r.name == name)
    }

    /// Where a request bound to `binding` goes: its session's replica,
    /// healthy or not (no other one knows the session), else the least busy.
    pub fn route(&self, binding: &Binding) -> usize {
        match binding.replica.as_deref().and_then(|n| self.named(n)) {
            Some(i) => i,
            None => self.least_busy(None),
        }
    }

    /// Whether a session bound to `binding` must leave its replica before
    /// its next request: the replica was dropped from the configuration or
    /// is out, and there is another to go to.
    pub fn must_leave(&self, binding: &Binding) -> bool {
        let Some(name) = binding.replica.as_deref() else {
            return false;
        };
        match self.named(name) {
            None => true,
            Some(i) => self.len() > 1 && !self.get(i).healthy(Instant::now()),
        }
    }

    /// The healthy replica with the fewest requests in flight, other than
    /// `avoid` when there is a choice. With none healthy, the one back the
    /// soonest: a request must go somewhere, and it may find it recovered.
    pub fn least_busy(&self, avoid: Option<usize>) -> usize {
        let now = Instant::now();
        let n = self.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        let order = (0..n).map(|k| (start + k) % n);
        let usable = |i: &usize| Some(*i) != avoid || n == 1;
        let healthy = order
            .clone()
            .filter(usable)
            .filter(|&i| self.get(i).healthy(now))
            .min_by_key(|&i| self.get(i).in_flight());
        healthy.unwrap_or_else(|| {
            order
                .filter(usable)
                .min_by_key(|&i| self.get(i).back_at())
                .unwrap_or(start)
        })
    }

    /// Counts a request on replica `i` until the returned guard (and every
    /// clone of it) is dropped: with the response body it is read from.
    pub fn start(&self, i: usize) -> InFlight {
        let counter = self.get(i).in_flight.clone();
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::new(Counted(counter)))
    }

    /// Replica `i` answered: it is healthy again.
    pub fn succeeded(&self, i: usize) {
        let replica = self.get(i);
        if !replica.troubled.load(Ordering::Relaxed) {
            return;
        }
        let mut health = replica.lock();
        if health.out_until.is_some() {
            tracing::info!(replica = %replica.name, "upstream replica answers again");
        }
        *health = Health::default();
        replica.troubled.store(false, Ordering::Relaxed);
    }

    /// Replica `i` failed (`why`): past `eject_after` in a row, it is out.
    /// A lone replica is never out: there is nowhere else to go.
    pub fn failed(&self, i: usize, why: &str) {
        if self.len() == 1 {
            return;
        }
        let replica = self.get(i);
        let mut health = replica.lock();
        replica.troubled.store(true, Ordering::Relaxed);
        health.failures = health.failures.saturating_add(1);
        if health.failures < self.ejection.after {
            return;
        }
        let now = Instant::now();
        if health.out_until.is_some_and(|until| until > now) {
            return;
        }
        let factor = 1u32 << health.ejections.min(MAX_BACKOFF.trailing_zeros());
        let out_for = self.ejection.base.saturating_mul(factor);
        health.ejections = health.ejections.saturating_add(1);
        health.out_until = Some(now + out_for);
        tracing::warn!(
            replica = %replica.name,
            failures = health.failures,
            out_ms = out_for.as_millis() as u64,
            error = why,
            "upstream replica taken out"
        );
    }
}

impl Replica {
    fn lock(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether it takes work at `now`: not out, or back from being out.
    pub fn healthy(&self, now: Instant) -> bool {
        !self.troubled.load(Ordering::Relaxed)
            || self.lock().out_until.is_none_or(|until| until <= now)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// When it takes work again (`None`: it does now).
    fn back_at(&self) -> Option<Instant> {
        self.lock().out_until
    }
}

/// One request counted in flight on a replica. Cloneable because a
/// response's extensions must be; the count drops with the last clone.
#[derive(Clone)]
pub struct InFlight(#[allow(dead_code)] Arc<Counted>);

struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three(after: u32, base_ms: u64) -> Replicas {
        let ejection = Ejection {
            after,
            base: Duration::from_millis(base_ms),
        };
        Replicas::new(&["http://a/mcp", "http://b/mcp", "http://c/mcp"], ejection).unwrap()
    }

    fn bound_to(name: &str) -> Binding {
        Binding {
            session: Some("s".into()),
            replica: Some(name.into()),
        }
    }

    #[test]
    fn ties_take_turns() {
        let r = three(1, 1_000);
        let picked: Vec<usize> = (0..6).map(|_| r.least_busy(None)).collect();
        assert_eq!(picked, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn the_least_busy_healthy_replica_is_chosen() {
        let r = three(1, 60_000);
        let _a = [r.start(0), r.start(0)];
        let _b = r.start(1);
        for _ in 0..3 {
            assert_eq!(r.least_busy(None), 2);
        }
        r.failed(2, "refused");
        for _ in 0..3 {
            assert_eq!(r.least_busy(None), 1);
        }
        drop(_a);
        assert_eq!(r.get(0).in_flight(), 0);
        assert_eq!(r.least_busy(None), 0);
    }

    #[test]
    fn a_bound_session_stays_on_its_replica_even_when_it_is_out() {
        let r = three(1, 60_000);
        let _busy = [r.start(1), r.start(1)];
        assert_eq!(r.route(&bound_to("http://b/mcp")), 1);
        assert!(!r.must_leave(&bound_to("http://b/mcp")));
        r.failed(1, "refused");
        assert_eq!(r.route(&bound_to("http://b/mcp")), 1);
        assert!(r.must_leave(&bound_to("http://b/mcp")));
    }

    #[test]
    fn a_session_of_a_replica_no_longer_configured_must_leave() {
        let r = three(1, 1_000);
        assert!(r.must_leave(&bound_to("http://gone/mcp")));
        assert!(!r.must_leave(&Binding::NONE));
        assert_ne!(r.route(&bound_to("http://gone/mcp")), usize::MAX);
    }

    #[test]
    fn failures_eject_only_when_consecutive() {
        let r = three(3, 60_000);
        r.failed(0, "502");
        r.failed(0, "502");
        r.succeeded(0);
        r.failed(0, "502");
        r.failed(0, "502");
        assert!(r.get(0).healthy(Instant::now()));
        r.failed(0, "502");
        assert!(!r.get(0).healthy(Instant::now()));
    }

    #[test]
    fn an_ejected_replica_returns_after_its_back_off_and_doubles_it_on_failing_again() {
        let r = three(2, 40);
        r.failed(0, "refused");
        r.failed(0, "refused");
        assert!(!r.get(0).healthy(Instant::now()));
        std::thread::sleep(Duration::from_millis(60));
        assert!(r.get(0).healthy(Instant::now()));
        r.failed(0, "refused");
        let back = r.get(0).back_at().unwrap();
        assert!(
            back >= Instant::now() + Duration::from_millis(60),
            "doubled"
        );
        r.succeeded(0);
        assert!(r.get(0).healthy(Instant::now()));
    }

    #[test]
    fn with_every_replica_out_the_one_back_soonest_is_chosen() {
        let r = three(1, 60_000);
        r.failed(1, "refused");
        std::thread::sleep(Duration::from_millis(5));
        r.failed(2, "refused");
        std::thread::sleep(Duration::from_millis(5));
        r.failed(0, "refused");
        assert_eq!(r.least_busy(None), 1);
        assert_eq!(r.least_busy(Some(1)), 2);
    }

    #[test]
    fn a_lone_replica_is_never_out_nor_named_in_records() {
        let one = Replicas::new(
            &["http://a/mcp"],
            Ejection {
                after: 1,
                base: Duration::from_secs(1),
            },
        )
        .unwrap();
        assert_eq!(one.least_busy(Some(0)), 0);
        one.failed(0, "refused");
        one.failed(0, "refused");
        assert!(one.get(0).healthy(Instant::now()), "never out");
        assert!(!one.must_leave(&bound_to("http://a/mcp")));
        assert_eq!(one.name_of(0), None, "records stay as they were");
    }
}
