use k8s_openapi::api::core::v1::{
    Capabilities, Container, Pod, PodSecurityContext, PodSpec, SecurityContext, Sysctl,
};
use oci_spec::image::{ConfigBuilder, ImageConfigurationBuilder};
use serde_json::Value;

use super::*;
use crate::runtime::spec::{build, SpecInput};

fn pod(psc: Option<PodSecurityContext>) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("web".into());
    pod.metadata.namespace = Some("edge".into());
    pod.metadata.uid = Some("u-1".into());
    pod.spec = Some(PodSpec {
        security_context: psc,
        ..PodSpec::default()
    });
    pod
}

fn container(sc: Option<SecurityContext>) -> Container {
    Container {
        name: "app".into(),
        command: Some(vec!["sleep".into(), "1".into()]),
        security_context: sc,
        ..Container::default()
    }
}

fn host() -> Host {
    Host {
        cap_last_cap: 40,
        bounding: u64::MAX,
        devices: Vec::new(),
        seccomp_root: "/nonexistent/seccomp".into(),
    }
}

fn spec_json(pod: &Pod, c: &Container) -> Result<Value, RuntimeError> {
    let image = ImageConfigurationBuilder::default()
        .config(
            ConfigBuilder::default()
                .env(vec!["PATH=/bin".to_string()])
                .build()
                .expect("config"),
        )
        .build()
        .expect("image");
    let mut spec = build(&SpecInput {
        pod,
        container: c,
        env: &[],
        image: &image,
        user: (1000, 1000),
        rootfs: std::path::Path::new("/c/rootfs"),
        cgroups_path: "/holdfast/x",
        hosts: std::path::Path::new("/c/hosts"),
        resolv_conf: std::path::Path::new("/c/resolv.conf"),
        hostname_file: std::path::Path::new("/c/hostname"),
        nofile_hard_limit: 1024,
    })?;
    let sc = effective(pod, c);
    apply(&mut spec, pod, &sc, &additional_gids(pod, &[]), &host())?;
    Ok(serde_json::to_value(&spec).expect("json"))
}

fn caps(v: &Value, set: &str) -> Vec<String> {
    let mut out: Vec<String> = v["process"]["capabilities"][set]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
fn default_caps_are_containerds() {
    let v = spec_json(&pod(None), &container(None)).expect("spec");
    let mut want: Vec<String> = DEFAULT_CAPS.iter().map(|c| format!("CAP_{c}")).collect();
    want.sort();
    assert_eq!(caps(&v, "bounding"), want);
    assert_eq!(caps(&v, "effective"), want);
    // Absent, not false: libcontainer then loads a seccomp filter before it drops
    // capabilities.
    assert!(
        v["process"].get("noNewPrivileges").is_none(),
        "{}",
        v["process"]
    );
    assert_ne!(v["root"]["readonly"], true);
}

#[test]
fn capabilities_add_and_drop() {
    let sc = SecurityContext {
        capabilities: Some(Capabilities {
            add: Some(vec!["NET_ADMIN".into(), "cap_sys_time".into()]),
            drop: Some(vec!["NET_RAW".into(), "CAP_CHOWN".into()]),
        }),
        ..SecurityContext::default()
    };
    let v = spec_json(&pod(None), &container(Some(sc))).expect("spec");
    let b = caps(&v, "bounding");
    assert!(b.contains(&"CAP_NET_ADMIN".to_string()), "{b:?}");
    assert!(b.contains(&"CAP_SYS_TIME".to_string()), "{b:?}");
    assert!(!b.contains(&"CAP_NET_RAW".to_string()), "{b:?}");
    assert!(!b.contains(&"CAP_CHOWN".to_string()), "{b:?}");
    assert_eq!(b.len(), DEFAULT_CAPS.len());

    let drop_all = SecurityContext {
        capabilities: Some(Capabilities {
            add: Some(vec!["NET_BIND_SERVICE".into()]),
            drop: Some(vec!["ALL".into()]),
        }),
        ..SecurityContext::default()
    };
    let v = spec_json(&pod(None), &container(Some(drop_all))).expect("spec");
    assert_eq!(caps(&v, "bounding"), ["CAP_NET_BIND_SERVICE"]);
    assert_eq!(caps(&v, "permitted"), ["CAP_NET_BIND_SERVICE"]);

    let bogus = SecurityContext {
        capabilities: Some(Capabilities {
            add: Some(vec!["FLY".into()]),
            drop: None,
        }),
        ..SecurityContext::default()
    };
    let err = spec_json(&pod(None), &container(Some(bogus))).expect_err("unknown");
    assert_eq!(err.reason(), "CreateContainerConfigError");
    assert!(err.to_string().contains("CAP_FLY"), "{err}");
}

#[test]
fn privileged_gets_everything_the_kernel_has() {
    let sc = SecurityContext {
        privileged: Some(true),
        ..SecurityContext::default()
    };
    let v = spec_json(&pod(None), &container(Some(sc))).expect("spec");
    assert_eq!(caps(&v, "bounding").len(), 41);
    assert!(v["linux"].get("maskedPaths").is_none(), "{}", v["linux"]);
    assert!(v["linux"].get("readonlyPaths").is_none());
    let sys = v["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["destination"] == "/sys")
        .expect("/sys");
    let opts = sys["options"].to_string();
    assert!(
        !opts.contains("\"ro\"") && opts.contains("\"rw\""),
        "{opts}"
    );
    assert_eq!(v["linux"]["resources"]["devices"][0]["allow"], true);
    assert_eq!(
        v["linux"]["resources"]["devices"].as_array().map(Vec::len),
        Some(1)
    );
}

#[test]
fn nothing_beyond_what_holdfast_holds() {
    // Without CAP_SYS_RESOURCE (24) ourselves, "all" lacks it and asking for it fails.
    let without = Host {
        bounding: !(1 << 24),
        ..host()
    };
    let p = pod(None);
    let c = container(Some(SecurityContext {
        privileged: Some(true),
        ..SecurityContext::default()
    }));
    let image = ImageConfigurationBuilder::default().build().expect("image");
    let mut spec = build(&SpecInput {
        pod: &p,
        container: &c,
        env: &[],
        image: &image,
        user: (0, 0),
        rootfs: std::path::Path::new("/c/rootfs"),
        cgroups_path: "/holdfast/x",
        hosts: std::path::Path::new("/c/hosts"),
        resolv_conf: std::path::Path::new("/c/resolv.conf"),
        hostname_file: std::path::Path::new("/c/hostname"),
        nofile_hard_limit: 1024,
    })
    .expect("spec");
    apply(&mut spec, &p, &effective(&p, &c), &[], &without).expect("apply");
    let v = serde_json::to_value(&spec).expect("json");
    let b = caps(&v, "bounding");
    assert_eq!(b.len(), 40);
    assert!(!b.contains(&"CAP_SYS_RESOURCE".to_string()));
    let asks = container(Some(SecurityContext {
        capabilities: Some(Capabilities {
            add: Some(vec!["SYS_RESOURCE".into()]),
            drop: None,
        }),
        ..SecurityContext::default()
    }));
    let err = apply(&mut spec, &p, &effective(&p, &asks), &[], &without).expect_err("refused");
    assert!(err.to_string().contains("CAP_SYS_RESOURCE"), "{err}");
}

#[test]
fn no_new_privs_and_read_only_root() {
    let sc = SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        ..SecurityContext::default()
    };
    let v = spec_json(&pod(None), &container(Some(sc))).expect("spec");
    assert_eq!(v["process"]["noNewPrivileges"], true);
    assert_eq!(v["root"]["readonly"], true);
}

#[test]
fn groups_and_sysctls() {
    let psc = PodSecurityContext {
        fs_group: Some(2000),
        supplemental_groups: Some(vec![3000, 2000]),
        sysctls: Some(vec![
            Sysctl {
                name: "net.ipv4.ip_local_port_range".into(),
                value: "1024 2048".into(),
            },
            Sysctl {
                name: "kernel/shm_rmid_forced".into(),
                value: "1".into(),
            },
        ]),
        ..PodSecurityContext::default()
    };
    let p = pod(Some(psc));
    assert_eq!(additional_gids(&p, &[10, 3000]), [2000, 3000, 10]);
    let v = spec_json(&p, &container(None)).expect("spec");
    assert_eq!(
        v["process"]["user"]["additionalGids"],
        serde_json::json!([2000, 3000])
    );
    assert_eq!(
        v["linux"]["sysctl"]["net.ipv4.ip_local_port_range"],
        "1024 2048"
    );
    assert_eq!(v["linux"]["sysctl"]["kernel.shm_rmid_forced"], "1");
    assert_eq!(
        normalize_sysctl("net/ipv4/conf/eno2.100/rp_filter"),
        "net.ipv4.conf.eno2/100.rp_filter"
    );
    assert_eq!(
        normalize_sysctl("net.ipv4.conf.eno2/100.rp_filter"),
        "net.ipv4.conf.eno2/100.rp_filter"
    );
}

#[test]
fn proc_mount_unmasked_is_refused() {
    let sc = SecurityContext {
        proc_mount: Some("Unmasked".into()),
        ..SecurityContext::default()
    };
    let err = spec_json(&pod(None), &container(Some(sc))).expect_err("refused");
    assert_eq!(err.reason(), "CreateContainerConfigError");
}

#[test]
fn run_as_non_root_as_the_kubelet_words_it() {
    let p = pod(Some(PodSecurityContext {
        run_as_non_root: Some(true),
        ..PodSecurityContext::default()
    }));
    let c = container(None);
    let sc = effective(&p, &c);
    let msg = |user: &str| match verify_run_as_non_root(&p, &c, &sc, user) {
        Err(RuntimeError::Config(m)) => m,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        msg(""),
        "container has runAsNonRoot and image will run as root (pod: \"web_edge(u-1)\", container: app)"
    );
    assert_eq!(
        msg("0:0"),
        "container has runAsNonRoot and image will run as root (pod: \"web_edge(u-1)\", container: app)"
    );
    assert_eq!(
        msg("nobody"),
        "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: \"web_edge(u-1)\", container: app)"
    );
    assert!(verify_run_as_non_root(&p, &c, &sc, "1000").is_ok());

    let as_root = container(Some(SecurityContext {
        run_as_user: Some(0),
        ..SecurityContext::default()
    }));
    let sc = effective(&p, &as_root);
    match verify_run_as_non_root(&p, &as_root, &sc, "1000") {
        Err(RuntimeError::Config(m)) => assert_eq!(
            m,
            "container's runAsUser breaks non-root policy (pod: \"web_edge(u-1)\", container: app)"
        ),
        other => panic!("{other:?}"),
    }
    // Without runAsNonRoot nothing is checked.
    let free = pod(None);
    let sc = effective(&free, &c);
    assert!(verify_run_as_non_root(&free, &c, &sc, "").is_ok());
}

#[test]
fn the_user_is_run_as_user_over_the_images() {
    let p = pod(Some(PodSecurityContext {
        run_as_user: Some(1000),
        run_as_group: Some(3000),
        ..PodSecurityContext::default()
    }));
    let c = container(Some(SecurityContext {
        run_as_user: Some(2000),
        ..SecurityContext::default()
    }));
    let sc = effective(&p, &c);
    assert_eq!(user_string(&sc, "nobody").expect("user"), "2000:3000");
    assert_eq!(
        user_string(&Effective::default(), "app:staff").expect("user"),
        "app:staff"
    );
    let group_only = Effective {
        run_as_group: Some(5),
        ..Effective::default()
    };
    assert!(user_string(&group_only, "").is_err());
}

#[test]
fn wants_privileged_looks_at_every_container() {
    let mut p = pod(None);
    assert!(!wants_privileged(&p));
    if let Some(spec) = p.spec.as_mut() {
        spec.init_containers = Some(vec![container(Some(SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        }))]);
    }
    assert!(wants_privileged(&p));
}
