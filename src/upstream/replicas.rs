//! The replicas of one HTTP upstream (`urls`, the addresses of a
//! `resolve = "each"` host, or the one `url`): which one a request goes
//! to, and whether each is fit to take work. A session's requests go to the
//! replica that created its upstream session (named in its record, so
//! another instance or a restarted proxy sends them there too); a request
//! of no session yet goes to the least busy healthy replica — fewest
//! requests in flight, ties taken in turn. Health is passive, and active
//! with a health check: `eject_after` consecutive failures (no connection,
//! HTTP 502 to 504, a timeout, a stream silent past the idle timeout, a
//! failed check) take a replica out for `eject_ms`, doubled each time it
//! fails again on its return; a success puts it back for good, at once.
//! A 503 counts: a server draining answers it, and should get no new
//! sessions (README "A replicated upstream" says why its sessions move).
//!
//! This owns the choice, the counts and the set, which a resolver may
//! change while requests run (`follow`): a request holds the replica it was
//! given, so a replica that leaves the set finishes what it was sent. It
//! sends nothing, looks nothing up, and moving a session off a replica
//! (re-initializing it on another) is `renew.rs`'s. A replica is named by
//! its URL as configured, or its address; records keep the name when
//! replicas are several (or may become so): a replica that left the set is
//! one a session must leave. A lone replica is never out.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::Uri;

use crate::metrics::{ReplicaMeter, ReplicaSeries};
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

/// A replica to be: its name, the URL requests to it carry, and how they
/// reach it (`C`: the HTTP upstream's client for it; `()` in tests).
pub struct Endpoint<C> {
    pub name: String,
    pub url: Uri,
    pub via: C,
}

pub struct Replica<C> {
    /// The URL as configured, or the address: the name records keep.
    pub name: Arc<str>,
    pub url: Uri,
    pub via: C,
    /// In flight, ejected, failures: the replica's series.
    series: ReplicaSeries,
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

pub struct Replicas<C> {
    set: ArcSwap<Vec<Arc<Replica<C>>>>,
    ejection: Ejection,
    /// Whether records name the replica: several of them, or a set that
    /// may grow (a resolved host).
    named: bool,
    meter: ReplicaMeter,
    /// Where the search for the least busy starts, so ties take turns.
    turn: AtomicUsize,
}

impl<C> Replicas<C> {
    /// The replicas at `endpoints`, at least one; `named` says whether
    /// session records name them (always when the set can change).
    pub fn new(
        endpoints: Vec<Endpoint<C>>,
        ejection: Ejection,
        named: bool,
        meter: ReplicaMeter,
    ) -> Result<Self, String> {
        if endpoints.is_empty() {
            return Err("an upstream needs at least one replica".into());
        }
        let set = endpoints.into_iter().map(|e| meter.replica(e)).collect();
        Ok(Self {
            set: ArcSwap::from_pointee(set),
            ejection,
            named,
            meter,
            turn: AtomicUsize::new(0),
        })
    }

    /// The replicas now: a snapshot, unchanged by a later `follow`.
    pub fn all(&self) -> Arc<Vec<Arc<Replica<C>>>> {
        self.set.load_full()
    }

    pub fn len(&self) -> usize {
        self.set.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.load().is_empty()
    }

    /// Whether a replica of this name is in the set.
    pub fn contains(&self, name: &str) -> bool {
        self.set.load().iter().any(|r| &*r.name == name)
    }

    /// Makes the set the replicas named in `fresh` (none: the set stays):
    /// those already in it stay as they are (their health, their counts,
    /// their connections), `make` makes the new ones from their name and
    /// what `fresh` says of them, and those not named leave — a session
    /// bound to one of them must leave it too.
    pub fn follow<T>(&self, fresh: Vec<(String, T)>, mut make: impl FnMut(&str, T) -> Endpoint<C>) {
        if fresh.is_empty() {
            return;
        }
        let was = self.set.load_full();
        let names: Vec<String> = fresh.iter().map(|(n, _)| n.clone()).collect();
        let set: Vec<Arc<Replica<C>>> = fresh
            .into_iter()
            .map(|(name, what)| match was.iter().find(|r| *r.name == *name) {
                Some(kept) => kept.clone(),
                None => {
                    tracing::info!(replica = %name, "upstream replica added");
                    self.meter.replica(make(&name, what))
                }
            })
            .collect();
        for gone in was.iter().filter(|r| !names.iter().any(|n| *n == *r.name)) {
            tracing::info!(replica = %gone.name, "upstream replica gone; its sessions move");
            self.meter.forget(&gone.name);
        }
        self.set.store(Arc::new(set));
    }

    /// What a session record keeps of `replica`: its name, when there is a
    /// choice of replicas (with one `url`, records stay as they were, and
    /// a changed `url` is tried with the session before any renewal).
    pub fn name_of(&self, replica: &Replica<C>) -> Option<String> {
        self.named.then(|| replica.name.to_string())
    }

    /// The replica named `name`, if it is still in the set.
    pub fn named(&self, name: &str) -> Option<Arc<Replica<C>>> {
        self.set.load().iter().find(|r| &*r.name == name).cloned()
    }

    /// Where a request bound to `binding` goes: its session's replica,
    /// healthy or not (no other one knows the session), else the least busy.
    pub fn route(&self, binding: &Binding) -> Arc<Replica<C>> {
        match binding.replica.as_deref().and_then(|n| self.named(n)) {
            Some(replica) => replica,
            None => self.least_busy(None),
        }
    }

    /// Whether a session bound to `binding` must leave its replica before
    /// its next request: the replica left the set or is out, and there is
    /// another to go to.
    pub fn must_leave(&self, binding: &Binding) -> bool {
        let Some(name) = binding.replica.as_deref() else {
            return false;
        };
        match self.named(name) {
            None => true,
            Some(replica) => self.len() > 1 && !replica.healthy(Instant::now()),
        }
    }

    /// The healthy replica with the fewest requests in flight, other than
    /// the one named `avoid` when there is a choice. With none healthy, the
    /// one back the soonest: a request must go somewhere, and it may find
    /// it recovered.
    pub fn least_busy(&self, avoid: Option<&str>) -> Arc<Replica<C>> {
        let now = Instant::now();
        let set = self.set.load();
        let n = set.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        let order = (0..n).map(|k| &set[(start + k) % n]);
        let usable = |r: &&Arc<Replica<C>>| n == 1 || Some(&*r.name) != avoid;
        let healthy = order
            .clone()
            .filter(usable)
            .filter(|r| r.healthy(now))
            .min_by_key(|r| r.in_flight());
        let chosen = healthy.or_else(|| order.filter(usable).min_by_key(|r| r.back_at()));
        chosen.unwrap_or(&set[start]).clone()
    }

    /// `replica` answered: it is healthy again (back at once if it was out).
    pub fn succeeded(&self, replica: &Replica<C>) {
        if !replica.troubled.load(Ordering::Relaxed) {
            return;
        }
        let mut health = replica.lock();
        if health.out_until.is_some() {
            tracing::info!(replica = %replica.name, "upstream replica answers again");
        }
        *health = Health::default();
        replica.series.ejected.set(0);
        replica.troubled.store(false, Ordering::Relaxed);
    }

    /// `replica` failed (`why`): past `eject_after` in a row, it is out.
    /// A lone replica is never out: there is nowhere else to go.
    pub fn failed(&self, replica: &Arc<Replica<C>>, why: &str)
    where
        C: Send + Sync + 'static,
    {
        replica.series.failures.inc();
        if self.len() == 1 {
            return;
        }
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
        replica.series.ejected.set(1);
        lower_when_back(Arc::downgrade(replica), out_for);
        tracing::warn!(
            replica = %replica.name,
            failures = health.failures,
            out_ms = out_for.as_millis() as u64,
            error = why,
            "upstream replica taken out"
        );
    }
}

/// Sets the `ejected` gauge back to 0 once the replica's back-off ran out
/// (it takes work again, on trial), unless it was taken out again since.
/// Without a runtime (unit tests) the gauge waits for the next success.
fn lower_when_back<C: Send + Sync + 'static>(replica: Weak<Replica<C>>, after: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        tokio::time::sleep(after).await;
        if let Some(replica) = replica.upgrade() {
            if replica.healthy(Instant::now()) {
                replica.series.ejected.set(0);
            }
        }
    });
}

impl ReplicaMeter {
    fn replica<C>(&self, endpoint: Endpoint<C>) -> Arc<Replica<C>> {
        let series = self.series(&endpoint.name);
        Arc::new(Replica {
            name: Arc::from(endpoint.name),
            url: endpoint.url,
            via: endpoint.via,
            series,
            troubled: AtomicBool::new(false),
            health: Mutex::default(),
        })
    }
}

impl<C> Replica<C> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether it takes work at `now`: not out, or back from being out.
    pub fn healthy(&self, now: Instant) -> bool {
        !self.troubled.load(Ordering::Relaxed)
            || self.lock().out_until.is_none_or(|until| until <= now)
    }

    pub fn in_flight(&self) -> usize {
        usize::try_from(self.series.in_flight.get()).unwrap_or(0)
    }

    /// When it takes work again (`None`: it does now).
    fn back_at(&self) -> Option<Instant> {
        self.lock().out_until
    }

    /// Counts a request on this replica until the returned guard (and every
    /// clone of it) is dropped: with the response body it is read from.
    pub fn start(&self) -> InFlight {
        let gauge = self.series.in_flight.clone();
        gauge.inc();
        InFlight(Arc::new(Counted(gauge)))
    }
}

/// One request counted in flight on a replica. Cloneable because a
/// response's extensions must be; the count drops with the last clone.
#[derive(Clone)]
pub struct InFlight(#[allow(dead_code)] Arc<Counted>);

struct Counted(prometheus_client::metrics::gauge::Gauge);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(name: &str) -> Endpoint<()> {
        Endpoint {
            name: name.to_owned(),
            url: Uri::from_static("http://host/mcp"),
            via: (),
        }
    }

    fn replicas(names: &[&str], after: u32, base_ms: u64) -> Arc<Replicas<()>> {
        let ejection = Ejection {
            after,
            base: Duration::from_millis(base_ms),
        };
        let endpoints = names.iter().map(|n| endpoint(n)).collect();
        let named = names.len() > 1;
        Arc::new(Replicas::new(endpoints, ejection, named, ReplicaMeter::detached()).unwrap())
    }

    fn three(after: u32, base_ms: u64) -> Arc<Replicas<()>> {
        replicas(&["a", "b", "c"], after, base_ms)
    }

    fn get(r: &Replicas<()>, name: &str) -> Arc<Replica<()>> {
        r.named(name).expect("in the set")
    }

    fn bound_to(name: &str) -> Binding {
        Binding {
            session: Some("s".into()),
            replica: Some(name.into()),
        }
    }

    fn pick(r: &Replicas<()>, avoid: Option<&str>) -> String {
        r.least_busy(avoid).name.to_string()
    }

    #[test]
    fn ties_take_turns() {
        let r = three(1, 1_000);
        let picked: Vec<String> = (0..6).map(|_| pick(&r, None)).collect();
        assert_eq!(picked, ["a", "b", "c", "a", "b", "c"]);
    }

    #[test]
    fn the_least_busy_healthy_replica_is_chosen() {
        let r = three(1, 60_000);
        let _a = [get(&r, "a").start(), get(&r, "a").start()];
        let _b = get(&r, "b").start();
        for _ in 0..3 {
            assert_eq!(pick(&r, None), "c");
        }
        r.failed(&get(&r, "c"), "refused");
        for _ in 0..3 {
            assert_eq!(pick(&r, None), "b");
        }
        drop(_a);
        assert_eq!(get(&r, "a").in_flight(), 0);
        assert_eq!(pick(&r, None), "a");
    }

    #[test]
    fn a_bound_session_stays_on_its_replica_even_when_it_is_out() {
        let r = three(1, 60_000);
        let _busy = [get(&r, "b").start(), get(&r, "b").start()];
        assert_eq!(&*r.route(&bound_to("b")).name, "b");
        assert!(!r.must_leave(&bound_to("b")));
        r.failed(&get(&r, "b"), "refused");
        assert_eq!(&*r.route(&bound_to("b")).name, "b");
        assert!(r.must_leave(&bound_to("b")));
    }

    #[test]
    fn a_session_of_a_replica_no_longer_configured_must_leave() {
        let r = three(1, 1_000);
        assert!(r.must_leave(&bound_to("gone")));
        assert!(!r.must_leave(&Binding::NONE));
        assert!(r.contains(&r.route(&bound_to("gone")).name));
    }

    #[test]
    fn failures_eject_only_when_consecutive() {
        let r = three(3, 60_000);
        let a = get(&r, "a");
        r.failed(&a, "502");
        r.failed(&a, "502");
        r.succeeded(&a);
        r.failed(&a, "502");
        r.failed(&a, "502");
        assert!(a.healthy(Instant::now()));
        r.failed(&a, "502");
        assert!(!a.healthy(Instant::now()));
    }

    #[test]
    fn an_ejected_replica_returns_after_its_back_off_and_doubles_it_on_failing_again() {
        let r = three(2, 40);
        let a = get(&r, "a");
        r.failed(&a, "refused");
        r.failed(&a, "refused");
        assert!(!a.healthy(Instant::now()));
        std::thread::sleep(Duration::from_millis(60));
        assert!(a.healthy(Instant::now()));
        r.failed(&a, "refused");
        let back = a.back_at().unwrap();
        assert!(
            back >= Instant::now() + Duration::from_millis(60),
            "doubled"
        );
        r.succeeded(&a);
        assert!(a.healthy(Instant::now()));
    }

    #[test]
    fn a_success_brings_an_ejected_replica_back_at_once() {
        let r = three(1, 60_000);
        let a = get(&r, "a");
        r.failed(&a, "health check: HTTP 500");
        assert!(!a.healthy(Instant::now()));
        r.succeeded(&a);
        assert!(a.healthy(Instant::now()));
        assert!(!r.must_leave(&bound_to("a")));
    }

    #[test]
    fn with_every_replica_out_the_one_back_soonest_is_chosen() {
        let r = three(1, 60_000);
        r.failed(&get(&r, "b"), "refused");
        std::thread::sleep(Duration::from_millis(5));
        r.failed(&get(&r, "c"), "refused");
        std::thread::sleep(Duration::from_millis(5));
        r.failed(&get(&r, "a"), "refused");
        assert_eq!(pick(&r, None), "b");
        assert_eq!(pick(&r, Some("b")), "c");
    }

    #[test]
    fn a_lone_replica_is_never_out_nor_named_in_records() {
        let one = replicas(&["a"], 1, 1_000);
        assert_eq!(pick(&one, Some("a")), "a");
        let a = get(&one, "a");
        one.failed(&a, "refused");
        one.failed(&a, "refused");
        assert!(a.healthy(Instant::now()), "never out");
        assert!(!one.must_leave(&bound_to("a")));
        assert_eq!(one.name_of(&a), None, "records stay as they were");
    }

    #[test]
    fn following_a_new_set_keeps_those_that_stay_adds_the_new_and_drops_the_gone() {
        let r = three(1, 60_000);
        let b = get(&r, "b");
        let _busy = b.start();
        let names = ["b".to_owned(), "c".to_owned(), "d".to_owned()];
        r.follow(names.iter().map(|n| (n.clone(), ())).collect(), |n, ()| {
            endpoint(n)
        });
        let now: Vec<String> = r.all().iter().map(|x| x.name.to_string()).collect();
        assert_eq!(now, names);
        assert_eq!(get(&r, "b").in_flight(), 1, "the same replica, kept");
        assert!(r.must_leave(&bound_to("a")), "a left the set");
        assert!(!r.must_leave(&bound_to("d")));
    }

    #[test]
    fn following_no_address_keeps_the_set() {
        let r = three(1, 60_000);
        r.follow(Vec::<(String, ())>::new(), |n, ()| endpoint(n));
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn a_request_keeps_its_replica_after_it_left_the_set() {
        let r = three(1, 60_000);
        let a = get(&r, "a");
        let held = a.start();
        r.follow(vec![("b".to_owned(), ())], |n, ()| endpoint(n));
        assert_eq!(a.in_flight(), 1);
        drop(held);
        assert_eq!(a.in_flight(), 0);
    }
}
