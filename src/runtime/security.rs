//! A container's security context applied to its OCI spec, as the kubelet and
//! containerd apply it: the user (runAsUser/runAsGroup over the image's), runAsNonRoot
//! with the kubelet's messages, supplemental groups and fsGroup, capabilities added and
//! dropped over containerd's default set, privileged, allowPrivilegeEscalation
//! (no_new_privs), readOnlyRootFilesystem, procMount, sysctls and seccomp. Pure: reads
//! the pod and writes the spec, never the system. Whether a privileged pod or a
//! sysctl is allowed at all is decided at admission (`resources::admission`).

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use oci_spec::runtime::{Capability, LinuxCapabilities, LinuxCapabilitiesBuilder, Spec};

pub use super::effective::{effective, Effective};
use super::sysctl::normalize_sysctl;
use super::RuntimeError;

/// containerd's default capabilities (`oci.defaultUnixCaps`), which Docker uses too.
pub const DEFAULT_CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// Every capability by its number (capability.h); `cap_last_cap` says how many this
/// kernel knows, and a privileged container gets those.
const ALL_CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// Whether any container of the pod asks to be privileged.
pub fn wants_privileged(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|sc| sc.privileged)
                    .unwrap_or(false)
            })
    })
}

/// The user to resolve in the image, as containerd builds it: runAsUser (and
/// runAsGroup) when set, else the image's own `User`.
pub fn user_string(sc: &Effective, image_user: &str) -> Result<String, RuntimeError> {
    match (sc.run_as_user, sc.run_as_group) {
        (Some(u), Some(g)) => Ok(format!("{u}:{g}")),
        (Some(u), None) => Ok(u.to_string()),
        (None, Some(g)) => Err(RuntimeError::Create {
            id: String::new(),
            message: format!("user group \"{g}\" is specified without user"),
        }),
        (None, None) => Ok(image_user.to_owned()),
    }
}

/// `format.Pod`: `name_namespace(uid)`.
pub fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

/// The kubelet's `verifyRunAsNonRoot`, with its messages: the image's user is judged
/// as the image states it (a name cannot be verified, even if `/etc/passwd` has it).
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    sc: &Effective,
    image_user: &str,
) -> Result<(), RuntimeError> {
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    let who = pod_ref(pod);
    if let Some(uid) = sc.run_as_user {
        if uid == 0 {
            return Err(RuntimeError::Config(format!(
                "container's runAsUser breaks non-root policy (pod: {who:?}, container: {})",
                container.name
            )));
        }
        return Ok(());
    }
    let user = image_user.split(':').next().unwrap_or("").trim();
    if user.is_empty() {
        return Err(root(&who, &container.name));
    }
    match user.parse::<i64>() {
        Ok(0) => Err(root(&who, &container.name)),
        Ok(_) => Ok(()),
        Err(_) => Err(RuntimeError::Config(format!(
            "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {who:?}, container: {})",
            container.name
        ))),
    }
}

fn root(who: &str, container: &str) -> RuntimeError {
    RuntimeError::Config(format!(
        "container has runAsNonRoot and image will run as root (pod: {who:?}, container: {container})"
    ))
}

/// The groups the process gets besides its own: fsGroup, then supplementalGroups, then
/// the groups the image's `/etc/group` lists the user in (containerd's Merge policy).
pub fn additional_gids(pod: &Pod, image_groups: &[u32]) -> Vec<u32> {
    let p = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let mut out: Vec<u32> = Vec::new();
    let fs_group = p.and_then(|p| p.fs_group);
    let groups = p
        .and_then(|p| p.supplemental_groups.clone())
        .unwrap_or_default();
    for g in fs_group.into_iter().chain(groups) {
        if let Ok(g) = u32::try_from(g) {
            if !out.contains(&g) {
                out.push(g);
            }
        }
    }
    for g in image_groups {
        if !out.contains(g) {
            out.push(*g);
        }
    }
    out
}

/// What the host offers that the spec may depend on.
pub struct Host {
    /// `/proc/sys/kernel/cap_last_cap`: the capabilities this kernel knows.
    pub cap_last_cap: usize,
    /// The capabilities holdfast itself may hand on (its bounding set): nothing can
    /// give a container more, so "all" means these.
    pub bounding: u64,
    /// Char and block devices under the host's `/dev`, for privileged containers.
    pub devices: Vec<oci_spec::runtime::LinuxDevice>,
    /// Where Localhost seccomp profiles live: `<root-dir>/seccomp`.
    pub seccomp_root: std::path::PathBuf,
}

/// Applies `sc` (and the pod's sysctls and groups) to `spec`, which `spec::build` made
/// with containerd's defaults.
pub fn apply(
    spec: &mut Spec,
    pod: &Pod,
    sc: &Effective,
    gids: &[u32],
    host: &Host,
) -> Result<(), RuntimeError> {
    let caps = capability_names(sc, host)?;
    // Privileged containers run unconfined, as with containerd.
    let seccomp = if sc.privileged {
        None
    } else {
        super::seccomp::profile(sc, &caps, &host.seccomp_root)?
    };
    let capabilities = capability_set(&caps)?;
    apply_process(spec, capabilities, sc, gids);
    if sc.read_only_root_filesystem {
        if let Some(root) = spec.root_mut() {
            root.set_readonly(Some(true));
        }
    }
    check_proc_mount(sc)?;
    let sysctls = pod_sysctls(pod);
    if sc.privileged {
        privileged(spec, host)?;
    }
    if let Some(linux) = spec.linux_mut() {
        if !sysctls.is_empty() {
            linux.set_sysctl(Some(sysctls));
        }
        linux.set_seccomp(seccomp);
    }
    Ok(())
}

/// The capabilities this host can hand on: those the kernel knows and holdfast holds.
fn host_capabilities(host: &Host) -> Vec<String> {
    ALL_CAPS
        .iter()
        .enumerate()
        .take(host.cap_last_cap.saturating_add(1))
        .filter(|(i, _)| host.bounding & (1u64 << i) != 0)
        .map(|(_, s)| (*s).to_owned())
        .collect()
}

/// The container's capability names (upper case, no `CAP_`): containerd's defaults
/// with `add` and `drop` applied, or everything the host holds when privileged.
fn capability_names(sc: &Effective, host: &Host) -> Result<Vec<String>, RuntimeError> {
    let all = host_capabilities(host);
    if sc.privileged {
        return Ok(all);
    }
    let mut caps: Vec<String> = DEFAULT_CAPS.iter().map(|s| (*s).to_owned()).collect();
    let upper = |v: &[String]| -> Vec<String> {
        v.iter()
            .map(|c| {
                c.trim()
                    .to_uppercase()
                    .trim_start_matches("CAP_")
                    .to_owned()
            })
            .collect()
    };
    let (add, drop) = (upper(&sc.capabilities_add), upper(&sc.capabilities_drop));
    // containerd: "ALL" first, so single names still apply (add ALL, drop CHOWN).
    if add.iter().any(|c| c == "ALL") {
        caps = all;
    }
    if drop.iter().any(|c| c == "ALL") {
        caps.clear();
    }
    for c in add.iter().filter(|c| *c != "ALL") {
        let held = ALL_CAPS
            .iter()
            .position(|k| k == c)
            .is_some_and(|i| host.bounding & (1u64 << i) != 0);
        if ALL_CAPS.contains(&c.as_str()) && !held {
            return Err(RuntimeError::Config(format!(
                "capability \"CAP_{c}\" is not in holdfast's own bounding set: no container can have it"
            )));
        }
        if !caps.contains(c) {
            caps.push(c.clone());
        }
    }
    caps.retain(|c| !drop.contains(c));
    Ok(caps)
}

/// `caps` as the process's bounding, effective and permitted sets; none inherited.
fn capability_set(caps: &[String]) -> Result<LinuxCapabilities, RuntimeError> {
    let set: HashSet<Capability> = caps
        .iter()
        .map(|c| capability(c))
        .collect::<Result<_, _>>()?;
    LinuxCapabilitiesBuilder::default()
        .bounding(set.clone())
        .effective(set.clone())
        .permitted(set)
        .inheritable(HashSet::new())
        .ambient(HashSet::new())
        .build()
        .map_err(oci)
}

/// The process's capabilities, no_new_privs and supplemental groups.
fn apply_process(spec: &mut Spec, capabilities: LinuxCapabilities, sc: &Effective, gids: &[u32]) {
    if let Some(process) = spec.process_mut() {
        process.set_capabilities(Some(capabilities));
        // The kubelet's AddNoNewPrivileges: only an explicit false sets the bit. Unset
        // otherwise, not false: libcontainer 0.7 loads a seccomp filter while the init
        // still holds CAP_SYS_ADMIN only when noNewPrivileges is absent, and after
        // dropping capabilities (where the kernel refuses it without no_new_privs)
        // whenever it is present, even false.
        process.set_no_new_privileges(no_new_privileges(sc));
        if !gids.is_empty() {
            process.user_mut().set_additional_gids(Some(gids.to_vec()));
        }
    }
}

/// Refuses a procMount holdfast cannot give.
fn check_proc_mount(sc: &Effective) -> Result<(), RuntimeError> {
    match sc.proc_mount.as_deref() {
        None | Some("Default") => Ok(()),
        Some("Unmasked") => Err(RuntimeError::Config(
            "procMount Unmasked needs a user namespace (hostUsers: false), which holdfast does not provide"
                .to_owned(),
        )),
        Some(other) => Err(RuntimeError::Config(format!("unknown procMount {other:?}"))),
    }
}

/// The pod's sysctls, names in their dotted form.
fn pod_sysctls(pod: &Pod) -> HashMap<String, String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|p| p.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (normalize_sysctl(&s.name), s.value.clone()))
        .collect()
}

/// The spec's `noNewPrivileges`: `Some(true)` for `allowPrivilegeEscalation: false`,
/// otherwise absent (see [`apply`]).
pub fn no_new_privileges(sc: &Effective) -> Option<bool> {
    (sc.allow_privilege_escalation == Some(false)).then_some(true)
}

/// What `privileged: true` adds: every capability (done above), nothing masked or
/// read-only under /proc, a writable /sys, and every host device.
fn privileged(spec: &mut Spec, host: &Host) -> Result<(), RuntimeError> {
    if let Some(linux) = spec.linux_mut() {
        linux.set_masked_paths(None);
        linux.set_readonly_paths(None);
        linux.set_devices(Some(host.devices.clone()));
        let all = oci_spec::runtime::LinuxDeviceCgroupBuilder::default()
            .allow(true)
            .access("rwm")
            .build()
            .map_err(oci)?;
        if let Some(res) = linux.resources_mut() {
            res.set_devices(Some(vec![all]));
        }
    }
    if let Some(mounts) = spec.mounts_mut() {
        for m in mounts.iter_mut() {
            if m.destination() == std::path::Path::new("/sys") {
                let opts: Vec<String> = m
                    .options()
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|o| o != "ro")
                    .chain(std::iter::once("rw".to_owned()))
                    .collect();
                m.set_options(Some(opts));
            }
        }
    }
    Ok(())
}

fn capability(name: &str) -> Result<Capability, RuntimeError> {
    serde_json::from_value(serde_json::Value::String(format!("CAP_{name}")))
        .map_err(|_| RuntimeError::Config(format!("unknown capability \"CAP_{name}\"")))
}

/// The bounding set of this process (`CapBnd` in `/proc/self/status`).
pub fn own_bounding_set() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(u64::MAX)
}

/// The kernel's highest capability number.
pub fn cap_last_cap() -> usize {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Char and block devices under the host's `/dev` (not its pseudo filesystems), as
/// containerd lists them for a privileged container.
pub fn host_devices() -> Vec<oci_spec::runtime::LinuxDevice> {
    use oci_spec::runtime::{LinuxDeviceBuilder, LinuxDeviceType};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from("/dev")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                let name = e.file_name();
                // The container gets its own of these.
                if !matches!(name.to_str(), Some("pts" | "shm" | "mqueue" | "fd")) {
                    dirs.push(path);
                }
                continue;
            }
            let typ = if ft.is_char_device() {
                LinuxDeviceType::C
            } else if ft.is_block_device() {
                LinuxDeviceType::B
            } else {
                continue;
            };
            if path == std::path::Path::new("/dev/console") {
                continue;
            }
            let rdev = meta.rdev();
            let dev = LinuxDeviceBuilder::default()
                .path(path)
                .typ(typ)
                .major(i64::from(nix::sys::stat::major(rdev) as u32))
                .minor(i64::from(nix::sys::stat::minor(rdev) as u32))
                .file_mode(meta.mode() & 0o7777)
                .uid(meta.uid())
                .gid(meta.gid())
                .build();
            if let Ok(dev) = dev {
                out.push(dev);
            }
        }
    }
    out
}

fn oci(err: oci_spec::OciSpecError) -> RuntimeError {
    RuntimeError::Config(format!("build oci spec: {err}"))
}

#[cfg(test)]
#[path = "security_tests.rs"]
mod tests;
