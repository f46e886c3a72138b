//! `seccompProfile: RuntimeDefault` end to end, as root, on real containers: the Pod
//! Security `restricted` shape (RuntimeDefault, runAsNonRoot with runAsUser 1000,
//! allowPrivilegeEscalation false, drop ALL) runs with the filter loaded and a blocked
//! call refused with EPERM while ordinary work succeeds; the same without
//! allowPrivilegeEscalation false, and a root container with the default
//! capabilities, run filtered too. `unshare -U` tells a filter from none: a user
//! namespace needs no capability, so only the filter refuses it.

use std::time::Duration;

use support::agent::{condition, line, need_root, Agent};

const WAIT: Duration = Duration::from_secs(60);

const SCRIPT: &str = "echo uid=$(id -u); grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status; \
     if unshare -U true 2>/tmp/err; then echo unshare=allowed; else echo unshare=$(cat /tmp/err); fi; \
     echo work > /tmp/w && echo work=$(cat /tmp/w); echo END; exec sleep 3600";

/// An exec probe that passes only when the command runs under a filter with the
/// container's own capabilities, those of its init.
const PROBE: &str = "grep -q 'Seccomp:.*2' /proc/self/status && \
     grep -E '^Cap(Bnd|Eff|Prm)' /proc/self/status > /tmp/exec-caps && \
     grep -E '^Cap(Bnd|Eff|Prm)' /proc/1/status | cmp -s - /tmp/exec-caps";

/// A host-network static pod of one container `main` running [`SCRIPT`], with the
/// [`PROBE`] as its readiness probe: a command run by exec gets the container's filter
/// too.
fn pod_yaml(name: &str, pod_sc: &str, container_sc: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  securityContext:\n{pod_sc}  containers:\n    \
         - name: main\n      image: busybox:demo\n      command: [\"sh\", \"-c\", {}]\n      \
         readinessProbe:\n        exec:\n          command: [\"sh\", \"-c\", {}]\n        \
         periodSeconds: 1\n      securityContext:\n{container_sc}",
        serde_json::to_string(SCRIPT).expect("json string"),
        serde_json::to_string(PROBE).expect("json string")
    )
}

const RESTRICTED_POD: &str = "    runAsNonRoot: true\n    runAsUser: 1000\n    \
                              seccompProfile:\n      type: RuntimeDefault\n";
const DROP_ALL: &str = "        capabilities:\n          drop: [ALL]\n";

#[test]
fn runtime_default_runs_the_restricted_shape_and_refuses_what_it_blocks() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("seccomp-restricted");
    a.start();
    a.write_manifest(
        "restricted.yaml",
        &pod_yaml(
            "restricted",
            RESTRICTED_POD,
            &format!("        allowPrivilegeEscalation: false\n{DROP_ALL}"),
        ),
    );
    // Escalation allowed: the filter is loaded before the capabilities are dropped.
    a.write_manifest(
        "escalating.yaml",
        &pod_yaml("escalating", RESTRICTED_POD, DROP_ALL),
    );
    a.write_manifest(
        "rootdefault.yaml",
        &pod_yaml(
            "rootdefault",
            "    seccompProfile:\n      type: RuntimeDefault\n",
            "        {}\n",
        ),
    );
    a.write_manifest(
        "unconfined.yaml",
        &pod_yaml(
            "unconfined",
            "    seccompProfile:\n      type: Unconfined\n",
            "        {}\n",
        ),
    );

    let eperm = "unshare: unshare(0x10000000): Operation not permitted";
    for (name, uid, nnp, cap_eff) in [
        ("restricted", "1000", "1", "0000000000000000"),
        ("escalating", "1000", "0", "0000000000000000"),
        ("rootdefault", "0", "0", "00000000a80425fb"),
    ] {
        let out = a.output(name);
        assert_eq!(line(&out, "uid="), uid, "{name}: {out:?}");
        assert_eq!(line(&out, "Seccomp:"), "2", "{name}: filter mode: {out:?}");
        assert_eq!(line(&out, "NoNewPrivs:"), nnp, "{name}: {out:?}");
        assert_eq!(line(&out, "CapEff:"), cap_eff, "{name}: {out:?}");
        assert_eq!(line(&out, "unshare="), eperm, "{name}: {out:?}");
        assert_eq!(line(&out, "work="), "work", "{name}: {out:?}");
        a.wait_pod(name, "Ready: its exec probe runs filtered", WAIT, |p| {
            condition(p, "Ready")["status"] == "True"
        });
    }
    // Without the filter the same call is allowed: it is the filter that refuses it.
    let out = a.output("unconfined");
    assert_eq!(line(&out, "Seccomp:"), "0", "{out:?}");
    assert_eq!(line(&out, "unshare="), "allowed", "{out:?}");

    a.reset();
    a.assert_clean();
}
