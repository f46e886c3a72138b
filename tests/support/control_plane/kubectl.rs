//! The real kubectl with the cluster's admin kubeconfig, and what tests build on it:
//! apply and create from a document, get as JSON (or a k8s-openapi type), input on its
//! stdin within a deadline, and a bounded wait on anything a probe can read.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::ControlPlane;

impl ControlPlane {
    /// The real kubectl with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args)
            .output()
            .unwrap_or_else(|e| panic!("run kubectl: {e}"))
    }

    /// kubectl with the admin kubeconfig, to spawn (for `logs -f`, `--watch`).
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.assets.join("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// kubectl's stdout; panics with its stderr if it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of a YAML or JSON document.
    pub fn apply(&self, doc: &str) -> String {
        self.kubectl_stdin(&["apply", "-f", "-"], doc)
    }

    /// `kubectl create -f -` (server-generated names, no last-applied annotation).
    pub fn create(&self, doc: &str) -> String {
        self.kubectl_stdin(&["create", "-f", "-"], doc)
    }

    /// The admin kubeconfig's client certificate and key files (the cluster CA issued
    /// them: the kubelet API lets them in too).
    pub fn admin_cert(&self) -> (PathBuf, PathBuf) {
        client_files(&self.admin_kubeconfig)
    }

    /// `kubectl logs <args>` until it succeeds with `want` in its output (20 s); that
    /// output.
    pub fn logs_showing(&self, args: &[&str], want: &str) -> String {
        let mut all = vec!["logs"];
        all.extend_from_slice(args);
        let mut last = String::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let out = self.kubectl(&all);
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && stdout.contains(want) {
                return stdout;
            }
            last = format!(
                "exit {:?}\n{stdout}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("kubectl {}: no {want:?} in\n{last}", all.join(" "));
    }

    /// `kubectl create -f - <extra>` (`-o json` to read what the server made of it).
    pub fn create_with(&self, doc: &str, extra: &[&str]) -> String {
        let mut args = vec!["create", "-f", "-"];
        args.extend_from_slice(extra);
        self.kubectl_stdin(&args, doc)
    }

    /// kubectl with `input` on its stdin (closed after), its output read while it
    /// runs; panics if it runs longer than `within`.
    pub fn kubectl_input(&self, args: &[&str], input: &[u8], within: Duration) -> Output {
        let mut child = self
            .kubectl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl");
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_vec();
        // Written while its output is read: a command that echoes its input fills the
        // output pipe long before the input is all written.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let what: Vec<&str> = std::iter::once("kubectl")
            .chain(args.iter().copied())
            .collect();
        let out = wait_output(child, within, &what);
        let _ = writer.join();
        out
    }

    fn kubectl_stdin(&self, args: &[&str], input: &str) -> String {
        let mut child = self
            .kubectl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl");
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes()).expect("kubectl stdin");
        }
        let out = child.wait_with_output().expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl {}: {}\n--- input ---\n{input}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl get <what> -o json` (`what` like `pod/web`, `nodes`), in `ns` if given;
    /// None when it is not found.
    pub fn get(&self, what: &str, ns: Option<&str>) -> Option<Value> {
        let mut args = vec!["get", what, "-o", "json"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let out = self.kubectl(&args);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("NotFound"), "kubectl get {what}: {err}");
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).expect("kubectl get -o json"))
    }

    /// Like [`ControlPlane::get`], as a k8s-openapi type.
    pub fn get_as<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        ns: Option<&str>,
    ) -> Option<T> {
        self.get(what, ns)
            .map(|v| serde_json::from_value(v).expect("object of the asked type"))
    }

    /// Polls `probe` every 200 ms until it gives a value; panics after `within` with
    /// `what` and `context()` (an agent's log, say).
    pub fn wait_for<T>(
        &self,
        what: &str,
        within: Duration,
        context: impl Fn() -> String,
        mut probe: impl FnMut(&Self) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = probe(self) {
                return v;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {within:?} waiting for {what}\n{}\n--- kube-apiserver ---\n{}",
                    context(),
                    self.log_tail("kube-apiserver", 20)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Reads a child's output while it runs; kills it and panics after `within` (`what`
/// names it in the message).
pub fn wait_output(mut child: Child, within: Duration, what: &[&str]) -> Output {
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + within;
    let mut late = false;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            late = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = child.wait().expect("kubectl status");
    let out = Output {
        status,
        stdout: stdout.join().expect("stdout"),
        stderr: stderr.join().expect("stderr"),
    };
    assert!(
        !late,
        "{} still running after {within:?}\nstdout ({} bytes): {}\nstderr: {}",
        what.join(" "),
        out.stdout.len(),
        short(&out.stdout),
        short(&out.stderr)
    );
    out
}

/// At most the last 2000 bytes of some output, as text.
fn short(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[b.len().saturating_sub(2000)..]).into_owned()
}

/// A kubeconfig's `client-certificate` and `client-key` paths.
pub fn client_files(kubeconfig: &Path) -> (PathBuf, PathBuf) {
    let kc = std::fs::read_to_string(kubeconfig).expect("read kubeconfig");
    let field = |name: &str| -> PathBuf {
        let value = kc
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {}", kubeconfig.display()))
            .trim();
        PathBuf::from(serde_json::from_str::<String>(value).unwrap_or_else(|_| value.to_string()))
    };
    (field("client-certificate:"), field("client-key:"))
}
