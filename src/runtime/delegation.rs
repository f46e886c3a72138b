//! `cgroupRoot: delegated`: the pods' cgroups inside the cgroup v2 subtree that the
//! service manager hands this process (systemd's `Delegate=yes`), never beside it.
//!
//! ```text
//! <base>              the unit's cgroup, as systemd delegates it; never holds a process
//! <base>/supervisor   the agent, its shims and pod namespace holders
//! <base>/pods         the cgroup root: kubepods/... and the containers under it
//! ```
//!
//! systemd >= 254 with `DelegateSubgroup=supervisor` starts the agent in
//! `<base>/supervisor`, and every restart there too. The kernel lets a cgroup either
//! hold processes or hand controllers to its children, not both: an agent started in
//! `<base>` itself (older systemd) could move, but the next one would be refused a place
//! in `<base>` while pods run, so there `delegated` falls back to `/holdfast`. Processes
//! an earlier agent left in `<base>` are moved into `supervisor`. Owns only `<base>`'s
//! children and the two `cgroup.subtree_control` files of `<base>` and `<base>/pods`;
//! never writes above `<base>`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::RuntimeError;

/// The controllers a pod's limits need: one hierarchy each on v1, enabled in
/// `cgroup.subtree_control` on v2 (and in a delegated base).
pub const CONTROLLERS: &[&str] = &["cpu", "memory", "pids"];
/// The `cgroupRoot` value that asks for the delegated subtree.
pub const DELEGATED: &str = "delegated";
/// Where the agent lives inside the delegated subtree (systemd's `DelegateSubgroup=`).
pub const SUPERVISOR: &str = "supervisor";
/// Where the pods live inside the delegated subtree.
pub const PODS: &str = "pods";
/// The cgroup root when `delegated` cannot be honoured (and the default).
pub const FALLBACK: &str = "/holdfast";
/// A cgroup path from `/proc` longer or deeper than this is not one a service manager
/// made: refused rather than trusted.
const MAX_PATH_LEN: usize = 1024;
const MAX_DEPTH: usize = 32;

/// Where this process was started, from `/proc/self/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// In `<base>/supervisor` (systemd >= 254 with `DelegateSubgroup=supervisor`).
    Supervisor { base: String },
    /// In `<base>` itself (systemd < 254, or a unit without `DelegateSubgroup=`).
    Base { base: String },
}

impl Placement {
    pub fn base(&self) -> &str {
        match self {
            Placement::Supervisor { base } | Placement::Base { base } => base,
        }
    }
}

/// Why the delegated subtree cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// No cgroup v2 line: a cgroup v1 host.
    NoUnified,
    /// The root cgroup: not started by a service manager that delegates.
    Root,
    /// A path that is not a plain absolute cgroup path.
    Hostile(String),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::NoUnified => write!(f, "this process is in no cgroup v2 hierarchy"),
            Unusable::Root => write!(
                f,
                "this process runs in the root cgroup, not in a subtree a service manager \
                 delegated (run it from a systemd unit with Delegate=yes)"
            ),
            Unusable::Hostile(why) => write!(f, "its cgroup from /proc/self/cgroup {why}"),
        }
    }
}

/// Where the process is, from the text of `/proc/self/cgroup`: its `0::` line.
pub fn placement(proc_self_cgroup: &str) -> Result<Placement, Unusable> {
    let path = proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(Unusable::NoUnified)?;
    let parts = checked(path)?;
    match parts.split_last() {
        None => Err(Unusable::Root),
        Some((last, [])) if *last == SUPERVISOR => Err(Unusable::Root),
        Some((last, parents)) if *last == SUPERVISOR => Ok(Placement::Supervisor {
            base: format!("/{}", parents.join("/")),
        }),
        Some(_) => Ok(Placement::Base {
            base: format!("/{}", parts.join("/")),
        }),
    }
}

/// The components of an absolute cgroup path, or why it is refused.
fn checked(path: &str) -> Result<Vec<&str>, Unusable> {
    let hostile = |why: &str| Err(Unusable::Hostile(format!("{why}: {path:?}")));
    if path.len() > MAX_PATH_LEN {
        return Err(Unusable::Hostile(format!(
            "is longer than {MAX_PATH_LEN} bytes"
        )));
    }
    if !path.starts_with('/') {
        return hostile("is not absolute");
    }
    // A cgroup removed while the process was in it.
    if path.ends_with(" (deleted)") {
        return hostile("was deleted");
    }
    if path == "/" {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = path[1..].split('/').collect();
    if parts.len() > MAX_DEPTH {
        return hostile("is too deep");
    }
    for p in &parts {
        if p.is_empty() || *p == "." || *p == ".." {
            return hostile("has an empty, . or .. component");
        }
        if p.chars().any(|c| c.is_control()) {
            return hostile("has a control character");
        }
    }
    Ok(parts)
}

/// The delegated base this process settled in, once [`settle`] honoured `delegated`:
/// the pods' cgroup tree (`resources::CgroupTree`) writes no `cgroup.subtree_control`
/// above it.
static BASE: OnceLock<String> = OnceLock::new();

/// The delegated base, when this process runs in one.
pub fn base() -> Option<&'static str> {
    BASE.get().map(String::as_str)
}

/// What [`settle`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The cgroup root every pod's cgroup goes under.
    pub cgroup_root: String,
    /// The delegated base, when `delegated` was honoured.
    pub base: Option<String>,
    /// Controllers holdfast needs that `<base>` does not have.
    pub missing: Vec<&'static str>,
}

/// Resolves `cgroupRoot`. Anything but `delegated` is returned as it is. `delegated`
/// becomes `<base>/pods` when this process runs in `<base>/supervisor`, with the
/// controllers enabled; on a cgroup v1 or hybrid host, outside a service manager, or
/// started in `<base>` itself, it falls back to `/holdfast` with a warning (the same
/// config is shipped everywhere).
/// Call it before the first container starts: shims stay in the agent's cgroup.
pub fn settle(configured: &str) -> Result<String, RuntimeError> {
    if configured != DELEGATED {
        return Ok(configured.to_owned());
    }
    let fs = Path::new("/sys/fs/cgroup");
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|source| RuntimeError::Io {
        context: "read /proc/self/cgroup to find the delegated cgroup".into(),
        source,
    })?;
    let settled = settle_at(fs, &own, std::process::id())?;
    if let Some(base) = &settled.base {
        verify_moved(fs, base)?;
        let _ = BASE.set(base.clone());
        log::info!(
            "cgroupRoot delegated: agent in {base}/{SUPERVISOR}, pods under {}",
            settled.cgroup_root
        );
    }
    Ok(settled.cgroup_root)
}

/// [`settle`] on the cgroupfs at `fs`, for this process as `pid` placed as
/// `proc_self_cgroup` says.
pub fn settle_at(fs: &Path, proc_self_cgroup: &str, pid: u32) -> Result<Settled, RuntimeError> {
    let fallback = |why: String| {
        log::warn!(
            "cgroupRoot delegated cannot be honoured: {why}; pods' cgroups go under {FALLBACK}, \
             outside any service manager's subtree"
        );
        Ok(Settled {
            cgroup_root: FALLBACK.to_owned(),
            base: None,
            missing: Vec::new(),
        })
    };
    if !fs.join("cgroup.controllers").exists() {
        return fallback(format!(
            "{} is not a cgroup v2 hierarchy (a cgroup v1 or hybrid host)",
            fs.display()
        ));
    }
    let base = match placement(proc_self_cgroup) {
        Ok(Placement::Supervisor { base }) => base,
        // The agent could move itself to <base>/supervisor, but the service manager
        // starts the next agent in <base> again, and once <base> hands controllers to
        // pods/ the kernel refuses it any process (EBUSY): every restart while pods run
        // would fail (systemd: status=219/CGROUP), for as long as they run.
        Ok(Placement::Base { base }) => {
            return fallback(format!(
                "started in {base} itself, not in {base}/{SUPERVISOR} (systemd < 254, or no \
                 DelegateSubgroup={SUPERVISOR} in the unit): with pods inside {base}, the kernel \
                 would refuse the next agent a place in {base} and every restart would fail \
                 while pods run"
            ))
        }
        Err(why) => return fallback(why.to_string()),
    };
    let base_dir = under(fs, &base);
    let supervisor = base_dir.join(SUPERVISOR);
    create(&supervisor)?;
    // Every process still in <base> (shims of an agent that ran there before the unit had
    // DelegateSubgroup=) moves: <base> can only enable controllers for its children when
    // it holds no process.
    evacuate(&base_dir, &supervisor, pid)?;
    let pods = base_dir.join(PODS);
    let missing = enable(&base_dir)?;
    create(&pods)?;
    enable(&pods)?;
    if !missing.is_empty() {
        log::warn!(
            "cgroup controllers missing from the delegated {base}: {} (pods get no {} limits); \
             give the unit Delegate=yes, or Delegate={}",
            missing.join(" "),
            missing.join(" or "),
            CONTROLLERS.join(" ")
        );
    }
    Ok(Settled {
        cgroup_root: format!("{}/{PODS}", base.trim_end_matches('/')),
        base: Some(base),
        missing,
    })
}

/// `<fs>/<rel>`.
fn under(fs: &Path, rel: &str) -> PathBuf {
    fs.join(rel.trim_start_matches('/'))
}

fn create(dir: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|source| RuntimeError::Io {
        context: format!("create cgroup {}", dir.display()),
        source,
    })
}

/// Moves every process listed in `from`'s `cgroup.procs` (`own` first) into `to`. On
/// cgroup v2 writing a process id to `cgroup.procs` moves all its threads.
fn evacuate(from: &Path, to: &Path, own: u32) -> Result<(), RuntimeError> {
    let procs = to.join("cgroup.procs");
    let write = |pid: &str| std::fs::write(&procs, pid);
    write(&own.to_string()).map_err(|source| RuntimeError::Io {
        context: format!(
            "move the agent into {} (is this cgroup delegated to it?)",
            to.display()
        ),
        source,
    })?;
    let listed = std::fs::read_to_string(from.join("cgroup.procs")).unwrap_or_default();
    for pid in listed.split_whitespace() {
        if pid.parse::<u32>().is_err() || pid == own.to_string() {
            continue;
        }
        match write(pid) {
            Ok(()) => log::info!(
                "moved process {pid} from {} to {}",
                from.display(),
                to.display()
            ),
            // Gone meanwhile.
            Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => {}
            Err(source) => {
                return Err(RuntimeError::Io {
                    context: format!("move process {pid} into {}", to.display()),
                    source,
                })
            }
        }
    }
    Ok(())
}

/// Enables the controllers holdfast needs that `dir` has in `cgroup.subtree_control`;
/// returns those it does not have.
fn enable(dir: &Path) -> Result<Vec<&'static str>, RuntimeError> {
    let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    let has = |text: &str, c: &str| text.split_whitespace().any(|a| a == c);
    let mut missing = Vec::new();
    for c in CONTROLLERS {
        if !has(&available, c) {
            missing.push(*c);
            continue;
        }
        if has(&enabled, c) {
            continue;
        }
        let path = dir.join("cgroup.subtree_control");
        std::fs::write(&path, format!("+{c}")).map_err(|source| RuntimeError::Io {
            context: format!(
                "enable {c} in {} (a process left in that cgroup stops it)",
                path.display()
            ),
            source,
        })?;
    }
    Ok(missing)
}

/// Checks that every thread of this process is now in `<base>/supervisor` and that
/// `<base>` holds no process.
fn verify_moved(fs: &Path, base: &str) -> Result<(), RuntimeError> {
    let want = format!("0::{}/{SUPERVISOR}", base.trim_end_matches('/'));
    let tasks = std::fs::read_dir("/proc/self/task").map_err(|source| RuntimeError::Io {
        context: "list this process's threads in /proc/self/task".into(),
        source,
    })?;
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("cgroup")).unwrap_or_default();
        if !text.lines().any(|l| l == want) {
            return Err(RuntimeError::Io {
                context: format!(
                    "thread {} of the agent is not in {base}/{SUPERVISOR} after the move",
                    t.file_name().to_string_lossy()
                ),
                source: std::io::Error::other(text.trim().to_owned()),
            });
        }
    }
    let left = std::fs::read_to_string(under(fs, base).join("cgroup.procs")).unwrap_or_default();
    if !left.trim().is_empty() {
        log::warn!(
            "processes still in {base} after moving them to {SUPERVISOR}: {}",
            left.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "delegation_tests.rs"]
mod tests;
