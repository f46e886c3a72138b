//! The README's example configuration is one this holdfast reads without a warning:
//! every key it shows exists, spelled as the config parser spells it.

use std::path::PathBuf;

use holdfast::config::read_config_file;

#[test]
fn the_readmes_example_config_is_read_without_a_warning() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let section = readme
        .split("\n## Configuration\n")
        .nth(1)
        .expect("the README has a Configuration section");
    let block = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a yaml block in the Configuration section");
    let dir = std::env::temp_dir().join(format!("holdfast-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("config.yaml");
    std::fs::write(&path, block).expect("write the example");
    let read = read_config_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
    let (file, warnings) = read.expect("holdfast reads the README's example config");
    assert!(
        warnings.is_empty(),
        "keys the README shows that holdfast ignores: {warnings:?}"
    );
    assert!(
        file.bootstrap_kubeconfig.is_some() && file.kubeconfig.is_some(),
        "the example names both kubeconfigs"
    );
}
