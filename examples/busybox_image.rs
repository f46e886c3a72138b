//! Writes an OCI image layout tar holding a static busybox, ready for
//! `holdfast image import`: the host's, or with `--arch` and `--busybox` another
//! architecture's (the VM test builds its guest's image this way).
//!
//! `cargo run --example busybox_image -- OUT.tar [REF] [--arch GOARCH[/VARIANT] --busybox PATH]`

use support::oci;

use std::path::PathBuf;
use std::process::ExitCode;

const DEFAULT_REF: &str = "docker.io/library/busybox:demo";
const USAGE: &str = "usage: busybox_image OUT.tar [REF] [--arch GOARCH[/VARIANT] --busybox PATH]";

fn main() -> ExitCode {
    let mut positional = Vec::new();
    let (mut arch, mut busybox) = (None, None);
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--arch") => arch = args.next().and_then(|v| v.into_string().ok()),
            Some("--busybox") => busybox = args.next().map(PathBuf::from),
            _ => positional.push(a),
        }
    }
    let mut positional = positional.into_iter();
    let Some(out) = positional.next().map(PathBuf::from) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let reference = positional
        .next()
        .map(|r| r.to_string_lossy().into_owned())
        .unwrap_or_else(|| DEFAULT_REF.to_string());
    match (arch, busybox) {
        (None, None) => {}
        (Some(arch), Some(busybox)) => {
            // Known GOARCH values only: they end up in the image's config and index.
            let (a, v) = match arch.as_str() {
                "amd64" => ("amd64", None),
                "arm64" => ("arm64", None),
                "arm/v7" => ("arm", Some("v7")),
                other => {
                    eprintln!("busybox_image: unknown --arch {other} (amd64, arm64, arm/v7)");
                    return ExitCode::from(2);
                }
            };
            oci::set_target(a, v, busybox);
        }
        _ => {
            eprintln!("busybox_image: --arch and --busybox go together\n{USAGE}");
            return ExitCode::from(2);
        }
    }
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
