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
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::agent::{free_port, Agent};
use crate::control_plane::link::NodeAddress;
use crate::control_plane::{ControlPlane, Options};
use crate::pki::Issued;

const WAIT: Duration = Duration::from_secs(60);

/// The konnectivity binaries' folder (setup.sh, in `shared/` beside the checkout as the
/// control plane's is, unpacks them once).
pub fn konnectivity() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // This crate is <checkout>/tests/support.
        let setup =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/konnectivity/setup.sh");
        let out = Command::new("bash")
            .arg(&setup)
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
/// connection and refuses new ones (the link is down) until `restore`. `silence` keeps
/// every connection open, new ones too, but passes no byte either way (a black hole: a
/// NAT table flushed, a cellular link dead) until `restore`; what was sent meanwhile,
/// and a side's close, then go on, as TCP's retransmission delivers them late.
pub struct Relay {
    pub port: u16,
    state: Arc<RelayState>,
}

struct RelayState {
    up: AtomicBool,
    stop: AtomicBool,
    /// Whether bytes pass (false: silenced), with a wake-up for the copies it holds.
    passing: Mutex<bool>,
    resumed: Condvar,
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
            passing: Mutex::new(true),
            resumed: Condvar::new(),
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

    /// No byte passes from now on, and no connection closes, until `restore`.
    pub fn silence(&self) {
        *self.state.passing.lock().expect("lock") = false;
    }

    pub fn restore(&self) {
        self.state.up.store(true, Ordering::SeqCst);
        *self.state.passing.lock().expect("lock") = true;
        self.state.resumed.notify_all();
    }
}

impl RelayState {
    fn relay(self: &Arc<Self>, client: TcpStream) {
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
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                return;
            };
            let state = self.clone();
            std::thread::spawn(move || state.pipe(from, to));
        }
        conns.push(client);
        conns.push(server);
    }

    /// Copies `from` to `to` until either ends, holding each read (and the end) while
    /// the relay is silenced.
    fn pipe(&self, mut from: TcpStream, mut to: TcpStream) {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = from.read(&mut buf).unwrap_or(0);
            let mut passing = self.passing.lock().expect("lock");
            while !*passing && !self.stop.load(Ordering::SeqCst) {
                passing = self.resumed.wait(passing).expect("lock");
            }
            drop(passing);
            if n == 0 || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.cut();
        // The copies a silence holds see the stop (under the lock: none misses it).
        let _held = self.state.passing.lock().unwrap_or_else(|e| e.into_inner());
        self.state.resumed.notify_all();
    }
}

pub struct Cluster {
    pub cp: ControlPlane,
    pub agent: Agent,
    pub servers: Vec<ProxyServer>,
    pub relay: Relay,
    /// The agent's config keys without the tunnel's (to run it with the tunnel off).
    pub kubelet_keys: String,
    /// The `holdfast.tunnel` section as written (see [`Cluster::tunnel_keys`]).
    pub tunnel_keys: String,
    pub node: String,
    pub node_ip: String,
    /// The local link holding `node_ip` when the cluster made it (see [`cluster`]).
    pub link: Option<NodeAddress>,
    /// A client certificate of the cluster CA, to read the kubelet API on the node.
    pub scraper: Issued,
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
    let scraper = cp.pki().client("node-scraper", "node-scraper", &[]);
    Cluster {
        cp,
        agent: a,
        servers,
        relay,
        kubelet_keys,
        tunnel_keys: keys,
        node: node.into(),
        node_ip,
        link: None,
        scraper,
        scratch,
    }
}

impl Cluster {
    /// A host-network pod `name` running `script`, once running.
    pub fn pod(&self, name: &str, script: &str) {
        self.pod_with(name, script, "", "");
    }

    /// [`pod`](Self::pod) with `spec_extra` YAML lines under its spec (two spaces in)
    /// and `extra` under its container (six spaces in).
    pub fn pod_with(&self, name: &str, script: &str, spec_extra: &str, extra: &str) {
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {}\n  \
             hostNetwork: true\n  automountServiceAccountToken: false\n  \
             terminationGracePeriodSeconds: 1\n{spec_extra}  containers:\n    - name: main\n      \
             image: docker.io/library/busybox:demo\n      command: [\"sh\", \"-c\", {}]\n{extra}",
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

    /// Writes the agent's config again with `extra` lines under `holdfast.tunnel` (four
    /// spaces in), such as `    keepaliveTime: 30s\n`.
    pub fn tunnel_keys(&self, extra: &str) {
        self.agent
            .write_config(&format!("{}{extra}{}", self.tunnel_keys, self.kubelet_keys));
    }

    /// `name` in the agent's `/metrics` read on the node itself (its kubelet API on
    /// 127.0.0.1, not through the tunnel), as someone on the gateway reads it; None when
    /// the agent does not answer or shows no such sample.
    pub fn node_metric(&self, name: &str) -> Option<u64> {
        let url = format!("https://127.0.0.1:{}/metrics", self.agent.port);
        let (code, body) = crate::kubelet_api::curl(&url, Some(&self.scraper), &[]);
        if code != 200 {
            return None;
        }
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
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

    /// Polls `kubectl logs` until it shows `want`, or fails after `within`. Each try
    /// has 10 s: one the server routed to a stream it has not yet seen end (a link back
    /// from silence) would wait for the apiserver's dial timeout (30 s).
    pub fn logs_within(&self, pod: &str, want: &str, within: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let out = self.cp.kubectl(&["logs", "--request-timeout=10s", pod]);
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

/// A process that runs until stopped (`kubectl port-forward`, `logs -f`);
/// killed and waited for when dropped, so that a failed test leaves none behind.
pub struct Spawned(pub Child);

impl std::ops::Deref for Spawned {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kubectl port-forward pod/<name> <local>:<port>`, once it forwards.
pub fn port_forward(cp: &ControlPlane, name: &str, port: u16) -> (Spawned, u16) {
    let local = free_port();
    let mut child = Spawned(
        cp.kubectl_cmd(&[
            "port-forward",
            &format!("pod/{name}"),
            &format!("{local}:{port}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward"),
    );
    let mut stdout = child.stdout.take().expect("stdout");
    let mut seen = Vec::new();
    let mut b = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("Forwarding from") {
        match stdout.read(&mut b) {
            Ok(0) | Err(_) => {
                let _ = child.kill();
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("port-forward ended: {err}");
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

/// A kubectl that runs until stopped (`logs -f`), what it prints gathered as it comes;
/// killed when dropped.
pub struct Follower {
    pub child: Spawned,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    what: String,
}

impl Follower {
    /// `kubectl ARGS`.
    pub fn start(cp: &ControlPlane, args: &[&str]) -> Follower {
        let mut child = Spawned(
            cp.kubectl_cmd(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn kubectl"),
        );
        let gather = |r: Option<Box<dyn Read + Send>>| {
            let buf = Arc::new(Mutex::new(Vec::new()));
            let into = buf.clone();
            if let Some(mut r) = r {
                std::thread::spawn(move || {
                    let mut b = [0u8; 4096];
                    while let Ok(n @ 1..) = r.read(&mut b) {
                        into.lock().expect("lock").extend_from_slice(&b[..n]);
                    }
                });
            }
            buf
        };
        let out = gather(
            child
                .stdout
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        );
        let err = gather(
            child
                .stderr
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        );
        Follower {
            child,
            out,
            err,
            what: format!("kubectl {}", args.join(" ")),
        }
    }

    /// What it printed on stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().expect("lock")).into_owned()
    }

    /// What it printed on stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().expect("lock")).into_owned()
    }

    /// Waits until its stdout shows `want`; panics after `within`, or when it ended
    /// without.
    pub fn wait_for(&mut self, want: &str, within: Duration) -> Duration {
        let t0 = Instant::now();
        while !self.stdout().contains(want) {
            let ended = self.child.try_wait().ok().flatten();
            assert!(
                ended.is_none() && t0.elapsed() < within,
                "{} shows no {want:?} after {:?} ({ended:?})\nstdout: {}\nstderr: {}",
                self.what,
                t0.elapsed(),
                tail(&self.stdout(), 20),
                tail(&self.stderr(), 20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        t0.elapsed()
    }
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

/// [`exchange`] within `within` all told: when it takes longer, the connection is shut
/// and it panics with how far it got.
pub fn exchange_within(port: u16, data: &[u8], within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect port-forward");
    let mut w = s.try_clone().expect("clone");
    let data = data.to_vec();
    let writer = std::thread::spawn(move || {
        let sent = w.write_all(&data);
        let _ = w.shutdown(Shutdown::Write);
        sent
    });
    let mut got = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = s.shutdown(Shutdown::Both);
            let sent = writer.join().expect("writer");
            panic!(
                "exchange through 127.0.0.1:{port} not done after {within:?}: {} bytes back, \
                 sending: {sent:?}",
                got.len()
            );
        }
        s.set_read_timeout(Some(left)).expect("timeout");
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    writer
        .join()
        .expect("writer")
        .expect("write through port-forward");
    got
}
