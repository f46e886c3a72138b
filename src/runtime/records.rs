//! The files through which the agent and a container's shim talk: `shim.json` (what to
//! run), `shim-pid.json`, `started.json`, `exit.json`, `failed.json`. Each is written
//! whole (temp file, rename) so a reader never sees half a record. Also the `/proc`
//! facts that tell a live process from a reused pid.
//!
//! Two kinds of record:
//! - boot-scoped ([`write_boot_scoped`]), in the container's state dir on the tmpfs at
//!   `<root>/boot`: `shim.json`, `shim-pid.json`, `started.json` carry the boot id and
//!   speak of processes, which a power cut kills; `failed.json` says why a start failed,
//!   which the start that waits for it returns to the agent at once (and the agent
//!   keeps in its store). None need survive a reboot, and none reaches the flash. A
//!   state dir on the disk (no tmpfs could be mounted) is not synced: after a power cut
//!   a record there may be empty or torn, and [`read_boot_scoped`] reads it as absent,
//!   which is what a record of another boot means anyway.
//! - durable: `exit.json`, in the container's dir on the disk, says how a container
//!   ended, which its restart policy still needs after a reboot. The shim writes it
//!   ([`write_unsynced`]) and tells the agent (`exits/<id>`); the agent takes the exit
//!   into its store, flushes it, and removes `exits/<id>`. Only if that does not
//!   happen within [`super::running::EXIT_TAKEN_WAIT`] (no agent runs) does the shim sync
//!   the record itself ([`sync`]): an fsync on the container's dir forces a journal
//!   commit of everything the filesystem has pending, the costliest write of a
//!   container's life on flash, and the store's flush already covers it.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::RuntimeError;
use crate::time::Timestamp;

pub const SHIM_CONFIG: &str = "shim.json";
pub const SHIM_PID: &str = "shim-pid.json";
pub const STARTED: &str = "started.json";
pub const EXIT: &str = "exit.json";
pub const FAILED: &str = "failed.json";
pub const SHIM_LOG: &str = "shim.log";

/// What a shim needs to run one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShimConfig {
    pub id: String,
    /// On the disk: the overlay's upper and work dirs, and `exit.json`.
    pub container_dir: PathBuf,
    /// For one boot: this config, the shim's other records and log, the bundle and the
    /// sockets. The same dir as `container_dir` in records of older shims.
    #[serde(default)]
    pub state_dir: PathBuf,
    pub bundle: PathBuf,
    /// Image layer directories, lowest first.
    pub layers: Vec<PathBuf>,
    pub log_path: PathBuf,
    pub log_max_size: u64,
    pub log_max_files: u32,
    /// Relative to each cgroup hierarchy's mount point.
    pub cgroups_path: String,
    /// libcontainer's state root.
    pub state_root: PathBuf,
    pub exits_dir: PathBuf,
    /// Written to the container's init before it starts (never to the shim, which must
    /// outlive its container to record its exit).
    pub oom_score_adj: Option<i32>,
    pub boot_id: String,
    /// The container's `stdin`, `stdinOnce` and `tty`: whether the shim keeps a stdin
    /// for attached clients, closes it after the first one, and gives the container a
    /// terminal. Absent in records of older shims: false.
    #[serde(default)]
    pub stdin: bool,
    #[serde(default)]
    pub stdin_once: bool,
    #[serde(default)]
    pub tty: bool,
}

impl ShimConfig {
    /// Where the shim's records, log and sockets go (see `state_dir`).
    pub fn state_dir(&self) -> &Path {
        if self.state_dir.as_os_str().is_empty() {
            &self.container_dir
        } else {
            &self.state_dir
        }
    }
}

/// A process as the kernel knows it: pid plus start time (clock ticks since boot), which
/// together name one process even after the pid is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRef {
    pub pid: i32,
    pub start_time: u64,
}

impl ProcessRef {
    pub fn of(pid: i32) -> Option<Self> {
        start_time(pid).map(|start_time| ProcessRef { pid, start_time })
    }

    /// Whether this very process still exists (a zombie counts as gone).
    pub fn is_alive(&self) -> bool {
        matches!(stat_fields(self.pid), Some((state, t)) if t == self.start_time && state != 'Z' && state != 'X')
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShimPid {
    pub process: ProcessRef,
    pub boot_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartedRecord {
    pub init: ProcessRef,
    pub started_at: Timestamp,
    pub boot_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureKind {
    /// libcontainer, the rootfs or the shim failed.
    Create,
    /// The container was set up but its process could not run.
    Start,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedRecord {
    pub kind: FailureKind,
    pub message: String,
    pub at: Timestamp,
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> RuntimeError {
    move |source| RuntimeError::Io { context, source }
}

/// Where `dir/name` is written before it is renamed into place.
fn temp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.tmp"))
}

/// Blocks a record of up to this many bytes takes, kept by [`reserve`].
const RESERVED_BYTES: nix::libc::off_t = 4096;

/// Allocates the blocks `dir/name` will need, now, so that it can still be written when
/// the disk is full by then (a container's exit record). Best effort: a filesystem
/// without `fallocate` just writes it later as any other.
pub fn reserve(dir: &Path, name: &str) -> Result<(), RuntimeError> {
    use std::os::fd::AsRawFd;
    let tmp = temp_path(dir, name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&tmp)
        .map_err(io(format!("create {}", tmp.display())))?;
    let _ = nix::fcntl::fallocate(
        file.as_raw_fd(),
        nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
        0,
        RESERVED_BYTES,
    );
    Ok(())
}

/// Writes `value` as JSON to `dir/name` atomically, without syncing it: [`sync`] makes
/// it durable later, unless something else has by then (the exit record, once the
/// agent's store holds the exit).
pub fn write_unsynced<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<(), RuntimeError> {
    write_record(dir, name, value)
}

/// Makes `dir/name`, written by [`write_unsynced`], durable: the file, then its name.
pub fn sync(dir: &Path, name: &str) -> Result<(), RuntimeError> {
    let path = dir.join(name);
    std::fs::File::open(&path)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("sync {}", path.display())))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("sync {}", dir.display())))
}

/// Writes a boot-scoped record (see the module doc) atomically, without syncing it.
pub fn write_boot_scoped<T: Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
) -> Result<(), RuntimeError> {
    write_record(dir, name, value)
}

/// The temp file is written over, not truncated first, so blocks [`reserve`] allocated
/// for it are used rather than freed.
fn write_record<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<(), RuntimeError> {
    let path = dir.join(name);
    let tmp = temp_path(dir, name);
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| RuntimeError::Io {
        context: format!("encode {}", path.display()),
        source: std::io::Error::other(e),
    })?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&tmp)
        .map_err(io(format!("create {}", tmp.display())))?;
    file.write_all(&bytes)
        .and_then(|()| file.set_len(bytes.len() as u64))
        .map_err(io(format!("write {}", tmp.display())))?;
    std::fs::rename(&tmp, &path).map_err(io(format!(
        "rename {} to {}",
        tmp.display(),
        path.display()
    )))?;
    Ok(())
}

/// Reads `dir/name`; `Ok(None)` when it does not exist.
pub fn read<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>, RuntimeError> {
    let path = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("read {}", path.display()))(e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| RuntimeError::Io {
            context: format!("decode {}", path.display()),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
}

/// Reads a boot-scoped record, or an exit record not yet synced; `Ok(None)` when it does
/// not exist or does not decode.
/// Renamed into place whole, a record of this boot always decodes: one that does not
/// was cut short by a power cut, so it speaks of processes that are gone.
pub fn read_boot_scoped<T: DeserializeOwned>(
    dir: &Path,
    name: &str,
) -> Result<Option<T>, RuntimeError> {
    let path = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("read {}", path.display()))(e)),
    };
    match serde_json::from_slice(&bytes) {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            log::debug!("{} from before a power cut ({e}): ignored", path.display());
            Ok(None)
        }
    }
}

/// This boot's id: pids and start times from another boot mean nothing.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Field 22 of `/proc/<pid>/stat`.
pub fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid).map(|(_, t)| t)
}

/// (state, start time) from `/proc/<pid>/stat`.
fn stat_fields(pid: i32) -> Option<(char, u64)> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3 (state); start time is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_records_round_trip() {
        let me = ProcessRef::of(std::process::id() as i32).expect("own stat");
        assert!(me.is_alive());
        assert!(!ProcessRef {
            start_time: me.start_time + 1,
            ..me
        }
        .is_alive());
        assert!(!boot_id().is_empty());

        let dir = std::env::temp_dir().join(format!("holdfast-records-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let rec = StartedRecord {
            init: me,
            started_at: crate::time::now(),
            boot_id: boot_id(),
        };
        write_unsynced(&dir, STARTED, &rec).expect("write");
        sync(&dir, STARTED).expect("sync");
        assert_eq!(
            read::<StartedRecord>(&dir, STARTED).expect("read"),
            Some(rec)
        );
        assert_eq!(
            read::<StartedRecord>(&dir, EXIT).expect("read missing"),
            None
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_boot_scoped_record_reads_as_absent() {
        let dir = std::env::temp_dir().join(format!("holdfast-torn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join(STARTED), b"{\"init\": {").expect("torn record");
        assert_eq!(
            read_boot_scoped::<StartedRecord>(&dir, STARTED).expect("read"),
            None
        );
        // A durable record that does not decode is an error worth reporting.
        assert!(read::<StartedRecord>(&dir, STARTED).is_err());
        let rec = ShimPid {
            process: ProcessRef::of(std::process::id() as i32).expect("own stat"),
            boot_id: boot_id(),
        };
        write_boot_scoped(&dir, SHIM_PID, &rec).expect("write");
        assert_eq!(read_boot_scoped(&dir, SHIM_PID).expect("read"), Some(rec));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
