//! A kube-apiserver double for integration tests: a TLS (rustls, ring) HTTP/1.1 server
//! on 127.0.0.1 that reproduces what the recorded kube-apiserver v1.36 answers
//! (`tests/fixtures/kube-apiserver/`) for the requests holdfast makes: pods, nodes,
//! leases, configmaps, secrets, services and events, with the Node authorizer and NodeRestriction
//! in front, one global resourceVersion, chunked watches with bookmarks, and 410s after
//! a compaction. It is a double, not a Kubernetes: it keeps objects in memory, runs no
//! controllers, and validates only what the fixtures show.
//!
//! Tests drive it in-process (no HTTP): seed and inspect objects as admin, inject faults,
//! cut watches, compact, and read the request log.

#![allow(dead_code, unused_imports)]

pub use crate::pki;

mod api;
mod auth;
mod authz;
pub mod client;
mod control;
mod defaults;
pub mod fixture;
mod http;
mod kubeconfig;
mod patch;
mod pods;
mod resources;
mod server;
mod status;
mod store;
mod watch;

use std::collections::HashMap;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use auth::{Identity, User};
pub use client::{RawClient, RawResponse, RawStream};
use pki::{Issued, Pki};
#[allow(unused_imports)]
pub use pods::bound_pod;

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

/// A failure the next matching request gets instead of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A `Status` error with this HTTP code (429 also gets `Retry-After: 1`).
    Status(u16),
    /// The connection is closed without an answer.
    Drop,
    /// A LIST answers 200 with no items and a resourceVersion one below the current one
    /// (a lagging cache). Only matches LIST requests.
    StaleList,
    /// A LIST answers 200 with no items at the current resourceVersion (a transient
    /// fault in front of the apiserver that looks like a real answer). Only matches
    /// LIST requests.
    EmptyList,
    /// The request is answered normally after this delay.
    Delay(Duration),
}

/// Which requests a fault applies to: all given parts must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    /// HTTP method, e.g. `"PATCH"`.
    pub method: Option<String>,
    /// Path prefix (no query), e.g. `"/api/v1/namespaces/default/pods/web/status"`.
    pub path: Option<String>,
    /// A substring of the raw query, e.g. `"watch=true"`.
    pub query: Option<String>,
}

impl Matcher {
    /// Every request.
    pub fn any() -> Matcher {
        Matcher::default()
    }

    /// `method` requests whose path starts with `path`.
    pub fn new(method: &str, path: &str) -> Matcher {
        Matcher {
            method: Some(method.to_string()),
            path: Some(path.to_string()),
            query: None,
        }
    }

    /// Also requires `q` in the raw query.
    pub fn query(mut self, q: &str) -> Matcher {
        self.query = Some(q.to_string());
        self
    }

    fn matches(&self, req: &http::Request) -> bool {
        self.method.as_ref().is_none_or(|m| *m == req.method)
            && self
                .path
                .as_ref()
                .is_none_or(|p| req.path.starts_with(p.as_str()))
            && self
                .query
                .as_ref()
                .is_none_or(|q| req.query.contains(q.as_str()))
    }
}

impl From<(&str, &str)> for Matcher {
    fn from((method, path): (&str, &str)) -> Matcher {
        Matcher::new(method, path)
    }
}

struct Armed {
    matcher: Matcher,
    fault: Fault,
    remaining: usize,
}

/// Takes the first armed fault matching `req` (StaleList and EmptyList only for LISTs).
fn take_fault(shared: &Shared, req: &http::Request, is_list: bool) -> Option<Fault> {
    let mut faults = lock(&shared.faults);
    let i = faults.iter().position(|a| {
        a.matcher.matches(req)
            && (is_list || !matches!(a.fault, Fault::StaleList | Fault::EmptyList))
    })?;
    let fault = faults[i].fault;
    faults[i].remaining -= 1;
    if faults[i].remaining == 0 {
        faults.remove(i);
    }
    Some(fault)
}

struct Shared {
    pki: Pki,
    authn: auth::Authenticator,
    tls: Arc<rustls::ServerConfig>,
    options: Options,
    stop: AtomicBool,
    conns: Mutex<Conns>,
    log: Mutex<Vec<Logged>>,
    state: Mutex<store::State>,
    /// Notified on every change, log entry, compaction, watch cut and stop.
    changed: Condvar,
    faults: Mutex<Vec<Armed>>,
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
            state: Mutex::new(store::State::new()),
            changed: Condvar::new(),
            faults: Mutex::new(Vec::new()),
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
}

impl Drop for ApiServerDouble {
    fn drop(&mut self) {
        {
            // Under the state lock, so a watch between its stop check and its wait
            // cannot miss the wake-up.
            let _state = lock(&self.shared.state);
            self.shared.stop.store(true, Ordering::SeqCst);
            self.shared.changed.notify_all();
        }
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
