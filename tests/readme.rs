//! The README and `docs/` against the code: every config example in them is one this
//! holdfast reads without a warning, every key the config file takes is named in
//! `docs/configuration.md`, and so is every flag of every command. The lists come from
//! the code (`config::KEYS`, `config::FLAGS`, the commands' own usage texts), so a key or
//! flag added without a word there fails here. Every link between the README and the
//! files of `docs/` leads to a file, and to a heading of it where it names one.

use std::path::{Path, PathBuf};
use std::process::Command;

use holdfast::config::{parse_config, read_config_file, FLAGS, KEYS};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn readme() -> String {
    read(&root().join("README.md"))
}

/// The reference for every command, flag and config key.
fn configuration() -> String {
    read(&root().join("docs/configuration.md"))
}

/// The README and every Markdown file of `docs/`, in a stable order.
fn docs() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("read docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    files.sort();
    files.insert(0, root().join("README.md"));
    files
}

#[test]
fn the_readmes_example_config_is_read_without_a_warning() {
    let readme = readme();
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

#[test]
fn every_config_example_in_the_docs_is_read_without_a_warning() {
    let mut examples = 0;
    for file in docs() {
        for block in raw_yaml_blocks(&read(&file)) {
            // Kubeconfigs and the like are other files.
            if block.contains("apiVersion:") && !block.contains("kubelet.config.k8s.io/") {
                continue;
            }
            examples += 1;
            let read = parse_config(Path::new("/etc/holdfast/config.yaml"), &block);
            let (_, warnings) =
                read.unwrap_or_else(|e| panic!("{}: {e}:\n{block}", file.display()));
            assert!(
                warnings.is_empty(),
                "{}: {warnings:?}:\n{block}",
                file.display()
            );
        }
    }
    assert!(examples >= 4, "the README and docs/ show config examples");
}

/// Each ```yaml block of `text`, its indentation (a block inside a list item) removed.
fn raw_yaml_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        match current.as_mut() {
            None if line.trim_start() == "```yaml" => current = Some((indent, String::new())),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => {
                blocks.extend(current.take().map(|(_, b)| b));
            }
            Some((at, block)) => {
                block.push_str(line.get(*at..).unwrap_or(""));
                block.push('\n');
            }
        }
    }
    blocks
}

/// A document split into what it says in `code spans` and what its ```yaml blocks hold.
struct Doc {
    spans: Vec<String>,
    yaml_blocks: Vec<Vec<String>>,
    text: String,
}

impl Doc {
    fn parse(text: String) -> Doc {
        let mut spans = Vec::new();
        let mut yaml_blocks = Vec::new();
        let mut fence: Option<Vec<String>> = None;
        let mut in_other_fence = false;
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("```") {
                if let Some(block) = fence.take() {
                    yaml_blocks.push(block);
                } else if in_other_fence {
                    in_other_fence = false;
                } else if trimmed == "```yaml" {
                    fence = Some(Vec::new());
                } else {
                    in_other_fence = true;
                }
                continue;
            }
            if let Some(block) = fence.as_mut() {
                // Comments say things about keys; only keys count.
                let code = line.split(" # ").next().unwrap_or(line);
                block.push(code.to_string());
            } else if !in_other_fence {
                spans.extend(line.split('`').skip(1).step_by(2).map(String::from));
            }
        }
        Doc {
            spans,
            yaml_blocks,
            text,
        }
    }

    /// `key` (a path of [`KEYS`]) is named in a code span, in full or by its last part,
    /// or every part of it is a key in one of the yaml blocks.
    fn names_key(&self, key: &str) -> bool {
        let parts: Vec<&str> = key
            .split('.')
            .filter(|p| *p != "*")
            .map(|p| p.trim_end_matches("[]"))
            .collect();
        let leaf = parts[parts.len() - 1];
        let own = parts.iter().filter(|p| **p != "holdfast").count() == 1;
        let in_span = self.spans.iter().any(|s| {
            s == key || (own && s == leaf) || (s.contains('.') && key.ends_with(&format!(".{s}")))
        });
        in_span
            || self.yaml_blocks.iter().any(|block| {
                parts
                    .iter()
                    .all(|part| block.iter().any(|line| yaml_key(line, part)))
            })
    }

    /// `--flag` appears, not as the start of a longer flag.
    fn names_flag(&self, flag: &str) -> bool {
        self.text.match_indices(flag).any(|(at, _)| {
            let before = self.text[..at].chars().next_back();
            let after = self.text[at + flag.len()..].chars().next();
            !matches!(before, Some(c) if c.is_alphanumeric() || c == '-')
                && !matches!(after, Some(c) if c.is_alphanumeric() || c == '-')
        })
    }
}

/// `name` is a key on this yaml line: `name:` at the start, after `- `, `{` or `, `.
fn yaml_key(line: &str, name: &str) -> bool {
    let pattern = format!("{name}:");
    line.match_indices(&pattern).any(|(at, _)| {
        let before = line[..at].trim_end();
        before.is_empty() || before.ends_with('-') || before.ends_with('{') || before.ends_with(',')
    })
}

#[test]
fn every_config_key_is_named_in_the_configuration_reference() {
    let reference = Doc::parse(configuration());
    let missing: Vec<&str> = KEYS
        .iter()
        .copied()
        .filter(|k| !reference.names_key(k))
        .collect();
    assert!(
        missing.is_empty(),
        "config keys docs/configuration.md does not name (as `key` or in a yaml block): {missing:?}"
    );
}

/// Every `--flag` a usage text names.
fn flags_in(usage: &str) -> Vec<String> {
    usage
        .split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(String::from)
        .collect()
}

#[test]
fn every_flag_is_named_in_the_configuration_reference() {
    let reference = Doc::parse(configuration());
    // `holdfast run`'s flags as its parser lists them; the other commands' as their
    // usage texts give them.
    let help = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("help")
        .output()
        .expect("run holdfast help");
    assert!(help.status.success(), "holdfast help: {help:?}");
    let mut flags: Vec<String> = FLAGS.iter().map(|f| f.to_string()).collect();
    flags.extend(flags_in(&String::from_utf8_lossy(&help.stdout)));
    flags.extend(flags_in(holdfast::check::USAGE));
    flags.sort();
    flags.dedup();
    assert!(
        flags.len() > FLAGS.len(),
        "the commands' usage texts name flags"
    );
    let missing: Vec<&String> = flags.iter().filter(|f| !reference.names_flag(f)).collect();
    assert!(
        missing.is_empty(),
        "flags docs/configuration.md does not name: {missing:?}"
    );
}

#[test]
fn the_key_check_sees_a_missing_key() {
    // The checks above hold only if they can fail: a reference without a key's name.
    let readme = Doc::parse(
        "`syncFrequency` and `holdfast.cniConfDir`\n\n```yaml\nauthentication:\n  x509: {clientCAFile: /ca}\n```\n"
            .into(),
    );
    assert!(readme.names_key("syncFrequency"));
    assert!(readme.names_key("holdfast.cniConfDir"));
    assert!(readme.names_key("authentication.x509.clientCAFile"));
    assert!(!readme.names_key("fileCheckFrequency"));
    assert!(!readme.names_key("holdfast.cniBinDir"));
    assert!(!readme.names_key("authentication.webhook.cacheTTL"));
    assert!(!readme.names_flag("--v"));
    let readme = Doc::parse("`--board-dir DIR` and `--v N`".into());
    assert!(!readme.names_flag("--board"));
    assert!(readme.names_flag("--board-dir"));
    assert!(readme.names_flag("--v"));
}

/// `text` with its fenced code blocks blanked out: what they hold is not Markdown.
fn outside_fences(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// The anchor a heading gets: lowercase, spaces as hyphens, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings.
fn anchors(text: &str) -> Vec<String> {
    outside_fences(text)
        .lines()
        .filter_map(|line| {
            let title = line.trim_start_matches('#');
            (title.len() < line.len() && title.starts_with(' ')).then(|| anchor(title))
        })
        .collect()
}

/// What is wrong with each relative link of `text`, a file in `dir`: a file that is not
/// there, or a `#anchor` that names no heading of it.
fn broken_links(dir: &Path, text: &str) -> Vec<String> {
    let text = outside_fences(text);
    let mut broken = Vec::new();
    for (at, _) in text.match_indices("](") {
        let rest = &text[at + 2..];
        let target = &rest[..rest.find([')', ' ', '\n']).unwrap_or(rest.len())];
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
        let linked = if path.is_empty() {
            text.clone()
        } else {
            match std::fs::read(dir.join(path)) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(_) if dir.join(path).is_dir() => String::new(),
                Err(e) => {
                    broken.push(format!("{target}: {e}"));
                    continue;
                }
            }
        };
        if !fragment.is_empty() && !anchors(&linked).iter().any(|a| a == fragment) {
            broken.push(format!("{target}: no such heading"));
        }
    }
    broken
}

#[test]
fn every_link_between_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut links = 0;
    for file in docs() {
        let text = read(&file);
        links += outside_fences(&text).matches("](").count();
        let dir = file.parent().expect("a file's folder");
        broken.extend(
            broken_links(dir, &text)
                .into_iter()
                .map(|b| format!("{}: {b}", file.display())),
        );
    }
    assert!(links > 20, "the README and docs/ link to each other");
    assert!(broken.is_empty(), "links that lead nowhere: {broken:#?}");
}

#[test]
fn the_link_check_sees_a_broken_link() {
    let dir = root().join("docs");
    let text = "# A title\n\n## Pods' sandboxes, and more\n\n\
        [ok](#a-title) [ok](#pods-sandboxes-and-more) [ok](../README.md#layout) \
        [ok](https://example.com/x#y)\n\n```\n[not a link](nowhere.md)\n```\n";
    let broken = broken_links(&dir, text);
    assert!(broken.is_empty(), "{broken:?}");
    let text = "# A title\n\n[no file](nowhere.md) [no heading](#pods) \
        [no heading there](../README.md#nowhere)\n";
    let broken = broken_links(&dir, text);
    assert_eq!(broken.len(), 3, "{broken:?}");
}
