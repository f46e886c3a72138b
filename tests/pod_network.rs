//! Pod networking end to end, as root, with Debian's real CNI plugins on a bridge of
//! the test's own: pods get their own network namespace and address, reach each
//! other by pod IP, a hostPort reaches a pod from the host, `/etc/resolv.conf` and
//! `/etc/hosts` follow the pod's DNS settings, and neither a removed pod nor an agent
//! killed at a bad moment leaks a lease, a rule or a namespace.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::agent::{container, need_root, Agent};
use support::cni::{nat_rules_naming, need_plugins, TestNetwork};

const WAIT: Duration = Duration::from_secs(60);

/// A static pod of one container `main` running `script` (JSON-quoted), with `extra`
/// YAML lines under `spec:` (two spaces in) and under the container (six spaces in).
fn pod_yaml(name: &str, script: &str, spec_extra: &str, container_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  \
         terminationGracePeriodSeconds: 1\n{spec_extra}  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", {}]\n{container_extra}",
        serde_json::to_string(script).expect("json string")
    )
}

fn running(p: &Value) -> bool {
    container(p, "main")["state"]["running"].is_object()
}

/// The lines a pod's container printed (CRI log lines without their prefix).
fn printed(a: &Agent, name: &str) -> Vec<String> {
    let Some(p) = a.pod(name) else {
        return Vec::new();
    };
    a.container_log(&p, "main", 0)
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
        .collect()
}

/// Waits until pod `name` has printed a line `END`, and returns what it printed.
fn output(a: &Agent, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    a.wait_until(&format!("pod {name} to print its output"), WAIT, |a| {
        out = printed(a, name);
        out.iter().any(|l| l == "END")
    });
    out
}

fn pod_ip(p: &Value) -> String {
    p["status"]["podIP"].as_str().unwrap_or_default().to_owned()
}

fn uid(p: &Value) -> String {
    p["pod"]["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A free TCP port on 127.0.0.1 for a hostPort.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn http_get(addr: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr.parse().expect("addr"), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

fn agent_on(name: &str, net_index: u32, extra: &str) -> (TestNetwork, Agent) {
    let a = Agent::new(name);
    let net = TestNetwork::new(&a, net_index);
    a.write_config(&format!("{}{extra}", net.holdfast_keys()));
    (net, a)
}

#[test]
fn pods_reach_each_other_by_pod_ip_and_the_host_reaches_a_host_port() {
    if !need_root() || !need_plugins() {
        return;
    }
    let (net, mut a) = agent_on("cni-reach", 0, "");
    a.start();
    let port = free_port();
    a.write_manifest(
        "web.yaml",
        &pod_yaml(
            "web",
            "ip -4 -o addr show eth0; mkdir -p /www; echo hello-from-web > /www/index.html; \
             echo END; exec httpd -f -p 80 -h /www",
            "",
            &format!("      ports:\n        - containerPort: 80\n          hostPort: {port}\n"),
        ),
    );
    let web = a.wait_pod("web", "running with an address", WAIT, |p| {
        running(p) && !pod_ip(p).is_empty()
    });
    let web_ip = pod_ip(&web);
    assert!(
        web_ip.starts_with(&net.prefix),
        "{web_ip} not in {}",
        net.subnet
    );
    assert_eq!(web["status"]["podIPs"][0]["ip"], web_ip.as_str());
    // The address the pod reports is its own eth0's.
    let shown = output(&a, "web");
    assert!(
        shown
            .iter()
            .any(|l| l.contains(&format!("inet {web_ip}/24"))),
        "{shown:?}"
    );

    a.write_manifest(
        "client.yaml",
        &pod_yaml(
            "client",
            &format!(
                "i=0; until wget -q -O- http://{web_ip}/; do i=$((i+1)); [ $i -gt 100 ] && break; \
                 sleep 0.1; done; echo; echo END; exec sleep 3600"
            ),
            "",
            "",
        ),
    );
    let client = a.wait_pod("client", "running with an address", WAIT, |p| {
        running(p) && !pod_ip(p).is_empty()
    });
    let client_ip = pod_ip(&client);
    assert!(client_ip.starts_with(&net.prefix), "{client_ip}");
    assert_ne!(client_ip, web_ip);
    let got = output(&a, "client");
    assert!(got.iter().any(|l| l == "hello-from-web"), "{got:?}");

    // From the host, through portmap.
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        match http_get(&addr) {
            Ok(b) if b.contains("hello-from-web") => break b,
            other if Instant::now() >= deadline => panic!("hostPort {addr}: {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert!(body.starts_with("HTTP/1."), "{body}");

    // Each pod holds one lease; removing the pods releases them and their rules.
    let leases = net.leases();
    assert_eq!(leases.len(), 2, "{leases:?}");
    let (web_uid, client_uid) = (uid(&web), uid(&client));
    assert!(
        leases.contains(&(web_ip.clone(), web_uid.clone())),
        "{leases:?}"
    );
    assert!(
        !nat_rules_naming(&web_uid).is_empty(),
        "portmap and masquerade rules"
    );
    a.remove_manifest("web.yaml");
    a.remove_manifest("client.yaml");
    a.wait_gone("web", WAIT);
    a.wait_gone("client", WAIT);
    a.wait_until("the pods' sandboxes to be torn down", WAIT, |a| {
        !a.root.join("pods").join(&web_uid).exists()
            && !a.root.join("pods").join(&client_uid).exists()
    });
    assert!(net.leases().is_empty(), "{:?}", net.leases());
    assert!(
        nat_rules_naming(&web_uid).is_empty(),
        "{:?}",
        nat_rules_naming(&web_uid)
    );
    assert!(nat_rules_naming(&client_uid).is_empty());
    assert!(http_get(&addr).map_or(true, |b| !b.contains("hello-from-web")));
    a.reset();
    a.assert_clean();
}

#[test]
fn dns_files_follow_the_pods_dns_policy() {
    if !need_root() || !need_plugins() {
        return;
    }
    let (_net, mut a) = agent_on(
        "cni-dns",
        1,
        "clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n",
    );
    // A host resolver of the test's own, so what pods inherit is known.
    let resolv = a.dir.join("host-resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 192.0.2.53\nsearch site.example\noptions edns0\n",
    )
    .expect("write resolv");
    let cfg = std::fs::read_to_string(a.dir.join("config.yaml")).expect("config");
    std::fs::write(
        a.dir.join("config.yaml"),
        format!("{cfg}resolvConf: {}\n", resolv.display()),
    )
    .expect("config");
    a.start();
    let show = "cat /etc/resolv.conf; echo ---; cat /etc/hosts; echo ---; hostname; echo END; exec sleep 3600";
    a.write_manifest(
        "cluster.yaml",
        &pod_yaml(
            "cluster",
            show,
            "  subdomain: db\n  hostAliases:\n    - ip: 10.0.0.9\n      hostnames: [foo.local, bar.local]\n",
            "",
        ),
    );
    a.write_manifest(
        "custom.yaml",
        &pod_yaml(
            "custom",
            show,
            "  hostname: fancy\n  dnsPolicy: None\n  dnsConfig:\n    nameservers: [1.1.1.1]\n    \
             searches: [a.example]\n    options:\n      - name: ndots\n        value: \"2\"\n",
            "",
        ),
    );
    a.write_manifest(
        "hostnet.yaml",
        &pod_yaml("hostnet", show, "  hostNetwork: true\n", ""),
    );
    let cluster = a.wait_pod("cluster", "running", WAIT, running);
    let ip = pod_ip(&cluster);
    let out = output(&a, "cluster");
    let text = out.join("\n");
    assert!(
        text.starts_with(
            "search default.svc.cluster.local svc.cluster.local cluster.local site.example\n\
             nameserver 10.96.0.10\noptions ndots:5\n---\n# Kubernetes-managed hosts file.\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{ip}\tcluster-node-1.db.default.svc.cluster.local\tcluster-node-1\n\n\
             # Entries added by HostAliases.\n10.0.0.9\tfoo.local\tbar.local\n---\ncluster-node-1\n"
        )),
        "{text}"
    );

    let out = output(&a, "custom").join("\n");
    assert!(
        out.starts_with("search a.example\nnameserver 1.1.1.1\noptions ndots:2\n---\n"),
        "{out}"
    );
    assert!(out.ends_with("---\nfancy\nEND"), "{out}");

    // ClusterFirst on the host's network: the host's resolver and /etc/hosts.
    let out = output(&a, "hostnet").join("\n");
    assert!(
        out.starts_with(
            "search site.example\nnameserver 192.0.2.53\noptions edns0\n---\n\
             # Kubernetes-managed hosts file (host network).\n"
        ),
        "{out}"
    );
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert!(
        out.ends_with(&format!("---\n{}\nEND", host_name.trim())),
        "{out}"
    );
    a.reset();
    a.assert_clean();
}

/// Kills every process of the agent's pods (shims and containers) and drops the
/// namespaces' bind mounts: what a power cut leaves on disk, without the reboot.
fn power_cut(a: &mut Agent) {
    a.kill9();
    let root = a.root.display().to_string();
    // Container inits first (SIGKILL takes their PID namespace with them), as their
    // shims' records name them.
    for e in std::fs::read_dir(a.root.join("boot/containers"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(e.path().join("started.json")) else {
            continue;
        };
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        if let Some(pid) = v["init"]["pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    for _ in 0..50 {
        let mut killed = 0;
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let proot = std::fs::read_link(format!("/proc/{pid}/root")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(&root) || proot.starts_with(&a.root) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                killed += 1;
            }
        }
        if killed == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for l in mounts.lines() {
        if let Some(mp) = l.split_whitespace().nth(4) {
            if mp.starts_with(&root) && mp.contains("/ns/") {
                let _ = nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

#[test]
fn restarts_and_power_cuts_leak_no_lease() {
    if !need_root() || !need_plugins() {
        return;
    }
    let (net, mut a) = agent_on("cni-cut", 2, "");
    a.start();
    a.write_manifest("web.yaml", &pod_yaml("web", "exec sleep 100000", "", ""));
    let p = a.wait_pod("web", "running", WAIT, |p| {
        running(p) && !pod_ip(p).is_empty()
    });
    let (ip, id) = (pod_ip(&p), uid(&p));
    assert_eq!(net.leases(), [(ip.clone(), id.clone())]);

    // An agent restart adopts the pod: same container, same address, no new lease.
    let cid = container(&p, "main")["containerID"].clone();
    a.kill9();
    a.start();
    let p = a.wait_pod("web", "adopted", WAIT, |p| {
        running(p) && container(p, "main")["containerID"] == cid
    });
    assert_eq!(pod_ip(&p), ip);
    assert_eq!(net.leases(), [(ip.clone(), id.clone())]);

    // A power cut: the namespace and the processes are gone, the lease and the record
    // of the attachment are still on disk. The pod comes back with one lease.
    power_cut(&mut a);
    support::cni::forget_rules_naming(&id);
    a.start();
    let p = a.wait_pod("web", "running again", WAIT, |p| {
        running(p) && container(p, "main")["containerID"] != cid && !pod_ip(p).is_empty()
    });
    let leases = net.leases();
    assert_eq!(leases, [(pod_ip(&p), id.clone())], "one lease for the pod");
    a.reset();
    a.assert_clean();
    assert!(
        net.leases().is_empty(),
        "reset releases the lease: {:?}",
        net.leases()
    );
    assert!(
        nat_rules_naming(&id).is_empty(),
        "{:?}",
        nat_rules_naming(&id)
    );
}

#[test]
fn a_broken_network_is_said_and_the_pod_waits() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("cni-broken");
    let conf = a.dir.join("cni-conf");
    std::fs::create_dir_all(&conf).expect("mkdir");
    std::fs::write(
        conf.join("10-missing.conflist"),
        br#"{"cniVersion":"1.0.0","name":"nope","plugins":[{"type":"no-such-plugin"}]}"#,
    )
    .expect("write");
    a.write_config(&format!(
        "  cniConfDir: {}\n  cniBinDir: /usr/lib/cni\n",
        conf.display()
    ));
    a.start();
    a.write_manifest("web.yaml", &pod_yaml("web", "exec sleep 100000", "", ""));
    let p = a.wait_pod("web", "waiting for its sandbox", WAIT, |p| {
        support::agent::condition(p, "PodReadyToStartContainers")["status"] == "False"
            && container(p, "main")["state"]["waiting"]["reason"] == "ContainerCreating"
    });
    assert_eq!(p["status"]["phase"], "Pending");
    a.wait_until("the failure to be logged", WAIT, |a| {
        a.agent_log().contains("Failed to create pod sandbox")
            && a.agent_log().contains("no-such-plugin")
    });
    // Nothing of it is left half set up.
    let id = uid(&p);
    let ns = a.root.join("boot/pods").join(&id).join("ns");
    let held: Vec<_> = std::fs::read_dir(&ns)
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    assert!(held.is_empty(), "{held:?}");
    a.reset();
    a.assert_clean();
}

#[test]
fn a_pods_containers_share_its_namespaces_and_a_broken_network_is_repaired() {
    if !need_root() || !need_plugins() {
        return;
    }
    let (net, mut a) = agent_on("cni-share", 3, "");
    a.start();
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: duo\nspec:\n  terminationGracePeriodSeconds: 1\n  \
         shareProcessNamespace: true\n  containers:\n    - name: main\n      image: busybox:demo\n      \
         command: [\"sh\", \"-c\", {}]\n    - name: side\n      image: busybox:demo\n      \
         command: [\"sh\", \"-c\", \"echo shared > /dev/shm/note; exec sleep 7777\"]\n",
        serde_json::to_string(
            "until [ -e /dev/shm/note ]; do sleep 0.1; done; \
             echo note=$(cat /dev/shm/note); echo host=$(hostname); \
             ps | grep -c '[s]leep 7777' | sed 's/^/sees-side=/'; \
             ip -4 -o addr show eth0 | grep -o 'inet [0-9.]*'; echo END; exec sleep 3600"
        )
        .expect("json")
    );
    a.write_manifest("duo.yaml", &yaml);
    let p = a.wait_pod("duo", "both running", WAIT, |p| {
        running(p) && container(p, "side")["state"]["running"].is_object()
    });
    let out = output(&a, "duo");
    let ip = pod_ip(&p);
    // One IPC namespace and /dev/shm, one host name, one PID namespace, one address.
    assert!(out.contains(&"note=shared".to_string()), "{out:?}");
    assert!(out.contains(&"host=duo-node-1".to_string()), "{out:?}");
    assert!(out.contains(&"sees-side=1".to_string()), "{out:?}");
    assert!(out.contains(&format!("inet {ip}")), "{out:?}");

    // Someone takes the pod's veth off the bridge: the next resync's CNI CHECK fails
    // and the pod is attached again (DEL, ADD), its containers still running.
    let dir = a.root.join("pods").join(uid(&p));
    // The namespaces last one boot: held on the agent's tmpfs, not in the pod's dir.
    let netns = a.root.join("boot/pods").join(uid(&p)).join("ns/net");
    let cid = container(&p, "main")["containerID"].clone();
    let attached: Value =
        serde_json::from_slice(&std::fs::read(dir.join("network.json")).expect("network.json"))
            .expect("json");
    let veth = attached["result"]["interfaces"]
        .as_array()
        .and_then(|i| {
            i.iter()
                .filter_map(|i| i["name"].as_str())
                .find(|n| n.starts_with("veth"))
        })
        .expect("the pod's host-side veth")
        .to_owned();
    let off = std::process::Command::new("ip")
        .args(["link", "set", &veth, "nomaster"])
        .status()
        .expect("ip link");
    assert!(off.success());
    let on_bridge = |name: &str| {
        std::process::Command::new("ip")
            .args(["-o", "link", "show", "master", &net.bridge])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(" {name}@")))
            .unwrap_or(false)
    };
    assert!(!on_bridge(&veth));
    a.wait_until("the pod's network to be attached again", WAIT, |_| {
        let now: Value = std::fs::read(dir.join("network.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let new_veth = now["result"]["interfaces"]
            .as_array()
            .and_then(|i| {
                i.iter()
                    .filter_map(|i| i["name"].as_str())
                    .find(|n| n.starts_with("veth"))
            })
            .unwrap_or_default()
            .to_owned();
        !new_veth.is_empty() && new_veth != veth && on_bridge(&new_veth)
    });
    let has_address = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-4", "-o", "addr", "show", "eth0"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(&net.prefix))
        .unwrap_or(false);
    assert!(has_address, "eth0 has an address again");
    a.wait_until("the repair to be said", WAIT, |a| {
        a.agent_log().contains("network check failed")
    });
    let p = a.pod("duo").expect("pod");
    assert_eq!(container(&p, "main")["containerID"], cid, "not restarted");
    assert_eq!(net.leases().len(), 1, "{:?}", net.leases());
    // The pod's PID 1 goes with the pod.
    let init = std::fs::read_to_string(netns.with_file_name("pid-init")).expect("pid-init");
    let init: i32 = init
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("pid");
    assert!(std::path::Path::new(&format!("/proc/{init}")).exists());
    a.reset();
    a.assert_clean();
    let alive =
        std::fs::read_to_string(format!("/proc/{init}/stat")).is_ok_and(|s| !s.contains(") Z "));
    assert!(!alive, "the pod's init {init} is still running");
}
