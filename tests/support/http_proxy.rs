//! A site's HTTP proxy for a test: Debian's `tinyproxy` on a 127.0.0.1 port it picks,
//! dropping to the user `nobody` itself, tunnelling CONNECT to the ports given only,
//! with BasicAuth when asked; its log shows each CONNECT. And [`DirectBlocked`]: iptables
//! OUTPUT rules that reset every TCP connection to given 127.0.0.1 ports from any user
//! but `nobody`, so that only the proxy reaches them. The proxy is killed and the rules
//! removed on drop, even when the test fails.

#![allow(dead_code)]

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::agent::free_port;

pub const TINYPROXY_BIN: &str = "/usr/bin/tinyproxy";
/// The user the proxy runs as, and the one the rules let through.
const NOBODY_UID: u32 = 65534;

/// Skips the calling test (with a printed reason) when tinyproxy or iptables is missing.
pub fn tools_present() -> bool {
    for tool in [TINYPROXY_BIN, "/usr/sbin/iptables"] {
        if !Path::new(tool).exists() {
            eprintln!("skipped: {tool} is not installed (.ci/run installs it)");
            return false;
        }
    }
    true
}

pub struct Tinyproxy {
    pub port: u16,
    dir: PathBuf,
    log: PathBuf,
    child: Child,
}

impl Tinyproxy {
    /// Starts tinyproxy in `dir` (created; removed on drop), requiring `user:password`
    /// when `auth` is given, and tunnelling to `connect_ports` only.
    pub fn start(dir: &Path, auth: Option<(&str, &str)>, connect_ports: &[u16]) -> Tinyproxy {
        // The proxy writes its log as nobody.
        std::fs::create_dir_all(dir).expect("proxy dir");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let port = free_port();
        let log = dir.join("tinyproxy.log");
        let mut conf = format!(
            "User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 60\n\
             LogFile \"{}\"\nLogLevel Connect\nMaxClients 50\nDisableViaHeader Yes\n",
            log.display()
        );
        if let Some((user, password)) = auth {
            conf.push_str(&format!("BasicAuth {user} {password}\n"));
        }
        for p in connect_ports {
            conf.push_str(&format!("ConnectPort {p}\n"));
        }
        let conf_path = dir.join("tinyproxy.conf");
        std::fs::write(&conf_path, conf).expect("tinyproxy.conf");
        let child = Command::new(TINYPROXY_BIN)
            .arg("-d")
            .arg("-c")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tinyproxy");
        let mut proxy = Tinyproxy {
            port,
            dir: dir.to_path_buf(),
            log,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = proxy.child.try_wait() {
                panic!("tinyproxy exited ({status}):\n{}", proxy.log());
            }
            assert!(Instant::now() < deadline, "tinyproxy did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    /// `http://[user:password@]127.0.0.1:<port>`.
    pub fn url(&self, creds: Option<(&str, &str)>) -> String {
        match creds {
            Some((u, p)) => format!("http://{u}:{p}@127.0.0.1:{}", self.port),
            None => format!("http://127.0.0.1:{}", self.port),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The `host:port` of every CONNECT the proxy was asked for, in order.
    pub fn connects(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|l| l.split("): CONNECT ").nth(1))
            .filter_map(|rest| rest.split(' ').next())
            .map(str::to_string)
            .collect()
    }

    /// The user the proxy process runs as (from /proc).
    pub fn uid(&self) -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            .and_then(|euid| euid.parse().ok())
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- tinyproxy log :{} ---\n{}", self.port, self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// iptables rules, in a chain of their own jumped to first from OUTPUT, that reset TCP
/// connections to 127.0.0.1 on the given ports unless they come from `nobody`.
pub struct DirectBlocked {
    chain: String,
    hooked: bool,
}

fn iptables(args: &[&str]) -> bool {
    Command::new("iptables")
        .arg("-w")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl DirectBlocked {
    pub fn new(ports: &[u16]) -> DirectBlocked {
        let chain = format!("HF-DIRECT-{}", std::process::id());
        assert!(iptables(&["-N", &chain]), "iptables -N {chain}");
        let mut guard = DirectBlocked {
            chain,
            hooked: false,
        };
        for port in ports {
            let rule = [
                "-A",
                &guard.chain,
                "-p",
                "tcp",
                "-d",
                "127.0.0.1",
                "--dport",
                &port.to_string(),
                "-m",
                "owner",
                "!",
                "--uid-owner",
                &NOBODY_UID.to_string(),
                "-j",
                "REJECT",
                "--reject-with",
                "tcp-reset",
            ]
            .map(str::to_string);
            let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
            assert!(iptables(&rule), "iptables {}", rule.join(" "));
        }
        guard.hooked = iptables(&["-I", "OUTPUT", "1", "-j", &guard.chain]);
        assert!(guard.hooked, "iptables -I OUTPUT -j {}", guard.chain);
        guard
    }
}

impl Drop for DirectBlocked {
    fn drop(&mut self) {
        if self.hooked {
            iptables(&["-D", "OUTPUT", "-j", &self.chain]);
        }
        iptables(&["-F", &self.chain]);
        iptables(&["-X", &self.chain]);
    }
}
