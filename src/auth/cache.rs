//! The bounded cache of tokens already vouched for (a verified JWT, an
//! active introspection answer): the SHA-256 of a token → the principal it
//! stands for and until when. A repeated token then costs a hash and a map
//! look-up, not a signature check or a round trip.
//!
//! It holds digests, never tokens, and never decides anything itself: an
//! entry past its time is simply absent. Past its capacity the oldest entry
//! goes. Its lock is a plain mutex held for a look-up or an insert, never
//! across an await.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use ring::digest;

/// The digest a token is cached under.
pub type TokenKey = [u8; 32];

pub fn token_key(token: &str) -> TokenKey {
    let d = digest::digest(&digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(d.as_ref());
    key
}

/// What a token was found to stand for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vouched {
    pub principal: Arc<str>,
    /// Unix seconds after which the entry no longer answers.
    pub until: u64,
}

pub struct TokenCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<TokenKey, (Vouched, u64)>,
    /// Keys in insertion order with the sequence number they were inserted
    /// with; a key removed or inserted again leaves a stale pair behind,
    /// skipped (and compacted away) later.
    order: VecDeque<(u64, TokenKey)>,
    next: u64,
}

impl TokenCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::default(),
        }
    }

    /// The entry of `key` if it still answers at `now` (Unix seconds).
    pub fn get(&self, key: &TokenKey, now: u64) -> Option<Vouched> {
        let mut inner = self.lock();
        let (vouched, _) = inner.entries.get(key)?;
        if vouched.until > now {
            return Some(vouched.clone());
        }
        inner.entries.remove(key);
        None
    }

    pub fn insert(&self, key: TokenKey, vouched: Vouched) {
        let mut inner = self.lock();
        let seq = inner.next;
        inner.next += 1;
        inner.entries.insert(key, (vouched, seq));
        inner.order.push_back((seq, key));
        while inner.entries.len() > self.capacity {
            let Some((seq, oldest)) = inner.order.pop_front() else {
                break;
            };
            if inner.entries.get(&oldest).is_some_and(|(_, s)| *s == seq) {
                inner.entries.remove(&oldest);
            }
        }
        if inner.order.len() > 2 * self.capacity {
            let Inner { entries, order, .. } = &mut *inner;
            order.retain(|(seq, key)| entries.get(key).is_some_and(|(_, s)| s == seq));
        }
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map half-updated
        // in a way that matters: at worst an entry is missing.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vouched(p: &str, until: u64) -> Vouched {
        Vouched {
            principal: p.into(),
            until,
        }
    }

    #[test]
    fn an_entry_answers_until_its_time() {
        let cache = TokenCache::new(4);
        cache.insert(token_key("a"), vouched("p", 100));
        assert_eq!(cache.get(&token_key("a"), 99), Some(vouched("p", 100)));
        assert_eq!(cache.get(&token_key("a"), 100), None);
        assert!(cache.is_empty());
    }

    #[test]
    fn the_oldest_goes_past_capacity_and_the_order_stays_bounded() {
        let cache = TokenCache::new(2);
        for t in ["a", "b", "c"] {
            cache.insert(token_key(t), vouched(t, 100));
        }
        assert_eq!(cache.get(&token_key("a"), 0), None);
        assert!(cache.get(&token_key("c"), 0).is_some());
        for _ in 0..100 {
            cache.insert(token_key("c"), vouched("c", 100));
        }
        assert_eq!(cache.len(), 2);
        assert!(cache.lock().order.len() <= 4);
        assert!(cache.get(&token_key("b"), 0).is_some());
    }
}
