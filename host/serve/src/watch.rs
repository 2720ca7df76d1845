//! The watched folder: `<pipelines_dir>/<tenant>/<pipeline>.yaml`. A new
//! file creates a pipeline, a changed one redefines it, a removed one
//! deletes it, and a plugin file that a sink names and that changed (and
//! then stayed the same for one look) is swapped in at a commit boundary.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::server::{Caller, MAX_PIPELINE_FILE, Origin, Server, file_digest};

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified_ns: i128,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        len: meta.len(),
        inode: meta.ino(),
    })
}

/// A plugin file a sink names, as last seen.
struct SeenPlugin {
    stamp: Option<Stamp>,
    sha256: String,
    /// A new stamp seen once; acted on when the next look sees it again.
    settling: Option<Stamp>,
}

#[derive(Default)]
struct Watcher {
    /// Pipeline file -> digest of its text as last acted on.
    files: BTreeMap<PathBuf, String>,
    plugins: BTreeMap<(String, String, String), SeenPlugin>,
}

/// Looks at the folder every `interval` until `stop`.
pub fn watch(server: Arc<Server>, interval: Duration, stop: Arc<AtomicBool>) {
    let mut watcher = Watcher::default();
    while !stop.load(Ordering::Relaxed) {
        watcher.look(&server);
        std::thread::sleep(interval);
    }
}

impl Watcher {
    fn look(&mut self, server: &Arc<Server>) {
        let mut present = BTreeSet::new();
        for (tenant_name, tenant) in &server.tenants {
            let files = match pipeline_files(&tenant.pipelines_dir) {
                Ok(files) => files,
                Err(e) => {
                    // Not a deletion: a folder that cannot be read now (the
                    // host out of descriptors, say) still holds its files.
                    tracing::warn!(
                        folder = %tenant.pipelines_dir.display(),
                        "cannot read the pipelines folder; its pipelines are left as they are: {e}"
                    );
                    continue;
                }
            };
            for (path, name) in files {
                present.insert(path.clone());
                let text = match read_pipeline_file(&path) {
                    Ok(text) => text,
                    Err(Unread::Refused(why)) => {
                        // What runs stays (as when the API refuses a file);
                        // the file counts as changed once it is fixed.
                        if let Some(digest) = self.files.get_mut(&path) {
                            digest.clear();
                        }
                        if !server.is_rejected(&path, &why) {
                            tracing::error!(file = %path.display(), "pipeline file refused: {why}");
                            server.reject(&path, why);
                        }
                        continue;
                    }
                    // Tried again at the next look; what runs stays.
                    Err(Unread::Failed(e)) => {
                        tracing::warn!(file = %path.display(), "cannot read the pipeline file: {e}");
                        continue;
                    }
                };
                let digest = hex::encode(Sha256::digest(text.as_bytes()));
                if self.files.get(&path) == Some(&digest) {
                    continue;
                }
                self.files.insert(path.clone(), digest);
                match server.apply(&Caller::Operator, tenant_name, &name, &text, Origin::Folder) {
                    Ok(_) => {}
                    Err(refusal) => {
                        let why = refusal.to_string();
                        tracing::error!(file = %path.display(), "pipeline file refused: {why}");
                        server.reject(&path, why);
                    }
                }
            }
        }
        // A file is gone only when it is confirmed absent: not when its
        // folder could not be listed, nor when looking at it failed.
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|f| !present.contains(*f) && confirmed_absent(f))
            .cloned()
            .collect();
        for file in gone {
            self.files.remove(&file);
            server.forget_rejected(&file);
            let Some(name) = pipeline_name(&file) else {
                continue;
            };
            let tenant = file
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if server
                .delete(&Caller::Operator, &tenant, &name, Origin::Folder)
                .is_ok()
            {
                tracing::info!(file = %file.display(), "pipeline file removed: pipeline deleted");
            }
        }
        // A refused file that was removed takes its refusal with it.
        for file in server.rejected_files() {
            if !present.contains(&file) && confirmed_absent(&file) {
                server.forget_rejected(&file);
            }
        }
        self.look_at_plugins(server);
    }

    /// Swaps in a plugin file that changed under a running definition.
    fn look_at_plugins(&mut self, server: &Arc<Server>) {
        let mut alive = Vec::new();
        for slot in server.slots() {
            for sink in slot.config().sinks {
                let key = (
                    slot.tenant.name.clone(),
                    slot.name.clone(),
                    sink.name.clone(),
                );
                alive.push(key.clone());
                let now = stamp(&sink.plugin);
                if now.is_none() && !confirmed_absent(&sink.plugin) {
                    // Could not be looked at now: not a change.
                    continue;
                }
                let Some(seen) = self.plugins.get_mut(&key) else {
                    let Ok(sha256) = file_digest(&sink.plugin) else {
                        continue;
                    };
                    self.plugins.insert(
                        key,
                        SeenPlugin {
                            stamp: now,
                            sha256,
                            settling: None,
                        },
                    );
                    continue;
                };
                if now == seen.stamp {
                    seen.settling = None;
                    continue;
                }
                if seen.settling != now {
                    // Changed since the last look: act when it holds still.
                    seen.settling = now;
                    continue;
                }
                seen.stamp = now;
                seen.settling = None;
                let Ok(sha256) = file_digest(&sink.plugin) else {
                    continue;
                };
                if sha256 == seen.sha256 {
                    continue;
                }
                seen.sha256 = sha256.clone();
                tracing::info!(
                    pipeline = %slot.id(), sink = %sink.name, sha256 = %sha256,
                    "plugin file changed: swapping at the next commit boundary"
                );
                let server = server.clone();
                let slot = slot.clone();
                let path = sink.plugin.clone();
                let name = sink.name.clone();
                // A swap waits for a commit boundary; the folder is looked at
                // meanwhile.
                let _ = std::thread::Builder::new()
                    .name("swap-from-file".into())
                    .spawn(move || {
                        if let Err(refusal) = server.reload_from_file(&slot, &name, path, sha256) {
                            tracing::error!(pipeline = %slot.id(), sink = %name, "plugin file refused: {refusal}");
                        }
                    });
            }
        }
        self.plugins.retain(|key, _| alive.contains(key));
    }
}

/// The pipeline files in `folder`, with their pipelines' names; an error
/// when the folder, or any entry of it, cannot be read.
pub(crate) fn pipeline_files(folder: &Path) -> std::io::Result<Vec<(PathBuf, String)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(folder)? {
        let path = entry?.path();
        if let Some(name) = pipeline_name(&path) {
            files.push((path, name));
        }
    }
    Ok(files)
}

/// True only when `path` is known not to exist.
fn confirmed_absent(path: &Path) -> bool {
    matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

pub(crate) enum Unread {
    /// Over the bound the API also holds to (refused, not read), or not text.
    Refused(String),
    Failed(std::io::Error),
}

/// A pipeline file's text, read only up to the API's bound: a larger file
/// is refused from its length, and one that grows while read is not read
/// past the bound.
pub(crate) fn read_pipeline_file(path: &Path) -> Result<String, Unread> {
    let too_large = |len: u64| {
        Unread::Refused(format!(
            "{}: the file is {len} bytes, over the {} KiB a pipeline file may hold",
            path.display(),
            MAX_PIPELINE_FILE >> 10
        ))
    };
    let file = std::fs::File::open(path).map_err(Unread::Failed)?;
    let len = file.metadata().map_err(Unread::Failed)?.len();
    if len > MAX_PIPELINE_FILE as u64 {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_PIPELINE_FILE as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(Unread::Failed)?;
    if bytes.len() > MAX_PIPELINE_FILE {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes)
        .map_err(|_| Unread::Refused(format!("{}: the file is not UTF-8", path.display())))
}

/// `orders` for `.../orders.yaml`; `None` for anything else (hidden files,
/// partial copies, other extensions).
fn pipeline_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    if file.starts_with('.') {
        return None;
    }
    let name = file
        .strip_suffix(".yaml")
        .or_else(|| file.strip_suffix(".yml"))?;
    Some(name.to_string())
}
