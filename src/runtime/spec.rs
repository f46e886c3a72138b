//! The OCI runtime spec of one container, built from its pod without IO: namespaces,
//! mounts, capabilities and device rules follow containerd's defaults; resources follow
//! the kubelet's formulas.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};
use oci_spec::image::ImageConfiguration;
use oci_spec::runtime::{
    Capability, Linux, LinuxBuilder, LinuxCapabilities, LinuxCapabilitiesBuilder, LinuxCpuBuilder,
    LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxMemoryBuilder, LinuxNamespaceBuilder,
    LinuxNamespaceType, LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimitBuilder,
    PosixRlimitType, Process, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use super::{command, RuntimeError};
use crate::quantity;

/// The kubelet's CFS period.
const CPU_PERIOD: u64 = 100_000;
/// The kubelet's `MinShares`.
const MIN_SHARES: u64 = 2;
/// The kubelet's `MinQuotaPeriod` (1 ms).
const MIN_QUOTA: i64 = 1000;
const NOFILE: u64 = 1_048_576;

/// Everything the spec depends on besides the pod.
pub struct SpecInput<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    /// The container's own environment, resolved (secret values: never log it).
    pub env: &'a [(String, String)],
    pub image: &'a ImageConfiguration,
    /// The image's `User`, already resolved to numeric ids.
    pub user: (u32, u32),
    pub rootfs: &'a Path,
    /// `<cgroup root>/<id>`.
    pub cgroups_path: &'a str,
    /// Files bind-mounted read-only at /etc/hosts, /etc/resolv.conf and /etc/hostname.
    pub hosts: &'a Path,
    pub resolv_conf: &'a Path,
    pub hostname_file: &'a Path,
    /// The caller's hard NOFILE limit: without CAP_SYS_RESOURCE nothing can go above it.
    pub nofile_hard_limit: u64,
}

/// What a pod's containers see as their hostname: the node's for a host-network pod
/// (which shares the host's UTS namespace), else the pod's name.
pub fn hostname(pod: &Pod, node_name: &str) -> String {
    if host_network(pod) {
        node_name.to_owned()
    } else {
        pod.metadata.name.clone().unwrap_or_default()
    }
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Whether the container asks for nothing: the kubelet gives such BestEffort
/// containers an OOM score of 1000 so they go first.
pub fn is_best_effort(container: &Container) -> bool {
    container.resources.as_ref().is_none_or(|r| {
        r.requests.as_ref().is_none_or(|m| m.is_empty())
            && r.limits.as_ref().is_none_or(|m| m.is_empty())
    })
}

/// The most the whole environment of a container may take, every `NAME=value` and its
/// NUL added up, the image's `Env` with the container's own: half of execve's 2 MiB for
/// both, the command line's [`command::MAX_ARGV_BYTES`] being the other half. The
/// pod's own variables are held to the same 1 MiB before they get here.
pub const MAX_ENV_BYTES: usize = 1024 * 1024;

/// Longest a variable name is quoted in a message: a name may be most of 128 KiB.
const NAME_IN_MESSAGE: usize = 64;

/// Measures the image's `Env` with the container's own variables (`own`) before they
/// are merged: each of the image's variables within [`command::MAX_ARG_STRLEN`], the
/// whole within [`MAX_ENV_BYTES`]. The image's config is up to 4 MiB of JSON from a
/// registry or a tar, which can hold a million small variables; the merge would copy
/// each. An image variable the container sets too does not count (the container's
/// value replaces it); a name the image sets twice counts twice, since knowing it would
/// take a set as large as what is being bounded. Errors name variables, never values.
pub fn check_environment(
    own: &[(String, String)],
    image: Option<&oci_spec::image::Config>,
) -> Result<(), RuntimeError> {
    let entry = |name: &str, value: &str| name.len().saturating_add(value.len()).saturating_add(2);
    let own_names: HashSet<&str> = own.iter().map(|(n, _)| n.as_str()).collect();
    let mut total = own
        .iter()
        .fold(0usize, |sum, (n, v)| sum.saturating_add(entry(n, v)));
    let mut path = own_names.contains("PATH");
    for var in image.and_then(|c| c.env().as_deref()).unwrap_or_default() {
        let (name, value) = var.split_once('=').unwrap_or((var.as_str(), ""));
        let bytes = entry(name, value);
        if bytes > command::MAX_ARG_STRLEN {
            return Err(RuntimeError::Config(format!(
                "the image's env {} would take {bytes} bytes (NAME=value), more than the \
                 {} bytes one variable may take (the kernel's MAX_ARG_STRLEN): rebuild the \
                 image without it",
                quoted(name),
                command::MAX_ARG_STRLEN
            )));
        }
        if own_names.contains(name) {
            continue;
        }
        path |= name == "PATH";
        total = total.saturating_add(bytes);
        if total > MAX_ENV_BYTES {
            return Err(RuntimeError::Config(format!(
                "environment would take {total} bytes with the image's env {}, more than \
                 the {MAX_ENV_BYTES} bytes (1 MiB) the image's Env and the container's env \
                 and envFrom may take together: trim the image's Env, or mount large \
                 values as a volume instead",
                quoted(name)
            )));
        }
    }
    if !path {
        total = total.saturating_add(entry("PATH", command::DEFAULT_PATH));
    }
    if total > MAX_ENV_BYTES {
        return Err(RuntimeError::Config(format!(
            "environment would take {total} bytes with the default PATH, more than the \
             {MAX_ENV_BYTES} bytes (1 MiB) a container's environment may take"
        )));
    }
    Ok(())
}

/// `name` quoted for a message, cut to [`NAME_IN_MESSAGE`] characters.
fn quoted(name: &str) -> String {
    match name.char_indices().nth(NAME_IN_MESSAGE) {
        Some((at, _)) => format!("{:?}... ({} bytes)", &name[..at], name.len()),
        None => format!("{name:?}"),
    }
}

/// The container's OCI spec with containerd's defaults; `security::apply` then applies
/// its security context.
pub fn build(input: &SpecInput<'_>) -> Result<Spec, RuntimeError> {
    let image = input.image.config().as_ref();
    check_environment(input.env, image)?;
    let (env, own_env) = command::environment(input.env, image)?;
    let args = command::argv(input.container, image, &own_env)?;
    let cwd = working_dir(input.container, image)?;
    let process = process(input, args, env, cwd)?;
    let host_net = host_network(input.pod);
    let linux = linux(input, host_net)?;
    let mut builder = SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path(input.rootfs)
                .readonly(false)
                .build()
                .map_err(oci)?,
        )
        .process(process)
        .mounts(mounts(input)?)
        .linux(linux);
    if !host_net {
        builder = builder.hostname(hostname(input.pod, ""));
    }
    let mut spec = builder.build().map_err(oci)?;
    if host_net {
        // The builder starts from a default hostname; sharing the host's UTS
        // namespace, the container may not set one.
        spec.set_hostname(None);
    }
    Ok(spec)
}

/// The container's `workingDir`, else the image's, else `/`; it must be absolute.
fn working_dir(
    container: &Container,
    image: Option<&oci_spec::image::Config>,
) -> Result<String, RuntimeError> {
    let cwd = container
        .working_dir
        .clone()
        .filter(|w| !w.is_empty())
        .or_else(|| {
            image
                .and_then(|c| c.working_dir().clone())
                .filter(|w| !w.is_empty())
        })
        .unwrap_or_else(|| "/".to_owned());
    if !cwd.starts_with('/') {
        return Err(RuntimeError::Config(format!(
            "working directory {cwd:?} is not absolute"
        )));
    }
    Ok(cwd)
}

/// containerd's default capabilities, before `security::apply` adds and drops.
fn default_capabilities() -> Result<LinuxCapabilities, RuntimeError> {
    let caps: HashSet<Capability> = [
        Capability::Chown,
        Capability::DacOverride,
        Capability::Fsetid,
        Capability::Fowner,
        Capability::Mknod,
        Capability::NetRaw,
        Capability::Setgid,
        Capability::Setuid,
        Capability::Setfcap,
        Capability::Setpcap,
        Capability::NetBindService,
        Capability::SysChroot,
        Capability::Kill,
        Capability::AuditWrite,
    ]
    .into_iter()
    .collect();
    LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .permitted(caps)
        .inheritable(HashSet::new())
        .ambient(HashSet::new())
        .build()
        .map_err(oci)
}

/// The process: its user, command, environment, directory, capabilities and limits.
fn process(
    input: &SpecInput<'_>,
    args: Vec<String>,
    env: Vec<String>,
    cwd: String,
) -> Result<Process, RuntimeError> {
    let container = input.container;
    let capabilities = default_capabilities()?;
    let nofile = NOFILE.min(input.nofile_hard_limit);
    ProcessBuilder::default()
        // A terminal comes through the shim's console socket (see `shim`).
        .terminal(container.tty.unwrap_or(false))
        .user(
            UserBuilder::default()
                .uid(input.user.0)
                .gid(input.user.1)
                .build()
                .map_err(oci)?,
        )
        .args(args)
        .env(env)
        .cwd(cwd)
        .capabilities(capabilities)
        // `security::apply` decides it (absent unless the pod forbids escalation).
        .no_new_privileges(false)
        .rlimits(vec![PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitNofile)
            .soft(nofile)
            .hard(nofile)
            .build()
            .map_err(oci)?])
        .build()
        .map_err(oci)
}

/// The namespaces, cgroup, resources and masked and read-only paths.
fn linux(input: &SpecInput<'_>, host_net: bool) -> Result<Linux, RuntimeError> {
    let mut ns_types = vec![
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Ipc,
    ];
    if !host_net {
        ns_types.push(LinuxNamespaceType::Uts);
    }
    let namespaces = ns_types
        .into_iter()
        .map(|t| LinuxNamespaceBuilder::default().typ(t).build().map_err(oci))
        .collect::<Result<Vec<_>, _>>()?;

    LinuxBuilder::default()
        .namespaces(namespaces)
        .cgroups_path(PathBuf::from(input.cgroups_path))
        .resources(resources(input.container)?)
        .masked_paths(strings(&[
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/proc/scsi",
            "/sys/firmware",
            "/sys/devices/virtual/powercap",
        ]))
        .readonly_paths(strings(&[
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger",
        ]))
        .build()
        .map_err(oci)
}

fn resources(container: &Container) -> Result<oci_spec::runtime::LinuxResources, RuntimeError> {
    let res = container.resources.as_ref();
    let quantity_of =
        |which: Option<
            &std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >,
         name: &str| { which.and_then(|m| m.get(name)).map(|q| q.0.clone()) };
    let limits = res.and_then(|r| r.limits.as_ref());
    let requests = res.and_then(|r| r.requests.as_ref());

    let mut builder = LinuxResourcesBuilder::default().devices(device_rules()?);
    if let Some(q) = quantity_of(limits, "memory") {
        let bytes = quantity::parse_bytes(&q).map_err(RuntimeError::Config)?;
        let limit = i64::try_from(bytes)
            .map_err(|_| RuntimeError::Config(format!("memory limit {q} is too large")))?;
        builder = builder.memory(
            LinuxMemoryBuilder::default()
                .limit(limit)
                .build()
                .map_err(oci)?,
        );
    }

    let mut cpu = LinuxCpuBuilder::default();
    // An unset request means the API server's defaulting did not run (a static pod):
    // like the kubelet, take the limit then.
    let request = quantity_of(requests, "cpu").or_else(|| quantity_of(limits, "cpu"));
    let shares = match request {
        Some(q) => (quantity::parse_millicpu(&q).map_err(RuntimeError::Config)? * 1024 / 1000)
            .max(MIN_SHARES),
        None => MIN_SHARES,
    };
    cpu = cpu.shares(shares);
    if let Some(q) = quantity_of(limits, "cpu") {
        let milli = quantity::parse_millicpu(&q).map_err(RuntimeError::Config)?;
        let quota = i64::try_from(milli.saturating_mul(CPU_PERIOD) / 1000)
            .map_err(|_| RuntimeError::Config(format!("cpu limit {q} is too large")))?
            .max(MIN_QUOTA);
        cpu = cpu.quota(quota).period(CPU_PERIOD);
    }
    builder = builder.cpu(cpu.build().map_err(oci)?);
    builder.build().map_err(oci)
}

fn device_rules() -> Result<Vec<oci_spec::runtime::LinuxDeviceCgroup>, RuntimeError> {
    let rule = |allow: bool,
                typ: LinuxDeviceType,
                major: Option<i64>,
                minor: Option<i64>,
                access: &str| {
        let mut b = LinuxDeviceCgroupBuilder::default()
            .allow(allow)
            .typ(typ)
            .access(access);
        if let Some(m) = major {
            b = b.major(m);
        }
        if let Some(m) = minor {
            b = b.minor(m);
        }
        b.build().map_err(oci)
    };
    use LinuxDeviceType::{A, B, C};
    [
        rule(false, A, None, None, "rwm"),
        // mknod of any device is allowed; using one is not (containerd's default).
        rule(true, C, None, None, "m"),
        rule(true, B, None, None, "m"),
        rule(true, C, Some(1), Some(3), "rwm"),
        rule(true, C, Some(1), Some(5), "rwm"),
        rule(true, C, Some(1), Some(7), "rwm"),
        rule(true, C, Some(1), Some(8), "rwm"),
        rule(true, C, Some(1), Some(9), "rwm"),
        rule(true, C, Some(5), Some(0), "rwm"),
        rule(true, C, Some(5), Some(2), "rwm"),
        rule(true, C, Some(136), None, "rwm"),
    ]
    .into_iter()
    .collect()
}

fn mounts(input: &SpecInput<'_>) -> Result<Vec<Mount>, RuntimeError> {
    let m = |dest: &str, typ: &str, source: &Path, options: &[&str]| {
        MountBuilder::default()
            .destination(dest)
            .typ(typ)
            .source(source)
            .options(strings(options))
            .build()
            .map_err(oci)
    };
    let p = Path::new;
    Ok(vec![
        m("/proc", "proc", p("proc"), &["nosuid", "noexec", "nodev"])?,
        m(
            "/dev",
            "tmpfs",
            p("tmpfs"),
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        m(
            "/dev/pts",
            "devpts",
            p("devpts"),
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        m(
            "/dev/shm",
            "tmpfs",
            p("shm"),
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        m(
            "/dev/mqueue",
            "mqueue",
            p("mqueue"),
            &["nosuid", "noexec", "nodev"],
        )?,
        m(
            "/sys",
            "sysfs",
            p("sysfs"),
            &["nosuid", "noexec", "nodev", "ro"],
        )?,
        m(
            "/etc/hosts",
            "bind",
            input.hosts,
            &["rbind", "ro", "nosuid", "nodev"],
        )?,
        m(
            "/etc/resolv.conf",
            "bind",
            input.resolv_conf,
            &["rbind", "ro", "nosuid", "nodev"],
        )?,
        m(
            "/etc/hostname",
            "bind",
            input.hostname_file,
            &["rbind", "ro", "nosuid", "nodev"],
        )?,
    ])
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn oci(err: oci_spec::OciSpecError) -> RuntimeError {
    RuntimeError::Config(format!("build oci spec: {err}"))
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
