//! wire: the small encodings both HTTP clients (the apiserver's and the registry's) put
//! on the wire: the User-Agent, percent-encoding of path segments and query values, and
//! the base64 that kubeconfigs and registry credentials carry. Pure functions; no IO.

/// `holdfast/<version> (linux/<arch>)`, with Go's architecture names as the kubelet
/// reports them. The apiserver records the part before the `/` as the field manager.
pub fn user_agent() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    format!(
        "holdfast/{} ({}/{arch})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS
    )
}

/// Percent-encodes `s` for a URL path segment or query value: everything but the
/// unreserved characters of RFC 3986.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes standard base64 (RFC 4648 with padding), ignoring ASCII whitespace, as
/// kubeconfig `*-data` fields carry it.
pub fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let symbols: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    if !symbols.len().is_multiple_of(4) {
        return Err(format!(
            "base64 length {} is not a multiple of 4",
            symbols.len()
        ));
    }
    let mut out = Vec::with_capacity(symbols.len() / 4 * 3);
    let quads = symbols.len() / 4;
    for (i, quad) in symbols.chunks(4).enumerate() {
        let padding = quad.iter().rev().take_while(|c| **c == b'=').count();
        if padding > 2 || (padding > 0 && i + 1 != quads) {
            return Err("misplaced base64 padding".to_string());
        }
        let mut acc = 0u32;
        for (j, c) in quad.iter().enumerate() {
            let v = if j >= 4 - padding {
                0
            } else {
                value(*c).ok_or_else(|| format!("invalid base64 character {:?}", *c as char))?
            };
            acc = (acc << 6) | v;
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - padding]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_keeps_only_the_unreserved_characters() {
        assert_eq!(escape("a=b&c d/+"), "a%3Db%26c%20d%2F%2B");
        assert_eq!(escape("tok-_.~9"), "tok-_.~9");
    }

    #[test]
    fn base64_round_trips_known_vectors() {
        for (text, bytes) in [
            ("", &b""[..]),
            ("Zg==", b"f"),
            ("Zm8=", b"fo"),
            ("Zm9v", b"foo"),
            ("Zm9vYmFy", b"foobar"),
            ("+/+/\n", &[0xfb, 0xff, 0xbf][..]),
        ] {
            assert_eq!(base64_decode(text).expect(text), bytes, "{text}");
        }
    }

    #[test]
    fn base64_rejects_garbage() {
        assert!(base64_decode("Zm9").is_err());
        assert!(base64_decode("Zm9*").is_err());
        assert!(base64_decode("Zg==Zm9v").is_err());
        assert!(base64_decode("Z===").is_err());
    }
}
