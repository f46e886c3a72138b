//! A node behind a site's HTTP proxy, against the real thing: the kube-apiserver and
//! Debian's `docker-registry` on 127.0.0.1, reachable only through Debian's `tinyproxy`
//! (the direct route reset by iptables for every user but the proxy's, and shown reset
//! first). With wrong proxy credentials in `HTTPS_PROXY` the node does not come up and the
//! agent says why, naming the proxy without the password, and keeps trying; with the
//! right ones in the config file's `holdfast.proxy` (which wins over the environment)
//! it registers, is Ready, and runs a pod whose image it pulls through the proxy, whose
//! log shows the CONNECTs; a registry listed in `noProxy` is pulled from directly; and
//! its `staticPodURL`, plain http on 127.0.0.1 behind the same block, is fetched through
//! the `http` proxy (the kubelet's Go client reads `HTTP_PROXY` for it).

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;
use support::agent::{container, need_root, sh_pod, Agent};
use support::control_plane::cluster::{tail, wait_node, wait_running, NO_PRESSURE};
use support::control_plane::{ControlPlane, Options};
use support::http_proxy::{self, DirectBlocked, Tinyproxy};
use support::http_server::HttpServer;
use support::pki::Pki;
use support::registry::{self, push_busybox, Auth, Registry};

const NODE: &str = "proxied-node";
const USER: &str = "site";
const PASSWORD: &str = "Pr0xy-pa55word";
const WRONG: &str = "not-the-pa55word";

/// Port of `https://127.0.0.1:<port>`.
fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port")
}

/// The test's kubectl reaches the apiserver through a proxy of its own, by the admin
/// kubeconfig's `proxy-url` (client-go's), as the direct route is blocked for it too.
fn kubectl_through(cp: &ControlPlane, proxy: &Tinyproxy) {
    let text = std::fs::read_to_string(&cp.admin_kubeconfig).expect("admin kubeconfig");
    let server = format!("    server: {}\n", cp.url);
    assert!(text.contains(&server), "{text}");
    let with_proxy = text.replace(
        &server,
        &format!("{server}    proxy-url: {}\n", proxy.url(None)),
    );
    std::fs::write(&cp.admin_kubeconfig, with_proxy).expect("write admin kubeconfig");
}

/// `holdfast:` keys: trust the test CA for the registries, then `proxy`.
fn registry_keys(hosts: &[&Registry], proxy: &str) -> String {
    format!("{}{proxy}", registry::trusted(hosts))
}

fn join(cp: &ControlPlane, a: &mut Agent, holdfast_keys: &str, top_level: &str) {
    a.extra_args.clear();
    cp.join(
        a,
        holdfast_keys,
        &format!(
            "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n{NO_PRESSURE}{top_level}"
        ),
    );
}

fn image_pod(name: &str, image: &str) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": image,
                "imagePullPolicy": "Always",
                "command": ["sleep", "3600"],
            }],
        },
    })
    .to_string()
}

fn refused(port: u16) -> bool {
    matches!(
        TcpStream::connect(("127.0.0.1", port)),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused
    )
}

#[test]
fn a_node_behind_a_proxy_registers_and_pulls_through_it() {
    if !need_root() || !registry::tools_present() || !http_proxy::tools_present() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    cp.kubectl_ok(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new("http-proxy");
    a.node_name = NODE.into();
    let pki = Pki::new(&a.dir.join("pki"));
    let reg = Registry::start(&a.dir.join("registry"), &pki, Auth::None);
    push_busybox(&reg, &a.dir, "edge/app", "1", None);
    let near = Registry::start(&a.dir.join("registry-near"), &pki, Auth::None);
    push_busybox(&near, &a.dir, "edge/near", "1", None);
    let manifests = HttpServer::start();
    manifests.answer(
        200,
        sh_pod(
            "from-url",
            "  terminationGracePeriodSeconds: 0\n",
            "main",
            "exec sleep 1000",
            "",
        ),
    );
    let (api_port, reg_port, url_port) = (port_of(&cp.url), reg.addr.port(), manifests.addr.port());

    let site = Tinyproxy::start(
        &a.dir.join("site-proxy"),
        Some((USER, PASSWORD)),
        &[api_port, reg_port, url_port],
    );
    let admin = Tinyproxy::start(&a.dir.join("admin-proxy"), None, &[api_port]);
    assert_eq!(site.uid(), Some(65534), "tinyproxy runs as nobody");
    kubectl_through(&cp, &admin);

    // The pods for the node, made while the apiserver's admission can still reach the
    // apiserver itself (its loopback client is blocked too once the route is).
    cp.create(&image_pod("far", &format!("{}/edge/app:1", reg.host())));
    cp.create(&image_pod("near", &format!("{}/edge/near:1", near.host())));

    // The direct route is there, then gone for everyone but the proxies.
    assert!(
        !refused(api_port) && !refused(reg_port) && !refused(url_port),
        "direct route before the block"
    );
    let _blocked = DirectBlocked::new(&[api_port, reg_port, url_port]);
    assert!(refused(api_port), "the apiserver is reached directly");
    assert!(refused(reg_port), "the registry is reached directly");
    assert!(refused(url_port), "the manifest URL is reached directly");
    cp.kubectl_ok(&["get", "serviceaccount", "default"]);

    // Wrong credentials, from the environment: a clear error, retried; no node.
    a.extra_env = vec![("HTTPS_PROXY".into(), site.url(Some((USER, WRONG))))];
    join(&cp, &mut a, &registry_keys(&[&reg], ""), "");
    a.start();
    let want = format!(
        "proxy http://***@127.0.0.1:{} refused the CONNECT to 127.0.0.1:{api_port}: \
         401 Unauthorized (the proxy URL's user and password were not accepted)",
        site.port
    );
    a.wait_until(
        "the agent to name the proxy's refusal, and to try again",
        Duration::from_secs(30),
        |a| {
            let api = format!("127.0.0.1:{api_port}");
            let asked = site.connects().into_iter().filter(|c| *c == api).count();
            a.agent_log().contains(&want) && asked >= 2
        },
    );
    assert!(
        cp.get(&format!("node/{NODE}"), None).is_none(),
        "no node yet"
    );
    a.stop();
    let log = a.agent_log();
    assert!(
        !log.contains(WRONG),
        "the password is in the log:\n{}",
        tail(&log, 30)
    );

    // The right credentials in the config file, which wins over the environment (still
    // wrong); the near registry reached directly by noProxy.
    // The manifest URL is plain http: it takes the `http` proxy.
    let site_url = site.url(Some((USER, PASSWORD)));
    let file_proxy = format!(
        "  proxy:\n    https: {site_url}\n    http: {site_url}\n    noProxy: [\"127.0.0.1:{}\"]\n",
        near.addr.port()
    );
    let url = format!(
        "staticPodURL: {}\nhttpCheckFrequency: 1s\n",
        manifests.url("/pods.yaml")
    );
    join(
        &cp,
        &mut a,
        &registry_keys(&[&reg, &near], &file_proxy),
        &url,
    );
    a.start();
    wait_node(&cp, &a, NODE, false);
    wait_running(&cp, &a, "default", "far");
    wait_running(&cp, &a, "default", "near");
    a.wait_pod(
        "from-url",
        "running from the URL",
        Duration::from_secs(60),
        |p| container(p, "main")["state"]["running"].is_object(),
    );
    assert!(
        !manifests.heads().is_empty(),
        "the manifest URL was not asked"
    );

    let connects = site.connects();
    for target in [api_port, reg_port, url_port].map(|p| format!("127.0.0.1:{p}")) {
        assert!(
            connects.contains(&target),
            "no CONNECT to {target}: {connects:?}"
        );
    }
    let near_target = format!("127.0.0.1:{}", near.addr.port());
    assert!(
        !connects.contains(&near_target),
        "{near_target} went through the proxy"
    );
    assert!(
        near.log().contains("/v2/edge/near/manifests/1"),
        "the near registry was not asked:\n{}",
        near.log()
    );
    let log = a.agent_log();
    assert!(!log.contains(PASSWORD), "the password is in the log");
}
