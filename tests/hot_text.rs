//! `cross/hot-text.ld` names the functions the idle agent runs, for release builds to
//! place together; code moved or renamed since it was measured falls back to the
//! ordinary `.text` and costs memory on the device. This says when too much of it is
//! gone from the agent as built now (cross/hot-text.sh measures it again).

use std::process::Command;

#[test]
fn the_hot_text_list_still_names_the_agents_functions() {
    let root = support::repo_root();
    let out = Command::new("python3")
        .arg(root.join("cross/hot-text.py"))
        .arg("--check")
        .arg(support::agent::bin())
        .arg(root.join("cross/hot-text.ld"))
        .output()
        .expect("run python3 cross/hot-text.py --check");
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
