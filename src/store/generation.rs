//! The store's generation: a counter bumped by every flush and written twice, into
//! sled's `meta` tree (flushed with the records) and, once sled's flush returned, into
//! a small file of its own beside sled's (`holdfast.generation`, replaced atomically
//! and synced). sled's file may lose its newest part and still open (its recovery
//! stops at the first damaged entry and calls the rest a torn tail): the store then
//! holds an older state without saying so. The file remembers how far the store got:
//! a store whose generation is behind it went back in time and is not trusted.
//!
//! A power cut between sled's flush and the file's rename leaves sled one ahead of
//! the file, which is fine; the other way round never happens.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::StoreError;

/// Key of the generation in sled's `meta` tree (u64, big-endian).
pub(super) const META_GENERATION: &str = "generation";

/// The file beside sled's, in the store's directory.
pub const FILE: &str = "holdfast.generation";

pub(super) fn file_path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// The generation sled holds (0 when none was ever written: a new store, or one
/// written before generations were kept).
pub(super) fn in_sled(db: &sled::Db) -> Result<u64, StoreError> {
    let db_err = |op: &'static str| {
        move |source| StoreError::Db {
            op,
            tree: "meta",
            key: META_GENERATION.into(),
            source,
        }
    };
    let meta = db.open_tree("meta").map_err(db_err("open tree"))?;
    Ok(match meta.get(META_GENERATION).map_err(db_err("get"))? {
        Some(v) => match <[u8; 8]>::try_from(v.as_ref()) {
            Ok(raw) => u64::from_be_bytes(raw),
            // Not ours to guess: the file's check below decides.
            Err(_) => 0,
        },
        None => 0,
    })
}

/// The generation the file records: `None` when there is no file (a new store, one
/// written before generations were kept, or just compacted) or it does not read back
/// as written (then it is written again at the next flush, and nothing is compared).
pub(super) fn in_file(dir: &Path) -> Option<u64> {
    let path = file_path(dir);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            log::warn!(
                "store: read {}: {e}; not compared this time",
                path.display()
            );
            return None;
        }
    };
    let parsed = parse(&text);
    if parsed.is_none() {
        log::warn!(
            "store: {} does not read back as written; not compared this time",
            path.display()
        );
    }
    parsed
}

/// `<n> <!n in hex>`: a flipped bit in the file itself is noticed rather than taken
/// for a generation the store never had.
fn render(n: u64) -> String {
    format!("{n} {:016x}\n", !n)
}

fn parse(text: &str) -> Option<u64> {
    let (n, check) = text.trim().split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    let check = u64::from_str_radix(check, 16).ok()?;
    (check == !n).then_some(n)
}

/// Replaces the file with generation `n`: written beside it, synced, renamed over it,
/// and the directory synced. Two fsyncs per flush; see [`super::Store::flush`].
pub(super) fn write_file(dir: &Path, n: u64) -> std::io::Result<()> {
    let path = file_path(dir);
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(render(n).as_bytes())?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()
}

/// Compares sled's generation with the file's at open; an error when sled is behind.
pub(super) fn check(db: &sled::Db, dir: &Path) -> Result<u64, StoreError> {
    let store = in_sled(db)?;
    match in_file(dir) {
        Some(file) if store < file => {
            crate::metrics::STORE_WENT_BACK.add(1);
            log::error!(
                "STORE WENT BACK IN TIME: {} holds generation {store}, but {} recorded generation {file} as flushed; sled lost writes it had made durable (its file is damaged) and its records cannot be trusted",
                dir.display(),
                file_path(dir).display()
            );
            Err(StoreError::WentBack {
                path: dir.to_path_buf(),
                store,
                file,
            })
        }
        Some(_) => Ok(store),
        None => {
            // Start comparing from here on.
            if let Err(e) = write_file(dir, store) {
                log::warn!(
                    "store: write {}: {e}; the store's generation is not tracked until the next flush",
                    file_path(dir).display()
                );
            }
            Ok(store)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_reads_back_and_a_flipped_bit_is_noticed() {
        assert_eq!(parse(&render(0)), Some(0));
        assert_eq!(parse(&render(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse(&render(41)), Some(41));
        let flipped = render(41).replacen("41", "43", 1);
        assert_eq!(parse(&flipped), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("12"), None);
    }
}
