//! The store's generation: a counter bumped by every durable flush ([`super::Store::flush`])
//! and written twice, into sled's `meta` tree (flushed with the records) and, once
//! sled's flush and the sync of its log returned, into a small file of its own beside
//! sled's (`holdfast.generation`, two checksummed slots overwritten in place, one per
//! flush, and synced). sled's file may lose its newest part and still open (its
//! recovery stops at the first damaged entry and calls the rest a torn tail): the store
//! then holds an older state without saying so. The file remembers how far the store
//! got: a store whose generation is behind it went back in time and is not trusted.
//!
//! A power cut between sled's flush and the file's write leaves sled one ahead of the
//! file, which is fine; the other way round never happens.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
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
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            log::warn!(
                "store: read {}: {e}; not compared this time",
                path.display()
            );
            return None;
        }
    };
    let parsed = parse(&bytes);
    if parsed.is_none() {
        log::warn!(
            "store: {} does not read back as written; not compared this time",
            path.display()
        );
    }
    parsed
}

/// The file's size: two slots of [`SLOT`] bytes. Written in place, one slot per flush
/// (generation `n` goes to slot `n % 2`), so a flush rewrites one block and its sync
/// changes no inode or directory; a write torn by a power cut spoils at most the slot
/// it wrote, and the other one still holds the generation before it, which is all the
/// file promises (a floor).
const SIZE: usize = 2 * SLOT;
const SLOT: usize = 32;
/// Opens every slot, so that a file of this size is known for one of ours.
const MAGIC: &[u8; 8] = b"hfgen\0\0\x02";

/// FNV-1a, 64 bits: enough to tell a torn or flipped slot from a written one.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A slot: magic, `n` (big-endian), `!n`, and the checksum of the 24 bytes before it.
fn slot(n: u64) -> [u8; SLOT] {
    let mut s = [0u8; SLOT];
    s[..8].copy_from_slice(MAGIC);
    s[8..16].copy_from_slice(&n.to_be_bytes());
    s[16..24].copy_from_slice(&(!n).to_be_bytes());
    let sum = checksum(&s[..24]);
    s[24..].copy_from_slice(&sum.to_be_bytes());
    s
}

fn read_slot(s: &[u8]) -> Option<u64> {
    let s: &[u8; SLOT] = s.try_into().ok()?;
    let word = |at: usize| s[at..at + 8].try_into().ok().map(u64::from_be_bytes);
    let (n, check, sum) = (word(8)?, word(16)?, word(24)?);
    (&s[..8] == MAGIC && check == !n && sum == checksum(&s[..24])).then_some(n)
}

/// The newest generation of a file's bytes, in either format: two slots (the newer of
/// those that read back), or the text `<n> <!n in hex>` written before the slots were.
fn parse(bytes: &[u8]) -> Option<u64> {
    if bytes.len() == SIZE {
        return bytes.chunks(SLOT).filter_map(read_slot).max();
    }
    parse_text(std::str::from_utf8(bytes).ok()?)
}

/// The file as it was before slots: `<n> <!n in hex>`.
fn parse_text(text: &str) -> Option<u64> {
    let (n, check) = text.trim().split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    let check = u64::from_str_radix(check, 16).ok()?;
    (check == !n).then_some(n)
}

/// Records generation `n` in the file. The common case overwrites one slot in place and
/// syncs its data only (one block, no journal commit for an inode or a directory); a
/// file that is missing, damaged or in the older text format is replaced whole instead,
/// atomically (written beside it, synced, renamed over it, the directory synced).
pub(super) fn write_file(dir: &Path, n: u64) -> std::io::Result<()> {
    let path = file_path(dir);
    // Write-only: a FIFO put in its place blocks here, as a stalled disk would.
    match OpenOptions::new().write(true).open(&path) {
        Ok(f) if f.metadata()?.len() == SIZE as u64 => {
            let at = (n % 2) * SLOT as u64;
            f.write_all_at(&slot(n), at)?;
            return f.sync_data();
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    replace_file(dir, n)
}

/// Replaces the file with one whose two slots both hold `n`.
fn replace_file(dir: &Path, n: u64) -> std::io::Result<()> {
    let path = file_path(dir);
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&tmp)?;
    let mut bytes = [0u8; SIZE];
    bytes[..SLOT].copy_from_slice(&slot(n));
    bytes[SLOT..].copy_from_slice(&slot(n));
    f.write_all(&bytes)?;
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

    fn text(n: u64) -> String {
        format!("{n} {:016x}\n", !n)
    }

    #[test]
    fn the_older_text_file_still_reads_and_a_flipped_bit_is_noticed() {
        assert_eq!(parse(text(0).as_bytes()), Some(0));
        assert_eq!(parse(text(u64::MAX).as_bytes()), Some(u64::MAX));
        assert_eq!(parse(text(41).as_bytes()), Some(41));
        let flipped = text(41).replacen("41", "43", 1);
        assert_eq!(parse(flipped.as_bytes()), None);
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"12"), None);
    }

    #[test]
    fn the_newer_slot_wins_and_a_damaged_slot_falls_back_to_the_other() {
        let mut bytes = [0u8; SIZE];
        bytes[..SLOT].copy_from_slice(&slot(42));
        bytes[SLOT..].copy_from_slice(&slot(41));
        assert_eq!(parse(&bytes), Some(42));
        // A write of 42 torn (or a bit flipped in it): 41 is still known.
        bytes[12] ^= 0x10;
        assert_eq!(parse(&bytes), Some(41));
        bytes[SLOT + 30] ^= 1;
        assert_eq!(parse(&bytes), None);
        assert_eq!(parse(&[0u8; SIZE]), None);
    }

    #[test]
    fn a_text_file_is_upgraded_then_written_in_place() {
        let tmp = crate::testutil::TempDir::new("generation");
        let dir = tmp.0.clone();
        let path = file_path(&dir);
        fs::write(&path, text(7)).expect("older file");
        assert_eq!(in_file(&dir), Some(7));
        write_file(&dir, 8).expect("upgrade");
        assert_eq!(in_file(&dir), Some(8));
        assert_eq!(fs::metadata(&path).expect("stat").len(), SIZE as u64);
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).expect("stat"));
        let before = inode(&path);
        for n in 9..20 {
            write_file(&dir, n).expect("write");
            assert_eq!(in_file(&dir), Some(n));
        }
        assert_eq!(
            inode(&path),
            before,
            "the file was replaced, not overwritten"
        );
        assert!(!dir.join(format!("{FILE}.tmp")).exists());
    }
}
