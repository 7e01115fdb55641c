//! The bound on open sessions: which sessions hold a place on this
//! instance, how many each principal holds, and which of them are still
//! unused (no request since `initialize`). A place is taken before anything
//! is opened upstream and freed when the session ends, closes or is found
//! gone; taking and freeing are idempotent by session id, so a session that
//! ends twice (DELETE racing with expiry) frees one place.
//!
//! It decides nothing about HTTP and does no I/O: [`Places::take`] says
//! which bound refused, the request path answers it. One lock for all of
//! it: places are taken once per `initialize` and freed once per session,
//! never per request, and the check and the count must be one step or two
//! concurrent `initialize`s could both pass a bound with one place left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::LimitsConfig;
use crate::id::{IdMap, SessionId};

/// Which bound an `initialize` met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// The principal holds `max_sessions_per_principal` sessions.
    Principal(usize),
    /// The instance holds `max_sessions`.
    Total(usize),
}

/// Places held, per principal and in all.
pub struct Places {
    /// The bounds, changed by a reload (a place already held is kept).
    max: AtomicUsize,
    per_principal: AtomicUsize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Session → the principal its place is counted under; `None` for a
    /// session without a credential (counted in all only).
    held: IdMap<SessionId, Option<Arc<str>>>,
    /// Places per principal; a principal with none has no entry.
    by_principal: HashMap<Arc<str>, usize>,
    /// Sessions not used yet → when they were created (ms).
    unused: IdMap<SessionId, u64>,
}

impl Places {
    pub fn new(limits: &LimitsConfig) -> Self {
        Self {
            max: AtomicUsize::new(limits.max_sessions),
            per_principal: AtomicUsize::new(limits.max_sessions_per_principal),
            inner: Mutex::default(),
        }
    }

    /// New bounds, for the places taken from now on.
    pub fn set_bounds(&self, limits: &LimitsConfig) {
        self.max.store(limits.max_sessions, Ordering::Relaxed);
        let per_principal = limits.max_sessions_per_principal;
        self.per_principal.store(per_principal, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every change is one step under the lock: a panic elsewhere
        // leaves nothing half-done behind it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a place for the new session `id` of `principal` (`None`: no
    /// credential), unused since `created_ms`, unless a bound is reached.
    pub fn take(
        &self,
        id: SessionId,
        principal: Option<&str>,
        created_ms: u64,
    ) -> Result<(), Full> {
        let max = self.max.load(Ordering::Relaxed);
        let per_principal = self.per_principal.load(Ordering::Relaxed);
        let mut inner = self.lock();
        if let Some(principal) = principal {
            let held = inner.by_principal.get(principal).copied().unwrap_or(0);
            if held >= per_principal {
                return Err(Full::Principal(per_principal));
            }
        }
        if inner.held.len() >= max {
            return Err(Full::Total(max));
        }
        inner.hold(id, principal);
        inner.unused.insert(id, created_ms);
        Ok(())
    }

    /// Counts a session found open in the log at start, past the bounds if
    /// need be: it exists, and refusing it would lose nothing but the
    /// count.
    pub fn count(&self, id: SessionId, principal: Option<&str>) {
        self.lock().hold(id, principal);
    }

    /// Notes that the session `id`, created at `created_ms`, is unused.
    pub fn unused_since(&self, id: SessionId, created_ms: u64) {
        self.lock().unused.insert(id, created_ms);
    }

    /// The session made its first request.
    pub fn used(&self, id: SessionId) {
        self.lock().unused.remove(&id);
    }

    /// Frees the place of a session that ended, closed or is gone.
    pub fn free(&self, id: SessionId) {
        let mut inner = self.lock();
        inner.unused.remove(&id);
        let Some(principal) = inner.held.remove(&id) else {
            return;
        };
        if let Some(principal) = principal {
            if let Some(count) = inner.by_principal.get_mut(&principal) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    inner.by_principal.remove(&principal);
                }
            }
        }
    }

    /// Unused sessions created at or before `created_by_ms`.
    pub fn unused_by(&self, created_by_ms: u64) -> Vec<SessionId> {
        let inner = self.lock();
        inner
            .unused
            .iter()
            .filter(|(_, &created)| created <= created_by_ms)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Places held in all.
    pub fn open(&self) -> usize {
        self.lock().held.len()
    }

    /// Places `principal` holds.
    #[cfg(test)]
    pub fn of(&self, principal: &str) -> usize {
        self.lock()
            .by_principal
            .get(principal)
            .copied()
            .unwrap_or(0)
    }
}

impl Inner {
    fn hold(&mut self, id: SessionId, principal: Option<&str>) {
        if self.held.contains_key(&id) {
            return;
        }
        let principal = principal.map(|p| match self.by_principal.get_key_value(p) {
            // One copy of a principal, however many sessions it holds.
            Some((shared, _)) => shared.clone(),
            None => Arc::from(p),
        });
        if let Some(p) = &principal {
            *self.by_principal.entry(p.clone()).or_default() += 1;
        }
        self.held.insert(id, principal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(max: usize, per_principal: usize) -> Places {
        Places::new(&LimitsConfig {
            max_sessions: max,
            max_sessions_per_principal: per_principal,
            ..LimitsConfig::default()
        })
    }

    #[test]
    fn a_principal_at_its_bound_is_refused_and_another_is_not() {
        let p = places(10, 2);
        for _ in 0..2 {
            p.take(SessionId::random(), Some("a"), 0).unwrap();
        }
        assert_eq!(
            p.take(SessionId::random(), Some("a"), 0),
            Err(Full::Principal(2))
        );
        p.take(SessionId::random(), Some("b"), 0).unwrap();
        assert_eq!((p.of("a"), p.of("b"), p.open()), (2, 1, 3));
    }

    #[test]
    fn the_total_bound_holds_for_sessions_without_a_credential_too() {
        let p = places(3, 1);
        for _ in 0..3 {
            p.take(SessionId::random(), None, 0).unwrap();
        }
        assert_eq!(p.take(SessionId::random(), None, 0), Err(Full::Total(3)));
        assert_eq!(
            p.take(SessionId::random(), Some("a"), 0),
            Err(Full::Total(3))
        );
    }

    #[test]
    fn freeing_twice_frees_one_place() {
        let p = places(2, 2);
        let (one, two) = (SessionId::random(), SessionId::random());
        p.take(one, Some("a"), 0).unwrap();
        p.take(two, Some("a"), 0).unwrap();
        p.free(one);
        p.free(one);
        assert_eq!((p.of("a"), p.open()), (1, 1));
        p.free(two);
        assert_eq!((p.of("a"), p.open()), (0, 0));
        assert!(p.lock().by_principal.is_empty(), "no entry left behind");
    }

    #[test]
    fn sessions_counted_at_start_may_exceed_the_bound_and_are_counted_once() {
        let p = places(1, 1);
        let (one, two) = (SessionId::random(), SessionId::random());
        p.count(one, Some("a"));
        p.count(one, Some("a"));
        p.count(two, Some("a"));
        assert_eq!((p.of("a"), p.open()), (2, 2));
        assert_eq!(
            p.take(SessionId::random(), Some("b"), 0),
            Err(Full::Total(1))
        );
    }

    #[test]
    fn unused_sessions_are_listed_by_age_until_used_or_freed() {
        let p = places(10, 10);
        let (old, new, used) = (
            SessionId::random(),
            SessionId::random(),
            SessionId::random(),
        );
        p.take(old, None, 100).unwrap();
        p.take(new, None, 900).unwrap();
        p.take(used, None, 100).unwrap();
        p.used(used);
        assert_eq!(p.unused_by(500), vec![old]);
        p.free(old);
        assert!(p.unused_by(500).is_empty());
        assert_eq!(p.unused_by(1_000), vec![new]);
    }
}
