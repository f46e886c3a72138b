//! A small OCI image builder for tests and examples: image layouts (directory or tar)
//! and `docker save` tars from in-memory layers, including layers with hostile entry
//! names that well-behaved tar writers refuse to produce.
//!
//! It uses only std, tar, flate2, ruzstd, sha2 and serde_json.
#![allow(dead_code)]

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const MEDIA_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// One entry of a layer. Paths are written into the tar header as given.
#[derive(Debug, Clone)]
pub enum Entry {
    File {
        path: String,
        content: Vec<u8>,
        mode: u32,
    },
    Dir {
        path: String,
        mode: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
    Hardlink {
        path: String,
        target: String,
    },
    /// A character (or block) device node.
    Device {
        path: String,
        block: bool,
        major: u32,
        minor: u32,
        mode: u32,
    },
    /// Anything at all, for hostile layers: name and link name are raw bytes.
    Raw {
        path: Vec<u8>,
        kind: tar::EntryType,
        content: Vec<u8>,
        link: Vec<u8>,
        mode: u32,
    },
}

impl Entry {
    pub fn file(path: &str, content: &[u8], mode: u32) -> Self {
        Entry::File {
            path: path.into(),
            content: content.to_vec(),
            mode,
        }
    }
    pub fn dir(path: &str, mode: u32) -> Self {
        Entry::Dir {
            path: path.into(),
            mode,
        }
    }
    pub fn symlink(path: &str, target: &str) -> Self {
        Entry::Symlink {
            path: path.into(),
            target: target.into(),
        }
    }
    pub fn hardlink(path: &str, target: &str) -> Self {
        Entry::Hardlink {
            path: path.into(),
            target: target.into(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Layer {
    pub entries: Vec<Entry>,
    pub gzip: bool,
    pub zstd: bool,
}

impl Layer {
    pub fn new(entries: Vec<Entry>) -> Self {
        Layer {
            entries,
            gzip: false,
            zstd: false,
        }
    }
    pub fn gzipped(mut self) -> Self {
        self.gzip = true;
        self
    }
    pub fn zstd(mut self) -> Self {
        self.zstd = true;
        self
    }
}

#[derive(Debug, Clone, Default)]
pub struct Config {
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Image {
    pub layers: Vec<Layer>,
    pub config: Config,
    /// Stored as the `org.opencontainers.image.ref.name` annotation.
    pub ref_name: Option<String>,
    /// Put the manifest in a nested index beside a manifest for another platform.
    pub nested_index: bool,
}

/// Digests of what was written.
#[derive(Debug, Clone)]
pub struct Built {
    pub manifest_digest: String,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
    pub diff_ids: Vec<String>,
}

pub fn sha256(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

pub fn hex(digest: &str) -> &str {
    digest.trim_start_matches("sha256:")
}

/// The architecture images are built for, and the busybox binary they carry, when not the
/// host's: set once, before any image is built (the VM test builds images for its guest).
static TARGET: std::sync::OnceLock<(&'static str, Option<&'static str>, PathBuf)> =
    std::sync::OnceLock::new();

/// Build images for `arch` (GOARCH, with `variant` for arm) holding `busybox` (a static
/// busybox of that architecture) instead of the host's. False if already set.
pub fn set_target(arch: &'static str, variant: Option<&'static str>, busybox: PathBuf) -> bool {
    TARGET.set((arch, variant, busybox)).is_ok()
}

/// The architecture images are built for in GOARCH terms: the host's unless `set_target`.
pub fn goarch() -> (&'static str, Option<&'static str>) {
    if let Some((arch, variant, _)) = TARGET.get() {
        return (arch, *variant);
    }
    match std::env::consts::ARCH {
        "x86_64" => ("amd64", None),
        "aarch64" => ("arm64", None),
        "arm" => ("arm", Some("v7")),
        other => (other, None),
    }
}

/// The uncompressed tar of a layer, headers written by hand so any name goes in.
pub fn layer_tar(layer: &Layer) -> io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for e in &layer.entries {
        let (path, kind, content, link, mode): (&[u8], tar::EntryType, &[u8], &[u8], u32) = match e
        {
            Entry::File {
                path,
                content,
                mode,
            } => (
                path.as_bytes(),
                tar::EntryType::Regular,
                content,
                b"",
                *mode,
            ),
            Entry::Dir { path, mode } => {
                (path.as_bytes(), tar::EntryType::Directory, b"", b"", *mode)
            }
            Entry::Symlink { path, target } => (
                path.as_bytes(),
                tar::EntryType::Symlink,
                b"",
                target.as_bytes(),
                0o777,
            ),
            Entry::Hardlink { path, target } => (
                path.as_bytes(),
                tar::EntryType::Link,
                b"",
                target.as_bytes(),
                0o644,
            ),
            Entry::Device {
                path, block, mode, ..
            } => {
                let kind = if *block {
                    tar::EntryType::Block
                } else {
                    tar::EntryType::Char
                };
                (path.as_bytes(), kind, b"", b"", *mode)
            }
            Entry::Raw {
                path,
                kind,
                content,
                link,
                mode,
            } => (path, *kind, content, link, *mode),
        };
        let mut h = tar::Header::new_gnu();
        if let Entry::Device { major, minor, .. } = e {
            h.set_device_major(*major)?;
            h.set_device_minor(*minor)?;
        }
        h.set_entry_type(kind);
        h.set_size(content.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        if path.len() <= 100 && link.len() <= 100 {
            let old = h.as_old_mut();
            old.name[..path.len()].copy_from_slice(path);
            old.linkname[..link.len()].copy_from_slice(link);
            h.set_cksum();
            b.append(&h, content)?;
        } else if kind == tar::EntryType::Symlink || kind == tar::EntryType::Link {
            b.append_link(
                &mut h,
                String::from_utf8_lossy(path).as_ref(),
                String::from_utf8_lossy(link).as_ref(),
            )?;
        } else {
            b.append_data(&mut h, String::from_utf8_lossy(path).as_ref(), content)?;
        }
    }
    b.into_inner()
}

fn gzip(bytes: &[u8]) -> io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes)?;
    gz.finish()
}

fn config_json(config: &Config, diff_ids: &[String]) -> Value {
    let (arch, variant) = goarch();
    let mut c = serde_json::Map::new();
    if let Some(v) = &config.entrypoint {
        c.insert("Entrypoint".into(), json!(v));
    }
    if let Some(v) = &config.cmd {
        c.insert("Cmd".into(), json!(v));
    }
    if !config.env.is_empty() {
        c.insert("Env".into(), json!(config.env));
    }
    if let Some(v) = &config.working_dir {
        c.insert("WorkingDir".into(), json!(v));
    }
    if let Some(v) = &config.user {
        c.insert("User".into(), json!(v));
    }
    let mut out = json!({
        "architecture": arch,
        "os": "linux",
        "config": c,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    if let Some(v) = variant {
        out["variant"] = json!(v);
    }
    out
}

fn platform_json() -> Value {
    let (arch, variant) = goarch();
    let mut p = json!({"os": "linux", "architecture": arch});
    if let Some(v) = variant {
        p["variant"] = json!(v);
    }
    p
}

/// Files of an archive: (path inside it, bytes).
pub type Files = Vec<(String, Vec<u8>)>;

/// Every file of an OCI layout.
pub fn layout_files(image: &Image) -> io::Result<(Files, Built)> {
    let mut files = Vec::new();
    let mut blob = |bytes: Vec<u8>| {
        let digest = sha256(&bytes);
        let size = bytes.len();
        files.push((format!("blobs/sha256/{}", hex(&digest)), bytes));
        (digest, size)
    };
    let mut layer_descs = Vec::new();
    let mut layer_digests = Vec::new();
    let mut diff_ids = Vec::new();
    for layer in &image.layers {
        let plain = layer_tar(layer)?;
        diff_ids.push(sha256(&plain));
        let (bytes, media) = if layer.zstd {
            let z = ruzstd::encoding::compress_to_vec(
                plain.as_slice(),
                ruzstd::encoding::CompressionLevel::Fastest,
            );
            (z, MEDIA_LAYER_ZSTD)
        } else if layer.gzip {
            (gzip(&plain)?, MEDIA_LAYER_GZIP)
        } else {
            (plain, MEDIA_LAYER)
        };
        let (digest, size) = blob(bytes);
        layer_descs.push(json!({"mediaType": media, "digest": digest, "size": size}));
        layer_digests.push(digest);
    }
    let config = serde_json::to_vec(&config_json(&image.config, &diff_ids))?;
    let (config_digest, config_size) = blob(config);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
        "layers": layer_descs,
    });
    let (manifest_digest, manifest_size) = blob(serde_json::to_vec(&manifest)?);
    let mut top = json!({
        "mediaType": MEDIA_MANIFEST,
        "digest": manifest_digest,
        "size": manifest_size,
        "platform": platform_json(),
    });
    if image.nested_index {
        let other = json!({
            "mediaType": MEDIA_MANIFEST,
            "digest": sha256(b"a manifest for another platform, never fetched"),
            "size": 1,
            "platform": {"os": "linux", "architecture": "s390x"},
        });
        let nested =
            json!({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [other, top]});
        let (digest, size) = blob(serde_json::to_vec(&nested)?);
        top = json!({"mediaType": MEDIA_INDEX, "digest": digest, "size": size});
    }
    if let Some(name) = &image.ref_name {
        top["annotations"] = json!({ REF_NAME: name });
    }
    let index = json!({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [top]});
    files.push(("index.json".into(), serde_json::to_vec(&index)?));
    files.push((
        "oci-layout".into(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    ));
    Ok((
        files,
        Built {
            manifest_digest,
            config_digest,
            layer_digests,
            diff_ids,
        },
    ))
}

fn write_tar(path: &Path, files: &[(String, Vec<u8>)]) -> io::Result<()> {
    let mut b = tar::Builder::new(fs::File::create(path)?);
    for (name, bytes) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, name, bytes.as_slice())?;
    }
    b.into_inner()?.sync_all()
}

impl Image {
    pub fn write_layout_dir(&self, dir: &Path) -> io::Result<Built> {
        let (files, built) = layout_files(self)?;
        for (name, bytes) in files {
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(path, bytes)?;
        }
        Ok(built)
    }

    pub fn write_layout_tar(&self, path: &Path) -> io::Result<Built> {
        let (files, built) = layout_files(self)?;
        write_tar(path, &files)?;
        Ok(built)
    }

    /// A `docker save` archive in the classic shape: `<n>/layer.tar` (uncompressed),
    /// `<config hex>.json` and a manifest.json naming them.
    pub fn write_docker_save(&self, path: &Path, repo_tags: &[&str]) -> io::Result<Built> {
        let mut files = Vec::new();
        let mut diff_ids = Vec::new();
        let mut layer_paths = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let plain = layer_tar(layer)?;
            diff_ids.push(sha256(&plain));
            let name = format!("{i:064x}/layer.tar");
            layer_paths.push(name.clone());
            files.push((name, plain));
        }
        let config = serde_json::to_vec(&config_json(&self.config, &diff_ids))?;
        let config_digest = sha256(&config);
        let config_name = format!("{}.json", hex(&config_digest));
        files.push((config_name.clone(), config));
        let manifest =
            json!([{"Config": config_name, "RepoTags": repo_tags, "Layers": layer_paths}]);
        files.push(("manifest.json".into(), serde_json::to_vec(&manifest)?));
        write_tar(path, &files)?;
        Ok(Built {
            manifest_digest: String::new(),
            config_digest,
            layer_digests: diff_ids.clone(),
            diff_ids,
        })
    }
}

/// A layer holding the host's static busybox with a symlink in /bin for every applet,
/// the usual top-level directories, and a passwd/group with root and nobody.
pub fn busybox_layer() -> io::Result<Layer> {
    // The applet list comes from the host's busybox (the same Debian package, so the same
    // list), which runs here whatever the target architecture is.
    let busybox = Path::new("/bin/busybox");
    let binary_path = TARGET.get().map_or(busybox, |(_, _, p)| p.as_path());
    let binary = fs::read(binary_path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "read {}: {e} (install the busybox-static package)",
                binary_path.display()
            ),
        )
    })?;
    let list = Command::new(busybox).arg("--list").output()?;
    if !list.status.success() {
        return Err(io::Error::other(format!(
            "{} --list failed",
            busybox.display()
        )));
    }
    let mut entries = vec![
        Entry::dir("bin/", 0o755),
        Entry::dir("etc/", 0o755),
        Entry::dir("tmp/", 0o1777),
        Entry::dir("proc/", 0o555),
        Entry::dir("sys/", 0o555),
        Entry::dir("dev/", 0o755),
        Entry::dir("root/", 0o700),
        Entry::file("bin/busybox", &binary, 0o755),
    ];
    let applets = String::from_utf8_lossy(&list.stdout).into_owned();
    for applet in applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        entries.push(Entry::symlink(&format!("bin/{applet}"), "busybox"));
    }
    entries.push(Entry::file(
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        0o644,
    ));
    entries.push(Entry::file(
        "etc/group",
        b"root:x:0:\nnogroup:x:65534:\n",
        0o644,
    ));
    Ok(Layer::new(entries).gzipped())
}

/// busybox ready to run `sh`, named `ref_name`.
pub fn busybox_image(ref_name: &str) -> io::Result<Image> {
    Ok(Image {
        layers: vec![busybox_layer()?],
        config: Config {
            cmd: Some(vec!["sh".into()]),
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
            working_dir: Some("/".into()),
            ..Config::default()
        },
        ref_name: Some(ref_name.into()),
        nested_index: false,
    })
}

/// An OCI layout directory whose one entry is an image index of `entries`, each an image
/// with the platform given as `os/arch[/variant]` (the config keeps the host's
/// architecture: only the index's platform is read when picking). Returns the index's
/// digest and each image's digests, in order.
pub fn write_index_dir(dir: &Path, entries: &[(&str, &Image)]) -> io::Result<(String, Vec<Built>)> {
    let mut manifests = Vec::new();
    let mut builts = Vec::new();
    for (platform, image) in entries {
        let (files, built) = layout_files(image)?;
        let mut size = 0;
        for (name, bytes) in files {
            if !name.starts_with("blobs/") {
                continue;
            }
            if name.ends_with(hex(&built.manifest_digest)) {
                size = bytes.len();
            }
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(path, bytes)?;
        }
        let mut parts = platform.split('/');
        let mut p = json!({
            "os": parts.next().unwrap_or("linux"),
            "architecture": parts.next().unwrap_or("amd64"),
        });
        if let Some(v) = parts.next() {
            p["variant"] = json!(v);
        }
        manifests.push(json!({
            "mediaType": MEDIA_MANIFEST,
            "digest": built.manifest_digest,
            "size": size,
            "platform": p,
        }));
        builts.push(built);
    }
    let index = serde_json::to_vec(
        &json!({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": manifests}),
    )?;
    let index_digest = sha256(&index);
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;
    fs::write(blobs.join(hex(&index_digest)), &index)?;
    let top = json!({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [
        {"mediaType": MEDIA_INDEX, "digest": index_digest, "size": index.len()}
    ]});
    fs::write(dir.join("index.json"), serde_json::to_vec(&top)?)?;
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok((index_digest, builts))
}

/// `n` bytes no compressor shrinks (xorshift from `seed`): layers of a real size.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}
