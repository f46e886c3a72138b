//! What the benchmarks share.

#![allow(dead_code)]

use std::path::Path;

/// Containers whose process runs under `root` (the shim wrote `started.json` and no
/// `exit.json`).
pub fn running_containers(root: &Path) -> usize {
    std::fs::read_dir(root.join("containers"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.path().join("started.json").exists() && !e.path().join("exit.json").exists()
                })
                .count()
        })
        .unwrap_or(0)
}

/// Writes a benchmark's figures to `target/bench/<name>.json` and says where.
pub fn write_json(name: &str, value: &serde_json::Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).expect("target/bench");
    let path = dir.join(format!("{name}.json"));
    std::fs::write(
        &path,
        serde_json::to_string_pretty(value).expect("json") + "\n",
    )
    .expect("write the bench's json");
    println!("\nwrote {}", path.display());
}
