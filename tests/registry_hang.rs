//! One repository of a registry that hangs, with a real `holdfast run` and Debian's real
//! `docker-registry` behind a 127.0.0.1 front (a [`Stub`]) that holds every request for
//! that repository unanswered and passes the rest on: the hanging repository's pulls
//! fail with its own timeout, while the host's other repositories are pulled as ever
//! (an `Always` pod asks the registry rather than falling back on its local copy), and
//! a pull in progress shows as ContainerCreating, not as the back-off of the last try.

use support::{pki, registry};

use std::time::{Duration, Instant};

use registry::{push_busybox, sleep_pod, waiting, Auth, Registry};
use serde_json::Value;
use support::agent::{container, need_root, Agent};
use support::https_stub::{Answer, Stub};

const WAIT: Duration = Duration::from_secs(60);
/// Three tries of a request whose answer never comes, 30 s each, with pauses.
const HANG_FAILS_WITHIN: Duration = Duration::from_secs(150);
const HANGING: &str = "/v2/edge/hang/";

fn running(p: &Value) -> bool {
    container(p, "c")["state"]["running"].is_object()
}

fn requests(front: &Stub, path: &str) -> usize {
    front
        .heads()
        .iter()
        .filter(|h| h.path.starts_with(path))
        .count()
}

#[test]
fn a_hanging_repository_fails_alone_and_its_next_pull_shows_as_in_progress() {
    if !need_root() || !registry::tools_present() {
        return;
    }
    let mut a = Agent::new("pull-hang");
    let pki = pki::Pki::new(&a.dir.join("pki"));
    let reg = Registry::start(&a.dir.join("registry"), &pki, Auth::None);
    for repo in ["edge/app", "edge/other", "edge/hang"] {
        push_busybox(&reg, &a.dir, repo, "1", None);
    }
    let front = Stub::start(&pki, "front", Some(reg.addr), |h| {
        if h.path.starts_with(HANGING) {
            Answer::Hang
        } else {
            Answer::Forward
        }
    });
    let host = front.addr.to_string();
    a.write_config(&format!(
        "  imagePullBackOffInitial: 2s\n  imagePullBackOffMax: 4s\n  registries:\n    \"{host}\":\n      caFile: {}\n",
        pki.ca.display()
    ));
    a.start();
    let app = format!("{host}/edge/app:1");
    a.write_manifest("app.yaml", &sleep_pod("app", &app, "Always"));
    a.wait_pod("app", "running", WAIT, running);

    // The hanging repository's pull fails with its own URL and timeout.
    let hang = format!("{host}/edge/hang:1");
    a.write_manifest("hang.yaml", &sleep_pod("hang", &hang, "IfNotPresent"));
    let p = a.wait_pod("hang", "ErrImagePull", HANG_FAILS_WITHIN, |p| {
        matches!(waiting(p).0.as_str(), "ErrImagePull" | "ImagePullBackOff")
    });
    let (_, message) = waiting(&p);
    assert!(
        message.contains(&format!("{host}{HANGING}")) && message.contains("timed out"),
        "{message}"
    );
    let hung = requests(&front, HANGING);

    // Right after, the host's other repositories are pulled as ever: a new image, and
    // an `Always` pod of an image that is here asks the registry, not its local copy.
    let app_manifests = requests(&front, "/v2/edge/app/manifests/");
    a.write_manifest("again.yaml", &sleep_pod("again", &app, "Always"));
    let other = format!("{host}/edge/other:1");
    a.write_manifest("other.yaml", &sleep_pod("other", &other, "IfNotPresent"));
    a.wait_pod("other", "running from its own pull", WAIT, running);
    a.wait_pod("again", "running", WAIT, running);
    assert!(
        requests(&front, "/v2/edge/app/manifests/") > app_manifests,
        "the Always pod did not ask the registry: {:?}",
        front.heads()
    );
    let log = a.agent_log();
    assert!(
        !log.contains("the image present on this node"),
        "an Always pod fell back on its local copy:\n{log}"
    );

    // Once the hanging repository is tried again, the pod shows the pull in progress.
    a.wait_until("the hanging repository to be tried again", WAIT, |_| {
        requests(&front, HANGING) > hung
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let p = a.pod("hang").expect("hang pod");
        let (reason, message) = waiting(&p);
        if reason == "ContainerCreating" {
            assert!(message.is_empty(), "{message}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a pull in progress shows as {reason}: {message}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(front);
    a.reset();
    a.assert_clean();
}
