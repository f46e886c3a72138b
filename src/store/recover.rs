//! Opening the agent's store whatever state a power cut left it in: a store that will
//! not open is moved aside (never deleted) and a fresh one takes its place; records
//! that no longer decode are moved into the `quarantine` tree.
//!
//! sled is opened first in a child process (`holdfast store probe`), so a panic inside
//! it, which `panic = "abort"` makes uncatchable, moves the store aside too. A store
//! that went back in time (see [`super::generation`]) is moved aside as well: which of
//! its records are stale cannot be told, so none is believed.
//!
//! The caller rebuilds a fresh store from what the running containers tell (their
//! spec annotations) and from the pod sources; the image index is rebuilt from the
//! content store (see `image::store`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

use super::pending::Op;
use super::{Store, StoreError};

/// Tree holding records that did not decode, keyed `<tree>/<key>`, for inspection.
pub const QUARANTINE: &str = "quarantine";

/// Beside the store dir: a line per store moved aside. `holdfast pods` shows it until
/// someone removes it.
pub const MOVED_MARKER: &str = "store-moved-aside";

/// What [`open_or_recover`] found.
pub struct Opened {
    pub store: Store,
    /// Set when the old store was moved aside: where to, and why.
    pub moved: Option<Moved>,
}

#[derive(Debug, Clone)]
pub struct Moved {
    pub to: PathBuf,
    pub reason: String,
}

/// Written by the panic hook when sled panics while opening the store. With
/// `panic = "abort"` (release builds) the panic cannot be caught, so the next start
/// reads this instead. A SIGKILL or power cut during the open leaves nothing: only a
/// real failure of sled moves the store aside.
fn panicked_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".open-panicked");
    path.with_file_name(name)
}

/// The thread opening the store and where its panic would be recorded.
static OPENING: Mutex<Option<(std::thread::ThreadId, PathBuf)>> = Mutex::new(None);

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // try_lock: a panic while the lock is held must not deadlock the hook.
            if let Ok(guard) = OPENING.try_lock() {
                if let Some((thread, marker)) = guard.as_ref() {
                    if *thread == std::thread::current().id() {
                        let _ = std::fs::write(marker, info.to_string());
                    }
                }
            }
            previous(info)
        }));
    });
}

/// Opens the store with a panic inside sled recorded for the next start.
fn open_watched(path: &Path) -> Result<Store, StoreError> {
    install_panic_hook();
    let marker = panicked_path(path);
    if let Ok(mut g) = OPENING.lock() {
        *g = Some((std::thread::current().id(), marker.clone()));
    }
    let opened = Store::open(path);
    if let Ok(mut g) = OPENING.lock() {
        *g = None;
    }
    if opened.is_ok() {
        let _ = std::fs::remove_file(&marker);
    }
    opened
}

fn marker_path(path: &Path) -> PathBuf {
    path.with_file_name(MOVED_MARKER)
}

/// Opens the store at `path`; if it cannot be opened (sled error or panic, also one
/// recorded by the last start, an unreadable schema), moves it to
/// `<path>.broken-<RFC 3339 time>`, records that beside it and opens a fresh one.
/// A store written by a newer holdfast, or one held by another process, is an error:
/// moving those aside would lose good data.
///
/// sled is first opened in a process of its own (`holdfast store probe`, this same
/// binary): with `panic = "abort"` a panic inside sled cannot be caught, and would
/// take the agent down at every start instead of moving the store aside.
pub fn open_or_recover(path: &Path) -> Result<Opened, StoreError> {
    open_or_recover_with(path, Some(Path::new(SELF_EXE)))
}

/// This binary, even when its file was replaced since it started.
const SELF_EXE: &str = "/proc/self/exe";

/// [`open_or_recover`], with sled opened first by `probe` (`<probe> store probe <path>`)
/// when given.
pub fn open_or_recover_with(path: &Path, probe: Option<&Path>) -> Result<Opened, StoreError> {
    super::compact::recover_interrupted(path)?;
    let panicked = panicked_path(path);
    let failure = match std::fs::read_to_string(&panicked) {
        Ok(message) if path.exists() => format!(
            "sled panicked while opening it last time: {}",
            message.trim()
        ),
        _ => match probe.and_then(|exe| probe_in_child(exe, path)) {
            Some(reason) => reason,
            None => match open_watched(path) {
                Ok(store) => return Ok(Opened { store, moved: None }),
                Err(e) if e.is_broken_store() => error_chain(&e),
                Err(e) => return Err(e),
            },
        },
    };
    let reason = failure;
    let to = move_aside(path)?;
    log::error!(
        "STORE LOST: the store at {} could not be opened ({reason}); moved it to {} and starting a fresh one, rebuilt from the running containers and the pod sources",
        path.display(),
        to.display()
    );
    let line = format!(
        "{} store {} could not be opened ({reason}); moved to {}\n",
        crate::time::now(),
        path.display(),
        to.display()
    );
    let marker = marker_path(path);
    let wrote = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&marker)
        .and_then(|mut f| f.write_all(line.as_bytes()).and_then(|_| f.sync_all()));
    if let Err(e) = wrote {
        log::error!("record the moved store in {}: {e}", marker.display());
    }
    let store = Store::open(path)?;
    let _ = std::fs::remove_file(&panicked);
    Ok(Opened {
        store,
        moved: Some(Moved { to, reason }),
    })
}

/// Exit code of `holdfast store probe` for a store sled cannot open (an error that
/// [`StoreError::is_broken_store`]).
const PROBE_BROKEN: i32 = 3;
/// Exit code of `holdfast store probe` for any other failure (busy, no space): the
/// agent's own open reports it.
const PROBE_OTHER: i32 = 4;
/// How much of the probe's stderr goes into the reason the store was moved aside.
const PROBE_STDERR_TAIL: usize = 2048;

/// `holdfast store probe <path>`: opens sled at `path` and closes it again; returns the
/// exit code. A panic inside sled kills this process, not the agent.
pub fn probe(path: &Path) -> i32 {
    let _lock = match super::open::lock(path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{}", error_chain(&e));
            return PROBE_OTHER;
        }
    };
    match super::open::open_sled(path) {
        Ok(db) => {
            drop(db);
            0
        }
        Err(e) if e.is_broken_store() => {
            eprintln!("{}", error_chain(&e));
            PROBE_BROKEN
        }
        Err(e) => {
            eprintln!("{}", error_chain(&e));
            PROBE_OTHER
        }
    }
}

/// Opens the store at `path` in a child process running `exe`; `Some(reason)` when
/// sled failed there (an error, a panic, a crash), `None` when it opened or the probe
/// could not tell (not started, killed by someone): then the store is opened here as
/// it always was.
fn probe_in_child(exe: &Path, path: &Path) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    // Nothing sled could panic on yet: a new store.
    if !path.join("db").exists() && !path.join("conf").exists() {
        return None;
    }
    let started = std::time::Instant::now();
    let out = std::process::Command::new(exe)
        .args(["store", "probe"])
        .arg(path)
        .env("RUST_BACKTRACE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            log::warn!(
                "store: could not run {} to open the store in a process of its own ({e}); opening it here",
                exe.display()
            );
            return None;
        }
    };
    log::debug!(
        "store: probe of {} took {} ms ({})",
        path.display(),
        started.elapsed().as_millis(),
        out.status
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut tail = stderr.trim();
    if tail.len() > PROBE_STDERR_TAIL {
        let mut at = tail.len() - PROBE_STDERR_TAIL;
        while !tail.is_char_boundary(at) {
            at += 1;
        }
        tail = &tail[at..];
    }
    let tail = tail.replace('\n', " / ");
    match (out.status.code(), out.status.signal()) {
        (Some(0), _) => None,
        (Some(PROBE_BROKEN), _) => Some(format!("sled failed to open it: {tail}")),
        (Some(PROBE_OTHER), _) => None,
        // Killed from outside (the OOM killer, a shutdown): says nothing of the store.
        (_, Some(libc_signal))
            if libc_signal == nix::sys::signal::Signal::SIGKILL as i32
                || libc_signal == nix::sys::signal::Signal::SIGTERM as i32
                || libc_signal == nix::sys::signal::Signal::SIGINT as i32 =>
        {
            log::warn!(
                "store: the process opening {} was killed ({}); opening it here",
                path.display(),
                out.status
            );
            None
        }
        // A panic (101 when it unwinds, SIGABRT with `panic = "abort"`) or a crash.
        _ => Some(format!(
            "sled panicked or crashed opening it in a process of its own ({}): {tail}",
            out.status
        )),
    }
}

/// What `holdfast pods` shows about stores moved aside, if any were.
pub fn moved_notice(path: &Path) -> Option<String> {
    let marker = marker_path(path);
    let text = std::fs::read_to_string(&marker).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| {
        format!(
            "{text}\n(remove {} once you have looked at the old store)",
            marker.display()
        )
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

fn move_aside(path: &Path) -> Result<PathBuf, StoreError> {
    let now = crate::time::now();
    let stamp = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    let base = format!("{}.broken-{stamp}", path.display());
    let mut to = PathBuf::from(&base);
    let mut n = 1;
    while to.exists() {
        to = PathBuf::from(format!("{base}.{n}"));
        n += 1;
    }
    std::fs::rename(path, &to).map_err(|source| StoreError::MoveAside {
        path: path.to_path_buf(),
        to: to.clone(),
        source,
    })?;
    if let Some(parent) = path.parent() {
        if let Ok(dir) = std::fs::File::open(parent) {
            let _ = dir.sync_all();
        }
    }
    Ok(to)
}

impl Store {
    /// Moves every record of tree `name` that does not decode as `T` into the
    /// [`QUARANTINE`] tree (key `<name>/<key>`), logging each; returns how many moved.
    /// Decoding is all the agent's readers need, so after this they never meet a bad
    /// record.
    pub fn quarantine_undecodable<T>(&self, name: &'static str) -> Result<usize, StoreError>
    where
        T: serde::de::DeserializeOwned,
    {
        let mut moved = 0;
        for (key, bytes) in self.scan_raw(name, "")? {
            let Err(e) = serde_json::from_slice::<T>(&bytes) else {
                continue;
            };
            log::error!(
                "store: tree {name} record {key} does not decode ({e}); moved to tree {QUARANTINE}"
            );
            self.write(vec![
                Op {
                    tree: QUARANTINE,
                    key: format!("{name}/{key}"),
                    value: Some(bytes),
                },
                Op {
                    tree: name,
                    key,
                    value: None,
                },
            ])?;
            moved += 1;
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_store_is_moved_aside_and_a_fresh_one_opens() {
        let tmp = crate::testutil::TempDir::new("recover");
        let dir = tmp.0.join("db");
        {
            let store = Store::open(&dir).expect("open");
            let t: super::super::Tree<u32> = store.tree("n").expect("tree");
            t.put("a", &1).expect("put");
            store.flush().expect("flush");
        }
        for e in std::fs::read_dir(&dir).expect("dir").flatten() {
            if e.path().is_file() && e.file_name() != "holdfast.lock" {
                std::fs::write(e.path(), vec![0xa5u8; 4096]).expect("garbage");
            }
        }
        let opened = open_or_recover_with(&dir, None).expect("recovered");
        let moved = opened.moved.expect("moved aside");
        assert!(
            moved.to.exists(),
            "old store kept at {}",
            moved.to.display()
        );
        assert!(moved
            .to
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .starts_with("db.broken-"));
        assert!(opened.store.is_fresh());
        let notice = moved_notice(&dir).expect("notice");
        assert!(notice.contains("could not be opened"), "{notice}");
        drop(opened.store);
        // The fresh store opens as any other.
        let again = open_or_recover_with(&dir, None).expect("reopen");
        assert!(again.moved.is_none());
    }

    #[test]
    fn a_panic_recorded_by_the_last_open_moves_the_store_aside() {
        let tmp = crate::testutil::TempDir::new("recover");
        let dir = tmp.0.join("db");
        drop(Store::open(&dir).expect("open"));
        std::fs::write(panicked_path(&dir), "sled: corrupt segment").expect("marker");
        let opened = open_or_recover_with(&dir, None).expect("recovered");
        let moved = opened.moved.expect("moved");
        assert!(moved.reason.contains("corrupt segment"), "{}", moved.reason);
        assert!(!panicked_path(&dir).exists());
    }

    #[test]
    fn undecodable_records_go_to_quarantine() {
        let tmp = crate::testutil::TempDir::new("recover");
        let store = Store::open(&tmp.0.join("db")).expect("open");
        store.put_raw("nums", "good", b"7").expect("insert");
        store.put_raw("nums", "bad", b"{not json").expect("insert");
        assert_eq!(
            store.quarantine_undecodable::<u32>("nums").expect("check"),
            1
        );
        let t: super::super::Tree<u32> = store.tree("nums").expect("tree");
        assert_eq!(t.entries().expect("entries"), vec![("good".to_string(), 7)]);
        assert_eq!(
            store
                .get_raw(QUARANTINE, "nums/bad")
                .expect("get")
                .as_deref(),
            Some(b"{not json".as_slice())
        );
    }
}
