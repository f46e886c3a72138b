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

/// An image whose config sets `env`, with a command so the spec needs nothing else.
fn image_with_env(env: Vec<String>) -> ImageConfiguration {
    ImageConfigurationBuilder::default()
        .config(
            ConfigBuilder::default()
                .cmd(vec!["/bin/true".to_string()])
                .env(env)
                .build()
                .expect("config"),
        )
        .build()
        .expect("image")
}

/// `build` of a plain container with `own` env and `image`: its error's status message.
fn build_env(own: &[(String, String)], image: &ImageConfiguration) -> Result<Spec, String> {
    let p = pod(true);
    let c = Container {
        name: "c".into(),
        ..Default::default()
    };
    let input = SpecInput {
        pod: &p,
        container: &c,
        env: own,
        image,
        user: (0, 0),
        rootfs: Path::new("/r"),
        cgroups_path: "/h/x",
        hosts: Path::new("/h"),
        resolv_conf: Path::new("/r"),
        hostname_file: Path::new("/n"),
        nofile_hard_limit: NOFILE,
    };
    build(&input).map_err(|e| {
        assert_eq!(e.reason(), "CreateContainerConfigError", "{e}");
        e.status_message()
    })
}

#[test]
fn the_images_env_counts_into_the_bounds_of_the_environment() {
    // One variable past MAX_ARG_STRLEN ("BIG=" + value + NUL): no execve takes it.
    let big = format!("BIG={}", "x".repeat(command::MAX_ARG_STRLEN));
    let err = build_env(&[], &image_with_env(vec![big])).expect_err("one var too long");
    assert!(
        err.starts_with("the image's env \"BIG\" would take 131077 bytes"),
        "{err}"
    );
    assert!(!err.contains("xxxx"), "no value in the message: {err}");

    // Each within its bound, nine of them past 1 MiB together.
    let fits = command::MAX_ARG_STRLEN - 16;
    let many: Vec<String> = (0..9)
        .map(|i| format!("V{i}={}", "y".repeat(fits)))
        .collect();
    let err = build_env(&[], &image_with_env(many.clone())).expect_err("too much in all");
    assert!(err.contains("with the image's env \"V8\""), "{err}");
    assert!(err.contains("1048576 bytes (1 MiB)"), "{err}");

    // The same, with the container's own variables adding the rest: together refused.
    let own: Vec<(String, String)> = (0..4)
        .map(|i| (format!("O{i}"), "z".repeat(fits)))
        .collect();
    let err = build_env(&own, &image_with_env(many[..5].to_vec())).expect_err("together");
    assert!(err.contains("with the image's env \"V4\""), "{err}");

    // Variables the container sets replace the image's and count once.
    let own: Vec<(String, String)> = (0..5)
        .map(|i| (format!("V{i}"), "z".repeat(fits)))
        .collect();
    let spec = build_env(&own, &image_with_env(many[..7].to_vec())).expect("fits");
    let env = spec
        .process()
        .as_ref()
        .and_then(|p| p.env().clone())
        .unwrap_or_default();
    assert_eq!(env.len(), 8, "PATH and V0..V6");
    assert!(env.iter().any(|e| e.starts_with("V0=zzz")));
    assert!(env.iter().any(|e| e.starts_with("V6=yyy")));
}

#[test]
fn a_long_name_is_cut_in_the_message() {
    let name = "N".repeat(200_000);
    let err = build_env(&[], &image_with_env(vec![format!("{name}=1")])).expect_err("too long");
    assert!(err.len() < 400, "{} bytes: {err}", err.len());
    assert!(err.contains("... (200000 bytes)"), "{err}");
}

#[test]
fn a_hundred_thousand_image_variables_merge_in_linear_time() {
    // 100 000 distinct names in 1 MiB: the merge looked each one up in a list, which
    // took minutes; by name it is a fraction of a second.
    let env: Vec<String> = (0..100_000).map(|i| format!("V{i}=")).collect();
    let image = image_with_env(env);
    let began = std::time::Instant::now();
    let spec = build_env(&[], &image).expect("within 1 MiB");
    let n = spec
        .process()
        .as_ref()
        .and_then(|p| p.env().as_ref())
        .map_or(0, Vec::len);
    assert_eq!(n, 100_001);
    assert!(
        began.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );
}
