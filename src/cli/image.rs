//! `holdfast image pull`, `image ls` and `image prune`. A pull goes through the running
//! agent when there is one (it holds the store; sled admits one process), else it runs
//! here. Progress is a bar per layer on a terminal, a log line per layer every few
//! seconds otherwise.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::control::{self, ControlError, Request, Response};
use crate::image::registry::{self, Keyring, Progress, PullOptions};
use crate::image::{ImageRecord, ImageStore, Platform};
use crate::store::Store;
use crate::Error;

const PULL_USAGE: &str = "usage: holdfast image pull REF [--platform OS/ARCH[/VARIANT]] [--creds FILE] [--config FILE] [--root-dir DIR]";

/// How often a layer's line is printed when not on a terminal.
const LOG_EVERY: Duration = Duration::from_secs(3);

/// `holdfast image pull REF ...`.
pub(super) fn pull(root: &Path, args: &[String]) -> Result<(), Error> {
    let usage = || Error::Cli(PULL_USAGE.into());
    let mut reference = None;
    let mut platform = None;
    let mut creds = None;
    let mut config_file = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| -> Result<String, Error> {
            match a.strip_prefix(&format!("{flag}=")) {
                Some(v) => Ok(v.to_string()),
                None => it.next().cloned().ok_or_else(usage),
            }
        };
        if a == "--platform" || a.starts_with("--platform=") {
            platform = Some(value("--platform")?);
        } else if a == "--creds" || a.starts_with("--creds=") {
            creds = Some(absolute(&value("--creds")?)?);
        } else if a == "--config" || a.starts_with("--config=") {
            config_file = Some(PathBuf::from(value("--config")?));
        } else if a.starts_with('-') || reference.is_some() {
            return Err(usage());
        } else {
            reference = Some(a.clone());
        }
    }
    let reference = reference.ok_or_else(usage)?;
    if let Some(p) = &platform {
        Platform::parse(p).map_err(Error::Cli)?;
    }
    let view = Arc::new(Mutex::new(View::new(std::io::stderr().is_terminal())));
    let req = Request::ImagePull {
        reference: reference.clone(),
        platform: platform.clone(),
        creds: creds.as_ref().map(|p| p.display().to_string()),
    };
    let on_progress = {
        let view = view.clone();
        move |p: Progress| {
            view.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .update(p)
        }
    };
    let deadline = Instant::now() + super::AGENT_START_WAIT;
    let answer = loop {
        match control::client::call_with_progress(root, &req, on_progress.clone()) {
            Err(ControlError::NotRunning { .. })
                if control::presence::agent_running(root) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(ControlError::NotRunning { .. }) => {
                break pull_here(root, &reference, platform, creds, config_file, view.clone())?;
            }
            Err(e) => return Err(Error::Cli(e.to_string())),
            Ok(other) => {
                if let Some(path) = &config_file {
                    super::note(&format!(
                        "note: {} was not read: the running agent pulled with its own configuration",
                        path.display()
                    ));
                }
                break other;
            }
        }
    };
    view.lock().unwrap_or_else(PoisonError::into_inner).finish();
    match answer {
        Response::Pulled {
            image,
            downloaded,
            seconds,
        } => super::emit_line(&format!(
            "pulled {} {} ({}, {} downloaded in {seconds:.1}s)",
            image.references.join(" "),
            image.manifest_digest,
            super::human_size(image.size),
            super::human_size(downloaded)
        )),
        other => Err(Error::Cli(format!("pull: unexpected answer {other:?}"))),
    }
}

/// No agent runs: this process opens the store and pulls.
fn pull_here(
    root: &Path,
    reference: &str,
    platform: Option<String>,
    creds: Option<PathBuf>,
    config_file: Option<PathBuf>,
    view: Arc<Mutex<View>>,
) -> Result<Response, Error> {
    let (file, proxy) = match &config_file {
        Some(path) => {
            let (file, warnings) = crate::config::read_config_file(path)?;
            for w in warnings {
                log::warn!("{w}");
            }
            (file.images, file.proxy)
        }
        None => (crate::config::FileImages::default(), None),
    };
    crate::proxy::install(crate::config::proxy_rules(proxy.as_ref())?);
    let config = crate::config::ImageConfig::for_root(&file, root);
    let mut keyring = match &creds {
        Some(path) => Keyring::load(path).map_err(|e| Error::Cli(format!("--creds: {e}")))?,
        None => Keyring::default(),
    };
    keyring.extend(config.node_keyring().map_err(Error::Cli)?);
    std::fs::create_dir_all(root).map_err(|source| Error::Io {
        context: format!("create {}", root.display()),
        source,
    })?;
    let store = Store::open(&root.join("db"))?;
    let images = ImageStore::open(root, &store)?;
    let mut opts = PullOptions::new(keyring);
    if let Some(p) = platform {
        opts.platform = Platform::parse(&p).map_err(Error::Cli)?;
    }
    opts.progress = Some(Arc::new(move |p| {
        view.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .update(p)
    }));
    let result = registry::pull(
        config.registries.clone(),
        config.max_parallel_layer_downloads as usize,
        &images,
        reference,
        &opts,
    );
    store.flush()?;
    let done =
        result.map_err(|e| Error::Cli(format!("pull {reference}: {}", crate::error_chain(&e))))?;
    Ok(Response::Pulled {
        image: done.record,
        downloaded: done.downloaded,
        seconds: done.duration.as_secs_f64(),
    })
}

fn absolute(path: &str) -> Result<PathBuf, Error> {
    std::path::absolute(path).map_err(|source| Error::Io {
        context: format!("--creds {path}"),
        source,
    })
}

/// One layer as the display knows it.
struct Layer {
    done: u64,
    total: u64,
    state: &'static str,
    logged: Option<Instant>,
}

/// The progress display: bars redrawn in place on a terminal, lines otherwise.
struct View {
    tty: bool,
    layers: BTreeMap<usize, (String, Layer)>,
    drawn: usize,
}

impl View {
    fn new(tty: bool) -> View {
        View {
            tty,
            layers: BTreeMap::new(),
            drawn: 0,
        }
    }

    fn index(&self, digest: &str) -> Option<usize> {
        self.layers
            .iter()
            .find(|(_, (d, _))| d == digest)
            .map(|(i, _)| *i)
    }

    fn update(&mut self, p: Progress) {
        match p {
            Progress::Resolved {
                reference,
                manifest,
                layers,
            } => {
                super::note(&format!(
                    "{reference}: manifest {manifest}, {} layer(s)",
                    layers.len()
                ));
                self.drawn = 0;
                self.layers = layers
                    .into_iter()
                    .enumerate()
                    .map(|(i, (d, total))| {
                        let l = Layer {
                            done: 0,
                            total,
                            state: "waiting",
                            logged: None,
                        };
                        (i, (d, l))
                    })
                    .collect();
            }
            Progress::Layer {
                digest,
                done,
                total,
            } => {
                let Some(i) = self.index(&digest) else { return };
                if let Some((_, l)) = self.layers.get_mut(&i) {
                    l.done = done;
                    l.total = total;
                    l.state = "downloading";
                }
                if !self.tty {
                    self.log_line(i, false);
                }
            }
            Progress::LayerDone { digest, cached } => {
                let Some(i) = self.index(&digest) else { return };
                if let Some((_, l)) = self.layers.get_mut(&i) {
                    l.done = l.total;
                    l.state = if cached { "already here" } else { "done" };
                }
                if !self.tty {
                    self.log_line(i, true);
                }
            }
        }
        if self.tty {
            self.draw();
        }
    }

    fn log_line(&mut self, i: usize, force: bool) {
        let Some((digest, l)) = self.layers.get_mut(&i) else {
            return;
        };
        if !force && l.logged.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            return;
        }
        l.logged = Some(Instant::now());
        super::note(&format!(
            "layer {}: {} {}/{}",
            short(digest),
            l.state,
            super::human_size(l.done),
            super::human_size(l.total)
        ));
    }

    fn draw(&mut self) {
        let mut out = std::io::stderr().lock();
        if self.drawn > 0 {
            // Back to the first bar, to draw over them.
            let _ = write!(out, "\x1b[{}A", self.drawn);
        }
        for (digest, l) in self.layers.values() {
            let width = 30usize;
            let filled = if l.total == 0 {
                width
            } else {
                (l.done.min(l.total) as u128 * width as u128 / l.total as u128) as usize
            };
            let _ = writeln!(
                out,
                "\x1b[2K{} [{}{}] {:>9}/{:<9} {}",
                short(digest),
                "=".repeat(filled),
                " ".repeat(width - filled),
                super::human_size(l.done),
                super::human_size(l.total),
                l.state
            );
        }
        self.drawn = self.layers.len();
        let _ = out.flush();
    }

    fn finish(&mut self) {
        if self.tty {
            self.draw();
        }
    }
}

fn short(digest: &str) -> &str {
    let hex = digest.trim_start_matches("sha256:");
    &hex[..hex.len().min(12)]
}

/// The `holdfast image ls` table: one row per reference.
pub(super) fn render(images: &[ImageRecord], now: crate::time::Timestamp) -> String {
    let mut out = format!(
        "{:<44} {:<16} {:<19} {:>10}  {:<10} {}\n",
        "REPOSITORY", "TAG", "DIGEST", "SIZE", "LAST USED", "PINNED"
    );
    let mut rows = Vec::new();
    for i in images {
        let digest = format!("sha256:{}", short(&i.manifest_digest));
        let used = match i.last_used {
            Some(t) => format!("{} ago", super::age(t, now)),
            None => "never".to_string(),
        };
        for r in &i.references {
            let (repo, tag) = split_reference(r);
            let row = format!(
                "{:<44} {:<16} {:<19} {:>10}  {:<10} {}",
                repo,
                tag,
                digest,
                super::human_size(i.size),
                used,
                if i.pinned { "pinned" } else { "" }
            );
            rows.push(format!("{}\n", row.trim_end()));
        }
    }
    rows.sort();
    for r in rows {
        out.push_str(&r);
    }
    out
}

/// `reg/x:1` → (`reg/x`, `1`); `reg/x@sha256:..` → (`reg/x`, `<none>`); a bare
/// digest (an image no name points at any more) → (`<none>`, `<none>`).
fn split_reference(r: &str) -> (String, String) {
    if r.starts_with("sha256:") {
        return ("<none>".into(), "<none>".into());
    }
    let name = r.split('@').next().unwrap_or(r);
    let last = name.rfind('/').map_or(0, |i| i + 1);
    match name[last..].find(':') {
        Some(i) => (
            name[..last + i].to_string(),
            name[last + i + 1..].to_string(),
        ),
        None => (name.to_string(), "<none>".into()),
    }
}

/// `holdfast image prune`: every image no pod uses and none pinned.
pub(super) fn prune(root: &Path) -> Result<(), Error> {
    if let Response::Images { images } = super::request(root, Request::ImagePrune)? {
        for i in &images {
            super::emit_line(&format!(
                "removed {} {}",
                i.manifest_digest,
                i.references.join(" ")
            ))?;
        }
        super::emit_line(&format!("{} image(s) removed", images.len()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_repository_and_tag() {
        let s = |r: &str| split_reference(r);
        assert_eq!(s("reg:5000/x/y:1"), ("reg:5000/x/y".into(), "1".into()));
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(s(&format!("reg/x@{d}")), ("reg/x".into(), "<none>".into()));
        assert_eq!(s(&d), ("<none>".into(), "<none>".into()));
    }

    #[test]
    fn the_table_names_tag_digest_size_and_last_use() {
        let now: crate::time::Timestamp = "2026-11-23T12:00:00Z".parse().expect("time");
        let rec = ImageRecord {
            references: vec!["docker.io/library/busybox:1.36".into()],
            manifest_digest: format!("sha256:{}", "b".repeat(64)),
            config_digest: format!("sha256:{}", "c".repeat(64)),
            layers: vec![],
            size: 2 * 1024 * 1024,
            imported_at: now,
            last_used: Some("2026-11-23T11:00:00Z".parse().expect("time")),
            pinned: false,
        };
        let pinned = ImageRecord {
            references: vec!["registry.local/site/app:2".into()],
            pinned: true,
            ..rec.clone()
        };
        let table = render(&[rec, pinned], now);
        let row = table.lines().nth(1).expect("row");
        assert!(row.starts_with("docker.io/library/busybox"), "{row}");
        for want in ["1.36", "sha256:bbbbbbbbbbbb", "2.0MiB", "60m ago"] {
            assert!(row.contains(want), "{want} in {row}");
        }
        assert!(!row.contains("pinned"), "{row}");
        let row = table.lines().nth(2).expect("row");
        assert!(
            row.starts_with("registry.local/site/app") && row.ends_with("pinned"),
            "{row}"
        );
    }
}
