//! `holdfast run`'s command-line flags, spelled as the kubelet spells them so that
//! a unit file written for the kubelet needs few changes.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Taint;

use super::cluster::check_node_ip;
use super::maps::{check_eviction, check_label, check_reserved};
use super::taints::{check_unique, parse_taint};
use super::ConfigError;

/// The flags as given; `None` where a flag was not given, so the config file and the
/// defaults can fill in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFlags {
    pub config: Option<PathBuf>,
    pub root_dir: Option<PathBuf>,
    pub pod_manifest_path: Option<PathBuf>,
    pub hostname_override: Option<String>,
    pub verbosity: Option<u8>,
    pub board: Option<String>,
    pub board_dir: Option<PathBuf>,
    /// Entries given with `--node-labels`, `--system-reserved`, `--kube-reserved` and
    /// `--eviction-hard`; each wins over the same entry from the file or a profile.
    pub node_labels: BTreeMap<String, String>,
    pub system_reserved: BTreeMap<String, String>,
    pub kube_reserved: BTreeMap<String, String>,
    pub eviction_hard: BTreeMap<String, String>,
    pub kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig`: the credential (a bootstrap token) that asks the
    /// cluster for the node's client certificate when `--kubeconfig` has none usable.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub node_ip: Option<IpAddr>,
    /// `--register-with-taints`: replaces the file's list as a whole.
    pub register_with_taints: Option<Vec<Taint>>,
    /// `--uplink-retry-max`: wins over the file's `uplinkRetryMax`.
    pub uplink_retry_max: Option<std::time::Duration>,
    /// `--port`: the kubelet API's HTTPS port; wins over the file's `port`.
    pub port: Option<u16>,
}

/// Every flag `holdfast run` takes, spelled as it is given (`--flag value` or
/// `--flag=value`); `-v` is short for `--v`. The parser takes only these.
pub const FLAGS: &[&str] = &[
    "--config",
    "--kubeconfig",
    "--bootstrap-kubeconfig",
    "--root-dir",
    "--pod-manifest-path",
    "--hostname-override",
    "--node-ip",
    "--board",
    "--board-dir",
    "--node-labels",
    "--system-reserved",
    "--kube-reserved",
    "--eviction-hard",
    "--register-with-taints",
    "--uplink-retry-max",
    "--port",
    "--v",
];

pub const USAGE: &str = "usage: holdfast run [flags]

flags:
  --config FILE               KubeletConfiguration-shaped YAML file
  --kubeconfig FILE           how to reach the apiserver; without one, standalone
  --bootstrap-kubeconfig FILE asks the cluster for the node's client certificate
                              when the kubeconfig is missing or its certificate is
                              unusable, then writes the kubeconfig
  --root-dir DIR              state directory (default /var/lib/holdfast)
  --pod-manifest-path DIR     static pod manifests (default /etc/kubernetes/manifests)
  --hostname-override NAME    node name instead of the machine's hostname
  --node-ip IP                the node's InternalIP (default: the default route's)
  --board NAME                board profile filling what the file and flags leave unset
  --board-dir DIR             where board profiles are (default /usr/share/holdfast/boards)
  --node-labels K=V,...       labels the node carries
  --system-reserved R=Q,...   resources kept for the system (cpu=250m,memory=256Mi)
  --kube-reserved R=Q,...     resources kept for holdfast itself
  --eviction-hard S<T,...     hard eviction thresholds (memory.available<100Mi)
  --register-with-taints K=V:E,...
                              taints the node registers with; E is NoSchedule,
                              PreferNoSchedule or NoExecute
  --uplink-retry-max D        longest wait between tries to reach the apiserver
                              while it is unreachable (default 5m)
  --port N                    the kubelet API's HTTPS port (default 10250)
  --v N, -v N                 log verbosity (0 info, 2 debug, 4 trace)";

/// Parses the arguments that follow `run`. Both `--flag value` and `--flag=value`.
pub fn parse_flags(args: &[String]) -> Result<RunFlags, ConfigError> {
    let mut flags = RunFlags::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--help" || arg == "-h" {
            return Err(ConfigError::Usage(USAGE.into()));
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let canonical = canonical(arg, name)?;
        let value = match inline {
            Some(v) => v,
            None => iter.next().cloned().ok_or_else(|| ConfigError::Flag {
                flag: canonical.into(),
                reason: "needs a value".into(),
            })?,
        };
        if value.is_empty() {
            return Err(ConfigError::Flag {
                flag: canonical.into(),
                reason: "empty value".into(),
            });
        }
        set_flag(&mut flags, canonical, value)?;
    }
    Ok(flags)
}

/// The flag `name` (from `arg`) as `FLAGS` lists it; `-v` is `--v`.
fn canonical<'a>(arg: &str, name: &'a str) -> Result<&'a str, ConfigError> {
    match name {
        "-v" => Ok("--v"),
        _ if FLAGS.contains(&name) => Ok(name),
        _ if name.starts_with('-') => Err(ConfigError::Flag {
            flag: name.to_string(),
            reason: "unknown flag (see holdfast run --help)".into(),
        }),
        _ => Err(ConfigError::Usage(format!(
            "unexpected argument {arg:?}\n{USAGE}"
        ))),
    }
}

/// Sets the flag `canonical` to `value` in `flags`, checked.
fn set_flag(flags: &mut RunFlags, canonical: &str, value: String) -> Result<(), ConfigError> {
    match canonical {
        "--config" => flags.config = Some(PathBuf::from(value)),
        "--root-dir" => flags.root_dir = Some(PathBuf::from(value)),
        "--pod-manifest-path" => flags.pod_manifest_path = Some(PathBuf::from(value)),
        "--hostname-override" => flags.hostname_override = Some(value),
        "--board" => flags.board = Some(value),
        "--board-dir" => flags.board_dir = Some(PathBuf::from(value)),
        "--kubeconfig" => flags.kubeconfig = Some(PathBuf::from(value)),
        "--bootstrap-kubeconfig" => flags.bootstrap_kubeconfig = Some(PathBuf::from(value)),
        "--node-ip" => flags.node_ip = Some(node_ip(canonical, &value)?),
        "--register-with-taints" => {
            flags.register_with_taints = Some(taints(canonical, &value)?);
        }
        "--uplink-retry-max" => {
            let d = super::parse_duration(&value).map_err(|reason| ConfigError::Flag {
                flag: canonical.into(),
                reason,
            })?;
            if d.is_zero() {
                return Err(ConfigError::Flag {
                    flag: canonical.into(),
                    reason: "must be more than zero".into(),
                });
            }
            flags.uplink_retry_max = Some(d);
        }
        "--port" => {
            let p = value.parse::<u16>().ok().filter(|p| *p > 0);
            flags.port = Some(p.ok_or_else(|| ConfigError::Flag {
                flag: canonical.into(),
                reason: format!("expected a port from 1 to 65535, got {value:?}"),
            })?);
        }
        "--node-labels" => pairs(canonical, &value, '=', check_label, &mut flags.node_labels)?,
        "--system-reserved" => pairs(
            canonical,
            &value,
            '=',
            check_reserved,
            &mut flags.system_reserved,
        )?,
        "--kube-reserved" => pairs(
            canonical,
            &value,
            '=',
            check_reserved,
            &mut flags.kube_reserved,
        )?,
        "--eviction-hard" => pairs(
            canonical,
            &value,
            '<',
            check_eviction,
            &mut flags.eviction_hard,
        )?,
        "--v" => {
            let level = value.parse::<u8>().map_err(|_| ConfigError::Flag {
                flag: canonical.into(),
                reason: format!("expected a number from 0 to 255, got {value:?}"),
            })?;
            flags.verbosity = Some(level);
        }
        other => {
            return Err(ConfigError::Flag {
                flag: other.into(),
                reason: "listed but not read (a bug)".into(),
            })
        }
    }
    Ok(())
}

fn node_ip(flag: &str, value: &str) -> Result<IpAddr, ConfigError> {
    let err = |reason: String| ConfigError::Flag {
        flag: flag.into(),
        reason,
    };
    let ip: IpAddr = value
        .trim()
        .parse()
        .map_err(|_| err(format!("expected an IPv4 or IPv6 address, got {value:?}")))?;
    check_node_ip(ip).map_err(err)?;
    Ok(ip)
}

fn taints(flag: &str, value: &str) -> Result<Vec<Taint>, ConfigError> {
    let err = |reason: String| ConfigError::Flag {
        flag: flag.into(),
        reason,
    };
    let taints = value
        .split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| parse_taint(e.trim()).map_err(err))
        .collect::<Result<Vec<_>, _>>()?;
    check_unique(&taints).map_err(err)?;
    Ok(taints)
}

/// `k=v,k2=v2` (or `signal<threshold,...` for `--eviction-hard`, as the kubelet spells
/// it), each entry checked as the config file's entries are.
fn pairs(
    flag: &str,
    value: &str,
    separator: char,
    check: fn(&str, &str) -> Result<(), String>,
    into: &mut BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    let err = |reason: String| ConfigError::Flag {
        flag: flag.into(),
        reason,
    };
    for entry in value.split(',').filter(|e| !e.is_empty()) {
        let (k, v) = entry
            .split_once(separator)
            .ok_or_else(|| err(format!("expected KEY{separator}VALUE, got {entry:?}")))?;
        let (k, v) = (k.trim(), v.trim());
        check(k, v).map_err(err)?;
        into.insert(k.to_string(), v.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn separate_and_joined_values() {
        let f = parse_flags(&args(&[
            "--config",
            "/etc/holdfast/config.yaml",
            "--root-dir=/data/holdfast",
            "--pod-manifest-path",
            "/m",
            "--hostname-override=GW-1",
            "--v=3",
        ]))
        .expect("parse");
        assert_eq!(f.config, Some(PathBuf::from("/etc/holdfast/config.yaml")));
        assert_eq!(f.root_dir, Some(PathBuf::from("/data/holdfast")));
        assert_eq!(f.pod_manifest_path, Some(PathBuf::from("/m")));
        assert_eq!(f.hostname_override.as_deref(), Some("GW-1"));
        assert_eq!(f.verbosity, Some(3));
    }

    #[test]
    fn verbosity_forms() {
        for form in [&["--v", "4"][..], &["--v=4"], &["-v", "4"], &["-v=4"]] {
            assert_eq!(parse_flags(&args(form)).expect("parse").verbosity, Some(4));
        }
        match parse_flags(&args(&["--v", "loud"])) {
            Err(ConfigError::Flag { flag, reason }) => {
                assert_eq!(flag, "--v");
                assert!(reason.contains("\"loud\""), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn board_and_map_flags() {
        let f = parse_flags(&args(&[
            "--board=rpi4",
            "--board-dir",
            "/b",
            "--node-labels=example.com/site=north,example.com/rack=3",
            "--system-reserved",
            "cpu=500m,memory=1Gi",
            "--eviction-hard=memory.available<50Mi,nodefs.available<5%",
        ]))
        .expect("parse");
        assert_eq!(f.board.as_deref(), Some("rpi4"));
        assert_eq!(f.board_dir, Some(PathBuf::from("/b")));
        assert_eq!(f.node_labels["example.com/rack"], "3");
        assert_eq!(f.system_reserved["memory"], "1Gi");
        assert_eq!(f.eviction_hard["nodefs.available"], "5%");
        for bad in [
            &["--system-reserved", "cpu=lots"][..],
            &["--kube-reserved", "cpu"],
            &["--eviction-hard", "memory.available=5Mi"],
            &["--node-labels", "kubernetes.io/role=x"],
        ] {
            match parse_flags(&args(bad)) {
                Err(ConfigError::Flag { flag, .. }) => assert_eq!(flag, bad[0]),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn cluster_flags() {
        let f = parse_flags(&args(&[
            "--kubeconfig=/etc/holdfast/kubelet.conf",
            "--node-ip",
            "192.168.50.10",
            "--register-with-taints",
            "example.com/edge=true:NoSchedule,dedicated:NoExecute",
        ]))
        .expect("parse");
        assert_eq!(
            f.kubeconfig,
            Some(PathBuf::from("/etc/holdfast/kubelet.conf"))
        );
        assert_eq!(f.node_ip, Some(IpAddr::from([192, 168, 50, 10])));
        let taints = f.register_with_taints.expect("taints");
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0].key, "example.com/edge");
        assert_eq!(taints[0].value.as_deref(), Some("true"));
        assert_eq!(taints[1].effect, "NoExecute");
        assert_eq!(
            parse_flags(&args(&["--node-ip=fd00::10"]))
                .expect("parse")
                .node_ip,
            Some("fd00::10".parse().expect("ip"))
        );
        for bad in [
            &["--node-ip", "gateway"][..],
            &["--node-ip", "127.0.0.1"],
            &["--node-ip", "0.0.0.0"],
            &["--register-with-taints", "a=b"],
            &["--register-with-taints", "a:NoSchedule,a=x:NoSchedule"],
        ] {
            match parse_flags(&args(bad)) {
                Err(ConfigError::Flag { flag, .. }) => assert_eq!(flag, bad[0]),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn every_listed_flag_is_read_and_in_the_usage() {
        for flag in FLAGS {
            assert!(USAGE.contains(&format!("{flag} ")), "{flag} in USAGE");
            // A value no flag takes: a flag that is read refuses it or takes it, never
            // "listed but not read".
            if let Err(ConfigError::Flag { reason, .. }) = parse_flags(&args(&[flag, "x"])) {
                assert!(!reason.contains("not read"), "{flag}: {reason}");
            }
        }
    }

    #[test]
    fn no_flags_is_all_unset() {
        assert_eq!(parse_flags(&[]).expect("parse"), RunFlags::default());
    }

    #[test]
    fn unknown_flag_is_named() {
        match parse_flags(&args(&["--root-dir", "/x", "--kubeconfg=/k"])) {
            Err(ConfigError::Flag { flag, .. }) => assert_eq!(flag, "--kubeconfg"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_or_empty_value() {
        match parse_flags(&args(&["--root-dir"])) {
            Err(ConfigError::Flag { flag, reason }) => {
                assert_eq!(flag, "--root-dir");
                assert!(reason.contains("needs a value"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_flags(&args(&["--config="])),
            Err(ConfigError::Flag { .. })
        ));
    }

    #[test]
    fn stray_argument_and_help() {
        assert!(matches!(
            parse_flags(&args(&["pods"])),
            Err(ConfigError::Usage(_))
        ));
        assert!(matches!(
            parse_flags(&args(&["--help"])),
            Err(ConfigError::Usage(_))
        ));
    }
}
