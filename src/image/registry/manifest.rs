//! Manifests and indexes as registries serve them: OCI and Docker schema 2, with the
//! media types this node can run. Schema 1 is refused with a clear error; artifacts that
//! are not container images (Helm charts, signatures) are refused by their config type.

use serde::Deserialize;

use super::super::platform::Descriptor;
use super::RegistryError;

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1";

/// What a manifest request asks for, most specific first.
pub(crate) const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// Layer media types and how they are compressed.
const LAYER_TYPES: &[(&str, Compression)] = &[
    ("application/vnd.oci.image.layer.v1.tar", Compression::None),
    (
        "application/vnd.oci.image.layer.v1.tar+gzip",
        Compression::Gzip,
    ),
    (
        "application/vnd.oci.image.layer.v1.tar+zstd",
        Compression::Zstd,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar",
        Compression::None,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
        Compression::Gzip,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
        Compression::Zstd,
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        Compression::Gzip,
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar.zstd",
        Compression::Zstd,
    ),
    (
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
        Compression::Gzip,
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

#[derive(Debug)]
pub(crate) enum Parsed {
    Index(Vec<Descriptor>),
    Manifest {
        config: Descriptor,
        layers: Vec<Descriptor>,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

/// Reads a manifest or index; `content_type` is the response's, `what` names it in errors.
pub(crate) fn parse(
    bytes: &[u8],
    content_type: Option<&str>,
    reference: &str,
    what: &str,
) -> Result<Parsed, RegistryError> {
    let content_type = content_type.map(|c| c.split(';').next().unwrap_or(c).trim());
    if content_type.is_some_and(|c| c.starts_with(DOCKER_SCHEMA1)) {
        return Err(RegistryError::Schema1 {
            reference: reference.to_string(),
        });
    }
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| RegistryError::Invalid {
        what: what.to_string(),
        reason: format!("not a manifest: {e}"),
    })?;
    let media = probe.media_type.as_deref().or(content_type);
    if probe.schema_version == Some(1) || media.is_some_and(|m| m.starts_with(DOCKER_SCHEMA1)) {
        return Err(RegistryError::Schema1 {
            reference: reference.to_string(),
        });
    }
    if let Some(manifests) = probe.manifests {
        if let Some(m) = media.filter(|m| *m != OCI_INDEX && *m != DOCKER_LIST) {
            return Err(RegistryError::MediaType {
                what: what.to_string(),
                media_type: m.to_string(),
            });
        }
        return Ok(Parsed::Index(manifests));
    }
    let (Some(config), Some(layers)) = (probe.config, probe.layers) else {
        return Err(RegistryError::Invalid {
            what: what.to_string(),
            reason: "neither an image index nor an image manifest".into(),
        });
    };
    if let Some(m) = media.filter(|m| *m != OCI_MANIFEST && *m != DOCKER_MANIFEST) {
        return Err(RegistryError::MediaType {
            what: what.to_string(),
            media_type: m.to_string(),
        });
    }
    if let Some(t) = config.media_type.as_deref() {
        if !CONFIG_TYPES.contains(&t) {
            return Err(RegistryError::MediaType {
                what: format!("{what}: config {} (not a container image)", config.digest),
                media_type: t.to_string(),
            });
        }
    }
    for layer in &layers {
        layer_compression(layer, what)?;
    }
    Ok(Parsed::Manifest { config, layers })
}

/// How a layer is compressed, by its media type (none given: sniffed when unpacked).
pub(crate) fn layer_compression(
    layer: &Descriptor,
    what: &str,
) -> Result<Option<Compression>, RegistryError> {
    let Some(t) = layer.media_type.as_deref() else {
        return Ok(None);
    };
    LAYER_TYPES
        .iter()
        .find(|(m, _)| *m == t)
        .map(|(_, c)| Some(*c))
        .ok_or_else(|| RegistryError::MediaType {
            what: format!("{what}: layer {}", layer.digest),
            media_type: t.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn manifests_indexes_and_what_is_refused() {
        let m = format!(
            r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST}",
            "config":{{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"{D}","size":1}},
            "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"{D}","size":2}}]}}"#
        );
        match parse(m.as_bytes(), Some(DOCKER_MANIFEST), "r", "m").expect("manifest") {
            Parsed::Manifest { layers, .. } => {
                assert_eq!(
                    layer_compression(&layers[0], "m").expect("zstd"),
                    Some(Compression::Zstd)
                )
            }
            other => panic!("{other:?}"),
        }
        let idx = format!(
            r#"{{"schemaVersion":2,"manifests":[{{"digest":"{D}","size":3,"platform":{{"os":"linux","architecture":"arm64"}}}}]}}"#
        );
        assert!(
            matches!(parse(idx.as_bytes(), Some(OCI_INDEX), "r", "i"), Ok(Parsed::Index(v)) if v.len() == 1)
        );

        let v1 = br#"{"schemaVersion":1,"name":"x","tag":"1","fsLayers":[]}"#;
        let e = parse(
            v1,
            Some("application/vnd.docker.distribution.manifest.v1+prettyjws"),
            "reg/x:1",
            "m",
        )
        .expect_err("schema 1");
        assert!(e.to_string().contains("schema 1 is not supported"), "{e}");
        assert!(matches!(
            parse(v1, None, "r", "m"),
            Err(RegistryError::Schema1 { .. })
        ));

        let helm = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.cncf.helm.config.v1+json","digest":"{D}","size":1}},"layers":[]}}"#
        );
        let e = parse(helm.as_bytes(), Some(OCI_MANIFEST), "r", "m").expect_err("helm");
        assert!(e.to_string().contains("not a container image"), "{e}");
        let odd = format!(
            r#"{{"schemaVersion":2,"config":{{"digest":"{D}","size":1}},"layers":[{{"mediaType":"application/x-7z","digest":"{D}","size":1}}]}}"#
        );
        assert!(matches!(
            parse(odd.as_bytes(), None, "r", "m"),
            Err(RegistryError::MediaType { .. })
        ));
    }
}
