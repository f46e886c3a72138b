//! `systemd-analyze verify` of holdfast's unit, as tests/systemd_unit.rs and
//! tests/package.rs run it.

#![allow(dead_code)]

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The unit the Yocto layer and the Debian packages install, in the repository.
pub const UNIT: &str = "yocto/meta-holdfast/recipes-containers/holdfast/files/holdfast.service";

/// Writes `unit_text` into `dir` with its binary and config pointed at `bin` and
/// `config` (verify checks that ExecStart's program exists). Panics if a path under
/// /etc is left in it.
pub fn unit_at(dir: &Path, unit_text: &str, bin: &Path, config: &Path) -> PathBuf {
    let text = unit_text
        .replace("/usr/bin/holdfast", &bin.display().to_string())
        .replace("/etc/holdfast/config.yaml", &config.display().to_string());
    assert!(
        !text
            .replace(&config.display().to_string(), "")
            .contains("/etc/"),
        "a path under /etc is left in the unit"
    );
    let unit = dir.join("holdfast.service");
    std::fs::write(&unit, text).expect("write the unit");
    unit
}

/// What `systemd-analyze verify` said of `unit`: its exit status and every line it
/// printed; None when systemd-analyze is not installed.
pub fn verify(unit: &Path) -> Option<(bool, String)> {
    let out = match Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(unit)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            eprintln!("skipped: systemd-analyze is not installed (Debian package systemd)");
            return None;
        }
        Err(e) => panic!("run systemd-analyze: {e}"),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), text))
}

/// Asserts that `systemd-analyze verify` finds nothing in `unit`. DelegateSubgroup= came
/// with systemd 254; Debian 12 has 252, which says exactly that it ignores the key (the
/// agent then moves itself into the subgroup). Any other line is a finding.
pub fn assert_verifies(unit: &Path) {
    let Some((ok, text)) = verify(unit) else {
        return;
    };
    let known = ": Unknown key 'DelegateSubgroup' in section [Service], ignoring.";
    let findings: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !(l.starts_with(&unit.display().to_string()) && l.ends_with(known)))
        .collect();
    assert!(
        ok && findings.is_empty(),
        "systemd-analyze verify {}:\n{}",
        unit.display(),
        findings.join("\n")
    );
}
