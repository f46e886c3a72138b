use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use super::*;
use crate::testutil::TempDir;

enum E<'a> {
    File(&'a [u8], &'a [u8], u32),
    Dir(&'a [u8], u32),
    Symlink(&'a [u8], &'a [u8]),
    Hardlink(&'a [u8], &'a [u8]),
    Dev(&'a [u8], EntryType, u32, u32),
}

/// Raw headers: the tar crate's path setters refuse exactly the names under test.
fn header(name: &[u8], kind: EntryType, size: u64, link: &[u8], mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name);
        old.linkname[..link.len()].copy_from_slice(link);
    }
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(1000);
    h.set_gid(1001);
    h.set_mtime(1_600_000_000);
    h.set_cksum();
    h
}

fn layer(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (h, data): (tar::Header, &[u8]) = match e {
            E::File(n, d, m) => (header(n, EntryType::Regular, d.len() as u64, b"", *m), d),
            E::Dir(n, m) => (header(n, EntryType::Directory, 0, b"", *m), b""),
            E::Symlink(n, t) => (header(n, EntryType::Symlink, 0, t, 0o777), b""),
            E::Hardlink(n, t) => (header(n, EntryType::Link, 0, t, 0o644), b""),
            E::Dev(n, k, maj, min) => {
                let mut h = header(n, *k, 0, b"", 0o620);
                h.set_device_major(*maj).expect("major");
                h.set_device_minor(*min).expect("minor");
                h.set_cksum();
                (h, b"")
            }
        };
        b.append(&h, data).expect("append");
    }
    b.into_inner().expect("finish tar")
}

fn unpack(tmp: &TempDir, bytes: &[u8]) -> (PathBuf, Result<(), ImageError>) {
    let blob = tmp.0.join("blob");
    fs::write(&blob, bytes).expect("write blob");
    let dest = tmp.0.join("layer");
    let r = unpack_layer(&blob, &dest, "sha256:test", None);
    (dest, r)
}

fn rejected(tmp: &TempDir, entries: &[E], want: &str) {
    let (dest, r) = unpack(tmp, &layer(entries));
    match r {
        Err(ImageError::UnsafeLayerEntry { reason, .. }) => {
            assert!(reason.contains(want), "reason {reason:?} lacks {want:?}")
        }
        other => panic!("expected an unsafe entry error with {want:?}, got {other:?}"),
    }
    assert!(!dest.exists(), "a rejected layer left its directory behind");
}

#[test]
fn unpacks_every_entry_kind_with_metadata() {
    let tmp = TempDir::new("kinds");
    let (dest, r) = unpack(
        &tmp,
        &layer(&[
            E::Dir(b"./", 0o755),
            E::Dir(b"./bin/", 0o750),
            E::File(b"./bin/tool", b"#!/bin/sh\n", 0o4755),
            E::File(b"implicit/dir/file", b"x", 0o600),
            E::Symlink(b"bin/link", b"/absolute/anywhere"),
            E::Hardlink(b"bin/hard", b"./bin/tool"),
            E::Dev(b"dev-null", EntryType::Char, 1, 3),
            E::Dev(b"blk", EntryType::Block, 7, 0),
            E::Dev(b"fifo", EntryType::Fifo, 0, 0),
        ]),
    );
    r.expect("unpack");
    let tool = fs::symlink_metadata(dest.join("bin/tool")).expect("tool");
    assert_eq!(tool.mode() & 0o7777, 0o4755);
    assert_eq!((tool.uid(), tool.gid()), (1000, 1001));
    assert_eq!(tool.mtime(), 1_600_000_000);
    assert_eq!(
        fs::read(dest.join("bin/tool")).expect("read"),
        b"#!/bin/sh\n"
    );
    let bin = fs::symlink_metadata(dest.join("bin")).expect("bin");
    assert_eq!(bin.mode() & 0o7777, 0o750);
    assert_eq!(
        bin.mtime(),
        1_600_000_000,
        "dir mtime survives its children"
    );
    let link = fs::read_link(dest.join("bin/link")).expect("link");
    assert_eq!(link, Path::new("/absolute/anywhere"));
    assert_eq!(
        fs::symlink_metadata(dest.join("bin/link"))
            .expect("l")
            .uid(),
        1000
    );
    let hard = fs::symlink_metadata(dest.join("bin/hard")).expect("hard");
    assert_eq!(hard.ino(), tool.ino());
    // Device nodes become whiteouts (0:0): they would work from the host's side.
    for dev in ["dev-null", "blk"] {
        let meta = fs::symlink_metadata(dest.join(dev)).expect("dev");
        assert!(meta.file_type().is_char_device(), "{dev}");
        assert_eq!(meta.rdev(), makedev(0, 0), "{dev}");
    }
    assert!(fs::symlink_metadata(dest.join("fifo"))
        .expect("f")
        .file_type()
        .is_fifo());
    assert!(dest.join("implicit/dir/file").is_file());
}

#[test]
fn rejects_dotdot_and_absolute_paths() {
    let tmp = TempDir::new("paths");
    rejected(&tmp, &[E::File(b"../escape", b"x", 0o644)], "'..'");
    assert!(!tmp.0.join("escape").exists());
    rejected(
        &tmp,
        &[
            E::File(b"ok", b"", 0o644),
            E::File(b"a/../../escape", b"x", 0o644),
        ],
        "'..'",
    );
    rejected(&tmp, &[E::File(b"/escape", b"x", 0o644)], "absolute");
    rejected(&tmp, &[E::Dir(b"/", 0o755)], "absolute");
}

#[test]
fn rejects_writes_through_symlinks() {
    let tmp = TempDir::new("symlink");
    let outside = tmp.0.join("outside");
    fs::create_dir(&outside).expect("outside");
    let target = outside.as_os_str().as_bytes();
    rejected(
        &tmp,
        &[
            E::Symlink(b"evil", target),
            E::File(b"evil/pwned", b"x", 0o644),
        ],
        "traverses symlink evil",
    );
    rejected(
        &tmp,
        &[E::Symlink(b"evil", target), E::Dir(b"evil/sub/", 0o755)],
        "traverses symlink",
    );
    rejected(
        &tmp,
        &[E::Symlink(b"evil", b"."), E::Symlink(b"evil/x", target)],
        "traverses symlink",
    );
    assert_eq!(fs::read_dir(&outside).expect("list").count(), 0);
}

#[test]
fn a_file_replaces_a_symlink_without_following_it() {
    let tmp = TempDir::new("replace");
    let victim = tmp.0.join("victim");
    fs::write(&victim, b"untouched").expect("victim");
    let (dest, r) = unpack(
        &tmp,
        &layer(&[
            E::Symlink(b"x", victim.as_os_str().as_bytes()),
            E::File(b"x", b"new", 0o644),
        ]),
    );
    r.expect("unpack");
    assert_eq!(fs::read(&victim).expect("victim"), b"untouched");
    assert_eq!(fs::read(dest.join("x")).expect("x"), b"new");
}

#[test]
fn rejects_hostile_hard_links() {
    let tmp = TempDir::new("hardlink");
    rejected(&tmp, &[E::Hardlink(b"passwd", b"../../etc/passwd")], "'..'");
    rejected(&tmp, &[E::Hardlink(b"passwd", b"/etc/passwd")], "absolute");
    rejected(
        &tmp,
        &[E::Hardlink(b"passwd", b"etc/passwd")],
        "does not exist in the layer",
    );
    rejected(
        &tmp,
        &[
            E::Symlink(b"etc", b"/etc"),
            E::Hardlink(b"passwd", b"etc/passwd"),
        ],
        "traverses symlink etc",
    );
    rejected(
        &tmp,
        &[E::Dir(b"d", 0o755), E::Hardlink(b"l", b"d")],
        "directory",
    );
}

#[test]
fn whiteouts_become_overlay_whiteouts() {
    let tmp = TempDir::new("whiteout");
    let (dest, r) = unpack(
        &tmp,
        &layer(&[
            E::Dir(b"etc/", 0o755),
            E::File(b"etc/.wh.gone", b"", 0o644),
            E::File(b"opaque/.wh..wh..opq", b"", 0o644),
            E::File(b".wh..wh.plnk", b"", 0o644),
        ]),
    );
    r.expect("unpack");
    let wh = fs::symlink_metadata(dest.join("etc/gone")).expect("whiteout");
    assert!(wh.file_type().is_char_device());
    assert_eq!(wh.rdev(), 0);
    assert!(!dest.join("etc/.wh.gone").exists());
    let opaque = xattr::get(dest.join("opaque"), OPAQUE_XATTR).expect("xattr");
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert!(!dest.join("opaque/.wh..wh..opq").exists());
    assert!(!dest.join(".wh..wh.plnk").exists());
}

#[test]
fn gzip_layers_and_diff_ids() {
    let tmp = TempDir::new("gzip");
    let plain = layer(&[E::File(b"a", b"hello", 0o644)]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&plain).expect("gzip");
    let gz = gz.finish().expect("gzip");
    let blob = tmp.0.join("blob");
    fs::write(&blob, &gz).expect("blob");
    let diff_id = format!("sha256:{}", hex(&Sha256::digest(&plain)));
    unpack_layer(&blob, &tmp.0.join("l1"), "sha256:t", Some(&diff_id)).expect("gzip layer");
    assert_eq!(fs::read(tmp.0.join("l1/a")).expect("a"), b"hello");
    let wrong = format!("sha256:{}", "0".repeat(64));
    match unpack_layer(&blob, &tmp.0.join("l2"), "sha256:t", Some(&wrong)) {
        Err(ImageError::DigestMismatch { .. }) => {}
        other => panic!("expected a diff id mismatch, got {other:?}"),
    }
    assert!(!tmp.0.join("l2").exists());
}

#[test]
fn zstd_layers_of_several_frames_and_their_diff_ids() {
    use ruzstd::encoding::{compress_to_vec, CompressionLevel};
    let tmp = TempDir::new("zstd");
    let plain = layer(&[
        E::File(b"a", &[b'x'; 100_000], 0o644),
        E::File(b"b", b"hello", 0o644),
    ]);
    // Two frames back to back, as chunked writers produce.
    let (head, tail) = plain.split_at(plain.len() / 2);
    let mut blob_bytes = compress_to_vec(head, CompressionLevel::Fastest);
    blob_bytes.extend(compress_to_vec(tail, CompressionLevel::Fastest));
    let blob = tmp.0.join("blob");
    fs::write(&blob, &blob_bytes).expect("blob");
    let diff_id = format!("sha256:{}", hex(&Sha256::digest(&plain)));
    unpack_layer(&blob, &tmp.0.join("l1"), "sha256:t", Some(&diff_id)).expect("zstd layer");
    assert_eq!(fs::read(tmp.0.join("l1/b")).expect("b"), b"hello");
    assert_eq!(fs::read(tmp.0.join("l1/a")).expect("a").len(), 100_000);

    let (dest, r) = unpack(&tmp, &[0x28, 0xb5, 0x2f, 0xfd, 0xff, 0xff, 0, 0]);
    assert!(r.is_err(), "a broken zstd frame is an error");
    assert!(!dest.exists());
}

/// Writes a gzipped layer holding one file of `zeros` zero bytes, streamed: a
/// decompression bomb, a few hundred KB for hundreds of MB.
fn write_zeros_layer(path: &Path, zeros: u64) {
    let out = File::create(path).expect("create blob");
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::best());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_size(zeros);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    b.append_data(&mut h, "zeros", io::repeat(0).take(zeros))
        .expect("append");
    b.into_inner()
        .expect("finish tar")
        .finish()
        .expect("finish gzip");
}

/// A small tmpfs mounted by the test (as root), unmounted on drop even on failure.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(dir: &Path, size: &str) -> Option<SmallFs> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mounting a small filesystem needs root");
            return None;
        }
        fs::create_dir_all(dir).expect("mount point");
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .expect("mount tmpfs");
        Some(SmallFs(dir.to_path_buf()))
    }

    fn available(&self) -> u64 {
        crate::node::facts::statfs(&self.0)
            .expect("statfs")
            .available
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn a_layer_larger_than_the_free_space_stops_before_the_disk_is_full() {
    let tmp = TempDir::new("bomb-disk");
    let Some(small) = SmallFs::mount(&tmp.0.join("small"), "16m") else {
        return;
    };
    let blob = tmp.0.join("bomb");
    write_zeros_layer(&blob, 40 << 20);
    let before = small.available();
    let dest = small.0.join("layer");
    let e = unpack_layer(&blob, &dest, "sha256:bomb", None).expect_err("the bomb is refused");
    let shown = e.to_string();
    assert!(shown.contains("disk is full"), "{shown}");
    assert!(shown.contains("sha256:bomb"), "{shown}");
    assert!(
        shown.contains(&(40u64 << 20).to_string()),
        "says what it needed: {shown}"
    );
    assert!(!dest.exists(), "nothing of the layer is left");
    assert_eq!(small.available(), before, "the free space is as it was");

    // A layer that fits still unpacks there.
    let (ok, r) = {
        let blob = tmp.0.join("small-layer");
        fs::write(
            &blob,
            layer(&[E::File(b"etc/hostname", b"gateway\n", 0o644)]),
        )
        .expect("w");
        let dest = small.0.join("fits");
        (
            dest.clone(),
            unpack_layer(&blob, &dest, "sha256:fits", None),
        )
    };
    r.expect("a layer that fits");
    assert_eq!(
        fs::read(ok.join("etc/hostname")).expect("read"),
        b"gateway\n"
    );
}

#[test]
fn a_layer_that_inflates_past_its_bound_is_refused() {
    let tmp = TempDir::new("bomb-ratio");
    let blob = tmp.0.join("bomb");
    write_zeros_layer(&blob, 8 << 20);
    let compressed = fs::metadata(&blob).expect("stat").len();
    assert!(compressed < 64 << 10, "{compressed} bytes compressed");
    let limits = Limits {
        ratio: 16,
        floor: 1 << 20,
    };
    let dest = tmp.0.join("layer");
    let e = unpack_layer_limited(&blob, &dest, "sha256:bomb", None, limits)
        .expect_err("the bomb is refused");
    let shown = e.to_string();
    assert!(shown.contains("decompression bomb"), "{shown}");
    assert!(
        matches!(e, ImageError::TooLarge { limit, .. } if limit == 1 << 20),
        "{e:?}"
    );
    assert!(!dest.exists(), "nothing of the layer is left");

    // The same stream within its bound unpacks.
    let generous = Limits {
        ratio: 16,
        floor: 16 << 20,
    };
    unpack_layer_limited(&blob, &dest, "sha256:bomb", None, generous).expect("within bounds");
    assert_eq!(
        fs::metadata(dest.join("zeros")).expect("zeros").len(),
        8 << 20
    );
}

#[test]
fn the_bound_follows_the_compressed_size() {
    let l = Limits::DEFAULT;
    assert_eq!(l.stream_limit(1000), MIN_INFLATE_LIMIT);
    assert_eq!(l.stream_limit(1 << 30), (1u64 << 30) * MAX_INFLATE_RATIO);
    assert_eq!(l.stream_limit(u64::MAX), u64::MAX);
}

#[test]
fn a_write_that_finds_the_disk_full_says_so_with_its_cause() {
    let tmp = TempDir::new("enospc");
    let unpacker = Unpacker {
        root: tmp.0.clone(),
        layer: "sha256:full".into(),
        dirs: Vec::new(),
        budget: DiskBudget::new(&tmp.0, "unpack layer sha256:full"),
        read: Rc::new(Cell::new(0)),
        limit: u64::MAX,
    };
    let enospc = io::Error::from_raw_os_error(nix::libc::ENOSPC);
    let shown = unpacker.io("etc/big", "write file")(enospc).to_string();
    assert!(
        shown.contains("etc/big") && shown.contains("write file"),
        "{shown}"
    );
    assert!(shown.contains("No space left on device"), "{shown}");
    assert!(shown.contains("disk is full"), "{shown}");
    assert!(
        shown.contains("bytes free on"),
        "says what is free: {shown}"
    );
    let denied = io::Error::from_raw_os_error(nix::libc::EACCES);
    let shown = unpacker.io("etc/big", "write file")(denied).to_string();
    assert!(shown.contains("Permission denied"), "{shown}");
}
