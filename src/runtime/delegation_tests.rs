use super::*;
use crate::testutil::TempDir;

fn base(s: &str) -> Placement {
    Placement::Base { base: s.into() }
}

#[test]
fn placed_in_supervisor_the_base_is_its_parent() {
    let text = "0::/system.slice/holdfast.service/supervisor\n";
    assert_eq!(
        placement(text),
        Ok(Placement::Supervisor {
            base: "/system.slice/holdfast.service".into()
        })
    );
}

#[test]
fn placed_in_the_unit_itself_the_base_is_its_own_cgroup() {
    let text = "0::/system.slice/holdfast.service\n";
    assert_eq!(placement(text), Ok(base("/system.slice/holdfast.service")));
    // A group named like it deeper down is not the suffix.
    let text = "0::/a/supervisor/b\n";
    assert_eq!(placement(text), Ok(base("/a/supervisor/b")));
}

#[test]
fn a_hybrid_host_gives_the_unified_line() {
    let text = "12:pids:/system.slice/holdfast.service\n\
                4:memory:/system.slice/holdfast.service\n\
                1:name=systemd:/system.slice/holdfast.service\n\
                0::/system.slice/holdfast.service/supervisor\n";
    assert_eq!(
        placement(text).map(|p| p.base().to_owned()),
        Ok("/system.slice/holdfast.service".into())
    );
}

#[test]
fn v1_lines_only_or_the_root_are_unusable() {
    let v1 = "12:pids:/user.slice\n4:memory:/user.slice\n1:name=systemd:/user.slice\n";
    assert_eq!(placement(v1), Err(Unusable::NoUnified));
    assert_eq!(placement(""), Err(Unusable::NoUnified));
    assert_eq!(placement("0::/\n"), Err(Unusable::Root));
    // `/supervisor` would make the root the base.
    assert_eq!(placement("0::/supervisor\n"), Err(Unusable::Root));
}

#[test]
fn hostile_paths_are_refused() {
    let long = format!("0::/{}\n", "a".repeat(MAX_PATH_LEN + 1));
    let deep = format!("0::{}\n", "/a".repeat(MAX_DEPTH + 1));
    for text in [
        "0::relative/path\n",
        "0::/a/../b\n",
        "0::/a/./b\n",
        "0::/a//b\n",
        "0::/a/\n",
        "0::/system.slice/holdfast.service (deleted)\n",
        "0::/a/\u{1b}[2J\n",
        long.as_str(),
        deep.as_str(),
    ] {
        match placement(text) {
            Err(Unusable::Hostile(_)) => {}
            other => panic!("{text:?}: {other:?}"),
        }
    }
    // Only the first lines are read: a later line cannot replace the unified one.
    assert_eq!(placement("0::/a\n0::/b\n"), Ok(base("/a")));
}

/// A cgroup v2 tree as systemd leaves it for a unit with Delegate=yes.
fn fake_v2(tmp: &TempDir, unit: &str, procs: &str) -> PathBuf {
    let fs = tmp.0.clone();
    std::fs::write(fs.join("cgroup.controllers"), "cpuset cpu io memory pids\n").expect("write");
    let dir = fs.join(unit.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("cgroup.controllers"), "cpu memory pids\n").expect("write");
    std::fs::write(dir.join("cgroup.subtree_control"), "").expect("write");
    std::fs::write(dir.join("cgroup.procs"), procs).expect("write");
    fs
}

#[test]
fn settle_moves_what_an_earlier_agent_left_and_enables_the_controllers() {
    let tmp = TempDir::new("delegation-base");
    let unit = "/system.slice/holdfast.service";
    let fs = fake_v2(&tmp, unit, "4242\n");
    let s = settle_at(&fs, &format!("0::{unit}/supervisor\n"), 77).expect("settle");
    assert_eq!(s.cgroup_root, format!("{unit}/pods"));
    assert_eq!(s.base.as_deref(), Some(unit));
    assert!(s.missing.is_empty());
    let base = fs.join(unit.trim_start_matches('/'));
    // A plain file stands for cgroup.procs: the last pid written is what it holds.
    assert_eq!(
        std::fs::read_to_string(base.join("supervisor/cgroup.procs")).expect("procs"),
        "4242"
    );
    // One controller per write, as the kernel takes them; never above the base.
    assert_eq!(
        std::fs::read_to_string(base.join("cgroup.subtree_control")).expect("read"),
        "+pids"
    );
    assert!(base.join("pods").is_dir());
    assert!(!fs.join("system.slice/cgroup.subtree_control").exists());
}

#[test]
fn settle_from_supervisor_names_what_the_base_lacks() {
    let tmp = TempDir::new("delegation-sup");
    let unit = "/system.slice/holdfast.service";
    let fs = fake_v2(&tmp, unit, "");
    let base = fs.join(unit.trim_start_matches('/'));
    std::fs::write(base.join("cgroup.controllers"), "cpu pids\n").expect("write");
    let s = settle_at(&fs, &format!("0::{unit}/supervisor\n"), 77).expect("settle");
    assert_eq!(s.cgroup_root, format!("{unit}/pods"));
    assert_eq!(s.missing, vec!["memory"]);
}

#[test]
fn settle_falls_back_on_v1_or_outside_a_service_manager() {
    let tmp = TempDir::new("delegation-v1");
    // No cgroup.controllers at the top: v1 or hybrid.
    let s = settle_at(&tmp.0, "0::/system.slice/holdfast.service\n", 77).expect("settle");
    assert_eq!((s.cgroup_root.as_str(), s.base), (FALLBACK, None));
    let tmp = TempDir::new("delegation-root");
    let fs = fake_v2(&tmp, "/x", "");
    for own in ["0::/\n", "0::/a/../../etc\n", "1:name=systemd:/\n"] {
        let s = settle_at(&fs, own, 77).expect("settle");
        assert_eq!(s.cgroup_root, FALLBACK, "{own:?}");
    }
}

#[test]
fn settle_started_in_the_unit_itself_falls_back_and_touches_nothing() {
    // systemd < 254 starts every agent in the unit's cgroup, which the kernel refuses
    // once it hands controllers on: honoured, the first restart with pods would fail.
    let tmp = TempDir::new("delegation-old");
    let unit = "/system.slice/holdfast.service";
    let fs = fake_v2(&tmp, unit, "77\n");
    let s = settle_at(&fs, &format!("0::{unit}\n"), 77).expect("settle");
    assert_eq!((s.cgroup_root.as_str(), s.base), (FALLBACK, None));
    let base = fs.join(unit.trim_start_matches('/'));
    assert!(!base.join("supervisor").exists());
    assert_eq!(
        std::fs::read_to_string(base.join("cgroup.subtree_control")).expect("read"),
        ""
    );
}

#[test]
fn other_values_are_kept() {
    assert_eq!(settle("/edge").expect("settle"), "/edge");
}
