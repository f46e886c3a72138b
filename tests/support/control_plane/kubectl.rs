//! The real kubectl with the cluster's admin kubeconfig, and what tests build on it:
//! apply and create from a document, get as JSON (or a k8s-openapi type), and a bounded
//! wait on anything a probe can read.

use std::process::{Command, Output, Stdio};
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

    /// `kubectl create -f - <extra>` (`-o json` to read what the server made of it).
    pub fn create_with(&self, doc: &str, extra: &[&str]) -> String {
        let mut args = vec!["create", "-f", "-"];
        args.extend_from_slice(extra);
        self.kubectl_stdin(&args, doc)
    }

    fn kubectl_stdin(&self, args: &[&str], input: &str) -> String {
        use std::io::Write;
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
