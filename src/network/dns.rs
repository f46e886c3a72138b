//! A pod's `/etc/resolv.conf`, `/etc/hosts` and host name, as the kubelet makes them
//! (`pkg/kubelet/network/dns`, `ensureHostsFile`, `GeneratePodHostNameAndDomain`) and
//! containerd writes them. Pure functions of the pod, the settings and the host's own
//! files.

use k8s_openapi::api::core::v1::Pod;

/// The kubelet's limits on what a resolver takes.
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCH_PATHS: usize = 32;
const MAX_SEARCH_CHARS: usize = 2048;
const MAX_HOSTNAME: usize = 63;

/// `clusterDNS`, `clusterDomain` and the host's resolver configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DnsSettings {
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
}

/// A resolver configuration: the parsed form of a resolv.conf.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolver {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl Resolver {
    /// The kubelet's `parseResolvConf`: `nameserver`, `search` (the last one wins) and
    /// `options` lines; comments and everything else are ignored.
    pub fn parse(text: &str) -> Resolver {
        let mut r = Resolver::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut f = line.split_whitespace();
            match f.next() {
                Some("nameserver") => {
                    if let Some(ns) = f.next() {
                        r.nameservers.push(ns.to_owned());
                    }
                }
                Some("search") => {
                    r.searches = f
                        .map(|s| s.trim_end_matches('.').to_owned())
                        .filter(|s| !s.is_empty())
                        .collect();
                }
                Some("options") => r.options.extend(f.map(str::to_owned)),
                _ => {}
            }
        }
        r
    }

    /// As containerd writes it: search, nameservers, options.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if !self.searches.is_empty() {
            out.push_str(&format!("search {}\n", self.searches.join(" ")));
        }
        for ns in &self.nameservers {
            out.push_str(&format!("nameserver {ns}\n"));
        }
        if !self.options.is_empty() {
            out.push_str(&format!("options {}\n", self.options.join(" ")));
        }
        out
    }
}

/// Which resolver a pod gets, from its `dnsPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsKind {
    Cluster,
    Host,
    None,
}

/// The pod's DNS kind, and a warning (the kubelet's MissingClusterDNS event) when
/// ClusterFirst has no cluster DNS to use.
pub fn kind(pod: &Pod, settings: &DnsSettings) -> (DnsKind, Option<String>) {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let kind = match policy {
        "None" => DnsKind::None,
        "Default" => DnsKind::Host,
        "ClusterFirstWithHostNet" => DnsKind::Cluster,
        _ if host_network => DnsKind::Host,
        _ => DnsKind::Cluster,
    };
    if kind == DnsKind::Cluster && settings.cluster_dns.is_empty() {
        let pod_name = crate::runtime::security::pod_ref(pod);
        let warning = format!(
            "pod: {pod_name:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using {policy:?} policy. Falling back to \"Default\" policy."
        );
        return (DnsKind::Host, Some(warning));
    }
    (kind, None)
}

/// The pod's resolver (`GetPodDNS`): by kind, then `dnsConfig` merged in, then the
/// kubelet's limits. `host` is the host's resolver (`resolvConf`).
pub fn resolver(pod: &Pod, settings: &DnsSettings, kind: DnsKind, host: &Resolver) -> Resolver {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut r = match kind {
        DnsKind::None => Resolver::default(),
        DnsKind::Host => host.clone(),
        DnsKind::Cluster => {
            let mut searches = Vec::new();
            let domain = settings.cluster_domain.trim_end_matches('.');
            if !domain.is_empty() {
                searches.push(format!("{ns}.svc.{domain}"));
                searches.push(format!("svc.{domain}"));
                searches.push(domain.to_owned());
            }
            searches.extend(host.searches.iter().cloned());
            Resolver {
                nameservers: settings.cluster_dns.clone(),
                searches,
                options: vec!["ndots:5".to_owned()],
            }
        }
    };
    if let Some(cfg) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        for n in cfg.nameservers.iter().flatten() {
            if !r.nameservers.contains(n) {
                r.nameservers.push(n.clone());
            }
        }
        for s in cfg.searches.iter().flatten() {
            if !r.searches.contains(s) {
                r.searches.push(s.clone());
            }
        }
        // An option of dnsConfig replaces the one of the same name.
        for o in cfg.options.iter().flatten() {
            let rendered = match &o.value {
                Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or("")),
                None => o.name.clone().unwrap_or_default(),
            };
            let name = rendered.split(':').next().unwrap_or("").to_owned();
            r.options
                .retain(|x| x.split(':').next() != Some(name.as_str()));
            r.options.push(rendered);
        }
    }
    let mut seen = Vec::new();
    r.searches.retain(|s| {
        let new = !seen.contains(s);
        seen.push(s.clone());
        new
    });
    r.nameservers.truncate(MAX_NAMESERVERS);
    r.searches.truncate(MAX_SEARCH_PATHS);
    while r.searches.join(" ").len() > MAX_SEARCH_CHARS {
        r.searches.pop();
    }
    r
}

/// The pod's host name and, when it has a subdomain, its domain
/// (`<subdomain>.<namespace>.svc.<clusterDomain>`).
pub fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    // `hostnameOverride` (beta, on by default since 1.35) names the pod alone: no
    // domain. The apiserver checked it is a DNS subdomain of at most 64 characters.
    if let Some(o) = spec
        .and_then(|s| s.hostname_override.as_deref())
        .filter(|o| !o.is_empty())
    {
        return (truncated(o.to_string()), None);
    }
    let name = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    let name = truncated(name);
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty() && !cluster_domain.is_empty())
        .map(|sub| {
            format!(
                "{sub}.{}.svc.{}",
                pod.metadata.namespace.as_deref().unwrap_or("default"),
                cluster_domain.trim_end_matches('.')
            )
        });
    (name, domain)
}

/// A host name cut to what a host name may hold, without a trailing `-` or `.`.
fn truncated(mut name: String) -> String {
    if name.len() > MAX_HOSTNAME {
        name.truncate(MAX_HOSTNAME);
        while name.ends_with(['-', '.']) {
            name.pop();
        }
    }
    name
}

/// The pod's `/etc/hosts` (`ensureHostsFile`). A host-network pod gets the host's
/// file; others get the managed one with their own addresses. Both end with
/// `hostAliases`.
pub fn hosts_file(
    pod: &Pod,
    pod_ips: &[String],
    hostname: &str,
    domain: Option<&str>,
    host_hosts: &str,
) -> String {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let mut out = String::new();
    if host_network {
        out.push_str("# Kubernetes-managed hosts file (host network).\n");
        out.push_str(host_hosts);
    } else {
        out.push_str("# Kubernetes-managed hosts file.\n");
        out.push_str("127.0.0.1\tlocalhost\n");
        out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
        out.push_str("fe00::0\tip6-localnet\n");
        out.push_str("fe00::0\tip6-mcastprefix\n");
        out.push_str("fe00::1\tip6-allnodes\n");
        out.push_str("fe00::2\tip6-allrouters\n");
        for ip in pod_ips {
            match domain {
                Some(d) => out.push_str(&format!("{ip}\t{hostname}.{d}\t{hostname}\n")),
                None => out.push_str(&format!("{ip}\t{hostname}\n")),
            }
        }
    }
    let aliases = pod.spec.as_ref().and_then(|s| s.host_aliases.as_ref());
    if let Some(aliases) = aliases.filter(|a| !a.is_empty()) {
        out.push('\n');
        out.push_str("# Entries added by HostAliases.\n");
        for a in aliases {
            let names = a.hostnames.clone().unwrap_or_default();
            out.push_str(&format!("{}\t{}\n", a.ip, names.join("\t")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HostAlias, PodDNSConfig, PodDNSConfigOption, PodSpec};

    fn pod(policy: Option<&str>, host_network: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web-0".into());
        p.metadata.namespace = Some("shop".into());
        p.metadata.uid = Some("u".into());
        p.spec = Some(PodSpec {
            dns_policy: policy.map(str::to_owned),
            host_network: Some(host_network),
            ..PodSpec::default()
        });
        p
    }

    fn cluster() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
        }
    }

    const HOST: &str = "# host\nnameserver 192.168.1.1\nnameserver 192.168.1.2\nsearch lan. example.org\noptions edns0\n";

    #[test]
    fn cluster_first() {
        let p = pod(None, false);
        let (k, warn) = kind(&p, &cluster());
        assert_eq!(k, DnsKind::Cluster);
        assert!(warn.is_none());
        let r = resolver(&p, &cluster(), k, &Resolver::parse(HOST));
        assert_eq!(
            r.render(),
            "search shop.svc.cluster.local svc.cluster.local cluster.local lan example.org\n\
             nameserver 10.96.0.10\noptions ndots:5\n"
        );
    }

    #[test]
    fn host_network_and_default_use_the_hosts_resolver() {
        let host = Resolver::parse(HOST);
        for p in [pod(Some("ClusterFirst"), true), pod(Some("Default"), false)] {
            let (k, _) = kind(&p, &cluster());
            assert_eq!(k, DnsKind::Host);
            assert_eq!(
                resolver(&p, &cluster(), k, &host).render(),
                "search lan example.org\nnameserver 192.168.1.1\nnameserver 192.168.1.2\noptions edns0\n"
            );
        }
        let p = pod(Some("ClusterFirstWithHostNet"), true);
        assert_eq!(kind(&p, &cluster()).0, DnsKind::Cluster);
    }

    #[test]
    fn cluster_first_without_cluster_dns_falls_back_with_a_warning() {
        let p = pod(None, false);
        let (k, warn) = kind(&p, &DnsSettings::default());
        assert_eq!(k, DnsKind::Host);
        let warn = warn.expect("warning");
        assert!(
            warn.contains("Falling back to \"Default\" policy"),
            "{warn}"
        );
    }

    #[test]
    fn none_takes_dns_config_only_and_options_merge() {
        let mut p = pod(Some("None"), false);
        if let Some(s) = p.spec.as_mut() {
            s.dns_config = Some(PodDNSConfig {
                nameservers: Some(vec!["1.1.1.1".into(), "1.1.1.1".into(), "8.8.8.8".into()]),
                searches: Some(vec!["a.example".into()]),
                options: Some(vec![
                    PodDNSConfigOption {
                        name: Some("ndots".into()),
                        value: Some("2".into()),
                    },
                    PodDNSConfigOption {
                        name: Some("edns0".into()),
                        value: None,
                    },
                ]),
            });
        }
        let (k, _) = kind(&p, &cluster());
        assert_eq!(k, DnsKind::None);
        assert_eq!(
            resolver(&p, &cluster(), k, &Resolver::parse(HOST)).render(),
            "search a.example\nnameserver 1.1.1.1\nnameserver 8.8.8.8\noptions ndots:2 edns0\n"
        );
        // dnsConfig's ndots replaces ClusterFirst's.
        if let Some(s) = p.spec.as_mut() {
            s.dns_policy = Some("ClusterFirst".into());
        }
        let r = resolver(&p, &cluster(), DnsKind::Cluster, &Resolver::default());
        assert_eq!(r.options, ["ndots:2", "edns0"]);
        assert_eq!(r.nameservers, ["10.96.0.10", "1.1.1.1", "8.8.8.8"]);
    }

    #[test]
    fn hosts_files() {
        let mut p = pod(None, false);
        if let Some(s) = p.spec.as_mut() {
            s.subdomain = Some("db".into());
            s.host_aliases = Some(vec![HostAlias {
                ip: "10.0.0.9".into(),
                hostnames: Some(vec!["foo.local".into(), "bar.local".into()]),
            }]);
        }
        let (h, d) = hostname_and_domain(&p, "cluster.local");
        assert_eq!(h, "web-0");
        assert_eq!(d.as_deref(), Some("db.shop.svc.cluster.local"));
        // hostnameOverride wins over hostname and subdomain, and has no domain.
        let mut o = p.clone();
        if let Some(s) = o.spec.as_mut() {
            s.hostname = Some("named".into());
            s.hostname_override = Some("override-host".into());
        }
        assert_eq!(
            hostname_and_domain(&o, "cluster.local"),
            ("override-host".to_string(), None)
        );
        let text = hosts_file(&p, &["10.88.0.7".into()], &h, d.as_deref(), "");
        assert_eq!(
            text,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n\
             ::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n\
             fe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.88.0.7\tweb-0.db.shop.svc.cluster.local\tweb-0\n\n\
             # Entries added by HostAliases.\n10.0.0.9\tfoo.local\tbar.local\n"
        );
        let hp = pod(None, true);
        assert_eq!(
            hosts_file(&hp, &[], "node-1", None, "127.0.0.1 localhost\n"),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
        );
        let mut long = pod(None, false);
        long.metadata.name = Some(format!("{}-x", "a".repeat(62)));
        assert_eq!(hostname_and_domain(&long, "").0, "a".repeat(62));
    }
}
