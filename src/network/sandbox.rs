//! One pod's network, set up, checked and torn down in its directory.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::cni::{self, CniCommand, RuntimeArgs};
use super::dns::{self, Resolver};
use super::{conf, netns, NetworkConfig, NetworkError};
use crate::runtime::NamespaceKind;

const ATTACHMENT: &str = "network.json";
const NS_DIR: &str = "ns";

/// What was attached, kept so that CHECK and DEL get the configuration and result
/// of the ADD, even after the configuration directory changed or the agent restarted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Attachment {
    /// The network configuration list, as used.
    list: Value,
    bin_dirs: Vec<PathBuf>,
    runtime: RuntimeArgs,
    /// The ADD's result; None while the ADD runs (a crash then still leaves what DEL
    /// needs to release the lease).
    result: Option<Value>,
    /// Why this attachment is never CHECKed: CHECK failed on an attachment of this
    /// network just made (portmap before CNI plugins 1.3 fails every CHECK of an IPv4
    /// pod where ip6tables works), so its failure says nothing about the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unchecked: Option<String>,
}

/// The pod's network as its containers see it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodNetwork {
    pub namespaces: Vec<(NamespaceKind, PathBuf)>,
    /// The pod's addresses (IPv4 first); empty for a host-network pod.
    pub ips: Vec<String>,
    pub hosts: PathBuf,
    pub resolv_conf: PathBuf,
    pub hostname: PathBuf,
    /// Said to the user as events (MissingClusterDNS).
    pub warnings: Vec<String>,
    /// The namespaces were made by this call, not found held.
    pub fresh: bool,
}

/// Sets up pods' networks.
pub struct Network {
    config: NetworkConfig,
    root: PathBuf,
    /// holdfast itself, run as the namespace holder.
    binary: PathBuf,
    /// Whether CHECK holds on a fresh attachment of a network list (the list, and
    /// CHECK's error if it failed): tried once per list on the first pod attached.
    check_verdict: std::sync::Mutex<Option<(Value, Option<String>)>>,
}

impl Network {
    pub fn new(config: NetworkConfig, root: &Path, binary: PathBuf) -> Self {
        Network {
            config,
            root: root.to_owned(),
            binary,
            check_verdict: std::sync::Mutex::new(None),
        }
    }

    /// The namespaces, attachment and DNS files of `pod` in `dir`: made when missing
    /// (the first start, or after a reboot took the namespaces), kept when they are
    /// there (an agent restart adopts them).
    pub fn ensure(&self, pod: &Pod, dir: &Path) -> Result<PodNetwork, NetworkError> {
        let spec = pod.spec.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let mut kinds = Vec::new();
        if !host_network {
            kinds.extend([NamespaceKind::Net, NamespaceKind::Uts]);
        }
        if !spec.and_then(|s| s.host_ipc).unwrap_or(false) {
            kinds.push(NamespaceKind::Ipc);
        }
        if spec
            .and_then(|s| s.share_process_namespace)
            .unwrap_or(false)
            && !spec.and_then(|s| s.host_pid).unwrap_or(false)
        {
            kinds.push(NamespaceKind::Pid);
        }
        let (hostname, domain) = dns::hostname_and_domain(pod, &self.config.dns.cluster_domain);
        let ns_dir = ns_dir(dir);
        let all_held = kinds.iter().all(|k| netns::held(&netns::path(&ns_dir, *k)));
        let attached = read_attachment(dir)?;
        let fresh =
            !(all_held && (host_network || attached.as_ref().is_some_and(|a| a.result.is_some())));
        let namespaces = if !fresh {
            kinds
                .iter()
                .map(|k| (*k, netns::path(&ns_dir, *k)))
                .collect()
        } else {
            // Half there (a crash mid-way) or gone (a reboot): release what is left,
            // the IPAM lease first, and start again.
            teardown(dir)?;
            let namespaces = netns::create(&self.binary, &ns_dir, &kinds, &hostname)?;
            if !host_network {
                if let Err(e) = self.attach(pod, dir, &netns::path(&ns_dir, NamespaceKind::Net)) {
                    let _ = teardown(dir);
                    return Err(e);
                }
            }
            namespaces
        };
        let ips = read_attachment(dir)?
            .and_then(|a| a.result)
            .map(|r| cni::pod_ips(&r))
            .unwrap_or_default();

        let (kind, warning) = dns::kind(pod, &self.config.dns);
        let host_resolver = match &self.config.resolv_conf {
            Some(p) => Resolver::parse(&std::fs::read_to_string(p).unwrap_or_default()),
            None => Resolver::default(),
        };
        let resolver = dns::resolver(pod, &self.config.dns, kind, &host_resolver);
        let host_hosts = if host_network {
            std::fs::read_to_string("/etc/hosts").unwrap_or_default()
        } else {
            String::new()
        };
        let hosts = dns::hosts_file(pod, &ips, &hostname, domain.as_deref(), &host_hosts);
        // Written again at every setup, so on the runtime's tmpfs: the flash never sees
        // them.
        let etc = boot_dir(dir);
        let net = PodNetwork {
            namespaces,
            ips,
            hosts: etc.join("hosts"),
            resolv_conf: etc.join("resolv.conf"),
            hostname: etc.join("hostname"),
            warnings: warning.into_iter().collect(),
            fresh,
        };
        write_if_changed(&net.hosts, hosts.as_bytes())?;
        write_if_changed(&net.resolv_conf, resolver.render().as_bytes())?;
        write_if_changed(&net.hostname, format!("{hostname}\n").as_bytes())?;
        Ok(net)
    }

    /// After a failed CHECK: DEL with what the ADD was given, then ADD again in the
    /// same namespace, so the pod's containers keep running and get their network back.
    pub fn repair(&self, pod: &Pod, dir: &Path) -> Result<(), NetworkError> {
        if let Some(mut a) = read_attachment(dir)? {
            if !netns::held(Path::new(&a.runtime.netns)) {
                a.runtime.netns = String::new();
            }
            cni::run_list(
                &a.bin_dirs,
                &a.list,
                CniCommand::Del,
                &a.runtime,
                a.result.as_ref(),
            )?;
            let path = dir.join(ATTACHMENT);
            std::fs::remove_file(&path).map_err(|source| NetworkError::Io {
                context: format!("remove {}", path.display()),
                source,
            })?;
        }
        let net = netns::path(&ns_dir(dir), NamespaceKind::Net);
        if netns::held(&net) {
            self.attach(pod, dir, &net)?;
            // CHECK again on what was just made: when that fails too, CHECK says nothing
            // about this network (a plugin's CHECK can depend on state its own first
            // run makes, as portmap's on ip6tables' nat table): stop acting on it.
            if let Some(mut a) = read_attachment(dir)? {
                if a.unchecked.is_none() {
                    if let Some(e) = self.check_now(&a) {
                        a.unchecked = Some(e);
                        write_attachment(dir, &a)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Loopback, then the pod's network on eth0.
    fn attach(&self, pod: &Pod, dir: &Path, netns_path: &Path) -> Result<(), NetworkError> {
        let network = conf::select(&self.config.conf_dir, &self.root, &self.config.pod_cidr)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let netns = netns_path.display().to_string();
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={uid};K8S_POD_UID={uid}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or(""),
        );
        let lo = RuntimeArgs {
            container_id: uid.clone(),
            netns: netns.clone(),
            ifname: "lo".into(),
            args: args.clone(),
            runtime_config: Map::new(),
        };
        cni::run_list(
            &self.config.bin_dirs,
            &conf::loopback(),
            CniCommand::Add,
            &lo,
            None,
        )?;
        let mut runtime_config = Map::new();
        let ports = port_mappings(pod);
        if !ports.is_empty() {
            runtime_config.insert("portMappings".into(), Value::Array(ports));
        }
        let mut attachment = Attachment {
            list: network.list,
            bin_dirs: self.config.bin_dirs.clone(),
            runtime: RuntimeArgs {
                container_id: uid,
                netns,
                ifname: "eth0".into(),
                args,
                runtime_config,
            },
            result: None,
            unchecked: None,
        };
        write_attachment(dir, &attachment)?;
        let result = cni::run_list(
            &attachment.bin_dirs,
            &attachment.list,
            CniCommand::Add,
            &attachment.runtime,
            None,
        )?;
        attachment.result = Some(result.unwrap_or(Value::Null));
        attachment.unchecked = self.check_fresh(&attachment);
        write_attachment(dir, &attachment)
    }

    /// CHECK of an attachment just made, once per network list: the error when CHECK
    /// fails on it (and is therefore no guide to a pod's network), None when it holds.
    fn check_fresh(&self, a: &Attachment) -> Option<String> {
        let verdict = self
            .check_verdict
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((list, error)) = verdict.as_ref() {
            if *list == a.list {
                return error.clone();
            }
        }
        drop(verdict);
        self.check_now(a)
    }

    /// CHECK of `a` now; its error, also remembered as the verdict on `a`'s network
    /// list (and said) when it fails.
    fn check_now(&self, a: &Attachment) -> Option<String> {
        let error = match &a.result {
            Some(result) if !result.is_null() => cni::run_list(
                &a.bin_dirs,
                &a.list,
                CniCommand::Check,
                &a.runtime,
                Some(result),
            )
            .err()
            .map(|e| e.to_string()),
            _ => None,
        };
        if let Some(e) = &error {
            log::warn!(
                "CNI network {}: CHECK fails on a pod's attachment just made ({e}); \
                 pods on it are not CHECKed, so a failure that says nothing does not \
                 re-attach them",
                a.list["name"].as_str().unwrap_or("?")
            );
        }
        let mut verdict = self
            .check_verdict
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if error.is_some() || verdict.as_ref().is_none_or(|(list, _)| *list != a.list) {
            *verdict = Some((a.list.clone(), error.clone()));
        }
        error
    }
}

/// CNI CHECK of the pod's attachment (nothing for a host-network pod, or a network
/// older than CNI 0.4.0).
pub fn check(dir: &Path) -> Result<(), NetworkError> {
    let Some(a) = read_attachment(dir)? else {
        return Ok(());
    };
    let Some(result) = &a.result else {
        return Ok(());
    };
    if a.unchecked.is_some() {
        return Ok(());
    }
    cni::run_list(
        &a.bin_dirs,
        &a.list,
        CniCommand::Check,
        &a.runtime,
        Some(result),
    )
    .map(|_| ())
}

/// DEL of the pod's attachment with the configuration and result of its ADD, then
/// the namespaces released. The attachment record is kept when DEL fails, so the
/// next try (the agent's next start, or `holdfast reset`) releases the lease.
pub fn teardown(dir: &Path) -> Result<(), NetworkError> {
    let mut result = Ok(());
    if let Some(mut a) = read_attachment(dir)? {
        // The spec lets DEL go without a namespace once it is gone (a reboot).
        if !netns::held(Path::new(&a.runtime.netns)) {
            a.runtime.netns = String::new();
        }
        match cni::run_list(
            &a.bin_dirs,
            &a.list,
            CniCommand::Del,
            &a.runtime,
            a.result.as_ref(),
        ) {
            Ok(_) => {
                let path = dir.join(ATTACHMENT);
                if let Err(source) = std::fs::remove_file(&path) {
                    if source.kind() != std::io::ErrorKind::NotFound {
                        result = Err(NetworkError::Io {
                            context: format!("remove {}", path.display()),
                            source,
                        });
                    }
                }
            }
            Err(e) => result = Err(e),
        }
    }
    netns::release(&boot_ns_dir(dir))?;
    netns::release(&dir.join(NS_DIR))?;
    result
}

/// Where pod dir `dir`'s namespaces are held. They are bind mounts, which last one boot:
/// on the runtime's tmpfs beside the pod's `hosts` (`boot/pods/<uid>/ns`), so that a
/// pod's start and stop write no namespace files to the flash. A pod an older holdfast
/// set up holds them in its dir on the disk (`pods/<uid>/ns`) while those mounts last.
fn ns_dir(dir: &Path) -> PathBuf {
    let legacy = dir.join(NS_DIR);
    let held_there = std::fs::read_dir(&legacy)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| netns::held(&e.path()));
    if held_there {
        legacy
    } else {
        boot_ns_dir(dir)
    }
}

/// `boot/pods/<uid>/ns` for pod dir `dir` (`<root>/pods/<uid>`).
fn boot_ns_dir(dir: &Path) -> PathBuf {
    boot_dir(dir).join(NS_DIR)
}

/// The pod's dir on the runtime's tmpfs, `<root>/boot/pods/<uid>`, for its dir on the
/// disk, `dir` (`<root>/pods/<uid>`): its namespaces, `hosts`, `resolv.conf`.
fn boot_dir(dir: &Path) -> PathBuf {
    match (dir.parent().and_then(Path::parent), dir.file_name()) {
        (Some(root), Some(uid)) => {
            crate::runtime::root_dir::pod_boot_dir(root, &uid.to_string_lossy())
        }
        _ => dir.to_path_buf(),
    }
}

/// `hostPort`s of the pod's containers as portmap's `portMappings`.
fn port_mappings(pod: &Pod) -> Vec<Value> {
    let mut out = Vec::new();
    let Some(spec) = &pod.spec else { return out };
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for p in c.ports.iter().flatten() {
            let Some(host_port) = p.host_port.filter(|h| *h > 0) else {
                continue;
            };
            let mut m = json!({
                "hostPort": host_port,
                "containerPort": p.container_port,
                "protocol": p.protocol.as_deref().unwrap_or("TCP").to_lowercase(),
            });
            if let Some(ip) = p.host_ip.as_deref().filter(|ip| !ip.is_empty()) {
                m["hostIP"] = Value::String(ip.to_owned());
            }
            out.push(m);
        }
    }
    out
}

fn read_attachment(dir: &Path) -> Result<Option<Attachment>, NetworkError> {
    let path = dir.join(ATTACHMENT);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| NetworkError::Config {
                path,
                reason: format!("unreadable attachment record: {e}"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(NetworkError::Io {
            context: format!("read {}", path.display()),
            source,
        }),
    }
}

/// Written whole (temp file, fsync, rename): a power cut leaves the old record or the
/// new, never half of one.
fn write_attachment(dir: &Path, a: &Attachment) -> Result<(), NetworkError> {
    let bytes = serde_json::to_vec(a).map_err(|e| NetworkError::Config {
        path: dir.join(ATTACHMENT),
        reason: format!("encode: {e}"),
    })?;
    write_whole(&dir.join(ATTACHMENT), &bytes, true)
}

/// Writes `path` whole (a reader never sees half of it); `durable` syncs it first, for
/// a file that must outlive a power cut.
fn write_whole(path: &Path, bytes: &[u8], durable: bool) -> Result<(), NetworkError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let io = |source| NetworkError::Io {
        context: format!("write {}", path.display()),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    if durable {
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

/// Flash wears: a file that says the same is not written again. These files (a pod's
/// hosts, resolv.conf, hostname) are not synced: they are written again from the pod
/// when its sandbox is set up, and a power cut ends the sandbox, so one lost or torn
/// by a power cut differs from what is written next and is put right then.
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), NetworkError> {
    if std::fs::read(path).ok().as_deref() == Some(bytes) {
        return Ok(());
    }
    write_whole(path, bytes, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};

    #[test]
    fn host_ports_become_port_mappings() {
        let p = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "web".into(),
                    ports: Some(vec![
                        ContainerPort {
                            container_port: 80,
                            host_port: Some(8080),
                            ..ContainerPort::default()
                        },
                        ContainerPort {
                            container_port: 53,
                            host_port: Some(5353),
                            protocol: Some("UDP".into()),
                            host_ip: Some("127.0.0.1".into()),
                            ..ContainerPort::default()
                        },
                        ContainerPort {
                            container_port: 9000,
                            ..ContainerPort::default()
                        },
                    ]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        assert_eq!(
            port_mappings(&p),
            vec![
                json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}),
                json!({"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}),
            ]
        );
    }
}
