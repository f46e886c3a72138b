//! der: the one ASN.1 DER reader, just enough for X.509: one TLV at a time
//! ([`element`]), and the validity window of a certificate, which the apiserver client
//! checks before its first handshake and the certificate manager watches for rotation.
//! The serving side reads client certificates with the same [`element`]. Pure functions
//! over bytes; no IO, no crypto (rustls verifies signatures), nothing above `tls`.

/// The `validity` of an X.509 certificate, in seconds since the Unix epoch (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
const VERSION_TAG: u8 = 0xa0;

/// Reads `Certificate → tbsCertificate → validity` (RFC 5280 4.1) from a DER certificate.
pub fn validity(cert: &[u8]) -> Result<Validity, String> {
    let (certificate, _) = tagged(cert, SEQUENCE, "certificate")?;
    let (tbs, _) = tagged(certificate, SEQUENCE, "tbsCertificate")?;
    let mut rest = tbs;
    if rest.first() == Some(&VERSION_TAG) {
        rest = tagged(rest, VERSION_TAG, "version")?.1;
    }
    rest = any(rest, "serialNumber")?.1;
    rest = tagged(rest, SEQUENCE, "signature")?.1;
    rest = tagged(rest, SEQUENCE, "issuer")?.1;
    let (validity, _) = tagged(rest, SEQUENCE, "validity")?;
    let (not_before, rest) = time(validity, "notBefore")?;
    let (not_after, _) = time(rest, "notAfter")?;
    Ok(Validity {
        not_before,
        not_after,
    })
}

/// One TLV with the expected tag: (its contents, what follows it).
fn tagged<'a>(input: &'a [u8], tag: u8, what: &str) -> Result<(&'a [u8], &'a [u8]), String> {
    match input.first() {
        Some(t) if *t == tag => any(input, what),
        Some(t) => Err(format!("{what}: expected tag {tag:#04x}, found {t:#04x}")),
        None => Err(format!("{what}: truncated")),
    }
}

/// One TLV of any tag: (its contents, what follows it).
fn any<'a>(input: &'a [u8], what: &str) -> Result<(&'a [u8], &'a [u8]), String> {
    match tlv(input) {
        Ok((_, contents, rest)) => Ok((contents, rest)),
        Err(Malformed::Length) => Err(format!("{what}: unsupported length encoding")),
        Err(Malformed::Truncated) => Err(format!("{what}: truncated")),
    }
}

/// Why a TLV cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Malformed {
    Truncated,
    /// BER's indefinite length (which DER forbids), or a length past 4 GiB.
    Length,
}

/// One DER element at the start of `input`: its tag, its contents, and what follows;
/// None if there is no whole element there.
pub fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    tlv(input).ok()
}

fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), Malformed> {
    let (&tag, rest) = input.split_first().ok_or(Malformed::Truncated)?;
    let (&first, rest) = rest.split_first().ok_or(Malformed::Truncated)?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        // 0x80 is BER's indefinite length, which DER forbids; four length bytes are 4 GiB.
        if n == 0 || n > 4 {
            return Err(Malformed::Length);
        }
        if rest.len() < n {
            return Err(Malformed::Truncated);
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, rest)
    };
    if rest.len() < len {
        return Err(Malformed::Truncated);
    }
    let (contents, rest) = rest.split_at(len);
    Ok((tag, contents, rest))
}

/// A UTCTime or GeneralizedTime in the `Z` forms RFC 5280 mandates, as Unix seconds.
fn time<'a>(input: &'a [u8], what: &str) -> Result<(i64, &'a [u8]), String> {
    let tag = *input.first().ok_or_else(|| format!("{what}: truncated"))?;
    let (contents, rest) = any(input, what)?;
    let bad = || {
        format!(
            "{what}: malformed time {:?}",
            String::from_utf8_lossy(contents)
        )
    };
    let digits = match contents.split_last() {
        Some((b'Z', digits)) if digits.iter().all(u8::is_ascii_digit) => digits,
        _ => return Err(bad()),
    };
    let num = |range: std::ops::Range<usize>| -> i64 {
        digits[range]
            .iter()
            .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'))
    };
    let (year, at) = match (tag, digits.len()) {
        // RFC 5280 4.1.2.5.1: YY >= 50 is 19YY, otherwise 20YY.
        (UTC_TIME, 12) => {
            let yy = num(0..2);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
        }
        (GENERALIZED_TIME, 14) => (num(0..4), 4),
        _ => return Err(bad()),
    };
    let (month, day) = (num(at..at + 2), num(at + 2..at + 4));
    let (hour, minute, second) = (
        num(at + 4..at + 6),
        num(at + 6..at + 8),
        num(at + 8..at + 10),
    );
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    let days = days_from_civil(year, month, day);
    Ok((days * 86_400 + hour * 3_600 + minute * 60 + second, rest))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if contents.len() < 0x80 {
            out.push(contents.len() as u8);
        } else {
            out.push(0x82);
            out.extend_from_slice(&(contents.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(contents);
        out
    }

    fn cert_with(not_before: (u8, &str), not_after: (u8, &str), versioned: bool) -> Vec<u8> {
        let mut tbs = Vec::new();
        if versioned {
            tbs.extend(tlv(VERSION_TAG, &tlv(0x02, &[2])));
        }
        tbs.extend(tlv(0x02, &[1, 2, 3]));
        tbs.extend(tlv(SEQUENCE, &tlv(0x06, &[42, 134, 72])));
        // A long issuer so the long length form is exercised.
        tbs.extend(tlv(SEQUENCE, &[0x05; 200]));
        let mut validity = tlv(not_before.0, not_before.1.as_bytes());
        validity.extend(tlv(not_after.0, not_after.1.as_bytes()));
        tbs.extend(tlv(SEQUENCE, &validity));
        tbs.extend(tlv(SEQUENCE, &[]));
        let mut cert = tlv(SEQUENCE, &tbs);
        cert.extend(tlv(SEQUENCE, &[]));
        tlv(SEQUENCE, &cert)
    }

    #[test]
    fn element_reads_short_and_long_lengths_and_refuses_the_rest() {
        let long = tlv(SEQUENCE, &[7; 300]);
        let mut input = long.clone();
        input.extend(tlv(0x02, &[1]));
        let (tag, contents, rest) = element(&input).expect("long form");
        assert_eq!(
            (tag, contents.len(), rest),
            (SEQUENCE, 300, &[0x02, 1, 1][..])
        );
        assert_eq!(element(&long[..long.len() - 1]), None, "truncated");
        assert_eq!(
            element(&[0x30, 0x80, 0x00, 0x00]),
            None,
            "indefinite length"
        );
        assert_eq!(element(&[0x30, 0x85, 1, 0, 0, 0, 0]), None, "past 4 GiB");
        assert_eq!(element(&[0x30]), None);
    }

    #[test]
    fn reads_utc_and_generalized_times() {
        let der = cert_with(
            (UTC_TIME, "240229123456Z"),
            (GENERALIZED_TIME, "20510101000000Z"),
            true,
        );
        let v = validity(&der).expect("validity");
        // 2024-02-29T12:34:56Z and 2051-01-01T00:00:00Z.
        assert_eq!(v.not_before, 1_709_210_096);
        assert_eq!(v.not_after, 2_556_144_000);
    }

    #[test]
    fn utc_time_before_fifty_is_this_century() {
        let der = cert_with(
            (UTC_TIME, "700101000000Z"),
            (UTC_TIME, "491231235959Z"),
            false,
        );
        let v = validity(&der).expect("validity");
        assert_eq!(v.not_before, 0);
        assert_eq!(v.not_after, 2_524_607_999);
    }

    #[test]
    fn rejects_malformed_input() {
        let bad_time = cert_with((UTC_TIME, "2401011200Z"), (UTC_TIME, "250101000000Z"), true);
        assert!(validity(&bad_time)
            .expect_err("short time")
            .contains("notBefore"));
        let month13 = cert_with(
            (UTC_TIME, "241301000000Z"),
            (UTC_TIME, "250101000000Z"),
            true,
        );
        assert!(validity(&month13).is_err());
        let good = cert_with(
            (UTC_TIME, "240101000000Z"),
            (UTC_TIME, "250101000000Z"),
            true,
        );
        for cut in [0, 1, 5, good.len() / 2] {
            assert!(validity(&good[..cut]).is_err(), "cut at {cut}");
        }
        assert!(validity(b"not der at all").is_err());
    }
}
