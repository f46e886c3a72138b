//! One control-plane process (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler): started with its output in a log file of its own, killed and waited
//! for when dropped, and its log's tail for a failure message.
//!
//! Each process gets the parent-death signal SIGKILL (through util-linux `setpriv`, as
//! the tests forbid unsafe code): a test binary killed outright (a CI timeout) leaves
//! no apiserver behind holding ports and memory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Process {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

/// Whether `setpriv --pdeathsig` can wrap the processes on this machine.
fn setpriv() -> Option<&'static str> {
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

impl Process {
    /// Starts `bin args` in `dir` with stdout and stderr into `dir/<name>.log`.
    pub fn spawn(name: &str, bin: &Path, args: &[String], dir: &Path) -> Process {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("control plane log");
        let mut cmd = match setpriv() {
            Some(sp) => {
                let mut c = Command::new(sp);
                c.args(["--pdeathsig", "KILL", "--"]).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log fd"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        Process {
            name: name.to_string(),
            log,
            child,
        }
    }

    /// Its exit status if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of its log.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Panics with the log's tail if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.exited() {
            panic!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                self.tail(40)
            );
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // SIGKILL: the cluster is thrown away whole, nothing of it needs a clean stop.
        let _ = self.child.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} did not exit within 10 s of SIGKILL", self.name);
    }
}
