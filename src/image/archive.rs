//! An image archive as a set of named files: an OCI layout directory, or a tar (OCI
//! layout or `docker save`, optionally gzipped) staged under the content store's `tmp/`
//! and hashed on the way in, so each blob is read once and then only renamed.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use flate2::read::MultiGzDecoder;

use super::content::{copy_hashing, read_limited, Content};
use super::digest::{verify, Expect};
use super::space::DiskBudget;
use super::unpack::{Bounded, Limits};
use super::{io_err, ImageError};

/// Symlink chains inside an archive longer than this are refused as loops.
const MAX_LINK_HOPS: usize = 16;

pub(crate) enum Archive {
    Dir(PathBuf),
    Tar(Staged),
}

pub(crate) struct Staged {
    source: PathBuf,
    dir: PathBuf,
    files: HashMap<String, StagedFile>,
    links: HashMap<String, String>,
}

struct StagedFile {
    path: PathBuf,
    digest: String,
    size: u64,
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Archive {
    pub(crate) fn open(path: &Path, content: &Content) -> Result<Self, ImageError> {
        let meta = fs::metadata(path).map_err(io_err(format!("open {}", path.display())))?;
        if meta.is_dir() {
            return Ok(Archive::Dir(path.to_path_buf()));
        }
        let dir = content.tmp_path("import");
        fs::create_dir(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        let mut staged = Staged {
            source: path.to_path_buf(),
            dir,
            files: HashMap::new(),
            links: HashMap::new(),
        };
        staged.fill()?;
        Ok(Archive::Tar(staged))
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Archive::Dir(p) => p.display().to_string(),
            Archive::Tar(s) => s.source.display().to_string(),
        }
    }

    fn bad(&self, reason: impl Into<String>) -> ImageError {
        ImageError::BadArchive {
            archive: self.describe(),
            reason: reason.into(),
        }
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        match self {
            Archive::Dir(root) => clean(name).is_some_and(|n| root.join(n).is_file()),
            Archive::Tar(s) => s.lookup(name).is_some(),
        }
    }

    /// A small file (index.json, manifest.json, a config), whole; None when absent.
    pub(crate) fn read_small(&self, name: &str, limit: u64) -> Result<Option<Vec<u8>>, ImageError> {
        let path = match self {
            Archive::Dir(root) => {
                let rel =
                    clean(name).ok_or_else(|| self.bad(format!("unsafe file name {name:?}")))?;
                let path = root.join(rel);
                if !path.is_file() {
                    return Ok(None);
                }
                path
            }
            Archive::Tar(s) => match s.lookup(name) {
                Some(f) => f.path.clone(),
                None => return Ok(None),
            },
        };
        read_limited(&path, limit).map(Some)
    }

    /// Puts the archive's file `name` into the content store, checking it against
    /// `expect`. Returns its digest and size.
    pub(crate) fn ingest(
        &self,
        name: &str,
        content: &Content,
        expect: Expect<'_>,
    ) -> Result<(String, u64), ImageError> {
        let missing = || ImageError::MissingBlob {
            archive: self.describe(),
            name: name.to_string(),
        };
        let what = format!("{} in {}", name, self.describe());
        match self {
            Archive::Dir(root) => {
                let rel =
                    clean(name).ok_or_else(|| self.bad(format!("unsafe file name {name:?}")))?;
                let path = root.join(rel);
                if let Some(digest) = expect.digest {
                    // Already verified when it was stored; only the size claim is new.
                    if content.has_blob(digest)? {
                        let stored = content.blob_size(digest)?;
                        check(&what, expect, digest, stored)?;
                        return Ok((digest.to_string(), stored));
                    }
                }
                let mut file = File::open(&path).map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => missing(),
                    _ => io_err(format!("open {}", path.display()))(e),
                })?;
                content.write_blob(&mut file, &what, expect)
            }
            Archive::Tar(s) => {
                let f = s.lookup(name).ok_or_else(missing)?;
                check(&what, expect, &f.digest, f.size)?;
                if !content.has_blob(&f.digest)? {
                    File::open(&f.path)
                        .and_then(|file| file.sync_all())
                        .map_err(io_err(format!("sync {}", f.path.display())))?;
                    content.adopt(&f.path, &f.digest)?;
                }
                Ok((f.digest.clone(), f.size))
            }
        }
    }
}

fn check(what: &str, expect: Expect<'_>, digest: &str, size: u64) -> Result<(), ImageError> {
    let want_digest = expect.digest.unwrap_or(digest);
    let want_size = expect.size.unwrap_or(size);
    verify(what, want_digest, want_size, digest, size)
}

impl Staged {
    fn fill(&mut self) -> Result<(), ImageError> {
        let source = self.source.clone();
        let shown = source.display().to_string();
        let file = File::open(&source).map_err(io_err(format!("open {shown}")))?;
        let mut buffered = BufReader::new(file);
        let gzip = buffered
            .fill_buf()
            .map_err(io_err(format!("read {shown}")))?
            .starts_with(&[0x1f, 0x8b]);
        let compressed = buffered
            .get_ref()
            .metadata()
            .map_err(io_err(format!("stat {shown}")))?
            .len();
        let limits = Limits::DEFAULT;
        let limit = limits.stream_limit(compressed);
        let read = Rc::new(Cell::new(0u64));
        let reader: Box<dyn Read> = if gzip {
            Box::new(Bounded::new(
                Box::new(MultiGzDecoder::new(buffered)),
                read.clone(),
                limit,
            ))
        } else {
            Box::new(buffered)
        };
        let mut budget = DiskBudget::new(&self.dir, format!("stage archive {shown}"));
        let result = self.fill_from(reader, &shown, &mut budget);
        match result {
            Err(_) if read.get() > limit => Err(ImageError::TooLarge {
                what: format!(
                    "archive {shown} once uncompressed (an archive may inflate to {} times \
                     its {compressed} compressed bytes, or to {} bytes if that is more; \
                     beyond that it is taken for a decompression bomb)",
                    limits.ratio, limits.floor
                ),
                limit,
            }),
            other => other,
        }
    }

    fn fill_from(
        &mut self,
        reader: Box<dyn Read>,
        shown: &str,
        budget: &mut DiskBudget,
    ) -> Result<(), ImageError> {
        let mut archive = tar::Archive::new(reader);
        let entries = archive
            .entries()
            .map_err(io_err(format!("read tar {shown}")))?;
        for (n, entry) in entries.enumerate() {
            let mut entry = entry.map_err(io_err(format!("read tar {shown}")))?;
            let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            // Names that could not be looked up anyway are skipped, never written.
            let Some(name) = clean(&raw) else {
                log::debug!("{shown}: skipping entry {raw:?}");
                continue;
            };
            match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    // The header says how much follows: what cannot fit is refused
                    // before any of it is written.
                    budget.charge_entry()?;
                    budget.charge(entry.size())?;
                    let path = self.dir.join(format!("f{n}"));
                    let mut out = File::create(&path)
                        .map_err(|e| budget.io_error(format!("create {}", path.display()), e))?;
                    let (digest, size) = copy_hashing(&mut entry, &mut out).map_err(|e| {
                        budget
                            .io_error(format!("copy {name} from {shown} to {}", path.display()), e)
                    })?;
                    self.files.insert(name, StagedFile { path, digest, size });
                }
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    let Some(target) = entry.link_name_bytes() else {
                        continue;
                    };
                    let target = String::from_utf8_lossy(&target).into_owned();
                    let kind = entry.header().entry_type();
                    // Hard link names are archive-relative; symlinks are relative to their directory.
                    let joined = match (kind, name.rfind('/')) {
                        (tar::EntryType::Symlink, Some(i)) => format!("{}/{target}", &name[..i]),
                        _ => target,
                    };
                    if let Some(resolved) = resolve_lexically(&joined) {
                        self.links.insert(name, resolved);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn lookup(&self, name: &str) -> Option<&StagedFile> {
        let mut name = clean(name)?;
        for _ in 0..MAX_LINK_HOPS {
            if let Some(f) = self.files.get(&name) {
                return Some(f);
            }
            name = self.links.get(&name)?.clone();
        }
        None
    }
}

/// `./a//b` → `a/b`; None for absolute names or ones with `..`.
fn clean(name: &str) -> Option<String> {
    if name.starts_with('/') {
        return None;
    }
    let parts: Vec<&str> = name
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.is_empty() || parts.contains(&"..") {
        return None;
    }
    Some(parts.join("/"))
}

/// Resolves `..` within the archive's namespace; None when it climbs out.
fn resolve_lexically(name: &str) -> Option<String> {
    if name.starts_with('/') {
        return None;
    }
    let mut out: Vec<&str> = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    (!out.is_empty()).then(|| out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_and_links_resolved_inside_the_archive() {
        assert_eq!(
            clean("./blobs//sha256/x").as_deref(),
            Some("blobs/sha256/x")
        );
        assert_eq!(clean("../x"), None);
        assert_eq!(clean("/x"), None);
        assert_eq!(
            resolve_lexically("abc/../blobs/sha256/x").as_deref(),
            Some("blobs/sha256/x")
        );
        assert_eq!(resolve_lexically("abc/../../x"), None);
    }

    /// Every cause of the error appears in what the user is shown.
    fn shows_its_cause(e: &ImageError) -> bool {
        use std::error::Error;
        let shown = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            if !shown.contains(&s.to_string()) {
                return false;
            }
            source = s.source();
        }
        true
    }

    #[test]
    fn a_malformed_archive_says_what_is_wrong_with_it() {
        let tmp = crate::testutil::TempDir::new("archive-malformed");
        let content = Content::open(&tmp.0.join("content")).expect("content store");
        // A tar cut off in the middle of its one file.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(10_000);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, "manifest.json", &[b'x'; 10_000][..])
            .expect("append");
        let mut bytes = b.into_inner().expect("tar");
        bytes.truncate(4096);
        let cut = tmp.0.join("cut.tar");
        fs::write(&cut, &bytes).expect("write");
        let e = Archive::open(&cut, &content)
            .err()
            .expect("a cut tar is refused");
        let shown = e.to_string();
        assert!(shown.contains("cut.tar"), "{shown}");
        assert!(shows_its_cause(&e), "{shown}");
        assert!(
            shown.contains("entire block")
                || shown.contains("EOF")
                || shown.contains("end of file"),
            "{shown}"
        );

        // A header whose checksum is wrong.
        let mut garbage = vec![b'A'; 1024];
        garbage.extend(vec![0u8; 1024]);
        let bad = tmp.0.join("garbage.tar");
        fs::write(&bad, &garbage).expect("write");
        let e = Archive::open(&bad, &content)
            .err()
            .expect("garbage is refused");
        let shown = e.to_string();
        assert!(shows_its_cause(&e), "{shown}");
        assert!(shown.contains("cksum"), "{shown}");

        // Nothing of either is left in the store's temp area.
        let left: Vec<_> = fs::read_dir(tmp.0.join("content/tmp"))
            .expect("tmp")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_full_disk_is_named_as_such() {
        // /dev/full answers every write with ENOSPC.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let e = std::io::Write::write_all(&mut f, b"x")
            .map_err(io_err("write blob /dev/full".into()))
            .expect_err("ENOSPC");
        let shown = e.to_string();
        assert!(shown.contains("No space left on device"), "{shown}");
        assert!(shown.contains("disk is full"), "{shown}");
        assert!(shown.contains("/dev/full"), "{shown}");
    }
}
