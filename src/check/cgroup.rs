//! The cgroup checks: which version is mounted, and whether the controllers holdfast
//! sets limits and stops pods with are there.

use std::collections::BTreeSet;

use super::kernel::{config_verdict, with_hint};
use super::{Facts, Item, Status};

/// The v1 controllers a mount's options can name; other options (`rw`, `xattr`,
/// `name=systemd`) are not controllers.
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    Hybrid,
    V2,
}

impl CgroupVersion {
    /// The spelling board profiles use: `v1`, `hybrid`, `v2`.
    pub fn parse(s: &str) -> Option<CgroupVersion> {
        match s {
            "v1" => Some(CgroupVersion::V1),
            "hybrid" => Some(CgroupVersion::Hybrid),
            "v2" => Some(CgroupVersion::V2),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::Hybrid => "hybrid",
            CgroupVersion::V2 => "v2",
        }
    }
}

/// The cgroup hierarchies mounted, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLayout {
    /// Where cgroup2 is mounted, preferring `/sys/fs/cgroup` when it is mounted twice.
    pub v2_mount: Option<String>,
    /// Controllers that have a v1 hierarchy.
    pub v1_controllers: BTreeSet<String>,
}

impl CgroupLayout {
    pub fn from_mountinfo(text: &str) -> CgroupLayout {
        let mut layout = CgroupLayout::default();
        for line in text.lines() {
            // `36 25 0:31 / /sys/fs/cgroup/memory rw,... shared:15 - cgroup cgroup rw,memory`:
            // the optional fields before ` - ` vary in number, so split there.
            let Some((before, after)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = before.split_whitespace().nth(4) else {
                continue;
            };
            let mut after = after.split_whitespace();
            let (fstype, options) = (after.next(), after.nth(1).unwrap_or(""));
            match fstype {
                Some("cgroup2") if layout.v2_mount.is_none() || mount_point == "/sys/fs/cgroup" => {
                    layout.v2_mount = Some(mount_point.to_string());
                }
                Some("cgroup") => layout.v1_controllers.extend(
                    options
                        .split(',')
                        .filter(|o| V1_CONTROLLERS.contains(o))
                        .map(str::to_string),
                ),
                _ => {}
            }
        }
        layout
    }

    pub fn version(&self) -> Option<CgroupVersion> {
        match (&self.v2_mount, self.v1_controllers.is_empty()) {
            (Some(_), true) => Some(CgroupVersion::V2),
            (Some(_), false) => Some(CgroupVersion::Hybrid),
            (None, false) => Some(CgroupVersion::V1),
            (None, true) => None,
        }
    }
}

/// A controller as the checks see it.
struct Controller {
    label: &'static str,
    /// Its v1 hierarchy name, and its name in cgroup v2's `cgroup.controllers`.
    v1: &'static str,
    v2: &'static str,
    options: &'static [&'static str],
    hint: &'static str,
}

pub fn checks(f: &Facts, required: &mut Vec<Item>, optional: &mut Vec<Item>) {
    let live = f.cgroup.as_ref().and_then(CgroupLayout::version);
    required.push(mounted(f, live));
    if let Some((board, expected)) = &f.expected_cgroup {
        required.push(expected_version(f, live, board, *expected));
    }
    // With a kernel config deciding, the version to judge controllers by is the one the
    // board expects; without a board, v1 needs the most, so judge by that.
    let judged = if f.config_decides {
        f.expected_cgroup.as_ref().map(|(_, v)| *v)
    } else {
        live
    };
    let v2 = judged == Some(CgroupVersion::V2);
    required.push(controller(
        f,
        live,
        &Controller {
            label: "cgroup memory controller",
            v1: "memory",
            v2: "memory",
            options: &["CONFIG_MEMCG"],
            hint: "memory limits and OOM kills need it; if the kernel has it, it is switched off \
                   on the command line (Raspberry Pi: add cgroup_enable=memory cgroup_memory=1 \
                   to cmdline.txt)",
        },
    ));
    required.push(controller(
        f,
        live,
        &Controller {
            label: "cgroup cpu controller",
            v1: "cpu",
            v2: "cpu",
            options: &["CONFIG_CGROUP_SCHED", "CONFIG_FAIR_GROUP_SCHED"],
            hint: "cpu shares and quotas need it",
        },
    ));
    if v2 {
        required.push(Item::new(
            "cgroup cpuacct",
            Status::Ok,
            "cgroup v2 accounts cpu time in the cpu controller (cpu.stat)",
        ));
    } else {
        required.push(controller(
            f,
            live,
            &Controller {
                label: "cgroup cpuacct controller",
                v1: "cpuacct",
                v2: "cpu",
                options: &["CONFIG_CGROUP_CPUACCT"],
                hint: "container cpu usage is read from it",
            },
        ));
    }
    required.push(controller(
        f,
        live,
        &Controller {
            label: "cgroup pids controller",
            v1: "pids",
            v2: "pids",
            options: &["CONFIG_CGROUP_PIDS"],
            hint: "it bounds a fork bomb to its pod",
        },
    ));
    required.push(freezer(f, live, v2));
    optional.push(controller(
        f,
        live,
        &Controller {
            label: "cgroup cpuset controller",
            v1: "cpuset",
            v2: "cpuset",
            options: &["CONFIG_CPUSETS"],
            hint: "pinning containers to cpus needs it",
        },
    ));
    optional.push(devices(f, live, v2));
    optional.push(cfs_bandwidth(f));
    if live == Some(CgroupVersion::V2) && !f.config_decides {
        optional.push(if f.v2_core_files.contains("cgroup.kill") {
            Item::new(
                "cgroup.kill",
                Status::Ok,
                "a pod's processes are killed at once",
            )
        } else {
            Item::new(
                "cgroup.kill",
                Status::Warn,
                "not there (kernel older than 5.14): pods are stopped through the freezer",
            )
        });
    }
}

fn describe(v: CgroupVersion, f: &Facts) -> String {
    let v2_at = f
        .cgroup
        .as_ref()
        .and_then(|c| c.v2_mount.as_deref())
        .unwrap_or("?");
    match v {
        CgroupVersion::V2 => format!("v2 (cgroup2 at {v2_at})"),
        CgroupVersion::Hybrid => format!("hybrid (v1 controllers, cgroup2 at {v2_at})"),
        CgroupVersion::V1 => "v1".into(),
    }
}

fn mounted(f: &Facts, live: Option<CgroupVersion>) -> Item {
    let here = live.map_or_else(|| "none mounted".to_string(), |v| describe(v, f));
    if let (true, Some((_, k))) = (f.config_decides, &f.kernel_config) {
        let (ok, detail) = config_verdict(k, &["CONFIG_CGROUPS"]);
        let status = if ok { Status::Ok } else { Status::Missing };
        return Item::new("cgroups", status, format!("{detail} (here: {here})"));
    }
    match live {
        Some(_) => Item::new("cgroups", Status::Ok, here),
        None => Item::new(
            "cgroups",
            Status::Missing,
            "no cgroup filesystem in /proc/self/mountinfo: mount /sys/fs/cgroup",
        ),
    }
}

fn expected_version(
    f: &Facts,
    live: Option<CgroupVersion>,
    board: &str,
    expected: CgroupVersion,
) -> Item {
    let name = format!("cgroup version for board {board}");
    let here = live.map_or("none", CgroupVersion::as_str);
    if f.config_decides {
        return Item::new(
            name,
            Status::Warn,
            format!(
                "expects {}; a kernel config cannot tell which is mounted (here: {here})",
                expected.as_str()
            ),
        );
    }
    if live == Some(expected) {
        return Item::new(name, Status::Ok, format!("{here}, as the profile expects"));
    }
    let fix = match expected {
        CgroupVersion::V2 => "boot with systemd.unified_cgroup_hierarchy=1",
        CgroupVersion::Hybrid | CgroupVersion::V1 => "boot with systemd.unified_cgroup_hierarchy=0",
    };
    Item::new(
        name,
        Status::Missing,
        format!("expects {}, mounted: {here}; {fix}", expected.as_str()),
    )
}

fn controller(f: &Facts, live: Option<CgroupVersion>, c: &Controller) -> Item {
    let config = f
        .kernel_config
        .as_ref()
        .map(|(_, k)| config_verdict(k, c.options));
    if f.config_decides || live.is_none() {
        return match config {
            Some((true, d)) if live.is_none() && !f.config_decides => Item::new(
                c.label,
                Status::Ok,
                format!("{d} (no cgroup mounted to confirm)"),
            ),
            Some((true, d)) => Item::new(c.label, Status::Ok, d),
            Some((false, d)) => Item::new(c.label, Status::Missing, with_hint(d, c.hint)),
            None => Item::new(
                c.label,
                Status::Missing,
                "no cgroup mounted and no kernel config to tell",
            ),
        };
    }
    let v1_has = f
        .cgroup
        .as_ref()
        .is_some_and(|l| l.v1_controllers.contains(c.v1));
    let v2_has = f
        .v2_controllers
        .as_deref()
        .is_some_and(|s| s.split_whitespace().any(|n| n == c.v2));
    if v1_has {
        return Item::new(c.label, Status::Ok, format!("{} (v1 hierarchy)", c.v1));
    }
    if v2_has {
        return Item::new(
            c.label,
            Status::Ok,
            format!("{} in cgroup.controllers", c.v2),
        );
    }
    let kernel = config.map_or_else(String::new, |(_, d)| format!("; kernel config: {d}"));
    Item::new(
        c.label,
        Status::Missing,
        with_hint(format!("not enabled{kernel}"), c.hint),
    )
}

fn freezer(f: &Facts, live: Option<CgroupVersion>, v2: bool) -> Item {
    const LABEL: &str = "cgroup freezer";
    if v2 && (f.config_decides || live.is_none()) {
        return Item::new(
            LABEL,
            Status::Ok,
            "cgroup v2 freezes in its core (kernel 5.2 and later)",
        );
    }
    if v2 {
        let files = &f.v2_core_files;
        return match (
            files.contains("cgroup.freeze"),
            files.contains("cgroup.kill"),
        ) {
            (true, _) => Item::new(LABEL, Status::Ok, "cgroup.freeze (cgroup v2 core)"),
            (false, true) => Item::new(LABEL, Status::Ok, "cgroup.kill (cgroup v2 core)"),
            (false, false) => Item::new(
                LABEL,
                Status::Missing,
                "no cgroup.freeze or cgroup.kill in a cgroup v2 group (kernel older than 5.2?)",
            ),
        };
    }
    controller(
        f,
        live,
        &Controller {
            label: LABEL,
            v1: "freezer",
            v2: "freezer",
            options: &["CONFIG_CGROUP_FREEZER"],
            hint: "stopping every process of a pod at once needs it",
        },
    )
}

fn devices(f: &Facts, live: Option<CgroupVersion>, v2: bool) -> Item {
    if v2 {
        // cgroup v2 has no devices controller: the device allow-list is an eBPF program.
        return match &f.kernel_config {
            Some((_, k)) => {
                let (ok, d) = config_verdict(k, &["CONFIG_CGROUP_BPF"]);
                let status = if ok { Status::Ok } else { Status::Missing };
                Item::new("cgroup device filter", status, format!("{d} (eBPF on cgroup v2)"))
            }
            None => Item::new(
                "cgroup device filter",
                Status::Warn,
                "cgroup v2 filters devices with eBPF (CONFIG_CGROUP_BPF); no kernel config to confirm",
            ),
        };
    }
    controller(
        f,
        live,
        &Controller {
            label: "cgroup devices controller",
            v1: "devices",
            v2: "devices",
            options: &["CONFIG_CGROUP_DEVICE"],
            hint: "without it containers are not kept from host devices",
        },
    )
}

fn cfs_bandwidth(f: &Facts) -> Item {
    const LABEL: &str = "cpu quota (CFS bandwidth)";
    match &f.kernel_config {
        Some((_, k)) => {
            let (ok, d) = config_verdict(k, &["CONFIG_CFS_BANDWIDTH"]);
            if ok {
                Item::new(LABEL, Status::Ok, d)
            } else {
                Item::new(
                    LABEL,
                    Status::Missing,
                    with_hint(d, "a container with a cpu limit fails to start"),
                )
            }
        }
        None => Item::new(LABEL, Status::Warn, "no kernel config to tell"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 33 0:30 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
38 33 0:33 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:15 - cgroup cgroup rw,cpu,cpuacct
39 33 0:34 / /sys/fs/cgroup/memory rw,nosuid shared:16 - cgroup cgroup rw,memory
";

    #[test]
    fn versions_from_mountinfo() {
        let hybrid = CgroupLayout::from_mountinfo(V1);
        assert_eq!(hybrid.version(), Some(CgroupVersion::Hybrid));
        assert_eq!(hybrid.v2_mount.as_deref(), Some("/sys/fs/cgroup/unified"));
        let names: Vec<_> = hybrid.v1_controllers.iter().map(String::as_str).collect();
        assert_eq!(names, ["cpu", "cpuacct", "memory"]);

        let v1_only: String = V1
            .lines()
            .filter(|l| !l.contains("cgroup2"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            CgroupLayout::from_mountinfo(&v1_only).version(),
            Some(CgroupVersion::V1)
        );
        let v2 = CgroupLayout::from_mountinfo(
            "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
        );
        assert_eq!(v2.version(), Some(CgroupVersion::V2));
        assert_eq!(v2.v2_mount.as_deref(), Some("/sys/fs/cgroup"));
        assert_eq!(CgroupLayout::from_mountinfo("").version(), None);
    }

    #[test]
    fn live_v2_controllers_and_freezer() {
        let f = Facts {
            cgroup: Some(CgroupLayout {
                v2_mount: Some("/sys/fs/cgroup".into()),
                v1_controllers: BTreeSet::new(),
            }),
            v2_controllers: Some("cpuset cpu io pids\n".into()),
            v2_core_files: ["cgroup.freeze".to_string()].into(),
            ..Facts::default()
        };
        let (mut req, mut opt) = (Vec::new(), Vec::new());
        checks(&f, &mut req, &mut opt);
        let status = |name: &str| {
            req.iter()
                .chain(&opt)
                .find(|i| i.name == name)
                .map(|i| i.status)
        };
        assert_eq!(status("cgroups"), Some(Status::Ok));
        assert_eq!(status("cgroup memory controller"), Some(Status::Missing));
        assert_eq!(status("cgroup cpu controller"), Some(Status::Ok));
        assert_eq!(status("cgroup cpuacct"), Some(Status::Ok));
        assert_eq!(status("cgroup freezer"), Some(Status::Ok));
        assert_eq!(status("cgroup.kill"), Some(Status::Warn));
        let memory = req.iter().find(|i| i.name == "cgroup memory controller");
        assert!(memory.is_some_and(|i| i.detail.contains("cgroup_enable=memory")));
    }

    #[test]
    fn board_expectation_is_checked_live() {
        let mut f = Facts {
            cgroup: Some(CgroupLayout::from_mountinfo(V1)),
            expected_cgroup: Some(("rpi4".into(), CgroupVersion::V2)),
            ..Facts::default()
        };
        let item = |f: &Facts| {
            let (mut req, mut opt) = (Vec::new(), Vec::new());
            checks(f, &mut req, &mut opt);
            req.into_iter()
                .find(|i| i.name == "cgroup version for board rpi4")
                .expect("board item")
        };
        let i = item(&f);
        assert_eq!(i.status, Status::Missing);
        assert!(
            i.detail.contains("unified_cgroup_hierarchy=1"),
            "{}",
            i.detail
        );
        f.expected_cgroup = Some(("rpi4".into(), CgroupVersion::Hybrid));
        assert_eq!(item(&f).status, Status::Ok);
    }
}
