//! Test certificates: one CA per `Pki`, server certificates for chosen names, client
//! certificates whose subject (CN, O) names a Kubernetes user and its groups, and an
//! expired client certificate. Everything is written as PEM into the `Pki`'s directory.
//!
//! The `Pki` remembers every client certificate it issued (DER -> subject), which is how
//! the apiserver double maps a presented certificate to a user without parsing X.509.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The subject of an issued client certificate: CN is the user, each O a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub common_name: String,
    pub organizations: Vec<String>,
}

/// One issued certificate and its key, in memory and as PEM files.
pub struct Issued {
    /// PEM certificate file.
    pub cert: PathBuf,
    /// PEM (PKCS#8) private key file.
    pub key: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl Issued {
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }
}

/// A certificate authority that writes what it issues into `dir`.
pub struct Pki {
    pub dir: PathBuf,
    /// The CA certificate, PEM.
    pub ca: PathBuf,
    pub ca_pem: String,
    pub ca_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    clients: Mutex<HashMap<Vec<u8>, Subject>>,
}

fn validity(params: &mut CertificateParams, from: SystemTime, to: SystemTime) {
    params.not_before = from.into();
    params.not_after = to.into();
}

impl Pki {
    /// A fresh CA ("holdfast-test-ca"), written to `dir/ca.crt` (and `ca.key`).
    pub fn new(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).expect("create pki dir");
        let key = KeyPair::generate().expect("generate CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "holdfast-test-ca");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        validity(
            &mut params,
            now - Duration::from_secs(3600),
            now + Duration::from_secs(10 * 365 * 86400),
        );
        let cert = params.self_signed(&key).expect("self-sign CA");
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, cert.pem()).expect("write ca.crt");
        std::fs::write(dir.join("ca.key"), key.serialize_pem()).expect("write ca.key");
        Pki {
            dir: dir.to_path_buf(),
            ca,
            ca_pem: cert.pem(),
            ca_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
            clients: Mutex::new(HashMap::new()),
        }
    }

    fn issue(&self, file: &str, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("generate key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign certificate");
        let cert_path = self.dir.join(format!("{file}.crt"));
        let key_path = self.dir.join(format!("{file}.key"));
        std::fs::write(&cert_path, cert.pem()).expect("write certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        Issued {
            cert: cert_path,
            key: key_path,
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }

    /// A server certificate for `names` (IP addresses or DNS names), written as
    /// `dir/<file>.crt` and `dir/<file>.key`.
    pub fn server(&self, file: &str, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("server params");
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = SystemTime::now();
        validity(
            &mut params,
            now - Duration::from_secs(3600),
            now + Duration::from_secs(365 * 86400),
        );
        self.issue(file, params)
    }

    fn client_params(cn: &str, orgs: &[&str]) -> CertificateParams {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        for o in orgs {
            dn.push(DnType::OrganizationName, *o);
        }
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params
    }

    fn remember(&self, issued: &Issued, cn: &str, orgs: &[&str]) {
        let subject = Subject {
            common_name: cn.to_string(),
            organizations: orgs.iter().map(|o| o.to_string()).collect(),
        };
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(issued.cert_der.to_vec(), subject);
    }

    /// A client certificate with subject CN=`cn`, O=each of `orgs`, valid from an hour
    /// ago for a year, written as `dir/<file>.crt` and `.key`.
    pub fn client(&self, file: &str, cn: &str, orgs: &[&str]) -> Issued {
        let mut params = Self::client_params(cn, orgs);
        let now = SystemTime::now();
        validity(
            &mut params,
            now - Duration::from_secs(3600),
            now + Duration::from_secs(365 * 86400),
        );
        let issued = self.issue(file, params);
        self.remember(&issued, cn, orgs);
        issued
    }

    /// Like `client`, but it expired a day ago (valid for one day before that).
    pub fn expired_client(&self, file: &str, cn: &str, orgs: &[&str]) -> Issued {
        let mut params = Self::client_params(cn, orgs);
        let now = SystemTime::now();
        validity(
            &mut params,
            now - Duration::from_secs(2 * 86400),
            now - Duration::from_secs(86400),
        );
        let issued = self.issue(file, params);
        self.remember(&issued, cn, orgs);
        issued
    }

    /// The subject of a client certificate this CA issued, by its DER bytes.
    pub fn subject_of(&self, der: &[u8]) -> Option<Subject> {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(der)
            .cloned()
    }
}

/// A server certificate verifier that takes any certificate (as `curl -k` does) and
/// checks only the handshake signatures: for an agent's self-signed serving
/// certificate, or a test that looks at which certificate was served.
#[derive(Debug)]
pub struct AnyServer(pub std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
