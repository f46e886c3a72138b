//! TLS bootstrap, as the kubelet's `--bootstrap-kubeconfig`: when the node's kubeconfig
//! is missing or its client certificate cannot be used (expired, not yet valid, its key
//! unreadable), a key is made on the device, a `kubernetes.io/kube-apiserver-client-kubelet`
//! CSR is sent with the bootstrap credential (a bootstrap token), and once signed the
//! pair goes to `<root>/pki/kubelet-client-current.pem` and a kubeconfig naming it is
//! written. Runs on the thread that connects the agent to the cluster: the pods run
//! meanwhile.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cert_state::ClientCertState;
use super::client::Client;
use super::csr::{self, CsrError, CsrSpec, PairFiles, CLIENT_PREFIX};
use super::kubeconfig::{Kubeconfig, KubeconfigError};
use crate::config::Config;

/// How long a bootstrap CSR is waited for before it is sent again: the kubelet's hour.
pub const BOOTSTRAP_WAIT: Duration = Duration::from_secs(3600);

/// The pair files of the node's client certificate: `<root>/pki/kubelet-client-*.pem`.
pub fn client_pair_files(config: &Config) -> PairFiles {
    PairFiles::new(config.root_dir.join("pki"), CLIENT_PREFIX)
}

/// The node's kubeconfig: `--kubeconfig`, else (with a bootstrap kubeconfig)
/// `<root>/kubeconfig`, which the bootstrap writes.
pub fn node_kubeconfig(config: &Config) -> Option<PathBuf> {
    match (&config.kubeconfig, &config.bootstrap_kubeconfig) {
        (Some(k), _) => Some(k.clone()),
        (None, Some(_)) => Some(config.root_dir.join("kubeconfig")),
        (None, None) => None,
    }
}

/// Why no client could be made, in words for the log and `holdfast status`.
#[derive(Debug)]
pub struct ConnectError {
    pub message: String,
}

/// A client for the node's kubeconfig; with a bootstrap kubeconfig, a new client
/// certificate is asked for first when the kubeconfig cannot be used. Blocking: the
/// wait for the signer lasts up to [`BOOTSTRAP_WAIT`].
pub fn connect(
    config: &Config,
    kubeconfig: &Path,
    state: &ClientCertState,
) -> Result<Client, ConnectError> {
    let node_error = match Client::from_kubeconfig_with(kubeconfig, &config.apiservers) {
        Ok(client) => {
            state.set_validity(client.client_certificate_validity());
            state.clear_problem();
            return Ok(client);
        }
        Err(e) => e,
    };
    // A certificate that looks out of date to a clock not yet set is no reason to ask
    // for another: the caller waits for the clock and reads the kubeconfig again.
    let clock_unset =
        matches!(node_error, KubeconfigError::Validity { .. }) && !crate::time::clock_is_sane();
    let Some(bootstrap) = config
        .bootstrap_kubeconfig
        .as_ref()
        .filter(|_| !clock_unset)
    else {
        return Err(ConnectError {
            message: node_error.to_string(),
        });
    };
    log::info!(
        "{node_error}; asking the cluster for a client certificate with the bootstrap \
         kubeconfig {}",
        bootstrap.display()
    );
    let fail = |message: String, refused: bool| {
        let message = if refused {
            format!(
                "the node's kubeconfig cannot be used ({node_error}) and the apiserver refused \
                 the bootstrap kubeconfig {} (401 Unauthorized: its token expired or was \
                 deleted); give the node a new bootstrap token or a kubeconfig; pods keep \
                 running",
                bootstrap.display()
            )
        } else {
            format!("{node_error}; bootstrap: {message}")
        };
        state.set_problem(message.clone());
        ConnectError { message }
    };
    let issued = request_client_certificate(bootstrap, &config.node_name, &config.apiservers)
        .map_err(|e| fail(e.to_string(), e.is_unauthorized()))?;
    install(config, kubeconfig, bootstrap, &issued).map_err(|m| fail(m, false))?;
    let client = Client::from_kubeconfig_with(kubeconfig, &config.apiservers)
        .map_err(|e| fail(format!("the written kubeconfig: {e}"), false))?;
    state.set_validity(client.client_certificate_validity());
    state.clear_problem();
    Ok(client)
}

/// A new client certificate for `node`, asked for with the bootstrap kubeconfig, of
/// its server or of the other apiserver endpoints `more`.
pub fn request_client_certificate(
    bootstrap: &Path,
    node: &str,
    more: &[String],
) -> Result<csr::Issued, CsrError> {
    let client = Client::from_kubeconfig_with(bootstrap, more).map_err(|e| {
        CsrError::Api(super::ApiError::Transport {
            method: "POST",
            path: "/apis/certificates.k8s.io/v1/certificatesigningrequests".to_string(),
            message: format!("bootstrap kubeconfig: {e}"),
        })
    })?;
    csr::request(&client, &CsrSpec::kubelet_client(node), BOOTSTRAP_WAIT)
}

/// Saves the pair and writes the kubeconfig that names it, at `kubeconfig` and, when
/// that is elsewhere, at `<root>/kubeconfig` too.
fn install(
    config: &Config,
    kubeconfig: &Path,
    bootstrap: &Path,
    issued: &csr::Issued,
) -> Result<(), String> {
    let files = client_pair_files(config);
    let saved = files.save(issued).map_err(|e| {
        format!(
            "save the client certificate in {}: {e}",
            files.dir().display()
        )
    })?;
    log::info!(
        "client certificate issued, valid until {}, saved as {}",
        crate::time::show_unix(issued.validity.not_after),
        saved.display()
    );
    let boot = Kubeconfig::load(bootstrap).map_err(|e| e.to_string())?;
    let text = kubeconfig_text(&boot, &files.current_path());
    let root_copy = config.root_dir.join("kubeconfig");
    for path in [kubeconfig, root_copy.as_path()] {
        write_private(path, text.as_bytes())
            .map_err(|e| format!("write the kubeconfig {}: {e}", path.display()))?;
        if path == root_copy {
            break;
        }
    }
    Ok(())
}

/// A kubeconfig as the kubelet writes it after a bootstrap: the bootstrap's server and
/// CA, and the pair file as both the certificate and the key.
fn kubeconfig_text(boot: &Kubeconfig, pair: &Path) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut ca = String::new();
    for cert in &boot.ca {
        ca.push_str(&crate::tls::pem_encode("CERTIFICATE", cert.as_ref()));
    }
    let ca_line = if ca.is_empty() {
        String::new()
    } else {
        format!(
            "    certificate-authority-data: {}\n",
            crate::wire::base64_encode(ca.as_bytes())
        )
    };
    let server_name = boot
        .tls_server_name
        .as_ref()
        .map(|n| format!("    tls-server-name: {}\n", q(&n.to_str())))
        .unwrap_or_default();
    let pair = pair.display().to_string();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: default-cluster\n  cluster:\n    \
         server: {}\n{ca_line}{server_name}contexts:\n- name: default-context\n  context:\n    \
         cluster: default-cluster\n    namespace: default\n    user: default-auth\n\
         current-context: default-context\nusers:\n- name: default-auth\n  user:\n    \
         client-certificate: {}\n    client-key: {}\n",
        q(&boot.server),
        q(&pair),
        q(&pair),
    )
}

/// Writes `bytes` to `path` as a new 0600 file renamed over the old one, fsynced.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        fs::create_dir_all(dir)?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{}.new", name.unwrap_or_default()));
    let _ = fs::remove_file(&tmp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = file.write_all(bytes).and_then(|_| file.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = dir {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::kube::testpki::Pki;

    #[test]
    fn the_written_kubeconfig_names_the_pair_file_and_loads() {
        let dir = std::env::temp_dir().join(format!(
            "holdfast-bootstrap-{}-{}",
            std::process::id(),
            crate::backoff::random()
        ));
        fs::create_dir_all(&dir).expect("mkdir");
        let pki = Pki::new("cluster-ca");
        let ca = dir.join("ca.crt");
        fs::write(&ca, &pki.ca_pem).expect("ca");
        let boot = dir.join("bootstrap.conf");
        fs::write(
            &boot,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
                 server: https://127.0.0.1:6443\n    certificate-authority: {}\n\
                 users:\n- name: b\n  user:\n    token: abcdef.0123456789abcdef\n\
                 contexts:\n- name: x\n  context: {{cluster: c, user: b}}\ncurrent-context: x\n",
                ca.display()
            ),
        )
        .expect("bootstrap");
        let mut config = Config::with_defaults("gw-1".into());
        config.root_dir = dir.join("root");
        config.bootstrap_kubeconfig = Some(boot.clone());
        let kubeconfig = node_kubeconfig(&config).expect("path");
        assert_eq!(kubeconfig, dir.join("root/kubeconfig"));

        let leaf = pki.client("system:node:gw-1");
        let issued = csr::Issued::from_pem(leaf.cert, leaf.key).expect("issued");
        install(&config, &kubeconfig, &boot, &issued).expect("install");

        let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&kubeconfig), 0o600);
        assert_eq!(mode(&dir.join("root/pki")), 0o700);
        let text = fs::read_to_string(&kubeconfig).expect("read");
        assert!(
            text.contains("root/pki/kubelet-client-current.pem"),
            "{text}"
        );
        let kc = Kubeconfig::load(&kubeconfig).expect("load the written kubeconfig");
        assert_eq!(kc.server, "https://127.0.0.1:6443");
        assert_eq!(kc.ca.len(), 1);
        assert!(kc.identity.is_some());
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
