//! Netfilter checks: what the CNI plugins' iptables rules (pod NAT, hostPort) need of
//! the kernel, with either iptables backend (legacy xtables or nf_tables), and
//! `br_netfilter`, which makes bridged pod traffic pass those rules.
//!
//! Since Linux 6.17 the legacy tables (`IP_NF_FILTER`, `IP_NF_NAT`, ...) depend on
//! `IP_NF_IPTABLES_LEGACY` and `NETFILTER_XTABLES_LEGACY`, which default to off: a
//! kernel config that names those options must enable them for the legacy backend.

use super::kconfig::KernelConfig;
use super::kernel::{config_verdict, with_hint};
use super::{Facts, Item, Status};

/// The legacy backend's options, in every kernel.
const LEGACY: &[&str] = &[
    "CONFIG_NETFILTER_XTABLES",
    "CONFIG_IP_NF_IPTABLES",
    "CONFIG_IP_NF_FILTER",
    "CONFIG_IP_NF_NAT",
    "CONFIG_IP_NF_TARGET_MASQUERADE",
];
/// Also needed for the legacy backend where the kernel has them (6.17 and later).
const LEGACY_SINCE_6_17: &[&str] = &[
    "CONFIG_NETFILTER_XTABLES_LEGACY",
    "CONFIG_IP_NF_IPTABLES_LEGACY",
];
/// The nf_tables backend (iptables-nft): the tables, NAT, and the xtables matches
/// and targets run through nft_compat.
const NFT: &[&str] = &[
    "CONFIG_NF_TABLES",
    "CONFIG_NF_TABLES_IPV4",
    "CONFIG_NFT_NAT",
    "CONFIG_NFT_MASQ",
    "CONFIG_NFT_COMPAT",
];
/// What the bridge and portmap plugins' rules use, with either backend.
const XT: &[&str] = &[
    "CONFIG_NETFILTER_XT_MATCH_COMMENT",
    "CONFIG_NETFILTER_XT_MATCH_MULTIPORT",
    "CONFIG_NETFILTER_XT_MARK",
    "CONFIG_NETFILTER_XT_NAT",
    "CONFIG_NETFILTER_XT_TARGET_MASQUERADE",
];

const NO_RULES: &str =
    "pod NAT and hostPort need it (the bridge and portmap CNI plugins); hostNetwork pods do without";

/// The legacy backend's options this kernel config has.
fn legacy_options(k: &KernelConfig) -> Vec<&'static str> {
    let mut options = LEGACY.to_vec();
    options.extend(LEGACY_SINCE_6_17.iter().filter(|o| k.get(o).is_some()));
    options
}

/// Which of `modules` the running system has, loaded or loadable; None when it could
/// not tell (no module lists), or when a kernel config says more.
fn modules_live(f: &Facts, modules: &[&str]) -> Option<(bool, String)> {
    let known = !f.modules_present.is_empty() || !f.modules_available.is_empty();
    let has = |m: &&str| f.modules_present.contains(*m) || f.modules_available.contains(*m);
    let missing: Vec<&str> = modules.iter().copied().filter(|m| !has(m)).collect();
    if missing.is_empty() {
        Some((true, format!("modules {}", modules.join(", "))))
    } else if known && f.kernel_config.is_none() {
        Some((false, format!("no module {}", missing.join(", "))))
    } else {
        None
    }
}

/// Either iptables backend, complete.
fn iptables(f: &Facts) -> Item {
    let name = "iptables (legacy or nf_tables)";
    let config = f.kernel_config.as_ref().map(|(_, k)| {
        let legacy = config_verdict(k, &legacy_options(k));
        let nft = config_verdict(k, NFT);
        let xt = config_verdict(k, XT);
        match (legacy.0 || nft.0, xt.0) {
            (true, true) => {
                let which = if legacy.0 {
                    "legacy xtables"
                } else {
                    "nf_tables"
                };
                (
                    true,
                    format!("{which}: {}", if legacy.0 { legacy.1 } else { nft.1 }),
                )
            }
            (true, false) => (false, xt.1),
            (false, _) => (false, format!("legacy: {}; nf_tables: {}", legacy.1, nft.1)),
        }
    });
    let live = if f.config_decides {
        None
    } else if let Some(tables) = &f.ip_tables_names {
        let names: Vec<&str> = tables.split_whitespace().collect();
        Some((
            true,
            if names.is_empty() {
                "legacy ip_tables loaded".to_string()
            } else {
                format!("legacy tables in use: {}", names.join(" "))
            },
        ))
    } else {
        let legacy = modules_live(f, &["ip_tables", "iptable_filter", "iptable_nat"]);
        let nft = modules_live(f, &["nf_tables", "nft_compat"]);
        match (legacy, nft) {
            (Some((true, d)), _) | (_, Some((true, d))) => Some((true, d)),
            (Some((false, a)), Some((false, b))) => Some((false, format!("{a}; {b}"))),
            _ => None,
        }
    };
    match (live, config) {
        // Loaded tables or modules do not show every match and target the rules use:
        // a kernel config that lacks one says more.
        (Some((true, d)), Some((false, c))) => Item::new(
            name,
            Status::Missing,
            with_hint(format!("{d}, but the kernel config has {c}"), NO_RULES),
        ),
        (Some((true, d)), _) | (None, Some((true, d))) => Item::new(name, Status::Ok, d),
        (Some((false, d)), _) | (None, Some((false, d))) => {
            Item::new(name, Status::Missing, with_hint(d, NO_RULES))
        }
        (None, None) => Item::new(
            name,
            Status::Missing,
            "cannot tell: the system could not be probed and no kernel config was found",
        ),
    }
}

/// br_netfilter: present (its sysctls exist), loadable but not loaded (a warning: it
/// is loaded at boot by a modules-load.d entry), or missing.
fn br_netfilter(f: &Facts) -> Item {
    let name = "br_netfilter";
    let hint = "traffic between pods on the bridge skips the iptables rules without it \
                (a Service's or hostPort's NAT to a pod of the same node)";
    let config = f
        .kernel_config
        .as_ref()
        .map(|(_, k)| config_verdict(k, &["CONFIG_BRIDGE_NETFILTER"]));
    if !f.config_decides && f.bridge_nf_sysctls {
        return Item::new(name, Status::Ok, "loaded (/proc/sys/net/bridge)");
    }
    let loadable = f.modules_available.contains("br_netfilter");
    match config {
        Some((true, d)) if f.config_decides => Item::new(name, Status::Ok, d),
        Some((true, d)) if loadable || d.ends_with("=m") => Item::new(
            name,
            Status::Warn,
            format!("{d}, not loaded: load it at boot (modules-load.d: br_netfilter)"),
        ),
        Some((true, d)) => Item::new(name, Status::Ok, d),
        Some((false, d)) => Item::new(name, Status::Missing, with_hint(d, hint)),
        None if loadable => Item::new(
            name,
            Status::Warn,
            "loadable module, not loaded: load it at boot (modules-load.d: br_netfilter)",
        ),
        None => Item::new(
            name,
            Status::Missing,
            with_hint("not loaded and no br_netfilter module".into(), hint),
        ),
    }
}

pub fn checks(f: &Facts, optional: &mut Vec<Item>) {
    optional.push(iptables(f));
    optional.push(br_netfilter(f));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(config: &str) -> Facts {
        Facts {
            kernel_config: Some(("test".into(), KernelConfig::parse(config))),
            config_decides: true,
            ..Facts::default()
        }
    }

    const XT_ON: &str =
        "CONFIG_NETFILTER_XT_MATCH_COMMENT=m\nCONFIG_NETFILTER_XT_MATCH_MULTIPORT=m\n\
                         CONFIG_NETFILTER_XT_MARK=m\nCONFIG_NETFILTER_XT_NAT=m\n\
                         CONFIG_NETFILTER_XT_TARGET_MASQUERADE=m\n";
    const LEGACY_ON: &str =
        "CONFIG_NETFILTER_XTABLES=y\nCONFIG_IP_NF_IPTABLES=m\nCONFIG_IP_NF_FILTER=m\n\
                             CONFIG_IP_NF_NAT=m\nCONFIG_IP_NF_TARGET_MASQUERADE=m\n";

    #[test]
    fn a_kernel_before_6_17_needs_no_legacy_switches() {
        let item = iptables(&facts(&format!("{LEGACY_ON}{XT_ON}")));
        assert_eq!(item.status, Status::Ok, "{item:?}");
        assert!(item.detail.starts_with("legacy xtables"), "{item:?}");
    }

    #[test]
    fn a_6_18_config_without_the_legacy_switches_has_no_legacy_tables() {
        // On 6.18 the legacy tables depend on these: a config that has them off (the
        // default) loses IP_NF_FILTER and the rest at `make olddefconfig`.
        let config = format!(
            "{LEGACY_ON}{XT_ON}# CONFIG_NETFILTER_XTABLES_LEGACY is not set\n\
             # CONFIG_IP_NF_IPTABLES_LEGACY is not set\n"
        );
        let item = iptables(&facts(&config));
        assert_eq!(item.status, Status::Missing, "{item:?}");
        assert!(
            item.detail.contains("CONFIG_IP_NF_IPTABLES_LEGACY not set"),
            "{item:?}"
        );
        let with = config.replace(
            "# CONFIG_NETFILTER_XTABLES_LEGACY is not set\n# CONFIG_IP_NF_IPTABLES_LEGACY is not set\n",
            "CONFIG_NETFILTER_XTABLES_LEGACY=y\nCONFIG_IP_NF_IPTABLES_LEGACY=m\n",
        );
        assert_eq!(iptables(&facts(&with)).status, Status::Ok);
    }

    #[test]
    fn nf_tables_alone_is_enough() {
        let config = format!(
            "{XT_ON}CONFIG_NF_TABLES=m\nCONFIG_NF_TABLES_IPV4=y\nCONFIG_NFT_NAT=m\n\
             CONFIG_NFT_MASQ=m\nCONFIG_NFT_COMPAT=m\n"
        );
        let item = iptables(&facts(&config));
        assert_eq!(item.status, Status::Ok, "{item:?}");
        assert!(item.detail.starts_with("nf_tables"), "{item:?}");
        let without_xt = iptables(&facts(&config.replace(XT_ON, "")));
        assert_eq!(without_xt.status, Status::Missing);
        assert!(
            without_xt
                .detail
                .contains("CONFIG_NETFILTER_XT_MATCH_COMMENT not set"),
            "{without_xt:?}"
        );
    }

    #[test]
    fn live_legacy_tables_or_loadable_modules() {
        let mut f = Facts {
            ip_tables_names: Some("nat\nfilter\n".into()),
            ..Facts::default()
        };
        let item = iptables(&f);
        assert_eq!(item.status, Status::Ok);
        assert_eq!(item.detail, "legacy tables in use: nat filter");
        // The running kernel's own config lacks a match the rules use.
        f.kernel_config = Some(("/proc/config.gz".into(), KernelConfig::parse(LEGACY_ON)));
        let item = iptables(&f);
        assert_eq!(item.status, Status::Missing, "{item:?}");
        assert!(
            item.detail
                .contains("CONFIG_NETFILTER_XT_MATCH_COMMENT not set"),
            "{item:?}"
        );
        let mut f = Facts {
            modules_available: ["nf_tables", "nft_compat"].map(String::from).into(),
            ..Facts::default()
        };
        assert_eq!(iptables(&f).status, Status::Ok);
        f.modules_available = ["veth".to_string()].into();
        let item = iptables(&f);
        assert_eq!(item.status, Status::Missing);
        assert!(item.detail.contains("no module ip_tables"), "{item:?}");
    }

    #[test]
    fn br_netfilter_loaded_loadable_or_missing() {
        let f = Facts {
            bridge_nf_sysctls: true,
            ..Facts::default()
        };
        assert_eq!(br_netfilter(&f).status, Status::Ok);
        let f = Facts {
            modules_available: ["br_netfilter".to_string()].into(),
            ..Facts::default()
        };
        let item = br_netfilter(&f);
        assert_eq!(item.status, Status::Warn);
        assert!(item.detail.contains("modules-load.d"), "{item:?}");
        let item = br_netfilter(&facts("# CONFIG_BRIDGE_NETFILTER is not set\n"));
        assert_eq!(item.status, Status::Missing);
        assert_eq!(
            br_netfilter(&facts("CONFIG_BRIDGE_NETFILTER=m\n")).status,
            Status::Ok,
            "a given config decides: it can be loaded"
        );
    }
}
