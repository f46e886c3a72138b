//! A planned power-off, end to end: a real systemd-logind (on a private dbus-daemon, in
//! a mount namespace of its own with a private /run/systemd and /etc/systemd), a real
//! kube-apiserver, real containers, as root. holdfast raises logind's
//! InhibitDelayMaxSec with its drop-in, holds a delay inhibitor, and on `PowerOff`
//! stops the ordinary pod first and the critical one last, each with its grace period
//! (their SIGTERM traps run), reports them Failed as the kubelet does and the node
//! NotReady, and only then lets logind go on; a cancelled shutdown takes the lock again.
//!
//! systemd is not PID 1 here, and logind will not begin a shutdown unless the unit
//! manager on its bus says poweroff.target is loaded: the one double is a stand-in for
//! `org.freedesktop.systemd1` on the private bus, which answers that, accepts the
//! StartUnit (recording it) and later fails the job as systemd would say a job failed.
//! Nothing on that bus can reach the machine's own service manager, so nothing powers
//! off.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::dbus::wire::Header;
use holdfast::dbus::{Connection, Kind, Value};
use serde_json::{json, Value as Json};
use support::agent::{condition, container, need_root, Agent};
use support::control_plane::cluster::tail;
use support::control_plane::{ControlPlane, Options};

const NODE: &str = "shutdown-node";
const WAIT: Duration = Duration::from_secs(60);
const LOGIND: &str = "/lib/systemd/systemd-logind";
const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

const BUS_CONF: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <auth>EXTERNAL</auth>
  <listen>unix:path=@BUS@</listen>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
  </policy>
</busconfig>
"#;

/// A private system bus with logind on it, and the unit manager's stand-in; all of it
/// ended on drop.
struct Logind {
    dir: PathBuf,
    address: String,
    bus: Child,
    logind: Option<Child>,
    stop: Arc<AtomicBool>,
    /// The units StartUnit was asked for, in order.
    started: Arc<Mutex<Vec<String>>>,
    /// Set to make the stand-in fail the job it accepted.
    fail_job: Arc<AtomicBool>,
    manager: Option<std::thread::JoinHandle<()>>,
}

impl Logind {
    fn start(dir: &Path) -> Logind {
        std::fs::create_dir_all(dir.join("etc/logind.conf.d")).expect("dirs");
        // No virtual terminals: logind must not touch the machine's consoles.
        std::fs::write(
            dir.join("etc/logind.conf"),
            "[Login]\nNAutoVTs=0\nReserveVT=0\n",
        )
        .expect("logind.conf");
        let socket = dir.join("bus");
        let conf = dir.join("bus.conf");
        std::fs::write(
            &conf,
            BUS_CONF.replace("@BUS@", &socket.display().to_string()),
        )
        .expect("bus.conf");
        let bus = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .arg("--nofork")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon");
        let address = format!("unix:path={}", socket.display());
        let mut me = Logind {
            dir: dir.to_path_buf(),
            address,
            bus,
            logind: None,
            stop: Arc::new(AtomicBool::new(false)),
            started: Arc::default(),
            fail_job: Arc::default(),
            manager: None,
        };
        poll("the private bus", || socket.exists());
        me.start_logind();
        me.manager = Some(me.unit_manager());
        poll("logind on the bus", || {
            me.busctl_ok(&["status", "org.freedesktop.login1"])
        });
        me
    }

    fn start_logind(&mut self) {
        let script = format!(
            "mount -t tmpfs tmpfs /run/systemd && mount --bind {}/etc /etc/systemd && exec {LOGIND}",
            self.dir.display()
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("logind.log")).expect("log"))
            .spawn()
            .expect("systemd-logind");
        self.logind = Some(child);
    }

    /// The stand-in for systemd's manager: poweroff.target is loaded, a StartUnit is
    /// accepted as job 1 (and recorded), KillUnit of logind signals it, and the job
    /// fails when the test says so.
    fn unit_manager(&self) -> std::thread::JoinHandle<()> {
        let mut c = Connection::open(&self.address).expect("stand-in connects");
        let name = [Value::Str("org.freedesktop.systemd1".into()), Value::U32(4)];
        c.bus_call("RequestName", &name).expect("RequestName");
        let logind_pid = self.logind.as_ref().map(|l| l.id() as i32).unwrap_or(0);
        let (stop, started, fail) = (
            self.stop.clone(),
            self.started.clone(),
            self.fail_job.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if fail.swap(false, Ordering::SeqCst) {
                    job_removed(&mut c);
                }
                let Ok(Some(m)) = c.next(Duration::from_millis(100)) else {
                    continue;
                };
                if m.header.kind == Some(Kind::Call) {
                    answer(&mut c, &m, logind_pid, &started);
                }
            }
        })
    }

    fn busctl(&self, args: &[&str]) -> std::process::Output {
        Command::new("busctl")
            .arg(format!("--address={}", self.address))
            .args(args)
            .output()
            .expect("busctl")
    }

    fn busctl_ok(&self, args: &[&str]) -> bool {
        self.busctl(args).status.success()
    }

    /// `busctl VERB org.freedesktop.login1 /org/freedesktop/login1 ARGS`.
    fn login1(&self, verb: &str, args: &[&str]) -> String {
        let mut all = vec![verb, "org.freedesktop.login1", "/org/freedesktop/login1"];
        all.extend_from_slice(args);
        let out = self.busctl(&all);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn inhibitors(&self) -> String {
        let mut args = vec!["call"];
        args.extend(["org.freedesktop.login1", "/org/freedesktop/login1"]);
        args.extend(["org.freedesktop.login1.Manager", "ListInhibitors"]);
        let out = self.busctl(&args);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn answer(
    c: &mut Connection,
    m: &holdfast::dbus::Message,
    logind: i32,
    started: &Mutex<Vec<String>>,
) {
    let member = m.header.member.as_deref().unwrap_or_default();
    let arg = |i: usize| {
        m.body
            .get(i)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let _ = match member {
        "Get" if arg(1) == "LoadState" => {
            c.reply(m, &[Value::Variant(Box::new(Value::Str("loaded".into())))])
        }
        "Subscribe" => c.reply(m, &[]),
        "StartUnit" => {
            started.lock().expect("lock").push(arg(0));
            c.reply(m, &[Value::Path("/org/freedesktop/systemd1/job/1".into())])
        }
        "KillUnit" if arg(0) == "systemd-logind.service" && logind > 1 => {
            let sig = match m.body.get(2) {
                Some(Value::I32(1)) => nix::sys::signal::Signal::SIGHUP,
                _ => return,
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(logind), sig);
            c.reply(m, &[])
        }
        _ => c.reply_error(m, "org.freedesktop.DBus.Error.UnknownMethod", member),
    };
}

/// systemd's word that job 1 (the power-off) ended without running.
fn job_removed(c: &mut Connection) {
    let h = Header {
        kind: Some(Kind::Signal),
        path: Some("/org/freedesktop/systemd1".into()),
        interface: Some("org.freedesktop.systemd1.Manager".into()),
        member: Some("JobRemoved".into()),
        ..Header::default()
    };
    let body = [
        Value::U32(1),
        Value::Path("/org/freedesktop/systemd1/job/1".into()),
        Value::Str("poweroff.target".into()),
        Value::Str("canceled".into()),
    ];
    c.send(h, &body).expect("JobRemoved");
}

impl Drop for Logind {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.manager.take() {
            let _ = t.join();
        }
        // The mount namespace ends with logind, its only process.
        for child in self.logind.iter_mut().chain(std::iter::once(&mut self.bus)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn poll(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A pod bound to the node whose SIGTERM trap writes its name to the shared file,
/// waits `linger` seconds and exits `code`.
fn pod(name: &str, class: Option<&str>, shared: &Path, linger: u32, code: i32) -> String {
    let script = format!(
        "trap 'echo {name} >> /shared/order; sleep {linger}; exit {code}' TERM; \
         while true; do sleep 0.2; done"
    );
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "volumes": [{"name": "shared", "hostPath": {"path": shared.display().to_string()}}],
            "containers": [{
                "name": "main", "image": "busybox:demo", "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
            }],
        },
    });
    if let Some(c) = class {
        p["spec"]["priorityClassName"] = json!(c);
    }
    p.to_string()
}

fn ready(cp: &ControlPlane) -> Json {
    let node = cp.get(&format!("node/{NODE}"), None).unwrap_or_default();
    condition(&node, "Ready").clone()
}

#[test]
fn a_power_off_waits_for_the_pods_stopped_by_priority_and_reported() {
    if !need_root() {
        return;
    }
    if !Path::new(LOGIND).exists() {
        eprintln!("skipped: no {LOGIND} (the systemd package)");
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    let mut a = Agent::new("node-shutdown");
    a.node_name = NODE.into();
    let logind = Logind::start(&a.dir.join("logind"));
    let conf_d = logind.dir.join("etc/logind.conf.d");
    cp.join(
        &mut a,
        &format!("  logindConfigDir: {}\n", conf_d.display()),
        "shutdownGracePeriod: 8s\nshutdownGracePeriodCriticalPods: 3s\n\
         nodeStatusUpdateFrequency: 2s\n",
    );
    a.extra_env
        .push(("DBUS_SYSTEM_BUS_ADDRESS".into(), logind.address.clone()));
    let shared = a.dir.join("shared");
    std::fs::create_dir_all(&shared).expect("shared dir");
    a.start();
    let log = || tail(&a.agent_log(), 60);

    // logind's 5 s default was raised to the 8 s asked for, by the drop-in.
    let drop_in = std::fs::read_to_string(conf_d.join("99-holdfast.conf")).unwrap_or_default();
    assert!(
        drop_in.contains("InhibitDelayMaxSec=8"),
        "{drop_in}\n{}",
        log()
    );
    cp.wait_for("logind's InhibitDelayMaxUSec at 8 s", WAIT, log, |_| {
        let args = ["org.freedesktop.login1.Manager", "InhibitDelayMaxUSec"];
        (logind.login1("get-property", &args).trim() == "t 8000000").then_some(())
    });
    cp.wait_for("holdfast's delay inhibitor", WAIT, log, |_| {
        let list = logind.inhibitors();
        (list.contains("\"holdfast\"") && list.contains("\"delay\"")).then_some(())
    });
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    cp.create(&pod("batch", None, &shared, 2, 42));
    cp.create(&pod(
        "critical",
        Some("system-node-critical"),
        &shared,
        0,
        43,
    ));
    for name in ["batch", "critical"] {
        cp.wait_for(&format!("{name} Running"), WAIT, log, |cp| {
            cp.get(&format!("pod/{name}"), Some("default"))
                .filter(|p| p["status"]["phase"] == "Running")
        });
    }

    let began = Instant::now();
    let power_off = ["org.freedesktop.login1.Manager", "PowerOff", "b", "false"];
    logind.login1("call", &power_off);
    cp.wait_for("the node NotReady for the shutdown", WAIT, log, |cp| {
        let r = ready(cp);
        (r["status"] == "False" && r["message"] == "node is shutting down").then_some(r)
    });
    // logind goes on (StartUnit poweroff.target) once holdfast released its lock.
    cp.wait_for("logind to start poweroff.target", WAIT, log, |_| {
        logind.started.lock().expect("lock").first().cloned()
    });
    let took = began.elapsed();
    assert_eq!(
        *logind.started.lock().expect("lock"),
        vec!["poweroff.target".to_string()]
    );
    assert_eq!(ready(&cp)["reason"], "KubeletNotReady");
    assert!(
        !logind.inhibitors().contains("\"holdfast\""),
        "{}",
        logind.inhibitors()
    );

    // Already in the apiserver when the lock went: no waiting here.
    assert_stopped_and_reported(&cp, &shared);
    eprintln!("PowerOff to poweroff.target started: {took:?}");

    // The power-off job fails: logind says the shutdown is off, holdfast takes the lock
    // again and the node is Ready again.
    logind.fail_job.store(true, Ordering::SeqCst);
    cp.wait_for("holdfast's inhibitor again", WAIT, log, |_| {
        logind.inhibitors().contains("\"holdfast\"").then_some(())
    });
    cp.wait_for("the node Ready again", WAIT, log, |cp| {
        (ready(cp)["status"] == "True").then_some(())
    });

    a.reset();
    a.assert_clean();
}

/// Both pods as the kubelet ends them on a shutdown, stopped in priority order, each
/// by its own SIGTERM trap.
fn assert_stopped_and_reported(cp: &ControlPlane, shared: &Path) {
    for (name, code) in [("batch", 42), ("critical", 43)] {
        let p = cp
            .get(&format!("pod/{name}"), Some("default"))
            .expect("pod");
        let s = &p["status"];
        assert_eq!(s["phase"], "Failed", "{name}: {s}");
        assert_eq!(s["reason"], "Terminated", "{name}");
        assert_eq!(s["message"], MESSAGE, "{name}");
        let d = condition(&p, "DisruptionTarget");
        assert_eq!(
            (&d["status"], &d["reason"]),
            (&json!("True"), &json!("TerminationByKubelet"))
        );
        // The trap ran and chose the exit code: SIGTERM came, with time to act on it.
        let exit = &container(&p, "main")["state"]["terminated"]["exitCode"];
        assert_eq!(*exit, json!(code), "{name}: {s}");
    }
    let order = std::fs::read_to_string(shared.join("order")).expect("order");
    assert_eq!(
        order, "batch\ncritical\n",
        "the critical pod is stopped last"
    );
}
