//! Bytes an idle node sends and receives over its uplink, run on demand as root:
//! `cargo bench --bench uplink_bytes`. The real control plane (etcd, kube-apiserver,
//! controller-manager from envtest); `holdfast run` reaches the apiserver only through a
//! TCP relay on 127.0.0.1 (tests/support/proxy) that counts the TCP payload each way and
//! the reads that carried it. Five idle pods run (real busybox containers, host network).
//! After the node settled (`HOLDFAST_BENCH_SETTLE_SECS`, default 30), a window of
//! `HOLDFAST_BENCH_WINDOW_SECS` (default 300: the node status report's period, so that a
//! window holds one) is measured and extrapolated to a day. The controller-manager's
//! `--node-monitor-grace-period` is 5 min, over every renewal interval measured, as a
//! user who lengthens the renewal must set it: under it, the node would go `Unknown`
//! between renewals and back, and each change would cost bytes of its own.
//!
//! Two figures: the TCP payload (TLS records: what the relay carried), and the IP bytes,
//! counted by iptables rules on the loopback traffic to and from the relay's port (IP and
//! TCP headers included, ACKs included). Loopback's MTU is 64 KiB where a cellular link's
//! is about 1500: a body larger than one segment is counted as fewer packets here, so the
//! IP figure is a floor for large answers; the idle traffic is of small messages.
//!
//! Run for each setting a user can change: the defaults, `nodeStatusUpdateFrequency`
//! (the lease renewal interval) and `nodeStatusReportFrequency`, `nodeLeaseDurationSeconds`.
//! `HOLDFAST_BENCH_SETTINGS=default,update20s` picks some by name.
//!
//! Prints a table and writes `target/bench/uplink_bytes.json`.

mod common;

use support::{agent, control_plane, proxy};

use std::process::Command;
use std::time::{Duration, Instant};

use agent::Agent;
use control_plane::{ControlPlane, Options};
use proxy::{Proxy, Traffic};
use serde_json::{json, Value};

const PODS: usize = 5;
const WAIT: Duration = Duration::from_secs(120);
const DAY: f64 = 86_400.0;

/// A setting a user can change, as KubeletConfiguration keys.
struct Setting {
    name: &'static str,
    keys: &'static str,
}

const SETTINGS: &[Setting] = &[
    Setting {
        name: "default",
        keys: "",
    },
    Setting {
        name: "update20s",
        keys: "nodeStatusUpdateFrequency: 20s\n",
    },
    Setting {
        name: "update40s",
        keys: "nodeStatusUpdateFrequency: 40s\nnodeLeaseDurationSeconds: 160\n",
    },
    Setting {
        name: "update40s-report5m",
        keys: "nodeStatusUpdateFrequency: 40s\nnodeLeaseDurationSeconds: 160\nnodeStatusReportFrequency: 5m\n",
    },
    Setting {
        name: "update60s-report5m",
        keys: "nodeStatusUpdateFrequency: 60s\nnodeLeaseDurationSeconds: 240\nnodeStatusReportFrequency: 5m\n",
    },
    Setting {
        name: "update90s-report5m",
        keys: "nodeStatusUpdateFrequency: 90s\nnodeLeaseDurationSeconds: 360\nnodeStatusReportFrequency: 5m\n",
    },
    Setting {
        name: "report10m",
        keys: "nodeStatusReportFrequency: 10m\n",
    },
    Setting {
        name: "lease120s",
        keys: "nodeLeaseDurationSeconds: 120\n",
    },
];

/// Two iptables rules counting the loopback packets to and from the relay's port; removed
/// on drop.
struct IpCounter {
    port: u16,
}

impl IpCounter {
    fn rule(&self, dir: &str) -> Vec<String> {
        let port = self.port.to_string();
        [
            "OUTPUT",
            "-o",
            "lo",
            "-p",
            "tcp",
            dir,
            &port,
            "-m",
            "comment",
            "--comment",
            "holdfast-bench-uplink",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn new(port: u16) -> IpCounter {
        let c = IpCounter { port };
        for dir in ["--dport", "--sport"] {
            let ok = Command::new("iptables")
                .args(["-w", "-I"])
                .args(c.rule(dir))
                .status()
                .expect("iptables");
            assert!(ok.success(), "iptables -I failed");
        }
        c
    }

    /// (packets, bytes) up (to the relay) and down (from it).
    fn read(&self) -> [(u64, u64); 2] {
        let out = Command::new("iptables")
            .args(["-w", "-L", "OUTPUT", "-v", "-x", "-n"])
            .output()
            .expect("iptables -L");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut r = [(0, 0); 2];
        for line in text.lines().filter(|l| l.contains("holdfast-bench-uplink")) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (p, b) = (f[0].parse().unwrap_or(0), f[1].parse().unwrap_or(0));
            if line.contains(&format!("dpt:{}", self.port)) {
                r[0] = (p, b);
            } else if line.contains(&format!("spt:{}", self.port)) {
                r[1] = (p, b);
            }
        }
        r
    }
}

impl Drop for IpCounter {
    fn drop(&mut self) {
        for dir in ["--dport", "--sport"] {
            let _ = Command::new("iptables")
                .args(["-w", "-D"])
                .args(self.rule(dir))
                .status();
        }
    }
}

fn pod_yaml(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         nodeName: {node}\n  automountServiceAccountToken: false\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", \"exec sleep 100000\"]\n"
    )
}

struct Measured {
    window: Duration,
    tcp: Traffic,
    ip: [(u64, u64); 2],
}

impl Measured {
    fn per_day(&self, bytes: u64) -> f64 {
        bytes as f64 * DAY / self.window.as_secs_f64()
    }

    fn json(&self, s: &Setting) -> Value {
        json!({
            "setting": s.name,
            "keys": s.keys,
            "window_secs": self.window.as_secs_f64(),
            "tcp_payload": {"up": self.tcp.up, "down": self.tcp.down,
                            "reads_up": self.tcp.reads_up, "reads_down": self.tcp.reads_down,
                            "connections": self.tcp.connections},
            "ip": {"packets_up": self.ip[0].0, "bytes_up": self.ip[0].1,
                   "packets_down": self.ip[1].0, "bytes_down": self.ip[1].1},
            "tcp_payload_bytes_per_day": self.per_day(self.tcp.up + self.tcp.down),
            "ip_bytes_per_day": self.per_day(self.ip[0].1 + self.ip[1].1),
        })
    }
}

fn measure(cp: &ControlPlane, s: &Setting, settle: Duration, window: Duration) -> Measured {
    let relay = Proxy::start(cp.addr());
    let counter = IpCounter::new(relay.addr().port());
    let node = format!("uplink-{}", s.name);
    let mut a = Agent::new(&format!("bench-uplink-{}", s.name));
    a.node_name = node.clone();
    cp.join(&mut a, "", s.keys);
    cp.relay_kubeconfig(&mut a, &relay.url());
    a.start();
    let log = || format!("--- agent log ---\n{}", a.agent_log());
    cp.wait_for("node Ready", WAIT, log, |cp| {
        cp.get(&format!("node/{node}"), None).filter(|n| {
            n["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
    });
    let names: Vec<String> = (0..PODS).map(|i| format!("{}-{i}", s.name)).collect();
    for n in &names {
        cp.apply(&pod_yaml(n, &node));
    }
    for n in &names {
        cp.wait_for(&format!("{n} Running"), WAIT, log, |cp| {
            cp.get(&format!("pod/{n}"), Some("default"))
                .filter(|p| p["status"]["phase"] == "Running")
        });
    }
    std::thread::sleep(settle);
    let (tcp0, ip0) = (relay.traffic(), counter.read());
    let start = Instant::now();
    std::thread::sleep(window);
    let (tcp1, ip1) = (relay.traffic(), counter.read());
    let window = start.elapsed();
    // What the node controller sees: the Lease's renewTime still moves.
    let renewed = |cp: &ControlPlane| {
        cp.get(&format!("lease/{node}"), Some("kube-node-lease"))
            .map(|l| l["spec"]["renewTime"].to_string())
    };
    let before = renewed(cp);
    cp.wait_for("the Lease renewed again", WAIT, log, |cp| {
        renewed(cp).filter(|r| Some(r) != before.as_ref())
    });
    for n in &names {
        let _ = cp.kubectl(&[
            "delete",
            "pod",
            n,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]);
    }
    drop(a);
    let _ = cp.kubectl(&["delete", "node", &node, "--wait=false"]);
    let d = |i: usize| (ip1[i].0 - ip0[i].0, ip1[i].1 - ip0[i].1);
    Measured {
        window,
        tcp: tcp1.since(&tcp0),
        ip: [d(0), d(1)],
    }
}

fn kib_day(v: f64) -> String {
    format!("{:.0} KiB", v / 1024.0)
}

fn main() {
    if !agent::need_root() {
        eprintln!("uplink_bytes bench: needs root (it runs containers and iptables)");
        std::process::exit(2);
    }
    let settle = Duration::from_secs(common::env_secs("HOLDFAST_BENCH_SETTLE_SECS", 30));
    let window = Duration::from_secs(common::env_secs("HOLDFAST_BENCH_WINDOW_SECS", 300));
    let picked = std::env::var("HOLDFAST_BENCH_SETTINGS").ok();
    let settings: Vec<&Setting> = SETTINGS
        .iter()
        .filter(|s| {
            picked
                .as_deref()
                .is_none_or(|p| p.split(',').any(|n| n == s.name))
        })
        .collect();
    let cp = ControlPlane::start(Options {
        scheduler: false,
        node_monitor_grace_period: Duration::from_secs(300),
        ..Options::default()
    });
    cp.wait_for("the default ServiceAccount", WAIT, String::new, |cp| {
        cp.get("serviceaccount/default", Some("default"))
    });
    let mut rows = Vec::new();
    for s in settings {
        eprintln!("{}: settle {settle:?}, window {window:?}", s.name);
        let m = measure(&cp, s, settle, window);
        rows.push((s, m));
    }

    println!();
    println!("uplink bytes, {PODS} idle pods, extrapolated to a day (IP: iptables counters on lo)");
    println!(
        "{:<10} {:>8} {:>9} {:>9} {:>7} {:>7} {:>5} {:>12} {:>12}",
        "setting", "window", "tcp up", "tcp down", "pkt up", "pkt dn", "conns", "tcp/day", "IP/day"
    );
    for (s, m) in &rows {
        println!(
            "{:<10} {:>7.0}s {:>9} {:>9} {:>7} {:>7} {:>5} {:>12} {:>12}",
            s.name,
            m.window.as_secs_f64(),
            m.tcp.up,
            m.tcp.down,
            m.ip[0].0,
            m.ip[1].0,
            m.tcp.connections,
            kib_day(m.per_day(m.tcp.up + m.tcp.down)),
            kib_day(m.per_day(m.ip[0].1 + m.ip[1].1)),
        );
    }
    let out = json!({
        "pods": PODS,
        "settle_secs": settle.as_secs(),
        "ip_figure": "iptables packet and byte counters on the loopback traffic to and from the relay port (MTU 64 KiB)",
        "settings": rows.iter().map(|(s, m)| m.json(s)).collect::<Vec<_>>(),
    });
    common::write_json("uplink_bytes", &out);
}
