//! The Debian package for gateways without Yocto: `cross/package.sh` builds it (here
//! around this build's binary; `.ci/cross` around the release binaries), dpkg installs
//! it into a throwaway root, and what an operator relies on is there: the binary, the
//! unit (which `systemd-analyze verify` accepts), the default config (a conffile that
//! holdfast reads without a warning), the board profiles, the manifest folder and a
//! state dir only root can enter. The tarball holds the same files. As root (dpkg).

use support::systemd;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use support::agent::{bin, need_root};
use support::tempdir::TempDir;

const TRIPLE: &str = "x86_64-unknown-linux-gnu";

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// Builds the amd64 package and tarball around this build's binary into `dir/deb`.
fn build(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let target = dir.join("target");
    let release = target.join(TRIPLE).join("release");
    std::fs::create_dir_all(&release).expect("release dir");
    // Stripped, as the release binary is: the package takes seconds, not minutes.
    run(Command::new("strip")
        .arg("-o")
        .arg(release.join("holdfast"))
        .arg(bin()));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join("deb");
    run(Command::new("bash")
        .arg(repo.join("cross/package.sh"))
        .arg(TRIPLE)
        .env("CARGO_TARGET_DIR", &target)
        .env("HOLDFAST_PACKAGE_DIR", &out)
        .env("HOLDFAST_PACKAGE_FAST", "1"));
    (
        out.join(format!("holdfast_{}_amd64.deb", version())),
        out.join(format!("holdfast-{}-{TRIPLE}.tar.gz", version())),
    )
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// What an operator relies on after installing, under `root`.
fn check_installed_tree(root: &Path) {
    let bin = root.join("usr/bin/holdfast");
    assert_eq!(mode(&bin), 0o755, "{}", bin.display());
    let said = run(Command::new(&bin).arg("version"));
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(
        said.contains(&version()),
        "`holdfast version` says {said:?}"
    );

    let state = root.join("var/lib/holdfast");
    assert_eq!(
        mode(&state),
        0o700,
        "the state dir caches Secrets: root only"
    );
    assert_eq!(std::fs::metadata(&state).expect("state dir").uid(), 0);
    assert!(root.join("etc/kubernetes/manifests").is_dir());

    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for board in std::fs::read_dir(repo.join("board")).expect("board dir") {
        let name = board.expect("board entry").file_name();
        assert!(
            root.join("usr/share/holdfast/boards").join(&name).is_file(),
            "board profile {name:?} missing"
        );
    }

    // The default config is read without a warning, and its static pod folder is the
    // one the package made.
    let config = root.join("etc/holdfast/config.yaml");
    let (_, warnings) =
        holdfast::config::read_config_file(&config).expect("holdfast reads the packaged config");
    assert!(warnings.is_empty(), "packaged config: {warnings:?}");
    let text = std::fs::read_to_string(&config).expect("config");
    assert!(
        text.contains("staticPodPath: /etc/kubernetes/manifests"),
        "{text}"
    );

    // The installed unit, pointed at the installed binary and config.
    let unit_text =
        std::fs::read_to_string(root.join("lib/systemd/system/holdfast.service")).expect("unit");
    assert!(
        unit_text.contains("ExecStart=/usr/bin/holdfast run --config /etc/holdfast/config.yaml")
    );
    let scratch = TempDir::new("package-unit");
    systemd::assert_verifies(&systemd::unit_at(&scratch.0, &unit_text, &bin, &config));
}

#[test]
fn the_deb_installs_what_an_operator_needs() {
    if !need_root() {
        return;
    }
    let dir = TempDir::new("package");
    let (deb, _) = build(&dir.0);

    let info = run(Command::new("dpkg-deb").arg("--field").arg(&deb));
    let info = String::from_utf8_lossy(&info.stdout).to_string();
    for field in [
        "Package: holdfast",
        "Architecture: amd64",
        &format!("Version: {}", version()),
        "Depends: libc6 (>= 2.",
        "libseccomp2",
    ] {
        assert!(info.contains(field), "control lacks {field:?}:\n{info}");
    }

    // dpkg's own install into a throwaway root; the maintainer scripts run outside it
    // with DPKG_ROOT set, and leave systemd alone there.
    let root = dir.0.join("root");
    let db = root.join("var/lib/dpkg");
    for d in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(db.join(d)).expect("dpkg db");
    }
    std::fs::write(db.join("status"), "").expect("status");
    std::fs::write(db.join("available"), "").expect("available");
    let dpkg = |args: &[&str]| {
        let mut cmd = Command::new("dpkg");
        cmd.arg(format!("--root={}", root.display()))
            .args([
                "--force-depends",
                "--force-script-chrootless",
                "--log=/dev/null",
            ])
            .args(args);
        cmd
    };
    run(dpkg(&["-i"]).arg(&deb));
    let status = run(&mut dpkg(&["-s", "holdfast"]));
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(status.contains("Status: install ok installed"), "{status}");
    assert!(
        status.contains("Conffiles:\n /etc/holdfast/config.yaml "),
        "{status}"
    );
    check_installed_tree(&root);

    // An edited config survives a reinstall (it is a conffile), and removal takes the
    // binary but keeps the config until a purge.
    let config = root.join("etc/holdfast/config.yaml");
    let edited = format!(
        "{}# edited on the gateway\n",
        std::fs::read_to_string(&config).expect("config")
    );
    std::fs::write(&config, &edited).expect("edit the config");
    run(dpkg(&["--force-confold", "-i"]).arg(&deb));
    assert_eq!(std::fs::read_to_string(&config).expect("config"), edited);
    run(&mut dpkg(&["-r", "holdfast"]));
    assert!(
        !root.join("usr/bin/holdfast").exists(),
        "removal left the binary"
    );
    assert!(config.exists(), "removal took the edited config");
    run(&mut dpkg(&["-P", "holdfast"]));
    assert!(!config.exists(), "purge left the config");
}

#[test]
fn the_tarball_holds_the_same_tree() {
    if !need_root() {
        return;
    }
    let dir = TempDir::new("package-tar");
    let (_, tarball) = build(&dir.0);
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).expect("root");
    run(Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-xzf")
        .arg(&tarball));
    check_installed_tree(&root);
}
