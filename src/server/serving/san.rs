//! The subjectAltName extension of an X.509 certificate: its DNS names and IP
//! addresses. Reads DER and nothing else; trusts nothing.

use std::net::IpAddr;

use super::Names;
use crate::tls::der::element;

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
const OCTET_STRING: u8 = 0x04;
/// `[3] EXPLICIT Extensions` of a TBSCertificate.
const EXTENSIONS: u8 = 0xa3;
const DNS_NAME: u8 = 0x82;
const IP_ADDRESS: u8 = 0x87;
/// 2.5.29.17
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

pub(super) fn read(cert: &[u8]) -> Option<Names> {
    let (SEQUENCE, cert, _) = element(cert)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = element(cert)? else {
        return None;
    };
    let mut names = Names {
        dns: Vec::new(),
        ips: Vec::new(),
    };
    // Version, serial, signature, issuer, validity, subject, key, unique ids: only
    // the extensions matter here.
    while let Some((tag, contents, rest)) = element(tbs) {
        tbs = rest;
        if tag != EXTENSIONS {
            continue;
        }
        let (SEQUENCE, mut exts, _) = element(contents)? else {
            return None;
        };
        while let Some((SEQUENCE, ext, rest)) = element(exts) {
            exts = rest;
            let (OID, oid, mut fields) = element(ext)? else {
                return None;
            };
            if oid != SUBJECT_ALT_NAME {
                continue;
            }
            // Skip `critical`, if present, to the value.
            let value = loop {
                let (tag, contents, rest) = element(fields)?;
                if tag == OCTET_STRING {
                    break contents;
                }
                fields = rest;
            };
            let (SEQUENCE, mut general, _) = element(value)? else {
                return None;
            };
            while let Some((tag, contents, rest)) = element(general) {
                general = rest;
                match (tag, contents.len()) {
                    (DNS_NAME, _) => names
                        .dns
                        .push(String::from_utf8_lossy(contents).into_owned()),
                    (IP_ADDRESS, 4) => {
                        let b: [u8; 4] = contents.try_into().ok()?;
                        names.ips.push(IpAddr::from(b));
                    }
                    (IP_ADDRESS, 16) => {
                        let b: [u8; 16] = contents.try_into().ok()?;
                        names.ips.push(IpAddr::from(b));
                    }
                    _ => {}
                }
            }
        }
    }
    Some(names)
}
