//! Kernel feature checks: namespaces, overlayfs, veth and bridge, seccomp.

use super::kconfig::KernelConfig;
use super::{Facts, Item, Status};

/// Whether this build can apply seccomp profiles: the `seccomp` cargo feature links
/// libcontainer's libseccomp support.
const SECCOMP_IN_BUILD: bool = cfg!(feature = "seccomp");

/// Whether every option is `=y` or `=m`, and the line that says so (or names the ones
/// that are not).
pub fn config_verdict(k: &KernelConfig, options: &[&str]) -> (bool, String) {
    let missing: Vec<&str> = options.iter().copied().filter(|o| !k.enabled(o)).collect();
    let shown = if missing.is_empty() {
        options.to_vec()
    } else {
        missing.clone()
    };
    let detail = shown
        .iter()
        .map(|o| k.describe(o))
        .collect::<Vec<_>>()
        .join(", ");
    (missing.is_empty(), detail)
}

pub fn with_hint(detail: String, hint: &str) -> String {
    if hint.is_empty() {
        detail
    } else {
        format!("{detail}: {hint}")
    }
}

/// One kernel feature: `live` is what the running system shows (`None` when it could
/// not be asked), `options` what a kernel config must enable. See the module doc of
/// `check` for which of the two decides.
fn feature(
    f: &Facts,
    name: &str,
    live: Option<(bool, String)>,
    options: &[&str],
    hint: &str,
) -> Item {
    let config = f
        .kernel_config
        .as_ref()
        .map(|(_, k)| config_verdict(k, options));
    let live = if f.config_decides { None } else { live };
    match (live, config) {
        (Some((true, d)), _) | (None, Some((true, d))) => Item::new(name, Status::Ok, d),
        (Some((false, d)), config) => {
            let kernel = config.map_or_else(String::new, |(_, c)| format!(" (kernel config: {c})"));
            Item::new(
                name,
                Status::Missing,
                with_hint(format!("{d}{kernel}"), hint),
            )
        }
        (None, Some((false, d))) => Item::new(name, Status::Missing, with_hint(d, hint)),
        (None, None) => Item::new(
            name,
            Status::Missing,
            "cannot tell: the system could not be probed and no kernel config was found",
        ),
    }
}

pub fn namespaces(f: &Facts, required: &mut Vec<Item>, optional: &mut Vec<Item>) {
    let ns = |entry: &str| {
        f.namespaces.as_ref().map(|set| {
            if set.contains(entry) {
                (true, format!("/proc/self/ns/{entry}"))
            } else {
                (false, format!("no /proc/self/ns/{entry}"))
            }
        })
    };
    // Mount namespaces exist in every kernel that has namespaces at all; there is no
    // option of their own.
    for (name, entry, option) in [
        ("pid namespace", "pid", "CONFIG_PID_NS"),
        ("mount namespace", "mnt", "CONFIG_NAMESPACES"),
        ("ipc namespace", "ipc", "CONFIG_IPC_NS"),
        ("uts namespace", "uts", "CONFIG_UTS_NS"),
        ("network namespace", "net", "CONFIG_NET_NS"),
    ] {
        let options: &[&str] = if option == "CONFIG_NAMESPACES" {
            &["CONFIG_NAMESPACES"]
        } else {
            &["CONFIG_NAMESPACES", option]
        };
        required.push(feature(f, name, ns(entry), options, "every pod gets one"));
    }
    let user = ns("user").map(|(present, d)| match (present, f.max_user_namespaces) {
        (false, _) => (false, d),
        (true, Some(0)) => (
            false,
            "/proc/sys/user/max_user_namespaces is 0: set it above 0".to_string(),
        ),
        (true, Some(n)) => (true, format!("max_user_namespaces {n}")),
        (true, None) => (true, d),
    });
    optional.push(feature(
        f,
        "user namespace",
        user,
        &["CONFIG_USER_NS"],
        "pods with hostUsers: false need it",
    ));
}

pub fn filesystems_and_network(f: &Facts, required: &mut Vec<Item>, optional: &mut Vec<Item>) {
    let overlay = f.filesystems.as_ref().map(|fs| {
        let listed = fs
            .lines()
            .any(|l| l.split_whitespace().last() == Some("overlay"));
        if listed {
            (true, "overlay in /proc/filesystems".to_string())
        } else if f.modules_available.contains("overlay") {
            (true, "loadable module overlay".to_string())
        } else {
            (
                false,
                "not in /proc/filesystems and no overlay module".to_string(),
            )
        }
    });
    required.push(feature(
        f,
        "overlayfs",
        overlay,
        &["CONFIG_OVERLAY_FS"],
        "every container's rootfs is an overlay mount",
    ));
    for (name, module, option, hint) in [
        (
            "veth",
            "veth",
            "CONFIG_VETH",
            "CNI plugins give pods their interfaces with it; hostNetwork pods do without",
        ),
        (
            "bridge",
            "bridge",
            "CONFIG_BRIDGE",
            "the bridge CNI plugin needs it; hostNetwork pods do without",
        ),
    ] {
        // A built-in driver without parameters leaves no trace in /sys/module, and
        // modules.builtin is often not installed: not finding a module proves nothing
        // when a kernel config can say more.
        let known = !f.modules_present.is_empty() || !f.modules_available.is_empty();
        let live = if f.modules_present.contains(module) {
            Some((true, format!("module {module} present")))
        } else if f.modules_available.contains(module) {
            Some((true, format!("loadable module {module}")))
        } else if known && f.kernel_config.is_none() {
            Some((false, format!("no module {module} found")))
        } else {
            None
        };
        optional.push(feature(f, name, live, &[option], hint));
    }
}

pub fn seccomp(f: &Facts, optional: &mut Vec<Item>) {
    // The `Seccomp:` field exists only in kernels built with CONFIG_SECCOMP.
    let live =
        f.proc_status.as_ref().map(
            |s| match s.lines().find_map(|l| l.strip_prefix("Seccomp:")) {
                Some(mode) => (
                    true,
                    format!("Seccomp: {} in /proc/self/status", mode.trim()),
                ),
                None => (false, "no Seccomp: field in /proc/self/status".to_string()),
            },
        );
    optional.push(feature(
        f,
        "seccomp (kernel)",
        live,
        &["CONFIG_SECCOMP", "CONFIG_SECCOMP_FILTER"],
        "syscall filtering of pods needs it",
    ));
    optional.push(if SECCOMP_IN_BUILD {
        Item::new("seccomp in this build", Status::Ok, "yes")
    } else {
        Item::new(
            "seccomp in this build",
            Status::Warn,
            "no (built without libseccomp): a pod's seccompProfile is not enforced",
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(config: &str, decides: bool) -> Facts {
        Facts {
            kernel_config: Some(("test".into(), KernelConfig::parse(config))),
            config_decides: decides,
            ..Facts::default()
        }
    }

    #[test]
    fn config_decides_over_live_probes() {
        let mut f = facts("CONFIG_OVERLAY_FS=m\n", true);
        f.filesystems = Some("nodev\tproc\n".into());
        let (mut req, mut opt) = (Vec::new(), Vec::new());
        filesystems_and_network(&f, &mut req, &mut opt);
        assert_eq!(req[0].status, Status::Ok, "{:?}", req[0]);
        assert_eq!(req[0].detail, "CONFIG_OVERLAY_FS=m");
    }

    #[test]
    fn live_probe_decides_without_a_given_config() {
        let mut f = facts("# CONFIG_OVERLAY_FS is not set\n", false);
        f.filesystems = Some("nodev\tproc\nnodev\toverlay\n".into());
        let (mut req, mut opt) = (Vec::new(), Vec::new());
        filesystems_and_network(&f, &mut req, &mut opt);
        assert_eq!(req[0].status, Status::Ok);

        f.filesystems = Some("nodev\tproc\n".into());
        f.modules_available = ["overlay".to_string()].into();
        let (mut req, mut opt) = (Vec::new(), Vec::new());
        filesystems_and_network(&f, &mut req, &mut opt);
        assert_eq!(req[0].status, Status::Ok);
        assert!(req[0].detail.contains("loadable"), "{}", req[0].detail);
    }

    #[test]
    fn user_namespaces_switched_off() {
        let mut f = facts("CONFIG_NAMESPACES=y\nCONFIG_USER_NS=y\n", false);
        f.namespaces = Some(["user".to_string(), "pid".to_string()].into());
        f.max_user_namespaces = Some(0);
        let (mut req, mut opt) = (Vec::new(), Vec::new());
        namespaces(&f, &mut req, &mut opt);
        let user = opt
            .iter()
            .find(|i| i.name == "user namespace")
            .expect("user");
        assert_eq!(user.status, Status::Missing);
        assert!(
            user.detail.contains("max_user_namespaces"),
            "{}",
            user.detail
        );
        let ipc = req.iter().find(|i| i.name == "ipc namespace").expect("ipc");
        assert_eq!(ipc.status, Status::Missing);
        assert!(
            ipc.detail.contains("CONFIG_IPC_NS not set"),
            "{}",
            ipc.detail
        );
    }
}
