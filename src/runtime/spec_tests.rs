use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use oci_spec::image::{ConfigBuilder, ImageConfiguration, ImageConfigurationBuilder};
use serde_json::Value;

use super::*;

fn pod(host_network: bool) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("web-0".into());
    pod.spec = Some(PodSpec {
        host_network: Some(host_network),
        ..Default::default()
    });
    pod
}

fn image() -> ImageConfiguration {
    ImageConfigurationBuilder::default()
        .config(
            ConfigBuilder::default()
                .entrypoint(vec!["/bin/sh".to_string(), "-c".to_string()])
                .cmd(vec!["echo hi".to_string()])
                .env(vec!["PATH=/bin".to_string()])
                .working_dir("/srv".to_string())
                .build()
                .expect("config"),
        )
        .build()
        .expect("image")
}

fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect(),
    )
}

fn spec_json(pod: &Pod, container: &Container) -> Value {
    let image = image();
    let input = SpecInput {
        pod,
        container,
        env: &[],
        image: &image,
        user: (1000, 1001),
        rootfs: Path::new("/c/bundle/rootfs"),
        cgroups_path: "/holdfast/abc",
        hosts: Path::new("/c/hosts"),
        resolv_conf: Path::new("/c/resolv.conf"),
        hostname_file: Path::new("/c/hostname"),
        nofile_hard_limit: 4096,
    };
    let spec = build(&input).expect("spec");
    serde_json::to_value(&spec).expect("json")
}

#[test]
fn host_network_pod() {
    let c = Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            limits: quantities(&[("memory", "64Mi"), ("cpu", "500m")]),
            requests: quantities(&[("cpu", "250m")]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let v = spec_json(&pod(true), &c);
    assert_eq!(
        v["process"]["args"],
        serde_json::json!(["/bin/sh", "-c", "echo hi"])
    );
    assert_eq!(v["process"]["cwd"], "/srv");
    assert_eq!(v["process"]["user"]["uid"], 1000);
    assert_eq!(v["process"]["user"]["gid"], 1001);
    assert_eq!(v["process"]["env"], serde_json::json!(["PATH=/bin"]));
    assert_eq!(v["process"]["noNewPrivileges"], false);
    assert_eq!(v["process"]["rlimits"][0]["hard"], 4096);
    let mut caps: Vec<String> =
        serde_json::from_value(v["process"]["capabilities"]["bounding"].clone()).expect("caps");
    caps.sort();
    assert_eq!(caps.len(), 14);
    assert!(caps.contains(&"CAP_NET_BIND_SERVICE".to_string()));
    assert!(!caps.contains(&"CAP_SYS_ADMIN".to_string()));
    assert!(v.get("hostname").is_none());

    let ns: Vec<&str> = v["linux"]["namespaces"]
        .as_array()
        .expect("ns")
        .iter()
        .filter_map(|n| n["type"].as_str())
        .collect();
    assert_eq!(ns, vec!["pid", "mount", "ipc"]);
    assert_eq!(v["linux"]["cgroupsPath"], "/holdfast/abc");
    assert_eq!(v["linux"]["resources"]["memory"]["limit"], 64 * 1024 * 1024);
    assert_eq!(v["linux"]["resources"]["cpu"]["quota"], 50_000);
    assert_eq!(v["linux"]["resources"]["cpu"]["period"], 100_000);
    assert_eq!(v["linux"]["resources"]["cpu"]["shares"], 256);
    assert_eq!(v["linux"]["resources"]["devices"][0]["allow"], false);

    let mounts = v["mounts"].as_array().expect("mounts");
    let dests: Vec<&str> = mounts
        .iter()
        .filter_map(|m| m["destination"].as_str())
        .collect();
    assert_eq!(
        dests,
        vec![
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/shm",
            "/dev/mqueue",
            "/sys",
            "/etc/hosts",
            "/etc/resolv.conf",
            "/etc/hostname"
        ]
    );
    let hosts = &mounts[6];
    assert_eq!(hosts["source"], "/c/hosts");
    assert!(hosts["options"]
        .as_array()
        .expect("opts")
        .contains(&Value::from("ro")));
    assert!(mounts[5]["options"]
        .as_array()
        .expect("opts")
        .contains(&Value::from("ro")));
    assert_eq!(v["root"]["path"], "/c/bundle/rootfs");
}

#[test]
fn own_uts_namespace_and_best_effort() {
    let c = Container {
        name: "c".into(),
        command: Some(vec!["/app".into()]),
        working_dir: Some("/w".into()),
        ..Default::default()
    };
    assert!(is_best_effort(&c));
    let v = spec_json(&pod(false), &c);
    assert_eq!(v["hostname"], "web-0");
    let ns: Vec<&str> = v["linux"]["namespaces"]
        .as_array()
        .expect("ns")
        .iter()
        .filter_map(|n| n["type"].as_str())
        .collect();
    assert!(ns.contains(&"uts"));
    assert_eq!(v["process"]["args"], serde_json::json!(["/app"]));
    assert_eq!(v["process"]["cwd"], "/w");
    assert_eq!(v["linux"]["resources"]["cpu"]["shares"], 2);
    assert!(v["linux"]["resources"]["cpu"].get("quota").is_none());
    assert!(v["linux"]["resources"].get("memory").is_none());
    assert_eq!(hostname(&pod(false), "node1"), "web-0");
    assert_eq!(hostname(&pod(true), "node1"), "node1");
}

#[test]
fn cpu_limit_alone_sets_shares_and_tiny_quota_is_clamped() {
    let c = Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            limits: quantities(&[("cpu", "1m")]),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(!is_best_effort(&c));
    let v = spec_json(&pod(true), &c);
    assert_eq!(v["linux"]["resources"]["cpu"]["quota"], 1000);
    assert_eq!(v["linux"]["resources"]["cpu"]["shares"], 2);
}

#[test]
fn bad_quantity_and_relative_workdir_are_config_errors() {
    let image = image();
    let bad_mem = Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            limits: quantities(&[("memory", "lots")]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let rel = Container {
        name: "c".into(),
        working_dir: Some("srv".into()),
        ..Default::default()
    };
    let p = pod(true);
    for c in [&bad_mem, &rel] {
        let input = SpecInput {
            pod: &p,
            container: c,
            env: &[],
            image: &image,
            user: (0, 0),
            rootfs: Path::new("/r"),
            cgroups_path: "/h/x",
            hosts: Path::new("/h"),
            resolv_conf: Path::new("/r"),
            hostname_file: Path::new("/n"),
            nofile_hard_limit: NOFILE,
        };
        assert!(matches!(build(&input), Err(RuntimeError::Config(_))));
    }
}
