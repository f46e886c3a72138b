//! cli: the `holdfast` subcommands other than `run`: `pods`, `status`, `image`, `store`
//! and `reset`. `pods`, `status` and `image` ask a running agent through the control
//! socket, or open the store when none runs.

mod image;
mod output;

pub use output::{emit, emit_line, note, stdout_closed, EXIT_BROKEN_PIPE};

use std::path::PathBuf;

use crate::control::{self, ControlError, Request, Response};
use crate::image::ImageStore;
use crate::store::Store;
use crate::sync::PodView;
use crate::Error;

const DEFAULT_ROOT: &str = "/var/lib/holdfast";

/// Splits `--root-dir DIR` / `--root-dir=DIR` from the other arguments. The root comes
/// back resolved, as the agent holds it (see [`crate::runtime::root_dir::resolve`]):
/// `reset` compares it with the mount table. One not there stays as given.
fn root_dir(args: &[String]) -> Result<(PathBuf, Vec<String>), Error> {
    let (root, rest) = root_dir_as_given(args)?;
    match std::fs::canonicalize(&root) {
        Ok(resolved) => Ok((resolved, rest)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((root, rest)),
        Err(source) => Err(Error::Io {
            context: format!("resolve root dir {}", root.display()),
            source,
        }),
    }
}

/// Whether the root dir `args` name is reached through a symlink: resolved, it is not
/// the path as given (made absolute).
fn through_symlink(args: &[String]) -> bool {
    let Ok((given, _)) = root_dir_as_given(args) else {
        return false;
    };
    let absolute = std::path::absolute(&given).unwrap_or(given);
    std::fs::canonicalize(&absolute).is_ok_and(|resolved| resolved != absolute)
}

fn root_dir_as_given(args: &[String]) -> Result<(PathBuf, Vec<String>), Error> {
    let mut root = PathBuf::from(DEFAULT_ROOT);
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--root-dir=") {
            root = PathBuf::from(v);
        } else if a == "--root-dir" {
            let v = it.next().ok_or_else(|| crate::config::ConfigError::Flag {
                flag: "--root-dir".into(),
                reason: "needs a value".into(),
            })?;
            root = PathBuf::from(v);
        } else {
            rest.push(a.clone());
        }
    }
    Ok((root, rest))
}

/// Sends `req` to the running agent, or carries it out on the store directly.
fn request(root: &std::path::Path, req: Request) -> Result<Response, Error> {
    let deadline = std::time::Instant::now() + AGENT_START_WAIT;
    loop {
        match control::client::call(root, &req) {
            // An agent that is starting holds its lock before it answers: wait for it
            // rather than take the store from under it.
            Err(ControlError::NotRunning { .. })
                if control::presence::agent_running(root)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            other => return answer(root, req, other),
        }
    }
}

/// How long the CLI waits for a starting agent to answer.
const AGENT_START_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn answer(
    root: &std::path::Path,
    req: Request,
    got: Result<Response, ControlError>,
) -> Result<Response, Error> {
    match got {
        Ok(resp) => Ok(resp),
        Err(ControlError::NotRunning { .. }) if !control::presence::agent_running(root) => {
            // Reading must not create a store where there was none (a mistyped
            // --root-dir); only an import may.
            let db = root.join("db");
            if !db.exists() && !matches!(req, Request::ImageImport { .. }) {
                return Err(Error::Cli(format!(
                    "no holdfast state under {} (is --root-dir right?)",
                    root.display()
                )));
            }
            let store = Store::open(&db)?;
            let images = ImageStore::open(root, &store)?;
            let podstates = crate::sync::PodStates::open(&store)?;
            let resp = control::execute(&images, &podstates, req);
            store.flush()?;
            match resp {
                Response::Error { message } => Err(Error::Cli(message)),
                other => Ok(other),
            }
        }
        Err(e) => Err(Error::Cli(e.to_string())),
    }
}

/// `holdfast pods`: pods and their containers, like `crictl pods` and `crictl ps`.
pub fn pods(args: &[String]) -> Result<(), Error> {
    let (root, rest) = root_dir(args)?;
    let json = match rest
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => false,
        ["-o", "json"] | ["-ojson"] | ["--output=json"] | ["-o=json"] => true,
        other => return Err(Error::Cli(format!("pods: unexpected arguments {other:?}"))),
    };
    if let Some(notice) = crate::store::recover::moved_notice(&root.join("db")) {
        note(&format!(
            "WARNING: the agent's store was moved aside and rebuilt:\n{notice}"
        ));
    }
    let Response::Pods { pods } = request(&root, Request::Pods)? else {
        return Err(Error::Cli("pods: unexpected answer".into()));
    };
    if json {
        let out =
            serde_json::to_string(&pods).map_err(|e| Error::Cli(format!("pods: encode: {e}")))?;
        emit_line(&out)?;
    } else {
        emit(&render_pods(&pods, crate::time::now()))?;
    }
    Ok(())
}

/// `holdfast status`: the uplink (standalone, up, or down since when and retrying
/// when), the outbox, the last successful sync, the store's size and the pods it
/// knows. With no agent running it says so and reads what it can from the root dir.
pub fn status(args: &[String]) -> Result<(), Error> {
    let (root, rest) = root_dir(args)?;
    let json = match rest
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => false,
        ["--json"] | ["-o", "json"] | ["-ojson"] | ["--output=json"] | ["-o=json"] => true,
        other => {
            return Err(Error::Cli(format!(
                "status: unexpected arguments {other:?}"
            )))
        }
    };
    let deadline = std::time::Instant::now() + AGENT_START_WAIT;
    let status = loop {
        match control::client::call(&root, &Request::Status) {
            Ok(Response::Status { status }) => break status,
            Ok(_) => return Err(Error::Cli("status: unexpected answer".into())),
            Err(ControlError::NotRunning { .. })
                if control::presence::agent_running(&root)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            Err(ControlError::NotRunning { .. }) => {
                break control::status::from_root(&root);
            }
            Err(e) => return Err(Error::Cli(e.to_string())),
        }
    };
    if json {
        let out = serde_json::to_string(&status)
            .map_err(|e| Error::Cli(format!("status: encode: {e}")))?;
        emit_line(&out)?;
    } else {
        emit(&control::status::render(&status, crate::time::now()))?;
    }
    Ok(())
}

/// The `holdfast pods` table: a row per pod, and under it a row per container, in the
/// same columns.
pub fn render_pods(pods: &[PodView], now: crate::time::Timestamp) -> String {
    let mut rows: Vec<Vec<String>> = vec![[
        "POD / CONTAINER",
        "NAMESPACE",
        "STATUS",
        "READY",
        "RESTARTS",
        "AGE",
        "ID",
        "DETAIL",
    ]
    .map(String::from)
    .to_vec()];
    for p in pods {
        let s = p.status();
        let cs = s.container_statuses.clone().unwrap_or_default();
        let ready = cs.iter().filter(|c| c.ready).count();
        let restarts: i64 = cs.iter().map(|c| i64::from(c.restart_count)).sum();
        rows.push(vec![
            p.name().to_owned(),
            p.namespace().to_owned(),
            s.phase.clone().unwrap_or_else(|| "Unknown".into()),
            format!("{ready}/{}", cs.len()),
            restarts.to_string(),
            age(p.start_time(), now),
            String::new(),
            pod_detail(s),
        ]);
        for c in &cs {
            let (state, detail) = container_state(c);
            let id = c
                .container_id
                .as_deref()
                .and_then(|i| i.split("://").nth(1))
                .map(|i| i.chars().take(13).collect())
                .unwrap_or_else(|| "-".into());
            let since = c
                .state
                .as_ref()
                .and_then(|st| st.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .map(|t| age(t.0, now))
                .unwrap_or_else(|| "-".into());
            rows.push(vec![
                format!("└ {}", c.name),
                String::new(),
                state.into(),
                format!("{}/1", u8::from(c.ready)),
                c.restart_count.to_string(),
                since,
                id,
                detail,
            ]);
        }
    }
    output::table(&rows)
}

/// Why a pod is where it is, when its status says (a rejected or evicted pod).
fn pod_detail(s: &k8s_openapi::api::core::v1::PodStatus) -> String {
    match (s.reason.as_deref(), s.message.as_deref()) {
        (Some(r), Some(m)) => format!("{r}: {m}"),
        (Some(r), None) => r.to_owned(),
        (None, Some(m)) => m.to_owned(),
        (None, None) => String::new(),
    }
}

fn container_state(c: &k8s_openapi::api::core::v1::ContainerStatus) -> (&'static str, String) {
    let Some(st) = &c.state else {
        return ("Unknown", String::new());
    };
    if let Some(r) = &st.running {
        let since = r
            .started_at
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default();
        return ("Running", format!("started {since}"));
    }
    if let Some(t) = &st.terminated {
        return (
            "Exited",
            format!(
                "exit {} {} finished {}",
                t.exit_code,
                t.reason.as_deref().unwrap_or(""),
                t.finished_at
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default()
            ),
        );
    }
    if let Some(w) = &st.waiting {
        let mut d = w.reason.clone().unwrap_or_default();
        if let Some(m) = &w.message {
            d.push_str(": ");
            d.push_str(m);
        }
        return ("Waiting", d);
    }
    ("Unknown", String::new())
}

fn age(since: crate::time::Timestamp, now: crate::time::Timestamp) -> String {
    let secs = now.duration_since(since).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `holdfast image import [--pin] FILE|DIR`, `image pull REF`, `image ls`, `image rm REF`,
/// `image prune`.
pub fn image(args: &[String]) -> Result<(), Error> {
    let (root, rest) = root_dir(args)?;
    let usage = || {
        Error::Cli(
            "usage: holdfast image import [--pin] FILE|DIR | pull REF [--platform OS/ARCH[/VARIANT]] \
             [--creds FILE] [--config FILE] | ls | rm REF | prune"
                .into(),
        )
    };
    match rest.first().map(String::as_str) {
        Some("import") => {
            let (pin, path) = match &rest[1..] {
                [flag, path] if flag == "--pin" => (true, path),
                [path, flag] if flag == "--pin" => (true, path),
                [path] if !path.starts_with('-') => (false, path),
                _ => return Err(usage()),
            };
            let abs = std::path::absolute(path).map_err(|source| Error::Io {
                context: format!("image import {path}"),
                source,
            })?;
            let req = Request::ImageImport {
                path: abs.display().to_string(),
                pin,
            };
            if let Response::Images { images } = request(&root, req)? {
                for i in &images {
                    emit_line(&format!(
                        "imported {} {}{}",
                        i.manifest_digest,
                        i.references.join(" "),
                        if i.pinned { " (pinned)" } else { "" }
                    ))?;
                }
            }
            Ok(())
        }
        Some("pull") => image::pull(&root, &rest[1..]),
        Some("prune") if rest.len() == 1 => image::prune(&root),
        Some("ls") | Some("list") => {
            if let Response::Images { images } = request(&root, Request::ImageList)? {
                emit(&image::render(&images, crate::time::now()))?;
            }
            Ok(())
        }
        Some("rm") | Some("remove") => {
            let reference = rest.get(1).ok_or_else(usage)?.clone();
            request(
                &root,
                Request::ImageRemove {
                    reference: reference.clone(),
                },
            )?;
            emit_line(&format!("removed {reference}"))?;
            Ok(())
        }
        _ => Err(usage()),
    }
}

/// `holdfast store compact`: rewrites the store without the space sled keeps for
/// deleted and rewritten records. Refused while an agent runs there.
pub fn store(args: &[String]) -> Result<(), Error> {
    // Not for people: the agent opens its store here first, in a process of its own,
    // so that a panic inside sled kills this process and not the agent.
    if let [probe, dir] = args {
        if probe == "probe" {
            std::process::exit(crate::store::recover::probe(std::path::Path::new(dir)));
        }
    }
    let (root, rest) = root_dir(args)?;
    if rest.iter().map(String::as_str).collect::<Vec<_>>() != ["compact"] {
        return Err(Error::Cli(format!(
            "store: expected `compact`, got {rest:?}"
        )));
    }
    // Held until done, so no agent starts on the store while it is swapped.
    let _presence = control::presence::lock(&root, std::time::Duration::ZERO).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Error::Cli(format!(
                "store compact: an agent is running on {}; stop it first",
                root.display()
            ))
        } else {
            Error::Io {
                context: format!("lock {}", root.display()),
                source: e,
            }
        }
    })?;
    let db = root.join("db");
    if !db.exists() {
        return Err(Error::Cli(format!(
            "no holdfast store under {} (is --root-dir right?)",
            root.display()
        )));
    }
    crate::store::compact::recover_interrupted(&db)?;
    let c = crate::store::compact::compact(&db)?;
    emit_line(&format!(
        "store compacted: {} -> {}",
        human_size(c.before),
        human_size(c.after)
    ))?;
    Ok(())
}

fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// `holdfast reset`: stops and removes every container under the root dir, its mounts
/// and cgroups, and then the root dir itself (like `kubeadm reset`). Refused while an
/// agent runs there.
pub fn reset(args: &[String]) -> Result<(), Error> {
    let (root, rest) = root_dir(args)?;
    let mut cgroup_root = "/holdfast".to_string();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--cgroup-root=") {
            cgroup_root = v.to_string();
        } else if a == "--cgroup-root" {
            cgroup_root = it
                .next()
                .ok_or_else(|| Error::Cli("reset: --cgroup-root needs a value".into()))?
                .clone();
        } else {
            return Err(Error::Cli(format!("reset: unexpected argument {a:?}")));
        }
    }
    if control::client::call(&root, &Request::Pods).is_ok() {
        return Err(Error::Cli(format!(
            "reset: an agent is running on {}; stop it first",
            root.display()
        )));
    }
    if !root.exists() {
        return Ok(());
    }
    let runtime = crate::runtime::LibcontainerRuntime::new(&root, &cgroup_root, None)?;
    let removed = crate::runtime::remove_all(&runtime, std::time::Duration::from_secs(10))?;
    // The pod hierarchy under the cgroup root (kubepods/...) goes too, deepest first.
    crate::resources::cgroups::remove_tree(runtime.cgroup_root()).map_err(|e| {
        crate::runtime::RuntimeError::Create {
            id: String::new(),
            message: e.to_string(),
        }
    })?;
    emit_line(&format!("removed {removed} container(s)"))?;
    // Then the pods' sandboxes: CNI leases released, namespaces and volumes unmounted.
    crate::sync::sandbox::reset(&root, &cgroup_root).map_err(Error::Cli)?;
    // The tmpfs of what lasts one boot, now empty of containers.
    crate::runtime::unmount_all_under(&runtime.boot_dir()).map_err(Error::Cli)?;
    let io = |path: &std::path::Path| {
        let context = format!("remove {}", path.display());
        move |source| Error::Io { context, source }
    };
    for entry in std::fs::read_dir(&root).map_err(io(&root))? {
        let path = entry.map_err(io(&root))?.path();
        // Whatever is still mounted below goes first; nothing is removed through a mount.
        crate::runtime::remove_unmounted(&path).map_err(|e| Error::Cli(format!("reset: {e}")))?;
    }
    // A root reached through a symlink (`/var/lib/holdfast -> /data/holdfast`) keeps
    // its target, empty: the link is the host's layout, and the next agent starts there.
    if through_symlink(args) {
        return Ok(());
    }
    match std::fs::remove_dir(&root) {
        Ok(()) => Ok(()),
        // The root dir is a filesystem of its own (a data partition): it stays, empty.
        Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => Ok(()),
        Err(e) => Err(io(&root)(e)),
    }
}
