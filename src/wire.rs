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
/// Like Go's `StdEncoding`, it accepts stray bits in the last symbol.
pub fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    use base64::engine::{general_purpose, GeneralPurpose};
    use base64::{alphabet, Engine};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &alphabet::STANDARD,
        general_purpose::PAD.with_decode_allow_trailing_bits(true),
    );
    let symbols: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    LENIENT.decode(symbols).map_err(|e| e.to_string())
}

/// Encodes standard base64 with padding, as the `Authorization: Basic` header and
/// kubeconfig `*-data` fields carry it.
pub fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
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
            ("Zh==", b"f"),
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
