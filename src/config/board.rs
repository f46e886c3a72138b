//! Board profiles: per-board-family defaults (reservations, eviction thresholds, log
//! sizes for its storage, node labels) as YAML files in `board/`. A profile is looked
//! up in the board dir first, so a device image can ship or override one; the profiles
//! in the source tree are also compiled in, so `--board rpi4` works on a bare binary.
//! A profile only fills what the config file and the flags leave unset.

use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

use super::file::{parse_mapping, FileConfig};
use super::reader::{short, type_name};
use super::ConfigError;

/// Where installed profiles live, one `<name>.yaml` each.
pub const DEFAULT_BOARD_DIR: &str = "/usr/share/holdfast/boards";

/// The profiles compiled into the binary, by name.
pub const BUILTIN_BOARDS: &[(&str, &str)] = &[
    ("rpi4", include_str!("../../board/rpi4.yaml")),
    ("rpi3-armv7", include_str!("../../board/rpi3-armv7.yaml")),
    ("imx8m", include_str!("../../board/imx8m.yaml")),
    ("arm64-vm", include_str!("../../board/arm64-vm.yaml")),
];

/// One board family.
#[derive(Debug, Clone, PartialEq)]
pub struct BoardProfile {
    pub name: String,
    pub description: String,
    /// The Rust target triple to build holdfast for.
    pub target: String,
    /// The Yocto `MACHINE` of the board's image.
    pub yocto_machine: String,
    /// `v1`, `hybrid` or `v2`: what `holdfast check --board` expects to find mounted.
    pub cgroup_version: String,
    /// The config the board ships, merged under the config file and the flags.
    pub config: FileConfig,
    /// The file it came from, or `board/<name>.yaml (built in)`.
    pub origin: PathBuf,
}

/// Finds the profile `name` in `dir`, else among the built-in ones. Returns the profile
/// and warnings for config keys in it that holdfast ignores.
pub fn load_board(name: &str, dir: &Path) -> Result<(BoardProfile, Vec<String>), ConfigError> {
    // A name is a file stem, never a path: `--board ../../etc/x` must not read files.
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if plain {
        let path = dir.join(format!("{name}.yaml"));
        match crate::yaml::read_bounded(&path, crate::yaml::MAX_BYTES) {
            Ok(text) => return parse_board(name, &path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ConfigError::File {
                    path,
                    reason: format!("read: {e}"),
                })
            }
        }
        if let Some((_, text)) = BUILTIN_BOARDS.iter().find(|(n, _)| *n == name) {
            let origin = PathBuf::from(format!("board/{name}.yaml (built in)"));
            return parse_board(name, &origin, text);
        }
    }
    Err(ConfigError::UnknownBoard {
        name: name.to_string(),
        known: known_boards(dir).join(", "),
        dir: dir.to_path_buf(),
    })
}

/// The built-in profiles and those in `dir`, sorted, without repeats.
pub fn known_boards(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = BUILTIN_BOARDS.iter().map(|(n, _)| n.to_string()).collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
        names.extend(entries.filter_map(Result::ok).filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            file.strip_suffix(".yaml").map(str::to_string)
        }));
    }
    names.sort();
    names.dedup();
    names
}

/// Parses profile text; `origin` names it in errors. Unknown top-level keys are errors:
/// a profile is written for holdfast, so a misspelt key is a mistake, not a kubelet key.
pub fn parse_board(
    name: &str,
    origin: &Path,
    text: &str,
) -> Result<(BoardProfile, Vec<String>), ConfigError> {
    let file_err = |reason: String| ConfigError::File {
        path: origin.to_path_buf(),
        reason,
    };
    let key_err = |key: &str, reason: String| ConfigError::Key {
        path: origin.to_path_buf(),
        key: key.to_string(),
        reason,
    };
    crate::yaml::prescan(text).map_err(file_err)?;
    let top = match serde_yaml::from_str::<Value>(text) {
        Ok(Value::Mapping(m)) => m,
        Ok(_) => {
            return Err(file_err(
                "expected a mapping of keys at the top level".into(),
            ))
        }
        Err(e) => return Err(file_err(format!("not valid YAML: {e}"))),
    };
    let mut fields: [(&str, Option<String>); 5] = [
        ("name", None),
        ("description", None),
        ("target", None),
        ("yoctoMachine", None),
        ("cgroupVersion", None),
    ];
    let mut config = (FileConfig::default(), Vec::new());
    for (k, v) in &top {
        let Value::String(key) = k else {
            return Err(file_err(format!(
                "keys must be strings, found {}",
                short(k)
            )));
        };
        if key == "config" {
            config = parse_profile_config(origin, v)?;
            continue;
        }
        let Some(slot) = fields.iter_mut().find(|(n, _)| n == key) else {
            return Err(key_err(
                key,
                "unknown key (name, description, target, yoctoMachine, cgroupVersion, config)"
                    .into(),
            ));
        };
        match v {
            Value::String(s) if !s.trim().is_empty() => slot.1 = Some(s.clone()),
            other => {
                return Err(key_err(
                    key,
                    format!(
                        "expected a non-empty string, got {} {}",
                        type_name(other),
                        short(other)
                    ),
                ))
            }
        }
    }
    let [profile_name, description, target, yocto_machine, cgroup_version] =
        fields.map(|(key, v)| v.ok_or(key));
    let need = |r: Result<String, &str>| r.map_err(|key| key_err(key, "missing".into()));
    let profile_name = need(profile_name)?;
    let description = need(description)?;
    let target = need(target)?;
    let yocto_machine = need(yocto_machine)?;
    let cgroup_version = need(cgroup_version)?;
    if profile_name != name {
        return Err(key_err(
            "name",
            format!("{profile_name:?} does not match the file's name {name:?}"),
        ));
    }
    if !matches!(cgroup_version.as_str(), "v1" | "hybrid" | "v2") {
        return Err(key_err(
            "cgroupVersion",
            format!("expected v1, hybrid or v2, got {cgroup_version:?}"),
        ));
    }
    let (config, warnings) = config;
    Ok((
        BoardProfile {
            name: profile_name,
            description,
            target,
            yocto_machine,
            cgroup_version,
            config,
            origin: origin.to_path_buf(),
        },
        warnings,
    ))
}

fn parse_profile_config(
    origin: &Path,
    value: &Value,
) -> Result<(FileConfig, Vec<String>), ConfigError> {
    let mapping = match value {
        Value::Mapping(m) => m.clone(),
        Value::Null => Mapping::new(),
        other => {
            return Err(ConfigError::Key {
                path: origin.to_path_buf(),
                key: "config".into(),
                reason: format!("expected a mapping, got {}", type_name(other)),
            })
        }
    };
    let (config, warnings) = parse_mapping(origin, &mapping, "config.")?;
    // A profile naming a board would chain profiles; one level is all there is.
    for (set, key) in [
        (config.board.is_some(), "config.holdfast.board"),
        (config.board_dir.is_some(), "config.holdfast.boardDir"),
    ] {
        if set {
            return Err(ConfigError::Key {
                path: origin.to_path_buf(),
                key: key.into(),
                reason: "a board profile cannot pick a board".into(),
            });
        }
    }
    Ok((config, warnings))
}

/// `file` with what it leaves unset taken from `profile`; maps merge entry by entry,
/// the file's entry winning.
pub(super) fn fill_from_profile(file: FileConfig, profile: FileConfig) -> FileConfig {
    // Destructured so that a new field cannot be forgotten here.
    let FileConfig {
        static_pod_path,
        file_check_frequency,
        // A profile describes a board, not the server a site's manifests come from.
        pod_url: _,
        sync_frequency,
        container_log_max_size,
        container_log_max_files,
        cgroup_root,
        crash_loop_initial,
        crash_loop_max,
        crash_loop_reset,
        root_dir,
        hostname_override,
        mut system_reserved,
        mut kube_reserved,
        mut eviction_hard,
        mut node_labels,
        board: _,
        board_dir: _,
        kubeconfig,
        bootstrap_kubeconfig,
        // Nor where a site's apiservers are.
        apiservers: _,
        rotate_certificates,
        register_with_taints,
        node_status_update_frequency,
        node_status_report_frequency,
        node_lease_duration_seconds,
        port,
        max_pods,
        uplink_retry_max,
        images,
        pods,
        // A profile describes a board, not who may call its kubelet API.
        server: _,
        // Nor which proxy servers a site's node dials.
        tunnel: _,
        shutdown,
        // Nor the site's HTTP proxy.
        proxy: _,
    } = profile;
    system_reserved.extend(file.system_reserved);
    kube_reserved.extend(file.kube_reserved);
    eviction_hard.extend(file.eviction_hard);
    node_labels.extend(file.node_labels);
    FileConfig {
        static_pod_path: file.static_pod_path.or(static_pod_path),
        file_check_frequency: file.file_check_frequency.or(file_check_frequency),
        pod_url: file.pod_url,
        sync_frequency: file.sync_frequency.or(sync_frequency),
        container_log_max_size: file.container_log_max_size.or(container_log_max_size),
        container_log_max_files: file.container_log_max_files.or(container_log_max_files),
        cgroup_root: file.cgroup_root.or(cgroup_root),
        crash_loop_initial: file.crash_loop_initial.or(crash_loop_initial),
        crash_loop_max: file.crash_loop_max.or(crash_loop_max),
        crash_loop_reset: file.crash_loop_reset.or(crash_loop_reset),
        root_dir: file.root_dir.or(root_dir),
        hostname_override: file.hostname_override.or(hostname_override),
        system_reserved,
        kube_reserved,
        eviction_hard,
        node_labels,
        board: file.board,
        board_dir: file.board_dir,
        kubeconfig: file.kubeconfig.or(kubeconfig),
        bootstrap_kubeconfig: file.bootstrap_kubeconfig.or(bootstrap_kubeconfig),
        apiservers: file.apiservers,
        rotate_certificates: file.rotate_certificates.or(rotate_certificates),
        register_with_taints: file.register_with_taints.or(register_with_taints),
        node_status_update_frequency: file
            .node_status_update_frequency
            .or(node_status_update_frequency),
        node_status_report_frequency: file
            .node_status_report_frequency
            .or(node_status_report_frequency),
        node_lease_duration_seconds: file
            .node_lease_duration_seconds
            .or(node_lease_duration_seconds),
        port: file.port.or(port),
        server: file.server,
        max_pods: file.max_pods.or(max_pods),
        uplink_retry_max: file.uplink_retry_max.or(uplink_retry_max),
        images: file.images.or(images),
        pods: file.pods.or(pods),
        tunnel: file.tunnel,
        shutdown: file.shutdown.or(shutdown),
        proxy: file.proxy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::{parse_bytes, parse_millicpu};

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("holdfast-board-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_shipped_profile_parses() {
        let targets = ["aarch64-unknown-linux-gnu", "armv7-unknown-linux-gnueabihf"];
        for (name, _) in BUILTIN_BOARDS {
            let (p, warnings) =
                load_board(name, Path::new("/nonexistent")).unwrap_or_else(|e| panic!("{e}"));
            assert!(warnings.is_empty(), "{name}: {warnings:?}");
            assert_eq!(p.name, *name);
            assert!(targets.contains(&p.target.as_str()), "{name}: {}", p.target);
            assert!(!p.yocto_machine.is_empty() && !p.description.is_empty());
            let c = &p.config;
            for map in [&c.system_reserved, &c.kube_reserved] {
                assert!(parse_millicpu(&map["cpu"]).is_ok(), "{name}");
                assert!(parse_bytes(&map["memory"]).is_ok(), "{name}");
            }
            for signal in ["memory.available", "nodefs.available", "imagefs.available"] {
                assert!(c.eviction_hard.contains_key(signal), "{name}: {signal}");
            }
            assert!(c.container_log_max_size.is_some() && c.container_log_max_files.is_some());
            assert_eq!(
                c.node_labels.get("node.kubernetes.io/instance-type"),
                Some(&name.to_string())
            );
        }
        let (rpi3, _) = load_board("rpi3-armv7", Path::new("/nonexistent")).expect("rpi3");
        assert_eq!(rpi3.target, "armv7-unknown-linux-gnueabihf");
        assert_eq!(rpi3.yocto_machine, "raspberrypi3");
    }

    #[test]
    fn unknown_board_lists_the_known_ones() {
        let dir = temp_dir("unknown");
        std::fs::write(dir.join("site-gw.yaml"), "name: site-gw\n").expect("write");
        for bad in ["rpi9", "../rpi4", ""] {
            match load_board(bad, &dir) {
                Err(e @ ConfigError::UnknownBoard { .. }) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("arm64-vm, imx8m, rpi3-armv7, rpi4, site-gw"),
                        "{msg}"
                    );
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_broken_profile_names_the_file_and_the_key() {
        let dir = temp_dir("broken");
        let cases = [
            (
                "config:\n  systemReserved: {memory: lots}\n",
                "config.systemReserved.memory",
            ),
            (
                "config:\n  containerLogMaxFiles: 1\n",
                "config.containerLogMaxFiles",
            ),
            (
                "config:\n  holdfast: {board: rpi4}\n",
                "config.holdfast.board",
            ),
            ("colour: blue\n", "colour"),
            ("cgroupVersion: v3\n", "cgroupVersion"),
            ("name: other\n", "name"),
            ("target: 7\n", "target"),
        ];
        for (extra, want_key) in cases {
            // The base profile with one key replaced or added.
            let replaced = extra.split(':').next().unwrap_or("");
            let base = [
                "name: gw",
                "description: d",
                "target: aarch64-unknown-linux-gnu",
                "yoctoMachine: m",
                "cgroupVersion: v2",
            ];
            let mut text: String = base
                .iter()
                .filter(|l| !l.starts_with(&format!("{replaced}:")))
                .map(|l| format!("{l}\n"))
                .collect();
            text.push_str(extra);
            let path = dir.join("gw.yaml");
            std::fs::write(&path, text).expect("write");
            match load_board("gw", &dir) {
                Err(ConfigError::Key { path: p, key, .. }) => {
                    assert_eq!(p, path);
                    assert_eq!(key, want_key);
                }
                other => panic!("{extra:?}: {other:?}"),
            }
        }
        std::fs::write(dir.join("gw.yaml"), "name: gw\n").expect("write");
        match load_board("gw", &dir) {
            Err(ConfigError::Key { key, reason, .. }) => {
                assert_eq!(key, "description");
                assert_eq!(reason, "missing");
            }
            other => panic!("{other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_deeply_nested_or_huge_profile_is_refused_naming_the_file() {
        let dir = temp_dir("deep");
        let path = dir.join("gw.yaml");
        std::fs::write(&path, format!("name: gw\nconfig: {}", "[".repeat(60_000))).expect("write");
        let started = std::time::Instant::now();
        let deep = load_board("gw", &dir);
        let elapsed = started.elapsed();
        std::fs::write(&path, format!("name: gw\n# {}\n", "x".repeat(1024 * 1024))).expect("write");
        let huge = load_board("gw", &dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            elapsed < std::time::Duration::from_millis(200),
            "{elapsed:?}"
        );
        let deep = deep.expect_err("60 000 open brackets").to_string();
        for part in [
            path.display().to_string(),
            "nested deeper than 64 levels (line 2)".into(),
        ] {
            assert!(deep.contains(&part), "{deep}");
        }
        let huge = huge.expect_err("over 1 MiB").to_string();
        assert!(huge.contains("1048576 bytes allowed"), "{huge}");
        assert!(huge.contains(&path.display().to_string()), "{huge}");
    }

    #[test]
    fn profile_under_file_under_flags() {
        let dir = temp_dir("precedence");
        let boards = dir.join("boards");
        std::fs::create_dir_all(&boards).expect("mkdir");
        // An installed profile shadows the built-in one of the same name.
        std::fs::write(
            boards.join("rpi4.yaml"),
            "name: rpi4\ndescription: site build\ntarget: aarch64-unknown-linux-gnu
yoctoMachine: raspberrypi4-64\ncgroupVersion: v2
config:
  syncFrequency: 2m
  containerLogMaxSize: 4Mi
  containerLogMaxFiles: 2
  systemReserved: {cpu: 300m, memory: 300Mi}
  evictionHard: {memory.available: 250Mi}
  holdfast:
    rootDir: /data/holdfast
    nodeLabels: {node.kubernetes.io/instance-type: rpi4, example.com/site: board}
",
        )
        .expect("write");
        let cfg = dir.join("config.yaml");
        std::fs::write(
            &cfg,
            "containerLogMaxFiles: 4
systemReserved: {memory: 512Mi}
holdfast:
  board: rpi4
  boardDir: boards
  hostnameOverride: gw-1
  nodeLabels: {example.com/site: file}
",
        )
        .expect("write");
        let c = cfg.display().to_string();

        let (config, warnings) =
            crate::config::load_run_args(&args(&["--config", &c])).expect("load");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(config.board.as_deref(), Some("rpi4"));
        // From the profile: what the file leaves unset.
        assert_eq!(config.sync_frequency, std::time::Duration::from_secs(120));
        assert_eq!(config.container_log_max_size, 4 * 1024 * 1024);
        assert_eq!(config.root_dir, PathBuf::from("/data/holdfast"));
        assert_eq!(config.eviction_hard["memory.available"], "250Mi");
        assert_eq!(config.system_reserved["cpu"], "300m");
        // From the file, over the profile.
        assert_eq!(config.container_log_max_files, 4);
        assert_eq!(config.system_reserved["memory"], "512Mi");
        assert_eq!(config.node_labels["example.com/site"], "file");
        assert_eq!(
            config.node_labels["node.kubernetes.io/instance-type"],
            "rpi4"
        );

        // Flags over both.
        let (config, _) = crate::config::load_run_args(&args(&[
            "--config",
            &c,
            "--root-dir=/flag/root",
            "--system-reserved=memory=1Gi",
            "--node-labels",
            "example.com/site=flag",
        ]))
        .expect("load");
        assert_eq!(config.root_dir, PathBuf::from("/flag/root"));
        assert_eq!(config.system_reserved["memory"], "1Gi");
        assert_eq!(config.system_reserved["cpu"], "300m");
        assert_eq!(config.node_labels["example.com/site"], "flag");

        // A flag picks the board over the file; the built-in one serves when the board
        // dir has none.
        let (config, _) =
            crate::config::load_run_args(&args(&["--config", &c, "--board", "imx8m"]))
                .expect("load");
        assert_eq!(config.board.as_deref(), Some("imx8m"));
        assert_eq!(
            config.node_labels["node.kubernetes.io/instance-type"],
            "imx8m"
        );
        assert_eq!(config.eviction_hard["memory.available"], "150Mi");

        match crate::config::load_run_args(&args(&["--config", &c, "--board=nope"])) {
            Err(ConfigError::UnknownBoard { name, known, .. }) => {
                assert_eq!(name, "nope");
                assert!(known.contains("rpi4"), "{known}");
            }
            other => panic!("{other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
