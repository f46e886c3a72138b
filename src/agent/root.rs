//! agent::root: the first stages of `holdfast run`: the process settled in its cgroup,
//! the root dir made private, resolved and locked, the store opened (broken records
//! quarantined, compacted when it needs it), the image store with its drop-in archives
//! imported, the runtime, and what still runs adopted into a new store. Each step is
//! the owning module's; this only orders them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::control::presence::AgentLock;
use crate::image::ImageStore;
use crate::runtime::LibcontainerRuntime;
use crate::store::Store;
use crate::Error;

/// What the agent runs on: its root dir, store, images and runtime.
pub struct Root {
    pub dir: PathBuf,
    pub store: Store,
    pub images: Arc<ImageStore>,
    pub runtime: Arc<LibcontainerRuntime>,
    /// Held while the agent runs: a second agent on the same root dir waits.
    _lock: AgentLock,
}

/// Opens the root: `config`'s root dir and cgroup root are replaced by what they
/// resolve to.
pub async fn open(config: &mut Config) -> Result<Root, Error> {
    // `cgroupRoot: delegated` settles the agent in its service's cgroup before any fork.
    config.cgroup_root = crate::runtime::delegation::settle(&config.cgroup_root)?;
    let dir = prepare_root(&config.root_dir)?;
    config.root_dir = dir.clone();
    let lock = crate::control::presence::lock(&dir, Duration::from_secs(2)).map_err(|source| {
        Error::Io {
            context: "lock the root dir".into(),
            source,
        }
    })?;
    // What the agent sees of an unset clock outlives it within the boot.
    crate::time::remember_in(&dir.join("clock"));
    let store = open_store(&dir)?;
    let images = Arc::new(ImageStore::open(&dir, &store)?);
    import_images(&images, &dir).await;
    let runtime = Arc::new(
        LibcontainerRuntime::new(&dir, &config.cgroup_root, None)?.with_log_limits(
            config.container_log_max_size,
            config.container_log_max_files,
        ),
    );
    if store.is_fresh() {
        adopt(&store, &runtime).await;
    }
    Ok(Root {
        dir,
        store,
        images,
        runtime,
        _lock: lock,
    })
}

/// The image archives dropped in `<root>/images`, imported.
async fn import_images(images: &Arc<ImageStore>, root: &Path) {
    let images = images.clone();
    let imported = tokio::task::spawn_blocking(move || images.import_dropins()).await;
    match imported {
        Ok(Ok(found)) if !found.is_empty() => {
            log::info!(
                "imported {} image(s) from {}",
                found.len(),
                root.join("images").display()
            )
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => log::error!("import images from {}: {e}", root.join("images").display()),
        Err(e) => log::error!("import images: {e}"),
    }
}

/// A new or moved-aside store: containers that still run tell whose they are.
async fn adopt(store: &Store, runtime: &Arc<LibcontainerRuntime>) {
    let rt = runtime.clone();
    let st = store.clone();
    match tokio::task::spawn_blocking(move || crate::sync::adopt::rebuild(&st, rt.as_ref())).await {
        Ok(Ok(r)) if r.containers > 0 => log::warn!(
            "store rebuilt from running containers: {} container(s) of {} pod(s) adopted",
            r.containers,
            r.pods
        ),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => log::error!("rebuild the store from running containers: {e}"),
        Err(e) => log::error!("rebuild the store from running containers: {e}"),
    }
}

/// The root dir made private (0700, narrowed from a wider mode) and
/// resolved, with the folders the agent writes to first. Returns it resolved.
fn prepare_root(root: &Path) -> Result<PathBuf, Error> {
    // Containers' files live below the root dir: no other user of the host may reach it.
    match crate::runtime::root_dir::secure(root) {
        Ok(Some(mode)) => log::warn!(
            "root dir {} was mode {mode:04o}, reachable by other users of the host: now 0700",
            root.display()
        ),
        Ok(None) => {}
        Err(source) => {
            return Err(Error::Io {
                context: format!("create {} with mode 0700", root.display()),
                source,
            })
        }
    }
    // A config not made by `config::load` (tests, embedders) may name it otherwise.
    let root = std::fs::canonicalize(root).map_err(|source| Error::Io {
        context: format!("resolve {}", root.display()),
        source,
    })?;
    for dir in [root.join("images"), root.join("logs")] {
        crate::runtime::root_dir::create_private(&dir).map_err(|source| Error::Io {
            context: format!("create {}", dir.display()),
            source,
        })?;
    }
    Ok(root)
}

/// Quarantines one tree's undecodable records; returns how many.
type TreeCheck = fn(&Store, &'static str) -> Result<usize, crate::store::StoreError>;

/// Opens the store under `root`, moving a broken one aside (see
/// [`crate::store::recover`]), and quarantines records that no longer decode.
fn open_store(root: &std::path::Path) -> Result<Store, Error> {
    let opened = crate::store::recover::open_or_recover(&root.join("db"))?;
    let store = opened.store;
    let checks: [(&'static str, TreeCheck); 8] = [
        (crate::source::PODS_TREE, |s, n| {
            s.quarantine_undecodable::<crate::source::DesiredPod>(n)
        }),
        ("containers", |s, n| {
            s.quarantine_undecodable::<crate::sync::ContainerRecord>(n)
        }),
        ("podstates", |s, n| {
            s.quarantine_undecodable::<crate::sync::PodState>(n)
        }),
        (crate::uplink::objects::TREE_CONFIG_MAPS, |s, n| {
            s.quarantine_undecodable::<k8s_openapi::api::core::v1::ConfigMap>(n)
        }),
        (crate::uplink::objects::TREE_SECRETS, |s, n| {
            s.quarantine_undecodable::<k8s_openapi::api::core::v1::Secret>(n)
        }),
        (crate::uplink::services::TREE_SERVICES, |s, n| {
            s.quarantine_undecodable::<k8s_openapi::api::core::v1::Service>(n)
        }),
        (crate::uplink::services::TREE_SERVICES_LISTED, |s, n| {
            s.quarantine_undecodable::<bool>(n)
        }),
        ("*images", |s, _| {
            crate::image::ImageStore::quarantine_undecodable(s)
        }),
    ];
    let mut bad = 0;
    for (name, check) in checks {
        match check(&store, name) {
            Ok(n) => bad += n,
            Err(e) => log::error!("store integrity check of {name}: {e}"),
        }
    }
    if bad > 0 {
        log::error!(
            "store: {bad} record(s) did not decode and were moved to tree {}",
            crate::store::recover::QUARANTINE
        );
        store.flush()?;
    }
    if !store.is_fresh() && store.needs_compaction()? {
        let path = store.path().to_path_buf();
        drop(store);
        let c = crate::store::compact::compact(&path)?;
        log::warn!(
            "store compacted at start: {} -> {} bytes on disk",
            c.before,
            c.after
        );
        return Ok(Store::open(&path)?);
    }
    Ok(store)
}
