//! CPU rate: `usageNanoCores` needs two readings of a cumulative counter. The sampler
//! keeps the last reading of each cgroup it was asked about (a bounded map; the
//! oldest entries go first) and turns a new reading into a rate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// The most cgroups remembered: a node's containers plus the node itself, with room.
pub const MAX_KEYS: usize = 1024;

#[derive(Default)]
pub struct Sampler {
    last: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Sampler {
    /// Records `usage_ns` for `key` at `at`; returns the rate since the reading
    /// before, in nanocores, when there is one at least 10 ms older.
    pub fn rate(&self, key: &str, at: Instant, usage_ns: u64) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let rate = last.get(key).and_then(|(t, u)| {
            let dt = at.checked_duration_since(*t)?.as_nanos();
            (dt >= 10_000_000).then(|| {
                let du = u128::from(usage_ns.saturating_sub(*u));
                u64::try_from(du * 1_000_000_000 / dt).unwrap_or(u64::MAX)
            })
        });
        // Keep the older reading while it is too recent to give a rate.
        if rate.is_some() || !last.contains_key(key) {
            if last.len() >= MAX_KEYS && !last.contains_key(key) {
                let oldest = last
                    .iter()
                    .min_by_key(|(_, (t, _))| *t)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    last.remove(&k);
                }
            }
            last.insert(key.to_owned(), (at, usage_ns));
        }
        rate
    }

    /// Whether `key` has a reading to compute a rate from.
    pub fn knows(&self, key: &str) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rate_from_two_readings_and_bounded() {
        let s = Sampler::default();
        let t0 = Instant::now();
        assert_eq!(s.rate("a", t0, 1_000_000_000), None);
        // Half a core over one second.
        assert_eq!(
            s.rate("a", t0 + Duration::from_secs(1), 1_500_000_000),
            Some(500_000_000)
        );
        // Too soon after: no rate, and the older reading is kept.
        assert_eq!(
            s.rate("a", t0 + Duration::from_millis(1001), 1_600_000_000),
            None
        );
        assert_eq!(
            s.rate("a", t0 + Duration::from_secs(2), 2_500_000_000),
            Some(1_000_000_000)
        );
        for i in 0..MAX_KEYS + 10 {
            s.rate(&format!("k{i}"), t0 + Duration::from_millis(i as u64), 0);
        }
        assert_eq!(s.len(), MAX_KEYS);
    }
}
