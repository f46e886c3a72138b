//! Connecting to a port inside another process's network namespace.
//!
//! A socket belongs to the namespace it was made in, whichever thread uses it later.
//! So a fresh thread enters `/proc/<pid>/ns/net` with `setns`, connects, hands the
//! socket back and exits: a thread that has changed namespace is never reused (not a
//! tokio worker, not a blocking-pool thread), so nothing else ever runs in the pod's
//! namespace by mistake.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use nix::sched::{setns, CloneFlags};

/// Connects to `localhost:<port>` in the network namespace of process `pid`.
pub async fn connect(pid: i32, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("api-netns-connect".into())
        .spawn(move || {
            let _ = tx.send(connect_here_after_setns(pid, port, timeout));
        })
        .map_err(|e| format!("start a thread to enter the pod's network namespace: {e}"))?;
    rx.await
        .map_err(|_| "the thread entering the pod's network namespace died".to_owned())?
}

/// Runs on a thread of its own, which must exit afterwards.
fn connect_here_after_setns(pid: i32, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let path = format!("/proc/{pid}/ns/net");
    let ns = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
    setns(&ns, CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("enter the network namespace {path}: {e}"))?;
    let mut last = String::new();
    for addr in [
        SocketAddr::from(([127, 0, 0, 1], port)),
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
    ] {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("dial tcp {addr}: connect: {e}"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    use std::time::Instant;

    /// A listener that exists only in a network namespace this test makes (with
    /// `unshare`): reached through the namespace, and not from the host.
    #[tokio::test]
    async fn reaches_a_port_only_inside_the_namespace() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: entering a network namespace needs root");
            return;
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        // A python echo server in a new network namespace whose loopback is up.
        let script = format!(
            "import socket,subprocess\n\
             subprocess.run(['busybox','ip','link','set','lo','up'],check=True)\n\
             s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(1)\n\
             print('ready',flush=True)\n\
             c,_=s.accept(); c.sendall(b'echo:'+c.recv(100)); c.close()\n"
        );
        let mut child = Command::new("unshare")
            .args(["--net", "python3", "-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        struct Kill(std::process::Child);
        impl Drop for Kill {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let mut out = child.stdout.take().expect("stdout");
        let guard = Kill(child);
        let mut ready = [0u8; 6];
        out.read_exact(&mut ready).expect("server ready");
        assert_eq!(&ready, b"ready\n");
        let pid = guard.0.id() as i32;

        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the port is open on the host too: the test proves nothing"
        );
        let started = Instant::now();
        let mut s = connect(pid, port, Duration::from_secs(5))
            .await
            .expect("connect inside the namespace");
        s.write_all(b"hi").expect("write");
        let mut got = String::new();
        s.read_to_string(&mut got).expect("read");
        assert_eq!(got, "echo:hi");
        assert!(started.elapsed() < Duration::from_secs(5));

        // This thread (the test's runtime) is still in the process's namespace.
        let here = std::fs::read_link("/proc/thread-self/ns/net").expect("ns");
        let process = std::fs::read_link("/proc/self/ns/net").expect("ns");
        assert_eq!(here, process);
        let e = connect(i32::MAX, port, Duration::from_secs(1))
            .await
            .expect_err("no such process");
        assert!(e.contains("/proc/"), "{e}");
    }
}
