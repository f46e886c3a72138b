//! Writes an OCI image layout tar holding the host's static busybox, ready for
//! `holdfast image import`.
//!
//! `cargo run --example busybox_image -- OUT.tar [REF]`

#[path = "../tests/support/oci.rs"]
mod oci;

use std::path::PathBuf;
use std::process::ExitCode;

const DEFAULT_REF: &str = "docker.io/library/busybox:demo";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(out) = args.next().map(PathBuf::from) else {
        eprintln!("usage: busybox_image OUT.tar [REF]");
        return ExitCode::from(2);
    };
    let reference = args
        .next()
        .map(|r| r.to_string_lossy().into_owned())
        .unwrap_or_else(|| DEFAULT_REF.to_string());
    let built = oci::busybox_image(&reference).and_then(|image| image.write_layout_tar(&out));
    match built {
        Ok(built) => {
            println!("{} {} {}", out.display(), reference, built.manifest_digest);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("write {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}
