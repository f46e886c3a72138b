//! The Yocto layer (`yocto/meta-holdfast`) against the repository it builds: the crate
//! list matches Cargo.lock, everything the recipe fetches or installs exists, and the
//! unit and config it installs are ones this holdfast accepts. bitbake does not run in
//! CI, so these checks are what catches a recipe left behind by a change here.

use std::path::{Path, PathBuf};
use std::process::Command;

use holdfast::config::{parse_flags, read_config_file};

const RECIPE_DIR: &str = "yocto/meta-holdfast/recipes-containers/holdfast";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The one `holdfast_<version>.bb` in the recipe folder: its path and version.
fn recipe() -> (PathBuf, String) {
    let dir = repo().join(RECIPE_DIR);
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("read the recipe folder") {
        let name = entry.expect("list the recipe folder").file_name();
        let name = name.to_string_lossy();
        if let Some(version) = name
            .strip_prefix("holdfast_")
            .and_then(|n| n.strip_suffix(".bb"))
        {
            found.push((dir.join(&*name), version.to_string()));
        }
    }
    assert_eq!(
        found.len(),
        1,
        "expected one holdfast_<version>.bb in {RECIPE_DIR}, found {found:?}"
    );
    found.remove(0)
}

/// The recipe's text without comment lines.
fn recipe_code(path: &Path) -> String {
    read(path)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a plain `NAME = "value"` assignment in `text`.
fn assigned(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| {
            let (lhs, rhs) = l.split_once('=')?;
            (lhs.trim() == name).then(|| rhs.trim().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| panic!("the recipe sets no {name}"))
}

/// The value of `NAME = "..."` in `text`, continued lines and all.
fn assigned_block<'a>(text: &'a str, name: &str) -> &'a str {
    let start = text
        .match_indices(name)
        .find_map(|(at, _)| {
            let rest = text[at + name.len()..].trim_start().strip_prefix('=')?;
            let at_line_start = at == 0 || text[..at].ends_with('\n');
            at_line_start
                .then(|| rest.trim_start().strip_prefix('"'))
                .flatten()
        })
        .unwrap_or_else(|| panic!("the recipe sets no {name}"));
    &start[..start.find('"').unwrap_or(start.len())]
}

/// Every `<prefix>path` token in `text`, the path ending at whitespace, a quote, `;`
/// or a line continuation.
fn paths_after<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.match_indices(prefix)
        .map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let end = rest
                .find(|c: char| c.is_whitespace() || matches!(c, '"' | ';' | '\\'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// `name = "x"` and `version = "y"` of each `[[package]]` in Cargo.lock.
fn locked_packages() -> Vec<String> {
    let lock = read(&repo().join("Cargo.lock"));
    let mut out = Vec::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                let v = l.strip_prefix(key)?.trim_start().strip_prefix('=')?;
                Some(v.trim().trim_matches('"').to_string())
            })
        };
        if let (Some(name), Some(version)) = (field("name"), field("version")) {
            out.push(format!("{name}-{version}"));
        }
    }
    out
}

#[test]
fn crates_inc_matches_cargo_lock() {
    let out = Command::new("python3")
        .arg("yocto/gen-crates-inc.py")
        .arg("--check")
        .current_dir(repo())
        .output()
        .expect("run python3 yocto/gen-crates-inc.py --check");
    assert!(
        out.status.success(),
        "gen-crates-inc.py --check failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn recipe_version_is_the_crate_version() {
    let (_, version) = recipe();
    let manifest = read(&repo().join("Cargo.toml"));
    let package = manifest
        .split("\n[")
        .find(|section| section.starts_with("[package]") || section.starts_with("package]"))
        .expect("Cargo.toml has a [package] table");
    let crate_version = assigned(package, "version");
    assert_eq!(
        version, crate_version,
        "rename the recipe to holdfast_{crate_version}.bb"
    );
}

#[test]
fn recipe_fetches_only_files_that_exist() {
    let (path, _) = recipe();
    let code = recipe_code(&path);
    let files = paths_after(assigned_block(&code, "SRC_URI"), "file://");
    assert!(!files.is_empty(), "the recipe fetches no file:// entries");
    for file in files {
        let local = repo().join(RECIPE_DIR).join("files").join(file);
        assert!(
            local.is_file(),
            "SRC_URI names file://{file}, but {} is missing",
            local.display()
        );
    }
    // What do_install takes from the unpack folder must be something SRC_URI fetched.
    for file in paths_after(&code, "${UNPACKDIR}/") {
        // A file named by a variable is fetched by the user's own bbappend.
        if file.starts_with("${") {
            continue;
        }
        assert!(
            code.contains(&format!("file://{file}")),
            "do_install uses ${{UNPACKDIR}}/{file}, which SRC_URI does not fetch"
        );
    }
    let lic = assigned(&code, "LIC_FILES_CHKSUM");
    let lic_file = lic
        .trim_start_matches("file://")
        .split(';')
        .next()
        .unwrap_or_default();
    assert!(
        repo().join(lic_file).is_file(),
        "LIC_FILES_CHKSUM names {lic_file}, missing here"
    );
}

#[test]
fn recipe_uses_only_source_paths_that_exist() {
    let (path, _) = recipe();
    let code = recipe_code(&path);
    let crates_32bit = assigned(&code, "HOLDFAST_CRATES_32BIT");
    let locked = locked_packages();
    for krate in crates_32bit.split_whitespace() {
        assert!(
            locked.iter().any(|p| p == krate),
            "HOLDFAST_CRATES_32BIT names {krate}, which Cargo.lock does not lock: \
             rebase its patch and rename it"
        );
    }
    for source_path in paths_after(&code, "${S}/") {
        let expanded: Vec<String> = if source_path.contains("${crate}") {
            crates_32bit
                .split_whitespace()
                .map(|c| source_path.replace("${crate}", c))
                .collect()
        } else {
            vec![source_path.to_string()]
        };
        for p in expanded {
            assert!(
                !p.contains("${"),
                "cannot check ${{S}}/{p}: expand it in this test"
            );
            let local = repo().join(&p);
            if p.starts_with("cross/") && !repo().join("cross").exists() {
                // The cross-build folder, with these patches, comes with the cross-build
                // support; until then the recipe fails only for 32-bit ARM targets.
                eprintln!("note: {p} is not in this tree yet (no cross/ folder)");
                continue;
            }
            assert!(
                local.is_file(),
                "the recipe uses ${{S}}/{p}, which is missing"
            );
        }
    }
}

#[test]
fn unit_starts_the_agent_with_the_installed_config() {
    let unit = read(&repo().join(RECIPE_DIR).join("files/holdfast.service"));
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("holdfast.service has no {key}="))
            .trim()
            .to_string()
    };
    let exec: Vec<String> = value("ExecStart")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(
        exec[..2],
        ["/usr/bin/holdfast", "run"],
        "ExecStart={exec:?}"
    );
    let flags = parse_flags(&exec[2..]).expect("holdfast run accepts the unit's flags");
    let config = flags.config.expect("the unit passes --config");
    assert_eq!(config, Path::new("/etc/holdfast/config.yaml"));
    // Containers outlive the agent only if systemd signals the agent alone.
    assert_eq!(value("KillMode"), "process");
    assert_eq!(value("Delegate"), "yes");
    assert_eq!(value("Restart"), "always");

    let (path, _) = recipe();
    let code = recipe_code(&path);
    assert!(
        code.contains("${D}${sysconfdir}/holdfast/config.yaml"),
        "the recipe must install the config where the unit reads it"
    );
}

#[test]
fn shipped_config_is_accepted_and_matches_the_installed_dirs() {
    let path = repo().join(RECIPE_DIR).join("files/config.yaml");
    let (file, warnings) = read_config_file(&path).expect("holdfast reads the shipped config");
    assert!(
        warnings.is_empty(),
        "the shipped config has ignored keys: {warnings:?}"
    );
    let (recipe_path, _) = recipe();
    let code = recipe_code(&recipe_path);
    let static_pods = file.static_pod_path.expect("the config sets staticPodPath");
    assert_eq!(static_pods, Path::new("/etc/kubernetes/manifests"));
    assert!(code.contains("install -d ${D}${sysconfdir}/kubernetes/manifests"));
    let root = file.root_dir.expect("the config sets holdfast.rootDir");
    assert_eq!(root, Path::new("/var/lib/holdfast"));
    assert!(code.contains("${D}${localstatedir}/lib/holdfast"));
}

#[test]
fn recipe_builds_the_default_seccomp_feature_against_libseccomp() {
    let manifest = read(&repo().join("Cargo.toml"));
    let default_features = manifest
        .lines()
        .find_map(|l| l.strip_prefix("default = "))
        .unwrap_or("[]");
    assert!(
        default_features.contains("\"seccomp\""),
        "seccomp is no longer a default feature ({default_features}): update the recipe"
    );
    let (path, _) = recipe();
    let code = recipe_code(&path);
    let depends: Vec<&str> = code
        .lines()
        .filter_map(|l| l.strip_prefix("DEPENDS += "))
        .flat_map(|v| v.trim_matches('"').split_whitespace())
        .collect();
    assert!(
        depends.contains(&"libseccomp"),
        "the recipe does not DEPEND on libseccomp: {depends:?}"
    );
    // The sysroot has the shared library only (Yocto builds no static ones by default).
    assert_eq!(assigned(&code, "export LIBSECCOMP_LINK_TYPE"), "dylib");
    assert!(
        !code.contains("--features seccomp"),
        "the feature is on by default: no PACKAGECONFIG turns it on"
    );
}

/// The recipe's own `sed` that names an installed bootstrap kubeconfig in the config,
/// run as do_install runs it on the shipped config: the result is one this holdfast
/// reads, with `holdfast.bootstrapKubeconfig` where the recipe installs the file.
#[test]
fn an_installed_bootstrap_kubeconfig_is_named_in_the_config() {
    let (path, _) = recipe();
    let code = recipe_code(&path);
    assert!(
        code.contains("install -m 0600 ${UNPACKDIR}/${HOLDFAST_BOOTSTRAP_KUBECONFIG}")
            && code.contains("${D}${sysconfdir}/holdfast/bootstrap-kubeconfig"),
        "the recipe no longer installs the bootstrap kubeconfig 0600 in /etc/holdfast"
    );
    let expr = code
        .lines()
        .find_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("sed -i -e '")?;
            rest.contains("bootstrapKubeconfig")
                .then(|| rest.split('\'').next().unwrap_or_default().to_string())
        })
        .expect("the recipe's sed that names the bootstrap kubeconfig");
    let expr = expr.replace("${sysconfdir}", "/etc");
    let dir = std::env::temp_dir().join(format!("holdfast-yocto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("config.yaml");
    std::fs::copy(repo().join(RECIPE_DIR).join("files/config.yaml"), &config)
        .expect("copy the shipped config");
    let sed = Command::new("sed")
        .args(["-i", "-e", &expr])
        .arg(&config)
        .status()
        .expect("run sed");
    assert!(sed.success(), "sed -e {expr:?} failed");
    let read = read_config_file(&config);
    let _ = std::fs::remove_dir_all(&dir);
    let (file, warnings) = read.expect("holdfast reads the config the recipe installs");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        file.bootstrap_kubeconfig.as_deref(),
        Some(Path::new("/etc/holdfast/bootstrap-kubeconfig"))
    );
    // Without one, the shipped config names none.
    let (shipped, _) = read_config_file(&repo().join(RECIPE_DIR).join("files/config.yaml"))
        .expect("the shipped config");
    assert_eq!(shipped.bootstrap_kubeconfig, None);
}
