//! Image archives against a small disk, as root on a loop-mounted ext4 the test makes:
//! a gzip bomb layer is refused before it fills the disk and leaves nothing behind, an
//! import onto a full disk says the disk is full, and healthy imports work afterwards;
//! a pull of a layer larger than the free space stops before writing it.

use support::{loopfs, oci, pki, registry};

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use holdfast::image::ImageStore;
use holdfast::store::Store;
use loopfs::LoopFs;
use oci::{Config, Entry, Image, Layer};
use sha2::{Digest, Sha256};

fn need_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        true
    } else {
        eprintln!("skipped: needs root to mount a loop filesystem");
        false
    }
}

/// A temp dir removed on drop, pass or fail.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("holdfast-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Passes writes on to `out` and hashes them: the diff id of a layer streamed through.
struct Hashing<W: Write> {
    out: W,
    hasher: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `docker save` archive of one image whose one layer is a gzip of a tar holding
/// `zeros` zero bytes: a few hundred KB that unpack to hundreds of MB. Streamed, so the
/// test never holds it in memory. Returns the archive's size.
fn write_bomb_archive(path: &Path, zeros: u64) -> u64 {
    let mut gz = Vec::new();
    let diff_id = {
        let enc = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::best());
        let mut tee = Hashing {
            out: enc,
            hasher: Sha256::new(),
        };
        {
            let mut b = tar::Builder::new(&mut tee);
            let mut h = tar::Header::new_gnu();
            h.set_size(zeros);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_cksum();
            b.append_data(&mut h, "var/zeros", io::repeat(0).take(zeros))
                .expect("append zeros");
            b.finish().expect("finish tar");
        }
        let digest = format!("sha256:{}", hex(&tee.hasher.finalize()));
        tee.out.finish().expect("finish gzip");
        digest
    };
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    let config = serde_json::to_vec(&config).expect("config");
    let config_name = format!("{}.json", hex(&Sha256::digest(&config)));
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": ["bomb:latest"],
        "Layers": ["bomb/layer.tar"],
    }]);
    let manifest = serde_json::to_vec(&manifest).expect("manifest");
    let mut b = tar::Builder::new(File::create(path).expect("create archive"));
    for (name, bytes) in [
        ("bomb/layer.tar", &gz),
        (config_name.as_str(), &config),
        ("manifest.json", &manifest),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, name, bytes.as_slice())
            .expect("append");
    }
    b.into_inner().expect("finish archive");
    fs::metadata(path).expect("stat archive").len()
}

fn healthy_image() -> Image {
    Image {
        layers: vec![Layer::new(vec![
            Entry::dir("etc/", 0o755),
            Entry::file("etc/hostname", b"gateway\n", 0o644),
        ])
        .gzipped()],
        config: Config {
            cmd: Some(vec!["/bin/app".into()]),
            ..Config::default()
        },
        ref_name: Some("registry.local/healthy:1".into()),
        nested_index: false,
    }
}

/// Names under `dir` (none when it is missing).
fn names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn assert_nothing_stored(root: &Path) {
    let content = root.join("content");
    for sub in ["tmp", "layers", "blobs/sha256"] {
        let left = names(&content.join(sub));
        assert!(left.is_empty(), "content/{sub} keeps {left:?}");
    }
}

#[test]
fn a_gzip_bomb_layer_is_refused_before_it_fills_the_disk() {
    if !need_root() {
        return;
    }
    let scratch = Scratch::new("image-bomb");
    let fs = LoopFs::mount(&scratch.0.join("mnt"), 64).expect("loop filesystem");
    let root = fs.mount.join("root");
    fs::create_dir_all(&root).expect("root dir");
    let store = Store::open(&root.join("db")).expect("open store");
    let images = ImageStore::open(&root, &store).expect("open image store");

    // 200 MiB inflates past any honest layer's ratio; 60 MiB inflates within it but
    // is more than this disk holds.
    for (zeros, refused_as) in [
        (200u64 << 20, "decompression bomb"),
        (60u64 << 20, "disk is full"),
    ] {
        let bomb = scratch.0.join(format!("bomb-{zeros}.tar"));
        let archive_size = write_bomb_archive(&bomb, zeros);
        assert!(archive_size < 1024 * 1024, "{archive_size} bytes");
        store.flush().expect("flush");
        let before = fs.free();

        let e = images.import(&bomb).expect_err("the bomb is refused");
        let shown = holdfast::error_chain(&e);
        eprintln!("{zeros} zero bytes in {archive_size}: {shown}");
        assert!(shown.contains(refused_as), "{shown}");
        assert!(shown.contains("layer sha256:"), "{shown}");
        if refused_as == "disk is full" {
            assert!(shown.contains("in reserve"), "says what is free: {shown}");
            assert!(
                shown.contains(&zeros.to_string()),
                "says how much was needed: {shown}"
            );
        }

        store.flush().expect("flush");
        let after = fs.free();
        eprintln!("free before {before}, after {after}");
        assert!(
            after + 512 * 1024 >= before,
            "the import took {} bytes of the disk",
            before.saturating_sub(after)
        );
        assert_nothing_stored(&root);
        assert!(images.list().expect("list").is_empty());
    }

    // A healthy image imports there afterwards.
    let good = scratch.0.join("good.tar");
    healthy_image()
        .write_layout_tar(&good)
        .expect("write image");
    let records = images.import(&good).expect("a healthy import works");
    assert_eq!(records.len(), 1);
    let resolved = images
        .resolve("registry.local/healthy:1")
        .expect("resolve")
        .expect("present");
    assert_eq!(
        fs::read(resolved.layers[0].join("etc/hostname")).expect("read"),
        b"gateway\n"
    );
    drop(images);
    drop(store);
}

#[test]
fn an_import_onto_a_full_disk_says_the_disk_is_full() {
    if !need_root() {
        return;
    }
    let scratch = Scratch::new("image-full");
    let layout = scratch.0.join("layout");
    healthy_image()
        .write_layout_dir(&layout)
        .expect("write layout");
    let tarball = scratch.0.join("healthy.tar");
    healthy_image()
        .write_layout_tar(&tarball)
        .expect("write tar");

    let fs = LoopFs::mount(&scratch.0.join("mnt"), 32).expect("loop filesystem");
    let root = fs.mount.join("root");
    fs::create_dir_all(&root).expect("root dir");
    let store = Store::open(&root.join("db")).expect("open store");
    let images = ImageStore::open(&root, &store).expect("open image store");
    store.flush().expect("flush");
    let filler = fs.fill("filler");

    // Blobs of a layout directory are copied as they are: the write itself fails.
    let e = images.import(&layout).expect_err("no room");
    let shown = holdfast::error_chain(&e);
    eprintln!("layout onto a full disk: {shown}");
    assert!(shown.contains("disk is full"), "{shown}");
    assert!(shown.contains("No space left on device"), "{shown}");
    assert_nothing_stored(&root);

    // A tar is staged first; the staging says so.
    let e = images.import(&tarball).expect_err("no room");
    let shown = holdfast::error_chain(&e);
    eprintln!("tar onto a full disk: {shown}");
    assert!(shown.contains("disk is full"), "{shown}");
    assert_nothing_stored(&root);

    fs::remove_file(&filler).expect("free the space");
    images.import(&layout).expect("imports once there is room");
    images.import(&tarball).expect("imports once there is room");
    assert!(images
        .resolve("registry.local/healthy:1")
        .expect("resolve")
        .is_some());
    drop(images);
    drop(store);
}

#[test]
fn a_pull_larger_than_the_free_space_stops_before_filling_the_disk() {
    if !need_root() || !registry::tools_present() {
        return;
    }
    let scratch = Scratch::new("image-pull-full");
    let pki = pki::Pki::new(&scratch.0.join("pki"));
    let reg = registry::Registry::start(&scratch.0.join("registry"), &pki, registry::Auth::None);
    let image = Image {
        // Compressed already, so that skopeo pushes the layer as it is: 40 MB of noise.
        layers: vec![
            Layer::new(vec![Entry::file("data", &oci::noise(40 << 20, 11), 0o644)]).gzipped(),
        ],
        ..Image::default()
    };
    let layout = scratch.0.join("layout");
    let platform = match oci::goarch() {
        ("arm", _) => "linux/arm/v7".to_string(),
        (arch, _) => format!("linux/{arch}"),
    };
    let (_, built) = oci::write_index_dir(&layout, &[(platform.as_str(), &image)]).expect("layout");
    reg.push(&layout, "big", "1", None);
    let cfg = scratch.0.join("config.yaml");
    fs::write(
        &cfg,
        format!(
            "holdfast:\n  registries:\n    \"{}\":\n      caFile: {}\n",
            reg.host(),
            reg.ca.display()
        ),
    )
    .expect("config");

    let fs = LoopFs::mount(&scratch.0.join("mnt"), 32).expect("loop filesystem");
    let root = fs.mount.join("root");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
            .args(args)
            .arg("--root-dir")
            .arg(&root)
            .env("HOME", &root)
            .output()
            .expect("run holdfast")
    };
    fs::create_dir_all(&root).expect("root dir");
    {
        // The state a node has before its first pull.
        let store = Store::open(&root.join("db")).expect("open store");
        ImageStore::open(&root, &store).expect("open image store");
        store.flush().expect("flush");
    }
    let before = fs.free();
    let reference = format!("{}/big:1", reg.host());
    let out = run(&[
        "image",
        "pull",
        &reference,
        "--config",
        cfg.to_str().expect("utf-8 path"),
    ]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{said}");
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("disk is full"), "{said}");
    assert!(
        said.contains(&format!("download blob {}", built[0].layer_digests[0])),
        "{said}"
    );
    let after = fs.free();
    eprintln!("free before {before}, after {after}");
    assert!(
        after + 1024 * 1024 >= before,
        "the pull took {} bytes of the disk",
        before.saturating_sub(after)
    );
    let left = names(&root.join("content/tmp"));
    assert!(left.is_empty(), "left in tmp: {left:?}");
}
