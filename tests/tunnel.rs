//! The konnectivity tunnel end to end: a real kube-apiserver v1.36 whose egress selector
//! sends node traffic to the real konnectivity `proxy-server` (apiserver-network-proxy
//! at 4f8517c, `../shared/konnectivity/`), and holdfast as the node's agent dialling out
//! to it. The node's InternalIP is an address of its own on a local link where nobody
//! listens (TEST-NET-3, refused on this machine), its kubelet API listens on 127.0.0.1
//! only: the apiserver cannot reach it but through the tunnel. Each check is first shown failing without the tunnel.

use support::control_plane;
use support::konnectivity::{cluster, exchange, port_forward, tail, text};

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use support::agent::{free_port, need_root};

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
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
