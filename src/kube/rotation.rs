//! Client certificate rotation, as the kubelet's `rotateCertificates`: at a random 70 to
//! 90 % of the certificate's life a new key and CSR are sent (authenticated with the
//! current certificate), and the issued pair is saved and swapped into the running
//! client without a restart. A certificate that expired while the site was offline is
//! asked for again with the bootstrap kubeconfig. Failures are retried with back-off and
//! counted; what `holdfast status` shows of it lives in [`ClientCertState`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::cert_state::ClientCertState;
use super::client::Client;
use super::csr::{self, CsrSpec, Issued, PairFiles};
use crate::backoff::Backoff;
use crate::tls::der::Validity;

/// How long a rotation CSR is waited for before it counts as failed.
const ROTATION_WAIT: Duration = Duration::from_secs(15 * 60);
/// Retries of a failed rotation: client-go's certificate manager backs off similarly.
const RETRY: Backoff = Backoff {
    initial: Duration::from_secs(2),
    max: Duration::from_secs(300),
};

/// The rotation thread's parts.
pub struct Rotation {
    pub client: Client,
    pub files: PairFiles,
    pub node_name: String,
    /// Asked when the current certificate is refused (it expired while offline).
    pub bootstrap: Option<PathBuf>,
    pub state: ClientCertState,
    pub stop: Arc<AtomicBool>,
}

impl Rotation {
    /// Starts the `cert-rotation` thread.
    pub fn spawn(self) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("cert-rotation".into())
            .spawn(move || self.run())
            .map(|_| ())
    }

    fn run(self) {
        let mut failures = 0u32;
        let mut planned: Option<(Validity, SystemTime)> = None;
        while !self.stop.load(Ordering::Relaxed) {
            let Some(validity) = self.client.client_certificate_validity() else {
                log::warn!("certificate rotation: the client has no certificate; not rotating");
                return;
            };
            self.state.set_validity(Some(validity));
            let deadline = match planned {
                Some((v, d)) if v == validity => d,
                _ => {
                    let d = csr::rotation_deadline(&validity);
                    log::info!(
                        "client certificate valid until {}; rotation planned at {}",
                        crate::time::show_unix(validity.not_after),
                        crate::time::show_unix(unix(d))
                    );
                    planned = Some((validity, d));
                    d
                }
            };
            if !self.sleep_until(deadline) {
                return;
            }
            match self.rotate() {
                Ok(v) => {
                    failures = 0;
                    self.state.rotated(v, unix(SystemTime::now()));
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    crate::metrics::CLIENT_CERT_RENEW_ERRORS.inc();
                    let wait = RETRY.jittered(failures, crate::backoff::random());
                    let wait = wait.max(RETRY.initial);
                    log::error!(
                        "client certificate rotation failed ({failures} in a row): {e}; \
                         trying again in {wait:?}"
                    );
                    if failures > 1 || expired(&validity) {
                        self.state.set_problem(format!(
                            "client certificate (valid until {}) could not be renewed: {e}",
                            crate::time::show_unix(validity.not_after)
                        ));
                    }
                    if !self.sleep_until(SystemTime::now() + wait) {
                        return;
                    }
                }
            }
        }
    }

    /// A new pair, saved and swapped in, then shown to work; the previous one is put
    /// back if the apiserver refuses the new one.
    fn rotate(&self) -> Result<Validity, String> {
        let spec = CsrSpec::kubelet_client(&self.node_name);
        let issued = match csr::request(&self.client, &spec, ROTATION_WAIT) {
            Ok(issued) => issued,
            Err(e) if e.is_unauthorized() => match &self.bootstrap {
                Some(bootstrap) => {
                    log::warn!(
                        "the apiserver refused the client certificate ({e}); asking again \
                         with the bootstrap kubeconfig {}",
                        bootstrap.display()
                    );
                    super::bootstrap::request_client_certificate(
                        bootstrap,
                        &self.node_name,
                        &self.client.servers(),
                    )
                    .map_err(|b| {
                        if b.is_unauthorized() {
                            format!(
                                "the apiserver refused both the client certificate and the \
                                     bootstrap kubeconfig {} (401 Unauthorized); give the node \
                                     a new bootstrap token or a kubeconfig; pods keep running",
                                bootstrap.display()
                            )
                        } else {
                            format!("bootstrap: {b}")
                        }
                    })?
                }
                None => return Err(e.to_string()),
            },
            Err(e) => return Err(e.to_string()),
        };
        let previous = self.files.load().ok().flatten();
        self.files
            .save(&issued)
            .map_err(|e| format!("save the new pair in {}: {e}", self.files.dir().display()))?;
        self.client
            .set_client_certificate(&issued.chain_pem, &issued.key_pem)?;
        let path = format!("/api/v1/nodes/{}", super::escape(&self.node_name));
        match self.client.get::<serde_json::Value>(&path) {
            Ok(_) => {}
            Err(e) if e.is_unauthorized() => {
                if let Some(old) = previous {
                    self.put_back(&old);
                }
                return Err(format!("the apiserver refused the new certificate: {e}"));
            }
            // Not a verdict on the certificate; the next requests will tell.
            Err(e) => log::warn!("client certificate rotated, not yet confirmed: {e}"),
        }
        log::info!(
            "client certificate rotated; the new one is valid until {}",
            crate::time::show_unix(issued.validity.not_after)
        );
        Ok(issued.validity)
    }

    fn put_back(&self, old: &Issued) {
        if let Err(e) = self
            .client
            .set_client_certificate(&old.chain_pem, &old.key_pem)
        {
            log::error!("put the previous client certificate back: {e}");
        }
        if let Err(e) = self.files.save(old) {
            log::error!("save the previous client certificate again: {e}");
        }
    }

    /// Sleeps until `t` (wall clock, read again every second so a clock set meanwhile
    /// counts); false when stopped.
    fn sleep_until(&self, t: SystemTime) -> bool {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            match t.duration_since(SystemTime::now()) {
                Ok(left) if !left.is_zero() => std::thread::sleep(left.min(Duration::from_secs(1))),
                _ => return true,
            }
        }
    }
}

fn expired(v: &Validity) -> bool {
    unix(SystemTime::now()) > v.not_after
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rotation_is_retried_with_back_off_counted_and_shown() {
        use crate::kube::testpki::{Pki, Scratch};
        let pki = Pki::new("ca");
        // Valid 1990-2030: its 70-90 % point has passed, so rotation starts at once.
        let leaf = pki.client_between("system:node:gw", 1990, 2030);
        let dir = Scratch::new("rotation-fails");
        let ca = dir.write("ca.crt", &pki.ca_pem);
        let cert = dir.write("c.crt", &leaf.cert);
        let key = dir.write("c.key", &leaf.key);
        // A port nothing listens on: the CSR cannot be sent.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let kubeconfig = dir.write(
            "kubeconfig",
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
                 server: https://127.0.0.1:{port}\n    certificate-authority: {}\n\
                 users:\n- name: u\n  user:\n    client-certificate: {}\n    client-key: {}\n\
                 contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
                ca.display(),
                cert.display(),
                key.display()
            ),
        );
        let client = Client::from_kubeconfig(&kubeconfig).expect("client");
        let state = ClientCertState::default();
        let stop = Arc::new(AtomicBool::new(false));
        let errors_before = crate::metrics::CLIENT_CERT_RENEW_ERRORS.get();
        let started = std::time::Instant::now();
        Rotation {
            client,
            files: PairFiles::new(dir.path().join("pki"), csr::CLIENT_PREFIX),
            node_name: "gw".into(),
            bootstrap: None,
            state: state.clone(),
            stop: stop.clone(),
        }
        .spawn()
        .expect("spawn");
        let deadline = started + Duration::from_secs(20);
        while state.report().problem.is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        let problem = state.report().problem.expect("the second failure is shown");
        assert!(problem.contains("could not be renewed"), "{problem}");
        assert!(
            crate::metrics::CLIENT_CERT_RENEW_ERRORS.get() >= errors_before + 2,
            "each failure counted"
        );
        assert!(
            started.elapsed() >= RETRY.initial,
            "the second try waited for the back-off"
        );
        assert!(!dir.path().join("pki").exists(), "nothing saved");
    }

    #[test]
    fn the_ttl_gauge_follows_the_certificate_in_use() {
        let state = ClientCertState::published();
        let in_an_hour = unix(SystemTime::now()) + 3600;
        state.set_validity(Some(Validity {
            not_before: 0,
            not_after: in_an_hour,
        }));
        let mut out = String::new();
        crate::metrics::render_all(&mut out);
        let ttl = out
            .lines()
            .find_map(|l| l.strip_prefix("kubelet_certificate_manager_client_ttl_seconds "))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or_else(|| panic!("no TTL gauge in:\n{out}"));
        assert!((3590..=3600).contains(&ttl), "{ttl}");
        assert!(out.contains("kubelet_certificate_manager_client_expiration_renew_errors "));
    }
}
