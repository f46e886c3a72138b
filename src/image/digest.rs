//! Digests as the image code names and checks them: `sha256:<hex>` strings, what a blob
//! is expected to be, and the check of what arrived against it. A leaf of `image`: the
//! content store, archives, layers and registry pulls all read it; it reads none of them.

use sha2::{Digest, Sha256};

use super::reference::check_digest;
use super::ImageError;

/// What a blob is expected to be, as far as the archive says.
#[derive(Clone, Copy, Default)]
pub(crate) struct Expect<'a> {
    pub digest: Option<&'a str>,
    pub size: Option<u64>,
}

pub(crate) fn hex_of(digest: &str) -> Result<&str, ImageError> {
    check_digest(digest).map_err(|reason| ImageError::BadDigest {
        digest: digest.to_string(),
        reason,
    })?;
    Ok(&digest["sha256:".len()..])
}

pub(crate) fn verify(
    what: &str,
    want: &str,
    want_size: u64,
    got: &str,
    got_size: u64,
) -> Result<(), ImageError> {
    if want != got {
        return Err(ImageError::DigestMismatch {
            what: what.to_string(),
            expected: want.to_string(),
            actual: got.to_string(),
        });
    }
    if want_size != got_size {
        return Err(ImageError::SizeMismatch {
            what: what.to_string(),
            expected: want_size,
            actual: got_size,
        });
    }
    Ok(())
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
