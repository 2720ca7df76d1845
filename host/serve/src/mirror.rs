//! With `cluster.plugin_store`, every host's pipelines folder is a copy of
//! one set of files kept in etcd: a pipeline file (its text in etcd) or a
//! plugin (its digest in etcd, its bytes in the store by digest) that
//! changes in one host's folder, by the API or by hand, reaches every
//! host's folder, where the watcher acts on it as on any change.
//!
//! Each host remembers the digest it last agreed with etcd per file. A file
//! that differs from etcd changed here if etcd still holds what was agreed
//! (it is published), and in etcd otherwise (it is copied here): etcd wins
//! a conflict. A host starting with an empty memory publishes what etcd
//! lacks and takes what etcd has.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use weir_cluster::keys::check_name;
use weir_cluster::{ClusterError, Session};

use crate::plugin_store::{MAX_PLUGIN, PluginStore};
use crate::server::MAX_PIPELINE_FILE;

/// What etcd holds of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Remote {
    sha256: String,
    /// A pipeline file's text (plugins' bytes live in the store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

/// A file of a tenant's folder: `(tenant, file name)`.
type FileKey = (String, String);

/// What identifies a file's content without reading it: modified time in
/// nanoseconds, length, inode.
type Stamp = (i128, u64, u64);

pub struct Mirror {
    session: Arc<Session>,
    store: Arc<PluginStore>,
    pipelines_dir: PathBuf,
    tenants: Vec<String>,
    /// The digest each file had when this host and etcd last agreed.
    agreed: Mutex<BTreeMap<FileKey, String>>,
    /// Digests of local files by what identifies their content, so a
    /// plugin is hashed once, not on every look.
    hashed: Mutex<BTreeMap<PathBuf, (Stamp, String)>>,
}

impl Mirror {
    pub fn new(
        session: Arc<Session>,
        store: Arc<PluginStore>,
        pipelines_dir: PathBuf,
        tenants: Vec<String>,
    ) -> Self {
        Mirror {
            session,
            store,
            pipelines_dir,
            tenants,
            agreed: Mutex::new(BTreeMap::new()),
            hashed: Mutex::new(BTreeMap::new()),
        }
    }

    /// One look: publishes what changed here, copies what changed in etcd.
    /// Plugins go before pipeline files, so a pipeline never names a
    /// plugin not yet in place.
    pub fn sync(&self) -> Result<(), ClusterError> {
        let remote = self.read_remote()?;
        let local = self.read_local();
        let mut agreed = self.agreed.lock().unwrap_or_else(PoisonError::into_inner);
        let names: BTreeSet<&FileKey> = remote.keys().chain(local.keys()).collect();
        let (plugins, pipelines): (Vec<&FileKey>, Vec<&FileKey>) = names
            .into_iter()
            .partition(|(_, file)| file.ends_with(".wasm"));
        for key in plugins.into_iter().chain(pipelines) {
            let here = local.get(key);
            let there = remote.get(key).map(|r| &r.sha256);
            if here == there {
                match here {
                    Some(digest) => agreed.insert(key.clone(), digest.clone()),
                    None => agreed.remove(key),
                };
                continue;
            }
            let outcome = if there != agreed.get(key) {
                self.take(key, remote.get(key))
            } else {
                self.publish(key, here)
            };
            match outcome {
                Ok(Some(digest)) => {
                    agreed.insert(key.clone(), digest);
                }
                Ok(None) => {
                    agreed.remove(key);
                }
                Err(e) => tracing::warn!(
                    tenant = %key.0, file = %key.1,
                    "cluster: cannot mirror the file: {e}"
                ),
            }
        }
        Ok(())
    }

    fn read_remote(&self) -> Result<BTreeMap<FileKey, Remote>, ClusterError> {
        let prefix = self.session.keys().files();
        let mut out = BTreeMap::new();
        for (rest, value) in self
            .session
            .under(&prefix, "reading the pipelines folders")?
        {
            let Some((tenant, file)) = rest.split_once('/') else {
                continue;
            };
            if !self.tenants.iter().any(|t| t == tenant) || check_name("file", file).is_err() {
                continue;
            }
            match serde_json::from_slice::<Remote>(&value) {
                Ok(remote) => {
                    out.insert((tenant.to_string(), file.to_string()), remote);
                }
                Err(e) => tracing::warn!(
                    %tenant, %file,
                    "cluster: etcd holds an unreadable file entry: {e}"
                ),
            }
        }
        Ok(out)
    }

    /// The pipeline files and plugins of every tenant's folder, by digest.
    fn read_local(&self) -> BTreeMap<FileKey, String> {
        let mut out = BTreeMap::new();
        for tenant in &self.tenants {
            let Ok(entries) = std::fs::read_dir(self.pipelines_dir.join(tenant)) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(file) = entry.file_name().into_string() else {
                    continue;
                };
                if !mirrored(&file) {
                    continue;
                }
                if let Some(digest) = self.digest(&entry.path()) {
                    out.insert((tenant.clone(), file), digest);
                }
            }
        }
        out
    }

    fn digest(&self, path: &Path) -> Option<String> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_file() || meta.len() > MAX_PLUGIN {
            return None;
        }
        let stamp: Stamp = (
            i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            meta.len(),
            meta.ino(),
        );
        let mut hashed = self.hashed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((seen, digest)) = hashed.get(path)
            && *seen == stamp
        {
            return Some(digest.clone());
        }
        let digest = hex::encode(Sha256::digest(std::fs::read(path).ok()?));
        hashed.insert(path.to_path_buf(), (stamp, digest.clone()));
        Some(digest)
    }

    /// Writes this host's version of the file to etcd (and a plugin's bytes
    /// to the store); returns the digest now agreed.
    fn publish(
        &self,
        (tenant, file): &FileKey,
        digest: Option<&String>,
    ) -> Result<Option<String>, String> {
        let key = self.session.keys().file(tenant, file);
        let mut client = self.session.client();
        let Some(digest) = digest else {
            self.session
                .wait(async {
                    client
                        .delete(key, None)
                        .await
                        .map_err(|e| self.session.error_of("removing a file", e))
                })
                .map_err(|e| e.to_string())?;
            tracing::info!(%tenant, %file, "cluster: published its removal");
            return Ok(None);
        };
        let path = self.pipelines_dir.join(tenant).join(file);
        let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        if hex::encode(Sha256::digest(&bytes)) != *digest {
            return Err("it changed while being read; next look".into());
        }
        let remote = if file.ends_with(".wasm") {
            self.store.put(tenant, digest, bytes)?;
            Remote {
                sha256: digest.clone(),
                text: None,
            }
        } else {
            if bytes.len() > MAX_PIPELINE_FILE {
                return Err(format!("over {MAX_PIPELINE_FILE} bytes"));
            }
            Remote {
                sha256: digest.clone(),
                text: Some(String::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?),
            }
        };
        let value = serde_json::to_vec(&remote).map_err(|e| e.to_string())?;
        self.session
            .wait(async {
                client
                    .put(key, value, None)
                    .await
                    .map_err(|e| self.session.error_of("publishing a file", e))
            })
            .map_err(|e| e.to_string())?;
        tracing::info!(%tenant, %file, sha256 = %digest, "cluster: published");
        Ok(Some(digest.clone()))
    }

    /// Makes this host's folder hold etcd's version of the file.
    fn take(
        &self,
        (tenant, file): &FileKey,
        remote: Option<&Remote>,
    ) -> Result<Option<String>, String> {
        let path = self.pipelines_dir.join(tenant).join(file);
        let Some(remote) = remote else {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("removing {}: {e}", path.display())),
            }
            tracing::info!(%tenant, %file, "cluster: removed, as another host did");
            return Ok(None);
        };
        let bytes = match &remote.text {
            Some(text) => text.clone().into_bytes(),
            None => self.store.get(tenant, &remote.sha256)?.ok_or_else(|| {
                format!(
                    "the plugin store does not hold {tenant}/{}.wasm",
                    remote.sha256
                )
            })?,
        };
        if hex::encode(Sha256::digest(&bytes)) != remote.sha256 {
            return Err(format!(
                "its content does not match the digest etcd holds ({}): not copied",
                remote.sha256
            ));
        }
        write_atomically(&path, &bytes)?;
        tracing::info!(%tenant, %file, sha256 = %remote.sha256, "cluster: copied from another host");
        Ok(Some(remote.sha256.clone()))
    }
}

/// Pipeline files and plugins, not hidden files or partial copies.
fn mirrored(file: &str) -> bool {
    check_name("file", file).is_ok()
        && [".yaml", ".yml", ".wasm"]
            .iter()
            .any(|ext| file.ends_with(ext))
}

/// Written under a hidden name first (the watcher and the mirror skip
/// hidden files), then renamed into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let folder = path.parent().ok_or("no folder")?;
    std::fs::create_dir_all(folder).map_err(|e| format!("creating {}: {e}", folder.display()))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("no file name")?;
    let partial = folder.join(format!(".{name}.partial-{}", std::process::id()));
    std::fs::write(&partial, bytes).map_err(|e| format!("writing {}: {e}", partial.display()))?;
    std::fs::rename(&partial, path).map_err(|e| format!("renaming into {}: {e}", path.display()))
}
