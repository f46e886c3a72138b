//! Certificates from the cluster's signers: a key made on the device, a
//! CertificateSigningRequest (certificates.k8s.io/v1) for it, the wait for the signed
//! certificate, the files the issued pairs live in, and when to ask for the next one.
//! Blocking (it uses the apiserver client); the key never leaves the device and is never
//! logged.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;

use super::client::Client;
use super::error::ApiError;
use crate::backoff::Backoff;
use crate::tls::der::{self, Validity};

/// The kubelet's client certificates: `kubernetes.io/kube-apiserver-client-kubelet`.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The kubelet's serving certificates: `kubernetes.io/kubelet-serving`.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The file prefix of the client pair, as the kubelet names it.
pub const CLIENT_PREFIX: &str = "kubelet-client";
/// The file prefix of the serving pair, as the kubelet names it.
pub const SERVER_PREFIX: &str = "kubelet-server";
/// The largest `status.certificate` accepted: a chain of a few certificates is a few KiB.
const MAX_CERTIFICATE: usize = 256 << 10;

const PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

/// What to ask a signer for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrSpec {
    pub signer_name: String,
    pub common_name: String,
    /// At most one: the subject is built with rcgen, whose names hold one value a type.
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// Key usages as certificates.k8s.io spells them (`digital signature`, `client auth`).
    pub usages: Vec<String>,
    /// `spec.expirationSeconds` (the apiserver's minimum is 600); the signer may cap it.
    pub expiration_seconds: Option<i32>,
}

impl CsrSpec {
    /// What the kubelet asks for its client certificate: CN `system:node:<node>`, O
    /// `system:nodes`, usages digital signature and client auth (key encipherment is
    /// asked for RSA keys only; this key is ECDSA).
    pub fn kubelet_client(node: &str) -> CsrSpec {
        CsrSpec {
            signer_name: KUBELET_CLIENT_SIGNER.to_string(),
            common_name: format!("system:node:{node}"),
            organizations: vec!["system:nodes".to_string()],
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            usages: vec!["digital signature".to_string(), "client auth".to_string()],
            expiration_seconds: None,
        }
    }
}

/// A key and the certificate chain a signer issued for it.
#[derive(Clone)]
pub struct Issued {
    pub key_pem: String,
    pub chain_pem: String,
    /// The leaf certificate's validity.
    pub validity: Validity,
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issued")
            .field("key_pem", &"<redacted>")
            .field("chain_pem", &self.chain_pem.len())
            .field("validity", &self.validity)
            .finish()
    }
}

impl Issued {
    /// Checks that `chain_pem` holds certificates whose first one belongs to `key_pem`,
    /// and reads its validity.
    pub fn from_pem(chain_pem: String, key_pem: String) -> Result<Issued, String> {
        let chain = crate::tls::certificates(chain_pem.as_bytes())
            .map_err(|e| format!("certificate: {e}"))?;
        let key = crate::tls::private_key(key_pem.as_bytes()).map_err(|e| format!("key: {e}"))?;
        let validity =
            der::validity(&chain[0]).map_err(|e| format!("unreadable certificate: {e}"))?;
        rustls::sign::CertifiedKey::from_der(chain, key, &crate::tls::provider())
            .map_err(|e| format!("the key does not belong to the certificate: {e}"))?;
        Ok(Issued {
            key_pem,
            chain_pem,
            validity,
        })
    }

    /// Whether the leaf certificate is valid at `now`.
    pub fn valid_at(&self, now: SystemTime) -> bool {
        let now = unix(now);
        self.validity.not_before <= now && now <= self.validity.not_after
    }
}

/// Why no certificate was issued.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("make a key and certificate request: {message}")]
    Key { message: String },
    #[error("certificate signing request: {0}")]
    Api(#[source] ApiError),
    #[error("certificate signing request {name} was denied: {reason}: {message}")]
    Denied {
        name: String,
        reason: String,
        message: String,
    },
    #[error("certificate signing request {name} failed: {reason}: {message}")]
    Failed {
        name: String,
        reason: String,
        message: String,
    },
    #[error(
        "certificate signing request {name} was not signed within {waited:?} (is it \
         approved? `kubectl certificate approve {name}`; is a signer for it running?)"
    )]
    Timeout { name: String, waited: Duration },
    #[error("certificate signing request {name} was deleted before it was signed")]
    Deleted { name: String },
    #[error("certificate signing request {name}: unusable certificate: {message}")]
    Unusable { name: String, message: String },
}

impl CsrError {
    /// Whether asking again later can help. Every failure but a key that could not be
    /// made may pass: a denied request may be approved when asked again by an operator.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, CsrError::Key { .. })
    }

    /// The apiserver did not accept the credential the request was sent with (401): a
    /// deleted or expired bootstrap token, an expired client certificate.
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, CsrError::Api(e) if e.is_unauthorized())
    }
}

/// Makes a new ECDSA P-256 key, posts a CertificateSigningRequest for it with `client`,
/// and waits, at most `wait`, until the request has a certificate, was denied or failed.
pub fn request(client: &Client, spec: &CsrSpec, wait: Duration) -> Result<Issued, CsrError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| {
        CsrError::Key {
            message: e.to_string(),
        }
    })?;
    let request_pem = request_pem(spec, &key)?;
    let object = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".to_string()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request_pem.into_bytes()),
            signer_name: spec.signer_name.clone(),
            usages: Some(spec.usages.clone()),
            expiration_seconds: spec.expiration_seconds,
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let created: CertificateSigningRequest = client.post(PATH, &object).map_err(CsrError::Api)?;
    let name = created.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(CsrError::Api(ApiError::Decode {
            method: "POST",
            path: PATH.to_string(),
            message: "the created request has no name".to_string(),
        }));
    }
    log::info!(
        "certificate signing request {name} sent to {} for {} ({})",
        spec.signer_name,
        spec.common_name,
        client.server()
    );
    let chain_pem = wait_for_certificate(client, &name, created, wait)?;
    Issued::from_pem(chain_pem, key.serialize_pem())
        .map_err(|message| CsrError::Unusable { name, message })
}

/// The PEM PKCS#10 request for `spec`, signed with `key`.
fn request_pem(spec: &CsrSpec, key: &rcgen::KeyPair) -> Result<String, CsrError> {
    let bad = |message: String| CsrError::Key { message };
    if spec.organizations.len() > 1 {
        return Err(bad(format!(
            "{} organizations asked for; at most one is supported",
            spec.organizations.len()
        )));
    }
    let mut params = rcgen::CertificateParams::default();
    let mut subject = rcgen::DistinguishedName::new();
    for o in &spec.organizations {
        subject.push(rcgen::DnType::OrganizationName, o.as_str());
    }
    subject.push(rcgen::DnType::CommonName, spec.common_name.as_str());
    params.distinguished_name = subject;
    for dns in &spec.dns_names {
        let name = rcgen::string::Ia5String::try_from(dns.as_str())
            .map_err(|e| bad(format!("dns name {dns:?}: {e}")))?;
        params.subject_alt_names.push(rcgen::SanType::DnsName(name));
    }
    for ip in &spec.ip_addresses {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(*ip));
    }
    params
        .serialize_request(key)
        .and_then(|csr| csr.pem())
        .map_err(|e| bad(e.to_string()))
}

/// Polls `name` until it carries a certificate, a Denied or Failed condition, or `wait`
/// has passed. Transient errors while polling are retried within `wait`.
fn wait_for_certificate(
    client: &Client,
    name: &str,
    mut current: CertificateSigningRequest,
    wait: Duration,
) -> Result<String, CsrError> {
    let started = Instant::now();
    let poll = Backoff {
        initial: Duration::from_millis(250),
        max: Duration::from_secs(5),
    };
    let path = format!("{PATH}/{}", super::escape(name));
    let mut polls = 0u32;
    loop {
        if let Some(done) = outcome(name, &current) {
            return done;
        }
        let elapsed = started.elapsed();
        if elapsed >= wait {
            return Err(CsrError::Timeout {
                name: name.to_string(),
                waited: wait,
            });
        }
        polls = polls.saturating_add(1);
        std::thread::sleep(poll.delay(polls).min(wait - elapsed));
        match client.get::<CertificateSigningRequest>(&path) {
            Ok(csr) => current = csr,
            Err(e) if e.is_not_found() => {
                return Err(CsrError::Deleted {
                    name: name.to_string(),
                })
            }
            Err(e) if e.is_transient() => {
                log::debug!("certificate signing request {name}: {e}; polling again")
            }
            Err(e) => return Err(CsrError::Api(e)),
        }
    }
}

/// The end of a request, if it has one: its certificate, or why there will be none.
fn outcome(name: &str, csr: &CertificateSigningRequest) -> Option<Result<String, CsrError>> {
    let status = csr.status.as_ref()?;
    for c in status.conditions.iter().flatten() {
        if c.status != "True" {
            continue;
        }
        let reason = c.reason.clone().unwrap_or_default();
        let message = c.message.clone().unwrap_or_default();
        let name = name.to_string();
        match c.type_.as_str() {
            "Denied" => {
                return Some(Err(CsrError::Denied {
                    name,
                    reason,
                    message,
                }))
            }
            "Failed" => {
                return Some(Err(CsrError::Failed {
                    name,
                    reason,
                    message,
                }))
            }
            _ => {}
        }
    }
    let cert = status.certificate.as_ref().filter(|c| !c.0.is_empty())?;
    if cert.0.len() > MAX_CERTIFICATE {
        return Some(Err(CsrError::Unusable {
            name: name.to_string(),
            message: format!(
                "status.certificate is {} bytes, more than {MAX_CERTIFICATE}",
                cert.0.len()
            ),
        }));
    }
    Some(
        String::from_utf8(cert.0.clone()).map_err(|_| CsrError::Unusable {
            name: name.to_string(),
            message: "status.certificate is not PEM text".to_string(),
        }),
    )
}

/// Where issued pairs live: `<dir>/<prefix>-<unix time>.pem` (the chain, then the key;
/// 0600), and `<dir>/<prefix>-current.pem`, a symlink to the newest, swapped atomically.
/// The file before the newest is kept until the next save, so a pair that does not work
/// can be gone back from.
#[derive(Debug, Clone)]
pub struct PairFiles {
    dir: PathBuf,
    prefix: String,
}

impl PairFiles {
    pub fn new(dir: PathBuf, prefix: &str) -> Self {
        PairFiles {
            dir,
            prefix: prefix.to_string(),
        }
    }

    /// `<dir>/<prefix>-current.pem`.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `issued` to a new file, fsyncs it, points the current link at it, and
    /// removes the pair files older than the one it replaced. Returns the new file.
    pub fn save(&self, issued: &Issued) -> io::Result<PathBuf> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))?;
        let previous = fs::read_link(self.current_path()).ok();
        let stamp = unix(SystemTime::now());
        let (path, mut file) = self.create_unique(stamp)?;
        let written = (|| {
            file.write_all(issued.chain_pem.as_bytes())?;
            if !issued.chain_pem.ends_with('\n') {
                file.write_all(b"\n")?;
            }
            file.write_all(issued.key_pem.as_bytes())?;
            file.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        drop(file);
        let file_name = path.file_name().map(PathBuf::from).unwrap_or_default();
        let link = self.dir.join(format!(".{}-current.pem.new", self.prefix));
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&file_name, &link)?;
        fs::rename(&link, self.current_path())?;
        fs::File::open(&self.dir)?.sync_all()?;
        self.remove_older(&file_name, previous.as_deref());
        Ok(path)
    }

    /// Reads the current pair back, checking the key belongs to the certificate. `None`
    /// when there is none yet.
    pub fn load(&self) -> Result<Option<Issued>, String> {
        let path = self.current_path();
        let text = match crate::yaml::read_bounded(&path, MAX_CERTIFICATE as u64) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("read {}: {e}", path.display())),
        };
        Issued::from_pem(text.clone(), text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    fn create_unique(&self, stamp: i64) -> io::Result<(PathBuf, fs::File)> {
        for n in 0..100 {
            let name = match n {
                0 => format!("{}-{stamp}.pem", self.prefix),
                n => format!("{}-{stamp}-{n}.pem", self.prefix),
            };
            let path = self.dir.join(name);
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => return Ok((path, file)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("100 pair files for {} in the same second", self.prefix),
        ))
    }

    /// Removes `<prefix>-<digits>*.pem` files other than `keep` and `previous`.
    fn remove_older(&self, keep: &Path, previous: Option<&Path>) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let stem = format!("{}-", self.prefix);
        for entry in entries.flatten() {
            let name = PathBuf::from(entry.file_name());
            let Some(text) = name.to_str() else { continue };
            let Some(rest) = text.strip_prefix(&stem) else {
                continue;
            };
            if !rest.ends_with(".pem") || !rest.starts_with(|c: char| c.is_ascii_digit()) {
                continue;
            }
            if name == keep || Some(name.as_path()) == previous {
                continue;
            }
            if let Err(e) = fs::remove_file(entry.path()) {
                log::warn!("remove old pair file {}: {e}", entry.path().display());
            }
        }
    }
}

/// When to ask for the next certificate: notBefore plus a random 70 to 90 % of the
/// validity, as client-go's certificate manager jitters it.
pub fn rotation_deadline(v: &Validity) -> SystemTime {
    let fraction = (crate::backoff::random() % 1_000_001) as f64 / 1_000_000.0;
    rotation_deadline_at(v, fraction)
}

/// The deadline for a given `fraction` in [0, 1] of the 20 % window.
fn rotation_deadline_at(v: &Validity, fraction: f64) -> SystemTime {
    let total = v.not_after.saturating_sub(v.not_before).max(0) as f64;
    let offset = (total * (0.7 + 0.2 * fraction.clamp(0.0, 1.0))) as i64;
    from_unix(v.not_before.saturating_add(offset))
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn from_unix(s: i64) -> SystemTime {
    if s >= 0 {
        UNIX_EPOCH
            .checked_add(Duration::from_secs(s as u64))
            .unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::testpki::Pki;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "holdfast-csr-{name}-{}-{}",
            std::process::id(),
            crate::backoff::random()
        ));
        dir.join("pki")
    }

    fn issued(pki: &Pki, cn: &str) -> Issued {
        let leaf = pki.client_between(cn, 2020, 2060);
        Issued::from_pem(leaf.cert, leaf.key).expect("issued")
    }

    #[test]
    fn the_request_names_the_node_and_nothing_else() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let pem = request_pem(&CsrSpec::kubelet_client("gw-1"), &key).expect("csr");
        // rcgen parses requests back only with its x509-parser feature; the PEM shape
        // and the subject's bytes are checked here instead.
        assert!(
            pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"),
            "{pem}"
        );
        let der = crate::wire::base64_decode(
            &pem.lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>(),
        )
        .expect("base64");
        let text = String::from_utf8_lossy(&der);
        assert!(text.contains("system:node:gw-1"), "CN in the request");
        assert!(text.contains("system:nodes"), "O in the request");
        let two = CsrSpec {
            organizations: vec!["a".into(), "b".into()],
            ..CsrSpec::kubelet_client("gw-1")
        };
        assert!(matches!(request_pem(&two, &key), Err(CsrError::Key { .. })));
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_and_debug_hides_the_key() {
        let pki = Pki::new("ca");
        let a = pki.client_between("a", 2020, 2060);
        let b = pki.client_between("b", 2020, 2060);
        let err = Issued::from_pem(a.cert.clone(), b.key).expect_err("mismatch");
        assert!(err.contains("does not belong"), "{err}");
        let ok = Issued::from_pem(a.cert, a.key).expect("match");
        let shown = format!("{ok:?}");
        assert!(
            shown.contains("<redacted>") && !shown.contains("PRIVATE"),
            "{shown}"
        );
        assert!(ok.valid_at(SystemTime::now()));
        assert!(!ok.valid_at(from_unix(4_000_000_000)));
    }

    #[test]
    fn save_swaps_the_link_keeps_the_previous_file_and_load_reads_it_back() {
        let pki = Pki::new("ca");
        let dir = scratch("save");
        let files = PairFiles::new(dir.clone(), CLIENT_PREFIX);
        assert!(files.load().expect("empty").is_none());

        let first = files.save(&issued(&pki, "one")).expect("save one");
        let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&first), 0o600);
        let loaded = files.load().expect("load").expect("some");
        assert!(loaded.chain_pem.contains("BEGIN CERTIFICATE"));
        assert_eq!(
            fs::read_link(files.current_path()).expect("link"),
            PathBuf::from(first.file_name().expect("name"))
        );

        let second = files.save(&issued(&pki, "two")).expect("save two");
        let third = files.save(&issued(&pki, "three")).expect("save three");
        assert!(!first.exists(), "the file two saves ago is removed");
        assert!(
            second.exists(),
            "the previous file is kept until the next save"
        );
        assert!(third.exists());
        assert_eq!(
            fs::canonicalize(files.current_path()).expect("resolve"),
            fs::canonicalize(&third).expect("resolve")
        );
        let other = PairFiles::new(dir.clone(), SERVER_PREFIX);
        other.save(&issued(&pki, "srv")).expect("save server");
        assert!(second.exists(), "another prefix leaves this one alone");

        fs::write(&third, "garbage").expect("spoil");
        assert!(files.load().is_err());
        fs::remove_dir_all(dir.parent().expect("parent")).expect("cleanup");
    }

    #[test]
    fn rotation_falls_between_seventy_and_ninety_percent() {
        let v = Validity {
            not_before: 1_000,
            not_after: 11_000,
        };
        assert_eq!(rotation_deadline_at(&v, 0.0), from_unix(8_000));
        assert_eq!(rotation_deadline_at(&v, 1.0), from_unix(10_000));
        for _ in 0..100 {
            let d = unix(rotation_deadline(&v));
            assert!((8_000..=10_000).contains(&d), "{d}");
        }
        let backwards = Validity {
            not_before: 5_000,
            not_after: 1_000,
        };
        assert_eq!(rotation_deadline_at(&backwards, 0.5), from_unix(5_000));
    }

    #[test]
    fn conditions_end_the_wait_with_their_reason() {
        use k8s_openapi::api::certificates::v1::{
            CertificateSigningRequestCondition, CertificateSigningRequestStatus,
        };
        let mut csr = CertificateSigningRequest::default();
        assert!(outcome("csr-1", &csr).is_none());
        csr.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            certificate: None,
        });
        assert!(outcome("csr-1", &csr).is_none(), "approved, not yet signed");
        csr.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Denied".into(),
                status: "True".into(),
                reason: Some("AutoDenied".into()),
                message: Some("not a node".into()),
                ..Default::default()
            }]),
            certificate: None,
        });
        let err = outcome("csr-1", &csr).expect("done").expect_err("denied");
        assert_eq!(
            err.to_string(),
            "certificate signing request csr-1 was denied: AutoDenied: not a node"
        );
        csr.status = Some(CertificateSigningRequestStatus {
            conditions: None,
            certificate: Some(ByteString(b"-----BEGIN CERTIFICATE-----".to_vec())),
        });
        assert!(outcome("csr-1", &csr).expect("done").is_ok());
    }
}
