//! The image index in sled (`images` by manifest digest, `image_refs` by normalised
//! reference) over the content store, and the operations the agent calls. Blocking:
//! callers on tokio use `spawn_blocking`.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::archive::Archive;
use super::content::Content;
use super::import::{diff_id_map, parse_config, Importer, Pending, JSON_LIMIT};
use super::pins::Pins;
use super::reference::{is_digest, Reference};
use super::{io_err, json_err, ImageError, ImageRecord, Platform};
use crate::runtime::ResolvedImage;
use crate::store::{Batch, Store, Tree};

/// A drop-in archive already imported, recognised without reading it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct DropinSeen {
    size: u64,
    mtime_ns: u128,
    manifests: Vec<String>,
}

/// Tree of the image index's own facts; [`RECONCILED`]: the index has been brought
/// together with the content store once (see [`ImageStore::reconcile`]).
const INDEX_META: &str = "image_index";
const RECONCILED: &str = "reconciled";
/// Tree of the references `holdfast.pinnedImages` names, as the agent last read them,
/// so that `image prune` and `image ls` without an agent know them too.
const PINS: &str = "image_pins";
const CONFIGURED: &str = "configured";

/// How finely `last_used` is kept.
const LAST_USED_RESOLUTION: std::time::Duration = std::time::Duration::from_secs(600);

pub struct ImageStore {
    root: PathBuf,
    content: Content,
    store: Store,
    images: Tree<ImageRecord>,
    refs: Tree<String>,
    dropins: Tree<DropinSeen>,
    pins: Tree<Vec<String>>,
    platform: Platform,
    /// One mutation at a time: an import must not race a removal of shared blobs.
    lock: Mutex<()>,
}

impl ImageStore {
    pub fn open(root_dir: &Path, store: &Store) -> Result<Self, ImageError> {
        let content = Content::open(&root_dir.join("content"))?;
        let images = store.tree("images")?;
        let refs = store.tree("image_refs")?;
        let dropins = store.tree("image_dropins")?;
        let pins = store.tree(PINS)?;
        let images = ImageStore {
            root: root_dir.to_path_buf(),
            content,
            store: store.clone(),
            images,
            refs,
            dropins,
            pins,
            platform: Platform::host(),
            lock: Mutex::new(()),
        };
        images.reconcile()?;
        Ok(images)
    }

    /// Imports from another platform's point of view, for archives built elsewhere.
    pub fn with_platform(mut self, platform: Platform) -> Self {
        self.platform = platform;
        self
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Imports every image in the archive at `path` (OCI layout dir or tar, or a
    /// `docker save` tar). A failed import leaves the store as it was.
    pub fn import(&self, path: &Path) -> Result<Vec<ImageRecord>, ImageError> {
        self.import_as(path, false)
    }

    /// [`ImageStore::import`], and every image imported is pinned: GC and `image
    /// prune` keep it. An image pinned once stays pinned when imported again.
    pub fn import_pinned(&self, path: &Path) -> Result<Vec<ImageRecord>, ImageError> {
        self.import_as(path, true)
    }

    fn import_as(&self, path: &Path, pin: bool) -> Result<Vec<ImageRecord>, ImageError> {
        let _guard = self.guard();
        let archive = Archive::open(path, &self.content)?;
        let mut importer = Importer {
            archive: &archive,
            content: &self.content,
            platform: &self.platform,
            fresh: Vec::new(),
        };
        let result = importer.images().and_then(|pending| {
            for p in &pending {
                let diff_ids = diff_id_map(p);
                for layer in &p.layers {
                    self.content
                        .ensure_unpacked(layer, diff_ids.get(layer).map(String::as_str))?;
                }
            }
            pending
                .into_iter()
                .map(|p| self.record(p, pin))
                .collect::<Result<Vec<_>, _>>()
        });
        // Whatever this import stored that no image ended up using (nested indexes,
        // or everything when it failed) goes again.
        let fresh = std::mem::take(&mut importer.fresh);
        if let Err(cleanup) = self.drop_unreferenced(&fresh) {
            log::warn!("clean up after import of {}: {cleanup}", path.display());
        }
        let records = result?;
        self.store.flush()?;
        Ok(records)
    }

    /// Records one imported image: its tags and its index entry change together, in
    /// one transaction, so a power cut never leaves a tag naming an image the index
    /// does not hold.
    fn record(&self, p: Pending, pin: bool) -> Result<ImageRecord, ImageError> {
        let mut batch = Batch::new();
        let existing = self.images.get(&p.manifest_digest)?;
        let mut references: Vec<String> = existing
            .as_ref()
            .map(|r| r.references.clone())
            .unwrap_or_default();
        for name in &p.names {
            if let Some(old) = self.refs.get(name)? {
                if old != p.manifest_digest {
                    self.detach(&mut batch, name, &old)?;
                }
            }
            batch.put(&self.refs, name, &p.manifest_digest)?;
            if !references.contains(name) {
                references.push(name.clone());
            }
        }
        let named = references.iter().any(|r| !is_digest(r));
        references.retain(|r| !named || !is_digest(r));
        if references.is_empty() {
            references.push(p.manifest_digest.clone());
        }
        let record = ImageRecord {
            references,
            manifest_digest: p.manifest_digest.clone(),
            config_digest: p.config_digest,
            layers: p.layers,
            size: p.size,
            imported_at: existing
                .as_ref()
                .map_or_else(crate::time::now, |r| r.imported_at),
            last_used: existing.as_ref().and_then(|r| r.last_used),
            pinned: pin || existing.is_some_and(|r| r.pinned),
        };
        batch.put(&self.images, &p.manifest_digest, &record)?;
        // The file first: one the index lacks is added back at the next open, an index
        // entry without one only loses it if the store is lost before then.
        self.write_record_file(&record)?;
        self.store.apply(batch)?;
        Ok(record)
    }

    /// Writes the record file that rebuilds `record` if the store is lost.
    fn write_record_file(&self, record: &ImageRecord) -> Result<(), ImageError> {
        let bytes = serde_json::to_vec(record)
            .map_err(json_err(format!("image record {}", record.manifest_digest)))?;
        self.content.write_record(&record.manifest_digest, &bytes)
    }

    /// A tag moved to another image: the old image keeps running containers and stays
    /// reachable by its digest.
    fn detach(&self, batch: &mut Batch, name: &str, manifest: &str) -> Result<(), ImageError> {
        if let Some(mut old) = self.images.get(manifest)? {
            old.references.retain(|r| r != name);
            if old.references.is_empty() {
                old.references.push(old.manifest_digest.clone());
            }
            batch.put(&self.images, manifest, &old)?;
            self.write_record_file(&old)?;
        }
        Ok(())
    }

    /// Moves image index records that no longer decode into the store's quarantine
    /// (start-up integrity check); returns how many.
    pub fn quarantine_undecodable(store: &Store) -> Result<usize, crate::store::StoreError> {
        Ok(store.quarantine_undecodable::<ImageRecord>("images")?
            + store.quarantine_undecodable::<String>("image_refs")?
            + store.quarantine_undecodable::<DropinSeen>("image_dropins")?
            + store.quarantine_undecodable::<Vec<String>>(PINS)?)
    }

    /// Imports every archive in `<root-dir>/images/` not imported before. One bad
    /// archive is logged and skipped; the others still import.
    pub fn import_dropins(&self) -> Result<Vec<ImageRecord>, ImageError> {
        let dir = self.root.join("images");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(format!("list {}", dir.display()))(e)),
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        let mut out = Vec::new();
        for path in paths {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let stamp_of = if path.is_dir() {
                path.join("index.json")
            } else if [".tar", ".tar.gz", ".tgz"]
                .iter()
                .any(|s| name.ends_with(s))
            {
                path.clone()
            } else {
                continue;
            };
            let Ok(meta) = fs::metadata(&stamp_of) else {
                log::debug!("{}: not an image archive, skipped", path.display());
                continue;
            };
            let mtime_ns = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            if let Some(seen) = self.dropins.get(&name)? {
                let present = seen
                    .manifests
                    .iter()
                    .all(|m| matches!(self.images.get(m), Ok(Some(_))));
                if seen.size == meta.len() && seen.mtime_ns == mtime_ns && present {
                    continue;
                }
            }
            match self.import(&path) {
                Ok(records) => {
                    log::info!(
                        "imported {} image(s) from {}",
                        records.len(),
                        path.display()
                    );
                    let manifests = records.iter().map(|r| r.manifest_digest.clone()).collect();
                    let seen = DropinSeen {
                        size: meta.len(),
                        mtime_ns,
                        manifests,
                    };
                    self.dropins.put(&name, &seen)?;
                    out.extend(records);
                }
                Err(e) => log::error!("import image archive {}: {e}", path.display()),
            }
        }
        Ok(out)
    }

    /// Finds an image by reference or image id and makes sure its layers are
    /// unpacked. Ok(None) when it is not here.
    pub fn resolve(&self, reference: &str) -> Result<Option<ResolvedImage>, ImageError> {
        let _guard = self.guard();
        let Some((shown, record)) = self.find(reference)? else {
            return Ok(None);
        };
        let config_bytes = self.content.read_blob(&record.config_digest, JSON_LIMIT)?;
        let diff_ids = parse_config(&config_bytes, &record.config_digest)?;
        let config: oci_spec::image::ImageConfiguration = serde_json::from_slice(&config_bytes)
            .map_err(json_err(format!("image config {}", record.config_digest)))?;
        let mut layers = Vec::new();
        for (i, layer) in record.layers.iter().enumerate() {
            layers.push(
                self.content
                    .ensure_unpacked(layer, diff_ids.get(i).map(String::as_str))?,
            );
        }
        Ok(Some(ResolvedImage {
            repo_digest: super::repo_digest(&shown, &record.manifest_digest),
            reference: shown,
            image_id: record.config_digest.clone(),
            config,
            layers,
        }))
    }

    /// The record for `reference` and the normalised form to show for it.
    fn find(&self, reference: &str) -> Result<Option<(String, ImageRecord)>, ImageError> {
        if is_digest(reference) {
            let found = self
                .images
                .entries()?
                .into_iter()
                .map(|(_, r)| r)
                .find(|r| r.manifest_digest == reference || r.config_digest == reference);
            return Ok(found.map(|r| (reference.to_string(), r)));
        }
        let parsed = Reference::parse(reference)?;
        let normalized = parsed.to_string();
        if let Some(manifest) = self.refs.get(&normalized)? {
            return Ok(self.images.get(&manifest)?.map(|r| (normalized, r)));
        }
        // `name@digest` finds an image known under that name with that manifest.
        if let Some(digest) = &parsed.digest {
            if let Some(r) = self.images.get(digest)? {
                let same_name = r
                    .references
                    .iter()
                    .filter_map(|x| Reference::parse(x).ok())
                    .any(|x| x.name() == parsed.name());
                if same_name {
                    return Ok(Some((normalized, r)));
                }
            }
        }
        Ok(None)
    }

    /// The content store, for the registry client's downloads.
    pub(crate) fn content(&self) -> &Content {
        &self.content
    }

    /// The root directory of the content store, whose filesystem image GC watches.
    pub fn content_root(&self) -> PathBuf {
        self.root.join("content")
    }

    /// The image recorded under `manifest_digest`, if it and all its blobs are here.
    pub(crate) fn complete(
        &self,
        manifest_digest: &str,
    ) -> Result<Option<ImageRecord>, ImageError> {
        let Some(record) = self.images.get(manifest_digest)? else {
            return Ok(None);
        };
        for d in std::iter::once(&record.config_digest).chain(&record.layers) {
            if !self.content.has_blob(d)? {
                return Ok(None);
            }
        }
        Ok(Some(record))
    }

    /// Records a pulled image whose blobs are all in the content store (and its layers
    /// unpacked), with its tags, in one transaction.
    pub(crate) fn record_pulled(&self, p: Pending) -> Result<ImageRecord, ImageError> {
        let _guard = self.guard();
        // A removal of another image that shared a blob may have taken it meanwhile.
        let diff_ids = diff_id_map(&p);
        for d in [&p.manifest_digest, &p.config_digest]
            .into_iter()
            .chain(&p.layers)
        {
            if !self.content.has_blob(d)? {
                return Err(ImageError::Io {
                    context: format!(
                        "record image {}: blob {d} was removed meanwhile",
                        p.manifest_digest
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
        }
        for layer in &p.layers {
            self.content
                .ensure_unpacked(layer, diff_ids.get(layer).map(String::as_str))?;
        }
        let record = self.record(p, false)?;
        self.store.flush()?;
        Ok(record)
    }

    /// Takes back what a failed pull fetched that no image uses: layer blobs go back to
    /// partial downloads (a retry verifies them instead of downloading them again), the
    /// rest is removed.
    pub(crate) fn abandon(&self, layers: &[String], others: &[String]) {
        let _guard = self.guard();
        let mut live = HashSet::new();
        if let Ok(entries) = self.images.entries() {
            for (_, r) in entries {
                live.insert(r.manifest_digest);
                live.insert(r.config_digest);
                live.extend(r.layers);
            }
        } else {
            return;
        }
        for d in layers.iter().filter(|d| !live.contains(*d)) {
            if let Err(e) = self.content.demote(d) {
                log::warn!("keep layer {d} for the next try: {e}");
            }
        }
        for d in others.iter().filter(|d| !live.contains(*d)) {
            if let Err(e) = self.content.remove_blob(d) {
                log::warn!("remove blob {d}: {e}");
            }
        }
    }

    /// Records that a container started from the image with id (config digest) or
    /// manifest digest `image`. Written at most every `LAST_USED_RESOLUTION`: GC needs
    /// the order of use, not every start, and the flash is spared a write per restart.
    pub fn mark_used(&self, image: &str, at: crate::time::Timestamp) -> Result<(), ImageError> {
        let _guard = self.guard();
        let found = self
            .images
            .entries()?
            .into_iter()
            .find(|(_, r)| r.config_digest == image || r.manifest_digest == image);
        let Some((key, mut record)) = found else {
            return Ok(());
        };
        let fresh = record.last_used.is_some_and(|t| {
            at.duration_since(t).as_secs() < LAST_USED_RESOLUTION.as_secs() as i64
        });
        if fresh {
            return Ok(());
        }
        record.last_used = Some(at);
        self.images.put(&key, &record)?;
        Ok(())
    }

    /// Bytes a blob takes on disk: the blob and, for a layer, its unpacked directory.
    pub fn disk_bytes(&self, digest: &str) -> Result<u64, ImageError> {
        let blob = if self.content.has_blob(digest)? {
            self.content.blob_size(digest)?
        } else {
            0
        };
        Ok(blob + dir_size(&self.content.layer_dir(digest)?))
    }

    /// Bytes each image's blobs and unpacked layers take that no other image shares,
    /// and the bytes of everything shared by more than one, each counted once.
    pub fn unique_sizes(&self) -> Result<Vec<(ImageRecord, u64)>, ImageError> {
        let records = self.list()?;
        let mut users: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for r in &records {
            let mut mine: HashSet<&String> = HashSet::new();
            mine.insert(&r.manifest_digest);
            mine.insert(&r.config_digest);
            mine.extend(&r.layers);
            for d in mine {
                *users.entry(d.clone()).or_default() += 1;
            }
        }
        let mut out = Vec::new();
        for r in records {
            let mut bytes = 0;
            let mut seen = HashSet::new();
            for d in std::iter::once(&r.manifest_digest)
                .chain(std::iter::once(&r.config_digest))
                .chain(&r.layers)
            {
                if users.get(d) == Some(&1) && seen.insert(d.clone()) {
                    bytes += self.disk_bytes(d)?;
                }
            }
            out.push((r, bytes));
        }
        Ok(out)
    }

    /// Keeps the references `holdfast.pinnedImages` names (normalised), written only
    /// when they differ from those kept.
    pub fn set_configured_pins(&self, references: &[String]) -> Result<(), ImageError> {
        let wanted = Pins::new(references).configured();
        if self.pins.get(CONFIGURED)?.as_ref() != Some(&wanted) {
            self.pins.put(CONFIGURED, &wanted)?;
        }
        Ok(())
    }

    /// What is pinned: the images imported with a pin, and those the references kept
    /// by [`ImageStore::set_configured_pins`] name.
    pub fn pins(&self) -> Result<Pins, ImageError> {
        Ok(Pins::new(&self.pins.get(CONFIGURED)?.unwrap_or_default()))
    }

    pub fn list(&self) -> Result<Vec<ImageRecord>, ImageError> {
        Ok(self.images.entries()?.into_iter().map(|(_, r)| r).collect())
    }

    /// Removes a reference (or, given an image id, every reference of that image).
    /// The last reference takes the image with it, freeing blobs and layers no other
    /// image shares, unless its id is in `in_use`.
    pub fn remove(&self, reference: &str, in_use: &[String]) -> Result<(), ImageError> {
        let _guard = self.guard();
        let not_present = || ImageError::NotPresent {
            reference: reference.to_string(),
        };
        let (dropping, record) = if is_digest(reference) {
            let (_, record) = self.find(reference)?.ok_or_else(not_present)?;
            (record.references.clone(), record)
        } else {
            let name = Reference::parse(reference)?.to_string();
            let manifest = self.refs.get(&name)?.ok_or_else(not_present)?;
            let Some(record) = self.images.get(&manifest)? else {
                self.refs.remove(&name)?;
                return Ok(());
            };
            (vec![name], record)
        };
        let left: Vec<String> = record
            .references
            .iter()
            .filter(|r| !dropping.contains(r) && !is_digest(r))
            .cloned()
            .collect();
        if left.is_empty()
            && (in_use.contains(&record.config_digest) || in_use.contains(&record.manifest_digest))
        {
            return Err(ImageError::InUse {
                reference: reference.to_string(),
                image_id: record.config_digest.clone(),
            });
        }
        // Tags and index entry change together (one transaction).
        let mut batch = Batch::new();
        for name in &dropping {
            if !is_digest(name) {
                batch.remove(&self.refs, name);
            }
        }
        if !left.is_empty() {
            let updated = ImageRecord {
                references: left,
                ..record
            };
            batch.put(&self.images, &updated.manifest_digest, &updated)?;
            self.write_record_file(&updated)?;
            self.store.apply(batch)?;
            self.store.flush()?;
            return Ok(());
        }
        batch.remove(&self.images, &record.manifest_digest);
        // The file first: an index entry without one gets it back at the next open,
        // while a file without an index entry would bring the image back.
        self.content.remove_record(&record.manifest_digest)?;
        self.store.apply(batch)?;
        self.store.flush()?;
        let mut blobs = vec![record.manifest_digest.clone(), record.config_digest.clone()];
        blobs.extend(record.layers.iter().cloned());
        self.drop_unreferenced(&blobs)
    }

    /// Digests of every blob a recorded image uses.
    fn live(&self) -> Result<HashSet<String>, ImageError> {
        let mut live = HashSet::new();
        for (_, r) in self.images.entries()? {
            live.insert(r.manifest_digest);
            live.insert(r.config_digest);
            live.extend(r.layers);
        }
        Ok(live)
    }

    /// Removes those of `blobs` (and their unpacked layers) that no recorded image uses.
    /// Only ever given blobs the caller knows about (those of a removed image, those an
    /// import stored), never what merely happens to be on disk.
    fn drop_unreferenced(&self, blobs: &[String]) -> Result<(), ImageError> {
        let live = self.live()?;
        let mut removed = 0usize;
        for digest in blobs.iter().filter(|d| !live.contains(*d)) {
            log::debug!("image content store: removing {digest}, which no recorded image uses");
            self.content.remove_layer(digest)?;
            self.content.remove_blob(digest)?;
            removed += 1;
        }
        if removed > 0 {
            log::info!(
                "image content store: removed {removed} blob(s) or layer(s) no recorded image uses"
            );
        }
        Ok(())
    }

    /// Brings the index and the content store together at open.
    ///
    /// Every image on disk stays an image: one whose record file the index lacks (the
    /// store was lost, moved aside, or went back in time; a power cut between the file
    /// and the index) is put back from it, tags included; in a new or rebuilt store,
    /// manifests that have no record file (stored before there were any) are put back
    /// under their digest. Only then, and only in a store whose index was reconciled
    /// before, are the blobs and layers no image uses removed (what an import or
    /// removal cut short left), each one logged. A new or rebuilt store removes
    /// nothing the first time: it cannot tell what it forgot from what nobody uses.
    fn reconcile(&self) -> Result<(), ImageError> {
        let started = std::time::Instant::now();
        // Set once this store's index has been brought together with the disk: from
        // then on every change goes through it, and what it does not know is unused.
        let reconciled: Tree<bool> = self.store.tree(INDEX_META)?;
        let fresh = reconciled.get(RECONCILED)?.is_none();
        let _guard = self.guard();
        // An index entry without its file (stored before there were files).
        for (_, r) in self.images.entries()? {
            if !self.content.has_record(&r.manifest_digest)? {
                self.write_record_file(&r)?;
            }
        }
        let mut batch = Batch::new();
        let mut indexed: HashSet<String> = self.images.keys()?.into_iter().collect();
        let mut restored = self.restore_from_record_files(&mut batch, &mut indexed)?;
        if fresh || indexed.is_empty() {
            for record in self.manifests_on_disk(&indexed)? {
                self.write_record_file(&record)?;
                log::warn!(
                    "image index: put back {} from its manifest, under its digest (its tags were not recorded)",
                    record.manifest_digest
                );
                indexed.insert(record.manifest_digest.clone());
                self.put_back(&mut batch, &record)?;
                restored += 1;
            }
        }
        self.store.apply(batch)?;
        if fresh {
            reconciled.put(RECONCILED, &true)?;
        }
        if restored > 0 || fresh {
            self.store.flush()?;
            log::warn!(
                "image index: {restored} image(s) put back from the content store in {} ms",
                started.elapsed().as_millis()
            );
        }
        self.remove_unused(fresh)
    }

    /// Puts back into `batch` the images whose record files the index lacks, when all
    /// their blobs are still there; returns how many.
    fn restore_from_record_files(
        &self,
        batch: &mut Batch,
        indexed: &mut HashSet<String>,
    ) -> Result<usize, ImageError> {
        let mut restored = 0usize;
        for (digest, bytes) in self.content.records(JSON_LIMIT)? {
            if indexed.contains(&digest) {
                continue;
            }
            let record: ImageRecord = match serde_json::from_slice(&bytes) {
                Ok(r) => r,
                Err(e) => {
                    log::warn!("image record file of {digest} does not decode ({e}); skipped");
                    continue;
                }
            };
            if record.manifest_digest != digest {
                log::warn!(
                    "image record file of {digest} names {}; skipped",
                    record.manifest_digest
                );
                continue;
            }
            if let Some(missing) = self.first_missing(&record)? {
                log::warn!(
                    "image {} ({digest}) is not put back into the index: its blob {missing} is gone",
                    record.references.join(", ")
                );
                continue;
            }
            self.put_back(batch, &record)?;
            log::warn!(
                "image index: put back {} ({digest}) from its record file",
                record.references.join(", ")
            );
            indexed.insert(digest);
            restored += 1;
        }
        Ok(restored)
    }

    /// Removes the blobs and layers no recorded image uses, unless the store is `fresh`
    /// and cannot tell them from what it forgot.
    fn remove_unused(&self, fresh: bool) -> Result<(), ImageError> {
        let live = self.live()?;
        let unused: Vec<String> = self
            .content
            .stored_digests()?
            .into_iter()
            .filter(|d| !live.contains(d))
            .collect();
        if unused.is_empty() {
            return Ok(());
        }
        if fresh {
            log::warn!(
                "image content store: kept {} blob(s) or layer(s) no recorded image uses: the store is new or was rebuilt and cannot tell them from what it forgot",
                unused.len()
            );
            return Ok(());
        }
        // A power cut between recording a change and deleting files, or in the middle
        // of an import, leaves blobs no image uses.
        for digest in &unused {
            log::warn!("image content store: removing {digest}, which no recorded image uses");
            self.content.remove_layer(digest)?;
            self.content.remove_blob(digest)?;
        }
        log::warn!(
            "image content store: removed {} blob(s) or layer(s) no recorded image uses",
            unused.len()
        );
        Ok(())
    }

    /// The first of `record`'s blobs that is not in the content store.
    fn first_missing(&self, record: &ImageRecord) -> Result<Option<String>, ImageError> {
        for d in std::iter::once(&record.manifest_digest)
            .chain(std::iter::once(&record.config_digest))
            .chain(&record.layers)
        {
            if !self.content.has_blob(d)? {
                return Ok(Some(d.clone()));
            }
        }
        Ok(None)
    }

    /// Adds `record` and the tags no other image holds to `batch`.
    fn put_back(&self, batch: &mut Batch, record: &ImageRecord) -> Result<(), ImageError> {
        batch.put(&self.images, &record.manifest_digest, record)?;
        for name in record.references.iter().filter(|r| !is_digest(r)) {
            if self.refs.get(name)?.is_none() {
                batch.put(&self.refs, name, &record.manifest_digest)?;
            }
        }
        Ok(())
    }

    /// Image manifests among the stored blobs not in `indexed` whose config and layers
    /// are all stored, as records named by their digest.
    fn manifests_on_disk(&self, indexed: &HashSet<String>) -> Result<Vec<ImageRecord>, ImageError> {
        let mut out = Vec::new();
        for digest in self.content.stored_digests()? {
            if indexed.contains(&digest)
                || !self.content.has_blob(&digest)?
                || self.content.blob_size(&digest)? > JSON_LIMIT
            {
                continue;
            }
            let Ok(bytes) = self.content.read_blob(&digest, JSON_LIMIT) else {
                continue;
            };
            if bytes.first() != Some(&b'{') {
                continue;
            }
            let Ok(manifest) = serde_json::from_slice::<ManifestShape>(&bytes) else {
                continue;
            };
            let mut record = ImageRecord {
                references: vec![digest.clone()],
                manifest_digest: digest.clone(),
                config_digest: manifest.config.digest,
                layers: manifest.layers.into_iter().map(|l| l.digest).collect(),
                size: 0,
                imported_at: crate::time::now(),
                last_used: None,
                pinned: false,
            };
            let mut complete = true;
            for d in std::iter::once(&record.manifest_digest)
                .chain(std::iter::once(&record.config_digest))
                .chain(&record.layers)
            {
                // Digests come from the file: checked before they become paths.
                if super::reference::check_digest(d).is_err() || !self.content.has_blob(d)? {
                    complete = false;
                    break;
                }
                record.size = record.size.saturating_add(self.content.blob_size(d)?);
            }
            if complete {
                out.push(record);
            }
        }
        Ok(out)
    }
}

/// What makes a blob an image manifest, for [`ImageStore::manifests_on_disk`].
#[derive(Deserialize)]
struct ManifestShape {
    config: DescriptorShape,
    layers: Vec<DescriptorShape>,
}

#[derive(Deserialize)]
struct DescriptorShape {
    digest: String,
}

/// Bytes of regular files under `dir` (an unpacked layer), without following links.
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::digest::Expect;

    /// Stores image `i` in `images`' content store: a config, a layer and a manifest
    /// (the layer is never unpacked here), and records it under `name`.
    fn put_image(images: &ImageStore, i: usize, name: Option<&str>) -> ImageRecord {
        let blob = |bytes: Vec<u8>| {
            images
                .content
                .write_blob(
                    &mut bytes.as_slice(),
                    "test blob",
                    Expect {
                        digest: None,
                        size: None,
                    },
                )
                .expect("blob")
        };
        let (config, config_size) = blob(format!("{{\"image\":{i}}}").into_bytes());
        let (layer, layer_size) = blob(format!("layer {i}").into_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "config": {"digest": config, "size": config_size},
            "layers": [{"digest": layer, "size": layer_size}],
        });
        let (manifest, _) = blob(serde_json::to_vec(&manifest).expect("json"));
        let record = ImageRecord {
            references: vec![name.map_or(manifest.clone(), str::to_string)],
            manifest_digest: manifest.clone(),
            config_digest: config,
            layers: vec![layer],
            size: 1,
            imported_at: crate::time::now(),
            last_used: None,
            pinned: false,
        };
        if name.is_some() {
            let mut batch = Batch::new();
            images.put_back(&mut batch, &record).expect("batch");
            images.write_record_file(&record).expect("record file");
            images.store.apply(batch).expect("apply");
        }
        record
    }

    fn blob_count(root: &Path) -> usize {
        fs::read_dir(root.join("content/blobs/sha256"))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    #[test]
    fn a_lost_index_is_rebuilt_from_disk_and_nothing_is_swept() {
        let tmp = crate::testutil::TempDir::new("image-rebuild");
        let root = tmp.0.clone();
        let (tagged, untagged) = {
            let store = Store::open(&root.join("db")).expect("open");
            let images = ImageStore::open(&root, &store).expect("images");
            let tagged = put_image(&images, 1, Some("docker.io/library/busybox:demo"));
            // A manifest with no record file, as stored before there were any.
            let untagged = put_image(&images, 2, None);
            store.flush().expect("flush");
            (tagged, untagged)
        };
        let blobs = blob_count(&root);
        assert_eq!(blobs, 6);
        fs::remove_dir_all(root.join("db")).expect("lose the store");
        let store = Store::open(&root.join("db")).expect("fresh store");
        assert!(store.is_fresh());
        let images = ImageStore::open(&root, &store).expect("images");
        assert_eq!(blob_count(&root), blobs, "nothing swept");
        let mut list = images.list().expect("list");
        list.sort_by(|a, b| a.references.cmp(&b.references));
        let refs: Vec<&str> = list.iter().map(|r| r.references[0].as_str()).collect();
        assert!(refs.contains(&"docker.io/library/busybox:demo"), "{refs:?}");
        assert!(
            refs.contains(&untagged.manifest_digest.as_str()),
            "{refs:?}"
        );
        let (shown, found) = images
            .find("busybox:demo")
            .expect("find")
            .expect("the tag names the image again");
        assert_eq!(shown, "docker.io/library/busybox:demo");
        assert_eq!(found.manifest_digest, tagged.manifest_digest);
        assert_eq!(found.layers, tagged.layers);
    }

    #[test]
    fn a_kept_store_sweeps_only_what_no_image_on_disk_uses() {
        let tmp = crate::testutil::TempDir::new("image-sweep");
        let root = tmp.0.clone();
        let store = Store::open(&root.join("db")).expect("open");
        let orphan = {
            let images = ImageStore::open(&root, &store).expect("images");
            put_image(&images, 1, Some("docker.io/library/a:1"));
            let (orphan, _) = images
                .content
                .write_blob(
                    &mut b"left by an import cut short".as_slice(),
                    "orphan",
                    Expect {
                        digest: None,
                        size: None,
                    },
                )
                .expect("orphan");
            store.flush().expect("flush");
            orphan
        };
        // The image's index entry is lost (a power cut before the index was flushed),
        // its record file is not.
        let t: Tree<ImageRecord> = store.tree("images").expect("tree");
        for k in t.keys().expect("keys") {
            t.remove(&k).expect("remove");
        }
        store.flush().expect("flush");
        drop((t, store));
        let store = Store::open(&root.join("db")).expect("reopen");
        assert!(!store.is_fresh());
        let images = ImageStore::open(&root, &store).expect("images");
        assert_eq!(images.list().expect("list").len(), 1, "put back");
        assert!(
            !images.content.has_blob(&orphan).expect("has"),
            "orphan swept"
        );
        assert_eq!(blob_count(&root), 3);
    }

    /// Prints how long rebuilding the index takes (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn rebuild_time() {
        for n in [10usize, 100, 500] {
            let tmp = crate::testutil::TempDir::new("image-rebuild-time");
            let root = tmp.0.clone();
            {
                let store = Store::open(&root.join("db")).expect("open");
                let images = ImageStore::open(&root, &store).expect("images");
                for i in 0..n {
                    put_image(&images, i, Some(&format!("docker.io/library/img:{i}")));
                }
                store.flush().expect("flush");
            }
            fs::remove_dir_all(root.join("db")).expect("lose the store");
            let store = Store::open(&root.join("db")).expect("fresh");
            let t0 = std::time::Instant::now();
            let images = ImageStore::open(&root, &store).expect("images");
            let from_files = t0.elapsed();
            assert_eq!(images.list().expect("list").len(), n);
            drop(images);
            drop(store);
            fs::remove_dir_all(root.join("db")).expect("lose the store");
            fs::remove_dir_all(root.join("content/records")).expect("lose the records");
            let store = Store::open(&root.join("db")).expect("fresh");
            let t0 = std::time::Instant::now();
            let images = ImageStore::open(&root, &store).expect("images");
            let from_manifests = t0.elapsed();
            assert_eq!(images.list().expect("list").len(), n);
            println!(
                "{n} images: from record files {from_files:?}, from manifests alone {from_manifests:?}"
            );
        }
    }
}
