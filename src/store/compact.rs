//! Compaction: sled keeps the space of deleted and rewritten records for a long time,
//! so after many pod create/delete cycles the store is much larger than what it holds.
//! Compacting copies every tree into a fresh database beside the old one, makes it
//! durable, and swaps it in by rename; the old one is removed only after the swap.
//! Run with the agent stopped (`holdfast store compact`), or by the agent at start.

use std::path::{Path, PathBuf};

use super::open::lock;
use super::{dir_size, Store, StoreError};

/// What a compaction did, in bytes on disk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compacted {
    pub before: u64,
    pub after: u64,
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Compact {
        path: path.to_path_buf(),
        source,
    }
}

/// Compacts the store at `path`, which nobody may hold. A power cut at any point
/// leaves either the old store or the new one at `path` (a half-written copy is
/// only ever at `<path>.compacting`, removed by the next compaction or open).
pub fn compact(path: &Path) -> Result<Compacted, StoreError> {
    let before = dir_size(path);
    let fresh = sibling(path, ".compacting");
    let old = sibling(path, ".old");
    remove_dir_if_there(&fresh)?;
    remove_dir_if_there(&old)?;
    {
        let src = Store::open(path)?;
        let _guard = lock(&fresh)?;
        let dst = Store::config(&fresh)
            .open()
            .map_err(|source| StoreError::Open {
                path: fresh.clone(),
                source,
            })?;
        src.with_db(|db| {
            dst.import(db.export());
            Ok(())
        })?;
        dst.flush().map_err(|source| StoreError::Db {
            op: "flush",
            tree: "*",
            key: String::new(),
            source,
        })?;
        let db_err = |source| StoreError::Db {
            op: "compare",
            tree: "*",
            key: String::new(),
            source,
        };
        // The copy must hold what the original holds before it replaces it.
        let src_sum = src.with_db(|db| db.checksum().map_err(db_err))?;
        if dst.checksum().map_err(db_err)? != src_sum {
            return Err(StoreError::Compact {
                path: path.to_path_buf(),
                source: std::io::Error::other("the copy's checksum differs from the store's"),
            });
        }
    }
    sync_dir(&fresh)?;
    std::fs::rename(path, &old).map_err(io(path))?;
    std::fs::rename(&fresh, path).map_err(io(path))?;
    if let Some(parent) = path.parent() {
        sync_dir(parent)?;
    }
    std::fs::remove_dir_all(&old).map_err(io(&old))?;
    Ok(Compacted {
        before,
        after: dir_size(path),
    })
}

fn remove_dir_if_there(dir: &Path) -> Result<(), StoreError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(dir)(e)),
    }
}

/// A compaction cut between its two renames leaves the store at `<path>.old` and the
/// finished copy at `<path>.compacting`: put one of them back.
pub fn recover_interrupted(path: &Path) -> Result<(), StoreError> {
    let fresh = sibling(path, ".compacting");
    let old = sibling(path, ".old");
    if !path.exists() {
        if old.exists() {
            log::warn!(
                "store: a compaction was interrupted; going back to {}",
                old.display()
            );
            std::fs::rename(&old, path).map_err(io(path))?;
        }
    } else if old.exists() {
        // The swap finished; only the removal of the old copy was cut short.
        remove_dir_if_there(&old)?;
    }
    remove_dir_if_there(&fresh)
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    let f = std::fs::File::open(dir).map_err(io(dir))?;
    f.sync_all().map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Tree;

    #[test]
    fn compaction_keeps_every_record_and_gives_space_back() {
        let tmp = crate::testutil::TempDir::new("compact");
        let dir = tmp.0.join("db");
        {
            let store = Store::open(&dir).expect("open");
            let t: Tree<String> = store.tree("pods").expect("tree");
            let big = "x".repeat(2000);
            for i in 0..3000 {
                t.put(&format!("p{i}"), &big).expect("put");
                if i % 100 != 0 {
                    t.remove(&format!("p{i}")).expect("remove");
                }
            }
            store.flush().expect("flush");
        }
        let c = compact(&dir).expect("compact");
        assert!(c.after < c.before, "{c:?}");
        assert!(!sibling(&dir, ".old").exists() && !sibling(&dir, ".compacting").exists());
        let store = Store::open(&dir).expect("reopen");
        assert!(!store.is_fresh(), "the schema version came along");
        let t: Tree<String> = store.tree("pods").expect("tree");
        assert_eq!(t.keys().expect("keys").len(), 30);
        assert_eq!(t.get("p100").expect("get").map(|s| s.len()), Some(2000));
    }

    #[test]
    fn a_cut_between_the_renames_goes_back_to_the_old_store() {
        let tmp = crate::testutil::TempDir::new("compact");
        let dir = tmp.0.join("db");
        {
            let store = Store::open(&dir).expect("open");
            let t: Tree<u32> = store.tree("n").expect("tree");
            t.put("a", &1).expect("put");
            store.flush().expect("flush");
        }
        std::fs::rename(&dir, sibling(&dir, ".old")).expect("rename");
        std::fs::create_dir_all(sibling(&dir, ".compacting")).expect("half copy");
        recover_interrupted(&dir).expect("recover");
        let store = Store::open(&dir).expect("open");
        let t: Tree<u32> = store.tree("n").expect("tree");
        assert_eq!(t.get("a").expect("get"), Some(1));
        assert!(!sibling(&dir, ".compacting").exists());
    }
}
