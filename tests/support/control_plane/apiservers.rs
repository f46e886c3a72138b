//! More kube-apiservers of one cluster, as a control plane of several has them: each on
//! a port of its own and on the cluster's one etcd, with the same serving certificate,
//! client CA and service-account keys, so a client of one is a client of all. One can
//! be killed and started again on its port; kubectl can be pointed at a survivor.

use std::time::{Duration, Instant};

use super::ControlPlane;
use crate::agent::free_port;

/// How long an apiserver may take to be ready.
const READY_WITHIN: Duration = Duration::from_secs(90);

impl ControlPlane {
    /// Starts `n` more kube-apiservers at once and waits until each is ready; their URLs.
    pub fn add_apiservers(&mut self, n: usize) -> Vec<String> {
        let mut urls = Vec::new();
        for _ in 0..n {
            let port = free_port();
            let url = format!("https://127.0.0.1:{port}");
            let name = format!("kube-apiserver-{port}");
            self.start_apiserver(&name, port);
            self.apiservers.push((url.clone(), name));
            urls.push(url);
        }
        for url in &urls {
            self.wait_apiserver_ready(url);
        }
        urls
    }

    /// Every kube-apiserver's URL, the first one's first.
    pub fn apiserver_urls(&self) -> Vec<String> {
        self.apiservers.iter().map(|(url, _)| url.clone()).collect()
    }

    /// Kills the kube-apiserver at `url` (SIGKILL, as a crash or a power cut would) and
    /// waits for it to be gone.
    pub fn kill_apiserver(&mut self, url: &str) {
        let name = self.apiserver_name(url);
        let at = self
            .procs
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("{name} is not running"));
        drop(self.procs.remove(at));
    }

    /// Starts the kube-apiserver at `url` again, on its port, and waits until it is
    /// ready. Its log is a new file (`<name>-again.log`): the first one stays for reading.
    pub fn restart_apiserver(&mut self, url: &str) {
        let name = format!("{}-again", self.apiserver_name(url));
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("no port in {url}"));
        self.start_apiserver(&name, port);
        if let Some(entry) = self.apiservers.iter_mut().find(|(u, _)| u == url) {
            entry.1 = name;
        }
        self.wait_apiserver_ready(url);
    }

    /// kubectl, and every getter and wait built on it, goes through the kube-apiserver
    /// at `url` from now on.
    pub fn kubectl_via(&mut self, url: &str) {
        let text = std::fs::read_to_string(&self.admin_kubeconfig).expect("admin kubeconfig");
        let mut out = String::new();
        for line in text.lines() {
            match line.split_once("server: ") {
                Some((indent, _)) if indent.trim().is_empty() => {
                    out.push_str(&format!("{indent}server: {url}\n"));
                }
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        std::fs::write(&self.admin_kubeconfig, out).expect("write admin kubeconfig");
    }

    fn apiserver_name(&self, url: &str) -> String {
        self.apiservers
            .iter()
            .find(|(u, _)| u == url)
            .map(|(_, name)| name.clone())
            .unwrap_or_else(|| panic!("no kube-apiserver at {url}"))
    }

    /// Polls the apiserver's `/readyz` until it answers ok, failing at once (with its
    /// log) if a process of the cluster exits, and after a deadline.
    fn wait_apiserver_ready(&mut self, url: &str) {
        let name = self.apiserver_name(url);
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            self.assert_running();
            let out = self.kubectl(&[
                "--server",
                url,
                "get",
                "--raw",
                "/readyz",
                "--request-timeout=2s",
            ]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} not ready within {READY_WITHIN:?}: {}\n--- its log ---\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log_tail(&name, 40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
