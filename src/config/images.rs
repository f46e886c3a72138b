//! The config keys about images: the kubelet's image GC thresholds and ages and pull
//! parallelism (`imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`,
//! `imageMinimumGCAge`, `imageMaximumGCAge`, `serializeImagePulls`,
//! `maxParallelImagePulls`), and holdfast's own under `holdfast:`: where registry
//! credentials are (`dockerConfig`), registry mirrors (`registries`, modelled on
//! containerd's hosts.toml), the offline fallback, the layer download limit, the pull
//! back-off and the images GC never removes (`pinnedImages`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::Value;

use super::duration::go_duration;
use super::reader::{short, type_name, Reader};
use super::ConfigError;
use crate::image::registry::{Capability, EndpointConfig, RegistryConfig, RegistryHosts};

/// What the file sets about images; `None` where it is silent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileImages {
    pub gc_high: Option<u8>,
    pub gc_low: Option<u8>,
    pub minimum_gc_age: Option<Duration>,
    pub maximum_gc_age: Option<Duration>,
    pub serialize_pulls: Option<bool>,
    pub max_parallel_pulls: Option<u32>,
    pub docker_config: Option<PathBuf>,
    pub registries: Option<RegistryHosts>,
    pub offline_fallback: Option<bool>,
    pub max_parallel_layer_downloads: Option<u32>,
    pub pull_backoff_initial: Option<Duration>,
    pub pull_backoff_max: Option<Duration>,
    pub pinned_images: Option<Vec<String>>,
}

impl FileImages {
    /// This file's settings, with what it leaves unset taken from a board profile.
    pub(super) fn or(self, profile: FileImages) -> FileImages {
        FileImages {
            gc_high: self.gc_high.or(profile.gc_high),
            gc_low: self.gc_low.or(profile.gc_low),
            minimum_gc_age: self.minimum_gc_age.or(profile.minimum_gc_age),
            maximum_gc_age: self.maximum_gc_age.or(profile.maximum_gc_age),
            serialize_pulls: self.serialize_pulls.or(profile.serialize_pulls),
            max_parallel_pulls: self.max_parallel_pulls.or(profile.max_parallel_pulls),
            docker_config: self.docker_config.or(profile.docker_config),
            registries: self.registries.or(profile.registries),
            offline_fallback: self.offline_fallback.or(profile.offline_fallback),
            max_parallel_layer_downloads: self
                .max_parallel_layer_downloads
                .or(profile.max_parallel_layer_downloads),
            pull_backoff_initial: self.pull_backoff_initial.or(profile.pull_backoff_initial),
            pull_backoff_max: self.pull_backoff_max.or(profile.pull_backoff_max),
            pinned_images: self.pinned_images.or(profile.pinned_images),
        }
    }
}

/// Image settings after the merge, with the kubelet's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageConfig {
    /// `imageGCHighThresholdPercent`, default 85.
    pub gc_high_percent: u8,
    /// `imageGCLowThresholdPercent`, default 80.
    pub gc_low_percent: u8,
    /// `imageMinimumGCAge`, default 2 min: an image used more recently is kept.
    pub minimum_gc_age: Duration,
    /// `imageMaximumGCAge`, default 0 (off): an image no pod uses and unused for
    /// longer goes whatever the disk.
    pub maximum_gc_age: Duration,
    /// How many images are pulled at once: 1 when `serializeImagePulls` (the default),
    /// else `maxParallelImagePulls` (unbounded when unset, as with the kubelet; here 8).
    pub max_parallel_pulls: u32,
    /// `holdfast.dockerConfig`: the only credentials file when set; otherwise the
    /// kubelet's search order in `docker_config_search`.
    pub docker_config: Option<PathBuf>,
    /// Where the kubelet looks for `config.json` and `.dockercfg`, in order.
    pub docker_config_search: Vec<PathBuf>,
    /// `holdfast.registries`.
    pub registries: RegistryHosts,
    /// `holdfast.imagePullOfflineFallback`, default true: policy `Always` runs the image
    /// that is here when the registry cannot be reached.
    pub offline_fallback: bool,
    /// `holdfast.maxParallelLayerDownloads`, default 2, across all pulls.
    pub max_parallel_layer_downloads: u32,
    /// `holdfast.imagePullBackOffInitial` (10 s) doubling to `imagePullBackOffMax` (5 min).
    pub pull_backoff_initial: Duration,
    pub pull_backoff_max: Duration,
    /// `holdfast.pinnedImages`: references GC and `image prune` never remove.
    pub pinned_images: Vec<String>,
}

/// `imageMinimumGCAge`'s default, the kubelet's.
const MINIMUM_GC_AGE: Duration = Duration::from_secs(120);

/// Parallel pulls allowed when `serializeImagePulls: false` leaves the number open.
const UNBOUNDED_PULLS: u32 = 8;

impl ImageConfig {
    /// Merges `file` over the defaults; `root_dir` anchors the kubelet's first place to
    /// look for credentials, `home` and `cwd` the others.
    pub fn merge(
        file: &FileImages,
        root_dir: &Path,
        home: Option<&Path>,
        cwd: Option<&Path>,
    ) -> ImageConfig {
        let serialize = file.serialize_pulls.unwrap_or(true);
        let max_parallel_pulls = if serialize {
            1
        } else {
            file.max_parallel_pulls.unwrap_or(UNBOUNDED_PULLS)
        };
        let mut search = vec![root_dir.join("config.json")];
        search.extend(cwd.map(|d| d.join("config.json")));
        search.extend(home.map(|h| h.join(".docker/config.json")));
        search.push(PathBuf::from("/.docker/config.json"));
        search.push(root_dir.join(".dockercfg"));
        search.extend(cwd.map(|d| d.join(".dockercfg")));
        search.extend(home.map(|h| h.join(".dockercfg")));
        search.push(PathBuf::from("/.dockercfg"));
        ImageConfig {
            gc_high_percent: file.gc_high.unwrap_or(85),
            gc_low_percent: file.gc_low.unwrap_or(80),
            minimum_gc_age: file.minimum_gc_age.unwrap_or(MINIMUM_GC_AGE),
            maximum_gc_age: file.maximum_gc_age.unwrap_or(Duration::ZERO),
            max_parallel_pulls,
            docker_config: file.docker_config.clone(),
            docker_config_search: search,
            registries: file.registries.clone().unwrap_or_default(),
            offline_fallback: file.offline_fallback.unwrap_or(true),
            max_parallel_layer_downloads: file.max_parallel_layer_downloads.unwrap_or(2),
            pull_backoff_initial: file.pull_backoff_initial.unwrap_or(Duration::from_secs(10)),
            pull_backoff_max: file.pull_backoff_max.unwrap_or(Duration::from_secs(300)),
            pinned_images: file.pinned_images.clone().unwrap_or_default(),
        }
    }

    /// Merged with the kubelet's search order seen from this process (its `$HOME` and
    /// working directory), for a root dir given on the command line.
    pub fn for_root(file: &FileImages, root_dir: &Path) -> ImageConfig {
        ImageConfig::merge(
            file,
            root_dir,
            home_dir().as_deref(),
            std::env::current_dir().ok().as_deref(),
        )
    }

    /// The node's credentials: `dockerConfig` if set (it must be readable), else the
    /// first file of the kubelet's search order.
    pub fn node_keyring(&self) -> Result<crate::image::registry::Keyring, String> {
        match &self.docker_config {
            Some(path) => crate::image::registry::Keyring::load(path),
            None => crate::image::registry::Keyring::load_first(&self.docker_config_search),
        }
    }
}

/// `$HOME`, where the kubelet also looks for credentials. The config module is the
/// only reader of the environment.
pub(super) fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Checks that only the file can see (the two thresholds together, the two ages
/// together, the pull limits).
pub(super) fn check(reader: &Reader<'_>, images: &FileImages) -> Result<(), ConfigError> {
    let minimum = images.minimum_gc_age.unwrap_or(MINIMUM_GC_AGE);
    if let Some(maximum) = images.maximum_gc_age.filter(|m| !m.is_zero()) {
        if maximum <= minimum {
            return Err(reader.err(
                "imageMaximumGCAge",
                format!(
                    "imageMaximumGCAge {} must be greater than imageMinimumGCAge {}",
                    go_duration(maximum),
                    go_duration(minimum)
                ),
            ));
        }
    }
    if let (Some(high), Some(low)) = (images.gc_high, images.gc_low) {
        if low >= high {
            return Err(reader.err(
                "imageGCLowThresholdPercent",
                format!("must be less than imageGCHighThresholdPercent ({low} >= {high})"),
            ));
        }
    }
    if images.serialize_pulls != Some(false) && images.max_parallel_pulls.is_some_and(|n| n > 1) {
        return Err(reader.err(
            "maxParallelImagePulls",
            "must be 1 when serializeImagePulls is true (its default); set serializeImagePulls: false".into(),
        ));
    }
    if let (Some(initial), Some(max)) = (images.pull_backoff_initial, images.pull_backoff_max) {
        if initial > max {
            return Err(reader.err(
                "holdfast.imagePullBackOffInitial",
                format!("must not exceed holdfast.imagePullBackOffMax ({initial:?} > {max:?})"),
            ));
        }
    }
    Ok(())
}

impl Reader<'_> {
    /// Reads a top-level image key into `out`; false if `key` is not one.
    pub(super) fn image_key(
        &self,
        key: &str,
        value: &Value,
        i: &mut FileImages,
    ) -> Result<bool, ConfigError> {
        match key {
            "imageGCHighThresholdPercent" => i.gc_high = Some(self.percent(key, value)?),
            "imageGCLowThresholdPercent" => i.gc_low = Some(self.percent(key, value)?),
            "imageMinimumGCAge" => i.minimum_gc_age = Some(self.positive_duration(key, value)?),
            "imageMaximumGCAge" => i.maximum_gc_age = Some(self.duration_or_zero(key, value)?),
            "serializeImagePulls" => i.serialize_pulls = Some(self.boolean(key, value)?),
            "maxParallelImagePulls" => {
                i.max_parallel_pulls = Some(self.count(key, value, 1, 64)?);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Reads a `holdfast.` image key into `out`; false if `key` is not one.
    pub(super) fn image_holdfast_key(
        &self,
        key: &str,
        value: &Value,
        base: &Path,
        i: &mut FileImages,
    ) -> Result<bool, ConfigError> {
        match key {
            "holdfast.dockerConfig" => i.docker_config = Some(base.join(self.path(key, value)?)),
            "holdfast.registries" => i.registries = Some(self.registries(key, value, base)?),
            "holdfast.imagePullOfflineFallback" => {
                i.offline_fallback = Some(self.boolean(key, value)?)
            }
            "holdfast.maxParallelLayerDownloads" => {
                i.max_parallel_layer_downloads = Some(self.count(key, value, 1, 16)?);
            }
            "holdfast.imagePullBackOffInitial" => {
                i.pull_backoff_initial = Some(self.positive_duration(key, value)?);
            }
            "holdfast.imagePullBackOffMax" => {
                i.pull_backoff_max = Some(self.positive_duration(key, value)?);
            }
            "holdfast.pinnedImages" => i.pinned_images = Some(self.references(key, value)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A list of image references (`repo:tag`, `repo@sha256:..`, or a manifest digest).
    fn references(&self, key: &str, value: &Value) -> Result<Vec<String>, ConfigError> {
        let list = match value {
            Value::Null => return Ok(Vec::new()),
            Value::Sequence(list) => list,
            other => {
                return Err(self.err(
                    key,
                    format!(
                        "expected a list of image references, got {}",
                        type_name(other)
                    ),
                ))
            }
        };
        let mut out = Vec::new();
        for (n, v) in list.iter().enumerate() {
            let at = format!("{key}[{n}]");
            let s = self.string(&at, v)?;
            if !crate::image::reference::is_digest(&s) {
                crate::image::Reference::parse(&s).map_err(|e| self.err(&at, e.to_string()))?;
            }
            out.push(s);
        }
        Ok(out)
    }

    fn percent(&self, key: &str, value: &Value) -> Result<u8, ConfigError> {
        Ok(self.count(key, value, 0, 100)? as u8)
    }

    fn count(&self, key: &str, value: &Value, min: u32, max: u32) -> Result<u32, ConfigError> {
        match value {
            Value::Number(n) => match n.as_u64() {
                Some(v) if (u64::from(min)..=u64::from(max)).contains(&v) => Ok(v as u32),
                _ => Err(self.err(
                    key,
                    format!("expected an integer from {min} to {max}, got {n}"),
                )),
            },
            other => Err(self.err(
                key,
                format!(
                    "expected an integer from {min} to {max}, got {} {}",
                    type_name(other),
                    short(other)
                ),
            )),
        }
    }

    fn boolean(&self, key: &str, value: &Value) -> Result<bool, ConfigError> {
        match value {
            Value::Bool(b) => Ok(*b),
            other => Err(self.err(
                key,
                format!(
                    "expected true or false, got {} {}",
                    type_name(other),
                    short(other)
                ),
            )),
        }
    }

    fn path(&self, key: &str, value: &Value) -> Result<PathBuf, ConfigError> {
        let s = self.string(key, value)?;
        if s.is_empty() {
            return Err(self.err(key, "expected a path, got an empty string".into()));
        }
        Ok(PathBuf::from(s))
    }

    fn registries(
        &self,
        key: &str,
        value: &Value,
        base: &Path,
    ) -> Result<RegistryHosts, ConfigError> {
        let mut hosts = RegistryHosts::default();
        if matches!(value, Value::Null) {
            return Ok(hosts);
        }
        for (name, section) in self.mapping(key, value)? {
            let name = match name {
                Value::String(s) => s.clone(),
                other => {
                    return Err(self.err(
                        key,
                        format!("registry names are strings, got {}", short(other)),
                    ))
                }
            };
            let here = format!("{key}.{name}");
            crate::image::Reference::parse(&format!("{name}/x"))
                .ok()
                .filter(|r| r.domain == name)
                .ok_or_else(|| {
                    self.err(
                        &here,
                        "not a registry name like docker.io or registry.local:5000".into(),
                    )
                })?;
            let mut reg = RegistryConfig::default();
            for (field, v) in self.mapping(&here, section)? {
                let field = match field {
                    Value::String(s) => s.as_str(),
                    _ => return Err(self.err(&here, "keys must be strings".into())),
                };
                let at = format!("{here}.{field}");
                let unknown = || {
                    self.err(
                        &at,
                        format!("unknown key {field:?} (server, caFile, clientCert, clientKey, mirrors)"),
                    )
                };
                if !super::keys::known(&format!("{key}.*.{field}")) {
                    return Err(unknown());
                }
                match field {
                    "server" => {
                        let s = self.string(&at, v)?;
                        if !s.starts_with("https://") {
                            return Err(
                                self.err(&at, format!("expected an https:// URL, got {s:?}"))
                            );
                        }
                        reg.server = Some(s);
                    }
                    "caFile" => reg.ca_file = Some(base.join(self.path(&at, v)?)),
                    "clientCert" => reg.client_cert = Some(base.join(self.path(&at, v)?)),
                    "clientKey" => reg.client_key = Some(base.join(self.path(&at, v)?)),
                    "mirrors" => {
                        let Value::Sequence(list) = v else {
                            return Err(
                                self.err(&at, format!("expected a list, got {}", type_name(v)))
                            );
                        };
                        for (n, m) in list.iter().enumerate() {
                            reg.mirrors
                                .push(self.mirror(&format!("{at}[{n}]"), m, base)?);
                        }
                    }
                    _ => return Err(unknown()),
                }
            }
            if reg.client_cert.is_some() != reg.client_key.is_some() {
                return Err(self.err(&here, "clientCert and clientKey go together".into()));
            }
            hosts.registries.insert(name, reg);
        }
        Ok(hosts)
    }

    fn mirror(&self, at: &str, value: &Value, base: &Path) -> Result<EndpointConfig, ConfigError> {
        let mut m = EndpointConfig::default();
        for (field, v) in self.mapping(at, value)? {
            let field = match field {
                Value::String(s) => s.as_str(),
                _ => return Err(self.err(at, "keys must be strings".into())),
            };
            let here = format!("{at}.{field}");
            let unknown = || {
                self.err(
                    &here,
                    format!("unknown key {field:?} (host, capabilities, caFile, clientCert, clientKey, plainHTTP, skipVerify)"),
                )
            };
            if !super::keys::known(&format!("holdfast.registries.*.mirrors[].{field}")) {
                return Err(unknown());
            }
            match field {
                "host" => m.host = self.string(&here, v)?,
                "capabilities" => {
                    let Value::Sequence(list) = v else {
                        return Err(self.err(&here, "expected a list like [pull, resolve]".into()));
                    };
                    for c in list {
                        let s = self.string(&here, c)?;
                        let cap = Capability::parse(&s).ok_or_else(|| {
                            self.err(&here, format!("unknown capability {s:?} (pull, resolve)"))
                        })?;
                        m.capabilities.push(cap);
                    }
                }
                "caFile" => m.ca_file = Some(base.join(self.path(&here, v)?)),
                "clientCert" => m.client_cert = Some(base.join(self.path(&here, v)?)),
                "clientKey" => m.client_key = Some(base.join(self.path(&here, v)?)),
                "plainHTTP" => m.plain_http = self.boolean(&here, v)?,
                "skipVerify" => m.skip_verify = self.boolean(&here, v)?,
                _ => return Err(unknown()),
            }
        }
        if m.host.is_empty() {
            return Err(self.err(at, "a mirror needs a host".into()));
        }
        m.check().map_err(|reason| self.err(at, reason))?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_config, ConfigError, FileConfig};

    fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        parse_config(Path::new("/etc/holdfast/config.yaml"), text).map(|(c, w)| {
            assert!(w.is_empty(), "{w:?}");
            c
        })
    }

    fn key_err(text: &str) -> (String, String) {
        match parse(text) {
            Err(ConfigError::Key { key, reason, .. }) => (key, reason),
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    #[test]
    fn every_image_key() {
        let cfg = parse(
            "imageGCHighThresholdPercent: 90
imageGCLowThresholdPercent: 70
imageMinimumGCAge: 5m
imageMaximumGCAge: 168h
serializeImagePulls: false
maxParallelImagePulls: 3
holdfast:
  dockerConfig: creds/config.json
  imagePullOfflineFallback: false
  maxParallelLayerDownloads: 4
  imagePullBackOffInitial: 1s
  imagePullBackOffMax: 8s
  pinnedImages:
    - busybox:1.36
    - registry.local:5000/site/app@sha256:0123456789012345678901234567890123456789012345678901234567890123
  registries:
    docker.io:
      mirrors:
        - host: https://mirror.site:5000
          caFile: site-ca.crt
        - host: cache.local:5000
          plainHTTP: true
          capabilities: [pull]
    registry.local:5000:
      caFile: /etc/ssl/reg.crt
",
        )
        .expect("parse");
        let i = &cfg.images;
        assert_eq!((i.gc_high, i.gc_low), (Some(90), Some(70)));
        assert_eq!(i.minimum_gc_age, Some(Duration::from_secs(300)));
        assert_eq!(i.maximum_gc_age, Some(Duration::from_secs(168 * 3600)));
        assert_eq!(i.pinned_images.as_ref().map(Vec::len), Some(2));
        assert_eq!(
            (i.serialize_pulls, i.max_parallel_pulls),
            (Some(false), Some(3))
        );
        assert_eq!(
            i.docker_config,
            Some(PathBuf::from("/etc/holdfast/creds/config.json"))
        );
        assert_eq!(i.offline_fallback, Some(false));
        let hosts = i.registries.clone().expect("registries");
        let hub = &hosts.registries["docker.io"];
        assert_eq!(hub.mirrors.len(), 2);
        assert_eq!(
            hub.mirrors[0].ca_file,
            Some(PathBuf::from("/etc/holdfast/site-ca.crt"))
        );
        assert!(hub.mirrors[1].plain_http);
        let merged = ImageConfig::merge(
            i,
            Path::new("/var/lib/holdfast"),
            Some(Path::new("/root")),
            None,
        );
        assert_eq!(merged.max_parallel_pulls, 3);
        assert_eq!(merged.max_parallel_layer_downloads, 4);
        assert_eq!(merged.pull_backoff_max, Duration::from_secs(8));
        assert_eq!(merged.maximum_gc_age, Duration::from_secs(168 * 3600));
        assert_eq!(merged.pinned_images[0], "busybox:1.36");
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let c = ImageConfig::merge(
            &FileImages::default(),
            Path::new("/r"),
            Some(Path::new("/home/u")),
            Some(Path::new("/w")),
        );
        assert_eq!((c.gc_high_percent, c.gc_low_percent), (85, 80));
        assert_eq!(c.minimum_gc_age, Duration::from_secs(120));
        assert_eq!(c.maximum_gc_age, Duration::ZERO);
        assert!(c.pinned_images.is_empty());
        assert_eq!(c.max_parallel_pulls, 1);
        assert!(c.offline_fallback);
        assert_eq!(c.max_parallel_layer_downloads, 2);
        assert_eq!(c.pull_backoff_initial, Duration::from_secs(10));
        assert_eq!(c.pull_backoff_max, Duration::from_secs(300));
        assert_eq!(
            c.docker_config_search[..4],
            [
                PathBuf::from("/r/config.json"),
                PathBuf::from("/w/config.json"),
                PathBuf::from("/home/u/.docker/config.json"),
                PathBuf::from("/.docker/config.json"),
            ]
        );
    }

    #[test]
    fn wrong_values_name_their_key() {
        assert_eq!(
            key_err("imageGCHighThresholdPercent: 101\n").0,
            "imageGCHighThresholdPercent"
        );
        assert_eq!(
            key_err("imageGCHighThresholdPercent: high\n").0,
            "imageGCHighThresholdPercent"
        );
        let (k, r) = key_err("imageGCHighThresholdPercent: 80\nimageGCLowThresholdPercent: 80\n");
        assert_eq!(k, "imageGCLowThresholdPercent");
        assert!(r.contains("less than"), "{r}");
        assert_eq!(
            key_err("maxParallelImagePulls: 4\n").0,
            "maxParallelImagePulls"
        );
        assert_eq!(
            key_err("serializeImagePulls: yes please\n").0,
            "serializeImagePulls"
        );
        assert_eq!(
            key_err("holdfast:\n  maxParallelLayerDownloads: 0\n").0,
            "holdfast.maxParallelLayerDownloads"
        );
        let (k, r) = key_err("holdfast:\n  registries:\n    docker.io:\n      mirrors:\n        - host: cache:5000\n          plainHTTP: true\n");
        assert_eq!(k, "holdfast.registries.docker.io.mirrors[0]");
        assert!(r.contains("capabilities [pull]"), "{r}");
        let (k, _) = key_err("holdfast:\n  registries:\n    docker.io:\n      mirrors:\n        - host: m\n          capabilities: [push]\n");
        assert_eq!(k, "holdfast.registries.docker.io.mirrors[0].capabilities");
        let (k, _) = key_err("holdfast:\n  registries:\n    Bad Name: {}\n");
        assert_eq!(k, "holdfast.registries.Bad Name");
        let (k, _) = key_err("holdfast:\n  registries:\n    docker.io:\n      server: http://x\n");
        assert_eq!(k, "holdfast.registries.docker.io.server");
    }

    #[test]
    fn the_maximum_age_is_off_at_zero_and_must_pass_the_minimum() {
        let cfg = parse("imageMaximumGCAge: \"0\"\n").expect("zero is off");
        assert_eq!(cfg.images.maximum_gc_age, Some(Duration::ZERO));
        // Against the minimum's default (2m), as the kubelet checks it.
        let (k, r) = key_err("imageMaximumGCAge: 90s\n");
        assert_eq!(k, "imageMaximumGCAge");
        assert!(
            r.contains("imageMaximumGCAge 1m30s must be greater than imageMinimumGCAge 2m0s"),
            "{r}"
        );
        let (_, r) = key_err("imageMinimumGCAge: 10s\nimageMaximumGCAge: 10s\n");
        assert!(
            r.contains("10s must be greater than imageMinimumGCAge 10s"),
            "{r}"
        );
        let cfg = parse("imageMinimumGCAge: 1s\nimageMaximumGCAge: 4s\n").expect("parse");
        assert_eq!(cfg.images.maximum_gc_age, Some(Duration::from_secs(4)));
        assert_eq!(key_err("imageMaximumGCAge: -1s\n").0, "imageMaximumGCAge");
        let (k, _) = key_err("holdfast:\n  pinnedImages: [\"Not A Reference\"]\n");
        assert_eq!(k, "holdfast.pinnedImages[0]");
        assert_eq!(
            key_err("holdfast:\n  pinnedImages: busybox\n").0,
            "holdfast.pinnedImages"
        );
    }
}
