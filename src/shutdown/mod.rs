//! shutdown: the graceful node shutdown, as the kubelet's shutdown manager does it. A
//! planned power-off (a UPS on low battery, a maintenance reboot) goes through
//! systemd-logind, which holds it back while a "delay" inhibitor lock is held: the
//! agent holds one (raising logind's `InhibitDelayMaxSec` to `shutdownGracePeriod`
//! first, with a drop-in), and on `PrepareForShutdown(true)` it marks the node
//! shutting down (Ready false, no pod admitted), has the sync loop stop the pods by
//! priority, waits for their statuses to reach the apiserver (not past the grace
//! period, not while the link is down: the store keeps them for after the reboot),
//! then releases the lock. `PrepareForShutdown(false)`, a shutdown cancelled, takes
//! the lock again.
//!
//! One thread of its own (the bus is blocking), which talks to the sync loop through
//! one request. Off when no grace period is configured, as in the kubelet.

pub mod logind;

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::config::ShutdownConfig;
use crate::kube::link::Link;
use crate::node::shutdown::ShuttingDown;
use crate::store::Store;
use crate::sync::shutdown::NodeShutdown;
use crate::uplink::report::Reporter;
use logind::{Logind, LogindError};

/// How soon a lost bus connection is tried again (the kubelet's `dbusReconnectPeriod`).
const RECONNECT: Duration = Duration::from_secs(1);
/// How long logind is given to take a reloaded configuration up.
const RELOAD_WAIT: Duration = Duration::from_secs(2);
/// How often the outbox is looked at while the pods' statuses go out.
const STATUS_POLL: Duration = Duration::from_millis(100);
/// The least time the statuses are given, even when the groups used up theirs.
const STATUS_GRACE: Duration = Duration::from_secs(2);

/// Where the pods' statuses go, to wait for them.
pub struct Reports {
    pub reporter: Reporter,
    pub link: Link,
}

/// The shutdown manager, before it runs.
pub struct Manager {
    pub config: ShutdownConfig,
    pub flag: ShuttingDown,
    pub store: Store,
    pub reports: Option<Reports>,
}

impl Manager {
    /// Starts the manager's thread, if a grace period is configured; the sync loop
    /// takes its requests from what is returned (a channel that never speaks when off).
    pub fn spawn(self) -> mpsc::Receiver<NodeShutdown> {
        let (tx, rx) = mpsc::channel(1);
        if !self.config.enabled() {
            log::info!("no shutdownGracePeriod: a shutdown of the node stops pods with no grace");
            return rx;
        }
        let spawned = std::thread::Builder::new()
            .name("node-shutdown".into())
            .spawn(move || self.run(tx));
        if let Err(e) = spawned {
            log::error!("node shutdown: cannot start its thread: {e}; pods get no grace");
        }
        rx
    }

    fn run(self, requests: mpsc::Sender<NodeShutdown>) {
        let mut said = String::new();
        loop {
            if let Err(e) = self.watch(&requests, &mut said) {
                let msg = e.to_string();
                if msg != said {
                    log::error!("node shutdown: {msg}; trying again every second");
                    said = msg;
                }
            }
            if requests.is_closed() {
                return;
            }
            std::thread::sleep(RECONNECT);
        }
    }

    /// One connection's life: the delay checked, the lock taken, the signals followed.
    fn watch(
        &self,
        requests: &mpsc::Sender<NodeShutdown>,
        said: &mut String,
    ) -> Result<(), LogindError> {
        let mut bus = Logind::connect(&self.config.bus_address)?;
        self.ensure_delay(&mut bus)?;
        let mut lock = Some(bus.inhibit()?);
        bus.watch_shutdown()?;
        said.clear();
        log::info!(
            "node shutdown: holding a delay inhibitor with logind; pods get up to {}s",
            self.config.requested().as_secs()
        );
        while !requests.is_closed() {
            match bus.next_prepare(RECONNECT)? {
                None => {}
                Some(true) => {
                    log::warn!("node shutdown: the node shuts down; stopping pods");
                    self.flag.set(true);
                    self.stop_pods(requests);
                    // The lock goes last: the machine powers off once it does.
                    release(&mut lock);
                    log::info!("node shutdown: pods stopped; the inhibitor lock is released");
                }
                Some(false) => {
                    log::info!("node shutdown: the shutdown was cancelled");
                    self.flag.set(false);
                    let fresh = bus.inhibit()?;
                    release(&mut lock);
                    lock = Some(fresh);
                }
            }
        }
        Ok(())
    }

    /// Raises logind's `InhibitDelayMaxSec` to what the grace periods need, as the
    /// kubelet does; says so loudly if logind still gives less.
    fn ensure_delay(&self, bus: &mut Logind) -> Result<(), LogindError> {
        let requested = self.config.requested();
        let current = bus.inhibit_delay_max()?;
        if current >= requested {
            return Ok(());
        }
        let path = logind::write_drop_in(&self.config.logind_conf_dir, requested)?;
        bus.reload()?;
        let deadline = Instant::now() + RELOAD_WAIT;
        let mut now = bus.inhibit_delay_max()?;
        while now < requested && Instant::now() < deadline {
            std::thread::sleep(STATUS_POLL);
            now = bus.inhibit_delay_max()?;
        }
        if now < requested {
            log::error!(
                "node shutdown: logind's InhibitDelayMaxSec is {}s after {} was written and \
                 logind reloaded, less than the {}s the shutdown grace periods need: pods \
                 get at most {}s (check logind.conf and its drop-ins for a later override)",
                now.as_secs(),
                path.display(),
                requested.as_secs(),
                now.as_secs()
            );
        } else {
            log::info!(
                "node shutdown: logind's InhibitDelayMaxSec raised from {}s to {}s ({})",
                current.as_secs(),
                now.as_secs(),
                path.display()
            );
        }
        Ok(())
    }

    /// Has the sync loop stop the pods, then waits for their statuses to go out.
    fn stop_pods(&self, requests: &mpsc::Sender<NodeShutdown>) {
        let began = Instant::now();
        let (done, stopped) = oneshot::channel();
        let request = NodeShutdown {
            periods: self.config.periods.clone(),
            done,
        };
        if requests.blocking_send(request).is_err() {
            return;
        }
        let uids = stopped.blocking_recv().unwrap_or_default();
        log::info!(
            "node shutdown: {} pod(s) stopped in {:.1}s",
            uids.len(),
            began.elapsed().as_secs_f64()
        );
        if let Err(e) = self.store.flush() {
            log::error!("node shutdown: write the store out: {e}");
        }
        let Some(reports) = &self.reports else { return };
        let deadline = (began + self.config.requested()).max(Instant::now() + STATUS_GRACE);
        loop {
            let unsent = reports.reporter.statuses_unsent(&uids);
            if unsent == 0 {
                return;
            }
            if reports.link.is_down() || Instant::now() >= deadline {
                log::warn!(
                    "node shutdown: {unsent} pod status(es) not reported yet; the store \
                     keeps them for after the reboot"
                );
                return;
            }
            std::thread::sleep(STATUS_POLL);
        }
    }
}

fn release(lock: &mut Option<OwnedFd>) {
    drop(lock.take());
}
