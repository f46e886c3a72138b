//! Opening sled: our lock beside sled's, sled's own quirks at open (a panic on damaged
//! files, an unfinished snapshot it would read as corruption), and the schema check.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::{Store, StoreError, LOCK_WAIT, META_SCHEMA, SCHEMA_VERSION};

/// Takes `<path>/holdfast.lock`, waiting up to [`LOCK_WAIT`] for a short-lived holder.
pub(super) fn lock(path: &Path) -> Result<Flock<File>, StoreError> {
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
pub(super) fn open_sled(path: &Path) -> Result<sled::Db, StoreError> {
    remove_unfinished_snapshots(path);
    fault_injection(path);
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

/// Debug builds only: panics, outside any `catch_unwind`, as a release build's sled
/// would on a damaged file (`panic = "abort"`), while the file named by
/// `HOLDFAST_TEST_SLED_PANIC_IF` is in the store's directory. No file sled 0.34 reads
/// at open was found to make it panic, so the tests of that path use this.
fn fault_injection(path: &Path) {
    if !cfg!(debug_assertions) {
        return;
    }
    if let Some(name) = std::env::var_os("HOLDFAST_TEST_SLED_PANIC_IF") {
        if path.join(&name).exists() {
            panic!("injected: sled panicked opening {}", path.display());
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

/// Checks the schema version; returns true when there was none (a new store).
pub(super) fn check_schema(db: &sled::Db, path: &Path) -> Result<bool, StoreError> {
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
