//! Whether the node is shutting down (a planned power-off under way), as the graceful
//! shutdown sets it and the node's Ready condition and pod admission read it: one flag
//! shared by the threads, and a wish for the node's status to go out now. Holds no
//! logic of the shutdown itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The kubelet's `ShutdownStatus` error, the Ready condition's message while set.
pub const NOT_READY_MESSAGE: &str = "node is shutting down";

/// The shared flag. Cheap to clone; the default is a node that is not shutting down.
#[derive(Debug, Clone, Default)]
pub struct ShuttingDown {
    now: Arc<AtomicBool>,
    report: Arc<AtomicBool>,
}

impl ShuttingDown {
    /// Sets or clears the flag (a shutdown cancelled clears it), and asks for the
    /// node's status to go out at once.
    pub fn set(&self, shutting_down: bool) {
        self.now.store(shutting_down, Ordering::SeqCst);
        self.report.store(true, Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.now.load(Ordering::SeqCst)
    }

    /// Whether the node's status was asked for since the last call.
    pub fn take_report(&self) -> bool {
        self.report.swap(false, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag_and_one_report_request() {
        let a = ShuttingDown::default();
        let b = a.clone();
        assert!(!b.is_set() && !b.take_report());
        a.set(true);
        assert!(b.is_set());
        assert!(b.take_report());
        assert!(!b.take_report());
        a.set(false);
        assert!(!b.is_set() && b.take_report());
    }
}
