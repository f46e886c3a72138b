//! The caches of delegated authentication and authorization: answers kept for a
//! time-to-live and bounded in number, and a bounded set that says whether something
//! was already logged. Time is passed in, so the tests need no clock.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Answers by key, each until its own expiry; at most `max` of them.
pub struct TtlCache<K, V> {
    max: usize,
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(max: usize) -> Self {
        TtlCache {
            max: max.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The answer for `key` if it has not expired at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let mut entries = lock(&self.entries);
        match entries.get(key) {
            Some((v, until)) if now < *until => Some(v.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for `ttl` from `now` (a zero ttl keeps nothing). When full, expired
    /// answers go first, then the one closest to expiring.
    pub fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        let Some(until) = now.checked_add(ttl).filter(|_| !ttl.is_zero()) else {
            return;
        };
        let mut entries = lock(&self.entries);
        if entries.len() >= self.max && !entries.contains_key(&key) {
            entries.retain(|_, (_, u)| now < *u);
            if entries.len() >= self.max {
                let soonest = entries
                    .iter()
                    .min_by_key(|(_, (_, u))| *u)
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    entries.remove(&k);
                }
            }
        }
        entries.insert(key, (value, until));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }
}

/// Whether a line was logged already, for at most `max` distinct lines; when full it
/// forgets them all (and so logs each again once).
pub struct Once {
    max: usize,
    seen: Mutex<HashSet<u64>>,
}

impl Once {
    pub fn new(max: usize) -> Self {
        Once {
            max: max.max(1),
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// True the first time `key` is seen.
    pub fn first(&self, key: &str) -> bool {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        let mut seen = lock(&self.seen);
        if seen.len() >= self.max {
            seen.clear();
        }
        seen.insert(h.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_expire_and_the_cache_stays_bounded() {
        let t0 = Instant::now();
        let c: TtlCache<u32, bool> = TtlCache::new(3);
        c.insert(1, true, Duration::from_secs(5), t0);
        c.insert(2, false, Duration::from_secs(1), t0);
        assert_eq!(c.get(&1, t0), Some(true));
        assert_eq!(c.get(&2, t0 + Duration::from_millis(999)), Some(false));
        assert_eq!(c.get(&2, t0 + Duration::from_secs(1)), None, "expired");
        assert_eq!(c.len(), 1, "an expired answer is dropped when looked up");
        c.insert(3, true, Duration::ZERO, t0);
        assert_eq!(c.get(&3, t0), None, "a zero ttl keeps nothing");
        for k in 10..20 {
            c.insert(k, true, Duration::from_secs(u64::from(k)), t0);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&19, t0), Some(true), "the newest longest-lived stay");
        assert_eq!(c.get(&1, t0), None, "the soonest to expire went first");
        // A ttl past what the clock can hold keeps nothing rather than panicking.
        c.insert(99, true, Duration::MAX, t0);
        assert_eq!(c.get(&99, t0), None);
    }

    #[test]
    fn once_per_key_and_bounded() {
        let o = Once::new(2);
        assert!(o.first("a"));
        assert!(!o.first("a"));
        assert!(o.first("b"));
        assert!(o.first("c"), "full: forgets and starts again");
        assert!(o.first("a"));
    }
}
