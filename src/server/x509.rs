//! The two fields of a client certificate that the handshake needs before the client
//! CA check runs, its X.509 version and its public key, and after it the subject that
//! names the client ([`subject`]). webpki parses version 3
//! certificates only, so without this a client holding a version 1 certificate (what
//! `openssl x509 -req` makes without an extension file) would get a TLS alert instead
//! of the 401 that says what is wrong. Reads DER through `tls::der` and nothing else;
//! trusts nothing.

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{DigitallySignedStruct, PeerMisbehaved};
use rustls_pki_types::SubjectPublicKeyInfoDer;

use crate::tls::der::element;

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
/// `[0] EXPLICIT`: the version field of a TBSCertificate.
const VERSION: u8 = 0xa0;

/// What the handshake reads of a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields<'a> {
    /// 1, 2 or 3.
    pub version: u8,
    /// The whole SubjectPublicKeyInfo element.
    pub spki: &'a [u8],
}

/// Reads the version and public key of a DER certificate; None if it is not one.
pub fn fields(cert: &[u8]) -> Option<Fields<'_>> {
    let (SEQUENCE, cert, _) = element(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = element(cert)? else {
        return None;
    };
    let (version, rest) = match element(tbs)? {
        (VERSION, explicit, rest) => match element(explicit)? {
            (INTEGER, [v @ 0..=2], _) => (v + 1, rest),
            _ => return None,
        },
        // Absent: the default, version 1.
        _ => (1, tbs),
    };
    // serialNumber, signature, issuer, validity, subject.
    let (INTEGER, _, mut rest) = element(rest)? else {
        return None;
    };
    for _ in 0..4 {
        let (SEQUENCE, _, next) = element(rest)? else {
            return None;
        };
        rest = next;
    }
    let (SEQUENCE, _, after) = element(rest)? else {
        return None;
    };
    let spki = &rest[..rest.len() - after.len()];
    Some(Fields { version, spki })
}

/// Who a client certificate names: its subject's common name and organizations, as
/// the kubelet reads them for a user name and groups.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subject {
    /// The last CN of the subject (Go's `pkix.Name` keeps the last one).
    pub common_name: Option<String>,
    /// Every O, in order.
    pub organizations: Vec<String>,
}

/// The most attributes read from a subject, and the longest value kept: a subject is
/// a handful of short strings, anything past these is not a client's name.
const MAX_SUBJECT_ATTRIBUTES: usize = 64;
const MAX_SUBJECT_VALUE: usize = 1024;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// 2.5.4.3 and 2.5.4.10.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

/// Reads the subject of a DER certificate; None if it is not a certificate or its
/// subject is not a well-formed Name of string attributes.
pub fn subject(cert: &[u8]) -> Option<Subject> {
    let (SEQUENCE, cert, _) = element(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = element(cert)? else {
        return None;
    };
    let rest = match element(tbs)? {
        (VERSION, _, rest) => rest,
        _ => tbs,
    };
    // serialNumber, signature, issuer, validity, then the subject.
    let (INTEGER, _, mut rest) = element(rest)? else {
        return None;
    };
    for _ in 0..3 {
        let (SEQUENCE, _, next) = element(rest)? else {
            return None;
        };
        rest = next;
    }
    let (SEQUENCE, mut rdns, _) = element(rest)? else {
        return None;
    };
    let mut out = Subject::default();
    let mut seen = 0usize;
    while !rdns.is_empty() {
        let (SET, mut set, next) = element(rdns)? else {
            return None;
        };
        rdns = next;
        while !set.is_empty() {
            seen += 1;
            if seen > MAX_SUBJECT_ATTRIBUTES {
                return None;
            }
            let (SEQUENCE, pair, next) = element(set)? else {
                return None;
            };
            set = next;
            let (OID, oid, value) = element(pair)? else {
                return None;
            };
            let (tag, text, _) = element(value)?;
            if oid != OID_COMMON_NAME && oid != OID_ORGANIZATION {
                continue;
            }
            let text = string_value(tag, text)?;
            if oid == OID_COMMON_NAME {
                out.common_name = Some(text);
            } else {
                out.organizations.push(text);
            }
        }
    }
    Some(out)
}

/// A DirectoryString's text: UTF8String, PrintableString, IA5String or (as Go reads
/// it) a T61String holding UTF-8.
fn string_value(tag: u8, bytes: &[u8]) -> Option<String> {
    const UTF8: u8 = 0x0c;
    const PRINTABLE: u8 = 0x13;
    const T61: u8 = 0x14;
    const IA5: u8 = 0x16;
    if bytes.len() > MAX_SUBJECT_VALUE || !matches!(tag, UTF8 | PRINTABLE | T61 | IA5) {
        return None;
    }
    let s = std::str::from_utf8(bytes).ok()?;
    if s.chars().any(char::is_control) {
        return None;
    }
    Some(s.to_owned())
}

/// Checks a handshake signature against the certificate's public key alone, without
/// webpki's parse of the whole certificate (which refuses versions 1 and 2). For
/// TLS 1.3 through rustls's raw-key check; for TLS 1.2, as rustls does it for a
/// certificate: every algorithm mapped to the scheme whose key type matches.
pub fn verify_signature(
    message: &[u8],
    cert: &[u8],
    dss: &DigitallySignedStruct,
    algorithms: &WebPkiSupportedAlgorithms,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let bad = || rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding);
    let spki = fields(cert).ok_or_else(bad)?.spki;
    if tls13 {
        return rustls::crypto::verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(spki),
            dss,
            algorithms,
        );
    }
    let (SEQUENCE, spki, _) = element(spki).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (SEQUENCE, algorithm, rest) = element(spki).ok_or_else(bad)? else {
        return Err(bad());
    };
    let (BIT_STRING, [0, key @ ..], _) = element(rest).ok_or_else(bad)? else {
        return Err(bad());
    };
    let candidates = algorithms
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == dss.scheme)
        .map(|(_, algs)| *algs)
        .ok_or(rustls::Error::PeerMisbehaved(
            PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
        ))?;
    for alg in candidates {
        if alg.public_key_alg_id().as_ref() != algorithm {
            continue;
        }
        return alg
            .verify_signature(key, message, dss.signature())
            .map(|()| HandshakeSignatureValid::assertion())
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature)
            });
    }
    Err(rustls::Error::InvalidCertificate(
        rustls::CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext {
            signature_algorithm_id: Vec::new(),
            public_key_algorithm_id: algorithm.to_vec(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert() -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["a.example".to_string()]).expect("params");
        (params.self_signed(&key).expect("cert"), key)
    }

    #[test]
    fn reads_version_and_key_of_a_v3_certificate() {
        use rcgen::PublicKeyData;
        let (c, key) = cert();
        let f = fields(c.der()).expect("fields");
        assert_eq!(f.version, 3);
        assert_eq!(f.spki, key.subject_public_key_info().as_slice());
    }

    #[test]
    fn reads_the_subject_common_name_and_organizations() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:other");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(rcgen::DnType::CountryName, "DE");
        let c = params.self_signed(&key).expect("cert");
        let s = subject(c.der()).expect("subject");
        assert_eq!(s.common_name.as_deref(), Some("system:node:other"));
        assert_eq!(s.organizations, vec!["system:nodes".to_string()]);
        let (c, _) = cert();
        assert_eq!(subject(c.der()).map(|s| s.organizations.len()), Some(0));
        assert_eq!(subject(b"not a certificate"), None);
        let der = c.der().to_vec();
        for cut in [1, 10, der.len() / 2, der.len() - 1] {
            assert_eq!(subject(&der[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn reads_a_v1_certificate_and_refuses_what_is_not_one() {
        // A v1 TBSCertificate: no [0] version; serial, alg, issuer, validity, subject,
        // then the SPKI (here a stand-in SEQUENCE).
        let tbs: &[u8] = &[
            0x30, 0x11, 0x02, 0x01, 0x01, 0x30, 0x00, 0x30, 0x00, 0x30, 0x00, 0x30, 0x00, 0x30,
            0x04, 0x30, 0x00, 0x03, 0x00,
        ];
        let mut der = vec![0x30, tbs.len() as u8];
        der.extend_from_slice(tbs);
        let f = fields(&der).expect("fields");
        assert_eq!(f.version, 1);
        assert_eq!(f.spki, &[0x30, 0x04, 0x30, 0x00, 0x03, 0x00]);
        assert_eq!(fields(&der[..der.len() - 1]), None, "truncated");
        assert_eq!(fields(b"not a certificate"), None);
        assert_eq!(fields(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
