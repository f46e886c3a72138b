//! Importing real archives into a real image store (sled file, content dir) as root:
//! busybox as an OCI layout, a docker-save tar, hostile layers, bad digests, removal.

use support::oci;

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use holdfast::image::{ImageError, ImageStore};
use holdfast::store::Store;
use oci::{Config, Entry, Image, Layer};

/// A store under a fresh temp dir; everything it and the test create is removed on
/// drop, pass or fail.
struct Env {
    root: PathBuf,
    extra: Vec<PathBuf>,
    images: ImageStore,
    _store: Store,
}

impl Env {
    fn new(tag: &str) -> Self {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("holdfast-image-{tag}-{}-{seq}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("create test root");
        let store = Store::open(&root.join("db")).expect("open store");
        let images = ImageStore::open(&root, &store).expect("open image store");
        Env {
            root,
            extra: Vec::new(),
            images,
            _store: store,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// A path outside the root that a hostile layer might aim at.
    fn outside(&mut self, name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "{name}-{}-{}",
            std::process::id(),
            self.extra.len()
        ));
        let _ = fs::remove_dir_all(&p);
        let _ = fs::remove_file(&p);
        self.extra.push(p.clone());
        p
    }

    fn count(&self, sub: &str) -> usize {
        fs::read_dir(self.root.join(sub))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
        for p in &self.extra {
            let _ = fs::remove_dir_all(p);
            let _ = fs::remove_file(p);
        }
    }
}

fn small_image(ref_name: &str, layers: Vec<Layer>) -> Image {
    Image {
        layers,
        config: Config {
            cmd: Some(vec!["/bin/app".into()]),
            ..Config::default()
        },
        ref_name: Some(ref_name.into()),
        nested_index: false,
    }
}

fn base_layer() -> Layer {
    Layer::new(vec![
        Entry::dir("etc/", 0o755),
        Entry::file("etc/base", b"base", 0o644),
    ])
    .gzipped()
}

#[test]
fn busybox_oci_tar_imports_and_resolves() {
    let env = Env::new("busybox");
    let tar = env.path("busybox.tar");
    let built = oci::busybox_image("docker.io/library/busybox:demo")
        .expect("busybox image (needs /bin/busybox)")
        .write_layout_tar(&tar)
        .expect("write tar");
    let records = env.images.import(&tar).expect("import busybox");
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].references,
        vec!["docker.io/library/busybox:demo".to_string()]
    );
    assert_eq!(records[0].manifest_digest, built.manifest_digest);

    let again = env.images.import(&tar).expect("import again");
    assert_eq!(again, records, "a second import changes nothing");
    assert_eq!(env.images.list().expect("list").len(), 1);

    let image = env
        .images
        .resolve("busybox:demo")
        .expect("resolve")
        .expect("present");
    assert_eq!(image.reference, "docker.io/library/busybox:demo");
    assert_eq!(image.image_id, built.config_digest);
    assert_eq!(image.layers.len(), 1);
    let busybox = image.layers[0].join("bin/busybox");
    let mode = fs::metadata(&busybox)
        .expect("bin/busybox")
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "busybox is executable");
    assert_eq!(
        fs::read_link(image.layers[0].join("bin/sh")).expect("sh"),
        Path::new("busybox")
    );
    let tmp = fs::symlink_metadata(image.layers[0].join("tmp")).expect("tmp");
    assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
    let cmd = image.config.config().as_ref().and_then(|c| c.cmd().clone());
    assert_eq!(cmd, Some(vec!["sh".to_string()]));

    let by_id = env
        .images
        .resolve(&built.config_digest)
        .expect("resolve id")
        .expect("by id");
    assert_eq!(by_id.layers, image.layers);
    assert!(env
        .images
        .resolve("busybox:other")
        .expect("resolve")
        .is_none());
    match env.images.resolve("BusyBox") {
        Err(e @ ImageError::BadReference { .. }) => assert!(e.to_string().contains("lowercase")),
        other => panic!("expected a bad reference, got {other:?}"),
    }
}

#[test]
fn docker_save_with_whiteouts_and_opaque_dirs() {
    let env = Env::new("docker");
    let upper = Layer::new(vec![
        Entry::file("etc/.wh.base", b"", 0o644),
        Entry::dir("var/", 0o755),
        Entry::dir("var/cache/", 0o755),
        Entry::file("var/cache/.wh..wh..opq", b"", 0o644),
        Entry::file("var/cache/new", b"fresh", 0o600),
    ]);
    let image = small_image("unused", vec![base_layer(), upper]);
    let tar = env.path("save.tar");
    let built = image
        .write_docker_save(&tar, &["example.com/team/app:1.0", "app"])
        .expect("write docker save");
    let records = env.images.import(&tar).expect("import docker save");
    assert_eq!(records.len(), 1);
    let mut refs = records[0].references.clone();
    refs.sort();
    assert_eq!(
        refs,
        vec!["docker.io/library/app:latest", "example.com/team/app:1.0"]
    );
    assert_eq!(env.images.import(&tar).expect("again"), records);

    let image = env
        .images
        .resolve("app")
        .expect("resolve")
        .expect("present");
    assert_eq!(image.image_id, built.config_digest);
    assert_eq!(
        fs::read(image.layers[0].join("etc/base")).expect("base"),
        b"base"
    );
    let whiteout = fs::symlink_metadata(image.layers[1].join("etc/base")).expect("whiteout");
    assert!(
        whiteout.file_type().is_char_device(),
        "whiteout is a char device"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(whiteout.rdev(), 0);
    let opaque = xattr_get(&image.layers[1].join("var/cache"));
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert_eq!(
        fs::read(image.layers[1].join("var/cache/new")).expect("new"),
        b"fresh"
    );
}

fn xattr_get(path: &Path) -> Option<Vec<u8>> {
    xattr::get(path, "trusted.overlay.opaque").expect("read xattr")
}

#[test]
fn hostile_layers_are_rejected_and_nothing_escapes() {
    let mut env = Env::new("hostile");
    let good = env.path("good.tar");
    small_image("good:1", vec![base_layer()])
        .write_layout_tar(&good)
        .expect("good");
    env.images.import(&good).expect("import good image");
    let blobs_before = env.count("content/blobs/sha256");
    let layers_before = env.count("content/layers");

    let absolute = env.outside("holdfast-escape-abs");
    let symlink_dir = env.outside("holdfast-escape-dir");
    fs::create_dir(&symlink_dir).expect("symlink target dir");
    let raw = |path: &str, kind: tar::EntryType, link: &str| Entry::Raw {
        path: path.as_bytes().to_vec(),
        kind,
        content: b"pwned".to_vec(),
        link: link.as_bytes().to_vec(),
        mode: 0o644,
    };
    let cases: Vec<(&str, Vec<Entry>, String)> = vec![
        (
            "dotdot",
            vec![raw("../escape", tar::EntryType::Regular, "")],
            "../escape".into(),
        ),
        (
            "absolute",
            vec![raw(
                &absolute.to_string_lossy(),
                tar::EntryType::Regular,
                "",
            )],
            "absolute path".into(),
        ),
        (
            "symlink",
            vec![
                Entry::symlink("evil", &symlink_dir.to_string_lossy()),
                raw("evil/pwned", tar::EntryType::Regular, ""),
            ],
            "traverses symlink evil".into(),
        ),
        (
            "hardlink",
            vec![raw("passwd", tar::EntryType::Link, "../../etc/passwd")],
            "../../etc/passwd".into(),
        ),
    ];
    for (name, entries, want) in cases {
        let tar = env.path(&format!("{name}.tar"));
        let image = small_image(
            &format!("hostile:{name}"),
            vec![base_layer(), Layer::new(entries)],
        );
        image.write_layout_tar(&tar).expect("hostile tar");
        match env.images.import(&tar) {
            Err(e @ ImageError::UnsafeLayerEntry { .. }) => {
                assert!(e.to_string().contains(&want), "{name}: {e} lacks {want:?}")
            }
            other => panic!("{name}: expected an unsafe layer error, got {other:?}"),
        }
        assert!(env
            .images
            .resolve(&format!("hostile:{name}"))
            .expect("resolve")
            .is_none());
    }
    assert!(!absolute.exists(), "absolute path written");
    assert!(
        !symlink_dir.join("pwned").exists(),
        "written through a symlink"
    );
    assert!(!env.path("content/escape").exists() && !env.path("content/tmp/escape").exists());
    assert_eq!(env.count("content/tmp"), 0, "temp files left behind");
    assert_eq!(
        env.count("content/blobs/sha256"),
        blobs_before,
        "hostile blobs kept"
    );
    assert_eq!(
        env.count("content/layers"),
        layers_before,
        "hostile layers kept"
    );
    assert_eq!(env.images.list().expect("list").len(), 1);
    let still = env
        .images
        .resolve("good:1")
        .expect("resolve")
        .expect("good image");
    assert_eq!(
        fs::read(still.layers[0].join("etc/base")).expect("base"),
        b"base"
    );
}

#[test]
fn a_blob_whose_digest_does_not_match_is_rejected() {
    let env = Env::new("digest");
    let dir = env.path("layout");
    let built = small_image("tampered:1", vec![base_layer()])
        .write_layout_dir(&dir)
        .expect("layout");
    let blob = dir
        .join("blobs/sha256")
        .join(oci::hex(&built.layer_digests[0]));
    let mut bytes = fs::read(&blob).expect("blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&blob, &bytes).expect("tamper");
    match env.images.import(&dir) {
        Err(e @ ImageError::DigestMismatch { .. }) => {
            assert!(e.to_string().contains(&built.layer_digests[0]), "{e}")
        }
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
    assert!(env.images.list().expect("list").is_empty());
    assert_eq!(
        env.count("content/blobs/sha256"),
        0,
        "blobs of a failed import kept"
    );
    assert_eq!(env.count("content/tmp"), 0);
}

#[test]
fn remove_frees_blobs_but_keeps_shared_ones() {
    let env = Env::new("remove");
    let top = |name: &str| Layer::new(vec![Entry::file(name, name.as_bytes(), 0o644)]);
    let a = env.path("a.tar");
    let b = env.path("b.tar");
    let built_a = small_image("a:1", vec![base_layer(), top("a")])
        .write_layout_tar(&a)
        .expect("a");
    let built_b = small_image("b:1", vec![base_layer(), top("b")])
        .write_layout_tar(&b)
        .expect("b");
    env.images.import(&a).expect("import a");
    env.images.import(&b).expect("import b");
    let shared = &built_a.layer_digests[0];
    assert_eq!(shared, &built_b.layer_digests[0]);
    let blob = |d: &str| env.path("content/blobs/sha256").join(oci::hex(d));
    let layer = |d: &str| env.path("content/layers").join(oci::hex(d));

    env.images.remove("a:1", &[]).expect("remove a");
    assert!(env.images.resolve("a:1").expect("resolve").is_none());
    assert!(
        !blob(&built_a.layer_digests[1]).exists() && !layer(&built_a.layer_digests[1]).exists()
    );
    assert!(!blob(&built_a.manifest_digest).exists() && !blob(&built_a.config_digest).exists());
    assert!(
        blob(shared).exists() && layer(shared).exists(),
        "shared layer kept"
    );
    env.images
        .resolve("b:1")
        .expect("resolve")
        .expect("b still there");

    match env
        .images
        .remove("b:1", std::slice::from_ref(&built_b.config_digest))
    {
        Err(e @ ImageError::InUse { .. }) => assert!(e.to_string().contains("used by a container")),
        other => panic!("expected in use, got {other:?}"),
    }
    env.images
        .resolve("b:1")
        .expect("resolve")
        .expect("in-use image kept");
    match env.images.remove("a:1", &[]) {
        Err(e) => assert!(e.is_not_present(), "{e}"),
        Ok(()) => panic!("removed an absent image"),
    }
    env.images.remove("b:1", &[]).expect("remove b");
    assert_eq!(env.count("content/blobs/sha256"), 0);
    assert_eq!(env.count("content/layers"), 0);
    assert!(env.images.list().expect("list").is_empty());
}

#[test]
fn nested_index_and_unnamed_images() {
    let env = Env::new("nested");
    let dir = env.path("layout");
    let mut image = small_image("unused", vec![base_layer()]);
    image.ref_name = None;
    image.nested_index = true;
    let built = image.write_layout_dir(&dir).expect("layout");
    let records = env.images.import(&dir).expect("import nested");
    assert_eq!(records[0].references, vec![built.manifest_digest.clone()]);
    assert_eq!(records[0].manifest_digest, built.manifest_digest);
    let resolved = env
        .images
        .resolve(&built.manifest_digest)
        .expect("resolve")
        .expect("by digest");
    assert_eq!(resolved.image_id, built.config_digest);
    assert_eq!(
        env.count("content/blobs/sha256"),
        3,
        "nested index blob not kept"
    );
}

#[test]
fn orphans_are_swept_when_the_store_opens() {
    let env = Env::new("sweep");
    let tar = env.path("keep.tar");
    let built = small_image("keep:1", vec![base_layer()])
        .write_layout_tar(&tar)
        .expect("keep");
    env.images.import(&tar).expect("import");
    let orphan = env.path("content/blobs/sha256").join("0".repeat(64));
    fs::write(&orphan, b"left by a power cut").expect("orphan");
    let orphan_layer = env.path("content/layers").join("1".repeat(64));
    fs::create_dir(&orphan_layer).expect("orphan layer");
    ImageStore::open(&env.root, &env._store).expect("reopen");
    assert!(!orphan.exists() && !orphan_layer.exists(), "orphans kept");
    let kept = env
        .path("content/blobs/sha256")
        .join(oci::hex(&built.manifest_digest));
    assert!(kept.exists(), "a live blob was swept");
}

#[test]
fn image_store_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<ImageStore>();
}

#[test]
fn dropins_import_once_and_survive_a_bad_archive() {
    let env = Env::new("dropins");
    let dir = env.path("images");
    fs::create_dir(&dir).expect("images dir");
    small_image("drop:1", vec![base_layer()])
        .write_layout_tar(&dir.join("good.tar"))
        .expect("good");
    fs::write(dir.join("bad.tar"), b"not a tar at all").expect("bad");
    fs::write(dir.join("notes.txt"), b"ignored").expect("notes");
    let first = env.images.import_dropins().expect("dropins");
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].references,
        vec!["docker.io/library/drop:1".to_string()]
    );
    assert!(
        env.images.import_dropins().expect("again").is_empty(),
        "re-imported"
    );
    env.images
        .resolve("drop:1")
        .expect("resolve")
        .expect("present");
}
