//! Client credentials for the double: certificates from its CA, bearer tokens, and
//! kubeconfig files that point at it (file paths or inline `-data`, optional
//! `tls-server-name`).

use std::path::{Path, PathBuf};

use super::pki::Issued;
use super::{http, lock, ApiServerDouble, Credential, Identity, KubeconfigOptions, RawClient};

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl ApiServerDouble {
    /// A fresh client certificate for `id`, issued by the double's CA; files under the
    /// double's own directory.
    pub fn client_cert(&self, id: Identity) -> Issued {
        let (cn, orgs) = id.subject();
        let orgs: Vec<&str> = orgs.iter().map(|s| s.as_str()).collect();
        self.shared.pki.client(&id.file_tag(), &cn, &orgs)
    }

    /// A raw client presenting a fresh certificate for `id` (`None`: no credentials).
    pub fn raw(&self, id: Option<Identity>) -> RawClient {
        let cert = id.map(|i| self.client_cert(i));
        RawClient::new(self.addr, &self.shared.pki, cert.as_ref())
    }

    /// A new bearer token that authenticates as `id`.
    pub fn token(&self, id: Identity) -> String {
        let t: [u8; 24] = http::random_bytes();
        let token: String = t.iter().map(|b| format!("{b:02x}")).collect();
        lock(&self.shared.authn.tokens).insert(token.clone(), id.user());
        token
    }

    /// Writes `dir/<identity>.kubeconfig` with a client certificate for `id` (files
    /// `ca.crt`, `<identity>.crt`, `<identity>.key` beside it) and returns its path.
    pub fn kubeconfig(&self, dir: &Path, id: Identity) -> PathBuf {
        self.kubeconfig_with(dir, id, &KubeconfigOptions::default())
    }

    /// Like `kubeconfig`, with a bearer token instead (`<identity>-token.kubeconfig`).
    pub fn kubeconfig_token(&self, dir: &Path, id: Identity) -> PathBuf {
        let opts = KubeconfigOptions {
            credential: Credential::Token,
            ..KubeconfigOptions::default()
        };
        self.kubeconfig_with(dir, id, &opts)
    }

    /// The general kubeconfig writer. The file name is `<identity>[-<credential>]
    /// [-data].kubeconfig` in `dir`.
    pub fn kubeconfig_with(&self, dir: &Path, id: Identity, opts: &KubeconfigOptions) -> PathBuf {
        std::fs::create_dir_all(dir).expect("create kubeconfig dir");
        let tag = id.file_tag();
        let suffix = match opts.credential {
            Credential::Certificate => "",
            Credential::ExpiredCertificate => "-expired",
            Credential::Token => "-token",
            Credential::UnknownToken => "-badtoken",
            Credential::None => "-anonymous",
        };
        let base = format!("{tag}{suffix}{}", if opts.embed { "-data" } else { "" });
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, &self.shared.pki.ca_pem).expect("write ca.crt");
        let mut cluster = format!(
            "    server: {}\n",
            yaml_str(&opts.server.clone().unwrap_or_else(|| self.url()))
        );
        if opts.embed {
            let data = http::base64(self.shared.pki.ca_pem.as_bytes());
            cluster.push_str(&format!("    certificate-authority-data: {data}\n"));
        } else {
            let p = ca_path.display().to_string();
            cluster.push_str(&format!("    certificate-authority: {}\n", yaml_str(&p)));
        }
        if let Some(n) = &opts.tls_server_name {
            cluster.push_str(&format!("    tls-server-name: {}\n", yaml_str(n)));
        }
        let (cn, orgs) = id.subject();
        let orgs: Vec<&str> = orgs.iter().map(|s| s.as_str()).collect();
        let cert = match opts.credential {
            Credential::Certificate => Some(self.shared.pki.client(&tag, &cn, &orgs)),
            Credential::ExpiredCertificate => Some(self.shared.pki.expired_client(
                &format!("{tag}-expired"),
                &cn,
                &orgs,
            )),
            _ => None,
        };
        let mut user = String::new();
        if let Some(c) = cert {
            if opts.embed {
                user.push_str(&format!(
                    "    client-certificate-data: {}\n    client-key-data: {}\n",
                    http::base64(c.cert_pem.as_bytes()),
                    http::base64(c.key_pem.as_bytes())
                ));
            } else {
                let cp = dir.join(format!("{base}.crt"));
                let kp = dir.join(format!("{base}.key"));
                std::fs::write(&cp, &c.cert_pem).expect("write client certificate");
                std::fs::write(&kp, &c.key_pem).expect("write client key");
                user.push_str(&format!(
                    "    client-certificate: {}\n    client-key: {}\n",
                    yaml_str(&cp.display().to_string()),
                    yaml_str(&kp.display().to_string())
                ));
            }
        }
        match opts.credential {
            Credential::Token => {
                user.push_str(&format!("    token: {}\n", yaml_str(&self.token(id))));
            }
            Credential::UnknownToken => {
                user.push_str("    token: \"0123456789abcdef0123456789abcdef\"\n");
            }
            _ => {}
        }
        if user.is_empty() {
            user.push_str("    {}\n");
        }
        let user_block = if user.trim() == "{}" {
            "  user: {}\n".to_string()
        } else {
            format!("  user:\n{user}")
        };
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n{cluster}\
             users:\n- name: {u}\n{user_block}contexts:\n- name: double\n  context:\n    \
             cluster: double\n    user: {u}\ncurrent-context: double\npreferences: {{}}\n",
            u = yaml_str(&cn),
        );
        let path = dir.join(format!("{base}.kubeconfig"));
        std::fs::write(&path, yaml).expect("write kubeconfig");
        path
    }
}
