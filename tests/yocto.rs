//! The Yocto layer (`yocto/meta-holdfast`) against the repository it builds: the crate
//! list matches Cargo.lock, everything the recipe fetches or installs exists, and the
//! unit and config it installs are ones this holdfast accepts. bitbake does not run in
//! CI, so these checks are what catches a recipe left behind by a change here.

use std::path::{Path, PathBuf};
use std::process::Command;

use holdfast::config::{parse_flags, read_config_file, FileConfig};

const RECIPE_DIR: &str = "yocto/meta-holdfast/recipes-containers/holdfast";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The one release recipe, `holdfast_<version>.bb`, in the recipe folder (the
/// development recipe `holdfast_git.bb` is not one): its path and version.
fn recipe() -> (PathBuf, String) {
    let dir = repo().join(RECIPE_DIR);
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("read the recipe folder") {
        let name = entry.expect("list the recipe folder").file_name();
        let name = name.to_string_lossy();
        if let Some(version) = name
            .strip_prefix("holdfast_")
            .and_then(|n| n.strip_suffix(".bb"))
            .filter(|v| *v != "git")
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

/// The recipe's text without comment lines, with the shared `holdfast.inc` it requires
/// (not the generated crates .inc) in place of its `require` line.
fn recipe_code(path: &Path) -> String {
    let dir = path.parent().expect("the recipe's folder");
    read(path)
        .lines()
        .flat_map(|l| match l.strip_prefix("require ") {
            Some(inc) if !inc.contains("crates") => read(&dir.join(inc.trim()))
                .lines()
                .map(String::from)
                .collect::<Vec<_>>(),
            _ => vec![l.to_string()],
        })
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The shipped config after the recipe's own `sed` whose expression holds `marker`, run
/// as do_install runs it, with `vars` (`${NAME}`, value) put in for the recipe's
/// variables; read by holdfast's parser, which must have no warning.
fn config_after_recipe_sed(code: &str, marker: &str, vars: &[(&str, &str)]) -> FileConfig {
    let expr = code
        .lines()
        .find_map(|l| {
            let rest = l.trim().strip_prefix("sed -i -e '")?;
            rest.contains(marker)
                .then(|| rest.split('\'').next().unwrap_or_default().to_string())
        })
        .unwrap_or_else(|| panic!("the recipe's sed that writes {marker}"));
    let expr = vars
        .iter()
        .fold(expr, |e, (name, value)| e.replace(name, value));
    let dir = std::env::temp_dir().join(format!(
        "holdfast-yocto-{}-{}",
        std::process::id(),
        marker.len()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("config.yaml");
    std::fs::copy(repo().join(RECIPE_DIR).join("files/config.yaml"), &config)
        .expect("copy the shipped config");
    let sed = Command::new("sed")
        .args(["-i", "-e", &expr])
        .arg(&config)
        .status()
        .expect("run sed");
    let read = read_config_file(&config);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(sed.success(), "sed -e {expr:?} failed");
    let (file, warnings) = read.expect("holdfast reads the config the recipe installs");
    assert!(warnings.is_empty(), "{warnings:?}");
    file
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

/// `version` in the working tree's Cargo.toml.
fn crate_version() -> String {
    let manifest = read(&repo().join("Cargo.toml"));
    let package = manifest
        .split("\n[")
        .find(|section| section.starts_with("[package]") || section.starts_with("package]"))
        .expect("Cargo.toml has a [package] table");
    assigned(package, "version")
}

/// The release recipe's PV is the version at its SRCREV, SRCREV is a commit of this
/// branch, and its crates .inc is the one generated from SRCREV's Cargo.lock.
#[test]
fn release_recipe_matches_its_srcrev() {
    let (_, version) = recipe();
    let out = Command::new("python3")
        .args(["yocto/gen-crates-inc.py", "--check-release"])
        .current_dir(repo())
        .output()
        .expect("run python3 yocto/gen-crates-inc.py --check-release");
    assert!(
        out.status.success(),
        "gen-crates-inc.py --check-release failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(repo()
        .join(RECIPE_DIR)
        .join(format!("holdfast-{version}-crates.inc"))
        .is_file());
}

/// holdfast_git.bb builds the checkout the layer lives in, with the working tree's
/// crates .inc, and is not preferred over the release.
#[test]
fn development_recipe_builds_this_checkout() {
    let path = repo().join(RECIPE_DIR).join("holdfast_git.bb");
    let code = recipe_code(&path);
    assert_eq!(
        assigned(&code, "PV"),
        format!("{}+git", crate_version()),
        "holdfast_git.bb's PV must be Cargo.toml's version with +git"
    );
    assert_eq!(assigned(&code, "DEFAULT_PREFERENCE"), "-1");
    assert!(code.contains("require holdfast-crates.inc"));
    assert!(code
        .lines()
        .any(|l| l.starts_with("inherit ") && l.contains("externalsrc")));
    // EXTERNALSRC's default: four folders up from the recipe's folder.
    let up = defaulted(&code, "EXTERNALSRC");
    assert!(up.contains("'../../../..'"), "EXTERNALSRC ?= {up}");
    let checkout = repo().join(RECIPE_DIR).join("../../../..");
    assert_eq!(
        checkout.canonicalize().expect("the checkout"),
        repo().canonicalize().expect("the repository")
    );
    // externalsrc drops do_patch, where the release applies the 32-bit crate patches.
    assert!(code.contains("do_unpack[postfuncs] += \"holdfast_patch_crates\""));
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
        } else if source_path.contains("${HOLDFAST_BOARD}") {
            defaulted(&code, "HOLDFAST_BOARD_MACHINES")
                .split_whitespace()
                .filter_map(|pair| pair.split_once(':'))
                .map(|(_, board)| source_path.replace("${HOLDFAST_BOARD}", board))
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
    let mut exec: Vec<String> = value("ExecStart")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(
        exec[..2],
        ["/usr/bin/holdfast", "run"],
        "ExecStart={exec:?}"
    );
    // A drop-in's more flags (holdfast-board's), as systemd splits an unquoted $VAR.
    assert_eq!(
        exec.pop().as_deref(),
        Some("$HOLDFAST_ARGS"),
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

/// The recipe turns Cargo's default features off and each back on through a
/// PACKAGECONFIG: `seccomp` follows the distro feature of that name, with libseccomp
/// as its only build dependency, linked from the sysroot (never fetched by build.rs).
/// What `bitbake -e` makes of it, with and without the distro feature, is checked by
/// yocto/check-bitbake.sh.
#[test]
fn seccomp_follows_the_distro_feature() {
    let manifest = read(&repo().join("Cargo.toml"));
    let default_features: Vec<&str> = manifest
        .lines()
        .find_map(|l| l.strip_prefix("default = "))
        .unwrap_or("[]")
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|f| f.trim().trim_matches('"'))
        .filter(|f| !f.is_empty())
        .collect();
    let (path, _) = recipe();
    let code = recipe_code(&path);
    assert!(
        assigned(&code, "CARGO_BUILD_FLAGS:append").contains("--no-default-features"),
        "the recipe keeps Cargo's default features"
    );
    for feature in &default_features {
        let flags = assigned(&code, &format!("PACKAGECONFIG[{feature}]"));
        let fields: Vec<&str> = flags.split(',').collect();
        assert_eq!(
            fields.first().copied(),
            Some(format!("--features {feature}").as_str()),
            "PACKAGECONFIG[{feature}] = {flags:?} does not turn the feature on"
        );
    }
    assert!(
        default_features.contains(&"seccomp"),
        "seccomp is no longer a default feature ({default_features:?}): update the recipe"
    );
    let seccomp = assigned(&code, "PACKAGECONFIG[seccomp]");
    assert_eq!(seccomp.split(',').nth(2), Some("libseccomp"), "{seccomp}");
    assert!(
        !code
            .lines()
            .any(|l| l.starts_with("DEPENDS") && l.contains("libseccomp")),
        "libseccomp is a dependency whatever the distro has"
    );
    assert!(
        assigned(&code, "PACKAGECONFIG ??")
            .contains("bb.utils.filter('DISTRO_FEATURES', 'seccomp', d)"),
        "PACKAGECONFIG does not follow DISTRO_FEATURES"
    );
    // The sysroot has the shared library only (Yocto builds no static ones by default),
    // and build.rs looks nowhere else.
    assert_eq!(assigned(&code, "export LIBSECCOMP_LINK_TYPE"), "dylib");
    assert_eq!(
        assigned(&code, "export LIBSECCOMP_LIB_PATH"),
        "${STAGING_LIBDIR}"
    );
}

/// The executable is PIE as the distro builds them, non-PIE only when a product asks
/// for it with HOLDFAST_PIE = "0".
#[test]
fn pie_unless_a_product_asks_for_non_pie() {
    let (path, _) = recipe();
    let code = recipe_code(&path);
    assert_eq!(assigned(&code, "HOLDFAST_PIE ?"), "1");
    let rustflags = assigned(&code, "RUSTFLAGS:append");
    let (always, rest) = rustflags
        .split_once("${@")
        .unwrap_or_else(|| panic!("RUSTFLAGS = {rustflags:?} has no HOLDFAST_PIE choice"));
    assert!(!always.contains("relocation-model"), "{rustflags}");
    assert!(
        rest.contains("relocation-model=static") && rest.contains("${HOLDFAST_PIE}"),
        "{rustflags}"
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
    let file = config_after_recipe_sed(&code, "bootstrapKubeconfig", &[("${sysconfdir}", "/etc")]);
    assert_eq!(
        file.bootstrap_kubeconfig.as_deref(),
        Some(Path::new("/etc/holdfast/bootstrap-kubeconfig"))
    );
    // Without one, the shipped config names none.
    let (shipped, _) = read_config_file(&repo().join(RECIPE_DIR).join("files/config.yaml"))
        .expect("the shipped config");
    assert_eq!(shipped.bootstrap_kubeconfig, None);
}

const LAYER_DIR: &str = "yocto/meta-holdfast";

/// The value of `NAME ?= "value"` (or `=`) on one line of `text`.
fn defaulted(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(name)?.trim_start();
            let rest = rest.strip_prefix("?=").or_else(|| rest.strip_prefix('='))?;
            Some(rest.trim().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| panic!("no {name} = or ?= assignment"))
}

/// Every `MACHINE:profile` pair of the recipe's default mapping names a profile in
/// board/ whose `yoctoMachine` is that MACHINE, and every profile in board/ is mapped
/// from its `yoctoMachine`.
#[test]
fn board_mapping_names_the_profiles_in_board() {
    let code = read(&repo().join(RECIPE_DIR).join(BOARD_RECIPE));
    let mapping = defaulted(&code, "HOLDFAST_BOARD_MACHINES");
    let pairs: Vec<(&str, &str)> = mapping
        .split_whitespace()
        .map(|p| {
            p.split_once(':')
                .unwrap_or_else(|| panic!("{p:?} is not MACHINE:board"))
        })
        .collect();
    assert!(!pairs.is_empty(), "HOLDFAST_BOARD_MACHINES maps no MACHINE");
    let board_dir = repo().join("board");
    for (machine, board) in &pairs {
        let file = board_dir.join(format!("{board}.yaml"));
        assert!(
            file.is_file(),
            "HOLDFAST_BOARD_MACHINES maps {machine} to {board}, but board/{board}.yaml is missing"
        );
        let profile = holdfast::config::parse_board(board, &file, &read(&file))
            .unwrap_or_else(|e| panic!("board/{board}.yaml: {e}"))
            .0;
        assert_eq!(
            profile.yocto_machine, *machine,
            "board/{board}.yaml is for MACHINE {}, the recipe maps {machine} to it",
            profile.yocto_machine
        );
    }
    for entry in std::fs::read_dir(&board_dir).expect("read board/") {
        let file = entry.expect("list board/").path();
        let Some(name) = file
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".yaml"))
        else {
            continue;
        };
        let profile = holdfast::config::parse_board(name, &file, &read(&file))
            .unwrap_or_else(|e| panic!("board/{name}.yaml: {e}"))
            .0;
        assert!(
            pairs.contains(&(profile.yocto_machine.as_str(), name)),
            "board/{name}.yaml is for MACHINE {}: add {}:{name} to HOLDFAST_BOARD_MACHINES",
            profile.yocto_machine,
            profile.yocto_machine
        );
    }
    assert_eq!(
        defaulted(&code, "HOLDFAST_BOARD"),
        "${@holdfast_board_for_machine(d)}"
    );
}

const BOARD_RECIPE: &str = "holdfast-board_1.0.bb";

/// The board profile is holdfast-board's choice, per MACHINE, in a drop-in of the unit
/// (`--board NAME` through HOLDFAST_ARGS), which `holdfast run` accepts; holdfast itself
/// names no profile and is built per architecture.
#[test]
fn the_board_package_names_the_profile_to_the_agent() {
    let board = read(&repo().join(RECIPE_DIR).join(BOARD_RECIPE));
    assert_eq!(assigned(&board, "PACKAGE_ARCH"), "${MACHINE_ARCH}");
    assert!(
        board.contains("'Environment=HOLDFAST_ARGS=--board ${HOLDFAST_BOARD}'")
            && board.contains("${D}${systemd_system_unitdir}/holdfast.service.d/board.conf"),
        "holdfast-board no longer writes the drop-in"
    );
    let unit = read(&repo().join(RECIPE_DIR).join("files/holdfast.service"));
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let args: Vec<String> = exec
        .replace("$HOLDFAST_ARGS", "--board rpi4")
        .split_whitespace()
        .skip(2)
        .map(String::from)
        .collect();
    let flags = parse_flags(&args).expect("holdfast run accepts --board");
    assert_eq!(flags.board.as_deref(), Some("rpi4"));
    let (path, _) = recipe();
    let code = recipe_code(&path);
    assert!(
        !code.contains("PACKAGE_ARCH") && !code.contains("HOLDFAST_BOARD"),
        "holdfast itself is machine-specific again"
    );
    let (shipped, _) = read_config_file(&repo().join(RECIPE_DIR).join("files/config.yaml"))
        .expect("the shipped config");
    assert_eq!(shipped.board, None, "the shipped config names no profile");
}

/// The recipe's LICENSE is the generated one, and that is what gen-crates-inc.py
/// computes from the crates linked in: holdfast's own licence first, in Yocto's
/// spelling (no SPDX operators).
#[test]
fn recipe_license_is_what_the_generator_computes() {
    let (path, _) = recipe();
    let code = recipe_code(&path);
    assert_eq!(assigned(&code, "LICENSE"), "${HOLDFAST_LICENSE}");
    let inc = read(&repo().join(RECIPE_DIR).join("holdfast-crates.inc"));
    let generated = assigned(&inc, "HOLDFAST_LICENSE");
    let out = Command::new("python3")
        .args(["yocto/gen-crates-inc.py", "--license"])
        .current_dir(repo())
        .output()
        .expect("run python3 yocto/gen-crates-inc.py --license");
    assert!(
        out.status.success(),
        "gen-crates-inc.py --license failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let computed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(generated, computed, "run python3 yocto/gen-crates-inc.py");
    let manifest = read(&repo().join("Cargo.toml"));
    let own = assigned(&manifest, "license");
    assert!(
        generated.starts_with(&format!("{own} & ")),
        "LICENSE {generated:?} does not start with holdfast's own {own}"
    );
    for word in generated.split(|c: char| c.is_whitespace() || "()&|".contains(c)) {
        assert!(
            !matches!(word, "AND" | "OR" | "WITH") && !word.contains('/'),
            "LICENSE {generated:?} has SPDX syntax {word:?}, not Yocto's"
        );
    }
    assert!(
        assigned(&code, "LIC_FILES_CHKSUM").contains("${HOLDFAST_CRATES_LIC_FILES}"),
        "LIC_FILES_CHKSUM leaves out the crates' license files"
    );
}

/// Each layer LAYERRECOMMENDS names has a dynamic-layers/ folder that BBFILES_DYNAMIC
/// reads, holding bbappends of this layer's recipes with the files they fetch; and what
/// those layers provide is recommended only there.
#[test]
fn recommended_layers_have_their_dynamic_layer_bbappends() {
    let layer = repo().join(LAYER_DIR);
    let conf = read(&layer.join("conf/layer.conf"));
    let recommends = assigned(&conf, "LAYERRECOMMENDS_holdfast");
    assert!(!recommends.is_empty(), "LAYERRECOMMENDS_holdfast is empty");
    for collection in recommends.split_whitespace() {
        // `collection (>= version)` may follow; only the name names the folder.
        if collection.starts_with('(') || collection.ends_with(')') {
            continue;
        }
        assert!(
            conf.contains(&format!(
                "{collection}:${{LAYERDIR}}/dynamic-layers/{collection}/"
            )),
            "BBFILES_DYNAMIC does not read dynamic-layers/{collection}/"
        );
        let dir = layer.join("dynamic-layers").join(collection);
        let mut appends = Vec::new();
        let mut todo = vec![dir.clone()];
        while let Some(d) = todo.pop() {
            for entry in
                std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display()))
            {
                let p = entry.expect("list dynamic-layers").path();
                if p.is_dir() {
                    todo.push(p);
                } else if p.extension().is_some_and(|e| e == "bbappend") {
                    appends.push(p);
                }
            }
        }
        assert!(!appends.is_empty(), "{} has no bbappend", dir.display());
        for append in appends {
            let name = append
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let pn = name.split('_').next().unwrap_or_default();
            assert!(
                layer.join("recipes-containers").join(pn).is_dir(),
                "{name} appends to {pn}, which is not a recipe of this layer"
            );
            let code = recipe_code(&append);
            for file in paths_after(&code, "file://") {
                let local = append.parent().expect("folder").join("files").join(file);
                assert!(
                    local.is_file(),
                    "{name} fetches file://{file}, {} is missing",
                    local.display()
                );
            }
        }
    }
    let (path, _) = recipe();
    let code = recipe_code(&path);
    for line in code.lines().filter(|l| l.starts_with("RRECOMMENDS")) {
        assert!(
            !line
                .split_whitespace()
                .any(|w| w.trim_matches('"') == "cni"),
            "the recipe recommends cni, which oe-core alone does not provide: {line}"
        );
    }
}

/// The CNI network the meta-virtualization bbappend installs is holdfast's own default.
#[test]
fn installed_cni_network_is_holdfasts_default() {
    let path = repo().join(LAYER_DIR).join(
        "dynamic-layers/virtualization-layer/recipes-containers/holdfast/files/10-holdfast.conflist",
    );
    let text = read(&path);
    let list: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let want = holdfast::network::conf::default_list(
        holdfast::network::conf::DEFAULT_POD_CIDR,
        Path::new("/var/lib/holdfast/cni/networks"),
    );
    assert_eq!(list, want);
}

/// The packagegroup a user adds to an image pulls in holdfast.
#[test]
fn packagegroup_installs_holdfast() {
    let path = repo()
        .join(LAYER_DIR)
        .join("recipes-core/packagegroups/packagegroup-holdfast.bb");
    let code = recipe_code(&path);
    let rdepends = assigned_block(&code, "RDEPENDS:${PN}");
    let packages: Vec<&str> = rdepends.split_whitespace().filter(|w| *w != "\\").collect();
    assert!(packages.contains(&"holdfast"), "{packages:?}");
    assert!(code.contains("inherit packagegroup"));
}

/// `holdfast check` on a kernel config as linux-yocto makes it from a 6.18 defconfig
/// (the legacy iptables switches off, as they default) with the layer's fragment on
/// top: pod NAT and hostPort have their iptables tables, and br_netfilter is there.
#[test]
fn the_kernel_fragment_gives_what_holdfast_check_asks_on_6_18() {
    let base = read(&repo().join("tests/fixtures/kernel/complete.config"));
    let fragment =
        read(&repo().join("yocto/meta-holdfast/recipes-kernel/linux/linux-yocto/holdfast.cfg"));
    let dir = support::tempdir::TempDir::new("yocto-kconfig");
    let config = dir.0.join("config");
    // The last setting of an option wins, as in a merged config.
    std::fs::write(
        &config,
        format!(
            "{base}# CONFIG_NETFILTER_XTABLES_LEGACY is not set\n\
             # CONFIG_IP_NF_IPTABLES_LEGACY is not set\n{fragment}"
        ),
    )
    .expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["check", "--kernel-config"])
        .arg(&config)
        .output()
        .expect("holdfast check");
    let report = String::from_utf8_lossy(&out.stdout);
    for item in ["iptables (legacy or nf_tables): ", "br_netfilter: "] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with("  [ok]") && l.contains(item)),
            "{item} not ok:\n{report}"
        );
    }
}

/// The modules loaded at boot: br_netfilter (never loaded on demand) among them, each
/// also recommended as its kernel-module package, and the file installed where
/// systemd-modules-load reads it.
#[test]
fn br_netfilter_is_loaded_at_boot() {
    let listed: Vec<String> = read(&repo().join(RECIPE_DIR).join("files/holdfast-modules.conf"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    for m in ["br_netfilter", "overlay", "veth", "bridge"] {
        assert!(
            listed.iter().any(|l| l == m),
            "{m} not loaded at boot: {listed:?}"
        );
    }
    let (path, _) = recipe();
    let code = recipe_code(&path);
    let recommended = assigned_block(&code, "RRECOMMENDS:${PN} +");
    for m in &listed {
        let package = format!("kernel-module-{}", m.replace('_', "-"));
        assert!(
            recommended.split_whitespace().any(|p| p == package),
            "{package} is not recommended: {recommended}"
        );
    }
    assert!(
        code.contains(
            "${UNPACKDIR}/holdfast-modules.conf ${D}${nonarch_libdir}/modules-load.d/holdfast.conf"
        ),
        "holdfast-modules.conf is not installed into modules-load.d"
    );
}

/// The development recipe's package version carries the checkout's commit, so no two
/// snapshots share one: its `holdfast_checkout_rev` run on this checkout, as bitbake
/// runs it.
#[test]
fn each_snapshot_has_a_package_version_of_its_own() {
    let path = repo().join(RECIPE_DIR).join("holdfast_git.bb");
    let code = read(&path);
    assert_eq!(assigned(&code, "PKGV"), "${PV}${@holdfast_checkout_rev(d)}");
    let start = code
        .find("def holdfast_checkout_rev(d):")
        .expect("holdfast_checkout_rev");
    let body: String = code[start..]
        .lines()
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let script = format!(
        "{body}\nclass D:\n    def getVar(self, name):\n        return {:?} if name == 'EXTERNALSRC' else None\nprint(holdfast_checkout_rev(D()))\n",
        repo().display().to_string()
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .arg("-C")
            .arg(repo())
            .args(args)
            .output()
            .expect("git");
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let want = format!(
        "{}+{}",
        git(&["rev-list", "--count", "HEAD"]),
        git(&["rev-parse", "--short=10", "HEAD"])
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want);
}

/// With HOLDFAST_DATA_DEVICE, the recipe writes a mount unit for the state dir: named
/// as systemd names the unit of that path, mounting it nosuid,nodev (not noexec), and
/// enabled with the agent, whose unit waits for it.
#[test]
fn a_data_partition_is_mounted_where_the_agent_keeps_its_state() {
    let (path, _) = recipe();
    let code = recipe_code(&path);
    let unit_name = Command::new("systemd-escape")
        .args(["--path", "--suffix=mount", "/var/lib/holdfast"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "var-lib-holdfast.mount".to_owned());
    assert_eq!(
        assigned(&code, "HOLDFAST_DATA_MOUNT"),
        format!("${{@'{unit_name}' if d.getVar('HOLDFAST_DATA_DEVICE') else ''}}")
    );
    for line in [
        "'What=${HOLDFAST_DATA_DEVICE}'",
        "'Where=${localstatedir}/lib/holdfast'",
        "'Options=nosuid,nodev'",
        "'WantedBy=local-fs.target'",
    ] {
        assert!(code.contains(line), "the mount unit has no {line}");
    }
    assert_eq!(
        assigned(&code, "SYSTEMD_SERVICE:${PN}"),
        "holdfast.service ${HOLDFAST_DATA_MOUNT}"
    );
    let service = read(&repo().join(RECIPE_DIR).join("files/holdfast.service"));
    assert!(
        service.contains("RequiresMountsFor=/var/lib/holdfast"),
        "{service}"
    );
}
