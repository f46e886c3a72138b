//! The container's seccomp filter for a command run by exec (`kubectl exec`, exec
//! probes and hooks). Runs in the exec process (see [`super::exec_shim`]).
//!
//! libcontainer 0.7's exec leaves the container's `linux.seccomp` out of the process it
//! starts, so the command would run unfiltered in a filtered container. As runc's exec
//! does, the command gets the container's filter: [`lend`] gives the process
//! CAP_SYS_ADMIN (a filter is loaded without no_new_privs only with it) and
//! CAP_SETPCAP (to drop from the bounding set afterwards) on top of its own, and the
//! [`Filtered`] executor loads the filter in the process right before its exec, then
//! drops back to the container's capabilities and execs.

use std::collections::HashSet;

use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use oci_spec::runtime::{Capability, LinuxCapabilities, LinuxSeccomp, Process, Spec};

/// The executor of a command in a filtered container.
#[derive(Clone)]
pub struct Filtered {
    // Never built without the `seccomp` feature (see [`lend`]).
    #[cfg_attr(not(feature = "seccomp"), allow(dead_code))]
    seccomp: LinuxSeccomp,
    /// The container's own capabilities, which the command ends with.
    caps: LinuxCapabilities,
}

/// For a container whose spec has a filter: lends `process` the capabilities that
/// loading it takes, and returns the executor that loads it. None without a filter.
pub fn lend(spec: &Spec, process: &mut Process) -> Option<Filtered> {
    // A build without seccomp refuses such containers (see `seccomp`).
    if !super::seccomp::SUPPORTED {
        return None;
    }
    let seccomp = spec.linux().as_ref()?.seccomp().clone()?;
    let caps = process.capabilities().clone().unwrap_or_default();
    let with = |set: &Option<HashSet<Capability>>| {
        let mut set = set.clone().unwrap_or_default();
        set.extend([Capability::SysAdmin, Capability::Setpcap]);
        Some(set)
    };
    let mut lent = caps.clone();
    lent.set_bounding(with(caps.bounding()))
        .set_effective(with(caps.effective()))
        .set_permitted(with(caps.permitted()));
    process.set_capabilities(Some(lent));
    Some(Filtered { seccomp, caps })
}

impl Executor for Filtered {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        #[cfg(feature = "seccomp")]
        libcontainer::seccomp::initialize_seccomp(&self.seccomp).map_err(|e| {
            ExecutorError::Other(format!("load the container's seccomp filter: {e}"))
        })?;
        let syscall = libcontainer::syscall::syscall::create_syscall();
        libcontainer::capabilities::drop_privileges(&self.caps, syscall.as_ref())
            .map_err(|e| ExecutorError::Other(format!("drop capabilities: {e}")))?;
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_filtered_container_lends_capabilities() {
        let mut spec = Spec::default();
        let mut process = Process::default();
        let own: HashSet<Capability> = [Capability::Chown].into();
        let mut caps = LinuxCapabilities::default();
        caps.set_bounding(Some(own.clone()))
            .set_effective(Some(own.clone()))
            .set_permitted(Some(own.clone()));
        process.set_capabilities(Some(caps.clone()));
        if let Some(linux) = spec.linux_mut() {
            linux.set_seccomp(None);
        }
        assert!(lend(&spec, &mut process).is_none());
        assert_eq!(process.capabilities().as_ref(), Some(&caps));

        if let Some(linux) = spec.linux_mut() {
            linux.set_seccomp(Some(LinuxSeccomp::default()));
        }
        let lent = lend(&spec, &mut process);
        assert_eq!(lent.is_some(), crate::runtime::seccomp::SUPPORTED);
        let Some(filtered) = lent else { return };
        assert_eq!(filtered.caps, caps, "the command ends with its own");
        let lent = process.capabilities().clone().unwrap_or_default();
        for set in [lent.bounding(), lent.effective(), lent.permitted()] {
            let set = set.clone().unwrap_or_default();
            assert!(set.contains(&Capability::Chown));
            assert!(set.contains(&Capability::SysAdmin));
            assert!(set.contains(&Capability::Setpcap));
        }
    }
}
