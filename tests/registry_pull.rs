//! `holdfast image pull` against Debian's real `docker-registry` on 127.0.0.1, over TLS
//! from a CA the test makes, with images pushed by `skopeo`: tags and digests, the
//! platform picked from a multi-arch index, a corrupt blob refused with nothing kept, a
//! download cut off midway resumed with `Range`, Basic and token auth with right and
//! wrong credentials (none of which reaches the output), and mirrors before the upstream.
//!
//! The multi-arch index holds the host's real busybox for the host's platform; the
//! entries for the other platforms (of linux/amd64, linux/arm64, linux/arm/v7) are small
//! images whose one file, `/etc/platform`, names their platform.

use support::{oci, pki, proxy, registry, tempdir};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use oci::{Entry, Image, Layer};
use pki::Pki;
use registry::{Auth, Registry, TokenServer};
use tempdir::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_holdfast");

fn holdfast(root: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--root-dir")
        .arg(root)
        // The credentials a test means are the only ones: no $HOME/.docker.
        .env("HOME", root)
        .env("RUST_LOG", "trace")
        .output()
        .expect("run holdfast")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A config file trusting the test CA for `hosts`.
fn config(dir: &Path, ca: &Path, hosts: &[String], extra: &str) -> PathBuf {
    let mut yaml = String::from("holdfast:\n  registries:\n");
    for h in hosts {
        yaml.push_str(&format!("    \"{h}\":\n      caFile: {}\n", ca.display()));
    }
    yaml.push_str(extra);
    let path = dir.join("config.yaml");
    std::fs::write(&path, yaml).expect("config");
    path
}

fn marker_image(platform: &str) -> Image {
    Image {
        layers: vec![Layer::new(vec![
            Entry::dir("etc/", 0o755),
            Entry::file("etc/platform", platform.as_bytes(), 0o644),
        ])
        .gzipped()],
        ..Image::default()
    }
}

fn host_platform() -> &'static str {
    match oci::goarch() {
        ("amd64", _) => "linux/amd64",
        ("arm64", _) => "linux/arm64",
        ("arm", _) => "linux/arm/v7",
        _ => "linux/amd64",
    }
}

/// The unpacked layers of the image recorded under `reference`, from `image ls` and
/// the content dir: the files of its one layer.
fn layer_file(root: &Path, file: &str) -> Option<Vec<u8>> {
    let layers = root.join("content/layers");
    for e in std::fs::read_dir(layers).ok()?.flatten() {
        if let Ok(bytes) = std::fs::read(e.path().join(file)) {
            return Some(bytes);
        }
    }
    None
}

/// A registry's tag, as it stores it: the digest of what the tag names.
fn tag_digest(r: &Registry, repo: &str, tag: &str) -> String {
    let link = r
        .dir
        .join("data/docker/registry/v2/repositories")
        .join(repo)
        .join("_manifests/tags")
        .join(tag)
        .join("current/link");
    std::fs::read_to_string(&link).expect("tag link")
}

#[test]
fn tags_digests_and_the_platform_of_a_multi_arch_index() {
    if !registry::tools_present() {
        return;
    }
    let tmp = TempDir::new("pull-multi");
    let pki = Pki::new(&tmp.0.join("pki"));
    let reg = Registry::start(&tmp.0.join("registry"), &pki, Auth::None);
    let host = host_platform();
    let busybox = oci::busybox_image("unused").expect("busybox");
    let others: Vec<(&str, Image)> = ["linux/amd64", "linux/arm64", "linux/arm/v7"]
        .into_iter()
        .filter(|p| *p != host)
        .map(|p| (p, marker_image(p)))
        .collect();
    let mut entries: Vec<(&str, &Image)> = vec![(host, &busybox)];
    entries.extend(others.iter().map(|(p, i)| (*p, i)));
    let layout = tmp.0.join("layout");
    let (_, built) = oci::write_index_dir(&layout, &entries).expect("layout");
    reg.push(&layout, "multi/busybox", "1", None);
    let cfg = config(&tmp.0, &reg.ca, &[reg.host()], "");
    let cfg = cfg.to_str().expect("path");

    // By tag: the host's entry, real busybox.
    let root = tmp.0.join("root-tag");
    let tag_ref = format!("{}/multi/busybox:1", reg.host());
    let out = holdfast(&root, &["image", "pull", &tag_ref, "--config", cfg]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&built[0].manifest_digest),
        "{}",
        text(&out)
    );
    let bin = layer_file(&root, "bin/busybox").expect("busybox in the layer");
    assert_eq!(bin, std::fs::read("/bin/busybox").expect("host busybox"));
    let ls = stdout(&holdfast(&root, &["image", "ls"]));
    assert!(
        ls.contains(&format!("{}/multi/busybox", reg.host())) && ls.contains(" 1 "),
        "{ls}"
    );

    // Another platform on request, from the same index.
    for (platform, _) in &others {
        let root = tmp.0.join(format!("root-{}", platform.replace('/', "-")));
        let out = holdfast(
            &root,
            &[
                "image",
                "pull",
                &tag_ref,
                "--platform",
                platform,
                "--config",
                cfg,
            ],
        );
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(
            layer_file(&root, "etc/platform").as_deref(),
            Some(platform.as_bytes()),
            "{platform}"
        );
    }
    let out = holdfast(
        &tmp.0.join("root-s390x"),
        &[
            "image",
            "pull",
            &tag_ref,
            "--platform",
            "linux/s390x",
            "--config",
            cfg,
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no manifest for platform linux/s390x"),
        "{}",
        text(&out)
    );

    // On a terminal (a pty from script(1)), progress is a bar per layer redrawn in place.
    let root = tmp.0.join("root-tty");
    let command = format!(
        "{BIN} image pull {tag_ref} --config {cfg} --root-dir {}",
        root.display()
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("HOME", &root)
        .output()
        .expect("script(1)");
    let screen = text(&out);
    assert!(out.status.success(), "{screen}");
    assert!(
        screen.contains("\x1b[2K") && screen.contains("[=============================="),
        "{screen:?}"
    );
    assert!(screen.contains("done"), "{screen:?}");

    // By the index's digest: the same image, recorded under the digest reference.
    let index = tag_digest(&reg, "multi/busybox", "1");
    let root = tmp.0.join("root-digest");
    let digest_ref = format!("{}/multi/busybox@{index}", reg.host());
    let out = holdfast(&root, &["image", "pull", &digest_ref, "--config", cfg]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&built[0].manifest_digest),
        "{}",
        text(&out)
    );
    // A digest that is not in the registry is its error, not a guess.
    let missing = format!("{}/multi/busybox@sha256:{}", reg.host(), "0".repeat(64));
    let out = holdfast(&root, &["image", "pull", &missing, "--config", cfg]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("MANIFEST_UNKNOWN") || text(&out).contains("404"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused_and_nothing_is_kept() {
    if !registry::tools_present() {
        return;
    }
    let tmp = TempDir::new("pull-corrupt");
    let pki = Pki::new(&tmp.0.join("pki"));
    let reg = Registry::start(&tmp.0.join("registry"), &pki, Auth::None);
    let image = Image {
        // Compressed already, so that skopeo pushes the layer as it is.
        layers: vec![
            Layer::new(vec![Entry::file("data", &oci::noise(300_000, 7), 0o644)]).gzipped(),
        ],
        ..Image::default()
    };
    let layout = tmp.0.join("layout");
    let (_, built) = oci::write_index_dir(&layout, &[(host_platform(), &image)]).expect("layout");
    reg.push(&layout, "app", "1", None);
    // The registry's copy of the layer is damaged on its disk: same size, other bytes.
    let blob = reg.blob_file(&built[0].layer_digests[0]);
    let len = std::fs::metadata(&blob)
        .expect("blob in the registry")
        .len() as usize;
    std::fs::write(&blob, oci::noise(len, 99)).expect("corrupt the blob");

    let root = tmp.0.join("root");
    let cfg = config(&tmp.0, &reg.ca, &[reg.host()], "");
    let reference = format!("{}/app:1", reg.host());
    let out = holdfast(
        &root,
        &[
            "image",
            "pull",
            &reference,
            "--config",
            cfg.to_str().expect("p"),
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("digest mismatch") && said.contains(&built[0].layer_digests[0]),
        "{said}"
    );
    // Nothing of it: no blob, no partial download, no image.
    let hex = built[0].layer_digests[0].trim_start_matches("sha256:");
    assert!(!root.join("content/blobs/sha256").join(hex).exists());
    let tmp_entries: Vec<_> = std::fs::read_dir(root.join("content/tmp"))
        .expect("tmp")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(tmp_entries.is_empty(), "left in tmp: {tmp_entries:?}");
    let ls = stdout(&holdfast(&root, &["image", "ls"]));
    assert_eq!(ls.lines().count(), 1, "{ls}");
}

#[test]
fn a_download_cut_midway_resumes_with_a_range_request() {
    if !registry::tools_present() {
        return;
    }
    let tmp = TempDir::new("pull-resume");
    let pki = Pki::new(&tmp.0.join("pki"));
    let reg = Registry::start(&tmp.0.join("registry"), &pki, Auth::None);
    let size = 4 * 1024 * 1024;
    let image = Image {
        layers: vec![Layer::new(vec![Entry::file("data", &oci::noise(size, 3), 0o644)]).gzipped()],
        ..Image::default()
    };
    let layout = tmp.0.join("layout");
    let (_, built) = oci::write_index_dir(&layout, &[(host_platform(), &image)]).expect("layout");
    reg.push(&layout, "big", "1", None);

    // The agent's uplink: a proxy that cuts the connection after 1.5 MiB of the layer.
    let proxy = proxy::Proxy::start(reg.addr);
    proxy.cut_after(1_500_000);
    let via = proxy.addr().to_string();
    let root = tmp.0.join("root");
    let cfg = config(&tmp.0, &reg.ca, std::slice::from_ref(&via), "");
    let out = holdfast(
        &root,
        &[
            "image",
            "pull",
            &format!("{via}/big:1"),
            "--config",
            cfg.to_str().expect("p"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(proxy.cuts(), 1, "the proxy cut one connection");
    assert!(text(&out).contains("resuming"), "{}", text(&out));
    // The registry served the rest as a partial content answer.
    let layer = &built[0].layer_digests[0];
    let ranged: Vec<String> = reg
        .requests(layer)
        .into_iter()
        .filter(|l| l.contains("\" 206 "))
        .collect();
    assert_eq!(ranged.len(), 1, "one 206 for the layer:\n{}", reg.log());
    assert_eq!(layer_file(&root, "data").map(|d| d.len()), Some(size));

    // A partial download left on disk (a restart, a power cut) is resumed too.
    let root2 = tmp.0.join("root2");
    let whole = std::fs::read(reg.blob_file(layer)).expect("blob");
    std::fs::create_dir_all(root2.join("content/tmp")).expect("tmp");
    let partial = root2
        .join("content/tmp")
        .join(format!("partial-{}", layer.trim_start_matches("sha256:")));
    std::fs::write(&partial, &whole[..whole.len() / 3]).expect("partial");
    let before = reg
        .requests(layer)
        .iter()
        .filter(|l| l.contains("\" 206 "))
        .count();
    let out = holdfast(
        &root2,
        &[
            "image",
            "pull",
            &format!("{}/big:1", reg.host()),
            "--config",
            config(&tmp.0, &reg.ca, &[reg.host()], "")
                .to_str()
                .expect("p"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let after = reg
        .requests(layer)
        .iter()
        .filter(|l| l.contains("\" 206 "))
        .count();
    assert_eq!(
        after,
        before + 1,
        "resumed with a Range request:\n{}",
        reg.log()
    );
    assert!(!partial.exists(), "the partial download became the blob");
}

/// One image pushed with `push_creds`, pulled without, with wrong and with right
/// credentials; returns the outputs.
fn auth_round(
    tmp: &TempDir,
    reg: &Registry,
    push_creds: (&str, &str),
    right: &str,
    wrong: &str,
) -> Vec<String> {
    let image = marker_image(host_platform());
    let layout = tmp.0.join("layout");
    oci::write_index_dir(&layout, &[(host_platform(), &image)]).expect("layout");
    reg.push(&layout, "private/app", "1", Some(push_creds));
    let reference = format!("{}/private/app:1", reg.host());
    let cfg = config(&tmp.0, &reg.ca, &[reg.host()], "");
    let cfg = cfg.to_str().expect("p");
    let creds = |name: &str, password: &str| {
        let auth = registry::b64(format!("{}:{password}", push_creds.0).as_bytes());
        let path = tmp.0.join(name);
        std::fs::write(
            &path,
            format!(
                "{{\"auths\":{{\"{}\":{{\"auth\":\"{auth}\"}}}}}}",
                reg.host()
            ),
        )
        .expect("creds");
        path
    };
    let mut outputs = Vec::new();
    let anonymous = holdfast(
        &tmp.0.join("root-anon"),
        &["image", "pull", &reference, "--config", cfg],
    );
    assert!(!anonymous.status.success(), "{}", text(&anonymous));
    assert!(
        text(&anonymous).contains("authentication failed"),
        "{}",
        text(&anonymous)
    );
    outputs.push(text(&anonymous));
    let bad = creds("wrong.json", wrong);
    let refused = holdfast(
        &tmp.0.join("root-wrong"),
        &[
            "image",
            "pull",
            &reference,
            "--config",
            cfg,
            "--creds",
            bad.to_str().expect("p"),
        ],
    );
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains("authentication failed") && text(&refused).contains("wrong.json"),
        "{}",
        text(&refused)
    );
    outputs.push(text(&refused));
    let good = creds("right.json", right);
    let root = tmp.0.join("root-right");
    let ok = holdfast(
        &root,
        &[
            "image",
            "pull",
            &reference,
            "--config",
            cfg,
            "--creds",
            good.to_str().expect("p"),
        ],
    );
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(layer_file(&root, "etc/platform").is_some());
    outputs.push(text(&ok));
    outputs
}

#[test]
fn basic_auth_with_right_and_wrong_credentials_and_none_in_the_output() {
    if !registry::tools_present() {
        return;
    }
    let tmp = TempDir::new("pull-basic");
    let pki = Pki::new(&tmp.0.join("pki"));
    let password = "s3cret-basic-pw";
    let reg = Registry::start(
        &tmp.0.join("registry"),
        &pki,
        Auth::Basic {
            user: "edge",
            password,
        },
    );
    let outputs = auth_round(&tmp, &reg, ("edge", password), password, "not-the-password");
    let encoded = registry::b64(format!("edge:{password}").as_bytes());
    for o in &outputs {
        assert!(
            !o.contains(password) && !o.contains(&encoded),
            "a credential in:\n{o}"
        );
        assert!(!o.contains("not-the-password"), "a credential in:\n{o}");
    }
}

#[test]
fn token_auth_with_right_and_wrong_credentials_and_no_token_in_the_output() {
    if !registry::tools_present() {
        return;
    }
    let tmp = TempDir::new("pull-token");
    let pki = Pki::new(&tmp.0.join("pki"));
    let password = "s3cret-token-pw";
    let tokens = TokenServer::start(&tmp.0.join("token"), &pki, "edge", password);
    let reg = Registry::start(&tmp.0.join("registry"), &pki, Auth::Token(&tokens));
    let before = tokens.requests.load(std::sync::atomic::Ordering::SeqCst);
    let outputs = auth_round(&tmp, &reg, ("edge", password), password, "not-the-password");
    assert!(
        tokens.requests.load(std::sync::atomic::Ordering::SeqCst) > before,
        "the token service was asked"
    );
    // One pull asks the token service once and meets one 401: the token is kept for
    // the manifest, config and layer requests that follow.
    let tokens_before = tokens.requests.load(std::sync::atomic::Ordering::SeqCst);
    let unauthorized = |r: &Registry| {
        r.requests("/v2/private/app/")
            .iter()
            .filter(|l| l.contains("\" 401 "))
            .count()
    };
    let refused_before = unauthorized(&reg);
    let out = holdfast(
        &tmp.0.join("root-again"),
        &[
            "image",
            "pull",
            &format!("{}/private/app:1", reg.host()),
            "--config",
            tmp.0.join("config.yaml").to_str().expect("p"),
            "--creds",
            tmp.0.join("right.json").to_str().expect("p"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        tokens.requests.load(std::sync::atomic::Ordering::SeqCst),
        tokens_before + 1
    );
    assert_eq!(unauthorized(&reg), refused_before + 1, "{}", reg.log());
    let issued = tokens
        .issued
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for o in &outputs {
        assert!(
            !o.contains(password) && !o.contains("not-the-password"),
            "a credential in:\n{o}"
        );
        for t in &issued {
            // The signature part is what makes a token usable.
            let sig = t.rsplit('.').next().unwrap_or(t);
            assert!(!o.contains(sig), "a token in:\n{o}");
        }
    }
}

#[test]
fn a_mirror_serves_first_and_the_upstream_when_the_mirror_fails() {
    if !registry::tools_present() {
        return;
    }
    let tmp = TempDir::new("pull-mirror");
    let pki = Pki::new(&tmp.0.join("pki"));
    let upstream = Registry::start(&tmp.0.join("upstream"), &pki, Auth::None);
    let mut mirror = Registry::start(&tmp.0.join("mirror"), &pki, Auth::None);
    for (tag, platform) in [("1", "one"), ("2", "two")] {
        let layout = tmp.0.join(format!("layout-{tag}"));
        oci::write_index_dir(&layout, &[(host_platform(), &marker_image(platform))])
            .expect("layout");
        upstream.push(&layout, "site/app", tag, None);
        mirror.push(&layout, "site/app", tag, None);
    }
    let extra = format!(
        "      mirrors:\n        - host: https://{}\n          caFile: {}\n",
        mirror.host(),
        pki.ca.display()
    );
    let cfg = config(&tmp.0, &upstream.ca, &[upstream.host()], &extra);
    let cfg = cfg.to_str().expect("p");
    let root = tmp.0.join("root");
    let out = holdfast(
        &root,
        &[
            "image",
            "pull",
            &format!("{}/site/app:1", upstream.host()),
            "--config",
            cfg,
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !mirror.requests("/v2/site/app/manifests/1").is_empty(),
        "the mirror resolved the tag"
    );
    assert!(
        !mirror.requests("/v2/site/app/blobs/").is_empty(),
        "the mirror served the blobs"
    );
    assert!(
        upstream.requests("/v2/site/app/").is_empty(),
        "the upstream was not asked:\n{}",
        upstream.log()
    );

    mirror.stop();
    let out = holdfast(
        &root,
        &[
            "image",
            "pull",
            &format!("{}/site/app:2", upstream.host()),
            "--config",
            cfg,
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("mirror https://"),
        "the mirror's failure is said:\n{}",
        text(&out)
    );
    assert!(
        !upstream.requests("/v2/site/app/manifests/2").is_empty(),
        "the upstream served the tag"
    );
    let ls = stdout(&holdfast(&root, &["image", "ls"]));
    assert_eq!(ls.lines().count(), 3, "{ls}");
}

#[test]
fn zstd_layers_are_pulled_and_unpacked() {
    if !registry::tools_present() {
        return;
    }
    let tmp = TempDir::new("pull-zstd");
    let pki = Pki::new(&tmp.0.join("pki"));
    let reg = Registry::start(&tmp.0.join("registry"), &pki, Auth::None);
    let data = oci::noise(500_000, 21);
    let image = Image {
        layers: vec![
            Layer::new(vec![Entry::file("etc/one", b"zstd layer", 0o644)]).zstd(),
            Layer::new(vec![Entry::file("data", &data, 0o644)]).zstd(),
        ],
        ..Image::default()
    };
    let layout = tmp.0.join("layout");
    let (_, built) = oci::write_index_dir(&layout, &[(host_platform(), &image)]).expect("layout");
    reg.push(&layout, "zstd/app", "1", None);
    let root = tmp.0.join("root");
    let cfg = config(&tmp.0, &reg.ca, &[reg.host()], "");
    let out = holdfast(
        &root,
        &[
            "image",
            "pull",
            &format!("{}/zstd/app:1", reg.host()),
            "--config",
            cfg.to_str().expect("p"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&built[0].manifest_digest),
        "{}",
        text(&out)
    );
    assert_eq!(
        layer_file(&root, "etc/one").as_deref(),
        Some(&b"zstd layer"[..])
    );
    assert_eq!(layer_file(&root, "data"), Some(data));
}
