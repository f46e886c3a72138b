//! Exponential back-off, one implementation for every retry in the agent.
//!
//! CrashLoopBackOff (10 s doubling to 5 min) and, later, image pulls and the uplink
//! (800 ms doubling to 30 s, full jitter) use it with their own parameters.

use std::time::Duration;

/// Back-off parameters: `initial`, doubled per consecutive failure up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay before retry number `failures` (1 = after the first failure).
    /// Zero failures means no delay.
    pub fn delay(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let shift = (failures - 1).min(31);
        let factor = 1u64 << shift;
        let nanos = (self.initial.as_nanos() as u64).saturating_mul(factor);
        Duration::from_nanos(nanos).min(self.max)
    }

    /// The delay with full jitter: uniformly random in `[0, delay(failures)]`, so many
    /// agents that failed together do not retry together.
    pub fn jittered(&self, failures: u32, random: u64) -> Duration {
        let d = self.delay(failures).as_nanos() as u64;
        if d == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(random % (d + 1))
    }
}

/// A random number for jitter; not for secrets. Each call hashes with fresh keys
/// from std's `RandomState`, which the OS seeds.
pub fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x686f6c6466617374);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap() {
        let b = Backoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        };
        let got: Vec<u64> = (0..8).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(got, vec![0, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_within_the_delay() {
        let b = Backoff {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
        };
        for r in [0u64, 1, 12345, u64::MAX] {
            assert!(b.jittered(3, r) <= b.delay(3));
        }
    }
}
