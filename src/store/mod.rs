//! store: the sled database. Sync only; never imports tokio.
//!
//! Every fact the agent needs after a restart lives here, in typed trees whose values
//! are JSON. Writes happen on state change only; callers that need a change to survive
//! a power cut call [`Store::flush`].

mod batch;
pub mod compact;
pub mod recover;
mod tree;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

pub use batch::Batch;
pub use tree::Tree;

/// Bumped when the layout of a tree changes; a store written by a newer holdfast is
/// refused rather than misread.
pub const SCHEMA_VERSION: u32 = 1;

const META_SCHEMA: &str = "schema_version";

/// sled's page cache: small, for a device with 256 MiB of RAM.
const CACHE_BYTES: u64 = 4 * 1024 * 1024;

/// Below this, a store is never compacted at start: sled's own floor is a few MiB.
pub const COMPACT_MIN_BYTES: u64 = 16 * 1024 * 1024;
/// Disk bytes per live byte above which the agent compacts at start.
pub const COMPACT_RATIO: u64 = 8;

/// Bytes of the regular files under `dir` (sled's files), 0 when unreadable.
pub fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => total += dir_size(&e.path()),
            Ok(m) => total += m.len(),
            Err(_) => {}
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
        matches!(
            self,
            StoreError::Open { .. }
                | StoreError::Panicked { .. }
                | StoreError::BadSchema { .. }
                | StoreError::NoSchema { .. }
        )
    }
}

/// The agent's database. Cheap to clone: sled handles are reference counted.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    path: PathBuf,
    /// The store had no schema version when opened: it was just created (or came back
    /// empty), and the caller may rebuild it from the running containers.
    fresh: bool,
    /// Our own lock beside sled's: sled's fails at once, with no way to tell contention
    /// from other errors, so whoever holds this one is the only one to open sled.
    _lock: Arc<Flock<File>>,
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

impl Store {
    /// Opens (or creates) the store at `path` and checks its schema version.
    ///
    /// One process holds the store at a time. A short-lived holder (`holdfast pods` run
    /// while the agent starts) is waited for, up to [`LOCK_WAIT`].
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let lock = Arc::new(lock(path)?);
        // Holding our lock, contention on sled's own can only be an earlier handle in
        // this process whose flusher thread has not let go yet: wait for it.
        let deadline = Instant::now() + LOCK_WAIT;
        let db = loop {
            // sled panics on some damaged files; a panic here must become an error
            // the caller can act on (move the store aside), not a dead agent.
            let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Self::config(path).open()
            }))
            .map_err(|panic| StoreError::Panicked {
                path: path.to_path_buf(),
                message: panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into()),
            })?;
            match opened {
                Ok(db) => break db,
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
        };
        let mut store = Store {
            db,
            path: path.to_path_buf(),
            fresh: false,
            _lock: lock,
        };
        store.fresh = store.check_schema()?;
        Ok(store)
    }

    /// sled's settings, for a device with 256 MiB of RAM and flash that wears.
    fn config(path: &Path) -> sled::Config {
        sled::Config::new()
            .path(path)
            .cache_capacity(CACHE_BYTES)
            .mode(sled::Mode::LowSpace)
            // sled's flusher writes only when something is dirty; a second keeps
            // bursts of changes in one write without losing more than that on a cut.
            .flush_every_ms(Some(1000))
    }

    /// Whether the store had no schema version when opened (new or emptied).
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// Checks the schema version; returns true when there was none (a new store).
    fn check_schema(&self) -> Result<bool, StoreError> {
        let meta = self.raw_tree("meta")?;
        let key = META_SCHEMA;
        let found = meta.get(key).map_err(|source| StoreError::Db {
            op: "get",
            tree: "meta",
            key: key.into(),
            source,
        })?;
        match found {
            None => {
                // Records without a schema: not a store we wrote. Refuse to guess.
                for name in self.db.tree_names() {
                    if name.as_ref() == b"meta" || name.as_ref() == b"__sled__default" {
                        continue;
                    }
                    let tree = self.db.open_tree(&name).map_err(|source| StoreError::Db {
                        op: "open tree",
                        tree: "*",
                        key: String::from_utf8_lossy(&name).into_owned(),
                        source,
                    })?;
                    if !tree.is_empty() {
                        return Err(StoreError::NoSchema {
                            path: self.path.clone(),
                        });
                    }
                }
                meta.insert(key, &SCHEMA_VERSION.to_be_bytes())
                    .map_err(|source| StoreError::Db {
                        op: "insert",
                        tree: "meta",
                        key: key.into(),
                        source,
                    })?;
                Ok(true)
            }
            Some(bytes) => {
                let raw: [u8; 4] =
                    bytes
                        .as_ref()
                        .try_into()
                        .map_err(|_| StoreError::BadSchema {
                            path: self.path.clone(),
                        })?;
                let found = u32::from_be_bytes(raw);
                if found == 0 {
                    return Err(StoreError::BadSchema {
                        path: self.path.clone(),
                    });
                }
                if found > SCHEMA_VERSION {
                    return Err(StoreError::TooNew {
                        path: self.path.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
                Ok(false)
            }
        }
    }

    fn raw_tree(&self, name: &'static str) -> Result<sled::Tree, StoreError> {
        self.db.open_tree(name).map_err(|source| StoreError::Db {
            op: "open tree",
            tree: name,
            key: String::new(),
            source,
        })
    }

    /// A typed tree. `name` is fixed at compile time: the set of trees is the schema.
    pub fn tree<T>(&self, name: &'static str) -> Result<Tree<T>, StoreError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        Ok(Tree::new(name, self.raw_tree(name)?))
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db
            .flush()
            .map(|_| ())
            .map_err(|source| StoreError::Db {
                op: "flush",
                tree: "*",
                key: String::new(),
                source,
            })
    }

    /// Where the store lives on disk.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of keys and values in every tree: what a compacted store needs, roughly.
    pub fn live_bytes(&self) -> Result<u64, StoreError> {
        let mut total = 0u64;
        for name in self.db.tree_names() {
            let tree = self.db.open_tree(&name).map_err(|source| StoreError::Db {
                op: "open tree",
                tree: "*",
                key: String::from_utf8_lossy(&name).into_owned(),
                source,
            })?;
            for item in tree.iter() {
                let (k, v) = item.map_err(|source| StoreError::Db {
                    op: "iterate",
                    tree: "*",
                    key: String::new(),
                    source,
                })?;
                total += (k.len() + v.len()) as u64;
            }
        }
        Ok(total)
    }

    /// Bytes the store takes on disk.
    pub fn disk_bytes(&self) -> u64 {
        dir_size(&self.path)
    }

    /// Whether the store is so much larger than what it holds that compacting it at
    /// start is worth the writes: above [`COMPACT_MIN_BYTES`] and more than
    /// [`COMPACT_RATIO`] times its live data.
    pub fn needs_compaction(&self) -> Result<bool, StoreError> {
        let disk = self.disk_bytes();
        Ok(disk > COMPACT_MIN_BYTES && disk > COMPACT_RATIO * self.live_bytes()?.max(1))
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
            let meta = store.raw_tree("meta").expect("meta");
            meta.insert(META_SCHEMA, &(SCHEMA_VERSION + 1).to_be_bytes())
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
