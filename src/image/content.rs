//! The content store under `<root-dir>/content/`: verified blobs by digest and each
//! layer unpacked once. Everything lands in `tmp/` first and is renamed into place, so
//! a blob or layer that is visible is complete even after a power cut.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use super::digest::{hex, hex_of, verify, Expect};
use super::reference::check_digest;
use super::{io_err, unpack, ImageError};

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Partial downloads in `tmp/` are `partial-<hex of the digest>`.
const PARTIAL_PREFIX: &str = "partial-";

pub(crate) struct Content {
    root: PathBuf,
}

impl Content {
    /// Creates the layout and clears `tmp/` of what a crashed process left there.
    pub(crate) fn open(root: &Path) -> Result<Self, ImageError> {
        let content = Content {
            root: root.to_path_buf(),
        };
        for dir in [
            content.blobs_dir(),
            content.layers_dir(),
            content.tmp_dir(),
            content.records_dir(),
        ] {
            fs::create_dir_all(&dir)
                .map_err(io_err(format!("create directory {}", dir.display())))?;
        }
        let tmp = content.tmp_dir();
        let entries = fs::read_dir(&tmp).map_err(io_err(format!("list {}", tmp.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            // A download cut off (by a crash, a power cut) resumes from what it has.
            if owner_alive(&name) || name.starts_with(PARTIAL_PREFIX) {
                continue;
            }
            let removed = match entry.file_type() {
                Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
                _ => fs::remove_file(&path),
            };
            if let Err(e) = removed {
                log::warn!("remove stale {}: {e}", path.display());
            }
        }
        Ok(content)
    }

    fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    fn layers_dir(&self) -> PathBuf {
        self.root.join("layers")
    }

    fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// One small file per image, `<hex of the manifest digest>.json`, holding its index
    /// record (tags included): what rebuilds the image index when the store is lost.
    fn records_dir(&self) -> PathBuf {
        self.root.join("records")
    }

    fn record_path(&self, manifest_digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self
            .records_dir()
            .join(format!("{}.json", hex_of(manifest_digest)?)))
    }

    /// Replaces the record file of `manifest_digest` (written beside, synced, renamed).
    pub(crate) fn write_record(
        &self,
        manifest_digest: &str,
        bytes: &[u8],
    ) -> Result<(), ImageError> {
        let dest = self.record_path(manifest_digest)?;
        let tmp = self.tmp_path("record");
        let written = File::create(&tmp)
            .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
            .and_then(|()| fs::rename(&tmp, &dest));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(format!("write image record {}", dest.display()))(e));
        }
        sync_dir(&self.records_dir());
        Ok(())
    }

    pub(crate) fn remove_record(&self, manifest_digest: &str) -> Result<(), ImageError> {
        let path = self.record_path(manifest_digest)?;
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(io_err(format!("remove image record {}", path.display()))(e))
            }
            _ => {
                sync_dir(&self.records_dir());
                Ok(())
            }
        }
    }

    pub(crate) fn has_record(&self, manifest_digest: &str) -> Result<bool, ImageError> {
        Ok(self.record_path(manifest_digest)?.is_file())
    }

    /// Every record file: its manifest digest and its bytes (at most `limit` each; a
    /// larger or unreadable one is logged and skipped).
    pub(crate) fn records(&self, limit: u64) -> Result<Vec<(String, Vec<u8>)>, ImageError> {
        let dir = self.records_dir();
        let entries = fs::read_dir(&dir).map_err(io_err(format!("list {}", dir.display())))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(hex) = name.strip_suffix(".json") else {
                continue;
            };
            let digest = format!("sha256:{hex}");
            if check_digest(&digest).is_err() {
                continue;
            }
            match read_limited(&entry.path(), limit) {
                Ok(bytes) => out.push((digest, bytes)),
                Err(e) => log::warn!("image record {}: {e}; skipped", entry.path().display()),
            }
        }
        out.sort();
        Ok(out)
    }

    /// A fresh path under `tmp/`, unique within this host.
    pub(crate) fn tmp_path(&self, prefix: &str) -> PathBuf {
        let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
        self.tmp_dir()
            .join(format!("{prefix}-{}-{seq}", std::process::id()))
    }

    /// Where a download of `digest` keeps its bytes until they are verified: named by the
    /// digest, so a download cut off, even by a restart, resumes from what it has.
    pub(crate) fn partial_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self
            .tmp_dir()
            .join(format!("{PARTIAL_PREFIX}{}", hex_of(digest)?)))
    }

    /// Moves a stored blob back to its partial download (and drops its unpacked layer):
    /// for blobs a failed pull fetched and no image uses, so the next try finds them
    /// whole there, verifies them and skips the download.
    pub(crate) fn demote(&self, digest: &str) -> Result<(), ImageError> {
        self.remove_layer(digest)?;
        let blob = self.blob_path(digest)?;
        let partial = self.partial_path(digest)?;
        match fs::rename(&blob, &partial) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(format!(
                "move blob {digest} back to {}",
                partial.display()
            ))(e)),
            _ => Ok(()),
        }
    }

    /// Partial downloads last written before `cutoff` are removed (an image nobody asks
    /// for any more); returns the bytes freed.
    pub(crate) fn remove_partials_before(&self, cutoff: std::time::SystemTime) -> u64 {
        let mut freed = 0;
        let Ok(entries) = fs::read_dir(self.tmp_dir()) else {
            return 0;
        };
        for entry in entries.flatten() {
            if !entry
                .file_name()
                .to_string_lossy()
                .starts_with(PARTIAL_PREFIX)
            {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.modified().is_ok_and(|m| m < cutoff) && fs::remove_file(entry.path()).is_ok() {
                freed += meta.len();
            }
        }
        freed
    }

    /// The digest is checked first: it comes from untrusted manifests and becomes a path.
    pub(crate) fn blob_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.blobs_dir().join(hex_of(digest)?))
    }

    pub(crate) fn has_blob(&self, digest: &str) -> Result<bool, ImageError> {
        Ok(self.blob_path(digest)?.is_file())
    }

    pub(crate) fn blob_size(&self, digest: &str) -> Result<u64, ImageError> {
        let path = self.blob_path(digest)?;
        fs::metadata(&path)
            .map(|m| m.len())
            .map_err(io_err(format!("stat {}", path.display())))
    }

    pub(crate) fn layer_dir(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.layers_dir().join(hex_of(digest)?))
    }

    /// Streams `reader` into the store, hashing as it goes; the blob becomes visible
    /// only once its digest (and size, when `expected` gives one) matched.
    pub(crate) fn write_blob(
        &self,
        reader: &mut dyn Read,
        what: &str,
        expected: Expect<'_>,
    ) -> Result<(String, u64), ImageError> {
        if let Some(digest) = expected.digest {
            hex_of(digest)?;
        }
        let tmp = self.tmp_path("blob");
        let result = self.write_blob_tmp(reader, what, expected, &tmp);
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn write_blob_tmp(
        &self,
        reader: &mut dyn Read,
        what: &str,
        expected: Expect<'_>,
        tmp: &Path,
    ) -> Result<(String, u64), ImageError> {
        let mut file = File::create(tmp).map_err(io_err(format!("create {}", tmp.display())))?;
        let (digest, size) = copy_hashing(reader, &mut file)
            .map_err(io_err(format!("copy {what} to {}", tmp.display())))?;
        verify(
            what,
            expected.digest.unwrap_or(&digest),
            expected.size.unwrap_or(size),
            &digest,
            size,
        )?;
        file.sync_all()
            .map_err(io_err(format!("sync {}", tmp.display())))?;
        drop(file);
        self.adopt(tmp, &digest)?;
        Ok((digest, size))
    }

    /// Moves an already verified and synced file into the store under `digest`.
    pub(crate) fn adopt(&self, tmp: &Path, digest: &str) -> Result<(), ImageError> {
        let dest = self.blob_path(digest)?;
        if dest.is_file() {
            // Same digest, same bytes: keep the copy that is already there.
            let _ = fs::remove_file(tmp);
            return Ok(());
        }
        fs::rename(tmp, &dest).map_err(io_err(format!(
            "move blob {digest} into {}",
            dest.display()
        )))?;
        sync_dir(&self.blobs_dir());
        Ok(())
    }

    /// Reads a small blob (manifest, config) whole, refusing one larger than `limit`.
    pub(crate) fn read_blob(&self, digest: &str, limit: u64) -> Result<Vec<u8>, ImageError> {
        let path = self.blob_path(digest)?;
        read_limited(&path, limit)
    }

    pub(crate) fn remove_blob(&self, digest: &str) -> Result<(), ImageError> {
        let path = self.blob_path(digest)?;
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(io_err(format!("remove blob {}", path.display()))(e))
            }
            _ => Ok(()),
        }
    }

    /// The layer's directory, unpacking the blob first if no complete copy exists.
    /// `diff_id`, when known, is checked against the uncompressed stream.
    pub(crate) fn ensure_unpacked(
        &self,
        digest: &str,
        diff_id: Option<&str>,
    ) -> Result<PathBuf, ImageError> {
        let dest = self.layer_dir(digest)?;
        if dest.is_dir() {
            return Ok(dest);
        }
        let blob = self.blob_path(digest)?;
        let tmp = self.tmp_path("layer");
        let result = unpack::unpack_layer(&blob, &tmp, digest, diff_id).and_then(|()| {
            match fs::rename(&tmp, &dest) {
                Ok(()) => {
                    sync_dir(&self.layers_dir());
                    Ok(())
                }
                // Another caller finished the same layer first; theirs is as good.
                Err(_) if dest.is_dir() => {
                    let _ = fs::remove_dir_all(&tmp);
                    Ok(())
                }
                Err(e) => Err(io_err(format!("move layer {digest} into place"))(e)),
            }
        });
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        result.map(|()| dest)
    }

    /// Digests of every stored blob and every unpacked layer, for sweeping orphans.
    pub(crate) fn stored_digests(&self) -> Result<Vec<String>, ImageError> {
        let mut out = Vec::new();
        for dir in [self.blobs_dir(), self.layers_dir()] {
            let entries = fs::read_dir(&dir).map_err(io_err(format!("list {}", dir.display())))?;
            for entry in entries.flatten() {
                let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
                if check_digest(&digest).is_ok() && !out.contains(&digest) {
                    out.push(digest);
                }
            }
        }
        Ok(out)
    }

    /// Renames the layer away first so that a removal cut short never leaves a
    /// half-empty directory that looks unpacked.
    pub(crate) fn remove_layer(&self, digest: &str) -> Result<(), ImageError> {
        let dir = self.layer_dir(digest)?;
        if !dir.exists() {
            return Ok(());
        }
        let tmp = self.tmp_path("gone");
        fs::rename(&dir, &tmp).map_err(io_err(format!("move away layer {}", dir.display())))?;
        fs::remove_dir_all(&tmp).map_err(io_err(format!("remove {}", tmp.display())))
    }
}

/// Copies everything, returning the sha256 digest and byte count of what passed.
pub(crate) fn copy_hashing(
    reader: &mut dyn Read,
    out: &mut dyn Write,
) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        size += n as u64;
    }
    Ok((format!("sha256:{}", hex(&hasher.finalize())), size))
}

pub(crate) fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, ImageError> {
    let file = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
    let mut out = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(io_err(format!("read {}", path.display())))?;
    if out.len() as u64 > limit {
        return Err(ImageError::TooLarge {
            what: path.display().to_string(),
            limit,
        });
    }
    Ok(out)
}

/// Temp names carry the creating process's pid (`prefix-pid-seq`): a live owner may
/// still be writing there.
fn owner_alive(name: &str) -> bool {
    let mut parts = name.rsplitn(3, '-');
    let _seq = parts.next();
    match parts.next().and_then(|p| p.parse::<u32>().ok()) {
        Some(pid) => Path::new("/proc").join(pid.to_string()).exists(),
        None => false,
    }
}

/// Makes a rename durable. Failure only costs durability, which the next import
/// restores, so it is logged rather than returned.
fn sync_dir(dir: &Path) {
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        log::warn!("sync directory {}: {e}", dir.display());
    }
}
