//! store: the sled database. Sync only; never imports tokio.
//!
//! Every fact the agent needs after a restart lives here, in typed trees whose values
//! are JSON. Writes happen on state change only; callers that need a change to survive
//! a power cut call [`Store::flush`]. A thread of the store's own flushes what is still
//! only in memory once a second.
//!
//! A full disk loses nothing: sled keeps [`space::HEADROOM`] bytes allocated for
//! itself, and when even that is gone, writes are held in memory (newest per key) and
//! read back from there, then written in one transaction once the disk has room again
//! (see [`pending`] and [`space`]).

mod batch;
pub mod compact;
mod pending;
pub mod recover;
pub mod space;
mod tree;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

pub use batch::Batch;
pub use pending::Holding;
pub use tree::Tree;

use pending::{Op, Pending};
use space::Space;

/// Bumped when the layout of a tree changes; a store written by a newer holdfast is
/// refused rather than misread.
pub const SCHEMA_VERSION: u32 = 1;

const META_SCHEMA: &str = "schema_version";

/// sled's page cache: small, for a device with 256 MiB of RAM.
const CACHE_BYTES: u64 = 4 * 1024 * 1024;

/// How often the store's thread flushes what sled holds only in memory: a second keeps
/// bursts of changes in one write without losing more than that on a power cut.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Below this, a store is never compacted at start: sled's own floor is a few MiB.
pub const COMPACT_MIN_BYTES: u64 = 16 * 1024 * 1024;
/// Disk bytes per live byte above which the agent compacts at start.
pub const COMPACT_RATIO: u64 = 8;

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
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("open store at {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    #[error("store at {path} has schema version {found}, newer than this holdfast understands ({supported}); upgrade holdfast or move the store away")]
    TooNew {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("store at {path} is held by another process (is another holdfast running?)")]
    Busy { path: PathBuf },
    #[error("lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store at {path} has an unreadable schema version")]
    BadSchema { path: PathBuf },
    #[error("store at {path} holds records but no schema version")]
    NoSchema { path: PathBuf },
    #[error("open store at {path}: no space left on its filesystem, even with the store's own headroom given back; free some space")]
    NoSpace { path: PathBuf },
    #[error("store at {path} is closed: opening it again after a write error failed; it is tried again every second")]
    Closed { path: PathBuf },
    #[error("open store at {path}: sled panicked: {message}")]
    Panicked { path: PathBuf, message: String },
    #[error("compact store at {path}")]
    Compact {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("move the broken store at {path} to {to}")]
    MoveAside {
        path: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store {op} in tree {tree} key {key}")]
    Db {
        op: &'static str,
        tree: &'static str,
        key: String,
        #[source]
        source: sled::Error,
    },
    #[error("decode {tree} record {key}")]
    Decode {
        tree: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("encode {tree} record {key}")]
    Encode {
        tree: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

impl StoreError {
    /// Whether the store itself is unreadable (rather than busy, too new or out of
    /// reach): the case for moving it aside and starting afresh.
    pub fn is_broken_store(&self) -> bool {
        match self {
            // A full disk breaks nothing: the store is fine once there is room.
            StoreError::Open { source, .. } => !is_no_space(source),
            StoreError::Panicked { .. }
            | StoreError::BadSchema { .. }
            | StoreError::NoSchema { .. } => true,
            _ => false,
        }
    }
}

/// Whether sled failed because the filesystem is full.
fn is_no_space(e: &sled::Error) -> bool {
    match e {
        sled::Error::Io(io) => {
            io.kind() == std::io::ErrorKind::StorageFull
                || io.raw_os_error() == Some(Errno::ENOSPC as i32)
                || io.to_string().contains("No space left")
        }
        _ => false,
    }
}

/// The agent's database. Cheap to clone: every clone is the same store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
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
    /// The store had no schema version when opened: it was just created (or came back
    /// empty), and the caller may rebuild it from the running containers.
    fresh: bool,
    /// Our own lock beside sled's: sled's fails at once, with no way to tell contention
    /// from other errors, so whoever holds this one is the only one to open sled.
    _lock: Flock<File>,
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

/// Takes `<path>/holdfast.lock`, waiting up to [`LOCK_WAIT`] for a short-lived holder.
fn lock(path: &Path) -> Result<Flock<File>, StoreError> {
    let lock_path = path.join("holdfast.lock");
    let io = |source| StoreError::Lock {
        path: lock_path.clone(),
        source,
    };
    std::fs::create_dir_all(path).map_err(io)?;
    // The store holds cached Secrets: nobody but the agent reads it.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((_, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(StoreError::Busy {
                    path: path.to_path_buf(),
                })
            }
            Err((_, e)) => return Err(io(std::io::Error::from(e))),
        }
    }
}

/// Opens sled at `path`, which our lock already guards. A panic inside sled becomes an
/// error, and contention on sled's own lock (an earlier handle in this process whose
/// threads have not let go yet) is waited for.
fn open_sled(path: &Path) -> Result<sled::Db, StoreError> {
    remove_unfinished_snapshots(path);
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        // sled panics on some damaged files; a panic here must become an error the
        // caller can act on (move the store aside), not a dead agent.
        let opened =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Store::config(path).open()))
                .map_err(|panic| StoreError::Panicked {
                path: path.to_path_buf(),
                message: panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into()),
            })?;
        match opened {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(source) => {
                return Err(StoreError::Open {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
}

/// sled writes a snapshot as `snap.<lsn>.generating` and renames it when complete, but
/// reads the newest `snap.*` file whatever its name: one cut short (a power cut, a full
/// disk) would make the store look corrupt. Such a file is never needed.
fn remove_unfinished_snapshots(path: &Path) {
    for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            match std::fs::remove_file(e.path()) {
                Ok(()) => log::warn!("store: removed an unfinished sled snapshot {name}"),
                Err(err) => log::error!("store: remove unfinished snapshot {name}: {err}"),
            }
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
        space.top_up();
        let inner = Arc::new(Inner {
            path: path.to_path_buf(),
            db: RwLock::new(Some(db)),
            pending: Mutex::new(Pending::default()),
            holding: AtomicBool::new(false),
            space,
            fresh,
            _lock: lock,
        });
        spawn_flusher(Arc::downgrade(&inner));
        Ok(Store { inner })
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
        self.inner.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_holding(&self) -> bool {
        self.inner.holding.load(Ordering::Acquire)
    }

    /// Runs `f` on the open sled database.
    fn with_db<R>(
        &self,
        f: impl FnOnce(&sled::Db) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let db = self.inner.db.read().unwrap_or_else(|p| p.into_inner());
        match db.as_ref() {
            Some(db) => f(db),
            None => Err(StoreError::Closed {
                path: self.inner.path.clone(),
            }),
        }
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

    /// The one way anything is written. `ops` are changes (the callers left out what
    /// would change nothing); they go to sled in one transaction, or, while the disk has
    /// no room for sled, into memory to be written when it has.
    fn write(&self, ops: Vec<Op>) -> Result<usize, StoreError> {
        if ops.is_empty() {
            return Ok(0);
        }
        let n = ops.len();
        let mut pending = self.pending();
        if pending.holding().is_none() {
            if !self.inner.space.writable() {
                self.start_holding(
                    &mut pending,
                    "no space left on the store's filesystem".into(),
                    false,
                );
            } else {
                match self.with_db(|db| commit(db, &ops)) {
                    Ok(()) => {
                        pending.record(&ops);
                        return Ok(n);
                    }
                    Err(StoreError::Db { source, .. }) if matches!(source, sled::Error::Io(_)) => {
                        let reason = format!("sled could not write: {source}");
                        self.start_holding(&mut pending, reason, true);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        pending.record(&ops);
        Ok(n)
    }

    fn start_holding(&self, pending: &mut Pending, reason: String, sled_failed: bool) {
        pending.sled_failed |= sled_failed;
        if pending.hold(reason.clone(), crate::time::now()) {
            self.inner.holding.store(true, Ordering::Release);
            log::error!(
                "store: {reason}; keeping writes in memory until {} has room again (running pods are not affected)",
                self.inner.path.display()
            );
        }
    }

    /// Makes every write so far durable. While the disk is full the writes stay held
    /// in memory instead, to be written as soon as it has room ([`Store::holding`]
    /// says since when).
    pub fn flush(&self) -> Result<(), StoreError> {
        if self.is_holding() {
            return Ok(());
        }
        let mark = self.pending().mark();
        match self.with_db(|db| {
            db.flush().map(|_| ()).map_err(|source| StoreError::Db {
                op: "flush",
                tree: "*",
                key: String::new(),
                source,
            })
        }) {
            Ok(()) => {
                self.pending().durable_below(mark);
                Ok(())
            }
            Err(StoreError::Db { source, .. }) if matches!(source, sled::Error::Io(_)) => {
                let reason = format!("sled could not flush: {source}");
                let mut pending = self.pending();
                self.start_holding(&mut pending, reason, true);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Since when and why writes are held in memory (the disk is full), and how many.
    pub fn holding(&self) -> Option<(Holding, usize)> {
        if !self.is_holding() {
            return None;
        }
        let pending = self.pending();
        pending.holding().map(|h| (h.clone(), pending.len()))
    }

    /// One tick of the store's thread: flush what sled holds only in memory, keep the
    /// headroom, and, while holding, write what is held once the disk has room.
    fn tick(&self) {
        if self.is_holding() {
            self.resume();
            return;
        }
        if !self.pending().is_empty() {
            if let Err(e) = self.flush() {
                log::error!("store: flush: {e}");
            }
        }
        self.inner.space.top_up();
    }

    /// Writes what is held, if the disk has room again for it and for the headroom.
    fn resume(&self) {
        let free = space::free_bytes(&self.inner.path).unwrap_or(0);
        if free < space::MIN_FREE + space::HEADROOM / 2 {
            return;
        }
        // Dropping sled to open it again is only worth it once it can write: if opening
        // failed, even reads would fail until it worked.
        if !self.inner.space.probe() {
            return;
        }
        let mut pending = self.pending();
        if pending.sled_failed {
            // sled refuses every write after a failed one until it is opened again;
            // what it had not made durable is replayed from `pending` below.
            let mut db = self.inner.db.write().unwrap_or_else(|p| p.into_inner());
            drop(db.take());
            match open_sled(&self.inner.path) {
                Ok(fresh) => *db = Some(fresh),
                Err(e) => {
                    log::error!("store: open again after a write error: {e}");
                    return;
                }
            }
            pending.sled_failed = false;
        }
        if self.inner.space.top_up() < space::MIN_TAIL {
            return;
        }
        let ops = pending.all();
        let n = ops.len();
        let written = self.with_db(|db| {
            commit(db, &ops)?;
            db.flush().map(|_| ()).map_err(|source| StoreError::Db {
                op: "flush",
                tree: "*",
                key: String::new(),
                source,
            })
        });
        match written {
            Ok(()) => {
                let since = pending.holding().map(|h| h.since);
                pending.clear();
                self.inner.holding.store(false, Ordering::Release);
                log::warn!(
                    "store: {} has room again; wrote the {n} record(s) held in memory{}",
                    self.inner.path.display(),
                    since.map(|s| format!(" since {s}")).unwrap_or_default()
                );
            }
            Err(e) => {
                if let StoreError::Db {
                    source: sled::Error::Io(_),
                    ..
                } = &e
                {
                    pending.sled_failed = true;
                }
                log::warn!("store: writing what is held failed, trying again: {e}");
            }
        }
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
        self.write(vec![Op {
            tree,
            key: key.to_string(),
            value: Some(bytes.to_vec()),
        }])
    }
}

/// Applies `ops` to sled as one transaction (a single op needs none).
fn commit(db: &sled::Db, ops: &[Op]) -> Result<(), StoreError> {
    crate::metrics::STORE_BYTES_WRITTEN.add(
        ops.iter()
            .map(|o| (o.key.len() + o.value.as_ref().map_or(0, Vec::len)) as u64)
            .sum(),
    );
    let db_err = |op: &'static str, o: &Op| {
        let (tree, key) = (o.tree, o.key.clone());
        move |source| StoreError::Db {
            op,
            tree,
            key,
            source,
        }
    };
    if let [op] = ops {
        let tree = db.open_tree(op.tree).map_err(db_err("open tree", op))?;
        return match &op.value {
            Some(v) => tree.insert(&op.key, v.as_slice()).map(|_| ()),
            None => tree.remove(&op.key).map(|_| ()),
        }
        .map_err(db_err("write", op));
    }
    // One transactional view per distinct tree; ops point at their view.
    let mut names: Vec<&'static str> = Vec::new();
    let mut index = Vec::with_capacity(ops.len());
    for op in ops {
        let at = match names.iter().position(|n| *n == op.tree) {
            Some(at) => at,
            None => {
                names.push(op.tree);
                names.len() - 1
            }
        };
        index.push(at);
    }
    let mut trees = Vec::with_capacity(names.len());
    for (name, op) in names.iter().zip(ops) {
        trees.push(db.open_tree(name).map_err(db_err("open tree", op))?);
    }
    let refs: Vec<&sled::Tree> = trees.iter().collect();
    let result = refs.as_slice().transaction(|views| {
        for (op, &at) in ops.iter().zip(&index) {
            let view = &views[at];
            match &op.value {
                Some(v) => {
                    view.insert(op.key.as_bytes(), v.as_slice())?;
                }
                None => {
                    view.remove(op.key.as_bytes())?;
                }
            }
        }
        Ok::<(), ConflictableTransactionError<()>>(())
    });
    match result {
        Ok(()) => Ok(()),
        Err(TransactionError::Storage(source)) => Err(db_err("transaction", &ops[0])(source)),
        Err(TransactionError::Abort(())) => Err(db_err("transaction", &ops[0])(
            sled::Error::Unsupported("transaction aborted".into()),
        )),
    }
}

/// The store's thread: a tick a second while the store is open.
fn spawn_flusher(inner: Weak<Inner>) {
    let spawned = std::thread::Builder::new()
        .name("store-flush".into())
        .spawn(move || loop {
            std::thread::sleep(FLUSH_EVERY);
            let Some(inner) = inner.upgrade() else {
                return;
            };
            Store { inner }.tick();
        });
    if let Err(e) = spawned {
        // Writes still become durable at every explicit flush.
        log::error!("store: start the flush thread: {e}");
    }
}

/// Checks the schema version; returns true when there was none (a new store).
fn check_schema(db: &sled::Db, path: &Path) -> Result<bool, StoreError> {
    let db_err = |op: &'static str, key: String| {
        move |source| StoreError::Db {
            op,
            tree: "meta",
            key,
            source,
        }
    };
    let meta = db
        .open_tree("meta")
        .map_err(db_err("open tree", String::new()))?;
    let key = META_SCHEMA;
    match meta.get(key).map_err(db_err("get", key.into()))? {
        None => {
            // Records without a schema: not a store we wrote. Refuse to guess.
            for name in db.tree_names() {
                if name.as_ref() == b"meta" || name.as_ref() == b"__sled__default" {
                    continue;
                }
                let tree = db.open_tree(&name).map_err(db_err(
                    "open tree",
                    String::from_utf8_lossy(&name).into_owned(),
                ))?;
                if !tree.is_empty() {
                    return Err(StoreError::NoSchema {
                        path: path.to_path_buf(),
                    });
                }
            }
            meta.insert(key, &SCHEMA_VERSION.to_be_bytes())
                .map_err(db_err("insert", key.into()))?;
            Ok(true)
        }
        Some(bytes) => {
            let raw: [u8; 4] = bytes
                .as_ref()
                .try_into()
                .map_err(|_| StoreError::BadSchema {
                    path: path.to_path_buf(),
                })?;
            let found = u32::from_be_bytes(raw);
            if found == 0 {
                return Err(StoreError::BadSchema {
                    path: path.to_path_buf(),
                });
            }
            if found > SCHEMA_VERSION {
                return Err(StoreError::TooNew {
                    path: path.to_path_buf(),
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
