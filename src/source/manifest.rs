//! One manifest file: YAML (several documents allowed) or JSON, each document a Pod.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_yaml::Value;

use super::static_pod::make_static_pod;
use super::validate::validate_pod;
use super::SourceError;

/// A manifest larger than this is refused rather than read: the device has little RAM
/// and no pod spec comes near it.
const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// Each pod document is decoded a second time by skipping to it from the start, which
/// costs the square of the document count; a bound keeps a hostile file cheap.
const MAX_DOCUMENTS: usize = 100;

/// What one file gave.
pub(super) enum FileRead {
    /// The file could not be read or is not YAML at all, as when an editor is halfway
    /// through saving it; the caller keeps what the file gave before.
    Unreadable(SourceError),
    /// The file parsed: its valid pods, and an error for each document refused.
    Read {
        pods: Vec<Pod>,
        errors: Vec<SourceError>,
    },
}

pub(super) fn read_manifest_file(path: &Path, node_name: &str) -> FileRead {
    let file = path.display().to_string();
    let manifest_err = |reason: String| SourceError::Manifest {
        file: file.clone(),
        reason,
    };
    match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_MANIFEST_BYTES => {
            return FileRead::Read {
                pods: Vec::new(),
                errors: vec![manifest_err(format!(
                    "file is {} bytes, larger than the {MAX_MANIFEST_BYTES} bytes allowed",
                    m.len()
                ))],
            }
        }
        // An empty file is what a power cut leaves of a manifest written but not yet
        // flushed (ext4 gives the new name with no blocks): as unreadable as a save cut
        // short, so it keeps the pods it gave before. Removing them takes removing it.
        Ok(m) if m.len() == 0 => {
            return FileRead::Unreadable(manifest_err(
                "file is empty (a write cut short by a power cut?)".into(),
            ))
        }
        Ok(_) => {}
        Err(source) => {
            return FileRead::Unreadable(SourceError::Io {
                context: format!("read manifest {file}"),
                source,
            })
        }
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(source) => {
            return FileRead::Unreadable(SourceError::Io {
                context: format!("read manifest {file}"),
                source,
            })
        }
    };

    // First pass: the whole file must be YAML before any of it counts, so a file cut
    // short mid-save does not lose the documents after the cut.
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(&text) {
        if docs.len() == MAX_DOCUMENTS {
            return FileRead::Read {
                pods: Vec::new(),
                errors: vec![manifest_err(format!(
                    "more than {MAX_DOCUMENTS} documents in one file"
                ))],
            };
        }
        match Value::deserialize(de) {
            Ok(v) => docs.push(v),
            Err(e) => {
                let at = if docs.is_empty() {
                    String::new()
                } else {
                    format!("document {}: ", docs.len())
                };
                // serde_yaml repeats a syntax error for ever instead of ending the
                // stream; stop at the first.
                return FileRead::Unreadable(manifest_err(format!("{at}not valid YAML: {e}")));
            }
        }
    }

    let mut pods = Vec::new();
    let mut errors = Vec::new();
    let many = docs.len() > 1;
    for (index, doc) in docs.iter().enumerate() {
        let at = if many {
            format!("document {index}: ")
        } else {
            String::new()
        };
        if doc.is_null() {
            continue;
        }
        if let Err(reason) = check_kind(doc) {
            errors.push(manifest_err(format!("{at}{reason}")));
            continue;
        }
        // Decoded again from the text rather than from the Value, so the error carries
        // the line and column as well as the field path.
        let decoded = serde_yaml::Deserializer::from_str(&text)
            .nth(index)
            .map(Pod::deserialize);
        let pod = match decoded {
            Some(Ok(pod)) => pod,
            Some(Err(e)) => {
                errors.push(manifest_err(format!("{at}decode pod: {e}")));
                continue;
            }
            None => {
                errors.push(manifest_err(format!("{at}document vanished on re-read")));
                continue;
            }
        };
        let problems = validate_pod(&pod);
        if !problems.is_empty() {
            errors.push(manifest_err(format!(
                "{at}invalid pod: {}",
                problems.join("; ")
            )));
            continue;
        }
        let pod = make_static_pod(pod, node_name, path);
        // The name grows by the node name; it must still be a valid pod name.
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if let Err(e) = crate::config::check_dns1123_subdomain(name) {
            errors.push(manifest_err(format!(
                "{at}invalid pod: metadata.name: with the node name appended: {e}"
            )));
            continue;
        }
        pods.push(pod);
    }
    FileRead::Read { pods, errors }
}

fn check_kind(doc: &Value) -> Result<(), String> {
    let Value::Mapping(map) = doc else {
        return Err("expected a Pod object (a mapping), got something else".into());
    };
    let field = |key: &str| match map.get(key) {
        Some(Value::String(s)) => Some(s.as_str()),
        _ => None,
    };
    match (field("apiVersion"), field("kind")) {
        (Some("v1"), Some("Pod")) => Ok(()),
        (api, kind) => Err(format!(
            "expected apiVersion v1 and kind Pod, got apiVersion {} and kind {}: only pods can be static manifests",
            api.unwrap_or("<missing>"),
            kind.unwrap_or("<missing>")
        )),
    }
}
