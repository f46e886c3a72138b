//! A real Kubernetes control plane for a test: etcd and kube-apiserver (Node and RBAC
//! authorization, NodeRestriction), optionally kube-controller-manager and
//! kube-scheduler, all v1.36 from `KUBEBUILDER_ASSETS` (else what
//! `../shared/envtest/setup.sh` unpacks), on 127.0.0.1 with free ports, with
//! certificates made here. Each test starts its own; nothing is shared. Dropping it
//! kills and waits for every process and removes its directory (etcd's data is in
//! /dev/shm, so the cluster costs no disk writes).
//!
//! It gives an admin kubeconfig and [`ControlPlane::kubectl`] running the real kubectl
//! with it, a node kubeconfig (`system:node:<name>`) and kubelet serving certificate for
//! an [`Agent`] ([`ControlPlane::join`]), and JSON getters and waits.

#![allow(dead_code)]

mod apiservers;
mod certs;
pub mod cluster;
pub mod kubectl;
pub mod link;
pub use crate::pki;
mod process;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::agent::{free_port, Agent};
use certs::{Certs, SERVICE_CIDR};
use process::Process;

/// What runs beside etcd and the apiserver.
#[derive(Debug, Clone)]
pub struct Options {
    /// kube-controller-manager: service accounts, `kube-root-ca.crt`, Deployments and
    /// ReplicaSets, node lifecycle, garbage collection, namespace deletion.
    pub controller_manager: bool,
    /// Its `--controllers` (`*` for all; `*,-root-ca-cert-publisher` leaves one out).
    pub controllers: String,
    /// Its `--node-monitor-grace-period`: how long a silent node stays Ready.
    pub node_monitor_grace_period: Duration,
    pub scheduler: bool,
    /// More kube-apiserver flags (`--audit-policy-file=...`), after the harness's own.
    pub apiserver_args: Vec<String>,
    /// More kube-controller-manager flags (`--cluster-signing-duration=120s`).
    pub controller_manager_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller_manager: true,
            controllers: "*".into(),
            node_monitor_grace_period: Duration::from_secs(40),
            scheduler: true,
            apiserver_args: Vec::new(),
            controller_manager_args: Vec::new(),
        }
    }
}

impl Options {
    /// etcd and the apiserver only: the cheapest cluster, for tests that need no
    /// controller (a test then creates the namespace's `default` ServiceAccount itself).
    pub fn bare() -> Options {
        Options {
            controller_manager: false,
            scheduler: false,
            ..Options::default()
        }
    }
}

pub struct ControlPlane {
    pub dir: PathBuf,
    /// The folder holding the binaries (`KUBEBUILDER_ASSETS`).
    pub assets: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    pub admin_kubeconfig: PathBuf,
    /// How long the start took, until `/readyz` answered ok.
    pub started_in: Duration,
    certs: Certs,
    /// Stopped in reverse order of start (the scheduler first, etcd last).
    procs: Vec<Process>,
    /// Where every kube-apiserver of the cluster keeps its data.
    etcd_url: String,
    /// The tests' kube-apiserver flags, for every apiserver of the cluster.
    apiserver_args: Vec<String>,
    /// Each kube-apiserver's URL and process name, the first one's first.
    apiservers: Vec<(String, String)>,
}

/// The binaries' folder: `KUBEBUILDER_ASSETS`, else what setup.sh unpacks (once per
/// test binary).
pub fn assets() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir);
        }
        let setup = crate::repo_root().join("../shared/envtest/setup.sh");
        let out = Command::new("bash")
            .arg(&setup)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", setup.display()));
        assert!(
            out.status.success(),
            "{} failed: {}",
            setup.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// A directory for one cluster: in /dev/shm when there is one (etcd writes there).
fn cluster_dir() -> PathBuf {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("holdfast-cp-{}-{seq}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("control plane dir");
    dir
}

fn s(v: impl std::fmt::Display) -> String {
    v.to_string()
}

impl ControlPlane {
    /// The apiserver's address, `127.0.0.1:<port>` (for a relay in front of it).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.url
            .trim_start_matches("https://")
            .parse()
            .expect("apiserver address")
    }

    /// Starts a cluster and waits (bounded) until the apiserver is ready.
    pub fn start(opts: Options) -> ControlPlane {
        let t0 = Instant::now();
        let assets = assets().to_path_buf();
        let dir = cluster_dir();
        let certs = Certs::new(&dir.join("pki"));
        let mut cp = ControlPlane {
            url: String::new(),
            admin_kubeconfig: PathBuf::new(),
            started_in: Duration::ZERO,
            assets,
            certs,
            procs: Vec::new(),
            dir,
            etcd_url: String::new(),
            apiserver_args: opts.apiserver_args.clone(),
            apiservers: Vec::new(),
        };
        cp.etcd_url = cp.start_etcd();
        let port = free_port();
        cp.url = format!("https://127.0.0.1:{port}");
        cp.admin_kubeconfig =
            cp.certs
                .kubeconfig(&cp.url, "admin", "kubernetes-admin", &["system:masters"]);
        cp.start_apiserver("kube-apiserver", port);
        cp.apiservers
            .push((cp.url.clone(), "kube-apiserver".into()));
        cp.wait_ready();
        if opts.controller_manager {
            cp.start_controller_manager(&opts);
        }
        if opts.scheduler {
            cp.start_scheduler();
        }
        cp.started_in = t0.elapsed();
        cp
    }

    fn spawn(&mut self, name: &str, args: Vec<String>) {
        self.spawn_as(name, name, args);
    }

    /// Starts binary `bin` as a process named `name` (its log is `<name>.log`).
    fn spawn_as(&mut self, name: &str, bin: &str, args: Vec<String>) {
        let bin = self.assets.join(bin);
        let p = Process::spawn(name, &bin, &args, &self.dir);
        self.procs.push(p);
    }

    fn start_etcd(&mut self) -> String {
        let (client, peer) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{client}");
        let peer = format!("http://127.0.0.1:{peer}");
        let config = self.dir.join("etcd.yaml");
        // This etcd takes only a config file (embed.Config's YAML keys).
        std::fs::write(
            &config,
            format!(
                "name: test\ndata-dir: {}\nlisten-client-urls: {client}\n\
                 advertise-client-urls: {client}\nlisten-peer-urls: {peer}\n\
                 initial-advertise-peer-urls: {peer}\ninitial-cluster: test={peer}\n\
                 unsafe-no-fsync: true\nlog-level: warn\n",
                self.dir.join("etcd").display()
            ),
        )
        .expect("etcd config");
        self.spawn("etcd", vec![s("--config-file"), s(config.display())]);
        client
    }

    /// Starts a kube-apiserver named `name` on `port`, on the cluster's etcd, with the
    /// cluster's serving certificate, client CA and service-account keys.
    fn start_apiserver(&mut self, name: &str, port: u16) {
        let (etcd, extra) = (&self.etcd_url, &self.apiserver_args);
        let c = &self.certs;
        let mut args = vec![
            s("--bind-address=127.0.0.1"),
            s("--advertise-address=127.0.0.1"),
            format!("--secure-port={port}"),
            format!("--etcd-servers={etcd}"),
            format!(
                "--cert-dir={}",
                self.dir.join(format!("{name}-certs")).display()
            ),
            format!("--tls-cert-file={}", c.apiserver.cert.display()),
            format!("--tls-private-key-file={}", c.apiserver.key.display()),
            format!("--client-ca-file={}", c.pki.ca.display()),
            s("--authorization-mode=Node,RBAC"),
            s("--enable-admission-plugins=NodeRestriction"),
            // No kube-proxy or Service network here: the apiserver cannot reach the
            // address it would publish for the `kubernetes` Service.
            s("--endpoint-reconciler-type=none"),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            s("--service-account-issuer=https://kubernetes.default.svc.cluster.local"),
            format!("--service-account-key-file={}", c.sa_pub.display()),
            format!("--service-account-signing-key-file={}", c.sa_key.display()),
            // To kubelets (`kubectl logs`, `exec`, the node proxy): a client
            // certificate, and their serving certificate checked against the test CA;
            // a test agent reports the one address it listens on as its InternalIP.
            format!(
                "--kubelet-client-certificate={}",
                c.kubelet_client.cert.display()
            ),
            format!("--kubelet-client-key={}", c.kubelet_client.key.display()),
            format!("--kubelet-certificate-authority={}", c.pki.ca.display()),
            s("--kubelet-preferred-address-types=InternalIP"),
            s("--allow-privileged=true"),
            s("--profiling=false"),
            // 3 logs every request with its status (HOLDFAST_TEST_APISERVER_V=3).
            format!(
                "--v={}",
                std::env::var("HOLDFAST_TEST_APISERVER_V").unwrap_or_else(|_| "1".into())
            ),
        ];
        args.extend(extra.iter().cloned());
        self.spawn_as(name, "kube-apiserver", args);
    }

    /// Polls `/readyz` until it answers ok, failing at once (with its log) if the
    /// apiserver or etcd exits, and after a deadline.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            for p in &mut self.procs {
                p.assert_running();
            }
            let out = self.kubectl(&["get", "--raw", "/readyz", "--request-timeout=2s"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
                return;
            }
            if Instant::now() > deadline {
                let tail = self.procs.last().map(|p| p.tail(40)).unwrap_or_default();
                panic!(
                    "kube-apiserver not ready within 90 s: {}\n--- its log ---\n{tail}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_controller_manager(&mut self, opts: &Options) {
        let kubeconfig = self.certs.kubeconfig(
            &self.url,
            "controller-manager",
            "system:kube-controller-manager",
            &[],
        );
        let c = &self.certs;
        let grace = opts.node_monitor_grace_period.as_secs().max(2);
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            s("--bind-address=127.0.0.1"),
            format!("--secure-port={}", free_port()),
            format!("--cert-dir={}", self.dir.join("kcm-certs").display()),
            s("--leader-elect=false"),
            format!("--controllers={}", opts.controllers),
            s("--use-service-account-credentials=true"),
            format!("--cluster-signing-cert-file={}", c.pki.ca.display()),
            format!(
                "--cluster-signing-key-file={}",
                c.pki.dir.join("ca.key").display()
            ),
            format!("--root-ca-file={}", c.pki.ca.display()),
            format!("--service-account-private-key-file={}", c.sa_key.display()),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--node-monitor-grace-period={grace}s"),
            s("--node-monitor-period=1s"),
            s("--profiling=false"),
        ];
        args.extend(opts.controller_manager_args.iter().cloned());
        self.spawn("kube-controller-manager", args);
    }

    fn start_scheduler(&mut self) {
        let kubeconfig =
            self.certs
                .kubeconfig(&self.url, "scheduler", "system:kube-scheduler", &[]);
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            s("--bind-address=127.0.0.1"),
            format!("--secure-port={}", free_port()),
            format!("--cert-dir={}", self.dir.join("scheduler-certs").display()),
            s("--leader-elect=false"),
            s("--profiling=false"),
        ];
        self.spawn("kube-scheduler", args);
    }

    /// The CA every certificate of this cluster chains to (PEM file).
    pub fn ca(&self) -> &Path {
        &self.certs.pki.ca
    }

    /// The cluster's CA, to issue more certificates from (a konnectivity server's, a
    /// kubelet serving certificate for more names).
    pub fn pki(&self) -> &crate::pki::Pki {
        &self.certs.pki
    }

    /// A kubeconfig for node `node` (CN=system:node:<node>, O=system:nodes).
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        self.certs.kubeconfig(
            &self.url,
            &format!("node-{node}"),
            &format!("system:node:{node}"),
            &["system:nodes"],
        )
    }

    /// Makes `agent` a node of this cluster: its `node_name`'s kubeconfig, a kubelet
    /// serving certificate from the cluster CA for its `address` and node name, and the
    /// CA as `clientCAFile` so the apiserver's client certificate is accepted. Writes
    /// the agent's config: `holdfast_keys` go under `holdfast:`, `top_level` after.
    pub fn join(&self, agent: &mut Agent, holdfast_keys: &str, top_level: &str) {
        let kubeconfig = self.node_kubeconfig(&agent.node_name);
        self.join_with(agent, holdfast_keys, top_level, "--kubeconfig", &kubeconfig);
    }

    /// [`join`](Self::join) with the node's credential given as `flag` (`--kubeconfig`,
    /// or `--bootstrap-kubeconfig` for a node that asks for its certificate).
    pub fn join_with(&self, agent: &mut Agent, keys: &str, top: &str, flag: &str, file: &Path) {
        let (holdfast_keys, top_level) = (keys, top);
        let node = agent.node_name.clone();
        let serving = self
            .certs
            .pki
            .server(&format!("kubelet-{node}"), &[&agent.address, &node]);
        agent.write_config(&format!(
            "{holdfast_keys}{top_level}tlsCertFile: {}\ntlsPrivateKeyFile: {}\n\
             authentication:\n  x509:\n    clientCAFile: {}\n",
            serving.cert.display(),
            serving.key.display(),
            self.certs.pki.ca.display()
        ));
        agent
            .extra_args
            .extend([flag.to_string(), file.display().to_string()]);
    }

    /// After `join`: the agent reaches the apiserver at `url` (a relay in front of it)
    /// with the node's kubeconfig.
    pub fn relay_kubeconfig(&self, agent: &mut Agent, url: &str) {
        let text = std::fs::read_to_string(self.node_kubeconfig(&agent.node_name))
            .expect("node kubeconfig");
        assert!(
            text.contains(&self.url),
            "the kubeconfig names {}",
            self.url
        );
        let relayed = agent.dir.join("kubeconfig-relayed");
        std::fs::write(&relayed, text.replace(&self.url, url)).expect("write kubeconfig");
        let at = agent
            .extra_args
            .iter()
            .position(|x| x == "--kubeconfig")
            .expect("--kubeconfig");
        agent.extra_args[at + 1] = relayed.display().to_string();
    }

    /// A ServiceAccount `sa` in `default` that may get `nodes/metrics` (ClusterRole
    /// `node-metrics`, made if missing), bound by a ClusterRoleBinding of its own.
    pub fn node_metrics_reader(&self, sa: &str) {
        self.apply(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  \
             name: node-metrics\nrules:\n- apiGroups: [\"\"]\n  resources: [nodes/metrics]\n  \
             verbs: [get]\n",
        );
        self.kubectl_ok(&["create", "serviceaccount", sa]);
        self.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            &format!("{sa}-node-metrics"),
            "--clusterrole=node-metrics",
            &format!("--serviceaccount=default:{sa}"),
        ]);
    }

    /// Turns on, in a config `join` or `join_with` wrote, Webhook authentication with
    /// `webhook` (`{enabled: true}` and its keys) and Webhook authorization with
    /// `authorization` after `mode: Webhook` (`""` or `  webhook: {...}\n`).
    pub fn webhook_auth(agent: &Agent, webhook: &str, authorization: &str) {
        let config = agent.dir.join("config.yaml");
        let cfg = std::fs::read_to_string(&config).expect("config");
        assert!(cfg.contains("authentication:\n  x509:\n"), "{cfg}");
        let cfg = cfg.replace(
            "authentication:\n  x509:\n",
            &format!("authentication:\n  webhook: {webhook}\n  x509:\n"),
        );
        std::fs::write(
            &config,
            format!("{cfg}authorization:\n  mode: Webhook\n{authorization}"),
        )
        .expect("write config");
    }

    /// A client certificate of `node` (CN=system:node:<node>, O=system:nodes) from the
    /// cluster CA that expired a day ago: (certificate PEM, key PEM).
    pub fn expired_node_pair(&self, node: &str) -> (String, String) {
        let cn = format!("system:node:{node}");
        let i = self
            .certs
            .pki
            .expired_client(&format!("expired-{node}"), &cn, &["system:nodes"]);
        (i.cert_pem, i.key_pem)
    }

    /// The last `lines` lines of a process's log (`etcd`, `kube-apiserver`, ...).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.tail(lines))
            .unwrap_or_default()
    }

    /// Panics (with its log) if a process of the cluster has exited.
    pub fn assert_running(&mut self) {
        for p in &mut self.procs {
            p.assert_running();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
        if std::thread::panicking() {
            // Logs are what one reads after a failure; certificates and etcd are not.
            let keep = std::env::temp_dir().join(
                self.dir
                    .file_name()
                    .map(|n| n.to_os_string())
                    .unwrap_or_default(),
            );
            let _ = std::fs::create_dir_all(&keep);
            for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                if e.path().extension().is_some_and(|x| x == "log") {
                    let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
                }
            }
            eprintln!("control plane logs kept in {}", keep.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
