//! check: `holdfast check`, a report of what the kernel and the system provide for
//! holdfast and what is missing, in the spirit of moby's and k3s's `check-config`.
//! Reads the live system only in [`facts`]; every verdict is a pure function of the
//! gathered [`Facts`], so tests run the checks on fixture kernel configs.
//!
//! Source of truth: without `--kernel-config`, the live system decides (what
//! `/proc/self/ns`, the cgroup mounts and `/proc/filesystems` show) and a kernel config
//! found in `/proc/config.gz` or `/boot/config-<release>` adds detail and covers what
//! cannot be probed. With `--kernel-config FILE`, that file decides every kernel
//! feature: it may describe the kernel of another device (an image's `.config` checked on
//! a build host), so the live cgroup layout, disk space and clock are still reported but
//! only as warnings. Disk space and the clock never fail the check either way.

mod cgroup;
mod facts;
mod kconfig;
mod kernel;
mod netfilter;
mod system;

use std::path::PathBuf;

pub use cgroup::{CgroupLayout, CgroupVersion};
pub use facts::Facts;
pub use kconfig::{KernelConfig, Setting};

pub const USAGE: &str = "usage: holdfast check [flags]

flags:
  --root-dir DIR          state directory whose disk space is checked (default /var/lib/holdfast)
  --kernel-config FILE    a kernel .config (plain or gzip) that decides every kernel feature,
                          instead of the running kernel; live probes then only warn
  --board NAME            also check the cgroup version the board profile expects
  --board-dir DIR         where board profiles are (default /usr/share/holdfast/boards)

exit code: 0 when every required item is there, 1 when one is missing, 2 for usage errors";

/// How one item fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Missing,
    Warn,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

impl Item {
    fn new(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Item {
        Item {
            name: name.into(),
            status,
            detail: detail.into(),
        }
    }
}

/// The whole report: a header line, then the required and the optional items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub header: String,
    pub required: Vec<Item>,
    pub optional: Vec<Item>,
}

impl Report {
    /// True when no required item is missing; warnings do not count.
    pub fn passed(&self) -> bool {
        self.required.iter().all(|i| i.status != Status::Missing)
    }

    pub fn missing_required(&self) -> Vec<&str> {
        self.required
            .iter()
            .filter(|i| i.status == Status::Missing)
            .map(|i| i.name.as_str())
            .collect()
    }

    pub fn render(&self) -> String {
        let mut out = format!("{}\n", self.header);
        for (title, items) in [("required:", &self.required), ("optional:", &self.optional)] {
            out.push_str(title);
            out.push('\n');
            for i in items {
                let tag = match i.status {
                    Status::Ok => "[ok]  ",
                    Status::Missing => "[MISSING]",
                    Status::Warn => "[warn]",
                };
                out.push_str(&format!("  {tag} {}: {}\n", i.name, i.detail));
            }
        }
        let missing = self.missing_required();
        if missing.is_empty() {
            out.push_str("result: every required item is there\n");
        } else {
            out.push_str(&format!("result: missing {}\n", missing.join(", ")));
        }
        out
    }
}

/// Every check, in report order, on gathered facts.
pub fn evaluate(facts: &Facts) -> Report {
    let mut required = Vec::new();
    let mut optional = Vec::new();
    kernel::namespaces(facts, &mut required, &mut optional);
    cgroup::checks(facts, &mut required, &mut optional);
    kernel::filesystems_and_network(facts, &mut required, &mut optional);
    kernel::seccomp(facts, &mut optional);
    netfilter::checks(facts, &mut optional);
    system::checks(facts, &mut required);
    Report {
        header: facts.header(),
        required,
        optional,
    }
}

/// `holdfast check`'s flags.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckFlags {
    pub root_dir: Option<PathBuf>,
    pub kernel_config: Option<PathBuf>,
    pub board: Option<String>,
    pub board_dir: Option<PathBuf>,
}

/// Parses the arguments after `check`; `--flag value` and `--flag=value`.
pub fn parse_flags(args: &[String]) -> Result<CheckFlags, CheckError> {
    let mut flags = CheckFlags::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--help" || arg == "-h" {
            return Err(CheckError::Usage(USAGE.into()));
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        if !matches!(
            name,
            "--root-dir" | "--kernel-config" | "--board" | "--board-dir"
        ) {
            return Err(CheckError::Usage(format!(
                "unknown argument {arg:?}\n{USAGE}"
            )));
        }
        let value = match inline {
            Some(v) => v,
            None => iter
                .next()
                .cloned()
                .ok_or_else(|| CheckError::Usage(format!("flag {name} needs a value")))?,
        };
        if value.is_empty() {
            return Err(CheckError::Usage(format!("flag {name}: empty value")));
        }
        match name {
            "--root-dir" => flags.root_dir = Some(PathBuf::from(value)),
            "--kernel-config" => flags.kernel_config = Some(PathBuf::from(value)),
            "--board" => flags.board = Some(value),
            _ => flags.board_dir = Some(PathBuf::from(value)),
        }
    }
    Ok(flags)
}

/// `holdfast check`: gathers the facts, prints the report and says whether every
/// required item is there.
pub fn run(args: &[String]) -> Result<bool, CheckError> {
    let flags = parse_flags(args)?;
    let expected = match &flags.board {
        Some(name) => {
            let dir = flags
                .board_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(crate::config::DEFAULT_BOARD_DIR));
            let (profile, _) = crate::config::load_board(name, &dir)?;
            let version = CgroupVersion::parse(&profile.cgroup_version).ok_or_else(|| {
                CheckError::Board(crate::config::ConfigError::Key {
                    path: profile.origin.clone(),
                    key: "cgroupVersion".into(),
                    reason: format!(
                        "expected v1, hybrid or v2, got {:?}",
                        profile.cgroup_version
                    ),
                })
            })?;
            Some((profile.name, version))
        }
        None => None,
    };
    let facts = Facts::gather(&flags, expected)?;
    let report = evaluate(&facts);
    // A reader gone (`holdfast check | head`) is seen by main through
    // `cli::stdout_closed`; the verdict is still the exit status.
    let _ = crate::cli::emit(&report.render());
    Ok(report.passed())
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{0}")]
    Usage(String),
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kernel config {path} has no CONFIG_ lines")]
    EmptyKernelConfig { path: PathBuf },
    #[error(transparent)]
    Board(#[from] crate::config::ConfigError),
}

impl CheckError {
    /// Every error is about what the user named (a flag, a kernel config file, a board),
    /// so all are usage errors: 1 is kept for "an item is missing".
    pub fn exit_code(&self) -> i32 {
        2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags() {
        let f = parse_flags(&args(&[
            "--root-dir",
            "/data",
            "--kernel-config=/tmp/.config",
            "--board=rpi4",
        ]))
        .expect("parse");
        assert_eq!(f.root_dir, Some(PathBuf::from("/data")));
        assert_eq!(f.kernel_config, Some(PathBuf::from("/tmp/.config")));
        assert_eq!(f.board.as_deref(), Some("rpi4"));
        assert!(matches!(
            parse_flags(&args(&["--frob"])),
            Err(CheckError::Usage(_))
        ));
        assert!(matches!(
            parse_flags(&args(&["--root-dir"])),
            Err(CheckError::Usage(_))
        ));
    }

    #[test]
    fn rendering_and_verdict() {
        let mut r = Report {
            header: "holdfast check".into(),
            required: vec![Item::new("a", Status::Ok, "fine")],
            optional: vec![Item::new("b", Status::Missing, "absent")],
        };
        assert!(r.passed());
        let text = r.render();
        assert!(text.contains("required:\n  [ok]   a: fine\n"), "{text}");
        assert!(
            text.contains("optional:\n  [MISSING] b: absent\n"),
            "{text}"
        );
        r.required.push(Item::new("c", Status::Warn, "low"));
        assert!(r.passed());
        r.required.push(Item::new("d", Status::Missing, "gone"));
        assert!(!r.passed());
        assert!(r.render().ends_with("result: missing d\n"));
    }
}
