//! store: the sled database. Sync only; never imports tokio.
//!
//! Every fact the agent needs after a restart lives here, in typed trees whose values
//! are JSON. Writes happen on state change only; callers that need a change to survive
//! a power cut call [`Store::flush`], which syncs sled's log file (one journal commit
//! when the log grew). A thread of the store's own writes out what is still only in
//! memory once a second, without a sync: the filesystem's own commit makes that
//! durable within seconds, as for any file, and the thread syncs it itself after
//! [`SYNC_EVERY`] at the latest. Dropping the last handle stops that thread,
//! waits for it and flushes, so that nothing of the store touches its directory once
//! that drop returned.
//!
//! A full disk loses nothing: sled keeps [`space::HEADROOM`] bytes allocated for
//! itself, and when even that is gone, writes are held in memory (newest per key) and
//! read back from there, then written in one transaction once the disk has room again
//! (see [`pending`] and [`space`]).
//!
//! Every durable flush bumps a generation kept both in sled and in a file beside it; a
//! store whose sled is behind that file went back in time (sled dropped a damaged tail)
//! and is refused (see [`generation`]).
//!
//! After a burst of writes that left the agent's memory well above where it stood, the
//! agent closes sled and opens it again ([`Store::reopen`]): what sled holds in memory
//! is then made anew in one short run instead of lying scattered through the heap the
//! burst grew (`sync::burst` says when, and what it costs the flash).

mod batch;
pub mod compact;
mod error;
pub mod generation;
mod open;
mod pending;
pub mod recover;
pub mod space;
mod tree;
mod write;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use nix::fcntl::Flock;

pub use batch::Batch;
pub use error::StoreError;
pub use pending::Holding;
pub use tree::Tree;

use error::is_no_space;
use open::{check_schema, lock, open_sled};
use pending::Pending;
use space::Space;
use write::Flusher;

/// Bumped when the layout of a tree changes; a store written by a newer holdfast is
/// refused rather than misread.
pub const SCHEMA_VERSION: u32 = 1;

const META_SCHEMA: &str = "schema_version";

/// sled's page cache: small, for a device with 256 MiB of RAM.
const CACHE_BYTES: u64 = 4 * 1024 * 1024;

/// How often the store's thread writes out what sled holds only in memory: a second
/// keeps bursts of changes in one write, and leaves the kernel little to hold.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// How long what the store's thread wrote out waits at most before the thread makes it
/// durable itself: a journal commit that often at most, while writes go on.
const SYNC_EVERY: Duration = Duration::from_secs(30);

/// Below this, a store is never compacted at start: sled's own floor is a few MiB.
pub const COMPACT_MIN_BYTES: u64 = 16 * 1024 * 1024;
/// Disk bytes per live byte above which the agent compacts at start.
pub const COMPACT_RATIO: u64 = 8;

/// Pins of the epoch [`collect_garbage`] makes: each may advance the epoch once and run
/// a few bags of deferred frees; this many empties a burst's worth of them.
const GARBAGE_PINS: usize = 64;

/// Runs the frees sled deferred on this thread and on threads gone since.
///
/// sled drops what a write replaced (tree nodes, each 512 KiB log buffer it filled)
/// through crossbeam-epoch: the drop waits in the writing thread's bag until the bag is
/// full or flushed, then in the global queue until a pinning thread finds it two epochs
/// old. After a burst nothing pins any more, and what the burst replaced stays
/// allocated, scattered through the heap between what lives on, so the allocator cannot
/// give the pages back. A few pins with a flush advance the epoch and run them.
pub fn collect_garbage() {
    for _ in 0..GARBAGE_PINS {
        crossbeam_epoch::pin().flush();
    }
}

/// Bytes of the regular files under `dir` (sled's files), 0 when unreadable. Bounded:
/// sled's layout is a few levels deep at most.
pub fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    let mut budget = 100_000usize;
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                return total;
            }
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// How long `open` waits for another process to let go of the store.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);
/// The agent's database. Cheap to clone: every clone is the same store. Dropping the
/// last clone closes it: once that drop returns, nothing of the store touches its
/// directory.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    /// Held by the handles only, never by the store's thread: the last handle is
    /// always dropped by a caller, which then stops that thread and waits for it.
    _flusher: Arc<Flusher>,
}

struct Inner {
    path: PathBuf,
    /// `None` only while sled is opened again after a write error, or if that failed.
    db: RwLock<Option<sled::Db>>,
    /// Lock order: `pending` before `db`.
    pending: Mutex<Pending>,
    /// Mirrors `pending.holding().is_some()`, so reads need no lock while all is well.
    holding: AtomicBool,
    space: Space,
    /// The generation last flushed (see [`generation`]); held across a whole flush so
    /// that flushes write their generations in order.
    generation: Mutex<u64>,
    /// The store's thread wrote sled's log out since the last durable flush: closing
    /// the store makes that durable.
    written_out: AtomicBool,
    /// Group commit: the flushes begun and ended, and the wait for one to end.
    group: Mutex<write::Group>,
    group_done: Condvar,
    /// The store had no schema version when opened: it was just created (or came back
    /// empty), and the caller may rebuild it from the running containers.
    fresh: bool,
    /// Our own lock beside sled's: sled's fails at once, with no way to tell contention
    /// from other errors, so whoever holds this one is the only one to open sled.
    _lock: Flock<File>,
}

impl Inner {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_holding(&self) -> bool {
        self.holding.load(Ordering::Acquire)
    }

    /// Runs `f` on the open sled database.
    fn with_db<R>(
        &self,
        f: impl FnOnce(&sled::Db) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let db = self.db.read().unwrap_or_else(|p| p.into_inner());
        match db.as_ref() {
            Some(db) => f(db),
            None => Err(StoreError::Closed {
                path: self.path.clone(),
            }),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let pending = self.pending.get_mut().unwrap_or_else(|p| p.into_inner());
        if pending.holding().is_some() && !pending.is_empty() {
            log::error!(
                "store: closing with {} write(s) held in memory that the full disk never took; they are lost",
                pending.len()
            );
        }
    }
}

impl Store {
    /// Opens (or creates) the store at `path` and checks its schema version.
    ///
    /// One process holds the store at a time. A short-lived holder (`holdfast pods` run
    /// while the agent starts) is waited for, up to [`LOCK_WAIT`]. On a full disk the
    /// store's headroom is given back so that sled can open; a store that still cannot
    /// is [`StoreError::NoSpace`], never a broken one.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let lock = lock(path)?;
        let space = Space::new(path);
        let db = match open_sled(path) {
            Err(StoreError::Open { source, .. }) if is_no_space(&source) => {
                let freed = space.release();
                log::warn!(
                    "store: no space to open {}; gave back its headroom ({freed} bytes)",
                    path.display()
                );
                match open_sled(path) {
                    Err(StoreError::Open { source, .. }) if is_no_space(&source) => {
                        return Err(StoreError::NoSpace {
                            path: path.to_path_buf(),
                        })
                    }
                    other => other?,
                }
            }
            other => other?,
        };
        let fresh = check_schema(&db, path)?;
        let flushed = generation::check(&db, path)?;
        space.top_up();
        let inner = Arc::new(Inner {
            path: path.to_path_buf(),
            db: RwLock::new(Some(db)),
            pending: Mutex::new(Pending::default()),
            holding: AtomicBool::new(false),
            space,
            generation: Mutex::new(flushed),
            written_out: AtomicBool::new(false),
            group: Mutex::new(write::Group::default()),
            group_done: Condvar::new(),
            fresh,
            _lock: lock,
        });
        let flusher = Arc::new(Flusher::start(inner.clone()));
        Ok(Store {
            inner,
            _flusher: flusher,
        })
    }

    /// sled's settings, for a device with 256 MiB of RAM and flash that wears. sled's
    /// own flusher is off: the store's thread flushes, so it knows what is durable.
    fn config(path: &Path) -> sled::Config {
        sled::Config::new()
            .path(path)
            .cache_capacity(CACHE_BYTES)
            .mode(sled::Mode::LowSpace)
            .flush_every_ms(None)
    }

    /// Whether the store had no schema version when opened (new or emptied).
    pub fn is_fresh(&self) -> bool {
        self.inner.fresh
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.inner.pending()
    }

    fn is_holding(&self) -> bool {
        self.inner.is_holding()
    }

    /// Runs `f` on the open sled database.
    fn with_db<R>(
        &self,
        f: impl FnOnce(&sled::Db) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.inner.with_db(f)
    }

    /// Runs `f` on sled's tree `name`.
    fn with_tree<R>(
        &self,
        name: &'static str,
        f: impl FnOnce(&sled::Tree) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.with_db(|db| {
            let tree = db.open_tree(name).map_err(|source| StoreError::Db {
                op: "open tree",
                tree: name,
                key: String::new(),
                source,
            })?;
            f(&tree)
        })
    }

    /// The stored bytes of `tree`/`key`, writes held in memory included.
    fn get_raw(&self, tree: &'static str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if self.is_holding() {
            if let Some(v) = self.pending().lookup(tree, key) {
                return Ok(v.map(<[u8]>::to_vec));
            }
        }
        self.with_tree(tree, |t| {
            t.get(key)
                .map(|v| v.map(|v| v.to_vec()))
                .map_err(|source| StoreError::Db {
                    op: "get",
                    tree,
                    key: key.to_string(),
                    source,
                })
        })
    }

    /// The records of `tree` whose key starts with `prefix`, in key order, writes held
    /// in memory included.
    fn scan_raw(
        &self,
        tree: &'static str,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let stored = self.with_tree(tree, |t| {
            let mut out = Vec::new();
            for item in t.scan_prefix(prefix) {
                let (k, v) = item.map_err(|source| StoreError::Db {
                    op: "scan",
                    tree,
                    key: prefix.to_string(),
                    source,
                })?;
                out.push((String::from_utf8_lossy(&k).into_owned(), v.to_vec()));
            }
            Ok(out)
        })?;
        if !self.is_holding() {
            return Ok(stored);
        }
        let pending = self.pending();
        Ok(pending::overlay(stored, pending.in_tree(tree, prefix)))
    }

    /// A typed tree. `name` is fixed at compile time: the set of trees is the schema.
    pub fn tree<T>(&self, name: &'static str) -> Result<Tree<T>, StoreError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        // Opening it now makes it exist, and a closed store an error here.
        self.with_tree(name, |_| Ok(()))?;
        Ok(Tree::new(name, self.clone()))
    }

    /// Where the store lives on disk.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Every tree name but sled's default tree.
    fn tree_names(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        self.with_db(|db| {
            Ok(db
                .tree_names()
                .into_iter()
                .map(|n| n.to_vec())
                .filter(|n| n.as_slice() != b"__sled__default")
                .collect())
        })
    }

    /// Bytes of keys and values in every tree: what a compacted store needs, roughly.
    pub fn live_bytes(&self) -> Result<u64, StoreError> {
        let mut total = 0u64;
        for name in self.tree_names()? {
            total += self.with_db(|db| {
                let tree = db.open_tree(&name).map_err(|source| StoreError::Db {
                    op: "open tree",
                    tree: "*",
                    key: String::from_utf8_lossy(&name).into_owned(),
                    source,
                })?;
                let mut bytes = 0u64;
                for item in tree.iter() {
                    let (k, v) = item.map_err(|source| StoreError::Db {
                        op: "iterate",
                        tree: "*",
                        key: String::new(),
                        source,
                    })?;
                    bytes += (k.len() + v.len()) as u64;
                }
                Ok(bytes)
            })?;
        }
        Ok(total)
    }

    /// Bytes the store takes on disk (its headroom not counted).
    pub fn disk_bytes(&self) -> u64 {
        dir_size(&self.inner.path)
    }

    /// Whether the store is so much larger than what it holds that compacting it at
    /// start is worth the writes: above [`COMPACT_MIN_BYTES`] and more than
    /// [`COMPACT_RATIO`] times its live data, with room on the disk for the copy.
    pub fn needs_compaction(&self) -> Result<bool, StoreError> {
        let disk = self.disk_bytes();
        let room = space::free_bytes(&self.inner.path).unwrap_or(0) > 2 * disk + space::HEADROOM;
        Ok(room && disk > COMPACT_MIN_BYTES && disk > COMPACT_RATIO * self.live_bytes()?.max(1))
    }
}

#[cfg(test)]
impl Store {
    /// Writes raw bytes, as a damaged or foreign record would be.
    pub(crate) fn put_raw(
        &self,
        tree: &'static str,
        key: &str,
        bytes: &[u8],
    ) -> Result<usize, StoreError> {
        self.write(vec![pending::Op {
            tree,
            key: key.to_string(),
            value: Some(bytes.to_vec()),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collecting_garbage_runs_what_this_thread_deferred() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        // As sled defers the drop of what a write replaced: one deferred function in this
        // thread's bag, far from full, which nothing else would ever run.
        crossbeam_epoch::pin().defer(move || flag.store(true, Ordering::SeqCst));
        // Other tests' threads may hold the epoch for a moment: poll with a deadline.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !ran.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            collect_garbage();
            std::thread::yield_now();
        }
        assert!(
            ran.load(Ordering::SeqCst),
            "the deferred function never ran"
        );
    }

    #[test]
    fn refuses_a_newer_schema() {
        let tmp = crate::testutil::TempDir::new("store");
        let dir = tmp.0.join("db");
        {
            let store = Store::open(&dir).expect("open");
            store
                .put_raw("meta", META_SCHEMA, &(SCHEMA_VERSION + 1).to_be_bytes())
                .expect("insert");
            store.flush().expect("flush");
        }
        match Store::open(&dir) {
            Err(StoreError::TooNew { found, .. }) => assert_eq!(found, SCHEMA_VERSION + 1),
            Err(other) => panic!("wrong error: {other}"),
            Ok(_) => panic!("a newer store was opened"),
        }
    }

    #[test]
    fn a_store_behind_its_generation_file_is_refused_and_moved_aside() {
        let tmp = crate::testutil::TempDir::new("store");
        let dir = tmp.0.join("db");
        let saved = tmp.0.join("saved");
        std::fs::create_dir_all(&saved).expect("saved dir");
        {
            let store = Store::open(&dir).expect("open");
            let t: Tree<u32> = store.tree("pods").expect("tree");
            t.put("a", &1).expect("put");
            store.flush().expect("flush");
        }
        for f in ["db", "conf"] {
            std::fs::copy(dir.join(f), saved.join(f)).expect("save");
        }
        {
            let store = Store::open(&dir).expect("reopen");
            let t: Tree<u32> = store.tree("pods").expect("tree");
            t.remove("a").expect("remove");
            store.flush().expect("flush");
        }
        // What sled's recovery leaves when its newest entries are damaged.
        for f in ["db", "conf"] {
            std::fs::copy(saved.join(f), dir.join(f)).expect("restore");
        }
        match Store::open(&dir) {
            Err(StoreError::WentBack { store, file, .. }) => assert!(store < file),
            Err(other) => panic!("wrong error: {other}"),
            Ok(_) => panic!("a store that went back in time was opened"),
        }
        let opened = recover::open_or_recover_with(&dir, None).expect("recovered");
        let moved = opened.moved.expect("moved aside");
        assert!(
            moved.reason.contains("went back in time"),
            "{}",
            moved.reason
        );
        assert!(opened.store.is_fresh());
        let t: Tree<u32> = opened.store.tree("pods").expect("tree");
        assert_eq!(
            t.get("a").expect("get"),
            None,
            "the stale record is not believed"
        );
    }

    #[test]
    fn a_store_without_its_generation_file_opens_and_starts_one() {
        let tmp = crate::testutil::TempDir::new("store");
        let dir = tmp.0.join("db");
        {
            let store = Store::open(&dir).expect("open");
            store.put_raw("n", "a", b"1").expect("put");
            store.flush().expect("flush");
        }
        std::fs::remove_file(dir.join(generation::FILE)).expect("remove");
        drop(Store::open(&dir).expect("opens without the file"));
        assert!(
            dir.join(generation::FILE).exists(),
            "the file is written again"
        );
        drop(Store::open(&dir).expect("opens with it"));
    }

    /// Prints what the generation file costs a flush (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn generation_file_cost() {
        let tmp = crate::testutil::TempDir::new("store");
        let dir = tmp.0.join("db");
        let store = Store::open(&dir).expect("open");
        let n = 200u32;
        let t0 = std::time::Instant::now();
        for i in 0..n {
            store.put_raw("n", "k", &i.to_be_bytes()).expect("put");
            store.flush().expect("flush");
        }
        let flush = t0.elapsed() / n;
        let t0 = std::time::Instant::now();
        for i in 0..n {
            generation::write_file(&dir, u64::from(i)).expect("write");
        }
        let file = t0.elapsed() / n;
        println!("flush with generation file: {flush:?}; the file alone: {file:?}");
    }

    #[test]
    fn typed_round_trip_survives_reopen() {
        let tmp = crate::testutil::TempDir::new("store");
        let dir = tmp.0.join("db");
        {
            let store = Store::open(&dir).expect("open");
            let t: Tree<Vec<u32>> = store.tree("numbers").expect("tree");
            t.put("a", &vec![1, 2, 3]).expect("put");
            t.put("b", &vec![4]).expect("put");
            t.remove("b").expect("remove");
            store.flush().expect("flush");
        }
        let store = Store::open(&dir).expect("reopen");
        let t: Tree<Vec<u32>> = store.tree("numbers").expect("tree");
        assert_eq!(t.get("a").expect("get"), Some(vec![1, 2, 3]));
        assert_eq!(t.get("b").expect("get"), None);
        assert_eq!(t.keys().expect("keys"), vec!["a".to_string()]);
    }
}
