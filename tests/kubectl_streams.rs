//! `kubectl exec`, `attach`, `cp` and `port-forward` end to end: the real kubectl
//! through a real kube-apiserver v1.36 (which reaches the agent's kubelet API over
//! SPDY/3.1, translating kubectl's WebSocket streams) to real containers, as root.
//! Output is checked byte for byte: stdout and stderr each hold exactly what the
//! command wrote, and the exit code is the command's.

use support::control_plane;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use control_plane::kubectl::wait_output;
use control_plane::{ControlPlane, Options};
use support::agent::{free_port, need_root, Agent};
use support::cni::{need_plugins, TestNetwork};

const WAIT: Duration = Duration::from_secs(60);
const NODE: &str = "streams-node-1";

/// A bare cluster with an agent as its node; `holdfast_keys` go under `holdfast:`.
fn cluster(name: &str, holdfast_keys: impl FnOnce(&Agent) -> String) -> (ControlPlane, Agent) {
    let cp = ControlPlane::start(Options::bare());
    // No controller makes the namespace's ServiceAccount in a bare cluster.
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new(name);
    a.node_name = NODE.into();
    let keys = holdfast_keys(&a);
    cp.join(&mut a, &keys, "");
    // The runtime's own logging must not reach an exec's output.
    a.extra_env.push(("RUST_LOG".into(), "debug".into()));
    a.start();
    (cp, a)
}

/// A pod bound to the node, of one container `main` (busybox) running `script`, with
/// `extra` YAML lines under the container (six spaces in) and `spec_extra` under spec.
fn pod(cp: &ControlPlane, a: &Agent, name: &str, script: &str, spec_extra: &str, extra: &str) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n{spec_extra}  \
         containers:\n    - name: main\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sh\", \"-c\", {}]\n{extra}",
        serde_json::to_string(script).expect("json string")
    ));
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    cp.wait_for(&format!("pod {name} running"), WAIT, log, |cp| {
        cp.get(&format!("pod/{name}"), None)
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
    });
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs kubectl with `input` on its stdin (closed after), bounded in time.
fn kubectl_with(cp: &ControlPlane, args: &[&str], input: &[u8]) -> Output {
    cp.kubectl_input(args, input, Duration::from_secs(30))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// kubectl run on a pseudo-terminal (so that `-t` gets a terminal): `typed` is written
/// to it once it shows `wait_for`; returns what it showed and kubectl's exit code.
fn kubectl_on_pty(
    cp: &ControlPlane,
    args: &[&str],
    wait_for: &str,
    typed: &str,
) -> (String, Option<i32>) {
    const PTY: &str = r#"
import os, pty, subprocess, sys, time, select
master, slave = pty.openpty()
p = subprocess.Popen(sys.argv[3:], stdin=slave, stdout=slave, stderr=slave, close_fds=True)
os.close(slave)
out, typed, wait_for = b"", sys.argv[1].encode(), sys.argv[2].encode()
deadline = time.time() + 30
while time.time() < deadline:
    r, _, _ = select.select([master], [], [], 0.2)
    if r:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    if typed and wait_for in out:
        os.write(master, typed)
        typed = b""
    if not r and p.poll() is not None:
        break
code = p.wait(timeout=5)
sys.stdout.buffer.write(out)
sys.exit(code)
"#;
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(PTY)
        .arg(typed)
        .arg(wait_for)
        .arg(cp.assets.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&cp.admin_kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let what: Vec<&str> = ["kubectl"].iter().chain(args).copied().collect();
    let out = wait_output(
        cmd.spawn().expect("python3"),
        Duration::from_secs(40),
        &what,
    );
    (text(&out.stdout), out.status.code())
}

#[test]
fn exec_attach_and_cp_through_the_apiserver() {
    if !need_root() {
        return;
    }
    let (cp, a) = cluster("kubectl-exec", |_| String::new());
    pod(&cp, &a, "shell", "sleep 3600", "", "");

    // Without stdin: stdout and stderr apart, each exactly what the command wrote.
    let out = kubectl_with(
        &cp,
        &["exec", "shell", "--", "sh", "-c", "echo out; echo err >&2"],
        b"",
    );
    assert_eq!(
        (text(&out.stdout), text(&out.stderr), out.status.code()),
        ("out\n".into(), "err\n".into(), Some(0))
    );
    // Several execs in a row (each a session of its own, streams opened anew).
    let t0 = Instant::now();
    for i in 0..3 {
        let out = kubectl_with(&cp, &["exec", "shell", "--", "echo", &i.to_string()], b"");
        assert_eq!(text(&out.stdout), format!("{i}\n"), "{}", text(&out.stderr));
    }
    eprintln!(
        "kubectl exec -- echo, whole command: {:?} each",
        t0.elapsed() / 3
    );
    // Much output, then the end at once: none of it is lost at the session's end.
    let t0 = Instant::now();
    let out = kubectl_with(
        &cp,
        &[
            "exec",
            "shell",
            "--",
            "sh",
            "-c",
            "head -c 8000000 /dev/zero; echo end >&2",
        ],
        b"",
    );
    assert_eq!(out.stdout.len(), 8_000_000, "{}", text(&out.stderr));
    eprintln!("kubectl exec of 8 MB of output: {:?}", t0.elapsed());
    assert!(out.stdout.iter().all(|b| *b == 0));
    assert_eq!(text(&out.stderr), "end\n");
    // The command's exit code is kubectl's.
    let out = kubectl_with(
        &cp,
        &["exec", "shell", "--", "sh", "-c", "echo bye; exit 3"],
        b"",
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "bye\n");
    assert_eq!(text(&out.stderr), "command terminated with exit code 3\n");

    // -i: stdin reaches the command, its end ends `cat`.
    let out = kubectl_with(
        &cp,
        &[
            "exec",
            "-i",
            "shell",
            "--",
            "sh",
            "-c",
            "cat; echo done >&2",
        ],
        b"hello\n",
    );
    assert_eq!(
        (text(&out.stdout), text(&out.stderr), out.status.code()),
        ("hello\n".into(), "done\n".into(), Some(0))
    );
    let big: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let out = kubectl_with(
        &cp,
        &[
            "exec",
            "-i",
            "shell",
            "--",
            "sh",
            "-c",
            "cat; echo; echo done >&2",
        ],
        &big,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), big.len() + 1);
    assert_eq!(&out.stdout[..big.len()], &big[..]);
    assert_eq!(text(&out.stderr), "done\n");

    // A command that ends without reading its input: its exit code still arrives.
    let unread = vec![b'x'; 4_000_000];
    let out = kubectl_with(
        &cp,
        &[
            "exec",
            "-i",
            "shell",
            "--",
            "sh",
            "-c",
            "echo early; exit 4",
        ],
        &unread,
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "early\n");

    // -it on a terminal: the command sees one, what is typed reaches it, and the
    // shell's exit code is kubectl's.
    let (screen, code) = kubectl_on_pty(
        &cp,
        &[
            "exec",
            "-it",
            "shell",
            "--",
            "sh",
            "-c",
            "tty; read x; echo got-$x; exit 5",
        ],
        "/dev/pts/",
        "hello\r",
    );
    assert_eq!(code, Some(5), "{screen}");
    assert!(screen.contains("/dev/pts/"), "{screen}");
    assert!(screen.contains("got-hello"), "{screen}");

    // attach -i to a container with stdin (stdinOnce): input in, output out, and the
    // end of input ends the container's loop.
    pod(
        &cp,
        &a,
        "talk",
        "while read l; do echo \"got $l\"; echo \"err $l\" >&2; done; echo bye",
        "  restartPolicy: Never\n",
        "      stdin: true\n      stdinOnce: true\n",
    );
    let out = kubectl_with(&cp, &["attach", "-i", "talk", "-c", "main"], b"one\ntwo\n");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "got one\ngot two\nbye\n");
    // kubectl's own notes (the session is logged; press enter) come first.
    let stderr = text(&out.stderr);
    let from_container: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            !l.starts_with("All commands and output from this session")
                && !l.starts_with("If you don't see a command prompt")
        })
        .collect();
    assert_eq!(from_container, ["err one", "err two"], "{stderr}");

    // cp both ways (tar through exec, stdin and stdout).
    let dir = a.dir.join("cp");
    std::fs::create_dir_all(&dir).expect("cp dir");
    let local = dir.join("up.bin");
    let content: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&local, &content).expect("write file");
    let local_s = local.display().to_string();
    let out = kubectl_with(&cp, &["cp", &local_s, "default/shell:/tmp/up.bin"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = kubectl_with(&cp, &["exec", "shell", "--", "md5sum", "/tmp/up.bin"], b"");
    let sum = text(&out.stdout);
    let back = dir.join("down.bin");
    let back_s = back.display().to_string();
    let out = kubectl_with(&cp, &["cp", "default/shell:/tmp/up.bin", &back_s], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(&back).expect("copied back"),
        content,
        "md5 in pod: {sum}"
    );
}

/// An HTTP GET through a forwarded local port.
fn http_get(port: u16) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// `kubectl port-forward pod/<name> <local>:<port>`, once it says it forwards.
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
    while !text(&seen).contains("Forwarding from") {
        match stdout.read(&mut b) {
            Ok(0) | Err(_) => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!("port-forward ended: {}{}", text(&seen), text(&out.stderr));
            }
            Ok(n) => seen.extend_from_slice(&b[..n]),
        }
    }
    // Its later lines ("Handling connection for ...") are not read: keep draining them.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = stdout.read_to_end(&mut sink);
    });
    (child, local)
}

#[test]
fn port_forward_through_the_apiserver_to_host_and_pod_networks() {
    if !need_root() || !need_plugins() {
        return;
    }
    let mut net = None;
    let (cp, a) = cluster("kubectl-pf", |a| {
        let n = TestNetwork::new(a, 0);
        let keys = n.holdfast_keys();
        net = Some(n);
        keys
    });
    let host_port = free_port();
    pod(
        &cp,
        &a,
        "web-host",
        &format!(
            "mkdir -p /www; echo hello-from-host-network > /www/index.html; \
             exec httpd -f -p 127.0.0.1:{host_port} -h /www"
        ),
        "  hostNetwork: true\n",
        "",
    );
    pod(
        &cp,
        &a,
        "web-pod",
        "mkdir -p /www; echo hello-from-pod-network > /www/index.html; \
         exec httpd -f -p 80 -h /www",
        "",
        "",
    );
    for (name, port, want) in [
        ("web-host", host_port, "hello-from-host-network"),
        ("web-pod", 80, "hello-from-pod-network"),
    ] {
        let (mut child, local) = port_forward(&cp, name, port);
        // Several connections on the one session, one after the other and at once.
        let t0 = Instant::now();
        for i in 0..3 {
            let body = http_get(local).unwrap_or_else(|e| panic!("{name} get {i}: {e}"));
            assert!(body.contains(want), "{name} get {i}: {body}");
        }
        let per_get = t0.elapsed() / 3;
        eprintln!("port-forward to {name}: an HTTP GET in {per_get:?}");
        // The pod's close reaches kubectl at once (it closes the local connection
        // only then), not after the second the client's late input may take.
        assert!(per_get < Duration::from_millis(800), "{per_get:?} per GET");
        let at_once: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || http_get(local)))
            .collect();
        for t in at_once {
            let body = t.join().expect("thread").expect("get");
            assert!(body.contains(want), "{name}: {body}");
        }
        assert!(
            child.try_wait().expect("wait").is_none(),
            "port-forward to {name} ended"
        );
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(net);
}
