//! The node's platform in GOARCH terms, and picking the matching manifest out of an
//! image index.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;

/// `os/architecture[/variant]` as image indexes name platforms.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl Platform {
    /// The platform this binary was built for: ARMv7 gateways run `linux/arm/v7`.
    pub fn host() -> Self {
        let (architecture, variant) = if cfg!(target_arch = "x86_64") {
            ("amd64", None)
        } else if cfg!(target_arch = "aarch64") {
            ("arm64", None)
        } else if cfg!(target_arch = "arm") {
            ("arm", Some("v7"))
        } else if cfg!(target_arch = "x86") {
            ("386", None)
        } else if cfg!(target_arch = "riscv64") {
            ("riscv64", None)
        } else {
            (std::env::consts::ARCH, None)
        };
        Platform {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: variant.map(String::from),
        }
    }

    /// Reads `os/architecture[/variant]` (`linux/arm/v7`, `linux/arm64`).
    pub fn parse(s: &str) -> Result<Platform, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok =
            |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, variant] if ok(os) && ok(arch) && ok(variant) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: Some(variant.to_string()),
            }),
            _ => Err(format!(
                "platform {s:?}: expected OS/ARCH or OS/ARCH/VARIANT, like linux/arm64 or linux/arm/v7"
            )),
        }
    }

    /// How well an image built for `self` runs on `host`; None when it does not.
    /// An older ARM variant runs on a newer core, and no variant means the baseline.
    fn score(&self, host: &Platform) -> Option<u32> {
        if self.os != host.os || self.architecture != host.architecture {
            return None;
        }
        let level = |v: &Option<String>| {
            v.as_deref()
                .and_then(|v| v.strip_prefix('v'))
                .and_then(|n| n.parse::<u32>().ok())
        };
        match (&self.variant, &host.variant) {
            (a, b) if a == b => Some(100),
            (None, _) => Some(50),
            (Some(v), None) if self.architecture == "arm64" && v == "v8" => Some(100),
            _ => match (level(&self.variant), level(&host.variant)) {
                (Some(mine), Some(theirs)) if mine <= theirs => Some(mine),
                _ => None,
            },
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A content descriptor, read leniently: docker and OCI spell media types differently
/// and older tools omit fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: Option<String>,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub annotations: Option<HashMap<String, String>>,
    #[serde(default)]
    pub platform: Option<Platform>,
}

impl Descriptor {
    pub(crate) fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }

    /// buildx stores provenance as extra `unknown/unknown` manifests in the index.
    fn is_attestation(&self) -> bool {
        self.annotation("vnd.docker.reference.type") == Some("attestation-manifest")
            || self
                .platform
                .as_ref()
                .is_some_and(|p| p.os == "unknown" && p.architecture == "unknown")
    }
}

/// The best manifest for `host`, or the only real one when none names a platform
/// that matches.
pub(crate) fn choose<'a>(manifests: &'a [Descriptor], host: &Platform) -> Option<&'a Descriptor> {
    let best = manifests
        .iter()
        .filter(|d| !d.is_attestation())
        .filter_map(|d| Some((d.platform.as_ref()?.score(host)?, d)))
        .max_by_key(|(score, _)| *score)
        .map(|(_, d)| d);
    if best.is_some() {
        return best;
    }
    let mut real = manifests.iter().filter(|d| !d.is_attestation());
    match (real.next(), real.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

pub(crate) fn describe(manifests: &[Descriptor]) -> String {
    let names: Vec<String> = manifests
        .iter()
        .map(|d| match &d.platform {
            Some(p) => p.to_string(),
            None => "unspecified".into(),
        })
        .collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(p: &str, digest: &str) -> Descriptor {
        let mut parts = p.split('/');
        let platform = Platform {
            os: parts.next().unwrap_or_default().into(),
            architecture: parts.next().unwrap_or_default().into(),
            variant: parts.next().map(String::from),
        };
        Descriptor {
            media_type: None,
            digest: digest.into(),
            size: 1,
            annotations: None,
            platform: Some(platform),
        }
    }

    fn host(p: &str) -> Platform {
        desc(p, "").platform.expect("platform")
    }

    #[test]
    fn picks_the_node_platform() {
        let idx = vec![
            desc("linux/amd64", "a"),
            desc("linux/arm/v6", "v6"),
            desc("linux/arm/v7", "v7"),
            desc("linux/arm64/v8", "a64"),
            desc("unknown/unknown", "att"),
        ];
        let pick = |p: &str| choose(&idx, &host(p)).map(|d| d.digest.clone());
        assert_eq!(pick("linux/amd64").as_deref(), Some("a"));
        assert_eq!(pick("linux/arm/v7").as_deref(), Some("v7"));
        assert_eq!(pick("linux/arm/v6").as_deref(), Some("v6"));
        assert_eq!(pick("linux/arm64").as_deref(), Some("a64"));
        assert_eq!(pick("linux/riscv64"), None);
    }

    #[test]
    fn older_arm_variant_runs_on_v7_and_only_manifest_is_the_fallback() {
        let idx = vec![desc("linux/arm/v6", "v6"), desc("linux/amd64", "a")];
        let got = choose(&idx, &host("linux/arm/v7")).map(|d| d.digest.as_str());
        assert_eq!(got, Some("v6"));
        let only = vec![desc("linux/s390x", "s"), desc("unknown/unknown", "att")];
        let got = choose(&only, &host("linux/arm64")).map(|d| d.digest.as_str());
        assert_eq!(got, Some("s"));
        assert_eq!(describe(&only), "linux/s390x, unknown/unknown");
    }

    #[test]
    fn platforms_parse() {
        assert_eq!(
            Platform::parse("linux/arm/v7").expect("v7").to_string(),
            "linux/arm/v7"
        );
        assert_eq!(Platform::parse("linux/arm64").expect("arm64").variant, None);
        assert!(Platform::parse("linux").is_err());
        assert!(Platform::parse("linux//v7").is_err());
    }

    #[test]
    fn host_platform_is_linux() {
        assert_eq!(Platform::host().os, "linux");
    }
}
