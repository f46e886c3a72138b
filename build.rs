//! Build script: where the linker finds libseccomp for the `seccomp` feature (on by
//! default). Touches nothing else.
//!
//! libseccomp-sys asks for `-lseccomp` (libseccomp-dev's folder, or
//! `LIBSECCOMP_LIB_PATH`), one setting for every target of a cargo run. This script
//! adds, per target, a folder the linker searches:
//!
//! - x86_64: none; Debian's libseccomp-dev on the host, linked dynamically (libseccomp2
//!   is on every Debian, as libseccomp is in every Yocto image with the recipe).
//! - aarch64, armv7: a folder holding only `libseccomp.a`, from Debian's
//!   `libseccomp-dev:arm64` / `:armhf`, so the device binary carries libseccomp
//!   itself. The .deb is fetched by `cross/apt-foreign.sh` (no foreign architecture is
//!   added to the host's dpkg; it is cached under `target/apt-foreign/`) and unpacked
//!   in OUT_DIR. With no shared library beside it, `-lseccomp` takes the archive.
//!
//! When the environment names its own libseccomp (`LIBSECCOMP_LIB_PATH`, as cross's
//! images do) it is left to it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cross/apt-foreign.sh");
    println!("cargo:rerun-if-env-changed=LIBSECCOMP_LIB_PATH");
    if env::var_os("CARGO_FEATURE_SECCOMP").is_none()
        || env::var_os("LIBSECCOMP_LIB_PATH").is_some()
    {
        return;
    }
    let target = env::var("TARGET").unwrap_or_default();
    let (deb_arch, triplet) = match target.as_str() {
        "aarch64-unknown-linux-gnu" => ("arm64", "aarch64-linux-gnu"),
        "armv7-unknown-linux-gnueabihf" => ("armhf", "arm-linux-gnueabihf"),
        _ => return,
    };
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let unpacked = out.join("libseccomp-dev");
    let archive = unpacked.join("usr/lib").join(triplet).join("libseccomp.a");
    let lib_dir = out.join("lib");
    let lib = lib_dir.join("libseccomp.a");
    if !lib.exists() {
        if !archive.exists() {
            fetch(deb_arch, &unpacked);
        }
        let copied = std::fs::create_dir_all(&lib_dir).and_then(|_| std::fs::copy(&archive, &lib));
        if let Err(e) = copied {
            panic!("copy {} to {}: {e}", archive.display(), lib.display());
        }
    }
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
}

/// Unpacks Debian's libseccomp-dev for `deb_arch` into `into`.
fn fetch(deb_arch: &str, into: &Path) {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let script = manifest.join("cross/apt-foreign.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg("-x")
        .arg(into)
        .arg(deb_arch)
        .arg("libseccomp-dev")
        // Its list of .debs is for a person; cargo would take it for directives.
        .stdout(std::process::Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "{} {deb_arch} libseccomp-dev failed ({s}): libseccomp for the `seccomp` \
             feature; or set LIBSECCOMP_LIB_PATH to a folder with libseccomp.a",
            script.display()
        ),
        Err(e) => panic!("run {}: {e}", script.display()),
    }
}
