//! The konnectivity tunnel end to end: a real kube-apiserver v1.36 whose egress selector
//! sends node traffic to the real konnectivity `proxy-server` (apiserver-network-proxy
//! at 4f8517c, `../shared/konnectivity/`), and holdfast as the node's agent dialling out
//! to it. The node's InternalIP is an address nobody listens on (TEST-NET-3 with no
//! link), its kubelet API listens on 127.0.0.1 only: the apiserver cannot reach it but
//! through the tunnel. Each check is first shown failing without the tunnel.

use support::control_plane;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane::{ControlPlane, Options};
use sha2::{Digest, Sha256};
use support::agent::{free_port, need_root, Agent};

const WAIT: Duration = Duration::from_secs(60);

/// The konnectivity binaries' folder (setup.sh unpacks them once).
fn konnectivity() -> &'static Path {
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
struct ProxyServer {
    child: Option<Child>,
    args: Vec<String>,
    log: PathBuf,
    agent_port: u16,
}

impl ProxyServer {
    fn start(dir: &Path, uds: &Path, cp: &ControlPlane, id: &str, count: u32) -> ProxyServer {
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

    fn spawn(&mut self) {
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

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        tail(&log, 30)
    }
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A folder for the socket and the egress config, short enough for a unix socket path.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
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
struct Relay {
    port: u16,
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
    fn new(backends: Vec<u16>) -> Relay {
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

    fn cut(&self) {
        self.state.up.store(false, Ordering::SeqCst);
        for c in self.state.conns.lock().expect("lock").drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
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

/// A node address in TEST-NET-3 on no link: nothing on this machine answers there.
fn unreachable_ip(index: u32) -> String {
    let pid = std::process::id();
    format!("203.0.113.{}", 1 + (pid.wrapping_mul(7) + index * 53) % 254)
}

struct Cluster {
    cp: ControlPlane,
    agent: Agent,
    servers: Vec<ProxyServer>,
    relay: Relay,
    node: String,
    node_ip: String,
    scratch: Scratch,
}

/// The apiserver with its egress selector (to the first proxy server's socket), `count`
/// proxy servers (`--server-count count`) behind one relay, and the agent joined with
/// the tunnel dialling the relay. The agent is not started.
fn cluster(name: &str, node: &str, count: u32) -> Cluster {
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
    let node_ip = unreachable_ip(0);
    let mut a = Agent::new(name);
    a.node_name = node.into();
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
    a.write_config(&format!(
        "{keys}tlsCertFile: {}\ntlsPrivateKeyFile: {}\n\
         authentication:\n  x509:\n    clientCAFile: {}\n",
        serving.cert.display(),
        serving.key.display(),
        cp.ca().display()
    ));
    a.extra_args
        .extend(["--node-ip".to_string(), node_ip.clone()]);
    Cluster {
        cp,
        agent: a,
        servers,
        relay,
        node: node.into(),
        node_ip,
        scratch,
    }
}

impl Cluster {
    /// A host-network pod `name` running `script`, once running.
    fn pod(&self, name: &str, script: &str) {
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

    fn metric(&self, name: &str) -> u64 {
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

    /// Waits until the agent's `/metrics` (read through the tunnel) shows `name` at `want`.
    fn wait_metric(&self, name: &str, want: u64, within: Duration) {
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
    fn logs_within(&self, pod: &str, want: &str, within: Duration) -> Duration {
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

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `kubectl port-forward pod/<name> <local>:<port>`, once it forwards.
fn port_forward(cp: &ControlPlane, name: &str, port: u16) -> (Child, u16) {
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
fn exchange(port: u16, data: &[u8]) -> Vec<u8> {
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

#[test]
fn kubectl_reaches_an_unreachable_node_through_the_tunnel() {
    if !need_root() {
        return;
    }
    let mut c = cluster("tunnel-e2e", "tunnel-node-1", 1);
    // Before: no tunnel (the proxy server is down), and the node's address answers
    // nothing: the apiserver cannot reach the kubelet API.
    c.servers[0].stop();
    c.agent.start();
    control_plane::cluster::wait_node(&c.cp, &c.agent, &c.node, false);
    let blob_port = free_port();
    let echo_port = free_port();
    c.pod(
        "tun",
        &format!(
            "echo hello-through-the-tunnel; mkdir -p /www; \
             head -c 3145728 /dev/urandom > /www/blob; \
             httpd -p 127.0.0.1:{blob_port} -h /www; \
             while true; do nc -l -p {echo_port} -e sha256sum; done"
        ),
    );
    let direct: SocketAddr = format!("{}:{}", c.node_ip, c.agent.port)
        .parse()
        .expect("addr");
    assert!(
        TcpStream::connect_timeout(&direct, Duration::from_secs(1)).is_err(),
        "{direct} answers: the node must be unreachable for this test"
    );
    assert_eq!(c.agent.status()["tunnelStreams"], 0, "{}", c.agent.status());
    let before = c.cp.kubectl(&["logs", "tun"]);
    assert!(
        !before.status.success(),
        "kubectl logs without the tunnel: {}",
        text(&before)
    );
    eprintln!("without the tunnel: {}", text(&before).trim());

    // The proxy server comes up: the agent's stream is back within its back-off.
    c.servers[0].spawn();
    let took = c.logs_within("tun", "hello-through-the-tunnel", Duration::from_secs(20));
    eprintln!("kubectl logs through the tunnel {took:?} after the proxy server came up");

    assert_eq!(c.agent.status()["tunnelStreams"], 1, "{}", c.agent.status());
    let human = c
        .agent
        .command(&["status"])
        .output()
        .expect("holdfast status");
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("tunnel:       1 stream(s) to proxy servers up"),
        "{human}"
    );

    // exec, with the command's exit code.
    let out = c.cp.kubectl(&[
        "exec",
        "tun",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    // kubectl adds its own line about the exit code.
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("err\n"),
        "{}",
        text(&out)
    );

    // port-forward: 3 MiB each way, the same checksum at both ends.
    let want =
        c.cp.kubectl_ok(&["exec", "tun", "--", "sha256sum", "/www/blob"]);
    let (mut pf, local) = port_forward(&c.cp, "tun", blob_port);
    let got = exchange(local, b"GET /blob HTTP/1.0\r\n\r\n");
    let body_at = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("http response")
        + 4;
    assert_eq!(got.len() - body_at, 3 << 20, "downloaded bytes");
    assert!(want.starts_with(&sha256(&got[body_at..])), "{want}");
    let _ = pf.kill();
    let _ = pf.wait();
    let upload: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (mut pf, local) = port_forward(&c.cp, "tun", echo_port);
    let echoed = exchange(local, &upload);
    assert!(
        String::from_utf8_lossy(&echoed).starts_with(&sha256(&upload)),
        "pod's checksum of the upload: {}",
        String::from_utf8_lossy(&echoed)
    );
    let _ = pf.kill();
    let _ = pf.wait();

    // The node proxy: /stats/summary and the tunnel's own counters.
    let stats = c.cp.kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy/stats/summary", c.node),
    ]);
    assert!(
        stats.contains(&format!("\"nodeName\": \"{}\"", c.node)) || stats.contains(&c.node),
        "{stats}"
    );
    assert!(c.metric("holdfast_tunnel_streams") == 1);
    assert!(c.metric("holdfast_tunnel_dials_served_total") > 0);
    assert!(c.metric("holdfast_tunnel_bytes_to_kubelet_total") > 3 << 20);
    assert!(c.metric("holdfast_tunnel_bytes_from_kubelet_total") > 3 << 20);

    // A dial for another port of the node is refused, with a log line.
    let refused_before = c.metric("holdfast_tunnel_dials_refused_total");
    let other = c.cp.kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}:22/proxy/", c.node),
    ]);
    assert!(
        !other.status.success(),
        "port 22 through the tunnel: {}",
        text(&other)
    );
    assert_eq!(
        c.metric("holdfast_tunnel_dials_refused_total"),
        refused_before + 1
    );
    assert!(
        c.agent
            .agent_log()
            .contains("refused a dial from proxy server"),
        "{}",
        tail(&c.agent.agent_log(), 20)
    );

    // The proxy server restarts: the tunnel is back, and exec works, within 15 s.
    c.servers[0].stop();
    c.servers[0].spawn();
    let t0 = Instant::now();
    loop {
        let out = c.cp.kubectl(&["exec", "tun", "--", "echo", "back"]);
        if out.status.success() && String::from_utf8_lossy(&out.stdout) == "back\n" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "exec not back within 15 s: {}\n{}",
            text(&out),
            tail(&c.agent.agent_log(), 20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "exec back {:?} after the proxy server restarted",
        t0.elapsed()
    );
    let _ = c.cp.kubectl(&["delete", "pod", "tun", "--wait=false"]);
    c.agent.stop();
}

#[test]
fn a_stream_to_each_of_two_servers_and_back_after_the_link_returns() {
    if !need_root() {
        return;
    }
    let mut c = cluster("tunnel-ha", "tunnel-node-2", 2);
    c.agent.start();
    control_plane::cluster::wait_node(&c.cp, &c.agent, &c.node, false);
    c.pod("ha", "echo hello-from-ha; sleep 3600");
    c.logs_within("ha", "hello-from-ha", Duration::from_secs(30));
    // Both servers behind the one address hold a stream (servercount 2).
    c.wait_metric("holdfast_tunnel_streams", 2, Duration::from_secs(30));
    for s in &c.servers {
        let log = std::fs::read_to_string(&s.log).unwrap_or_default();
        assert!(log.contains("tunnel-node-2"), "{}", s.tail());
    }

    // The link goes down: no way to the node.
    c.relay.cut();
    let t0 = Instant::now();
    loop {
        let out = c.cp.kubectl(&["logs", "ha"]);
        if !out.status.success() {
            eprintln!("link down: {}", text(&out).trim());
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "logs still work with the link cut"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    // Back within 15 s of the link.
    c.relay.restore();
    let took = c.logs_within("ha", "hello-from-ha", Duration::from_secs(15));
    eprintln!("kubectl logs back {took:?} after the link returned");
    c.wait_metric("holdfast_tunnel_streams", 2, Duration::from_secs(15));
    let _ = c.cp.kubectl(&["delete", "pod", "ha", "--wait=false"]);
    c.agent.stop();
}

#[test]
fn a_rotated_client_certificate_is_used_by_the_next_stream() {
    if !need_root() {
        return;
    }
    let mut c = cluster("tunnel-rot", "tunnel-node-3", 1);
    c.agent.start();
    control_plane::cluster::wait_node(&c.cp, &c.agent, &c.node, false);
    c.pod("rot", "echo hello-from-rot; sleep 3600");
    c.logs_within("rot", "hello-from-rot", Duration::from_secs(30));

    // The node's certificate files now hold one from another CA, and the proxy server,
    // restarted, trusts only that CA: the old certificate would be refused.
    let kubeconfig = std::fs::read_to_string(c.cp.node_kubeconfig(&c.node)).expect("kubeconfig");
    let field = |name: &str| {
        kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
            .map(|v| PathBuf::from(v.trim_matches('"')))
            .expect("kubeconfig field")
    };
    let (cert_file, key_file) = (field("client-certificate"), field("client-key"));
    let other = support::pki::Pki::new(&c.scratch.0.join("other-ca"));
    let rotated = other.client(
        "rotated",
        &format!("system:node:{}", c.node),
        &["system:nodes"],
    );
    std::fs::copy(&rotated.key, &key_file).expect("rotate key");
    std::fs::copy(&rotated.cert, &cert_file).expect("rotate cert");
    let s = &mut c.servers[0];
    s.stop();
    for arg in &mut s.args {
        if arg.starts_with("--cluster-ca-cert=") {
            *arg = format!("--cluster-ca-cert={}", other.ca.display());
        }
    }
    s.spawn();
    let took = c.logs_within("rot", "hello-from-rot", Duration::from_secs(15));
    eprintln!("through the tunnel with the rotated certificate {took:?} after the restart");
    let _ = c.cp.kubectl(&["delete", "pod", "rot", "--wait=false"]);
    c.agent.stop();
}
