//! A container's effective security context: its own settings over the pod's, as the
//! kubelet's `DetermineEffectiveSecurityContext`. Pure data read from the pod; what the
//! settings do to the OCI spec lives in `security` and `seccomp`, which both read this.

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};

/// The container's settings over the pod's, as `DetermineEffectiveSecurityContext`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effective {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub run_as_non_root: Option<bool>,
    pub privileged: bool,
    pub allow_privilege_escalation: Option<bool>,
    pub read_only_root_filesystem: bool,
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    pub proc_mount: Option<String>,
    /// `(type, localhostProfile)`.
    pub seccomp: Option<(String, Option<String>)>,
}

pub fn effective(pod: &Pod, container: &Container) -> Effective {
    let p: Option<&PodSecurityContext> =
        pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let c: Option<&SecurityContext> = container.security_context.as_ref();
    let caps = c.and_then(|c| c.capabilities.as_ref());
    Effective {
        run_as_user: c
            .and_then(|c| c.run_as_user)
            .or_else(|| p.and_then(|p| p.run_as_user)),
        run_as_group: c
            .and_then(|c| c.run_as_group)
            .or_else(|| p.and_then(|p| p.run_as_group)),
        run_as_non_root: c
            .and_then(|c| c.run_as_non_root)
            .or_else(|| p.and_then(|p| p.run_as_non_root)),
        privileged: c.and_then(|c| c.privileged).unwrap_or(false),
        allow_privilege_escalation: c.and_then(|c| c.allow_privilege_escalation),
        read_only_root_filesystem: c.and_then(|c| c.read_only_root_filesystem).unwrap_or(false),
        capabilities_add: caps.and_then(|c| c.add.clone()).unwrap_or_default(),
        capabilities_drop: caps.and_then(|c| c.drop.clone()).unwrap_or_default(),
        proc_mount: c.and_then(|c| c.proc_mount.clone()),
        seccomp: c
            .and_then(|c| c.seccomp_profile.as_ref())
            .or_else(|| p.and_then(|p| p.seccomp_profile.as_ref()))
            .map(|s| (s.type_.clone(), s.localhost_profile.clone())),
    }
}
