//! The watched folder: `<pipelines_dir>/<tenant>/<pipeline>.yaml`. A new
//! file creates a pipeline, a changed one redefines it, a removed one
//! deletes it, and a plugin file that a sink names and that changed (and
//! then stayed the same for one look) is swapped in at a commit boundary.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::server::{Caller, Origin, Server, file_digest};

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
        let mut present = BTreeMap::new();
        for (tenant_name, tenant) in &server.tenants {
            let Ok(entries) = std::fs::read_dir(&tenant.pipelines_dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Some(name) = pipeline_name(&path) else {
                    continue;
                };
                present.insert(path.clone(), (tenant_name.clone(), name.clone()));
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
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
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|f| !present.contains_key(*f))
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
                let Some(seen) = self.plugins.get_mut(&key) else {
                    let sha256 = file_digest(&sink.plugin).unwrap_or_default();
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
