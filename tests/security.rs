//! Security contexts end to end, as root, on real containers: what a container may do
//! is checked from inside it (its ids, groups, capabilities, no_new_privs, a read-only
//! root, the owner of its volume), and what it may not ask for is refused with the
//! kubelet's reasons and messages.

use std::time::Duration;

use serde_json::Value;
use support::agent::{container, line, need_root, Agent};

const WAIT: Duration = Duration::from_secs(60);

/// A host-network static pod (no CNI needed) of one container `main`.
fn pod_yaml(name: &str, script: &str, spec_extra: &str, container_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n{spec_extra}  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", {}]\n{container_extra}",
        serde_json::to_string(script).expect("json string")
    )
}

fn waiting(p: &Value) -> (String, String) {
    let w = &container(p, "main")["state"]["waiting"];
    (
        w["reason"].as_str().unwrap_or_default().to_owned(),
        w["message"].as_str().unwrap_or_default().to_owned(),
    )
}

#[test]
fn a_restricted_container_sees_only_what_it_was_given() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("sec-restricted");
    a.start();
    let script = "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); \
                  grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs):' /proc/self/status; \
                  if touch /rootfs-write 2>/dev/null; then echo root=rw; else echo root=ro; fi; \
                  touch /data/made-here && stat -c 'data=%g %A' /data && stat -c 'file=%g' /data/made-here; \
                  echo shm=$(cat /proc/sys/kernel/shm_rmid_forced); echo END; exec sleep 3600";
    a.write_manifest(
        "locked.yaml",
        &pod_yaml(
            "locked",
            script,
            "  securityContext:\n    runAsNonRoot: true\n    runAsUser: 1000\n    runAsGroup: 3000\n    \
             fsGroup: 2000\n    supplementalGroups: [4000]\n    sysctls:\n      - name: kernel.shm_rmid_forced\n        value: \"1\"\n  \
             volumes:\n    - name: data\n      emptyDir: {}\n",
            "      securityContext:\n        allowPrivilegeEscalation: false\n        \
             readOnlyRootFilesystem: true\n        capabilities:\n          drop: [ALL]\n          \
             add: [NET_BIND_SERVICE]\n      volumeMounts:\n        - name: data\n          mountPath: /data\n",
        ),
    );
    let out = a.output("locked");
    assert_eq!(line(&out, "uid="), "1000 gid=3000 groups=3000 2000 4000");
    // NET_BIND_SERVICE is capability 10; nothing else is in the bounding set. A
    // non-root process keeps no effective capability across exec.
    assert_eq!(line(&out, "CapBnd:"), "0000000000000400");
    assert_eq!(line(&out, "CapEff:"), "0000000000000000");
    assert_eq!(line(&out, "NoNewPrivs:"), "1");
    assert_eq!(line(&out, "root="), "ro");
    // fsGroup owns the volume (setgid, group-writable) and what is made in it.
    assert_eq!(line(&out, "data="), "2000 drwxrwsrwx");
    assert_eq!(line(&out, "file="), "2000");
    assert_eq!(line(&out, "shm="), "1");

    // The default: containerd's capabilities, privilege escalation allowed, as root.
    a.write_manifest(
        "plain.yaml",
        &pod_yaml(
            "plain",
            "echo uid=$(id -u); grep -E '^(CapEff|NoNewPrivs):' /proc/self/status; echo END; exec sleep 3600",
            "",
            "",
        ),
    );
    let out = a.output("plain");
    assert_eq!(line(&out, "uid="), "0");
    assert_eq!(line(&out, "CapEff:"), "00000000a80425fb");
    assert_eq!(line(&out, "NoNewPrivs:"), "0");
    a.reset();
    a.assert_clean();
}

#[test]
fn what_a_pod_may_not_ask_for_is_refused() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("sec-refused");
    a.start();
    // The image runs as root.
    a.write_manifest(
        "nonroot.yaml",
        &pod_yaml(
            "nonroot",
            "exec sleep 3600",
            "  securityContext:\n    runAsNonRoot: true\n",
            "",
        ),
    );
    a.write_manifest(
        "privileged.yaml",
        &pod_yaml(
            "privileged",
            "exec sleep 3600",
            "",
            "      securityContext:\n        privileged: true\n",
        ),
    );
    a.write_manifest(
        "sysctl.yaml",
        &pod_yaml(
            "sysctl",
            "exec sleep 3600",
            "  securityContext:\n    sysctls:\n      - name: kernel.msgmax\n        value: \"65536\"\n",
            "",
        ),
    );
    if !holdfast::runtime::seccomp::SUPPORTED {
        // A build that can load filters runs it (tests/seccomp_restricted.rs).
        a.write_manifest(
            "seccomp.yaml",
            &pod_yaml(
                "seccomp",
                "exec sleep 3600",
                "  securityContext:\n    seccompProfile:\n      type: RuntimeDefault\n",
                "",
            ),
        );
    }

    let p = a.wait_pod("nonroot", "refused to run as root", WAIT, |p| {
        waiting(p).0 == "CreateContainerConfigError"
    });
    let uid = p["pod"]["metadata"]["uid"].as_str().unwrap_or_default();
    assert_eq!(
        waiting(&p).1,
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"nonroot-node-1_default({uid})\", container: main)"
        )
    );
    assert_eq!(p["status"]["phase"], "Pending");

    let p = a.wait_pod("privileged", "rejected", WAIT, |p| {
        p["status"]["phase"] == "Failed"
    });
    let uid = p["pod"]["metadata"]["uid"].as_str().unwrap_or_default();
    assert_eq!(p["status"]["reason"], "Forbidden");
    assert_eq!(
        p["status"]["message"],
        format!("Pod was rejected: pod with UID \"{uid}\" specified privileged container, but is disallowed")
    );
    assert!(
        p["status"]["containerStatuses"].is_null(),
        "{}",
        p["status"]
    );

    let p = a.wait_pod("sysctl", "rejected", WAIT, |p| {
        p["status"]["phase"] == "Failed"
    });
    assert_eq!(p["status"]["reason"], "SysctlForbidden");
    assert_eq!(
        p["status"]["message"],
        "Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted"
    );

    if !holdfast::runtime::seccomp::SUPPORTED {
        // Never run unconfined when a profile was asked for.
        let p = a.wait_pod("seccomp", "refused", WAIT, |p| {
            waiting(p).0 == "CreateContainerError"
        });
        assert!(
            waiting(&p).1.contains("seccomp is not supported"),
            "{:?}",
            waiting(&p)
        );
    }

    // A rejected pod stays rejected across a restart, and nothing of it ever ran.
    a.kill9();
    a.start();
    let p = a.pod("privileged").expect("pod");
    assert_eq!(p["status"]["reason"], "Forbidden");
    let ran = std::fs::read_dir(a.root.join("containers"))
        .into_iter()
        .flatten()
        .count();
    assert_eq!(ran, 0, "no container of a refused pod was created");
    a.reset();
    a.assert_clean();
}

#[test]
fn privileged_runs_when_the_config_allows_it() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("sec-privileged");
    a.write_config("  allowPrivileged: true\n");
    a.start();
    a.write_manifest(
        "privileged.yaml",
        &pod_yaml(
            "privileged",
            "grep CapEff: /proc/self/status; ls /dev/null /dev/zero >/dev/null && echo devices=ok; \
             mount | grep -q ' /sys .*rw' && echo sys=rw; echo END; exec sleep 3600",
            "",
            "      securityContext:\n        privileged: true\n",
        ),
    );
    let out = a.output("privileged");
    // Every capability the agent itself holds (its bounding set, as this test's).
    let own = std::fs::read_to_string("/proc/self/status").expect("status");
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .expect("CapBnd")
        .trim()
        .to_owned();
    assert_eq!(line(&out, "CapEff:"), own, "every capability");
    assert!(out.iter().any(|l| l == "sys=rw"), "{out:?}");
    a.reset();
    a.assert_clean();
}
