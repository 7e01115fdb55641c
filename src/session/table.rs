//! The small maps one session keeps (its requests in flight, their progress
//! tokens and streams, the inlets of its relays): one lock each, and no
//! allocation until the first entry.
//!
//! They were `DashMap`s, which allocate their shards when made — four per
//! core, 128 bytes each — whether or not anything is ever put in them: 1 KiB
//! per map on two cores, 16 KiB on thirty-two, seven maps per session, for
//! every session a client opened and left idle (BENCHMARKS.md, session 20).
//! A session's maps hold the entries of that one client's calls, changed a
//! few times per call; one lock held for a lookup never waits long, and is
//! never held across an await.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard};

pub struct Table<K, V, S = RandomState>(Mutex<HashMap<K, V, S>>);

impl<K, V, S: Default> Default for Table<K, V, S> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::with_hasher(S::default())))
    }
}

impl<K: Hash + Eq, V, S: BuildHasher> Table<K, V, S> {
    fn lock(&self) -> MutexGuard<'_, HashMap<K, V, S>> {
        // Every operation is one step under the lock: a panic elsewhere
        // leaves no half-made change behind.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Inserts, returning the value `key` had.
    pub fn insert(&self, key: K, value: V) -> Option<V> {
        self.lock().insert(key, value)
    }

    /// A copy of the value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        V: Clone,
    {
        self.lock().get(key).cloned()
    }

    /// What `read` makes of the value of `key`, read under the lock.
    pub fn read<Q, R>(&self, key: &Q, read: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lock().get(key).map(read)
    }

    pub fn remove<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lock().remove(key)
    }

    /// Removes the value of `key` if `pred` holds for it.
    pub fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&V) -> bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut map = self.lock();
        if map.get(key).is_some_and(pred) {
            map.remove(key)
        } else {
            None
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Empties the table (giving its memory back): how many entries it had.
    pub fn clear(&self) -> usize
    where
        S: Default,
    {
        std::mem::take(&mut *self.lock()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_a_map_with_conditional_removal() {
        let t: Table<String, u32> = Table::default();
        assert_eq!(t.insert("a".into(), 1), None);
        assert_eq!(t.insert("a".into(), 2), Some(1));
        t.insert("b".into(), 3);
        assert_eq!(t.get("a"), Some(2));
        assert_eq!(t.read("b", |v| v * 10), Some(30));
        assert_eq!(t.remove_if("a", |v| *v == 1), None, "not its value");
        assert_eq!(t.remove_if("a", |v| *v == 2), Some(2));
        assert_eq!(t.remove("b"), Some(3));
        assert_eq!(t.len(), 0);
        t.insert("c".into(), 4);
        assert_eq!(t.clear(), 1);
        assert_eq!(t.get("c"), None);
    }
}
