//! Credentials and redirects, with Debian's real `docker-registry` (token auth against
//! the test's token service, TLS from the test's CA) on 127.0.0.1: blobs the registry
//! redirects to a storage host are fetched there without the registry's token, and a
//! token service that redirects to another host gets the password sent to it alone,
//! never to the host it redirects to. Both through `holdfast image pull` and a pod's
//! pull by `holdfast run`.
//!
//! The storage host and the redirect target are [`Stub`]s on 127.0.0.1 that record
//! every request. The holdfast processes trust the test's CA as their system CA
//! (`SSL_CERT_FILE`), as a public storage host or token service would be trusted: so a
//! redirect's TLS handshake succeeds and what holdfast sends there can be seen.

use support::{oci, pki, registry, tempdir};

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use pki::Pki;
use registry::{sleep_pod, waiting, Auth, Registry, TokenServer};
use support::agent::{container, need_root, Agent};
use support::https_stub::{Answer, Stub};
use tempdir::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_holdfast");
const WAIT: Duration = Duration::from_secs(60);
const USER: &str = "edge";

/// The registry, its token service, and the storage its blobs are redirected to.
struct Site {
    pki: Pki,
    tokens: TokenServer,
    storage: Stub,
    reg: Registry,
}

impl Site {
    fn start(dir: &Path, password: &str) -> Site {
        let pki = Pki::new(&dir.join("pki"));
        let tokens = TokenServer::start(&dir.join("token"), &pki, USER, password);
        let reg_dir = dir.join("registry");
        let data = reg_dir.join("data");
        // Serves the registry's own files at the paths its redirects name.
        let storage = Stub::start(&pki, "storage", None, move |head| {
            let path = head.path.split('?').next().unwrap_or("");
            if path.contains("..") {
                return Answer::Status(400, String::new());
            }
            Answer::File(data.join(path.trim_start_matches('/')))
        });
        let reg =
            Registry::start_redirecting_blobs(&reg_dir, &pki, Auth::Token(&tokens), &storage.url());
        Site {
            pki,
            tokens,
            storage,
            reg,
        }
    }

    /// A stub for the token service to redirect to: it records and refuses.
    fn catcher(&self) -> Stub {
        Stub::start(&self.pki, "catcher", None, |_| {
            Answer::Status(401, "{\"details\":\"no\"}".into())
        })
    }

    /// The docker config with the right password for this registry.
    fn docker_config(&self, password: &str) -> String {
        format!(
            "{{\"auths\":{{\"{}\":{{\"auth\":\"{}\"}}}}}}",
            self.reg.host(),
            registry::b64(format!("{USER}:{password}").as_bytes())
        )
    }
}

fn host_platform() -> String {
    match oci::goarch() {
        (arch, Some(v)) => format!("linux/{arch}/{v}"),
        (arch, None) => format!("linux/{arch}"),
    }
}

/// Pushes an image as `repo:tag`: the host's busybox with a layer of its own.
fn push(site: &Site, dir: &Path, repo: &str, tag: &str, password: &str) {
    let layout = dir.join(format!("layout-{}-{tag}", repo.replace('/', "-")));
    let mut image = oci::busybox_image("unused").expect("busybox");
    let seed = repo.bytes().chain(tag.bytes()).map(u64::from).sum::<u64>() + 7;
    image.layers.push(
        oci::Layer::new(vec![oci::Entry::file(
            "etc/own",
            &oci::noise(100_000, seed),
            0o644,
        )])
        .gzipped(),
    );
    oci::write_index_dir(&layout, &[(&host_platform(), &image)]).expect("layout");
    site.reg.push(&layout, repo, tag, Some((USER, password)));
}

/// Asserts no request `stub` saw carried credentials, and returns how many it saw.
fn no_authorization(stub: &Stub, what: &str) -> usize {
    let heads = stub.heads();
    for h in &heads {
        assert!(
            h.header("authorization").is_none(),
            "{what} was sent credentials: {} {} with {:?}",
            h.method,
            h.path,
            h.header("authorization")
        );
    }
    heads.len()
}

fn pull(site: &Site, root: &Path, reference: &str, creds: &Path) -> Output {
    let config = root.with_extension("yaml");
    std::fs::write(
        &config,
        format!(
            "holdfast:\n  registries:\n    \"{}\":\n      caFile: {}\n",
            site.reg.host(),
            site.reg.ca.display()
        ),
    )
    .expect("config");
    Command::new(BIN)
        .args(["image", "pull", reference, "--config"])
        .arg(&config)
        .arg("--creds")
        .arg(creds)
        .arg("--root-dir")
        .arg(root)
        .env("HOME", root)
        .env("SSL_CERT_FILE", &site.pki.ca)
        .env("RUST_LOG", "debug")
        .output()
        .expect("run holdfast")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn image_pull_sends_the_password_to_the_token_service_alone_and_no_token_to_storage() {
    if !registry::tools_present() {
        return;
    }
    let tmp = TempDir::new("pull-redirect-cli");
    let password = "redirect-cli-pw-41";
    let site = Site::start(&tmp.0, password);
    push(&site, &tmp.0, "private/app", "1", password);
    let creds = tmp.0.join("creds.json");
    std::fs::write(&creds, site.docker_config(password)).expect("creds");

    // Blobs come from the storage host, which never sees the registry's token.
    let reference = format!("{}/private/app:1", site.reg.host());
    let ok = pull(&site, &tmp.0.join("root-ok"), &reference, &creds);
    assert!(ok.status.success(), "{}", text(&ok));
    let fetched = no_authorization(&site.storage, "the blob storage host");
    assert!(fetched >= 3, "{:?}", site.storage.heads());

    // The token service now sends its callers to another host: that host is asked
    // for a token, without the password, and the pull fails saying where it failed.
    let catcher = site.catcher();
    site.tokens.redirect_to(Some(catcher.url()));
    let refused = pull(&site, &tmp.0.join("root-redirected"), &reference, &creds);
    assert!(!refused.status.success(), "{}", text(&refused));
    let asked = no_authorization(&catcher, "the host the token service redirected to");
    assert!(
        asked >= 1,
        "the redirect was not followed: {}",
        text(&refused)
    );
    assert!(
        catcher
            .heads()
            .iter()
            .all(|h| h.path.starts_with("/token?")),
        "{:?}",
        catcher.heads()
    );
    let out = text(&refused);
    assert!(out.contains("authentication failed"), "{out}");
    let encoded = registry::b64(format!("{USER}:{password}").as_bytes());
    for o in [text(&ok), out] {
        assert!(
            !o.contains(password) && !o.contains(&encoded),
            "a credential in:\n{o}"
        );
    }
}

#[test]
fn a_pods_pull_sends_the_password_to_the_token_service_alone_and_no_token_to_storage() {
    if !need_root() || !registry::tools_present() {
        return;
    }
    let mut a = Agent::new("pull-redirect-pod");
    let password = "redirect-pod-pw-97";
    let site = Site::start(&a.dir, password);
    push(&site, &a.dir, "private/app", "1", password);
    push(&site, &a.dir, "private/other", "1", password);
    a.extra_env
        .push(("SSL_CERT_FILE".into(), site.pki.ca.display().to_string()));
    a.write_config(&format!(
        "  imagePullBackOffInitial: 2s\n  imagePullBackOffMax: 4s\n  registries:\n    \"{}\":\n      caFile: {}\n",
        site.reg.host(),
        site.reg.ca.display()
    ));
    // The node's docker config holds the password.
    std::fs::write(a.root.join("config.json"), site.docker_config(password)).expect("config");
    a.start();

    let app = format!("{}/private/app:1", site.reg.host());
    a.write_manifest("app.yaml", &sleep_pod("app", &app, "Always"));
    a.wait_pod(
        "app",
        "running from blobs the storage host served",
        WAIT,
        |p| container(p, "c")["state"]["running"].is_object(),
    );
    // Its config and its own layer (the busybox layer is here from the agent's start).
    let fetched = no_authorization(&site.storage, "the blob storage host");
    assert!(fetched >= 2, "{:?}", site.storage.heads());

    // A repository the agent holds no token for yet: the token service redirects.
    let catcher = site.catcher();
    site.tokens.redirect_to(Some(catcher.url()));
    let other = format!("{}/private/other:1", site.reg.host());
    a.write_manifest("other.yaml", &sleep_pod("other", &other, "Always"));
    let p = a.wait_pod("other", "ErrImagePull", WAIT, |p| {
        matches!(waiting(p).0.as_str(), "ErrImagePull" | "ImagePullBackOff")
    });
    assert!(
        waiting(&p).1.contains("authentication failed"),
        "{}",
        waiting(&p).1
    );
    let asked = no_authorization(&catcher, "the host the token service redirected to");
    assert!(asked >= 1, "the redirect was not followed");
    let log = a.agent_log();
    assert!(!log.contains(password), "the password in the log");
    drop(catcher);
    a.reset();
    a.assert_clean();
}
