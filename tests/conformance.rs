//! The upstream node conformance suite (`e2e.test` v1.36.2, `../shared/conformance/`)
//! against holdfast as the one node of the real envtest control plane (with the
//! controller-manager and the scheduler): its kubelet API on port 10250 at an address of
//! its own, its own CNI network, and the suite's images, built as stand-ins by
//! `tests/conformance/images/build.sh` (the shared script, with what the stand-ins
//! lacked added), pulled from Debian's `docker-registry` on 127.0.0.1 as a mirror of
//! `registry.k8s.io`.
//!
//! `node_conformance` (ignored: `tests/conformance/run.sh` runs it) runs every selected
//! spec in several `e2e.test` processes, merges their JUnit results per spec and ends
//! with `N passed, M failed`, each failure listed with its message; the results go to
//! `target/conformance/`. `a_short_subset_passes` runs a few quick specs of different
//! areas on every test run.
//!
//! Environment: `CONFORMANCE_FOCUS` (`|`-separated parts of specs' texts: only specs
//! holding one run), `CONFORMANCE_PROCS` (processes, default 4),
//! `CONFORMANCE_SLOW=0` (leave the `[Slow]` specs out).

use support::agent::{need_root, Agent};
use support::cni::TestNetwork;
use support::control_plane::cluster::{tail, wait_node, NO_PRESSURE};
use support::control_plane::link::NodeAddress;
use support::control_plane::{ControlPlane, Options};
use support::registry::{Auth, Registry};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const NODE: &str = "conformance-node";
/// The usual selection for a node with no cloud provider (the suite's README).
const FOCUS: &str = r"\[NodeConformance\]";
const SKIP: &str = r"\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:|\[LinuxOnly\].*sysctl";

/// `e2e.test` and `agnhost`, unpacked once.
fn suite_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("bash")
            .arg(shared().join("conformance/setup.sh"))
            .output()
            .expect("run conformance setup.sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// The shared folder beside the checkout.
fn shared() -> PathBuf {
    support::repo_root().join("../shared")
}

fn out_dir() -> PathBuf {
    let dir = support::target_tmpdir()
        .parent()
        .expect("target dir")
        .join("conformance");
    std::fs::create_dir_all(&dir).expect("conformance out dir");
    dir
}

/// The cluster the suite runs against; everything stops and is removed on drop.
struct Site {
    cp: ControlPlane,
    agent: Agent,
    _registry: Registry,
    _net: TestNetwork,
    _addr: NodeAddress,
    ca_maps: CaMaps,
}

impl Site {
    fn start() -> Site {
        let cp = ControlPlane::start(Options::default());
        let registry = Registry::start(&cp.dir.join("registry"), cp.pki(), Auth::None);
        build_images(&registry);
        let addr = NodeAddress::new(0);
        let mut a = Agent::new("conformance");
        a.node_name = NODE.into();
        a.address = addr.ip.clone();
        // The suite reads the node's pods through the node proxy at <node>:10250.
        a.port = 10250;
        let net = TestNetwork::new(&a, 0);
        let mirror = format!(
            "  registries:\n    registry.k8s.io:\n      mirrors:\n        - host: https://{}\n          \
             capabilities: [pull, resolve]\n          caFile: {}\n",
            registry.host(),
            registry.ca.display()
        );
        cp.join(
            &mut a,
            // The kubelet's defaults the suite counts on (holdfast's are stricter).
            &format!("{}{mirror}  allowPrivileged: true\n", net.holdfast_keys()),
            &format!(
                "nodeStatusUpdateFrequency: 2s\nnodeStatusReportFrequency: 10s\n{NO_PRESSURE}"
            ),
        );
        a.extra_args
            .extend(["--node-ip".to_string(), addr.ip.clone()]);
        kubelet_back_off(&a);
        a.start();
        wait_node(&cp, &a, NODE, true);
        let ca_maps = CaMaps::start(&cp);
        Site {
            cp,
            agent: a,
            _registry: registry,
            _net: net,
            _addr: addr,
            ca_maps,
        }
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.ca_maps.stop.store(true, Ordering::Relaxed);
        self.agent.stop();
    }
}

/// The kubelet's crash-loop back-off (10 s doubling to 5 min), which the suite's
/// back-off specs measure, instead of the short one of the other tests.
fn kubelet_back_off(a: &Agent) {
    let path = a.dir.join("config.yaml");
    let config = std::fs::read_to_string(&path).expect("agent config");
    let kubelets = config
        .replace(
            "crashLoopBackOffInitial: 1s",
            "crashLoopBackOffInitial: 10s",
        )
        .replace("crashLoopBackOffMax: 4s", "crashLoopBackOffMax: 5m");
    assert_ne!(config, kubelets, "the harness's back-off keys moved");
    std::fs::write(&path, kubelets).expect("agent config");
}

/// The suite's images by their real names in `registry` (`images/build.sh`).
fn build_images(registry: &Registry) {
    let t0 = Instant::now();
    let out = Command::new("bash")
        .arg(support::repo_root().join("tests/conformance/images/build.sh"))
        .arg(suite_dir().join("agnhost"))
        .arg(registry.host())
        .env("DEST_TLS", "false")
        .env("ARCH", go_arch())
        .stdin(Stdio::null())
        .output()
        .expect("run images/build.sh");
    assert!(
        out.status.success(),
        "images/build.sh: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("conformance: images built and pushed in {:?}", t0.elapsed());
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        "arm" => "arm",
        _ => "amd64",
    }
}

/// Gives each namespace the `openshift-service-ca.crt` ConfigMap that this apiserver
/// build's ServiceAccount admission projects into every pod (the suite's README):
/// polled, until `stop`.
struct CaMaps {
    stop: Arc<AtomicBool>,
}

impl CaMaps {
    fn start(cp: &ControlPlane) -> CaMaps {
        let stop = Arc::new(AtomicBool::new(false));
        let kubectl = cp.assets.join("kubectl");
        let kubeconfig = cp.admin_kubeconfig.clone();
        let ca = std::fs::read_to_string(cp.ca()).expect("ca");
        let done = stop.clone();
        std::thread::spawn(move || {
            let run = |args: &[&str]| {
                Command::new(&kubectl)
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(args)
                    .stdin(Stdio::null())
                    .output()
                    .ok()
                    .filter(|o| o.status.success())
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            };
            let mut seen = std::collections::BTreeSet::new();
            while !done.load(Ordering::Relaxed) {
                let names = run(&["get", "ns", "-o", "name"]).unwrap_or_default();
                for ns in names.lines().filter_map(|l| l.strip_prefix("namespace/")) {
                    if seen.contains(ns) {
                        continue;
                    }
                    let made = run(&[
                        "create",
                        "configmap",
                        "openshift-service-ca.crt",
                        "-n",
                        ns,
                        &format!("--from-literal=service-ca.crt={ca}"),
                    ]);
                    let there = made.is_some()
                        || run(&["get", "configmap", "openshift-service-ca.crt", "-n", ns])
                            .is_some();
                    if there {
                        seen.insert(ns.to_string());
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        CaMaps { stop }
    }
}

/// The selected specs' texts, as the suite lists them (`--ginkgo.dry-run`).
fn select(extra_focus: Option<&str>, slow: bool) -> Vec<String> {
    let dir = out_dir().join("dry-run");
    let _ = std::fs::remove_dir_all(&dir);
    let skip = if slow {
        SKIP.to_string()
    } else {
        format!(r"{SKIP}|\[Slow\]")
    };
    let out = Command::new(suite_dir().join("e2e.test"))
        .args(["--provider", "skeleton", "--kubeconfig", "/dev/null"])
        .arg(format!("--ginkgo.focus={FOCUS}"))
        .arg(format!("--ginkgo.skip={skip}"))
        .args(["--ginkgo.dry-run", "--ginkgo.no-color"])
        .arg(format!("--report-dir={}", dir.display()))
        .stdin(Stdio::null())
        .output()
        .expect("e2e.test --ginkgo.dry-run");
    assert!(out.status.success(), "dry run: {}", text(&out));
    let junit = std::fs::read_to_string(dir.join("junit_01.xml")).expect("dry-run junit");
    let wanted = extra_focus.map(any_of);
    junit::cases(&junit)
        .into_iter()
        .filter(|c| c.status == junit::Status::Passed)
        .filter_map(|c| c.name.strip_prefix("[It] ").map(str::to_string))
        .filter(|name| wanted.as_ref().is_none_or(|w| w(name)))
        .collect()
}

/// `CONFORMANCE_FOCUS`: `|`-separated parts of specs' texts, any of which selects a spec.
fn any_of(focus: &str) -> impl Fn(&str) -> bool {
    let parts: Vec<String> = focus.split('|').map(str::to_string).collect();
    move |name: &str| parts.iter().any(|p| name.contains(p.as_str()))
}

/// Escapes a spec's text for `--ginkgo.focus` (Go's RE2).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `specs` over `procs` processes of `e2e.test` against `site`; the merged result
/// per spec.
fn run(site: &Site, specs: &[String], procs: usize, name: &str) -> BTreeMap<String, junit::Case> {
    let dir = out_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("run dir");
    let procs = procs.clamp(1, specs.len().max(1));
    let mut groups: Vec<Vec<&String>> = vec![Vec::new(); procs];
    for (i, s) in specs.iter().enumerate() {
        groups[i % procs].push(s);
    }
    let children: Vec<_> = groups
        .iter()
        .enumerate()
        .map(|(i, group)| {
            let focus = group
                .iter()
                .map(|s| escape(s))
                .collect::<Vec<_>>()
                .join("|");
            let report = dir.join(format!("p{i}"));
            let log = std::fs::File::create(dir.join(format!("p{i}.log"))).expect("log");
            let child = Command::new(suite_dir().join("e2e.test"))
                .arg("--kubeconfig")
                .arg(&site.cp.admin_kubeconfig)
                .args(["--provider", "skeleton", "--ginkgo.no-color"])
                .arg(format!("--ginkgo.focus={focus}"))
                .arg(format!("--ginkgo.skip={SKIP}"))
                .arg("--ginkgo.timeout=3h")
                .arg(format!("--report-dir={}", report.display()))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log fd"))
                .stderr(log)
                .spawn()
                .expect("spawn e2e.test");
            (report, child)
        })
        .collect();
    let mut merged: BTreeMap<String, junit::Case> = BTreeMap::new();
    for (report, mut child) in children {
        let _ = child.wait();
        let xml = std::fs::read_to_string(report.join("junit_01.xml")).unwrap_or_default();
        for case in junit::cases(&xml) {
            let Some(name) = case.name.strip_prefix("[It] ").map(str::to_string) else {
                continue;
            };
            if !specs.contains(&name) || case.status == junit::Status::Skipped {
                continue;
            }
            // A spec run twice (its text inside another's focus) counts once, failed
            // if either run failed.
            let keep = merged
                .get(&name)
                .is_none_or(|c| c.status == junit::Status::Passed);
            if keep {
                merged.insert(name, case);
            }
        }
    }
    merged
}

/// Prints `N passed, M failed` with each failure, writes it to `<out>/<name>.txt`;
/// the failures' names.
fn report(specs: &[String], merged: &BTreeMap<String, junit::Case>, name: &str) -> Vec<String> {
    let mut failed = Vec::new();
    let mut lines = Vec::new();
    for s in specs {
        match merged.get(s) {
            Some(c) if c.status == junit::Status::Passed => {}
            Some(c) => {
                failed.push(s.clone());
                lines.push(format!("FAILED {s}\n    {}", c.message.trim()));
            }
            None => {
                failed.push(s.clone());
                lines.push(format!("NOT RUN {s}"));
            }
        }
    }
    let summary = format!(
        "{} passed, {} failed\n{}",
        specs.len() - failed.len(),
        failed.len(),
        lines.join("\n")
    );
    println!("{summary}");
    std::fs::write(out_dir().join(format!("{name}.txt")), &summary).expect("summary");
    failed
}

#[test]
#[ignore = "the whole suite, an hour or more: tests/conformance/run.sh"]
fn node_conformance() {
    if !need_root() {
        return;
    }
    let focus = std::env::var("CONFORMANCE_FOCUS").ok();
    let slow = std::env::var("CONFORMANCE_SLOW").map_or(true, |v| v != "0");
    let procs = std::env::var("CONFORMANCE_PROCS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let specs = select(focus.as_deref(), slow);
    assert!(!specs.is_empty(), "no spec selected");
    let t0 = Instant::now();
    let site = Site::start();
    eprintln!(
        "conformance: {} specs in {procs} processes, cluster up in {:?}",
        specs.len(),
        t0.elapsed()
    );
    let merged = run(&site, &specs, procs, "node-conformance");
    let failed = report(&specs, &merged, "node-conformance");
    eprintln!("conformance: the run took {:?}", t0.elapsed());
    assert!(
        failed.is_empty(),
        "{} of {} specs failed (above); agent log tail:\n{}",
        failed.len(),
        specs.len(),
        tail(&site.agent.agent_log(), 20)
    );
}

/// Quick specs of different areas: pods and their status, the environment, volumes, the
/// kubelet API's logs and exec, probes.
const SUBSET: &[&str] = &[
    "[sig-node] Pods should get a host IP [NodeConformance] [Conformance]",
    "[sig-node] Downward API should provide pod name, namespace and IP address as env vars [NodeConformance] [Conformance]",
    "[sig-storage] EmptyDir volumes should support (root,0644,tmpfs) [LinuxOnly] [NodeConformance] [Conformance]",
    "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs [NodeConformance] [Conformance]",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart exec hook properly [NodeConformance] [Conformance]",
];

#[test]
fn a_short_subset_passes() {
    if !need_root() || !support::registry::tools_present() {
        return;
    }
    let all = select(None, true);
    let specs: Vec<String> = SUBSET.iter().map(|s| s.to_string()).collect();
    for s in &specs {
        assert!(all.contains(s), "not a selected spec of this suite: {s}");
    }
    let site = Site::start();
    let merged = run(&site, &specs, 2, "subset");
    let failed = report(&specs, &merged, "subset");
    assert!(
        failed.is_empty(),
        "{failed:?} failed (above); agent log tail:\n{}",
        tail(&site.agent.agent_log(), 30)
    );
}

/// The JUnit report's test cases, read with no XML library: the attributes and the
/// failure message `e2e.test` writes.
mod junit {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Status {
        Passed,
        Failed,
        Skipped,
    }

    #[derive(Debug, Clone)]
    pub struct Case {
        pub name: String,
        pub status: Status,
        pub message: String,
    }

    pub fn cases(xml: &str) -> Vec<Case> {
        let mut out = Vec::new();
        for chunk in xml.split("<testcase ").skip(1) {
            let body = chunk.split("</testcase>").next().unwrap_or(chunk);
            let Some(name) = attr(body, "name") else {
                continue;
            };
            let status = match attr(body, "status").as_deref() {
                Some("passed") => Status::Passed,
                Some("skipped") | Some("pending") => Status::Skipped,
                _ => Status::Failed,
            };
            // The message attribute is often empty: the text is the element's.
            let message = body
                .split_once("<failure ")
                .and_then(|(_, rest)| rest.split_once('>'))
                .map(|(attrs, rest)| {
                    let text = rest.split("</failure>").next().unwrap_or_default();
                    let attr = attrs
                        .split_once("message=\"")
                        .and_then(|(_, m)| m.split_once('"'))
                        .map(|(m, _)| m)
                        .unwrap_or_default();
                    unescape(if attr.is_empty() { text } else { attr })
                })
                .unwrap_or_default();
            out.push(Case {
                name,
                status,
                message,
            });
        }
        out
    }

    fn attr(tag: &str, name: &str) -> Option<String> {
        let head = tag.split('>').next()?;
        let (_, rest) = head
            .split_once(&format!(" {name}=\""))
            .or_else(|| head.strip_prefix(&format!("{name}=\"")).map(|r| ("", r)))?;
        rest.split_once('"').map(|(v, _)| unescape(v))
    }

    fn unescape(s: &str) -> String {
        s.replace("&#xA;", "\n")
            .replace("&#x9;", "\t")
            .replace("&quot;", "\"")
            .replace("&#34;", "\"")
            .replace("&#39;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    }
}
