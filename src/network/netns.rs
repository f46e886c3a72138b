//! A pod's namespaces without a pause container: a short-lived holder process
//! (`holdfast sandbox ns`, single-threaded: the agent must never `unshare` its own
//! threads) makes new network, IPC and UTS namespaces, names the pod's host in the
//! new UTS namespace, bind-mounts each `/proc/self/ns/<kind>` onto a file in the pod's
//! `ns/` directory and exits; the bind mounts keep the namespaces alive until
//! [`release`] unmounts them. The pod's containers join them by path.
//!
//! A shared PID namespace (`shareProcessNamespace`) needs a living init, or the
//! namespace dies with its first process: for it the holder also starts
//! `holdfast sandbox init`, PID 1 of the pod, which only reaps orphans and is killed by
//! [`release`].
//!
//! After a reboot the files are still there but hold nothing: [`held`] tells them
//! apart by their filesystem (nsfs).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

use super::NetworkError;
use crate::runtime::NamespaceKind;

const INIT_RECORD: &str = "pid-init";

fn file_name(kind: NamespaceKind) -> &'static str {
    match kind {
        NamespaceKind::Net => "net",
        NamespaceKind::Ipc => "ipc",
        NamespaceKind::Uts => "uts",
        NamespaceKind::Pid => "pid",
    }
}

fn kind_of(name: &str) -> Option<NamespaceKind> {
    match name {
        "net" => Some(NamespaceKind::Net),
        "ipc" => Some(NamespaceKind::Ipc),
        "uts" => Some(NamespaceKind::Uts),
        "pid" => Some(NamespaceKind::Pid),
        _ => None,
    }
}

/// Where namespace `kind` of the pod whose namespace directory is `dir` is held.
pub fn path(dir: &Path, kind: NamespaceKind) -> PathBuf {
    dir.join(file_name(kind))
}

/// Whether `path` holds a namespace now (an nsfs bind mount), not a file left by a
/// reboot or a crash.
pub fn held(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
        .unwrap_or(false)
}

/// Makes the namespaces `kinds` for a pod in `dir`, running `binary` (holdfast) as the
/// holder; `hostname` is set in a new UTS namespace. Returns where each is held.
pub fn create(
    binary: &Path,
    dir: &Path,
    kinds: &[NamespaceKind],
    hostname: &str,
) -> Result<Vec<(NamespaceKind, PathBuf)>, NetworkError> {
    std::fs::create_dir_all(dir).map_err(|source| NetworkError::Io {
        context: format!("create {}", dir.display()),
        source,
    })?;
    // A holder killed half-way, or a reboot, leaves some of them: start clean.
    release(dir)?;
    let mut args: Vec<OsString> = vec![
        "sandbox".into(),
        "ns".into(),
        dir.as_os_str().to_owned(),
        hostname.into(),
    ];
    args.extend(kinds.iter().map(|k| OsString::from(file_name(*k))));
    let out = Command::new(binary)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| NetworkError::Io {
            context: format!("run {} sandbox ns", binary.display()),
            source,
        })?;
    if !out.status.success() {
        let _ = release(dir);
        return Err(NetworkError::Namespaces {
            dir: dir.to_owned(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(kinds.iter().map(|k| (*k, path(dir, *k))).collect())
}

/// Unmounts and removes every namespace file in `dir` and kills the pod's init, if
/// any. The namespaces themselves go once no container uses them.
pub fn release(dir: &Path) -> Result<(), NetworkError> {
    kill_init(dir);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(NetworkError::Io {
                context: format!("list {}", dir.display()),
                source,
            })
        }
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if kind_of(name).is_none() && name != INIT_RECORD {
            continue;
        }
        let p = e.path();
        match nix::mount::umount2(&p, MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => {
                return Err(NetworkError::Io {
                    context: format!("unmount {}", p.display()),
                    source: e.into(),
                })
            }
        }
        if let Err(source) = std::fs::remove_file(&p) {
            if source.kind() != std::io::ErrorKind::NotFound {
                return Err(NetworkError::Io {
                    context: format!("remove {}", p.display()),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// The pod's init, as its record names it: pid and start time, so a reused pid is
/// never killed.
fn kill_init(dir: &Path) {
    let Ok(text) = std::fs::read_to_string(dir.join(INIT_RECORD)) else {
        return;
    };
    let mut it = text.split_whitespace();
    let (Some(pid), Some(start)) = (
        it.next().and_then(|p| p.parse::<i32>().ok()),
        it.next().and_then(|s| s.parse::<u64>().ok()),
    ) else {
        return;
    };
    if start_time(pid) == Some(start) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields start after the last ')'.
    let rest = stat.rsplit_once(") ")?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// `holdfast sandbox ...`, run by the agent as a child. Single-threaded: dispatched
/// before anything starts a thread. Returns the exit code.
pub fn holder_main(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("ns") if args.len() >= 3 => match hold(&args[1..]) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{e}");
                1
            }
        },
        Some("init") => pod_init(),
        _ => {
            eprintln!("usage: holdfast sandbox ns <dir> <hostname> net|ipc|uts|pid... | holdfast sandbox init");
            2
        }
    }
}

fn hold(args: &[String]) -> Result<(), String> {
    let dir = PathBuf::from(&args[0]);
    let hostname = &args[1];
    let mut kinds = Vec::new();
    for a in &args[2..] {
        kinds.push(kind_of(a).ok_or_else(|| format!("unknown namespace {a:?}"))?);
    }
    let mut flags = CloneFlags::empty();
    for k in &kinds {
        flags |= match k {
            NamespaceKind::Net => CloneFlags::CLONE_NEWNET,
            NamespaceKind::Ipc => CloneFlags::CLONE_NEWIPC,
            NamespaceKind::Uts => CloneFlags::CLONE_NEWUTS,
            NamespaceKind::Pid => CloneFlags::CLONE_NEWPID,
        };
    }
    nix::sched::unshare(flags).map_err(|e| format!("unshare {kinds:?}: {e}"))?;
    if kinds.contains(&NamespaceKind::Uts) {
        nix::unistd::sethostname(hostname).map_err(|e| format!("sethostname {hostname:?}: {e}"))?;
    }
    for k in &kinds {
        let target = path(&dir, *k);
        let source = if *k == NamespaceKind::Pid {
            let pid = start_init(&dir)?;
            PathBuf::from(format!("/proc/{pid}/ns/pid"))
        } else {
            PathBuf::from(format!("/proc/self/ns/{}", file_name(*k)))
        };
        std::fs::File::create(&target).map_err(|e| format!("create {}: {e}", target.display()))?;
        nix::mount::mount(
            Some(&source),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind {} to {}: {e}", source.display(), target.display()))?;
    }
    Ok(())
}

/// Starts the pod's PID 1 (our first child after `unshare(CLONE_NEWPID)`) and records
/// it. Returns its pid as this namespace sees it.
fn start_init(dir: &Path) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("find own executable: {e}"))?;
    let child = Command::new(exe)
        .args(["sandbox", "init"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start the pod's init: {e}"))?;
    let pid = child.id() as i32;
    let start = start_time(pid).ok_or_else(|| "the pod's init exited at once".to_owned())?;
    std::fs::write(dir.join(INIT_RECORD), format!("{pid} {start}\n"))
        .map_err(|e| format!("record the pod's init: {e}"))?;
    // Not waited for: it outlives us, adopted by the host's init.
    Ok(pid)
}

/// PID 1 of a pod that shares its PID namespace: reaps the orphans the kernel hands
/// it and exits on SIGTERM. Signals are taken with sigwait, so no handler runs.
fn pod_init() -> i32 {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let _ = nix::unistd::setsid();
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    if set.thread_block().is_err() {
        return 1;
    }
    loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => loop {
                match waitpid(None::<nix::unistd::Pid>, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => {}
                }
            },
            Ok(Signal::SIGTERM | Signal::SIGINT) => return 0,
            _ => {}
        }
    }
}
