//! Reading images out of an archive: OCI layouts (with nested indexes and platform
//! selection) and `docker save` tars. Every blob is verified against its digest and
//! size as it enters the content store.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::json;

use super::archive::Archive;
use super::content::Content;
use super::digest::{hex_of, sha256_hex, Expect};
use super::platform::{self, Descriptor, Platform};
use super::reference::{check_digest, Reference};
use super::unpack::{detect_compression, Compression};
use super::{json_err, ImageError};

/// Manifests, indexes and configs are JSON read whole; nothing honest is this large.
pub(crate) const JSON_LIMIT: u64 = 4 * 1024 * 1024;
const MAX_INDEX_DEPTH: usize = 4;

const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const MEDIA_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// An image whose blobs are all in the content store, not yet recorded.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub names: Vec<String>,
    pub manifest_digest: String,
    pub config_digest: String,
    pub layers: Vec<String>,
    pub diff_ids: Vec<String>,
    pub size: u64,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

pub(crate) struct Importer<'a> {
    pub archive: &'a Archive,
    pub content: &'a Content,
    pub platform: &'a Platform,
    /// Blobs this import added, so a failed import can take them back out.
    pub fresh: Vec<String>,
}

impl Importer<'_> {
    pub(crate) fn images(&mut self) -> Result<Vec<Pending>, ImageError> {
        let mut out = if self.archive.has("index.json") {
            self.oci()?
        } else if self.archive.has("manifest.json") {
            self.docker()?
        } else {
            return Err(ImageError::BadArchive {
                archive: self.archive.describe(),
                reason: "neither an OCI image layout (index.json) nor a docker save archive (manifest.json)".into(),
            });
        };
        // The same manifest under several names is one image.
        let mut merged: Vec<Pending> = Vec::new();
        for p in out.drain(..) {
            match merged
                .iter_mut()
                .find(|m| m.manifest_digest == p.manifest_digest)
            {
                Some(m) => {
                    for n in p.names {
                        if !m.names.contains(&n) {
                            m.names.push(n);
                        }
                    }
                }
                None => merged.push(p),
            }
        }
        Ok(merged)
    }

    fn ingest(&mut self, name: &str, expect: Expect<'_>) -> Result<(String, u64), ImageError> {
        let known = match expect.digest {
            Some(d) => self.content.has_blob(d)?,
            None => false,
        };
        let (digest, size) = self.archive.ingest(name, self.content, expect)?;
        if !known && !self.fresh.contains(&digest) {
            self.fresh.push(digest.clone());
        }
        Ok((digest, size))
    }

    fn blob_json(&mut self, desc: &Descriptor) -> Result<Vec<u8>, ImageError> {
        let name = format!("blobs/sha256/{}", hex_of(&desc.digest)?);
        if desc.size > JSON_LIMIT {
            return Err(ImageError::TooLarge {
                what: format!("{name} in {}", self.archive.describe()),
                limit: JSON_LIMIT,
            });
        }
        let expect = Expect {
            digest: Some(&desc.digest),
            size: Some(desc.size),
        };
        self.ingest(&name, expect)?;
        self.content.read_blob(&desc.digest, JSON_LIMIT)
    }

    fn oci(&mut self) -> Result<Vec<Pending>, ImageError> {
        let what = format!("index.json in {}", self.archive.describe());
        let bytes = self
            .archive
            .read_small("index.json", JSON_LIMIT)?
            .unwrap_or_default();
        let index: Index = serde_json::from_slice(&bytes).map_err(json_err(what.clone()))?;
        // Entries that share a name are platform variants of one image.
        let mut groups: Vec<(Vec<String>, Vec<Descriptor>)> = Vec::new();
        for desc in index.manifests {
            let names = names_of(&desc)?;
            match groups.iter_mut().find(|(n, _)| *n == names) {
                Some((_, descs)) => descs.push(desc),
                None => groups.push((names, vec![desc])),
            }
        }
        let mut out = Vec::new();
        for (names, descs) in groups {
            let picks: Vec<Descriptor> = if descs.iter().any(|d| d.platform.is_some()) {
                let pick = platform::choose(&descs, self.platform).ok_or_else(|| {
                    ImageError::NoMatchingPlatform {
                        what: what.clone(),
                        wanted: self.platform.to_string(),
                        available: platform::describe(&descs),
                    }
                })?;
                vec![pick.clone()]
            } else {
                descs
            };
            for desc in picks {
                out.push(self.descriptor(&desc, names.clone(), 0)?);
            }
        }
        Ok(out)
    }

    /// Follows nested indexes down to the manifest for this node.
    fn descriptor(
        &mut self,
        desc: &Descriptor,
        names: Vec<String>,
        depth: usize,
    ) -> Result<Pending, ImageError> {
        let bytes = self.blob_json(desc)?;
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(json_err(format!("blob {}", desc.digest)))?;
        if value.get("manifests").is_none() {
            return self.manifest(desc, &bytes, names);
        }
        if depth >= MAX_INDEX_DEPTH {
            return Err(ImageError::BadArchive {
                archive: self.archive.describe(),
                reason: format!(
                    "image indexes nested deeper than {MAX_INDEX_DEPTH} at {}",
                    desc.digest
                ),
            });
        }
        let index: Index =
            serde_json::from_value(value).map_err(json_err(format!("index {}", desc.digest)))?;
        let pick = platform::choose(&index.manifests, self.platform).ok_or_else(|| {
            ImageError::NoMatchingPlatform {
                what: format!("index {}", desc.digest),
                wanted: self.platform.to_string(),
                available: platform::describe(&index.manifests),
            }
        })?;
        let pick = pick.clone();
        self.descriptor(&pick, names, depth + 1)
    }

    fn manifest(
        &mut self,
        desc: &Descriptor,
        bytes: &[u8],
        names: Vec<String>,
    ) -> Result<Pending, ImageError> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(json_err(format!("manifest {}", desc.digest)))?;
        let config = self.blob_json(&manifest.config)?;
        let diff_ids = parse_config(&config, &manifest.config.digest)?;
        let mut size = desc.size + manifest.config.size;
        let mut layers = Vec::new();
        for layer in &manifest.layers {
            let name = format!("blobs/sha256/{}", hex_of(&layer.digest)?);
            let expect = Expect {
                digest: Some(&layer.digest),
                size: Some(layer.size),
            };
            self.ingest(&name, expect)?;
            size += layer.size;
            layers.push(layer.digest.clone());
        }
        check_diff_ids(&layers, &diff_ids, &manifest.config.digest)?;
        Ok(Pending {
            names,
            manifest_digest: desc.digest.clone(),
            config_digest: manifest.config.digest.clone(),
            layers,
            diff_ids,
            size,
        })
    }

    fn docker(&mut self) -> Result<Vec<Pending>, ImageError> {
        let what = format!("manifest.json in {}", self.archive.describe());
        let bytes = self
            .archive
            .read_small("manifest.json", JSON_LIMIT)?
            .unwrap_or_default();
        let entries: Vec<DockerEntry> = serde_json::from_slice(&bytes).map_err(json_err(what))?;
        let mut out = Vec::new();
        for entry in entries {
            out.push(self.docker_image(&entry)?);
        }
        Ok(out)
    }

    fn docker_image(&mut self, entry: &DockerEntry) -> Result<Pending, ImageError> {
        let named = digest_in_name(&entry.config);
        let expect = Expect {
            digest: named.as_deref(),
            size: None,
        };
        let (config_digest, config_size) = self.ingest(&entry.config, expect)?;
        let config = self.content.read_blob(&config_digest, JSON_LIMIT)?;
        let diff_ids = parse_config(&config, &config_digest)?;
        let mut layer_descs = Vec::new();
        let mut layers = Vec::new();
        let mut size = config_size;
        for name in &entry.layers {
            let named = digest_in_name(name);
            let expect = Expect {
                digest: named.as_deref(),
                size: None,
            };
            let (digest, layer_size) = self.ingest(name, expect)?;
            let media_type = match detect_compression(&self.blob_head(&digest)?) {
                Compression::Gzip => MEDIA_LAYER_GZIP,
                Compression::Zstd => MEDIA_LAYER_ZSTD,
                Compression::None => MEDIA_LAYER_TAR,
                Compression::Unsupported(kind) => {
                    return Err(ImageError::UnsupportedCompression {
                        layer: digest,
                        kind,
                    })
                }
            };
            layer_descs
                .push(json!({"mediaType": media_type, "digest": digest, "size": layer_size}));
            size += layer_size;
            layers.push(digest);
        }
        check_diff_ids(&layers, &diff_ids, &config_digest)?;
        // docker save carries no manifest; this one is built deterministically so that
        // importing the same archive twice gives the same image.
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
            "layers": layer_descs,
        });
        let manifest = serde_json::to_vec(&manifest).map_err(json_err("generated manifest"))?;
        let manifest_digest = sha256_hex(&manifest);
        let known = self.content.has_blob(&manifest_digest)?;
        self.content.write_blob(
            &mut manifest.as_slice(),
            "generated manifest",
            Expect::default(),
        )?;
        if !known {
            self.fresh.push(manifest_digest.clone());
        }
        size += manifest.len() as u64;
        let mut names = Vec::new();
        for tag in entry.repo_tags.iter().flatten() {
            let n = Reference::parse(tag)?.to_string();
            if !names.contains(&n) {
                names.push(n);
            }
        }
        Ok(Pending {
            names,
            manifest_digest,
            config_digest,
            layers,
            diff_ids,
            size,
        })
    }

    fn blob_head(&self, digest: &str) -> Result<Vec<u8>, ImageError> {
        use std::io::Read;
        let path = self.content.blob_path(digest)?;
        let mut head = Vec::new();
        std::fs::File::open(&path)
            .and_then(|f| f.take(8).read_to_end(&mut head))
            .map_err(super::io_err(format!("read {}", path.display())))?;
        Ok(head)
    }
}

/// Checks the config parses as an image config and returns its diff ids.
pub(crate) fn parse_config(bytes: &[u8], digest: &str) -> Result<Vec<String>, ImageError> {
    let config: oci_spec::image::ImageConfiguration =
        serde_json::from_slice(bytes).map_err(json_err(format!("image config {digest}")))?;
    Ok(config.rootfs().diff_ids().clone())
}

fn check_diff_ids(layers: &[String], diff_ids: &[String], config: &str) -> Result<(), ImageError> {
    if layers.len() != diff_ids.len() {
        return Err(ImageError::BadArchive {
            archive: format!("image config {config}"),
            reason: format!("{} layers but {} diff ids", layers.len(), diff_ids.len()),
        });
    }
    Ok(())
}

/// docker save names files after their digest (`<hex>.json`, `blobs/sha256/<hex>`),
/// which lets their content be checked.
fn digest_in_name(name: &str) -> Option<String> {
    let base = name.rsplit('/').next()?;
    let hex = base.strip_suffix(".json").unwrap_or(base);
    let digest = format!("sha256:{hex}");
    check_digest(&digest).is_ok().then_some(digest)
}

/// The references an index entry names. `ref.name` is either a full reference or,
/// as the image layout spec has it, a bare tag; a bare tag only names something when
/// containerd's annotation gives the repository.
fn names_of(desc: &Descriptor) -> Result<Vec<String>, ImageError> {
    let mut out: Vec<String> = Vec::new();
    let containerd = desc
        .annotation(ANNOTATION_CONTAINERD_NAME)
        .map(Reference::parse)
        .transpose()?;
    if let Some(r) = &containerd {
        out.push(r.to_string());
    }
    if let Some(name) = desc.annotation(ANNOTATION_REF_NAME) {
        let full = if name.contains(['/', ':', '@']) {
            Some(Reference::parse(name)?)
        } else if let Some(r) = &containerd {
            Some(Reference::parse(&format!("{}:{name}", r.name()))?)
        } else {
            log::warn!(
                "image ref name {name:?} is a bare tag naming no repository; importing by digest"
            );
            None
        };
        if let Some(full) = full.map(|r| r.to_string()) {
            if !out.contains(&full) {
                out.push(full);
            }
        }
    }
    out.sort();
    Ok(out)
}

pub(crate) fn diff_id_map(p: &Pending) -> HashMap<String, String> {
    p.layers
        .iter()
        .cloned()
        .zip(p.diff_ids.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_read_from_docker_save_names() {
        let hex = "a".repeat(64);
        assert_eq!(
            digest_in_name(&format!("{hex}.json")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(
            digest_in_name(&format!("blobs/sha256/{hex}")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(digest_in_name("0123/layer.tar"), None);
    }

    #[test]
    fn annotations_name_images() {
        let desc = |pairs: &[(&str, &str)]| Descriptor {
            media_type: None,
            digest: String::new(),
            size: 0,
            annotations: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            platform: None,
        };
        let full = desc(&[(ANNOTATION_REF_NAME, "busybox:demo")]);
        assert_eq!(
            names_of(&full).expect("names"),
            vec!["docker.io/library/busybox:demo"]
        );
        let bare = desc(&[(ANNOTATION_REF_NAME, "1.0")]);
        assert!(names_of(&bare).expect("names").is_empty());
        let both = desc(&[
            (ANNOTATION_REF_NAME, "1.0"),
            (ANNOTATION_CONTAINERD_NAME, "registry.local/x/y:1.0"),
        ]);
        assert_eq!(
            names_of(&both).expect("names"),
            vec!["registry.local/x/y:1.0"]
        );
        let bad = desc(&[(ANNOTATION_REF_NAME, "Bad/Name:1")]);
        assert!(names_of(&bad).is_err());
    }

    #[test]
    fn a_bad_manifest_json_says_what_is_wrong_with_it() {
        let tmp = crate::testutil::TempDir::new("import-bad-manifest");
        let content = Content::open(&tmp.0.join("content")).expect("content store");
        let dir = tmp.0.join("saved");
        std::fs::create_dir(&dir).expect("mkdir");
        let platform = Platform::host();
        for (json, cause) in [
            (
                "[{\"Config\": 5, \"Layers\": []}]",
                "invalid type: integer `5`",
            ),
            ("[{\"Config\": \"x.json\"", "EOF while parsing"),
        ] {
            std::fs::write(dir.join("manifest.json"), json).expect("write");
            let archive = Archive::open(&dir, &content).expect("open");
            let mut importer = Importer {
                archive: &archive,
                content: &content,
                platform: &platform,
                fresh: Vec::new(),
            };
            let e = importer
                .images()
                .expect_err("a bad manifest.json is refused");
            let shown = e.to_string();
            assert!(shown.contains("manifest.json"), "{shown}");
            assert!(shown.contains(cause), "{shown}");
            assert!(shown.contains("line 1 column"), "{shown}");
        }
    }
}
