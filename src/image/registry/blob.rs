//! One blob from a registry into the content store, over a link that drops: bytes go to
//! `content/tmp/partial-<hex>`, a cut connection resumes with `Range` from what is on
//! disk (also after a restart), the sha256 and size are checked before the blob is
//! renamed into place, and a blob that fails its digest is deleted, never kept.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use sha2::{Digest, Sha256};
use ureq::http::Response;
use ureq::Body;

use super::super::content::Content;
use super::super::digest::hex;
use super::super::space::DiskBudget;
use super::super::{io_err, ImageError};
use super::auth::Session;
use super::http::status_error;
use super::RegistryError;
use crate::backoff::{self, Backoff};

/// Tries in a row that bring no new byte before the endpoint is given up.
const STALLED_TRIES: u32 = 5;
/// Pause between such tries: 500 ms doubling to 8 s, full jitter.
const RETRY: Backoff = Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(8),
};
const CHUNK: usize = 64 * 1024;

/// Blobs being downloaded in this process: a second pull of the same blob (two images
/// sharing a layer) waits for the first instead of writing the same partial file.
static IN_FLIGHT: Mutex<Option<HashSet<String>>> = Mutex::new(None);
static IN_FLIGHT_DONE: Condvar = Condvar::new();

struct Claim(String);

impl Claim {
    fn take(digest: &str) -> Claim {
        let mut set = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let s = set.get_or_insert_with(HashSet::new);
            if s.insert(digest.to_string()) {
                return Claim(digest.to_string());
            }
            set = IN_FLIGHT_DONE
                .wait(set)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut set = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = set.as_mut() {
            s.remove(&self.0);
        }
        IN_FLIGHT_DONE.notify_all();
    }
}

/// What became of a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// It was in the store already.
    Present,
    /// Downloaded now; `resumed_from` bytes were on disk before.
    Downloaded { resumed_from: u64 },
}

/// Makes sure blob `digest` of `size` bytes is in the store, downloading what is missing
/// through `session`. `progress` gets the bytes on disk so far.
pub(crate) fn fetch(
    session: &mut Session<'_>,
    content: &Content,
    digest: &str,
    size: u64,
    progress: &mut dyn FnMut(u64),
    cancel: &AtomicBool,
) -> Result<Fetched, RegistryError> {
    let _claim = Claim::take(digest);
    if content.has_blob(digest)? {
        return Ok(Fetched::Present);
    }
    let partial = content.partial_path(digest)?;
    let first_offset = std::fs::metadata(&partial).map_or(0, |m| m.len());
    if first_offset > 0 {
        log::info!("blob {digest}: resuming at {first_offset} of {size} bytes");
    }
    let mut stalled = 0;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(cancelled(digest));
        }
        let before = std::fs::metadata(&partial).map_or(0, |m| m.len());
        match attempt(session, content, digest, size, progress, cancel) {
            Ok(()) => {
                return Ok(Fetched::Downloaded {
                    resumed_from: first_offset,
                })
            }
            Err(e) if e.is_retryable() => {
                let after = std::fs::metadata(&partial).map_or(0, |m| m.len());
                if after > before {
                    stalled = 0;
                    log::info!("blob {digest}: cut off at {after} of {size} bytes ({e}); resuming");
                } else {
                    stalled += 1;
                    if stalled >= STALLED_TRIES {
                        return Err(e);
                    }
                    let pause = RETRY.jittered(stalled, backoff::random());
                    log::info!("blob {digest}: {e}; trying again in {pause:?}");
                    std::thread::sleep(pause);
                }
            }
            Err(e) => {
                if matches!(e, RegistryError::Image(ImageError::DiskFull { .. })) {
                    // Kept, the part would hold the very space that is missing.
                    remove(&partial);
                }
                return Err(e);
            }
        }
    }
}

fn cancelled(digest: &str) -> RegistryError {
    RegistryError::Invalid {
        what: format!("blob {digest}"),
        reason: "cancelled".into(),
    }
}

/// One request: from what is on disk to the end, or an error.
fn attempt(
    session: &mut Session<'_>,
    content: &Content,
    digest: &str,
    size: u64,
    progress: &mut dyn FnMut(u64),
    cancel: &AtomicBool,
) -> Result<(), RegistryError> {
    let partial = content.partial_path(digest)?;
    let Some(mut offset) = partial_offset(&partial, digest, size)? else {
        // Complete on disk already (a pull that failed after it, or a restart).
        return adopt(content, &partial, digest);
    };
    let mut headers = vec![("Accept", "*/*".to_string())];
    if offset > 0 {
        headers.push(("Range", format!("bytes={offset}-")));
    }
    // The body may take as long as a slow uplink needs, but not forever: a stalled
    // transfer ends and resumes from where it stopped.
    let timeout = Duration::from_secs(60) + Duration::from_secs((size - offset) / (16 * 1024));
    let path = format!("/v2/{}/blobs/{digest}", session.repository);
    let response = session.get(&path, headers, Some(timeout))?;
    let url = format!("{}{path}", session.endpoint.base);
    let (resume, response) = resumes(response, offset, &partial, &url)?;
    // Refused before a byte is written when the declared size cannot fit.
    let mut budget = DiskBudget::new(
        partial.parent().unwrap_or(std::path::Path::new("/")),
        format!("download blob {digest} ({size} bytes)"),
    );
    budget.expect(size - offset)?;
    let mut hasher = Sha256::new();
    if !resume {
        offset = 0;
    }
    let mut file = open_partial(&partial, resume, &mut hasher)?;
    let (_, body) = response.into_parts();
    let mut reader = body.into_reader();
    let mut buf = vec![0u8; CHUNK];
    let mut written = offset;
    while written < size {
        if cancel.load(Ordering::Relaxed) {
            return Err(cancelled(digest));
        }
        let want = usize::try_from(size - written).unwrap_or(CHUNK).min(CHUNK);
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(RegistryError::Transport {
                    url,
                    message: format!("the body ended at {written} of {size} bytes"),
                    connect: false,
                })
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(RegistryError::Transport {
                    url,
                    message: format!("read at {written} of {size} bytes: {e}"),
                    connect: false,
                })
            }
        };
        budget.charge(n as u64)?;
        file.write_all(&buf[..n])
            .map_err(|e| budget.io_error(format!("write {}", partial.display()), e))?;
        hasher.update(&buf[..n]);
        written += n as u64;
        progress(written);
    }
    if let Err(e) = check_end(&mut reader, hasher, digest, size, &url) {
        drop(file);
        remove(&partial);
        return Err(e);
    }
    file.sync_all()
        .map_err(io_err(format!("sync {}", partial.display())))?;
    drop(file);
    adopt(content, &partial, digest)
}

/// Where to resume the download of `partial`: from its length, or from 0 when it is
/// longer than the blob or complete but wrong. None when it is complete and verified.
fn partial_offset(
    partial: &std::path::Path,
    digest: &str,
    size: u64,
) -> Result<Option<u64>, RegistryError> {
    let offset = std::fs::metadata(partial).map_or(0, |m| m.len());
    if offset > size {
        remove(partial);
        return Ok(Some(0));
    }
    if offset == size && size > 0 {
        if verify_file(partial, digest, size)? {
            return Ok(None);
        }
        remove(partial);
        return Ok(Some(0));
    }
    Ok(Some(offset))
}

/// Whether the registry's answer resumes at `offset` (206 with the range asked for)
/// or sends the whole blob (200). A range it cannot serve starts the download over.
fn resumes(
    response: Response<Body>,
    offset: u64,
    partial: &std::path::Path,
    url: &str,
) -> Result<(bool, Response<Body>), RegistryError> {
    match response.status().as_u16() {
        200 => Ok((false, response)),
        206 => {
            let range = response
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !range.starts_with(&format!("bytes {offset}-")) {
                remove(partial);
                return Err(RegistryError::Transport {
                    url: url.to_owned(),
                    message: format!(
                        "asked for bytes from {offset}, got range {range:?}; starting over"
                    ),
                    connect: false,
                });
            }
            Ok((true, response))
        }
        416 => {
            remove(partial);
            Err(RegistryError::Transport {
                url: url.to_owned(),
                message: "range not satisfiable; starting over".into(),
                connect: false,
            })
        }
        _ => Err(status_error("GET", url, response)),
    }
}

/// The partial file to write to: appended to after hashing what it holds, or made anew.
fn open_partial(
    partial: &std::path::Path,
    resume: bool,
    hasher: &mut Sha256,
) -> Result<File, RegistryError> {
    if resume {
        hash_prefix(partial, hasher)?;
        Ok(OpenOptions::new()
            .append(true)
            .open(partial)
            .map_err(io_err(format!("open {}", partial.display())))?)
    } else {
        Ok(File::create(partial).map_err(io_err(format!("create {}", partial.display())))?)
    }
}

/// Checks a body read to the blob's size: nothing more follows, and it hashes to `digest`.
fn check_end(
    reader: &mut impl Read,
    hasher: Sha256,
    digest: &str,
    size: u64,
    url: &str,
) -> Result<(), RegistryError> {
    // A server that sends more than the descriptor says is not serving this blob.
    let mut extra = [0u8; 1];
    if matches!(reader.read(&mut extra), Ok(n) if n > 0) {
        return Err(ImageError::SizeMismatch {
            what: format!("blob {digest} from {url}"),
            expected: size,
            actual: size + 1,
        }
        .into());
    }
    let got = format!("sha256:{}", hex(&hasher.finalize()));
    if got != digest {
        return Err(ImageError::DigestMismatch {
            what: format!("blob from {url}"),
            expected: digest.to_string(),
            actual: got,
        }
        .into());
    }
    Ok(())
}

fn adopt(content: &Content, partial: &std::path::Path, digest: &str) -> Result<(), RegistryError> {
    content.adopt(partial, digest)?;
    Ok(())
}

fn remove(path: &std::path::Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            log::warn!("remove {}: {e}", path.display());
        }
    }
}

fn hash_prefix(path: &std::path::Path, hasher: &mut Sha256) -> Result<(), RegistryError> {
    let mut f = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io_err(format!("read {}", path.display())))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

fn verify_file(path: &std::path::Path, digest: &str, size: u64) -> Result<bool, RegistryError> {
    let mut hasher = Sha256::new();
    hash_prefix(path, &mut hasher)?;
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    Ok(len == size && format!("sha256:{}", hex(&hasher.finalize())) == digest)
}
