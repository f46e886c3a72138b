//! The agent's one apiserver client: made once, on a thread of its own, as soon as the
//! node's kubeconfig can be used (read again and again with back-off until it can; with
//! a bootstrap kubeconfig, once the cluster has signed the node's client certificate),
//! then kept current by the certificate rotation, which swaps the new pair into that
//! same client. Whoever talks to the apiserver holds a [`SharedClient`] and asks it for
//! the client; nobody builds one of their own.
//!
//! Knows nothing of what the client is used for: the services that use it are started
//! by whoever waits on the handle.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::bootstrap;
use super::cert_state::ClientCertState;
use super::client::Client;
use super::rotation::Rotation;
use crate::backoff::Backoff;
use crate::config::Config;

/// How often a kubeconfig that cannot be used is read again, at most.
const RELOAD: Backoff = Backoff {
    initial: Duration::from_secs(2),
    max: Duration::from_secs(300),
};

/// How often a wait for the client looks whether it should stop.
const STOP_CHECK: Duration = Duration::from_millis(500);

/// The one client, once it is made. Cheap to clone; clones share it.
#[derive(Clone, Default)]
pub struct SharedClient {
    inner: Arc<(Mutex<Option<Client>>, Condvar)>,
}

impl SharedClient {
    /// A handle with no client yet.
    pub fn new() -> Self {
        SharedClient::default()
    }

    /// The client, if it is made.
    pub fn get(&self) -> Option<Client> {
        self.inner
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Blocks until the client is made; `None` if `stop` is set first.
    pub fn wait(&self, stop: &AtomicBool) -> Option<Client> {
        let (slot, ready) = &*self.inner;
        let mut client = slot.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(c) = client.as_ref() {
                return Some(c.clone());
            }
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            client = ready
                .wait_timeout(client, STOP_CHECK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn set(&self, client: Client) {
        let (slot, ready) = &*self.inner;
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(client);
        ready.notify_all();
    }
}

/// What making the client needs.
pub struct Connect {
    pub config: Config,
    pub kubeconfig: PathBuf,
    /// Until when the client certificate is valid, and why there is no working one.
    pub credentials: ClientCertState,
    /// Set when the agent stops: the thread gives up waiting.
    pub stop: Arc<AtomicBool>,
}

impl Connect {
    /// Makes the client on a thread of its own and puts it in `shared`, starting the
    /// rotation of its certificate when the config asks for it.
    pub fn spawn(self, shared: SharedClient) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("uplink-start".into())
            .spawn(move || {
                if let Some(client) = self.until_usable() {
                    log::info!("uplink: apiserver {}", client.server());
                    self.start_rotation(&client);
                    shared.set(client);
                }
            })
            .map(drop)
    }

    /// Reads the kubeconfig until it gives a client; `None` if stopped first.
    fn until_usable(&self) -> Option<Client> {
        let mut failures = 0u32;
        let mut last_error = String::new();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            // With a bootstrap kubeconfig this also asks the cluster for the node's
            // client certificate, waiting for the signer; the pods run meanwhile.
            let msg = match bootstrap::connect(&self.config, &self.kubeconfig, &self.credentials) {
                Ok(c) => return Some(c),
                Err(e) => e.message,
            };
            if msg != last_error {
                log::error!("{msg}; pods keep running, the kubeconfig is read again with back-off");
                last_error = msg;
            }
            if wait_for_clock(&self.stop) {
                // The certificates looked not yet valid to a clock that was not set:
                // read the file again now that it is, not after a back-off that grew
                // while the board was in 1970.
                continue;
            }
            failures = failures.saturating_add(1);
            let wait = RELOAD.jittered(failures, crate::backoff::random());
            sleep_unless_stopped(&self.stop, wait.max(RELOAD.initial));
        }
    }

    /// With `rotateCertificates` and a client certificate from the bootstrap, the thread
    /// that renews it before it expires, in the running client.
    fn start_rotation(&self, client: &Client) {
        let Some(bootstrap) = self.config.bootstrap_kubeconfig.clone() else {
            return;
        };
        if !self.config.rotate_certificates || client.client_certificate_validity().is_none() {
            return;
        }
        let rotation = Rotation {
            client: client.clone(),
            files: bootstrap::client_pair_files(&self.config),
            node_name: self.config.node_name.clone(),
            bootstrap: Some(bootstrap),
            state: self.credentials.clone(),
            stop: self.stop.clone(),
        };
        if let Err(e) = rotation.spawn() {
            log::error!("uplink: cannot start the certificate rotation thread: {e}");
        }
    }
}

/// Waits while the wall clock is not set (reading the local clock only); true if it
/// had to wait.
fn wait_for_clock(stop: &AtomicBool) -> bool {
    let mut waited = false;
    while !stop.load(Ordering::Relaxed) && !crate::time::clock_is_sane() {
        waited = true;
        std::thread::sleep(STOP_CHECK);
    }
    waited
}

fn sleep_unless_stopped(stop: &AtomicBool, total: Duration) {
    let deadline = std::time::Instant::now() + total;
    while !stop.load(Ordering::Relaxed) {
        let now = std::time::Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(STOP_CHECK));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_when_stopped_before_a_client_is_made() {
        let shared = SharedClient::new();
        let stop = AtomicBool::new(true);
        assert!(shared.wait(&stop).is_none());
        assert!(shared.get().is_none());
    }
}
