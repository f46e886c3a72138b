//! A container's seccomp filter from its `seccompProfile`.
//!
//! - `Unconfined`, or none (the kubelet's default while `seccompDefault` is off): no
//!   filter.
//! - `RuntimeDefault`: holdfast's default, which refuses (EPERM) the system calls
//!   Docker's and containerd's default profiles refuse to a container without the
//!   matching capability, and allows the rest. containerd's profile is an allowlist
//!   of some 350 calls; this one blocks the same dangerous calls without a table
//!   that must follow every new kernel and architecture.
//! - `Localhost`: the OCI-format profile at `<root-dir>/seccomp/<localhostProfile>`,
//!   as the kubelet's `seccompProfileRoot`.
//!
//! Without the `seccomp` feature libcontainer cannot load a filter at all, and would
//! silently run the container unconfined; like containerd on a host without seccomp,
//! a container that asks for a profile is then refused ("seccomp is not supported")
//! rather than given less protection than it asked for.

use std::path::Path;

use oci_spec::runtime::LinuxSeccomp;

use super::effective::Effective;
use super::RuntimeError;

/// Calls refused unless the container holds the capability that unlocks them (as in
/// Docker's default profile); `None`: refused to every container.
const BLOCKED: &[(&str, Option<&str>)] = &[
    ("acct", Some("SYS_PACCT")),
    ("add_key", None),
    ("bpf", Some("SYS_ADMIN")),
    ("clock_adjtime", Some("SYS_TIME")),
    ("clock_settime", Some("SYS_TIME")),
    ("create_module", None),
    ("delete_module", Some("SYS_MODULE")),
    ("finit_module", Some("SYS_MODULE")),
    ("get_kernel_syms", None),
    ("get_mempolicy", Some("SYS_NICE")),
    ("init_module", Some("SYS_MODULE")),
    ("ioperm", Some("SYS_RAWIO")),
    ("iopl", Some("SYS_RAWIO")),
    ("kcmp", Some("SYS_PTRACE")),
    ("kexec_file_load", Some("SYS_BOOT")),
    ("kexec_load", Some("SYS_BOOT")),
    ("keyctl", None),
    ("lookup_dcookie", Some("SYS_ADMIN")),
    ("mbind", Some("SYS_NICE")),
    ("mount", Some("SYS_ADMIN")),
    ("move_pages", Some("SYS_NICE")),
    ("name_to_handle_at", Some("DAC_READ_SEARCH")),
    ("nfsservctl", None),
    ("open_by_handle_at", Some("DAC_READ_SEARCH")),
    ("perf_event_open", Some("SYS_ADMIN")),
    ("pivot_root", Some("SYS_ADMIN")),
    ("process_vm_readv", Some("SYS_PTRACE")),
    ("process_vm_writev", Some("SYS_PTRACE")),
    ("ptrace", Some("SYS_PTRACE")),
    ("query_module", None),
    ("quotactl", Some("SYS_ADMIN")),
    ("reboot", Some("SYS_BOOT")),
    ("request_key", None),
    ("set_mempolicy", Some("SYS_NICE")),
    ("setns", Some("SYS_ADMIN")),
    ("settimeofday", Some("SYS_TIME")),
    ("stime", Some("SYS_TIME")),
    ("swapoff", Some("SYS_ADMIN")),
    ("swapon", Some("SYS_ADMIN")),
    ("sysfs", None),
    ("_sysctl", None),
    ("umount", Some("SYS_ADMIN")),
    ("umount2", Some("SYS_ADMIN")),
    ("unshare", Some("SYS_ADMIN")),
    ("uselib", None),
    ("userfaultfd", None),
    ("ustat", None),
    ("vm86", None),
    ("vm86old", None),
];

const EPERM: u32 = 1;

/// Whether this build can load seccomp filters.
pub const SUPPORTED: bool = cfg!(feature = "seccomp");

/// The filter for a container with effective security context `sc` and capability
/// set `caps` (upper case, no `CAP_`); `root` is where Localhost profiles live.
pub fn profile(
    sc: &Effective,
    caps: &[String],
    root: &Path,
) -> Result<Option<LinuxSeccomp>, RuntimeError> {
    let Some((kind, localhost)) = &sc.seccomp else {
        return Ok(None);
    };
    if kind == "Unconfined" {
        return Ok(None);
    }
    if !SUPPORTED {
        return Err(RuntimeError::Create {
            id: String::new(),
            message: "failed to generate seccomp spec opts: seccomp is not supported".to_owned(),
        });
    }
    match kind.as_str() {
        "RuntimeDefault" => runtime_default(caps).map(Some),
        "Localhost" => {
            let name = localhost.as_deref().unwrap_or("");
            let rel = Path::new(name);
            let safe = !name.is_empty()
                && rel.is_relative()
                && rel
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !safe {
                return Err(RuntimeError::Config(format!(
                    "localhostProfile {name:?} must be a relative path without \"..\""
                )));
            }
            let path = root.join(rel);
            let text = std::fs::read(&path).map_err(|e| RuntimeError::Create {
                id: String::new(),
                message: format!(
                    "failed to generate seccomp spec opts: cannot load seccomp profile {:?}: {e}",
                    path.display().to_string()
                ),
            })?;
            serde_json::from_slice(&text)
                .map(Some)
                .map_err(|e| RuntimeError::Create {
                    id: String::new(),
                    message: format!(
                        "failed to generate seccomp spec opts: decoding seccomp profile {:?}: {e}",
                        path.display().to_string()
                    ),
                })
        }
        other => Err(RuntimeError::Config(format!(
            "unknown seccompProfile type {other:?}"
        ))),
    }
}

/// holdfast's RuntimeDefault for a container holding `caps`.
pub fn runtime_default(caps: &[String]) -> Result<LinuxSeccomp, RuntimeError> {
    let names: Vec<&str> = BLOCKED
        .iter()
        .filter(|(_, unlock)| !unlock.is_some_and(|cap| caps.iter().any(|c| c == cap)))
        .map(|(name, _)| *name)
        .collect();
    let profile = serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{
            "names": names,
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
        }],
    });
    serde_json::from_value(profile)
        .map_err(|e| RuntimeError::Config(format!("build seccomp profile: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(p: &LinuxSeccomp) -> Vec<String> {
        p.syscalls()
            .as_ref()
            .map(|s| s.iter().flat_map(|s| s.names().clone()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn capabilities_unlock_their_calls() {
        let plain = runtime_default(&["CHOWN".into()]).expect("profile");
        let b = blocked(&plain);
        assert!(b.contains(&"mount".to_string()));
        assert!(b.contains(&"ptrace".to_string()));
        assert!(b.contains(&"keyctl".to_string()));
        let admin = runtime_default(&["SYS_ADMIN".into()]).expect("profile");
        let b = blocked(&admin);
        assert!(!b.contains(&"mount".to_string()));
        assert!(b.contains(&"ptrace".to_string()));
        // Never unlocked.
        assert!(b.contains(&"keyctl".to_string()));
        let v = serde_json::to_value(&admin).expect("json");
        assert_eq!(v["defaultAction"], "SCMP_ACT_ALLOW");
        assert_eq!(v["syscalls"][0]["action"], "SCMP_ACT_ERRNO");
        assert_eq!(v["syscalls"][0]["errnoRet"], 1);
    }

    #[test]
    fn unconfined_and_unset_need_no_filter() {
        let root = Path::new("/nonexistent");
        assert!(profile(&Effective::default(), &[], root)
            .expect("none")
            .is_none());
        let sc = Effective {
            seccomp: Some(("Unconfined".into(), None)),
            ..Effective::default()
        };
        assert!(profile(&sc, &[], root).expect("unconfined").is_none());
    }

    #[test]
    fn a_profile_is_refused_or_given_never_dropped() {
        let sc = Effective {
            seccomp: Some(("RuntimeDefault".into(), None)),
            ..Effective::default()
        };
        let got = profile(&sc, &[], Path::new("/nonexistent"));
        if SUPPORTED {
            assert!(got.expect("profile").is_some());
        } else {
            let err = got.expect_err("refused");
            assert_eq!(err.reason(), "CreateContainerError");
            assert!(
                err.to_string().contains("seccomp is not supported"),
                "{err}"
            );
        }
        let escape = Effective {
            seccomp: Some(("Localhost".into(), Some("../../etc/passwd".into()))),
            ..Effective::default()
        };
        if SUPPORTED {
            assert!(profile(&escape, &[], Path::new("/r/seccomp")).is_err());
        }
    }
}
