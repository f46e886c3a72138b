//! What the benchmarks share.

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
