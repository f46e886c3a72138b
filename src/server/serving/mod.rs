//! The serving certificate as the cluster issues it (`serverTLSBootstrap`): a
//! `kubernetes.io/kubelet-serving` CSR for the node's names and addresses, the issued pair
//! kept in `<root>/pki/kubelet-server-current.pem`, swapped into the running listener
//! when issued and asked for again at the rotation deadline or when the node's addresses
//! change. Until the first one is issued the listener serves what [`super::tls`] made
//! (`tlsCertFile`, else the self-signed certificate).
//!
//! kube-controller-manager approves no kubelet-serving CSR: the cluster's operator does
//! (`kubectl certificate approve`). A request is waited for [`CSR_WAIT`], as the
//! kubelet's certificate manager waits, and then sent again with a new key; a request
//! that could not be sent, or was denied, is sent again with back-off. Whatever happens
//! the listener keeps what it serves, and each new reason is logged once.
//!
//! The CSR and the pair files are [`crate::kube::csr`]'s; this module decides what to
//! ask for and when. Files: [`resolver`] (the certificate the listener hands out), [`san`]
//! (the names a certificate is for).

use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use rustls::sign::CertifiedKey;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::kube::connect::SharedClient;
use crate::kube::csr::{self, CsrError, CsrSpec, Issued, PairFiles};

mod resolver;
mod san;

pub use resolver::ServingCert;

/// How long one CSR is waited for before a new one is sent (client-go's certificate
/// manager waits 15 minutes).
pub const CSR_WAIT: Duration = Duration::from_secs(15 * 60);

/// The longest wait for the agent's client while the kubeconfig cannot be used yet.
const KUBECONFIG_RETRY: Duration = Duration::from_secs(30);

/// How often the node's addresses are looked at while a certificate is served.
pub const ADDRESS_CHECK: Duration = Duration::from_secs(10);

/// Between requests that failed (apiserver unreachable, denied, no usable kubeconfig).
const RETRY: Backoff = Backoff {
    initial: Duration::from_secs(2),
    max: Duration::from_secs(300),
};

/// The names a serving certificate is for: the node's Hostname address as a DNS name
/// (or an IP address if it is one) and its InternalIP, sorted, as the kubelet builds
/// its request from the Node's addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Names {
    /// What the Node's status reports now (see [`Config::node_address`]).
    pub fn of_node(config: &Config) -> Names {
        let address = config.node_address().and_then(|a| a.parse().ok());
        Names::new(&config.node_name, address)
    }

    fn new(hostname: &str, internal_ip: Option<IpAddr>) -> Names {
        let mut names = Names {
            dns: Vec::new(),
            ips: internal_ip.into_iter().collect(),
        };
        match hostname.parse::<IpAddr>() {
            Ok(ip) => names.ips.push(ip),
            Err(_) if !hostname.is_empty() => names.dns.push(hostname.to_string()),
            Err(_) => {}
        }
        names.sort();
        names
    }

    fn sort(&mut self) {
        self.dns.sort();
        self.dns.dedup();
        self.ips.sort();
        self.ips.dedup();
    }

    /// The subject alternative names of a DER certificate; None if it cannot be read.
    pub fn of_certificate(der: &[u8]) -> Option<Names> {
        let mut names = san::read(der)?;
        names.sort();
        Some(names)
    }

    /// The request for these names, as the kubelet sends it for an ECDSA key.
    pub fn request(&self, node_name: &str) -> CsrSpec {
        CsrSpec {
            signer_name: csr::KUBELET_SERVING_SIGNER.to_string(),
            common_name: format!("system:node:{node_name}"),
            organizations: vec!["system:nodes".to_string()],
            dns_names: self.dns.clone(),
            ip_addresses: self.ips.clone(),
            // client-go asks key encipherment for RSA keys only.
            usages: vec!["digital signature".to_string(), "server auth".to_string()],
            expiration_seconds: None,
        }
    }
}

/// A pair from the cluster, as the listener and the rotation see it.
struct Held {
    issued: Issued,
    names: Option<Names>,
    deadline: SystemTime,
}

impl Held {
    fn new(issued: Issued) -> Held {
        let names = crate::tls::certificates(issued.chain_pem.as_bytes())
            .ok()
            .and_then(|chain| Names::of_certificate(&chain[0]));
        let deadline = csr::rotation_deadline(&issued.validity);
        Held {
            issued,
            names,
            deadline,
        }
    }
}

/// When the next request is due, from now: at once without a certificate from the
/// cluster or with one for other names, else at its rotation deadline, looked at again
/// within [`ADDRESS_CHECK`].
fn next_request(
    held: Option<(&Option<Names>, SystemTime)>,
    wanted: &Names,
    now: SystemTime,
) -> Duration {
    match held {
        Some((Some(names), deadline)) if names == wanted => deadline
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(ADDRESS_CHECK),
        _ => Duration::ZERO,
    }
}

/// Turns an issued pair into what the listener serves.
fn certified(issued: &Issued) -> Result<CertifiedKey, String> {
    let chain = crate::tls::certificates(issued.chain_pem.as_bytes())?;
    let key = crate::tls::private_key(issued.key_pem.as_bytes())?;
    CertifiedKey::from_der(chain, key, &crate::tls::provider()).map_err(|e| e.to_string())
}

/// `serverTLSBootstrap` for one agent: what it asks for and where it keeps it.
pub struct Bootstrap {
    config: Config,
    /// The agent's client, which asks with the node's own certificate.
    client: SharedClient,
    files: PairFiles,
}

impl Bootstrap {
    /// Some when the config asks for `serverTLSBootstrap` and the node has a client
    /// for the apiserver (a kubeconfig, or a bootstrap kubeconfig, which writes one).
    pub fn from_config(config: &Config, client: Option<SharedClient>) -> Option<Bootstrap> {
        if !config.server.server_tls_bootstrap {
            return None;
        }
        let Some(client) = client else {
            log::warn!(
                "kubelet API: serverTLSBootstrap needs a kubeconfig to ask the cluster for a \
                 serving certificate; serving the certificate made here"
            );
            return None;
        };
        Some(Bootstrap {
            config: config.clone(),
            client,
            files: PairFiles::new(config.root_dir.join("pki"), csr::SERVER_PREFIX),
        })
    }

    /// The stored pair if it can be served: it reads, its key is its certificate's, it
    /// is valid now (or the clock is not set yet), and it names the node's addresses.
    fn stored(&self) -> Option<Held> {
        let issued = match self.files.load() {
            Ok(Some(i)) => i,
            Ok(None) => return None,
            Err(e) => {
                log::warn!("kubelet API: serving certificate {e}; asking for a new one");
                return None;
            }
        };
        if crate::time::clock_is_sane() && !issued.valid_at(SystemTime::now()) {
            log::info!(
                "kubelet API: serving certificate {} is not valid now; asking for a new one",
                self.files.current_path().display()
            );
            return None;
        }
        let held = Held::new(issued);
        let wanted = Names::of_node(&self.config);
        if held.names.as_ref() != Some(&wanted) {
            log::info!(
                "kubelet API: serving certificate {} is for {:?}, the node is {wanted:?}; \
                 asking for a new one",
                self.files.current_path().display(),
                held.names
            );
            return None;
        }
        Some(held)
    }

    /// Serves the stored pair at once if it can be, then asks for and rotates the
    /// certificate on a thread of its own, which ends when `serving` is dropped.
    /// Blocking (files).
    pub fn start(self, serving: &Arc<ServingCert>) {
        let held = self.stored().and_then(|h| match certified(&h.issued) {
            Ok(c) => {
                serving.set(c);
                log::info!(
                    "kubelet API: serving the cluster's certificate {}",
                    self.files.current_path().display()
                );
                Some(h)
            }
            Err(e) => {
                log::warn!("kubelet API: serving certificate: {e}; asking for a new one");
                None
            }
        });
        let weak = Arc::downgrade(serving);
        let spawned = std::thread::Builder::new()
            .name("serving-cert".into())
            .spawn(move || self.run(held, weak));
        if let Err(e) = spawned {
            log::error!("kubelet API: cannot start the serving certificate thread: {e}");
        }
    }

    fn run(self, mut held: Option<Held>, serving: Weak<ServingCert>) {
        let mut failures = 0u32;
        let mut last_reason = String::new();
        loop {
            let wanted = Names::of_node(&self.config);
            let wait = next_request(
                held.as_ref().map(|h| (&h.names, h.deadline)),
                &wanted,
                SystemTime::now(),
            );
            if !wait.is_zero() {
                if !sleep_while_served(&serving, wait) {
                    return;
                }
                continue;
            }
            match self.request(&wanted) {
                Ok((issued, certified)) => {
                    let Some(target) = serving.upgrade() else {
                        return;
                    };
                    target.set(certified);
                    self.keep(&issued, &wanted);
                    held = Some(Held::new(issued));
                    failures = 0;
                    last_reason.clear();
                }
                Err(e) => {
                    let (reason, retry_now) = match &e {
                        Failure::Csr(CsrError::Timeout { .. }) => ("timeout".to_string(), true),
                        Failure::Csr(CsrError::Denied { .. }) => ("denied".to_string(), false),
                        other => (other.to_string(), false),
                    };
                    if reason != last_reason {
                        log::warn!(
                            "kubelet API: no serving certificate from the cluster: {}; \
                             serving what it has and asking again",
                            crate::error_chain(&e)
                        );
                        last_reason = reason;
                    }
                    if retry_now {
                        continue;
                    }
                    failures = failures.saturating_add(1);
                    let mut delay = RETRY.jittered(failures, crate::backoff::random());
                    if let Failure::NoClient = e {
                        // The client bootstrap is under way, most likely: asking the
                        // handle is cheap, and the pair is wanted soon after.
                        delay = delay.min(KUBECONFIG_RETRY);
                    }
                    if !sleep_while_served(&serving, delay.max(RETRY.initial)) {
                        return;
                    }
                }
            }
        }
    }

    /// One request with the agent's client (its certificate rotated in place).
    fn request(&self, names: &Names) -> Result<(Issued, CertifiedKey), Failure> {
        let client = self.client.get().ok_or(Failure::NoClient)?;
        let issued = csr::request(&client, &names.request(&self.config.node_name), CSR_WAIT)
            .map_err(Failure::Csr)?;
        let certified = certified(&issued).map_err(Failure::Unusable)?;
        Ok((issued, certified))
    }

    /// Keeps an issued pair for the next start; one that cannot be kept is still served.
    fn keep(&self, issued: &Issued, names: &Names) {
        match self.files.save(issued) {
            Ok(path) => log::info!(
                "kubelet API: serving the certificate the cluster issued for {names:?}, kept \
                 in {}",
                path.display()
            ),
            Err(e) => log::error!(
                "kubelet API: serving the certificate the cluster issued, but it could not be \
                 kept in {}: {e}; it will be asked for again at the next start",
                self.files.dir().display()
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("the node's kubeconfig cannot be used yet")]
    NoClient,
    #[error(transparent)]
    Csr(CsrError),
    #[error("the issued certificate cannot be served: {0}")]
    Unusable(String),
}

/// Sleeps `total` in short steps; false as soon as the listener is gone.
fn sleep_while_served(serving: &Weak<ServingCert>, total: Duration) -> bool {
    let started = std::time::Instant::now();
    loop {
        if serving.strong_count() == 0 {
            return false;
        }
        let elapsed = started.elapsed();
        if elapsed >= total {
            return true;
        }
        std::thread::sleep((total - elapsed).min(Duration::from_secs(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn self_signed(names: &[&str]) -> (CertifiedKey, Vec<u8>) {
        let key = rcgen::KeyPair::generate().expect("key");
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        let der = cert.der().to_vec();
        let issued = Issued::from_pem(cert.pem(), key.serialize_pem()).expect("pair");
        (certified(&issued).expect("certified"), der)
    }

    #[test]
    fn names_are_the_nodes_hostname_and_internal_ip_sorted() {
        let n = Names::new("gw-7", Some(IpAddr::from([10, 0, 0, 9])));
        assert_eq!(n.dns, vec!["gw-7".to_string()]);
        assert_eq!(n.ips, vec![IpAddr::from([10, 0, 0, 9])]);
        let n = Names::new("10.0.240.5", Some(IpAddr::from([10, 0, 240, 5])));
        assert!(n.dns.is_empty());
        assert_eq!(n.ips, vec![IpAddr::from([10, 0, 240, 5])]);
        let spec = Names::new("gw-7", Some(IpAddr::from([10, 0, 0, 9]))).request("gw-7");
        assert_eq!(spec.signer_name, "kubernetes.io/kubelet-serving");
        assert_eq!(spec.common_name, "system:node:gw-7");
        assert_eq!(spec.organizations, vec!["system:nodes".to_string()]);
        assert_eq!(spec.usages, vec!["digital signature", "server auth"]);
    }

    #[test]
    fn it_runs_with_server_tls_bootstrap_and_a_client() {
        let mut c = Config::with_defaults("gw".into());
        let client = || Some(SharedClient::new());
        assert!(
            Bootstrap::from_config(&c, client()).is_none(),
            "off by default"
        );
        c.server.server_tls_bootstrap = true;
        let b = Bootstrap::from_config(&c, client()).expect("on");
        assert_eq!(
            b.files.current_path(),
            c.root_dir.join("pki/kubelet-server-current.pem")
        );
        assert!(Bootstrap::from_config(&c, None).is_none(), "nobody to ask");
    }

    #[test]
    fn certificate_names_are_read_from_its_extension() {
        let (_, der) = self_signed(&["gw-7", "10.0.0.9", "fd00::1", "a.example"]);
        let n = Names::of_certificate(&der).expect("names");
        assert_eq!(n.dns, vec!["a.example".to_string(), "gw-7".to_string()]);
        assert_eq!(
            n.ips,
            vec![
                IpAddr::from([10, 0, 0, 9]),
                "fd00::1".parse::<IpAddr>().expect("ip")
            ]
        );
        assert_eq!(Names::of_certificate(&der[..der.len() / 2]), None);
        assert_eq!(Names::of_certificate(b"not a certificate"), None);
    }

    #[test]
    fn a_request_is_due_without_a_matching_certificate_else_at_its_deadline() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let wanted = Names::new("gw", Some(IpAddr::from([10, 0, 0, 9])));
        let other = Some(Names::new("gw", Some(IpAddr::from([10, 0, 0, 8]))));
        let far = now + Duration::from_secs(3600);
        assert_eq!(next_request(None, &wanted, now), Duration::ZERO);
        assert_eq!(
            next_request(Some((&other, far)), &wanted, now),
            Duration::ZERO
        );
        assert_eq!(
            next_request(Some((&None, far)), &wanted, now),
            Duration::ZERO
        );
        let same = Some(wanted.clone());
        assert_eq!(
            next_request(Some((&same, far)), &wanted, now),
            ADDRESS_CHECK
        );
        let soon = now + Duration::from_secs(3);
        assert_eq!(
            next_request(Some((&same, soon)), &wanted, now),
            Duration::from_secs(3)
        );
        let past = now - Duration::from_secs(3);
        assert_eq!(
            next_request(Some((&same, past)), &wanted, now),
            Duration::ZERO
        );
    }
}
