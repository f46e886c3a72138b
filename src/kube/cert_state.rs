//! The client certificate as `holdfast status` and the metrics show it: until when it is
//! valid, when it was last rotated, and why the node has no working credential. Written
//! by the connection and the rotation, read by the status; holds no certificate.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::tls::der::Validity;

/// What the status shows of the client certificate. Cheap to clone; clones share.
#[derive(Debug, Clone, Default)]
pub struct ClientCertState {
    inner: Arc<Mutex<CertReport>>,
    /// Whether the validity goes to the process's TTL gauge (the uplink's state does;
    /// a default one, as tests make, does not).
    publish: bool,
}

/// The client certificate as `holdfast status` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertReport {
    /// notAfter of the certificate in use, Unix seconds.
    pub not_after: Option<i64>,
    /// When the last rotation swapped a new certificate in, Unix seconds.
    pub rotated_at: Option<i64>,
    /// Why the node has no working credential, or why rotation fails; `None` when well.
    pub problem: Option<String>,
}

impl ClientCertState {
    /// The uplink's state, whose validity is the TTL gauge's.
    pub fn published() -> ClientCertState {
        ClientCertState {
            publish: true,
            ..ClientCertState::default()
        }
    }

    pub fn report(&self) -> CertReport {
        self.lock().clone()
    }

    pub fn set_validity(&self, v: Option<Validity>) {
        let not_after = v.map(|v| v.not_after);
        if self.publish {
            crate::metrics::CLIENT_CERT_NOT_AFTER.store(not_after.unwrap_or(0), Ordering::Relaxed);
        }
        self.lock().not_after = not_after;
    }

    pub fn set_problem(&self, problem: String) {
        self.lock().problem = Some(problem);
    }

    pub fn clear_problem(&self) {
        self.lock().problem = None;
    }

    /// A new certificate, valid for `v`, was swapped in at `at` (Unix seconds).
    pub(super) fn rotated(&self, v: Validity, at: i64) {
        self.set_validity(Some(v));
        let mut r = self.lock();
        r.rotated_at = Some(at);
        r.problem = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CertReport> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_shows_validity_problems_and_rotations() {
        let state = ClientCertState::default();
        assert_eq!(state.report(), CertReport::default());
        state.set_problem("refused".into());
        state.set_validity(Some(Validity {
            not_before: 1,
            not_after: 2,
        }));
        let clone = state.clone();
        assert_eq!(clone.report().problem.as_deref(), Some("refused"));
        assert_eq!(clone.report().not_after, Some(2));
        state.rotated(
            Validity {
                not_before: 3,
                not_after: 4,
            },
            5,
        );
        let r = clone.report();
        assert_eq!((r.not_after, r.problem), (Some(4), None));
        assert_eq!(r.rotated_at, Some(5));
    }
}
