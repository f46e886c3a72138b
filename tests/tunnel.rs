//! The konnectivity tunnel end to end: a real kube-apiserver v1.36 whose egress selector
//! sends node traffic to the real konnectivity `proxy-server` (apiserver-network-proxy
//! at 4f8517c, `../shared/konnectivity/`), and holdfast as the node's agent dialling out
//! to it. The node's InternalIP is an address of its own on a local link where nobody
//! listens (TEST-NET-3, refused on this machine), its kubelet API listens on 127.0.0.1
//! only: the apiserver cannot reach it but through the tunnel.
//!
//! What a user does with a node is each first shown failing without the tunnel, then
//! working through it: `kubectl logs` (and `-f`, a line printed after the follow
//! began), `exec` with its exit code, `attach -i`, `port-forward` (64 MiB each way, the
//! same checksum at both ends), and the node proxy's `/stats/summary` and
//! `/metrics/resource` (what metrics-server and `kubectl top` read). Then what the link
//! and the servers do to it: a server restarted, two servers behind one address, a cut
//! link, a silent one (found by the keepalive), a rotated certificate, and the DRAIN a
//! stopping agent says.

use support::control_plane;
use support::konnectivity::{
    cluster, exchange_within, port_forward, tail, text, Cluster, Follower,
};

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use support::agent::{free_port, need_root};

/// What port-forward moves each way.
const BIG: usize = 64 << 20;
/// How long moving it one way may take (a loaded machine of two cores, debug builds).
const BIG_WITHIN: Duration = Duration::from_secs(120);

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The ports the pod `tun` listens on (host network): `blob` serves /www/blob (BIG
/// random bytes) over HTTP, `echo` answers with the sha256 of what it got, and what is
/// sent to `say` the pod prints to its log.
struct Ports {
    blob: u16,
    echo: u16,
    say: u16,
}

/// The pods the checks use: `tun` (see [`Ports`]) and `talk`, which answers each line
/// of its stdin (`stdin: true`, once) and says `bye` at its end.
fn start_pods(c: &Cluster) -> Ports {
    let p = Ports {
        blob: free_port(),
        echo: free_port(),
        say: free_port(),
    };
    c.pod(
        "tun",
        &format!(
            "mkdir -p /www; head -c {BIG} /dev/urandom > /www/blob; \
             httpd -p 127.0.0.1:{} -h /www; \
             (while true; do nc -l -p {} -e sha256sum; done) & \
             echo hello-through-the-tunnel; \
             while true; do nc -l -p {} -e sh -c 'cat >&2'; done",
            p.blob, p.echo, p.say
        ),
    );
    c.pod_with(
        "talk",
        "while read l; do echo \"got $l\"; done; echo bye",
        "  restartPolicy: Never\n",
        "      stdin: true\n      stdinOnce: true\n",
    );
    p
}

#[test]
fn kubectl_reaches_an_unreachable_node_through_the_tunnel() {
    if !need_root() {
        return;
    }
    let mut c = cluster("tunnel-e2e", "tunnel-node-1", 1);
    // Before: no tunnel (the link to the proxy server is cut: the server answers the
    // apiserver at once that it has no agent for the node), and the node's address
    // answers nothing: the apiserver cannot reach the kubelet API.
    c.relay.cut();
    c.agent.start();
    control_plane::cluster::wait_node(&c.cp, &c.agent, &c.node, false);
    let ports = start_pods(&c);
    nothing_reaches_the_node_without_the_tunnel(&c, &ports);

    // The link comes up: the agent's stream is there within its back-off.
    c.relay.restore();
    let took = c.logs_within("tun", "hello-through-the-tunnel", Duration::from_secs(20));
    eprintln!("kubectl logs through the tunnel {took:?} after the link came up");
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

    logs_follow(&c, &ports);
    exec_and_attach(&c);
    port_forward_both_ways(&c, &ports);
    node_proxy(&c);
    a_dial_elsewhere_is_refused(&c);
    back_after_the_server_restarts(&mut c);
    a_stopping_agent_drains(&mut c);
}

/// The node's address answers nothing, and every kubectl command that needs the
/// kubelet API fails.
fn nothing_reaches_the_node_without_the_tunnel(c: &Cluster, ports: &Ports) {
    let direct: SocketAddr = format!("{}:{}", c.node_ip, c.agent.port)
        .parse()
        .expect("addr");
    assert!(
        TcpStream::connect_timeout(&direct, Duration::from_secs(1)).is_err(),
        "{direct} answers: the node must be unreachable for this test"
    );
    assert_eq!(c.agent.status()["tunnelStreams"], 0, "{}", c.agent.status());
    let pf = format!("{}:{}", free_port(), ports.blob);
    let stats = format!("/api/v1/nodes/{}/proxy/stats/summary", c.node);
    let resource = format!("/api/v1/nodes/{}/proxy/metrics/resource", c.node);
    for args in [
        &["logs", "tun"][..],
        // Without a time limit of its own, kubectl tries for 20 s.
        &["logs", "-f", "--pod-running-timeout=2s", "tun"],
        &["exec", "tun", "--", "echo", "hi"],
        &["attach", "-i", "talk", "-c", "main"],
        &["port-forward", "pod/tun", &pf],
        &["get", "--raw", &stats],
        &["get", "--raw", &resource],
    ] {
        let t0 = Instant::now();
        let out = c.cp.kubectl_input(args, b"", Duration::from_secs(30));
        assert!(
            !out.status.success(),
            "kubectl {} without the tunnel: {}",
            args.join(" "),
            text(&out)
        );
        let why = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "without the tunnel, kubectl {} ({:?}): {}",
            args.join(" "),
            t0.elapsed(),
            why.lines().last().unwrap_or_default()
        );
    }
}

/// `kubectl logs -f`: a line the pod prints after the follow began arrives.
fn logs_follow(c: &Cluster, ports: &Ports) {
    let mut follow = Follower::start(&c.cp, &["logs", "-f", "tun"]);
    follow.wait_for("hello-through-the-tunnel", Duration::from_secs(20));
    let line = format!("said-after-the-follow-began-{}", std::process::id());
    assert!(!follow.stdout().contains(&line));
    // Straight to the pod on the host network, not through the tunnel.
    let t0 = Instant::now();
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", ports.say)) {
            Ok(s) => break s,
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(20), "say port: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    s.write_all(format!("{line}\n").as_bytes())
        .expect("say to the pod");
    drop(s);
    let took = follow.wait_for(&line, Duration::from_secs(15));
    eprintln!("kubectl logs -f showed a new line {took:?} after the pod printed it");
}

/// exec with the command's exit code; attach -i to a container's stdin.
fn exec_and_attach(c: &Cluster) {
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

    // What is sent reaches the container's stdin, its answers come back, and the end of
    // the input ends it (stdinOnce), which ends kubectl with 0.
    let out = c.cp.kubectl_input(
        &["attach", "-i", "talk", "-c", "main"],
        b"one\ntwo\n",
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "got one\ngot two\nbye\n",
        "{}",
        text(&out)
    );
}

/// port-forward: BIG bytes each way, the same checksum at both ends.
fn port_forward_both_ways(c: &Cluster, ports: &Ports) {
    let want =
        c.cp.kubectl_ok(&["exec", "tun", "--", "sha256sum", "/www/blob"]);
    let (pf, local) = port_forward(&c.cp, "tun", ports.blob);
    let t0 = Instant::now();
    let got = exchange_within(local, b"GET /blob HTTP/1.0\r\n\r\n", BIG_WITHIN);
    let took = t0.elapsed();
    drop(pf);
    let body_at = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("http response")
        + 4;
    assert_eq!(got.len() - body_at, BIG, "downloaded bytes");
    assert!(want.starts_with(&sha256(&got[body_at..])), "{want}");
    eprintln!("port-forward: {} MiB from the pod in {took:?}", BIG >> 20);

    let upload: Vec<u8> = (0..BIG as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (pf, local) = port_forward(&c.cp, "tun", ports.echo);
    let t0 = Instant::now();
    let echoed = exchange_within(local, &upload, BIG_WITHIN);
    let took = t0.elapsed();
    drop(pf);
    assert!(
        String::from_utf8_lossy(&echoed).starts_with(&sha256(&upload)),
        "pod's checksum of the upload: {}",
        String::from_utf8_lossy(&echoed)
    );
    eprintln!("port-forward: {} MiB to the pod in {took:?}", BIG >> 20);
}

/// The node proxy: /stats/summary, /metrics/resource (the pod's CPU, as metrics-server
/// reads it), and the tunnel's own counters.
fn node_proxy(c: &Cluster) {
    let stats = c.cp.kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy/stats/summary", c.node),
    ]);
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("summary json");
    assert_eq!(stats["node"]["nodeName"], c.node.as_str(), "{stats}");
    let resource = c.cp.kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy/metrics/resource", c.node),
    ]);
    let cpu = support::kubelet_api::parse_prometheus(&resource)
        .into_iter()
        .find(|(name, labels, _)| {
            name == "container_cpu_usage_seconds_total"
                && labels["pod"] == "tun"
                && labels["namespace"] == "default"
                && labels["container"] == "main"
        })
        .map(|(_, _, v)| v);
    // The pod wrote BIG random bytes: it has used CPU.
    assert!(cpu.is_some_and(|v| v > 0.0), "{cpu:?}\n{resource}");

    assert!(c.metric("holdfast_tunnel_streams") == 1);
    assert!(c.metric("holdfast_tunnel_dials_served_total") > 0);
    assert!(c.metric("holdfast_tunnel_bytes_to_kubelet_total") > BIG as u64);
    assert!(c.metric("holdfast_tunnel_bytes_from_kubelet_total") > BIG as u64);
}

/// A dial for another port of the node is refused, with a log line.
fn a_dial_elsewhere_is_refused(c: &Cluster) {
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
}

/// The proxy server restarts: the tunnel is back, and exec works, within 15 s.
fn back_after_the_server_restarts(c: &mut Cluster) {
    c.servers[0].stop();
    c.servers[0].spawn();
    let t0 = Instant::now();
    exec_within(c, "tun", Duration::from_secs(15));
    eprintln!(
        "exec back {:?} after the proxy server restarted",
        t0.elapsed()
    );
}

/// Polls `kubectl exec <pod> -- echo back` until it works, or fails after `within`;
/// each try has 10 s (see [`Cluster::logs_within`]).
fn exec_within(c: &Cluster, pod: &str, within: Duration) {
    let t0 = Instant::now();
    loop {
        let out =
            c.cp.kubectl(&["--request-timeout=10s", "exec", pod, "--", "echo", "back"]);
        if out.status.success() && String::from_utf8_lossy(&out.stdout) == "back\n" {
            return;
        }
        assert!(
            t0.elapsed() < within,
            "exec not back within {within:?}: {}\n{}",
            text(&out),
            tail(&c.agent.agent_log(), 20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGTERM: each of the agent's streams says DRAIN before it goes, and each proxy
/// server hears it.
fn a_stopping_agent_drains(c: &mut Cluster) {
    let heard = |c: &Cluster, i: usize| {
        std::fs::read_to_string(&c.servers[i].log)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("agent is draining"))
            .map(str::to_string)
    };
    for i in 0..c.servers.len() {
        assert_eq!(heard(c, i), None, "{}", c.servers[i].tail());
    }
    let t0 = Instant::now();
    c.agent.stop();
    eprintln!("the agent stopped {:?} after SIGTERM", t0.elapsed());
    // Each stream said DRAIN and ended; the server ended its side in turn.
    let log = c.agent.agent_log();
    let draining = log
        .lines()
        .filter(|l| l.contains("tunnel: draining the stream"))
        .count();
    let closed = log
        .lines()
        .filter(|l| l.contains("tunnel: stream to proxy server") && l.ends_with(" closed"))
        .count();
    let want = c.servers.len();
    assert_eq!((draining, closed), (want, want), "{}", tail(&log, 20));
    for i in 0..c.servers.len() {
        let t0 = Instant::now();
        let line = loop {
            if let Some(line) = heard(c, i) {
                break line;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "proxy server {i} heard no DRAIN:\n{}\n--- agent ---\n{}",
                c.servers[i].tail(),
                tail(&c.agent.agent_log(), 20)
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(line.contains(&format!("agentID=\"{}\"", c.node)), "{line}");
        eprintln!("proxy server {i}: {line}");
    }
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

    // A node with no pod left stops: it still says DRAIN on both streams.
    c.cp.kubectl_ok(&["delete", "pod", "ha", "--wait=false"]);
    c.agent.wait_gone("ha", Duration::from_secs(30));
    a_stopping_agent_drains(&mut c);
}

#[test]
fn a_silent_link_is_found_by_the_keepalive_and_dialled_again() {
    if !need_root() {
        return;
    }
    let mut c = cluster("tunnel-quiet", "tunnel-node-4", 1);
    // The least interval the servers allow: a dead stream is found 15 s after a ping.
    c.tunnel_keys("    keepaliveTime: 30s\n");
    c.agent.start();
    control_plane::cluster::wait_node(&c.cp, &c.agent, &c.node, false);
    c.pod("quiet", "echo hello-from-quiet; sleep 3600");
    c.logs_within("quiet", "hello-from-quiet", Duration::from_secs(30));
    assert_eq!(c.node_metric("holdfast_tunnel_streams"), Some(1));

    // The link goes silent: the connections stay open, no byte passes either way.
    c.relay.silence();
    let t0 = Instant::now();
    let out = c.cp.kubectl(&["logs", "--request-timeout=5s", "quiet"]);
    assert!(
        !out.status.success(),
        "kubectl logs over a silent link: {}",
        text(&out)
    );
    eprintln!("link silent: {}", text(&out).trim());
    // A ping goes unanswered: the agent gives the stream up.
    c.agent.wait_until(
        "the agent to find the stream dead",
        Duration::from_secs(30 + 15 + 20),
        |a| a.agent_log().contains("no answer to a ping"),
    );
    eprintln!(
        "the agent gave the silent stream up {:?} after the link went silent",
        t0.elapsed()
    );
    assert_eq!(c.node_metric("holdfast_tunnel_streams"), Some(0));
    let human = c.agent.command(&["status"]).output().expect("status");
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("tunnel:       down"), "{human}");

    // The link passes bytes again: a new stream, and kubectl works.
    c.relay.restore();
    let t0 = Instant::now();
    c.logs_within("quiet", "hello-from-quiet", Duration::from_secs(45));
    exec_within(&c, "quiet", Duration::from_secs(30));
    eprintln!(
        "kubectl logs and exec back {:?} after the link",
        t0.elapsed()
    );
    assert_eq!(c.node_metric("holdfast_tunnel_streams"), Some(1));
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
    let (cert_file, key_file) = c.client_cert_files();
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
