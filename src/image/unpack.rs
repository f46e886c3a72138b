//! Layer extraction. A layer is hostile input: every path is checked component by
//! component, nothing is ever written through a symlink, metadata calls never follow
//! one, and a layer that tries any of it is rejected whole.
//!
//! Whiteouts are turned into overlayfs whiteouts so unpacked layers stack directly as
//! overlay lowerdirs.

use std::cell::Cell;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use flate2::read::MultiGzDecoder;
use nix::sys::stat::{makedev, mknod, utimensat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::{time_t, TimeSpec};
use sha2::{Digest, Sha256};
use tar::EntryType;

use super::digest::hex;
use super::space::{self, DiskBudget};
use super::{io_err, ImageError};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// Extended attributes a layer may carry. `trusted.overlay.*` in particular must never
/// come from a layer: overlayfs would obey it.
const ALLOWED_XATTR_PREFIXES: &[&str] = &["security.capability", "user."];

/// A layer may inflate to this many times its compressed size. Honest layers stay far
/// below (text and binaries compress 2 to 10 times); a run of zeros compressed a
/// thousandfold is a bomb meant to fill the disk.
const MAX_INFLATE_RATIO: u64 = 256;
/// Below this, a layer is never refused for its ratio: small layers of sparse data are
/// honest, and this much fits on any device's disk.
const MIN_INFLATE_LIMIT: u64 = 64 * 1024 * 1024;

/// How far a layer may inflate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub ratio: u64,
    pub floor: u64,
}

impl Limits {
    pub(crate) const DEFAULT: Limits = Limits {
        ratio: MAX_INFLATE_RATIO,
        floor: MIN_INFLATE_LIMIT,
    };

    /// Bytes of tar stream a layer of `compressed` bytes may unpack from.
    pub(crate) fn stream_limit(&self, compressed: u64) -> u64 {
        compressed.saturating_mul(self.ratio).max(self.floor)
    }
}

/// Unpacks the layer blob at `blob` into the new directory `dest`. On error `dest` is
/// removed, so a failed layer leaves nothing behind. The unpacked size is bounded by
/// the blob's (compressed, digest-checked) size and by the free space where `dest` is.
pub(crate) fn unpack_layer(
    blob: &Path,
    dest: &Path,
    layer: &str,
    diff_id: Option<&str>,
) -> Result<(), ImageError> {
    unpack_layer_limited(blob, dest, layer, diff_id, Limits::DEFAULT)
}

pub(crate) fn unpack_layer_limited(
    blob: &Path,
    dest: &Path,
    layer: &str,
    diff_id: Option<&str>,
    limits: Limits,
) -> Result<(), ImageError> {
    let file = File::open(blob).map_err(io_err(format!("open layer blob {}", blob.display())))?;
    let compressed = file
        .metadata()
        .map_err(io_err(format!("stat layer blob {}", blob.display())))?
        .len();
    let mut budget = DiskBudget::new(
        dest.parent().unwrap_or(Path::new("/")),
        format!("unpack layer {layer}"),
    );
    budget.charge_entry()?;
    fs::create_dir(dest)
        .map_err(|e| budget.io_error(format!("create layer directory {}", dest.display()), e))?;
    let stream = Stream {
        layer,
        compressed,
        limit: limits.stream_limit(compressed),
        limits,
    };
    let result = unpack_reader(file, dest, &stream, diff_id, budget);
    if let Err(e) = &result {
        if let Err(cleanup) = fs::remove_dir_all(dest) {
            log::warn!(
                "remove {} after a failed unpack ({e}): {cleanup}",
                dest.display()
            );
        }
    }
    result
}

/// The layer's tar stream and how much of it may be read.
struct Stream<'a> {
    layer: &'a str,
    compressed: u64,
    limit: u64,
    limits: Limits,
}

impl Stream<'_> {
    fn too_large(&self) -> ImageError {
        ImageError::TooLarge {
            what: format!(
                "layer {} once uncompressed (a layer may inflate to {} times its {} \
                 compressed bytes, or to {} bytes if that is more; beyond that it is \
                 taken for a decompression bomb)",
                self.layer, self.limits.ratio, self.compressed, self.limits.floor
            ),
            limit: self.limit,
        }
    }
}

/// What a layer stream is compressed with, judged by its first bytes rather than a
/// media type that docker-save archives do not carry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
    Unsupported(&'static str),
}

pub(crate) fn detect_compression(head: &[u8]) -> Compression {
    match head {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
        [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => Compression::Unsupported("xz"),
        [b'B', b'Z', b'h', ..] => Compression::Unsupported("bzip2"),
        _ => Compression::None,
    }
}

fn unpack_reader(
    file: File,
    dest: &Path,
    stream: &Stream<'_>,
    diff_id: Option<&str>,
    budget: DiskBudget,
) -> Result<(), ImageError> {
    let layer = stream.layer;
    let mut buffered = BufReader::new(file);
    let head = buffered
        .fill_buf()
        .map_err(io_err(format!("read layer {layer}")))?;
    let plain: Box<dyn Read> = match detect_compression(head) {
        Compression::Gzip => Box::new(MultiGzDecoder::new(buffered)),
        Compression::Zstd => Box::new(ZstdFrames::new(buffered, layer)?),
        Compression::None => Box::new(buffered),
        Compression::Unsupported(kind) => {
            return Err(ImageError::UnsupportedCompression {
                layer: layer.to_string(),
                kind,
            })
        }
    };
    let read = Rc::new(Cell::new(0u64));
    let mut hashing = HashingReader {
        inner: Box::new(Bounded::new(plain, read.clone(), stream.limit)),
        hasher: Sha256::new(),
    };
    let mut unpacker = Unpacker {
        root: dest.to_path_buf(),
        layer: layer.to_string(),
        dirs: Vec::new(),
        budget,
        read: read.clone(),
        limit: stream.limit,
    };
    let result = (|| {
        {
            let mut archive = tar::Archive::new(&mut hashing);
            let entries = archive
                .entries()
                .map_err(|e| unpacker.io("", "read tar")(e))?;
            for entry in entries {
                let mut entry = entry.map_err(|e| unpacker.io("", "read tar entry")(e))?;
                unpacker.entry(&mut entry)?;
            }
        }
        unpacker.finish_dirs();
        if let Some(want) = diff_id {
            // The tar end marker can be followed by padding that is still part of the diff.
            io::copy(&mut hashing, &mut io::sink()).map_err(|e| unpacker.io("", "read tar")(e))?;
            let got = format!("sha256:{}", hex(&hashing.hasher.finalize()));
            if got != want {
                return Err(ImageError::DigestMismatch {
                    what: format!("uncompressed layer {layer}"),
                    expected: want.to_string(),
                    actual: got,
                });
            }
        }
        Ok(())
    })();
    // However the tar reader reported running into the bound, it is the bound.
    match result {
        Err(_) if read.get() > stream.limit => Err(stream.too_large()),
        Err(ImageError::TooLarge { .. }) => Err(stream.too_large()),
        other => other,
    }
}

/// Reads at most `limit` bytes of the uncompressed stream, counting them in `read`;
/// one byte more is an error (and `read` shows it).
pub(crate) struct Bounded {
    inner: Box<dyn Read>,
    read: Rc<Cell<u64>>,
    limit: u64,
}

impl Bounded {
    pub(crate) fn new(inner: Box<dyn Read>, read: Rc<Cell<u64>>, limit: u64) -> Bounded {
        Bounded { inner, read, limit }
    }
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let total = self.read.get().saturating_add(n as u64);
        self.read.set(total);
        if total > self.limit {
            return Err(io::Error::other(format!(
                "the uncompressed layer exceeds {} bytes",
                self.limit
            )));
        }
        Ok(n)
    }
}

/// A zstd stream of one or more frames (writers may split a layer into several), read
/// with ruzstd. Its window is bounded by ruzstd's default, so a hostile frame header
/// cannot make it reserve a gateway's memory.
struct ZstdFrames<R: BufRead> {
    decoder: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(source: R, layer: &str) -> Result<Self, ImageError> {
        let decoder =
            ruzstd::decoding::StreamingDecoder::new(source).map_err(|e| ImageError::Io {
                context: format!("layer {layer}: zstd frame header"),
                source: io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
            })?;
        Ok(ZstdFrames {
            decoder: Some(decoder),
        })
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(d) = self.decoder.as_mut() else {
                return Ok(0);
            };
            let n = d.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This frame is done; another may follow.
            let Some(d) = self.decoder.take() else {
                return Ok(0);
            };
            let (mut source, decoder) = d.into_parts();
            if source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            let next = ruzstd::decoding::StreamingDecoder::new_with_decoder(source, decoder)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            self.decoder = Some(next);
        }
    }
}

struct HashingReader {
    inner: Box<dyn Read>,
    hasher: Sha256,
}

impl Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: u64,
    xattrs: Vec<(String, Vec<u8>)>,
}

struct Unpacker {
    root: PathBuf,
    layer: String,
    /// Directory mtimes are set last: creating their children would change them again.
    dirs: Vec<(PathBuf, u64)>,
    /// What the layer has put on the disk so far, against its free space.
    budget: DiskBudget,
    /// Bytes of the uncompressed stream read so far, and how many it may have.
    read: Rc<Cell<u64>>,
    limit: u64,
}

impl Unpacker {
    fn unsafe_entry(&self, entry: &str, reason: impl Into<String>) -> ImageError {
        ImageError::UnsafeLayerEntry {
            layer: self.layer.clone(),
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }

    fn io<'a>(&'a self, entry: &'a str, op: &'a str) -> impl FnOnce(io::Error) -> ImageError + 'a {
        move |source| {
            if space::is_no_space(&source) {
                return self.budget.io_error(
                    format!("layer {}: entry {entry:?}: {op}", self.layer),
                    source,
                );
            }
            ImageError::LayerEntry {
                layer: self.layer.clone(),
                entry: entry.to_string(),
                op: op.to_string(),
                source,
            }
        }
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<R>) -> Result<(), ImageError> {
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            return Ok(());
        }
        let meta = self.meta(entry, &name)?;
        let components = clean_path(&raw).map_err(|r| self.unsafe_entry(&name, r))?;
        let size = entry.size();
        if kind.is_file() || kind == EntryType::Continuous {
            // The header says how much follows: refuse a file that cannot fit before
            // writing any of it.
            if self.read.get().saturating_add(size) > self.limit {
                return Err(ImageError::TooLarge {
                    what: String::new(),
                    limit: self.limit,
                });
            }
            self.budget.charge(size)?;
        }
        self.budget.charge_entry()?;
        let Some((file_name, parents)) = components.split_last() else {
            if kind != EntryType::Directory {
                return Err(self.unsafe_entry(&name, "names the layer root but is not a directory"));
            }
            let root = self.root.clone();
            self.set_meta(&root, &meta, &name)?;
            self.dirs.push((root, meta.mtime));
            return Ok(());
        };
        let parent = self.ensure_parent(parents, &name)?;
        if file_name.starts_with(WHITEOUT_PREFIX) {
            return self.whiteout(&parent, file_name, &name);
        }
        let path = parent.join(OsStr::from_bytes(file_name));
        match kind {
            EntryType::Directory => self.directory(path, &meta, &name)?,
            EntryType::Regular | EntryType::Continuous => {
                self.regular(entry, &path, &meta, &name)?
            }
            EntryType::Symlink => self.symlink(entry, &path, &meta, &name)?,
            EntryType::Link => self.hard_link(entry, &path, &name)?,
            EntryType::Char | EntryType::Block => self.device(&path, &name)?,
            EntryType::Fifo => self.fifo(entry, &path, &meta, &name)?,
            other => {
                return Err(
                    self.unsafe_entry(&name, format!("unsupported tar entry type {other:?}"))
                );
            }
        }
        Ok(())
    }

    /// A directory: made unless one is there, its metadata set (its mtime at the end).
    fn directory(&mut self, path: PathBuf, meta: &Meta, name: &str) -> Result<(), ImageError> {
        let existing = fs::symlink_metadata(&path).ok();
        if !existing.is_some_and(|m| m.is_dir()) {
            self.remove_existing(&path, name)?;
            fs::create_dir(&path).map_err(self.io(name, "create directory"))?;
        }
        self.set_meta(&path, meta, name)?;
        self.dirs.push((path, meta.mtime));
        Ok(())
    }

    /// A regular file, written through no symlink, then owned, moded and dated.
    fn regular<R: Read>(
        &self,
        entry: &mut tar::Entry<R>,
        path: &Path,
        meta: &Meta,
        name: &str,
    ) -> Result<(), ImageError> {
        self.remove_existing(path, name)?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)
            .map_err(self.io(name, "create file"))?;
        io::copy(entry, &mut file).map_err(self.io(name, "write file"))?;
        std::os::unix::fs::fchown(&file, Some(meta.uid), Some(meta.gid))
            .map_err(self.io(name, "chown file"))?;
        // After chown, which clears set-id bits.
        file.set_permissions(fs::Permissions::from_mode(meta.mode))
            .map_err(self.io(name, "chmod file"))?;
        self.set_xattrs(path, meta, name)?;
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(meta.mtime))
            .map_err(self.io(name, "set file mtime"))?;
        Ok(())
    }

    /// A symlink, owned and dated without following it.
    fn symlink<R: Read>(
        &self,
        entry: &mut tar::Entry<R>,
        path: &Path,
        meta: &Meta,
        name: &str,
    ) -> Result<(), ImageError> {
        let target = entry
            .link_name_bytes()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| self.unsafe_entry(name, "symlink has no target"))?
            .into_owned();
        self.remove_existing(path, name)?;
        std::os::unix::fs::symlink(OsStr::from_bytes(&target), path)
            .map_err(self.io(name, "create symlink"))?;
        std::os::unix::fs::lchown(path, Some(meta.uid), Some(meta.gid))
            .map_err(self.io(name, "chown symlink"))?;
        set_mtime_nofollow(path, meta.mtime).map_err(self.io(name, "set symlink mtime"))?;
        Ok(())
    }

    /// A hard link to an entry already unpacked in this layer.
    fn hard_link<R: Read>(
        &self,
        entry: &mut tar::Entry<R>,
        path: &Path,
        name: &str,
    ) -> Result<(), ImageError> {
        let raw_target = entry
            .link_name_bytes()
            .ok_or_else(|| self.unsafe_entry(name, "hard link has no target"))?
            .into_owned();
        let target = self.hardlink_target(&raw_target, name)?;
        if target == *path {
            return Ok(());
        }
        self.remove_existing(path, name)?;
        fs::hard_link(&target, path).map_err(self.io(name, "create hard link"))?;
        Ok(())
    }

    /// A char or block device node, unpacked as a whiteout.
    fn device(&self, path: &Path, name: &str) -> Result<(), ImageError> {
        // A layer's device node would work for whoever reaches the layer store
        // on the host, and a container gets its /dev from the runtime (its
        // devices cgroup allows only those): an overlay whiteout instead (device
        // 0:0, which opens nothing), so the path is absent in the container, as
        // rootless unpackers leave it, and still hides what lower layers had.
        log::info!(
            "layer {}: device node {name} unpacked as a whiteout",
            self.layer
        );
        self.remove_existing(path, name)?;
        mknod(path, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0))
            .map_err(|e| self.io(name, "create whiteout")(e.into()))?;
        Ok(())
    }

    /// A FIFO, owned, moded and dated without following it.
    fn fifo<R: Read>(
        &self,
        entry: &mut tar::Entry<R>,
        path: &Path,
        meta: &Meta,
        name: &str,
    ) -> Result<(), ImageError> {
        let sflag = SFlag::S_IFIFO;
        let header = entry.header();
        let major = header.device_major().ok().flatten().unwrap_or(0);
        let minor = header.device_minor().ok().flatten().unwrap_or(0);
        self.remove_existing(path, name)?;
        mknod(
            path,
            sflag,
            Mode::empty(),
            makedev(major.into(), minor.into()),
        )
        .map_err(|e| self.io(name, "create device node")(e.into()))?;
        std::os::unix::fs::lchown(path, Some(meta.uid), Some(meta.gid))
            .map_err(self.io(name, "chown device node"))?;
        fs::set_permissions(path, fs::Permissions::from_mode(meta.mode))
            .map_err(self.io(name, "chmod device node"))?;
        set_mtime_nofollow(path, meta.mtime).map_err(self.io(name, "set mtime"))?;
        Ok(())
    }

    fn meta<R: Read>(&self, entry: &mut tar::Entry<R>, name: &str) -> Result<Meta, ImageError> {
        let header = entry.header();
        let bad = |what: &str, why: &dyn std::fmt::Display| {
            self.unsafe_entry(name, format!("unreadable {what} in tar header: {why}"))
        };
        let mode = header.mode().map_err(|e| bad("mode", &e))? & 0o7777;
        let mut uid = header.uid().map_err(|e| bad("uid", &e))?;
        let mut gid = header.gid().map_err(|e| bad("gid", &e))?;
        let mtime = header.mtime().unwrap_or(0);
        let mut xattrs = Vec::new();
        // A pax header that cannot be read may have meant another owner: refused.
        let pax = entry
            .pax_extensions()
            .map_err(|e| bad("pax extensions", &e))?;
        if let Some(pax) = pax {
            for ext in pax {
                let ext = ext.map_err(|e| bad("pax extension", &e))?;
                let (Ok(key), value) = (ext.key(), ext.value_bytes()) else {
                    continue;
                };
                let number = || {
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                };
                match key {
                    "uid" => uid = number().ok_or_else(|| bad("pax uid", &"not a number"))?,
                    "gid" => gid = number().ok_or_else(|| bad("pax gid", &"not a number"))?,
                    _ => {
                        if let Some(attr) = key.strip_prefix("SCHILY.xattr.") {
                            if ALLOWED_XATTR_PREFIXES.iter().any(|p| attr.starts_with(p)) {
                                xattrs.push((attr.to_string(), value.to_vec()));
                            } else {
                                log::debug!(
                                    "layer {}: ignoring xattr {attr} on {name}",
                                    self.layer
                                );
                            }
                        }
                    }
                }
            }
        }
        let id = |v: u64, what: &str| u32::try_from(v).map_err(|e| bad(what, &e));
        Ok(Meta {
            mode,
            uid: id(uid, "uid")?,
            gid: id(gid, "gid")?,
            mtime,
            xattrs,
        })
    }

    /// Walks to the entry's parent, creating missing directories and refusing to pass
    /// through anything that is not a real directory created by this layer.
    fn ensure_parent(&self, parents: &[Vec<u8>], name: &str) -> Result<PathBuf, ImageError> {
        let mut cur = self.root.clone();
        for (i, c) in parents.iter().enumerate() {
            cur.push(OsStr::from_bytes(c));
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.unsafe_entry(
                        name,
                        format!("path traverses symlink {}", join(&parents[..=i])),
                    ));
                }
                Ok(_) => {
                    return Err(self.unsafe_entry(
                        name,
                        format!("parent {} is not a directory", join(&parents[..=i])),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&cur).map_err(self.io(name, "create parent directory"))?;
                }
                Err(e) => return Err(self.io(name, "inspect parent directory")(e)),
            }
        }
        Ok(cur)
    }

    fn hardlink_target(&self, raw: &[u8], name: &str) -> Result<PathBuf, ImageError> {
        let shown = String::from_utf8_lossy(raw);
        let components = clean_path(raw)
            .map_err(|r| self.unsafe_entry(name, format!("hard link target {shown:?}: {r}")))?;
        let Some((_, parents)) = components.split_last() else {
            return Err(self.unsafe_entry(name, "hard link target is the layer root"));
        };
        let mut cur = self.root.clone();
        for (i, c) in parents.iter().enumerate() {
            cur.push(OsStr::from_bytes(c));
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.unsafe_entry(
                        name,
                        format!(
                            "hard link target {shown:?} traverses symlink {}",
                            join(&parents[..=i])
                        ),
                    ));
                }
                _ => {
                    return Err(self.unsafe_entry(
                        name,
                        format!("hard link target {shown:?} does not exist in the layer"),
                    ));
                }
            }
        }
        let target = self.root.join(join_path(&components));
        match fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => {
                Err(self.unsafe_entry(name, format!("hard link target {shown:?} is a directory")))
            }
            Ok(_) => Ok(target),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(self.unsafe_entry(
                name,
                format!("hard link target {shown:?} does not exist in the layer"),
            )),
            Err(e) => Err(self.io(name, "inspect hard link target")(e)),
        }
    }

    fn whiteout(&self, parent: &Path, file_name: &[u8], name: &str) -> Result<(), ImageError> {
        if file_name == OPAQUE_MARKER {
            return xattr::set(parent, OPAQUE_XATTR, b"y")
                .map_err(self.io(name, "mark directory opaque"));
        }
        let hidden = &file_name[WHITEOUT_PREFIX.len()..];
        if hidden.starts_with(WHITEOUT_PREFIX) {
            // Other aufs metadata (`.wh..wh.plnk`, ...) means nothing to overlayfs.
            return Ok(());
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(self.unsafe_entry(name, "whiteout names no file"));
        }
        let path = parent.join(OsStr::from_bytes(hidden));
        self.remove_existing(&path, name)?;
        mknod(&path, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0))
            .map_err(|e| self.io(name, "create whiteout")(e.into()))
    }

    /// A later entry replaces an earlier one of the same name. Removing a symlink
    /// removes the link, never what it points at.
    fn remove_existing(&self, path: &Path, name: &str) -> Result<(), ImageError> {
        match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => {
                fs::remove_dir_all(path).map_err(self.io(name, "replace directory"))
            }
            Ok(_) => fs::remove_file(path).map_err(self.io(name, "replace file")),
            Err(_) => Ok(()),
        }
    }

    /// Only called on paths this layer just created as directories or devices, never
    /// on a symlink: chmod would follow it.
    fn set_meta(&self, path: &Path, meta: &Meta, name: &str) -> Result<(), ImageError> {
        std::os::unix::fs::lchown(path, Some(meta.uid), Some(meta.gid))
            .map_err(self.io(name, "chown"))?;
        fs::set_permissions(path, fs::Permissions::from_mode(meta.mode))
            .map_err(self.io(name, "chmod"))?;
        self.set_xattrs(path, meta, name)
    }

    fn set_xattrs(&self, path: &Path, meta: &Meta, name: &str) -> Result<(), ImageError> {
        for (key, value) in &meta.xattrs {
            xattr::set(path, key, value).map_err(self.io(name, "set xattr"))?;
        }
        Ok(())
    }

    fn finish_dirs(&mut self) {
        for (path, mtime) in self.dirs.drain(..).rev() {
            if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                if let Err(e) = set_mtime_nofollow(&path, mtime) {
                    log::debug!("set mtime of {}: {e}", path.display());
                }
            }
        }
    }
}

/// Splits a tar path into its components, accepting a leading `./` and refusing
/// absolute paths and `..` anywhere.
fn clean_path(raw: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if raw.first() == Some(&b'/') {
        return Err("absolute path".into());
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("path has a '..' component".into()),
            c => out.push(c.to_vec()),
        }
    }
    Ok(out)
}

fn join(components: &[Vec<u8>]) -> String {
    components
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn join_path(components: &[Vec<u8>]) -> PathBuf {
    components.iter().map(|c| OsStr::from_bytes(c)).collect()
}

fn set_mtime_nofollow(path: &Path, mtime: u64) -> io::Result<()> {
    // time_t is i32 on 32-bit ARM glibc and i64 elsewhere: saturate in whichever it is.
    let secs = time_t::try_from(mtime).unwrap_or(time_t::MAX);
    let t = TimeSpec::new(secs, 0);
    utimensat(None, path, &t, &t, UtimensatFlags::NoFollowSymlink).map_err(io::Error::from)
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
