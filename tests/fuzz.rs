//! Fuzzing of everything that reads hostile bytes: static manifests, the config file,
//! kubeconfigs, image archives and layers, the kubelet API's HTTP requests, SPDY and
//! WebSocket framing, CRI log files and store records. Each target mutates its corpus
//! under `tests/fuzz/corpus/<target>/` for `HOLDFAST_FUZZ_SECS` (see
//! `tests/support/fuzz.rs`); every input that once failed stays under
//! `tests/fuzz/regressions/<target>/` and is replayed by `regressions`.
//!
//! `cargo test --test fuzz -- --ignored write_seed_corpus` rebuilds the generated seeds.

use support::{fuzz, oci, pki, tempdir};

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuzz::{kind, Exec, Target};
use holdfast::image::ImageStore;
use holdfast::server::fuzz as api;
use holdfast::store::Store;
use tempdir::TempDir;

#[global_allocator]
static ALLOC: fuzz::Capped = fuzz::Capped;

const SEC: Duration = Duration::from_secs(1);

fn chain(e: &dyn std::error::Error) -> String {
    holdfast::error_chain(e)
}

// ---------------------------------------------------------------------------------
// Targets: each a `Target` and a maker of its `Exec`, shared by the fuzz run and the
// regression replay.

const MANIFEST: Target = Target {
    name: "manifest",
    dict: &[
        b"apiVersion: v1\n",
        b"kind: Pod\n",
        b"metadata:\n  name: ",
        b"spec:\n  containers:\n  - name: a\n    image: b\n",
        b"---\n",
        b"&anchor ",
        b"*anchor",
        b"<<: *anchor\n",
        b"!!binary ",
        b"!!str ",
        b"null",
        b"~",
        b"\"\\u0000\"",
        b"resources:\n      limits:\n        memory: ",
        b"cpu: ",
        b"999999999999999999999Ei",
        b"1e309",
        b"-0.5m",
        b"restartPolicy: ",
        b"env:\n    - name: X\n      value: $(X)$(X)",
        b"$(",
        b"volumes:\n  - name: v\n    emptyDir: {}\n",
        b"hostNetwork: true\n",
        b"initContainers:\n  - name: i\n    image: b\n",
        b"ports:\n    - containerPort: ",
        b"terminationGracePeriodSeconds: ",
        b"activeDeadlineSeconds: ",
        b"securityContext:\n      runAsUser: ",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\t",
        b"\xef\xbb\xbf",
    ],
    max_len: 64 * 1024,
    hang: SEC,
};

fn manifest_exec() -> Exec {
    let dir = TempDir::new("fuzz-manifest");
    let path = dir.0.join("pod.yaml");
    Box::new(move |input| {
        let _keep = &dir;
        fs::write(&path, input).expect("write the manifest");
        let (pods, errors) = holdfast::source::read_manifests(&dir.0, "fuzz-node");
        for pod in &pods {
            // What the reader lets through, validation must pass.
            let problems = holdfast::source::validate_pod(pod);
            assert!(problems.is_empty(), "a pod read is invalid: {problems:?}");
        }
        match errors.first() {
            Some(e) => kind(&chain(e)),
            None => format!("ok {} pods", pods.len().min(3)),
        }
    })
}

const CONFIG: Target = Target {
    name: "config",
    dict: &[
        b"apiVersion: kubelet.config.k8s.io/v1beta1\n",
        b"kind: KubeletConfiguration\n",
        b"evictionHard:\n  memory.available: ",
        b"systemReserved:\n  memory: ",
        b"maxPods: ",
        b"podPidsLimit: ",
        b"containerLogMaxSize: ",
        b"containerLogMaxFiles: ",
        b"imageGCHighThresholdPercent: ",
        b"nodeStatusUpdateFrequency: ",
        b"syncFrequency: ",
        b"1h2m3s",
        b"-1ns",
        b"9223372036854775807s",
        b"100%",
        b"registerWithTaints:\n- key: a\n  effect: NoSchedule\n",
        b"staticPodPath: ",
        b"port: ",
        b"65536",
        b"&a ",
        b"*a",
    ],
    max_len: 64 * 1024,
    hang: SEC,
};

fn config_exec() -> Exec {
    let path = PathBuf::from("/etc/holdfast/config.yaml");
    Box::new(move |input| {
        let text = String::from_utf8_lossy(input);
        match holdfast::config::parse_config(&path, &text) {
            Ok((_, warnings)) => format!("ok {} warnings", warnings.len().min(3)),
            Err(e) => kind(&chain(&e)),
        }
    })
}

const KUBECONFIG: Target = Target {
    name: "kubeconfig",
    dict: &[
        b"apiVersion: v1\n",
        b"kind: Config\n",
        b"current-context: ",
        b"clusters:\n- name: c\n  cluster:\n    server: ",
        b"https://10.0.0.1:6443",
        b"http://[::1]:99999",
        b"certificate-authority-data: ",
        b"certificate-authority: ",
        b"insecure-skip-tls-verify: true\n",
        b"client-certificate-data: ",
        b"client-key-data: ",
        b"token: ",
        b"tokenFile: ",
        b"exec:\n      command: ",
        b"users:\n- name: u\n  user:\n",
        b"contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n",
        b"-----BEGIN CERTIFICATE-----\n",
        b"-----END CERTIFICATE-----\n",
        b"-----BEGIN PRIVATE KEY-----\n",
        b"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
        b"/dev/zero",
        b"../../../../etc/shadow",
    ],
    max_len: 64 * 1024,
    hang: SEC,
};

fn kubeconfig_exec() -> Exec {
    let dir = TempDir::new("fuzz-kubeconfig");
    let path = dir.0.join("kubeconfig");
    let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    Box::new(move |input| {
        let _keep = &dir;
        fs::write(&path, input).expect("write the kubeconfig");
        match holdfast::kube::kubeconfig::Kubeconfig::load_at(&path, now) {
            Ok(_) => "ok".to_string(),
            Err(e) => kind(&chain(&e)),
        }
    })
}

const ARCHIVE: Target = Target {
    name: "archive",
    dict: &[
        b"blobs/sha256/",
        b"index.json",
        b"manifest.json",
        b"oci-layout",
        b"../",
        b"/",
        b"\"mediaType\":\"application/vnd.oci.image.index.v1+json\"",
        b"\"size\":",
        b"\"digest\":\"sha256:",
        b"\"manifests\":[",
        b"\"Layers\":[",
        b"\"RepoTags\":[",
        b"\"Config\":",
        b"00000001750",
        b"77777777777",
        b"ustar\x0000",
        b"1",
        b"2",
        b"5",
    ],
    max_len: 256 * 1024,
    hang: Duration::from_secs(3),
};

/// What lies beside the directory an untrusted archive or layer is unpacked into: a
/// canary file and directory that nothing may write to, and nothing else.
struct Fence {
    top: PathBuf,
    canary: PathBuf,
    expected: Vec<String>,
}

const CANARY_TEXT: &[u8] = b"left alone\n";
/// An absolute path the hostile seeds aim at.
const ESCAPE_ABS: &str = "/tmp/holdfast-fuzz-escape";

impl Fence {
    /// The fence, and the temporary directory it is in (to be dropped after all that
    /// works inside it).
    fn new(tag: &str, inside: &[&str]) -> (Fence, TempDir) {
        let dir = TempDir::new(tag);
        let top = dir.0.clone();
        let canary = top.join("canary");
        fs::create_dir(&canary).expect("canary dir");
        fs::write(canary.join("file"), CANARY_TEXT).expect("canary file");
        let mut expected: Vec<String> = inside.iter().map(|s| s.to_string()).collect();
        expected.push("canary".into());
        expected.sort();
        let fence = Fence {
            top,
            canary,
            expected,
        };
        (fence, dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.top.join(name)
    }

    /// Panics when anything was written outside the inner directory.
    fn check(&self) {
        let mut names: Vec<String> = fs::read_dir(&self.top)
            .expect("list the fence")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| self.expected.contains(n) || !n.ends_with(".in"))
            .collect();
        names.sort();
        assert_eq!(
            names, self.expected,
            "something was written beside the target dir"
        );
        let canary: Vec<String> = fs::read_dir(&self.canary)
            .expect("list the canary")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            canary,
            vec!["file".to_string()],
            "something was written into the canary dir"
        );
        let file = self.canary.join("file");
        assert_eq!(
            fs::read(&file).expect("read the canary"),
            CANARY_TEXT,
            "the canary was changed"
        );
        let meta = fs::symlink_metadata(&file).expect("canary metadata");
        assert_eq!(meta.nlink(), 1, "the canary was hard-linked from inside");
        assert_eq!(meta.mode() & 0o7777, 0o644, "the canary's mode was changed");
        assert!(
            fs::symlink_metadata(ESCAPE_ABS).is_err(),
            "{ESCAPE_ABS} was written"
        );
    }
}

fn archive_exec() -> Exec {
    let (fence, dir) = Fence::new("fuzz-archive", &["root"]);
    let root = fence.path("root");
    fs::create_dir(&root).expect("create the image root");
    let store = Store::open(&root.join("db")).expect("open the store");
    let images = ImageStore::open(&root, &store).expect("open the image store");
    let input_path = fence.path("archive.in");
    let exec = Box::new(move |input: &[u8]| {
        let _keep = &store;
        let mut bytes = input.to_vec();
        fuzz::fix_tar_checksums(&mut bytes);
        // Half the inputs have their blobs' digests and sizes made true again, so a
        // mutated manifest or config is read rather than refused for its digest.
        if input.len().is_multiple_of(2) {
            if let Some(rehashed) = rehash_layout(&bytes) {
                bytes = rehashed;
            }
        }
        fs::write(&input_path, &bytes).expect("write the archive");
        let outcome = match images.import(&input_path) {
            Ok(records) => {
                let mut outcome = format!("ok {} images", records.len().min(3));
                for r in &records {
                    if let Some(reference) = r.references.first() {
                        // Resolving what was imported unpacks its layers.
                        if let Err(e) = images.resolve(reference) {
                            outcome = kind(&format!("resolve: {}", chain(&e)));
                        }
                    }
                }
                outcome
            }
            Err(e) => kind(&chain(&e)),
        };
        fence.check();
        outcome
    });
    fuzz::then_drop(exec, dir)
}

/// The archive with every `blobs/sha256/<hex>` entry renamed to its content's digest,
/// every reference to the old name changed to the new one and every `"size"` after it
/// made the blob's length, repeated until the names hold (manifests name configs and
/// layers, indexes name manifests). None when it is not a tar.
fn rehash_layout(archive: &[u8]) -> Option<Vec<u8>> {
    use sha2::{Digest, Sha256};
    let mut entries = Vec::new();
    let mut ar = tar::Archive::new(archive);
    for e in ar.entries().ok()? {
        let mut e = e.ok()?;
        let header = e.header().clone();
        let path = e.path_bytes().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).ok()?;
        entries.push((header, path, data));
    }
    const PREFIX: &[u8] = b"blobs/sha256/";
    for _ in 0..4 {
        let mut renames: Vec<(Vec<u8>, Vec<u8>, usize)> = Vec::new();
        for (_, path, data) in &mut entries {
            let Some(old) = path.strip_prefix(PREFIX) else {
                continue;
            };
            let new: Vec<u8> = Sha256::digest(&data[..])
                .iter()
                .flat_map(|b| format!("{b:02x}").into_bytes())
                .collect();
            if old != new.as_slice() {
                renames.push((old.to_vec(), new.clone(), data.len()));
                *path = [PREFIX, &new].concat();
            }
        }
        if renames.is_empty() {
            break;
        }
        for (_, _, data) in &mut entries {
            for (old, new, len) in &renames {
                if old.is_empty() {
                    continue;
                }
                *data = replace_digest(data, old, new, *len);
            }
        }
    }
    let mut out = tar::Builder::new(Vec::new());
    for (mut header, path, data) in entries {
        header.set_size(data.len() as u64);
        if header.set_path(std::str::from_utf8(&path).ok()?).is_err() {
            return None;
        }
        header.set_cksum();
        out.append(&header, data.as_slice()).ok()?;
    }
    out.into_inner().ok()
}

/// `data` with `old` replaced by `new` and the first `"size":` number after each
/// replacement (before the object ends) set to `len`.
fn replace_digest(data: &[u8], old: &[u8], new: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(old) {
            out.extend_from_slice(new);
            i += old.len();
            let rest = &data[i..];
            let end = rest.iter().position(|&b| b == b'}').unwrap_or(rest.len());
            if let Some(at) = split(&rest[..end], b"\"size\":").first().map(|s| s.len()) {
                if at < end {
                    let digits_at = at + b"\"size\":".len();
                    let digits = rest[digits_at..]
                        .iter()
                        .take_while(|b| b.is_ascii_digit())
                        .count();
                    out.extend_from_slice(&rest[..digits_at]);
                    out.extend_from_slice(len.to_string().as_bytes());
                    i += digits_at + digits;
                }
            }
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

const LAYER: Target = Target {
    name: "layer",
    dict: &[
        b"../",
        b"/",
        b"./",
        b".wh.",
        b".wh..wh..opq",
        b"/tmp/holdfast-fuzz-escape",
        b"../canary/file",
        b"../../canary",
        b"0000644\0",
        b"0004755\0",
        b"0007777\0",
        b"00000000000\0",
        b"77777777777\0",
        b"ustar\x0000",
        b"ustar  \0",
        b"././@LongLink",
        b"path=",
        b"SCHILY.xattr.trusted.overlay.opaque=y\n",
        b"SCHILY.xattr.user.a=b\n",
        b"SCHILY.xattr.security.capability=",
        b"1",
        b"2",
        b"3",
        b"4",
        b"5",
        b"6",
        b"x",
        b"L",
        b"K",
    ],
    max_len: 256 * 1024,
    hang: Duration::from_secs(2),
};

fn layer_exec() -> Exec {
    let (fence, dir) = Fence::new("fuzz-layer", &["layers"]);
    let layers = fence.path("layers");
    fs::create_dir(&layers).expect("create the layers dir");
    let blob = fence.path("blob.in");
    let exec = Box::new(move |input: &[u8]| {
        let mut bytes = input.to_vec();
        let compressed = bytes.starts_with(&[0x1f, 0x8b]) || bytes.starts_with(&[0x28, 0xb5]);
        if !compressed {
            fuzz::fix_tar_checksums(&mut bytes);
            // A quarter of the plain tars go in gzipped, as most layers come.
            if bytes.len().is_multiple_of(4) {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(&bytes).expect("gzip in memory");
                bytes = gz.finish().expect("gzip in memory");
            }
        }
        fs::write(&blob, &bytes).expect("write the blob");
        let dest = layers.join("l");
        let outcome = match holdfast::image::unpack_layer_blob(&blob, &dest) {
            Ok(()) => {
                check_layer_dir(&dest);
                "ok".to_string()
            }
            Err(e) => {
                assert!(!dest.exists(), "a failed layer left {}", dest.display());
                kind(&chain(&e))
            }
        };
        fence.check();
        let _ = fs::remove_dir_all(&dest);
        outcome
    });
    fuzz::then_drop(exec, dir)
}

/// What an unpacked layer may hold: no hard link to anything outside it, and no
/// `trusted.overlay.*` attribute but the opaque marker made from a whiteout.
fn check_layer_dir(dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    let mut inodes = std::collections::HashMap::new();
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(meta) = fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(p.clone());
            }
            if meta.is_file() && meta.nlink() > 1 {
                *inodes.entry(meta.ino()).or_insert(0u64) += 1;
            }
            if let Ok(attrs) = xattr::list(&p) {
                for a in attrs {
                    let a = a.to_string_lossy();
                    assert!(
                        !a.starts_with("trusted.") || a == "trusted.overlay.opaque",
                        "{} carries {a}",
                        p.display()
                    );
                }
            }
        }
    }
    // Every hard-linked file's links must all be inside the layer.
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(meta) = fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() && meta.nlink() > 1 {
                let seen = inodes.get(&meta.ino()).copied().unwrap_or(0);
                assert_eq!(
                    seen,
                    meta.nlink(),
                    "{} is hard-linked from outside the layer",
                    p.display()
                );
            }
        }
    }
}

const HTTP: Target = Target {
    name: "http",
    dict: &[
        b"GET ",
        b"POST ",
        b"PUT ",
        b" HTTP/1.1\r\n",
        b" HTTP/1.0\r\n",
        b"\r\n",
        b"\r\n\r\n",
        b"Host: node\r\n",
        b"Content-Length: ",
        b"Transfer-Encoding: chunked\r\n",
        b"Connection: Upgrade\r\n",
        b"Upgrade: SPDY/3.1\r\n",
        b"Upgrade: websocket\r\n",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        b"Sec-WebSocket-Version: 13\r\n",
        b"Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n",
        b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n",
        b"/containerLogs/default/p/c",
        b"/exec/default/p/c",
        b"/attach/default/p/c",
        b"/portForward/default/p",
        b"/stats/summary",
        b"/metrics/resource",
        b"/runningpods/",
        b"/configz",
        b"?tailLines=",
        b"&limitBytes=",
        b"&sinceSeconds=",
        b"&sinceTime=2024-01-01T00:00:00Z",
        b"&follow=true",
        b"&previous=1",
        b"&command=sh",
        b"&port=",
        b"%",
        b"%00",
        b"%ff",
        b"//",
        b"/../",
    ],
    max_len: 16 * 1024,
    hang: Duration::from_secs(2),
};

fn http_exec() -> Exec {
    use holdfast::config::{AuthorizationMode, ServerConfig};
    use holdfast::server::{ApiDeps, Port};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = TempDir::new("fuzz-http");
    let store = Store::open(&dir.0.join("db")).expect("open the store");
    let runtime = holdfast::runtime::LibcontainerRuntime::new(
        dir.0.join("runtime"),
        "holdfast-fuzz",
        Some(PathBuf::from("/bin/false")),
    )
    .expect("runtime");
    let deps = Arc::new(ApiDeps {
        node_name: "fuzz-node".into(),
        port: 10250,
        root_dir: dir.0.clone(),
        podstates: holdfast::sync::PodStates::open(&store).expect("podstates tree"),
        runtime: Arc::new(runtime),
        uplink: None,
        configz: Arc::new(serde_json::json!({"kind": "KubeletConfiguration"})),
        settings: ServerConfig {
            anonymous: true,
            authorization: AuthorizationMode::AlwaysAllow,
            ..ServerConfig::default()
        },
        sampler: Arc::new(holdfast::server::sampler::Sampler::default()),
        streams: Arc::new(tokio::sync::Semaphore::new(holdfast::server::MAX_STREAMS)),
        auth: holdfast::server::Auth::new(
            &ServerConfig {
                anonymous: true,
                ..ServerConfig::default()
            },
            "fuzz-node",
            None,
        ),
    });
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("listen");
    let addr = listener.local_addr().expect("listener address");
    let exec = Box::new(move |input: &[u8]| {
        let _keep = &store;
        let deps = deps.clone();
        rt.block_on(async {
            let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let (stream, peer) = listener.accept().await.expect("accept");
            let server = tokio::spawn(api::serve_connection(
                stream,
                peer,
                Port::Secure,
                deps,
                None,
            ));
            let _ = client.write_all(input).await;
            let _ = client.shutdown().await;
            let mut response = Vec::new();
            let mut buf = [0u8; 8192];
            let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
            loop {
                match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(n)) => {
                        if response.len() < 64 * 1024 {
                            response.extend_from_slice(&buf[..n]);
                        }
                    }
                }
            }
            drop(client);
            match tokio::time::timeout(Duration::from_secs(2), server).await {
                Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Ok(_) => {}
                // An upgraded stream may outlive the client a little; it is not a hang
                // of the parser. Its task is left to end on its own.
                Err(_) => {}
            }
            let head = response.split(|&b| b == b'\r').next().unwrap_or_default();
            let status = String::from_utf8_lossy(&head[..head.len().min(12)]).into_owned();
            if status.is_empty() {
                "no response".to_string()
            } else {
                status
            }
        })
    });
    fuzz::then_drop(exec, dir)
}

const SPDY: Target = Target {
    name: "spdy",
    dict: &[
        b"\x80\x03\x00\x01",
        b"\x80\x03\x00\x02",
        b"\x80\x03\x00\x03",
        b"\x80\x03\x00\x06",
        b"\x80\x03\x00\x07",
        b"\x80\x03\x00\x09",
        b"\x00\x00\x00\x01",
        b"\x01",
        b"\xff\xff\xff",
        b"\x78\xbb",
        b"streamtype",
        b"stdin",
        b"error",
        b"port",
    ],
    max_len: 64 * 1024,
    hang: SEC,
};

fn spdy_exec() -> Exec {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    Box::new(move |input| {
        rt.block_on(async {
            let mut rd: &[u8] = input;
            let mut headers = api::Headers::default();
            let mut outcome = String::new();
            let mut frames = 0;
            loop {
                match api::read_frame(&mut rd).await {
                    Ok(api::Frame::Control {
                        kind: k, payload, ..
                    }) => {
                        frames += 1;
                        // SYN_STREAM and SYN_REPLY carry a header block after their ids.
                        let skip = match k {
                            1 => 10,
                            2 => 4,
                            _ => continue,
                        };
                        if payload.len() < skip {
                            outcome = format!("short control frame {k}");
                            continue;
                        }
                        match headers.decode(&payload[skip..]) {
                            Ok(pairs) => {
                                let total: usize =
                                    pairs.iter().map(|(n, v)| n.len() + v.len()).sum();
                                assert!(total < 16 << 20, "{total} bytes of headers decoded");
                            }
                            Err(e) => {
                                outcome = kind(&e);
                                break;
                            }
                        }
                    }
                    Ok(api::Frame::Data { .. }) => frames += 1,
                    Err(e) => {
                        if outcome.is_empty() {
                            outcome = kind(&e.to_string());
                        }
                        break;
                    }
                }
            }
            format!("{} frames, {outcome}", frames.min(3))
        })
    })
}

const WEBSOCKET: Target = Target {
    name: "websocket",
    dict: &[
        b"\x81",
        b"\x82",
        b"\x01",
        b"\x00",
        b"\x80",
        b"\x88",
        b"\x89",
        b"\x8a",
        b"\xfe",
        b"\xff",
        b"\x7e",
        b"\x7f",
        b"\x00\x00\x00\x00",
        b"\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\x7f\xff\xff\xff\xff\xff\xff\xff",
    ],
    max_len: 64 * 1024,
    hang: SEC,
};

fn websocket_exec() -> Exec {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    Box::new(move |input| {
        rt.block_on(async {
            let mut rd: &[u8] = input;
            let mut partial = (None, Vec::new());
            let mut messages = 0;
            loop {
                match api::read_message(&mut rd, &mut partial).await {
                    Ok((_, payload)) => {
                        assert!(
                            payload.len() <= input.len(),
                            "a message longer than its frames"
                        );
                        messages += 1;
                    }
                    Err(e) => {
                        return format!("{} messages, {}", messages.min(3), kind(&e.to_string()))
                    }
                }
            }
        })
    })
}

const CRI_LOGS: Target = Target {
    name: "cri_logs",
    dict: &[
        b"2024-01-01T00:00:00.000000000Z stdout F ",
        b"2024-01-01T00:00:00.000000001Z stderr P ",
        b"9999-12-31T23:59:59.999999999Z",
        b"-009999-01-01T00:00:00Z",
        b"1970-01-01T00:00:00+14:00",
        b" stdout ",
        b" stderr ",
        b" F ",
        b" P ",
        b"\n",
        b"\n@@rotate@@\n",
        b"tailLines=",
        b"&limitBytes=",
        b"&sinceSeconds=",
        b"&sinceTime=",
        b"&timestamps=true",
        b"&previous=true",
        b"&follow=true",
    ],
    max_len: 128 * 1024,
    hang: SEC,
};

fn cri_logs_exec() -> Exec {
    let dir = TempDir::new("fuzz-cri-logs");
    let live = dir.0.join("0.log");
    let now: holdfast::time::Timestamp = "2024-06-01T00:00:00Z".parse().expect("a timestamp");
    Box::new(move |input| {
        let _keep = &dir;
        for e in fs::read_dir(&dir.0).expect("list the log dir").flatten() {
            let _ = fs::remove_file(e.path());
        }
        let (query, content) = match input.iter().position(|&b| b == b'\n') {
            Some(i) => (&input[..i], &input[i + 1..]),
            None => (input, &[][..]),
        };
        let q = api::Query::parse(&String::from_utf8_lossy(query));
        let mut opts = match api::LogOptions::parse(&q, now) {
            Ok(o) => o,
            Err((status, message)) => return format!("{status} {}", kind(&message)),
        };
        // Following waits for a container; here there is none.
        opts.follow = false;
        // Files split at `@@rotate@@` lines: the rotated ones first, oldest first.
        let parts: Vec<&[u8]> = split(content, b"\n@@rotate@@\n");
        let (rotated, last) = parts.split_at(parts.len() - 1);
        for (i, part) in rotated.iter().enumerate() {
            fs::write(dir.0.join(format!("0.log.2024010100000{i}")), part).expect("write");
        }
        fs::write(&live, last[0]).expect("write the live log");
        let mut out = Vec::new();
        if let Err(e) = api::read_log(&live, &opts, None, &|_| false, &mut out) {
            return kind(&e.to_string());
        }
        if let Some(limit) = opts.limit_bytes {
            assert!(
                out.len() as u64 <= limit,
                "{} bytes out past limitBytes={limit}",
                out.len()
            );
        }
        if let Some(n) = opts.tail_lines {
            let lines = out.iter().filter(|&&b| b == b'\n').count() as u64;
            assert!(lines <= n, "{lines} lines out past tailLines={n}");
        }
        if out.is_empty() {
            "ok, nothing".to_string()
        } else {
            "ok".to_string()
        }
    })
}

fn split<'a>(data: &'a [u8], sep: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + sep.len() <= data.len() {
        if &data[i..i + sep.len()] == sep {
            out.push(&data[start..i]);
            i += sep.len();
            start = i;
        } else {
            i += 1;
        }
    }
    out.push(&data[start..]);
    out
}

const STORE_RECORDS: Target = Target {
    name: "store_records",
    dict: &[
        b"\"2024-01-01T00:00:00Z\"",
        b"\"9999-12-31T23:59:59.999999999Z\"",
        b"\"-009999-01-01T00:00:00Z\"",
        b"null",
        b"[]",
        b"{}",
        b"\"\"",
        b"true",
        b"1e999",
        b"-0",
        b"4294967296",
        b"\"\\ud800\"",
        b"\"Running\"",
        b"\"Terminated\"",
        b"{\"Running\":{\"started_at\":\"2024-01-01T00:00:00Z\"}}",
        b"\"restart_count\":",
        b"\"exit_code\":",
        b"\"start_time\":",
    ],
    max_len: 64 * 1024,
    hang: SEC,
};

fn store_records_exec() -> Exec {
    use holdfast::image::ImageRecord;
    use holdfast::store::Tree;
    use holdfast::sync::{ContainerRecord, PodState};
    use k8s_openapi::api::core::v1::Pod;

    let dir = TempDir::new("fuzz-store");
    let store = Store::open(&dir.0.join("db")).expect("open the store");
    let raw: Tree<serde_json::Value> = store.tree("fuzz").expect("tree");
    let pods: Tree<PodState> = store.tree("fuzz").expect("tree");
    let containers: Tree<ContainerRecord> = store.tree("fuzz").expect("tree");
    let images: Tree<ImageRecord> = store.tree("fuzz").expect("tree");
    let manifests: Tree<Pod> = store.tree("fuzz").expect("tree");

    fn roundtrip<T>(tree: &Tree<T>, label: &str) -> String
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        match tree.get("k") {
            Ok(Some(v)) => {
                // What decodes must encode, and decode again to itself.
                tree.put("again", &v).expect("a decoded record encodes");
                let back = tree.get("again").expect("re-read").expect("present");
                assert_eq!(back, v, "{label} changes across a store round trip");
                format!("{label} ok")
            }
            Ok(None) => format!("{label} missing"),
            Err(e) => format!("{label} {}", kind(&chain(&e))),
        }
    }

    let exec = Box::new(move |input: &[u8]| {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(input) else {
            // Not JSON at all: the decoders must still only refuse it.
            let _ = serde_json::from_slice::<PodState>(input);
            let _ = serde_json::from_slice::<ContainerRecord>(input);
            return "not json".to_string();
        };
        raw.put("k", &value).expect("store a value");
        [
            roundtrip(&pods, "pod"),
            roundtrip(&containers, "container"),
            roundtrip(&images, "image"),
            roundtrip(&manifests, "manifest"),
        ]
        .join("; ")
    });
    fuzz::then_drop(exec, dir)
}

// ---------------------------------------------------------------------------------
// The fuzz runs, one test each so they share the machine's cores.

fn run(target: &Target, make: fn() -> Exec) {
    fuzz::fuzz(target, fuzz::corpus(target.name), make);
}

#[test]
fn fuzz_manifest() {
    run(&MANIFEST, manifest_exec);
}

#[test]
fn fuzz_config() {
    run(&CONFIG, config_exec);
}

#[test]
fn fuzz_kubeconfig() {
    run(&KUBECONFIG, kubeconfig_exec);
}

#[test]
fn fuzz_archive() {
    run(&ARCHIVE, archive_exec);
}

#[test]
fn fuzz_layer() {
    run(&LAYER, layer_exec);
}

#[test]
fn fuzz_http() {
    run(&HTTP, http_exec);
}

#[test]
fn fuzz_spdy() {
    run(&SPDY, spdy_exec);
}

#[test]
fn fuzz_websocket() {
    run(&WEBSOCKET, websocket_exec);
}

#[test]
fn fuzz_cri_logs() {
    run(&CRI_LOGS, cri_logs_exec);
}

#[test]
fn fuzz_store_records() {
    run(&STORE_RECORDS, store_records_exec);
}

/// A target and the maker of its `Exec`.
type Entry = (&'static Target, fn() -> Exec);

const TARGETS: [Entry; 10] = [
    (&MANIFEST, manifest_exec),
    (&CONFIG, config_exec),
    (&KUBECONFIG, kubeconfig_exec),
    (&ARCHIVE, archive_exec),
    (&LAYER, layer_exec),
    (&HTTP, http_exec),
    (&SPDY, spdy_exec),
    (&WEBSOCKET, websocket_exec),
    (&CRI_LOGS, cri_logs_exec),
    (&STORE_RECORDS, store_records_exec),
];

/// Every input that once failed, replayed.
#[test]
fn regressions() {
    for (target, make) in TARGETS {
        let dir = fuzz::repo_path(&format!("tests/fuzz/regressions/{}", target.name));
        fuzz::replay(target, &dir, make);
    }
}

// ---------------------------------------------------------------------------------
// The generated part of the corpus.

fn write_seeds(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let dir = fuzz::repo_path(&format!("tests/fuzz/corpus/{target}"));
    fs::create_dir_all(&dir).expect("create corpus dir");
    for (name, bytes) in seeds {
        fs::write(dir.join(name), bytes).expect("write seed");
    }
}

#[test]
#[ignore = "rewrites tests/fuzz/corpus; run by hand when the formats change"]
fn write_seed_corpus() {
    seeds_manifest();
    seeds_config_and_kubeconfig();
    seeds_archive_and_layer();
    seeds_http();
    seeds_spdy();
    seeds_websocket();
    seeds_cri_logs();
    seeds_store_records();
}

fn seeds_manifest() {
    let mut seeds = Vec::new();
    for (name, bytes) in fuzz::files_in(&fuzz::repo_path("tests/fixtures")) {
        if name.ends_with(".yaml") {
            seeds.push((name, bytes));
        }
    }
    let refs: Vec<(&str, Vec<u8>)> = seeds.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    write_seeds("manifest", &refs);
}

fn seeds_config_and_kubeconfig() {
    use base64::Engine;
    write_seeds(
        "config",
        &[
            (
                "agent.yaml",
                b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                  fileCheckFrequency: 2s\nsyncFrequency: 5s\ncgroupRoot: /holdfast\n\
                  address: 127.0.0.1\nport: 10250\nhealthzPort: 10248\nreadOnlyPort: 10255\n\
                  authentication:\n  x509:\n    clientCAFile: /etc/ca.crt\n  anonymous:\n    enabled: true\n\
                  authorization:\n  mode: Webhook\n\
                  evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 10%\n\
                  systemReserved:\n  memory: 64Mi\n  cpu: 100m\n\
                  maxPods: 20\npodPidsLimit: 1024\ncontainerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\n\
                  registerWithTaints:\n- key: site\n  value: edge\n  effect: NoSchedule\n\
                  holdfast:\n  crashLoopBackOffInitial: 1s\n  crashLoopBackOffMax: 4s\n  evictionMonitoringPeriod: 24h\n"
                    .to_vec(),
            ),
            ("minimal.yaml", b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n".to_vec()),
        ],
    );
    let dir = TempDir::new("fuzz-pki");
    let ca = pki::Pki::new(&dir.0);
    let client = ca.client("node", "system:node:fuzz", &["system:nodes"]);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let config = |cluster: &str, user: &str| {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: ctx\n\
             clusters:\n- name: c\n  cluster:\n{cluster}\
             users:\n- name: u\n  user:\n{user}\
             contexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\n"
        )
        .into_bytes()
    };
    let cluster_data = format!(
        "    server: https://10.0.0.1:6443/\n    certificate-authority-data: {}\n",
        b64(&ca.ca_pem)
    );
    write_seeds(
        "kubeconfig",
        &[
            (
                "client-cert-data",
                config(
                    &cluster_data,
                    &format!(
                        "    client-certificate-data: {}\n    client-key-data: {}\n",
                        b64(&client.cert_pem),
                        b64(&client.key_pem)
                    ),
                ),
            ),
            ("token", config(&cluster_data, "    token: abc.def\n")),
            (
                "plain-http",
                config("    server: http://127.0.0.1:8080\n", "    token: t\n"),
            ),
            (
                "files",
                config(
                    "    server: https://k8s:6443\n    certificate-authority: ca.crt\n",
                    "    client-certificate: node.crt\n    client-key: node.key\n",
                ),
            ),
        ],
    );
}

fn seeds_archive_and_layer() {
    use oci::{Config, Entry, Image, Layer};
    let dir = TempDir::new("fuzz-seeds");
    let base = || {
        vec![
            Entry::dir("etc/", 0o755),
            Entry::file("etc/base", b"base", 0o644),
            Entry::symlink("etc/link", "base"),
            Entry::hardlink("etc/hard", "etc/base"),
            Entry::file("etc/.wh.gone", b"", 0o644),
            Entry::dir("var/", 0o755),
            Entry::file("var/.wh..wh..opq", b"", 0o644),
        ]
    };
    let image = |layers: Vec<Layer>| Image {
        layers,
        config: Config {
            cmd: Some(vec!["/bin/app".into()]),
            env: vec!["PATH=/bin".into()],
            ..Config::default()
        },
        ref_name: Some("fuzz:1".into()),
        nested_index: false,
    };
    let read = |p: &Path| fs::read(p).expect("read seed");
    let oci_tar = dir.0.join("oci.tar");
    image(vec![Layer::new(base())])
        .write_layout_tar(&oci_tar)
        .expect("oci tar");
    let oci_gz = dir.0.join("oci-gz.tar");
    image(vec![
        Layer::new(base()).gzipped(),
        Layer::new(vec![Entry::file("b", b"b", 0o600)]),
    ])
    .write_layout_tar(&oci_gz)
    .expect("oci tar gz");
    let nested = dir.0.join("nested.tar");
    Image {
        nested_index: true,
        ..image(vec![Layer::new(base())])
    }
    .write_layout_tar(&nested)
    .expect("nested index tar");
    let docker = dir.0.join("docker.tar");
    image(vec![Layer::new(base())])
        .write_docker_save(&docker, &["fuzz:docker"])
        .expect("docker save");
    write_seeds(
        "archive",
        &[
            ("oci.tar", read(&oci_tar)),
            ("oci-gzip-layers.tar", read(&oci_gz)),
            ("nested-index.tar", read(&nested)),
            ("docker-save.tar", read(&docker)),
        ],
    );

    let raw = |path: &str, kind: tar::EntryType, link: &str| Entry::Raw {
        path: path.as_bytes().to_vec(),
        kind,
        content: b"pwned".to_vec(),
        link: link.as_bytes().to_vec(),
        mode: 0o644,
    };
    let tar_of = |entries: Vec<Entry>| oci::layer_tar(&Layer::new(entries)).expect("layer tar");
    let plain = tar_of(base());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).expect("gzip");
    let gz = gz.finish().expect("gzip");
    let zst = ruzstd::encoding::compress_to_vec(
        plain.as_slice(),
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    write_seeds(
        "layer",
        &[
            ("base.tar", plain),
            ("base.tar.gz", gz),
            ("base.tar.zst", zst),
            (
                "dotdot.tar",
                tar_of(vec![raw("../canary/file", tar::EntryType::Regular, "")]),
            ),
            (
                "absolute.tar",
                tar_of(vec![raw(ESCAPE_ABS, tar::EntryType::Regular, "")]),
            ),
            (
                "symlink-escape.tar",
                tar_of(vec![
                    Entry::symlink("evil", "../../canary"),
                    raw("evil/pwned", tar::EntryType::Regular, ""),
                ]),
            ),
            (
                "hardlink-escape.tar",
                tar_of(vec![raw(
                    "passwd",
                    tar::EntryType::Link,
                    "../../canary/file",
                )]),
            ),
            (
                "devices.tar",
                tar_of(vec![
                    raw("dev-null", tar::EntryType::Char, ""),
                    raw("fifo", tar::EntryType::Fifo, ""),
                    raw("disk", tar::EntryType::Block, ""),
                ]),
            ),
            (
                "long-names.tar",
                tar_of(vec![
                    Entry::dir(&"d".repeat(120), 0o755),
                    Entry::file(
                        &format!("{}/{}", "d".repeat(120), "f".repeat(200)),
                        b"x",
                        0o644,
                    ),
                ]),
            ),
        ],
    );
}

fn seeds_http() {
    let reqs: [(&str, &str); 9] = [
        ("healthz", "GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n"),
        ("pods", "GET /pods HTTP/1.1\r\nHost: node\r\n\r\n"),
        ("runningpods", "GET /runningpods/ HTTP/1.1\r\nHost: node\r\n\r\n"),
        (
            "logs",
            "GET /containerLogs/default/p/c?tailLines=5&limitBytes=100&sinceSeconds=10&timestamps=true HTTP/1.1\r\nHost: node\r\n\r\n",
        ),
        (
            "exec-spdy",
            "POST /exec/default/p/c?command=sh&command=-c&command=echo%20hi&stdout=1&stderr=1 HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n",
        ),
        (
            "attach-websocket",
            "GET /attach/default/p/c?stdout=1 HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n",
        ),
        (
            "portforward",
            "GET /portForward/default/p?port=80 HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: portforward.k8s.io\r\n\r\n",
        ),
        (
            "stats-chunked",
            "POST /stats/summary?only_cpu_and_memory=true HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        (
            "pipelined",
            "GET /configz HTTP/1.1\r\nHost: node\r\n\r\nGET /metrics/resource HTTP/1.1\r\nHost: node\r\n\r\nGET /nope HTTP/1.1\r\n\r\n",
        ),
    ];
    let seeds: Vec<(&str, Vec<u8>)> = reqs
        .iter()
        .map(|(n, r)| (*n, r.as_bytes().to_vec()))
        .collect();
    write_seeds("http", &seeds);
}

fn seeds_spdy() {
    let mut h = api::Headers::default();
    let syn = |h: &mut api::Headers, id: u32, pairs: &[(&str, &str)]| {
        let mut p = id.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&h.encode(pairs));
        holdfast_spdy_control(1, 0, &p)
    };
    let mut session = Vec::new();
    session.extend(syn(&mut h, 1, &[("streamtype", "error")]));
    session.extend(syn(&mut h, 3, &[("streamtype", "stdin")]));
    session.extend(holdfast_spdy_data(3, 0, b"echo hi\n"));
    session.extend(holdfast_spdy_data(3, 1, b""));
    session.extend(holdfast_spdy_control(6, 0, &1u32.to_be_bytes()));
    session.extend(holdfast_spdy_control(3, 0, &[0, 0, 0, 3, 0, 0, 0, 5]));
    session.extend(holdfast_spdy_control(7, 0, &[0, 0, 0, 3, 0, 0, 0, 0]));
    let mut h2 = api::Headers::default();
    let portforward = syn(
        &mut h2,
        1,
        &[("streamtype", "data"), ("port", "80"), ("requestid", "0")],
    );
    write_seeds(
        "spdy",
        &[("exec-session", session), ("portforward-syn", portforward)],
    );
}

fn holdfast_spdy_control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80, 3];
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

fn holdfast_spdy_data(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = stream.to_be_bytes().to_vec();
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

fn ws_frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut f = vec![(u8::from(fin) << 7) | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    if payload.len() < 126 {
        f.push(m | payload.len() as u8);
    } else if payload.len() <= 0xffff {
        f.push(m | 126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    } else {
        f.push(m | 127);
        f.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    }
    match mask {
        Some(k) => {
            f.extend_from_slice(&k);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        }
        None => f.extend_from_slice(payload),
    }
    f
}

fn seeds_websocket() {
    let k = Some([1, 2, 3, 4]);
    let mut fragmented = ws_frame(false, 2, b"\x00echo ", k);
    fragmented.extend(ws_frame(true, 9, b"ping", k));
    fragmented.extend(ws_frame(false, 0, b"hi", k));
    fragmented.extend(ws_frame(true, 0, b"\n", k));
    fragmented.extend(ws_frame(true, 8, b"\x03\xe8bye", k));
    write_seeds(
        "websocket",
        &[
            ("binary", ws_frame(true, 2, b"\x00hello", k)),
            ("fragmented", fragmented),
            ("medium", ws_frame(true, 2, &[7u8; 300], k)),
            ("large", ws_frame(true, 1, &[b'a'; 70_000], None)),
            ("close", ws_frame(true, 8, b"", None)),
        ],
    );
}

fn seeds_cri_logs() {
    let lines = "2024-01-01T00:00:00.000000000Z stdout F first\n\
                 2024-01-01T00:00:01.000000000Z stderr P part\n\
                 2024-01-01T00:00:01.500000000Z stderr F ial\n\
                 2024-01-01T00:00:02+02:00 stdout F zoned\n";
    write_seeds(
        "cri_logs",
        &[
            ("plain", format!("\n{lines}").into_bytes()),
            (
                "tail",
                format!("tailLines=2&timestamps=true\n{lines}").into_bytes(),
            ),
            (
                "rotated",
                format!(
                    "limitBytes=20&sinceTime=2024-01-01T00:00:00.5Z\n{lines}@@rotate@@\n{lines}"
                )
                .into_bytes(),
            ),
            (
                "since",
                format!("sinceSeconds=100000000&tailLines=0\n{lines}torn").into_bytes(),
            ),
        ],
    );
}

fn seeds_store_records() {
    use holdfast::image::ImageRecord;
    use holdfast::runtime::ContainerId;
    use holdfast::sync::record::{Instance, InstanceState, Terminated};
    use holdfast::sync::{ContainerRecord, PodState};
    let t: holdfast::time::Timestamp = "2024-01-01T00:00:00.123Z".parse().expect("time");
    let terminated = Terminated {
        container_id: Some("holdfast://abc".into()),
        exit_code: 137,
        signal: Some(9),
        reason: "OOMKilled".into(),
        message: None,
        started_at: Some(t),
        finished_at: t,
    };
    let mut record = ContainerRecord::new("app");
    record.restart_count = 3;
    record.current = Some(Instance {
        id: ContainerId::derive("uid", "app", 3),
        image: "busybox".into(),
        image_id: "sha256:00".into(),
        state: InstanceState::Running { started_at: t },
    });
    record.last = Some(terminated.clone());
    let mut done = ContainerRecord::new("init");
    done.current = Some(Instance {
        id: ContainerId::derive("uid", "init", 0),
        image: "busybox".into(),
        image_id: "sha256:00".into(),
        state: InstanceState::Terminated(terminated),
    });
    let image = ImageRecord {
        references: vec!["docker.io/library/busybox:latest".into()],
        manifest_digest: "sha256:aa".into(),
        config_digest: "sha256:bb".into(),
        layers: vec!["sha256:cc".into()],
        size: 12345,
        imported_at: t,
        last_used: Some(t),
        pinned: false,
    };
    let pod: k8s_openapi::api::core::v1::Pod = serde_yaml::from_slice(
        &fs::read(fuzz::repo_path("tests/fixtures/sleep.yaml")).expect("fixture"),
    )
    .expect("fixture pod");
    let state = PodState {
        pod: pod.clone(),
        status: k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        },
        start_time: t,
        stop_deadline: None,
    };
    let json = |v: &dyn erased::Ser| v.to_json();
    write_seeds(
        "store_records",
        &[
            ("container-running", json(&record)),
            ("container-terminated", json(&done)),
            ("image", json(&image)),
            ("podstate", json(&state)),
            ("pod", json(&pod)),
        ],
    );
}

mod erased {
    pub trait Ser {
        fn to_json(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Ser for T {
        fn to_json(&self) -> Vec<u8> {
            serde_json::to_vec_pretty(self).expect("encode a seed")
        }
    }
}

#[test]
fn tar_checksums_are_rewritten() {
    let layer = oci::Layer::new(vec![oci::Entry::file("a", b"abc", 0o644)]);
    let good = oci::layer_tar(&layer).expect("layer tar");
    let mut broken = good.clone();
    broken[0] = b'b';
    fuzz::fix_tar_checksums(&mut broken);
    let mut archive = tar::Archive::new(broken.as_slice());
    let names: Vec<String> = archive
        .entries()
        .expect("entries")
        .map(|e| {
            e.expect("entry")
                .path()
                .expect("path")
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(names, vec!["b".to_string()]);
}

#[test]
fn kinds_drop_what_varies() {
    assert_eq!(
        kind("read manifest /tmp/x/pod.yaml: line 3 column 7: \"abc\""),
        "read manifest <path>: line # column #: <q>"
    );
}

#[test]
fn rehashed_archives_import() {
    let tar = fs::read(fuzz::repo_path("tests/fuzz/corpus/archive/oci.tar")).expect("seed");
    let edited = split(&tar, b"/bin/app").join(&b"/bin/apq"[..]);
    assert_ne!(edited, tar, "the seed names /bin/app");
    let mut exec = archive_exec();
    let rehashed = rehash_layout(&edited).expect("a tar");
    assert_eq!(exec(&rehashed), "ok 1 images");
}
