//! A kube-apiserver double for integration tests: a TLS (rustls, ring) HTTP/1.1 server
//! on 127.0.0.1 that reproduces what the recorded kube-apiserver v1.36 answers
//! (`tests/fixtures/kube-apiserver/`) for the requests holdfast makes: pods, nodes,
//! leases, configmaps, secrets and events, with the Node authorizer and NodeRestriction
//! in front, one global resourceVersion, chunked watches with bookmarks, and 410s after
//! a compaction. It is a double, not a Kubernetes: it keeps objects in memory, runs no
//! controllers, and validates only what the fixtures show.
//!
//! Tests drive it in-process (no HTTP): seed and inspect objects as admin, inject faults,
//! cut watches, compact, and read the request log.
//!
//! Include with `#[path = "support/apiserver/mod.rs"] mod apiserver;`.

#![allow(dead_code, unused_imports)]

#[path = "../pki.rs"]
pub mod pki;

mod api;
mod auth;
pub mod client;
mod http;
mod server;

use std::collections::HashMap;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use auth::{Identity, User};
pub use client::{RawClient, RawResponse, RawStream};
use pki::{Issued, Pki};

/// Locks, ignoring poisoning (a panicking test thread must not wedge the server).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How the double behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Time between periodic BOOKMARK events on watches that asked for them (the real
    /// server: about 60 s).
    pub bookmark_interval: Duration,
    /// A watch with `timeoutSeconds` gets a last BOOKMARK this long before it ends
    /// (the real server: about 2 s).
    pub bookmark_before_timeout: Duration,
    /// Names in the server certificate (IP addresses or DNS names).
    pub server_names: Vec<String>,
    /// NodeRestriction admission on (as in fixtures 00-63) or off (as in 64).
    pub node_restriction: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            bookmark_interval: Duration::from_secs(60),
            bookmark_before_timeout: Duration::from_secs(2),
            server_names: vec!["127.0.0.1".into(), "localhost".into()],
            node_restriction: true,
        }
    }
}

/// One request as the double saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Raw query string (no `?`).
    pub query: String,
    /// The authenticated user name (`system:anonymous`; empty for a 401).
    pub user: String,
    pub code: u16,
    pub at: Instant,
}

/// What a kubeconfig authenticates with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Credential {
    /// A client certificate and key for the identity.
    #[default]
    Certificate,
    /// A client certificate that expired yesterday (the server answers 401).
    ExpiredCertificate,
    /// A bearer token the double maps to the identity.
    Token,
    /// A bearer token the double does not know (401).
    UnknownToken,
    /// Nothing: requests are anonymous.
    None,
}

/// How `kubeconfig_with` writes the file.
#[derive(Debug, Clone, Default)]
pub struct KubeconfigOptions {
    pub credential: Credential,
    /// Inline `certificate-authority-data` / `client-certificate-data` /
    /// `client-key-data` instead of file paths.
    pub embed: bool,
    /// `tls-server-name` for the cluster.
    pub tls_server_name: Option<String>,
    /// Server URL instead of the double's own.
    pub server: Option<String>,
}

#[derive(Default)]
struct Conns {
    next_id: u64,
    /// Connection id -> (socket, currently streaming a watch).
    open: HashMap<u64, (TcpStream, bool)>,
}

struct Shared {
    pki: Pki,
    authn: auth::Authenticator,
    tls: Arc<rustls::ServerConfig>,
    options: Options,
    stop: AtomicBool,
    conns: Mutex<Conns>,
    log: Mutex<Vec<Logged>>,
}

/// The running double. Dropping it stops the server and its threads.
pub struct ApiServerDouble {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    dir: PathBuf,
    accept: Option<JoinHandle<()>>,
}

/// Starts a double (see `ApiServerDouble::start`).
pub fn start(options: Options) -> ApiServerDouble {
    ApiServerDouble::start(options)
}

fn temp_dir() -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!(
        "holdfast-apiserver-double-{}-{seq}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create double dir");
    d
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl ApiServerDouble {
    /// Listens on 127.0.0.1 (a free port) with a fresh CA and server certificate.
    pub fn start(options: Options) -> ApiServerDouble {
        let dir = temp_dir();
        let pki = Pki::new(&dir.join("pki"));
        let names: Vec<&str> = options.server_names.iter().map(|s| s.as_str()).collect();
        let server_cert = pki.server("apiserver", &names);
        let authn = auth::Authenticator::new(&pki);
        let tls = authn.server_config(&server_cert);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            pki,
            authn,
            tls,
            options,
            stop: AtomicBool::new(false),
            conns: Mutex::new(Conns::default()),
            log: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = std::thread::spawn(move || server::accept_loop(s, listener));
        ApiServerDouble {
            shared,
            addr,
            dir,
            accept: Some(accept),
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The CA certificate (PEM file) that signed the server and client certificates.
    pub fn ca_pem(&self) -> &Path {
        &self.shared.pki.ca
    }

    /// The CA that signs server and client certificates (for raw TLS clients).
    pub fn pki(&self) -> &Pki {
        &self.shared.pki
    }

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

    /// Every request so far, in arrival order.
    pub fn request_log(&self) -> Vec<Logged> {
        lock(&self.shared.log).clone()
    }
}

impl Drop for ApiServerDouble {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for (_, (tcp, _)) in lock(&self.shared.conns).open.iter() {
            let _ = tcp.shutdown(Shutdown::Both);
        }
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
