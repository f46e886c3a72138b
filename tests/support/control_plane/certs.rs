//! The control plane's credentials, all from one test CA: the apiserver's serving
//! certificate, the service-account signing key, the client certificates of the
//! apiserver (towards kubelets), the controller-manager, the scheduler, an admin and
//! nodes, and kubeconfig files that carry them.

use std::path::{Path, PathBuf};

use super::pki::{Issued, Pki};

/// The cluster's Service range; its first address is the `kubernetes` Service's.
pub const SERVICE_CIDR: &str = "10.96.0.0/24";
const SERVICE_IP: &str = "10.96.0.1";

pub struct Certs {
    pub pki: Pki,
    pub apiserver: Issued,
    /// The apiserver's client certificate for kubelet APIs (O=system:masters).
    pub kubelet_client: Issued,
    /// Service-account token signing key (PKCS#8 PEM) and its public key (PEM).
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

impl Certs {
    pub fn new(dir: &Path) -> Certs {
        let pki = Pki::new(dir);
        let apiserver = pki.server(
            "apiserver",
            &[
                "127.0.0.1",
                "localhost",
                SERVICE_IP,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        );
        let kubelet_client = pki.client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        );
        let sa = rcgen::KeyPair::generate().expect("service-account key");
        let sa_key = dir.join("sa.key");
        let sa_pub = dir.join("sa.pub");
        std::fs::write(&sa_key, sa.serialize_pem()).expect("write sa.key");
        std::fs::write(&sa_pub, sa.public_key_pem()).expect("write sa.pub");
        Certs {
            pki,
            apiserver,
            kubelet_client,
            sa_key,
            sa_pub,
        }
    }

    /// Writes `<file>.kubeconfig` for a client certificate CN=`cn`, O=`orgs` (its
    /// certificate and key beside it, by path) and returns its path.
    pub fn kubeconfig(&self, url: &str, file: &str, cn: &str, orgs: &[&str]) -> PathBuf {
        let cert = self.pki.client(file, cn, orgs);
        let path = self.pki.dir.join(format!("{file}.kubeconfig"));
        let q = |p: &Path| serde_json::to_string(&p.display().to_string()).unwrap_or_default();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    \
             server: {url}\n    certificate-authority: {}\nusers:\n- name: {file}\n  user:\n    \
             client-certificate: {}\n    client-key: {}\ncontexts:\n- name: test\n  context:\n    \
             cluster: test\n    user: {file}\ncurrent-context: test\n",
            q(&self.pki.ca),
            q(&cert.cert),
            q(&cert.key),
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }
}
