//! Debian's `docker-registry` (distribution 2.8) run by a test on a 127.0.0.1 port it
//! picks, with filesystem storage in the test's directory and TLS from the test's CA;
//! optionally htpasswd (bcrypt) auth, or token auth against [`TokenServer`], a small
//! token service of the test's own that signs ES256 JWTs with a key whose certificate
//! is the registry's root bundle (`x5c` header), and which can be made to redirect its
//! callers elsewhere. Blobs may be redirected to a storage host (the registry's `redirect`
//! middleware). Images are pushed with `skopeo`.
//! The registry process is killed and its directory removed on drop, even on failure.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::pki::{Issued, Pki};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// Skips the calling test (with a printed reason) when the registry or skopeo is missing.
pub fn tools_present() -> bool {
    for tool in [REGISTRY_BIN, "/usr/bin/skopeo"] {
        if !Path::new(tool).exists() {
            eprintln!("skipped: {tool} is not installed (.ci/run installs it)");
            return false;
        }
    }
    true
}

/// How a registry checks who asks.
pub enum Auth<'a> {
    None,
    /// htpasswd with bcrypt, one user.
    Basic {
        user: &'a str,
        password: &'a str,
    },
    /// `auth: token:` against this token service.
    Token(&'a TokenServer),
}

pub struct Registry {
    pub dir: PathBuf,
    pub addr: SocketAddr,
    /// The CA the registry's certificate is issued by.
    pub ca: PathBuf,
    /// A directory with `ca.crt`, for skopeo's `--dest-cert-dir`.
    pub cert_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("address")
}

impl Registry {
    /// Starts a registry in `dir` (created; removed on drop) serving TLS from `pki`.
    pub fn start(dir: &Path, pki: &Pki, auth: Auth<'_>) -> Registry {
        Registry::start_with(dir, pki, auth, "")
    }

    /// A registry that answers blob requests with a redirect to `storage` (its `redirect`
    /// storage middleware, as one in front of S3 or a CDN does): the path there is the
    /// blob's path below the registry's `data` directory.
    pub fn start_redirecting_blobs(
        dir: &Path,
        pki: &Pki,
        auth: Auth<'_>,
        storage: &str,
    ) -> Registry {
        let middleware = format!(
            "middleware:\n  storage:\n    - name: redirect\n      options:\n        baseurl: {storage}/\n"
        );
        Registry::start_with(dir, pki, auth, &middleware)
    }

    fn start_with(dir: &Path, pki: &Pki, auth: Auth<'_>, extra: &str) -> Registry {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("registry dir");
        let addr = free_port();
        let cert: Issued = pki.server(&format!("registry-{}", addr.port()), &["127.0.0.1"]);
        let cert_dir = dir.join("certs");
        std::fs::create_dir_all(&cert_dir).expect("cert dir");
        std::fs::copy(&pki.ca, cert_dir.join("ca.crt")).expect("copy ca");
        let auth_yaml = match auth {
            Auth::None => String::new(),
            Auth::Basic { user, password } => {
                let out = Command::new("htpasswd")
                    .args(["-Bbn", user, password])
                    .output()
                    .expect("htpasswd (apache2-utils)");
                assert!(out.status.success(), "htpasswd failed");
                let file = dir.join("htpasswd");
                std::fs::write(&file, &out.stdout).expect("write htpasswd");
                format!(
                    "auth:\n  htpasswd:\n    realm: holdfast-test\n    path: {}\n",
                    file.display()
                )
            }
            Auth::Token(t) => format!(
                "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                t.realm(),
                TokenServer::SERVICE,
                TokenServer::ISSUER,
                t.bundle.display()
            ),
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: {addr}\n  tls:\n    certificate: {}\n    key: {}\n{auth_yaml}{extra}",
            dir.join("data").display(),
            cert.cert.display(),
            cert.key.display(),
        );
        let config_path = dir.join("config.yml");
        std::fs::write(&config_path, config).expect("registry config");
        let log = dir.join("registry.log");
        let out = std::fs::File::create(&log).expect("registry log");
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log fd"))
            .stderr(out)
            .spawn()
            .expect("start docker-registry");
        let mut r = Registry {
            dir: dir.to_path_buf(),
            addr,
            ca: pki.ca.clone(),
            cert_dir,
            log,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(c) = r.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("docker-registry exited ({status}):\n{}", r.log());
                }
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen:\n{}",
                r.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    /// `127.0.0.1:<port>`, the registry part of image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Lines of the access log for holdfast's requests whose URI contains `needle`.
    pub fn requests(&self, needle: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.starts_with("127.0.0.1 - ") && l.contains("\"holdfast/"))
            .filter(|l| l.contains("\"GET ") || l.contains("\"HEAD "))
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Pushes the OCI layout at `layout` (every manifest of an index) as `repo:tag`.
    pub fn push(&self, layout: &Path, repo: &str, tag: &str, creds: Option<(&str, &str)>) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--all", "--quiet", "--dest-cert-dir"])
            .arg(&self.cert_dir);
        if let Some((u, p)) = creds {
            cmd.arg("--dest-creds").arg(format!("{u}:{p}"));
        }
        cmd.arg(format!("oci:{}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.host()));
        let out = cmd.output().expect("run skopeo");
        assert!(
            out.status.success(),
            "skopeo copy to {repo}:{tag} failed: {}\n--- registry log ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Where the registry keeps a blob's bytes (filesystem driver).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Stops the registry (a mirror going away).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- registry log {} ---\n{}", self.addr, self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A token service for `auth: token:`: GET `/token?service=..&scope=..`, with Basic
/// credentials that must match to be granted anything; anonymous callers get a token
/// with no access, as the distribution spec has it. Serves TLS from the test's CA.
pub struct TokenServer {
    pub addr: SocketAddr,
    /// PEM of the signing certificate: the registry's `rootcertbundle`.
    pub bundle: PathBuf,
    /// Token requests answered so far.
    pub requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    /// Every token issued, to check none reaches a log.
    pub issued: Arc<std::sync::Mutex<Vec<String>>>,
    /// Set: every request is answered `302 Found` to this URL (its path and query kept).
    redirect: Arc<std::sync::Mutex<Option<String>>>,
}

impl TokenServer {
    pub const SERVICE: &'static str = "holdfast-test-registry";
    pub const ISSUER: &'static str = "holdfast-test-token-issuer";

    pub fn start(dir: &Path, pki: &Pki, user: &str, password: &str) -> TokenServer {
        std::fs::create_dir_all(dir).expect("token dir");
        // The signing key and its self-signed certificate (the root bundle).
        let key = rcgen::KeyPair::generate().expect("signing key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "holdfast-test-token-signer");
        let cert = params.self_signed(&key).expect("self-signed");
        let bundle = dir.join("token-signer.crt");
        std::fs::write(&bundle, cert.pem()).expect("bundle");
        let cert_der = cert.der().to_vec();
        let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()),
        );
        let signer = rustls::crypto::ring::sign::any_ecdsa_type(&key_der).expect("ecdsa key");
        let tls = pki.server("token-server", &["127.0.0.1"]);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![tls.cert_der.clone()], tls.key_der())
            .expect("token server tls");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind token server");
        let addr = listener.local_addr().expect("addr");
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let issued = Arc::new(std::sync::Mutex::new(Vec::new()));
        let redirect = Arc::new(std::sync::Mutex::new(None::<String>));
        let (s, r, iss, to) = (
            stop.clone(),
            requests.clone(),
            issued.clone(),
            redirect.clone(),
        );
        let expect = format!("Basic {}", b64(format!("{user}:{password}").as_bytes()));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = conn else { continue };
                let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
                let Ok(tls) = rustls::ServerConnection::new(config.clone()) else {
                    continue;
                };
                let mut stream = rustls::StreamOwned::new(tls, tcp);
                let Some((path, auth)) = read_head(&mut stream) else {
                    continue;
                };
                r.fetch_add(1, Ordering::SeqCst);
                let elsewhere = to.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(base) = elsewhere {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 302 Found\r\nLocation: {base}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    let _ = stream.flush();
                    stream.conn.send_close_notify();
                    let _ = stream.flush();
                    continue;
                }
                let query = path.split_once('?').map(|(_, q)| q).unwrap_or("");
                let scope = param(query, "scope").unwrap_or_default();
                let granted = auth.as_deref() == Some(expect.as_str());
                let token = sign_token(signer.as_ref(), &cert_der, &scope, granted);
                iss.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(token.clone());
                let body = format!("{{\"token\":\"{token}\",\"expires_in\":300}}");
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.flush();
                stream.conn.send_close_notify();
                let _ = stream.flush();
            }
        });
        TokenServer {
            addr,
            bundle,
            requests,
            stop,
            issued,
            redirect,
        }
    }

    /// From now on, answers every request with a redirect to `base` (`https://host:port`),
    /// or again itself with None.
    pub fn redirect_to(&self, base: Option<String>) {
        *self.redirect.lock().unwrap_or_else(|p| p.into_inner()) = base;
    }

    pub fn realm(&self) -> String {
        format!("https://{}/token", self.addr)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// The request line's path and the Authorization header.
fn read_head(stream: &mut impl Read) -> Option<(String, Option<String>)> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut auth = None;
    for _ in 0..100 {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("authorization") {
                auth = Some(v.trim().to_string());
            }
        }
    }
    Some((path, auth))
}

fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| unescape(v))
    })
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Standard base64 with padding (what Basic auth and dockerconfigjson carry).
pub fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64url(bytes: &[u8]) -> String {
    b64(bytes)
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// An ES256 JWT for `scope` (`repository:name:actions`), granting its actions when
/// `granted`, nothing otherwise.
fn sign_token(
    signer: &dyn rustls::sign::SigningKey,
    cert_der: &[u8],
    scope: &str,
    granted: bool,
) -> String {
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [b64(cert_der)]});
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut access = Vec::new();
    for s in scope.split(' ').filter(|s| !s.is_empty()) {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() >= 3 && granted {
            let actions: Vec<&str> = parts[parts.len() - 1].split(',').collect();
            let name = parts[1..parts.len() - 1].join(":");
            access.push(serde_json::json!({"type": parts[0], "name": name, "actions": actions}));
        }
    }
    let claims = serde_json::json!({
        "iss": TokenServer::ISSUER, "sub": if granted { "tester" } else { "" },
        "aud": TokenServer::SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now,
        "jti": format!("{now}-{}", access.len()), "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let s = signer
        .choose_scheme(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256])
        .expect("P-256 signer");
    let der = s.sign(signing_input.as_bytes()).expect("sign");
    format!("{signing_input}.{}", b64url(&der_to_raw(&der)))
}

/// ECDSA DER (`SEQUENCE { INTEGER r, INTEGER s }`) to JOSE's fixed 64 bytes `r || s`.
fn der_to_raw(der: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    let mut i = 2; // SEQUENCE tag and (short) length
    for _ in 0..2 {
        assert_eq!(der[i], 0x02, "INTEGER");
        let len = der[i + 1] as usize;
        let int = &der[i + 2..i + 2 + len];
        let int = if int.len() > 32 {
            &int[int.len() - 32..]
        } else {
            int
        };
        out.extend(std::iter::repeat_n(0, 32 - int.len()));
        out.extend_from_slice(int);
        i += 2 + len;
    }
    out
}

/// The `holdfast.registries` keys that trust the test CA of each of `hosts`.
pub fn trusted(hosts: &[&Registry]) -> String {
    let mut s = String::from("  registries:\n");
    for r in hosts {
        s.push_str(&format!(
            "    \"{}\":\n      caFile: {}\n",
            r.host(),
            r.ca.display()
        ));
    }
    s
}

/// Pushes the host's busybox as `repo:tag`, with a layer of its own (so that each image
/// has blobs of its own), as `creds` if given.
pub fn push_busybox(
    reg: &Registry,
    dir: &Path,
    repo: &str,
    tag: &str,
    creds: Option<(&str, &str)>,
) {
    use crate::oci;
    let layout = dir.join(format!("layout-{}-{tag}", repo.replace('/', "-")));
    let mut image = oci::busybox_image("unused").expect("busybox");
    let seed = repo.bytes().chain(tag.bytes()).map(u64::from).sum::<u64>() + 1;
    image.layers.push(
        oci::Layer::new(vec![oci::Entry::file(
            "etc/own",
            &oci::noise(200_000, seed),
            0o644,
        )])
        .gzipped(),
    );
    let platform = match oci::goarch() {
        (arch, Some(v)) => format!("linux/{arch}/{v}"),
        (arch, None) => format!("linux/{arch}"),
    };
    oci::write_index_dir(&layout, &[(&platform, &image)]).expect("layout");
    reg.push(&layout, repo, tag, creds);
}

/// A host-network pod whose one container `c` runs `image` (pulled by `policy`) and
/// sleeps.
pub fn sleep_pod(name: &str, image: &str, policy: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: c\n      image: {image}\n      \
         imagePullPolicy: {policy}\n      command: [\"sleep\", \"3600\"]\n"
    )
}

/// Why container `c` of a pod (as `holdfast pods` shows it) waits: its reason and message.
pub fn waiting(p: &serde_json::Value) -> (String, String) {
    let w = &crate::agent::container(p, "c")["state"]["waiting"];
    (
        w["reason"].as_str().unwrap_or("").to_string(),
        w["message"].as_str().unwrap_or("").to_string(),
    )
}
