//! Test certificates (rcgen) and a scratch directory for kubeconfig tests.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
};

pub struct Pki {
    pub ca_pem: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A PEM certificate and its PEM key.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("ca key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("ca");
        Pki {
            ca_pem: issuer.pem(),
            issuer,
        }
    }

    /// A client certificate for `cn`, valid between the two years (Jan 1st).
    pub fn client_between(&self, cn: &str, from: i32, until: i32) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.not_before = date_time_ymd(from, 1, 1);
        params.not_after = date_time_ymd(until, 1, 1);
        self.sign(params)
    }

    /// A client certificate valid from 1975 to 4096 (rcgen's defaults).
    pub fn client(&self, cn: &str) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

pub fn base64(bytes: &[u8]) -> String {
    crate::wire::base64_encode(bytes)
}

/// A directory removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "holdfast-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn base64_matches_the_decoder() {
    for input in [&b""[..], b"f", b"fo", b"foo", b"foob", b"\xff\x00\xfe"] {
        assert_eq!(
            crate::wire::base64_decode(&base64(input)).expect("decode"),
            input
        );
    }
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
}
