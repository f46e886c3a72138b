//! The konnectivity tunnel's surroundings for tests and benches: the real `proxy-server`
//! (and `proxy-agent`) from `../shared/konnectivity/`, a relay standing for a load
//! balancer or a link that can be cut, and a cluster whose apiserver reaches its node
//! only through the proxy servers (its egress selector), the node's InternalIP a local
//! address nothing answers on.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::agent::{free_port, Agent};
use crate::control_plane::link::NodeAddress;
use crate::control_plane::{ControlPlane, Options};

const WAIT: Duration = Duration::from_secs(60);

/// The konnectivity binaries' folder (setup.sh unpacks them once).
pub fn konnectivity() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("bash")
            .arg("/work/shared/konnectivity/setup.sh")
            .output()
            .expect("run konnectivity setup.sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// A `proxy-server` process; killed and waited for when dropped.
pub struct ProxyServer {
    pub child: Option<Child>,
    pub args: Vec<String>,
    pub log: PathBuf,
    pub agent_port: u16,
}

impl ProxyServer {
    pub fn start(dir: &Path, uds: &Path, cp: &ControlPlane, id: &str, count: u32) -> ProxyServer {
        let cert = cp
            .pki()
            .server(&format!("konnectivity-{id}"), &["127.0.0.1", "localhost"]);
        let agent_port = free_port();
        let args = vec![
            "--mode=grpc".to_string(),
            format!("--uds-name={}", uds.display()),
            "--delete-existing-uds-file".into(),
            "--server-port=0".into(),
            format!("--agent-port={agent_port}"),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--admin-port={}", free_port()),
            format!("--health-port={}", free_port()),
            "--health-bind-address=127.0.0.1".into(),
            format!("--cluster-cert={}", cert.cert.display()),
            format!("--cluster-key={}", cert.key.display()),
            format!("--cluster-ca-cert={}", cp.ca().display()),
            "--proxy-strategies=destHost,default".into(),
            format!("--server-id={id}"),
            format!("--server-count={count}"),
        ];
        let mut s = ProxyServer {
            child: None,
            args,
            log: dir.join(format!("proxy-server-{id}.log")),
            agent_port,
        };
        s.spawn();
        s
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("proxy-server log");
        let child = Command::new(konnectivity().join("proxy-server"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("spawn proxy-server");
        self.child = Some(child);
        let addr: SocketAddr = ([127, 0, 0, 1], self.agent_port).into();
        let t0 = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                t0.elapsed() < WAIT,
                "proxy-server not listening:\n{}",
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        tail(&log, 30)
    }
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A folder for the socket and the egress config, short enough for a unix socket path.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = PathBuf::from(format!("/tmp/hf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TCP relay in front of the proxy servers, as a load balancer with one address:
/// each connection goes to the next server in turn. `cut` closes every relayed
/// connection and refuses new ones (the link is down) until `restore`.
pub struct Relay {
    pub port: u16,
    state: Arc<RelayState>,
}

struct RelayState {
    up: AtomicBool,
    stop: AtomicBool,
    backends: Vec<u16>,
    next: AtomicUsize,
    conns: Mutex<Vec<TcpStream>>,
}

impl Relay {
    pub fn new(backends: Vec<u16>) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(RelayState {
            up: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            backends,
            next: AtomicUsize::new(0),
            conns: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        std::thread::spawn(move || {
            while !st.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => st.relay(client),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Relay { port, state }
    }

    pub fn cut(&self) {
        self.state.up.store(false, Ordering::SeqCst);
        for c in self.state.conns.lock().expect("lock").drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.state.up.store(true, Ordering::SeqCst);
    }
}

impl RelayState {
    fn relay(&self, client: TcpStream) {
        if !self.up.load(Ordering::SeqCst) {
            return;
        }
        let _ = client.set_nonblocking(false);
        let i = self.next.fetch_add(1, Ordering::SeqCst) % self.backends.len();
        let Ok(server) = TcpStream::connect(("127.0.0.1", self.backends[i])) else {
            return;
        };
        let mut conns = self.conns.lock().expect("lock");
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                return;
            };
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from, &mut to);
                let _ = to.shutdown(Shutdown::Write);
            });
        }
        conns.push(client);
        conns.push(server);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.cut();
    }
}

pub struct Cluster {
    pub cp: ControlPlane,
    pub agent: Agent,
    pub servers: Vec<ProxyServer>,
    pub relay: Relay,
    /// The agent's config keys without the tunnel's (to run it with the tunnel off).
    pub kubelet_keys: String,
    pub node: String,
    pub node_ip: String,
    /// The local link holding `node_ip` when the cluster made it (see [`cluster`]).
    pub link: Option<NodeAddress>,
    pub scratch: Scratch,
}

/// The apiserver with its egress selector (to the first proxy server's socket), `count`
/// proxy servers (`--server-count count`) behind one relay, and the agent joined with
/// the tunnel dialling the relay. The agent is not started.
///
/// The node's InternalIP is an address of its own on a local link (TEST-NET-3, see
/// [`NodeAddress`]) where nothing listens: the kubelet API listens on 127.0.0.1 only,
/// so a direct dial is refused on this machine and no packet leaves it.
pub fn cluster(name: &str, node: &str, count: u32) -> Cluster {
    let index = name
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()))
        % 1000;
    let link = NodeAddress::new(index);
    let mut c = cluster_at(name, node, count, &link.ip, false);
    c.link = Some(link);
    c
}

/// [`cluster`] with the node's InternalIP given; with `listen`, the kubelet API listens
/// there (where an agent that dials the address it is asked for, as the upstream one
/// does, must reach it).
pub fn cluster_at(name: &str, node: &str, count: u32, node_ip: &str, listen: bool) -> Cluster {
    let scratch = Scratch::new(name);
    let uds = scratch.0.join("k0.sock");
    let egress = scratch.0.join("egress.yaml");
    std::fs::write(
        &egress,
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n\
             egressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: GRPC\n    \
             transport:\n      uds:\n        udsName: {}\n",
            uds.display()
        ),
    )
    .expect("egress config");
    let cp = ControlPlane::start(Options {
        apiserver_args: vec![format!(
            "--egress-selector-config-file={}",
            egress.display()
        )],
        ..Options::bare()
    });
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let servers: Vec<ProxyServer> = (0..count)
        .map(|i| {
            let uds = scratch.0.join(format!("k{i}.sock"));
            ProxyServer::start(&scratch.0, &uds, &cp, &format!("{name}-{i}"), count)
        })
        .collect();
    let relay = Relay::new(servers.iter().map(|s| s.agent_port).collect());
    let node_ip = node_ip.to_string();
    let mut a = Agent::new(name);
    a.node_name = node.into();
    if listen {
        a.address = node_ip.clone();
    }
    let keys = format!(
        "  tunnel:\n    servers: [\"127.0.0.1:{}\"]\n    caFile: {}\n",
        relay.port,
        cp.ca().display()
    );
    cp.join(&mut a, &keys, "");
    // The serving certificate also names the InternalIP the apiserver dials (it checks
    // it against the cluster CA); the kubelet API still listens on 127.0.0.1 only.
    let serving = cp.pki().server(
        &format!("kubelet-{node}-tunnel"),
        &[&a.address, &node_ip, node],
    );
    let kubelet_keys = format!(
        "tlsCertFile: {}\ntlsPrivateKeyFile: {}\n\
         authentication:\n  x509:\n    clientCAFile: {}\n",
        serving.cert.display(),
        serving.key.display(),
        cp.ca().display()
    );
    a.write_config(&format!("{keys}{kubelet_keys}"));
    a.extra_args
        .extend(["--node-ip".to_string(), node_ip.clone()]);
    Cluster {
        cp,
        agent: a,
        servers,
        relay,
        kubelet_keys,
        node: node.into(),
        node_ip,
        link: None,
        scratch,
    }
}

impl Cluster {
    /// A host-network pod `name` running `script`, once running.
    pub fn pod(&self, name: &str, script: &str) {
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {}\n  \
             hostNetwork: true\n  automountServiceAccountToken: false\n  \
             terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      \
             image: docker.io/library/busybox:demo\n      command: [\"sh\", \"-c\", {}]\n",
            self.node,
            serde_json::to_string(script).expect("json string")
        ));
        let a = &self.agent;
        let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
        self.cp
            .wait_for(&format!("pod {name} running"), WAIT, log, |cp| {
                cp.get(&format!("pod/{name}"), None)
                    .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
            });
    }

    pub fn metric(&self, name: &str) -> u64 {
        let out = self.cp.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/metrics", self.node),
        ]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The node's client certificate and key files, as its kubeconfig names them.
    pub fn client_cert_files(&self) -> (PathBuf, PathBuf) {
        let kubeconfig =
            std::fs::read_to_string(self.cp.node_kubeconfig(&self.node)).expect("kubeconfig");
        let field = |name: &str| {
            kubeconfig
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
                .map(|v| PathBuf::from(v.trim_matches('"')))
                .expect("kubeconfig field")
        };
        (field("client-certificate"), field("client-key"))
    }

    /// Waits until the agent's `/metrics` (read through the tunnel) shows `name` at `want`.
    pub fn wait_metric(&self, name: &str, want: u64, within: Duration) {
        let t0 = Instant::now();
        while self.metric(name) != want {
            assert!(
                t0.elapsed() < within,
                "{name} is {} after {within:?}, not {want}\n{}",
                self.metric(name),
                tail(&self.agent.agent_log(), 30)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Polls `kubectl logs` until it shows `want`, or fails after `within`.
    pub fn logs_within(&self, pod: &str, want: &str, within: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let out = self.cp.kubectl(&["logs", pod]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).contains(want) {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < within,
                "kubectl logs {pod} not through the tunnel within {within:?}: {}\n\
                 --- agent log ---\n{}\n--- proxy-server ---\n{}",
                String::from_utf8_lossy(&out.stderr),
                tail(&self.agent.agent_log(), 30),
                self.servers[0].tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `kubectl port-forward pod/<name> <local>:<port>`, once it forwards.
pub fn port_forward(cp: &ControlPlane, name: &str, port: u16) -> (Child, u16) {
    let local = free_port();
    let mut child = cp
        .kubectl_cmd(&[
            "port-forward",
            &format!("pod/{name}"),
            &format!("{local}:{port}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut seen = Vec::new();
    let mut b = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("Forwarding from") {
        match stdout.read(&mut b) {
            Ok(0) | Err(_) => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!("port-forward ended: {}", text(&out));
            }
            Ok(n) => seen.extend_from_slice(&b[..n]),
        }
    }
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = stdout.read_to_end(&mut sink);
    });
    (child, local)
}

/// Sends `data` to 127.0.0.1:`port`, closes its side, and returns all it got back.
pub fn exchange(port: u16, data: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect port-forward");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut w = s.try_clone().expect("clone");
    let data = data.to_vec();
    let writer = std::thread::spawn(move || {
        w.write_all(&data).expect("write through port-forward");
        let _ = w.shutdown(Shutdown::Write);
    });
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    writer.join().expect("writer");
    got
}
