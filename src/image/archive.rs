//! An image archive as a set of named files: an OCI layout directory, or a tar (OCI
//! layout or `docker save`, optionally gzipped) staged under the content store's `tmp/`
//! and hashed on the way in, so each blob is read once and then only renamed.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

use super::content::{copy_hashing, read_limited, verify, Content};
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

/// What a blob is expected to be, as far as the archive says.
#[derive(Clone, Copy, Default)]
pub(crate) struct Expect<'a> {
    pub digest: Option<&'a str>,
    pub size: Option<u64>,
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
                let mut file = File::open(&path).map_err(|_| missing())?;
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
        let reader: Box<dyn Read> = if gzip {
            Box::new(MultiGzDecoder::new(buffered))
        } else {
            Box::new(buffered)
        };
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
                    let path = self.dir.join(format!("f{n}"));
                    let mut out = File::create(&path)
                        .map_err(io_err(format!("create {}", path.display())))?;
                    let (digest, size) = copy_hashing(&mut entry, &mut out)
                        .map_err(io_err(format!("read {name} from {shown}")))?;
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
}
