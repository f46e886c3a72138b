//! What holdfast's integration tests, benches and examples share: a real agent process,
//! the kube-apiserver double and a real control plane, images, certificates, a registry
//! and HTTPS stubs beside it, a plain HTTP server, a TCP proxy, a site's HTTP proxy
//! (tinyproxy) with the direct route blocked, loop filesystems and the fuzz harness.
//!
//! A crate of its own (a dev-dependency of holdfast, named `support` there), so that it
//! is compiled once rather than again inside every test binary. It does not depend on
//! holdfast: what it needs of the agent, it gets from the `holdfast` binary it runs.

// Lints on how an exported API reads to other crates' users (a `len` without
// `is_empty`, a `next` that is not `Iterator::next`): the items here were private to
// each test binary until they became this crate, and only this repository's tests use
// them.
#![allow(clippy::len_without_is_empty, clippy::should_implement_trait)]

pub mod agent;
pub mod apiserver;
pub mod cni;
pub mod control_plane;
pub mod fuzz;
pub mod http_proxy;
pub mod http_server;
pub mod https_stub;
pub mod konnectivity;
pub mod kubelet_api;
pub mod loopfs;
pub mod maps;
pub mod oci;
pub mod offline;
pub mod pki;
pub mod proxy;
pub mod registry;
pub mod spdy_client;
pub mod systemd;
pub mod tempdir;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The repository's root (this crate is `tests/support` in it).
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The cargo profile directory the running test, bench or example was built into
/// (`target/debug`, `target/release`, or the same under a target triple): cargo puts
/// test and bench executables in its `deps/`, examples in its `examples/`.
pub(crate) fn profile_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the path of the running executable");
        let dir = exe.parent().expect("the executable's directory");
        match dir.file_name().and_then(|n| n.to_str()) {
            Some("deps" | "examples") => dir.parent().unwrap_or(dir).to_path_buf(),
            _ => dir.to_path_buf(),
        }
    })
}

/// A directory for files tests keep between runs, under the target directory (removed
/// by `cargo clean`), as cargo's `CARGO_TARGET_TMPDIR` gives integration tests.
pub fn target_tmpdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let profile = profile_dir();
        profile.parent().unwrap_or(profile).join("tmp")
    })
}
