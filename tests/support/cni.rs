//! A CNI network of a test's own: a bridge whose name no one else uses, a /24 from
//! the range set aside for tests (198.18.0.0/15, RFC 2544), host-local leases under
//! the agent's directory, Debian's real plugins. Dropping it deletes the bridge; each
//! pod's own rules and leases are the agent's to remove (CNI DEL), and tests check it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use super::agent::Agent;

/// Where Debian's containernetworking-plugins are.
pub const PLUGINS: &str = "/usr/lib/cni";

pub struct TestNetwork {
    pub name: String,
    pub bridge: String,
    /// `198.18.X.0/24`.
    pub subnet: String,
    /// `198.18.X.`: the subnet's prefix, for checks.
    pub prefix: String,
    pub conf_dir: PathBuf,
    pub ipam_dir: PathBuf,
}

/// Skips the calling test (with a printed reason) when the CNI plugins are missing.
pub fn need_plugins() -> bool {
    let ok = ["bridge", "host-local", "portmap", "loopback"]
        .iter()
        .all(|p| Path::new(PLUGINS).join(p).exists());
    if !ok {
        eprintln!("skipped: needs Debian's containernetworking-plugins in {PLUGINS}");
    }
    ok
}

impl TestNetwork {
    /// A network for `agent`; `index` tells apart several networks of one test binary.
    pub fn new(agent: &Agent, index: u32) -> TestNetwork {
        let pid = std::process::id();
        let n = (pid.wrapping_mul(7).wrapping_add(index * 131)) % 512;
        let (second, third) = (18 + n / 256, n % 256);
        let bridge = format!("hft{}x{index}", pid % 100_000);
        let conf_dir = agent.dir.join("cni-conf");
        let ipam_dir = agent.dir.join("cni-ipam");
        std::fs::create_dir_all(&conf_dir).expect("cni conf dir");
        let net = TestNetwork {
            name: format!("hftest{index}"),
            bridge,
            subnet: format!("198.{second}.{third}.0/24"),
            prefix: format!("198.{second}.{third}."),
            conf_dir,
            ipam_dir,
        };
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": net.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": net.bridge,
                    "isGateway": true,
                    "ipMasq": true,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": net.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": net.ipam_dir,
                    }
                },
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        std::fs::write(
            net.conf_dir.join("10-test.conflist"),
            serde_json::to_vec_pretty(&conflist).expect("json"),
        )
        .expect("write conflist");
        net
    }

    /// The `holdfast:` keys that point an agent at this network (to go first in the
    /// text `Agent::write_config` appends).
    pub fn holdfast_keys(&self) -> String {
        format!(
            "  cniConfDir: {}\n  cniBinDir: {PLUGINS}\n",
            self.conf_dir.display()
        )
    }

    /// Leases host-local holds now: address to container id.
    pub fn leases(&self) -> Vec<(String, String)> {
        let dir = self.ipam_dir.join(&self.name);
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.parse::<std::net::IpAddr>().is_ok() {
                let owner = std::fs::read_to_string(e.path()).unwrap_or_default();
                let id = owner.lines().next().unwrap_or("").trim().to_owned();
                out.push((name, id));
            }
        }
        out.sort();
        out
    }
}

/// The NAT rules (iptables-save) that name `id`: what bridge and portmap add for one
/// attachment, and DEL must take away.
pub fn nat_rules_naming(id: &str) -> Vec<String> {
    let out = Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter(|l| l.contains(id))
        .map(str::to_owned)
        .collect()
}

/// Drops the NAT rules and chains that name `id`, as a reboot drops all of netfilter's
/// state (a test's simulated power cut has no reboot to do it).
pub fn forget_rules_naming(id: &str) {
    let mut chains = Vec::new();
    for line in nat_rules_naming(id) {
        let Some(rule) = line.strip_prefix("-A ") else {
            continue;
        };
        let mut words = rule.split_whitespace();
        let chain = words.next().unwrap_or("");
        let target = rule
            .rsplit(" -j ")
            .next()
            .unwrap_or("")
            .split_whitespace()
            .next();
        for c in [Some(chain), target].into_iter().flatten() {
            if c.starts_with("CNI-")
                && !c.starts_with("CNI-HOSTPORT-")
                && !chains.contains(&c.to_owned())
            {
                chains.push(c.to_owned());
            }
        }
        // iptables-save quotes as a shell would read it.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!("iptables -t nat -D {rule}"))
            .output();
    }
    for c in chains {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-F", &c])
            .output();
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-X", &c])
            .output();
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}
