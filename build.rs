//! Build script: where the linker finds libseccomp for the `seccomp` feature (on by
//! default), and the release binary's unwind tables (below). Touches nothing else.
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
//!
//! Release builds for aarch64 and x86_64 link the `holdfast` binary without
//! `.eh_frame` and `.eh_frame_hdr` (`cross/no-unwind-tables.ld`): with `panic =
//! "abort"` nothing unwinds, and the release binary is stripped, so the tables served
//! only nameless backtrace addresses, at 1.3 MiB of the aarch64 binary. A panic still
//! prints its message and where it happened, then aborts. Our own crates are already
//! built without them (`force-unwind-tables=no`, `.cargo/config.toml`); these are the
//! tables of the prebuilt std and of the C objects. armv7 unwinds through
//! `.ARM.exidx` instead and is left as it is. A build script cannot see the panic
//! strategy (cargo reports `unwind` to it), so a `cargo test --release` binary gets
//! this too: there a panic aborts where it would have unwound.
//!
//! The same release binaries place the functions the idle agent runs before the rest of
//! the code (`cross/hot-text.ld`, written by `cross/hot-text.sh`): the kernel maps up to
//! 64 KiB of the file around each page of code faulted in, and with those functions
//! spread over all of `.text` that mapped most of it again after every trim. armv7 is
//! left as it is here too.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    release_link_scripts();
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

/// See the module doc: the release binary's link drops the unwind tables and places the
/// idle agent's code together.
fn release_link_scripts() {
    println!("cargo:rerun-if-changed=cross/no-unwind-tables.ld");
    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    // By cfg, not by triple: Yocto names its own targets (aarch64-poky-linux-gnu).
    let cfg = |k: &str| env::var(format!("CARGO_CFG_TARGET_{k}")).unwrap_or_default();
    let arch = cfg("ARCH");
    let linux_gnu =
        cfg("OS") == "linux" && cfg("ENV") == "gnu" && (arch == "aarch64" || arch == "x86_64");
    if !release || !linux_gnu {
        return;
    }
    let script = Path::new(&env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
        .join("cross/no-unwind-tables.ld");
    println!("cargo:rustc-link-arg-bins=-Wl,--no-eh-frame-hdr");
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", script.display());
    // See the module doc: the code the idle agent runs, together.
    let hot = script.with_file_name("hot-text.ld");
    println!("cargo:rerun-if-changed=cross/hot-text.ld");
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", hot.display());
}
