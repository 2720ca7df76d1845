//! One tenant of `weir serve`: its token, its folders, its grants and
//! bounds, and what it shares between its pipelines. What a tenant may run
//! is decided in [`policy`](crate::policy).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use weir_contract::grants::Grants;

use super::host_file::{HostConfig, TenantConfig, local_folder};
use weir_runtime::TenantShare;
use weir_runtime::capability::blobstore::BlobScope;
use weir_runtime::tenant::TenantBounds;

pub struct Tenant {
    pub name: String,
    pub config: TenantConfig,
    token_digest: [u8; 32],
    /// The tenant's blob-store root.
    pub root: TenantRoot,
    /// `<pipelines_dir>/<tenant>`, links resolved: its pipeline files and
    /// the plugins they name.
    pub pipelines_dir: PathBuf,
    /// `<state_dir>/tenants/<tenant>`: its positions, epochs and uploads.
    pub state_dir: PathBuf,
    pub grants: Grants,
    /// The servers its pipelines' sources may read (as TCP grants), by
    /// the kind of source.
    pub sources: SourceGrants,
    pub share: Arc<TenantShare>,
    /// What pruning must keep besides what runs and what files name. Held
    /// while an upload is written and while uploads are pruned.
    uploads: Mutex<Uploads>,
}

/// Where a tenant's sinks keep their data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantRoot {
    /// A folder, made and with its links resolved.
    Folder(PathBuf),
    /// Object storage: the root's URL (no `/` at its end), and the object
    /// store's options (`${VAR}` already read).
    Objects {
        url: String,
        options: BTreeMap<String, String>,
    },
}

impl TenantRoot {
    /// The folder, for a root that is one.
    pub fn folder(&self) -> Option<&Path> {
        match self {
            TenantRoot::Folder(path) => Some(path),
            TenantRoot::Objects { .. } => None,
        }
    }

    /// Whether one root lies in the other (a folder in a folder, a prefix
    /// in a prefix of the same bucket).
    pub fn overlaps(&self, other: &TenantRoot) -> bool {
        match (self, other) {
            (TenantRoot::Folder(a), TenantRoot::Folder(b)) => a.starts_with(b) || b.starts_with(a),
            (TenantRoot::Objects { url: a, .. }, TenantRoot::Objects { url: b, .. }) => {
                let within = |inner: &str, outer: &str| {
                    inner == outer || inner.starts_with(&format!("{outer}/"))
                };
                within(a, b) || within(b, a)
            }
            _ => false,
        }
    }

    /// The root as an operator wrote it, for messages.
    pub fn describe(&self) -> String {
        match self {
            TenantRoot::Folder(path) => path.display().to_string(),
            TenantRoot::Objects { url, .. } => url.clone(),
        }
    }
}

/// The servers a tenant's sources may read, per kind of source: a grant of
/// a Postgres server does not let a MySQL source reach the same address.
pub struct SourceGrants {
    pub postgres: Grants,
    pub mysql: Grants,
}

impl SourceGrants {
    /// The grants of the source kind a pipeline file names (`postgres`,
    /// `mysql`); none for a kind that connects nowhere.
    pub fn of(&self, kind: &str) -> Option<&Grants> {
        match kind {
            "postgres" => Some(&self.postgres),
            "mysql" => Some(&self.mysql),
            _ => None,
        }
    }
}

/// Uploads that pruning keeps though no sink runs them and no pipeline
/// file names them (yet), by digest.
#[derive(Debug, Default)]
pub struct Uploads {
    /// Swaps under way, with how many of each digest.
    pub under_way: BTreeMap<String, usize>,
    /// Plugins uploaded on their own, kept until then for the apply that
    /// names them.
    pub held_until: BTreeMap<String, SystemTime>,
}

impl Tenant {
    /// Makes the tenant's folders and reads its token; `host_state` and
    /// `watched` are the host's own folders (resolved), which no tenant
    /// root may overlap.
    /// `io` measures what an object-storage root holds (without it, a
    /// root on object storage counts as empty at start).
    pub fn open(
        host: &HostConfig,
        name: &str,
        io: Option<&tokio::runtime::Handle>,
    ) -> Result<Tenant, String> {
        let config = host.tenants[name].clone();
        let field = format!("{}: tenants.{name}", host.file.display());
        let token = host.tenant_token(name)?;
        let root = open_root(host, &config, &field)?;
        let pipelines_dir = made(
            &host.resolve(&host.pipelines_dir).join(name),
            &format!("{field}: its pipelines folder"),
        )?;
        let state_dir = made(
            &host.resolve(&host.state_dir).join("tenants").join(name),
            &format!("{field}: its state folder"),
        )?;
        let grants = config.grants.parse().map_err(|e| format!("{field}.{e}"))?;
        let sources = SourceGrants {
            postgres: Grants::parse(Vec::<String>::new(), &config.sources.postgres)
                .map_err(|e| format!("{field}.sources.postgres: {e}"))?,
            mysql: Grants::parse(Vec::<String>::new(), &config.sources.mysql)
                .map_err(|e| format!("{field}.sources.mysql: {e}"))?,
        };
        let stored_now = match &root {
            TenantRoot::Folder(folder) => weir_runtime::capability::blob_walk::stored_bytes(folder)
                .map_err(|e| format!("{field}.root: cannot measure {}: {e}", folder.display()))?,
            TenantRoot::Objects { url, options } => match io {
                Some(io) => {
                    let options: Vec<(String, String)> = options
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    BlobScope::open(url, &options, &host.base_dir, io.clone())
                        .map_err(|e| format!("{field}.root: {e}"))?
                        .total_bytes()
                        .map_err(|e| format!("{field}.root: cannot measure {url}: {e}"))?
                }
                None => 0,
            },
        };
        // Its uploaded plugins count against the same quota.
        let uploads = state_dir.join("plugins");
        let uploaded_now = if uploads.exists() {
            weir_runtime::capability::blob_walk::stored_bytes(&uploads).map_err(|e| {
                format!(
                    "{field}: cannot measure its uploads in {}: {e}",
                    uploads.display()
                )
            })?
        } else {
            0
        };
        let bounds = TenantBounds {
            max_stored_bytes: config.max_stored_mb.saturating_mul(1 << 20),
            log_lines_per_second: config.log_lines_per_second,
            log_burst: config.log_burst,
            max_instances: config.max_instances,
            max_sockets: config.max_sockets,
        };
        let share = Arc::new(TenantShare::new(
            name,
            bounds,
            stored_now.saturating_add(uploaded_now),
        ));
        let held_until = uploads_held_after_restart(&uploads, host.admin.upload_hold());
        Ok(Tenant {
            name: name.to_string(),
            token_digest: digest(&token),
            config,
            root,
            pipelines_dir,
            state_dir,
            grants,
            sources,
            share,
            uploads: Mutex::new(Uploads {
                under_way: BTreeMap::new(),
                held_until,
            }),
        })
    }

    pub fn token_matches(&self, presented_digest: &[u8; 32]) -> bool {
        self.token_digest == *presented_digest
    }

    /// Where uploaded plugins of the tenant are kept, by digest.
    pub fn uploads_dir(&self) -> PathBuf {
        self.state_dir.join("plugins")
    }

    /// The uploads pruning keeps; hold it while writing or pruning uploads.
    pub fn uploads(&self) -> MutexGuard<'_, Uploads> {
        self.uploads.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Which plugin uploaded on its own was held when the host stopped is not
/// recorded: after a restart every upload is held for `hold` from its
/// file's last change (an upload of the same bytes again touches it), so
/// one whose apply was still to come is still there for it.
fn uploads_held_after_restart(folder: &Path, hold: Duration) -> BTreeMap<String, SystemTime> {
    let mut held = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(folder) else {
        return held;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(sha256) = name.to_str().and_then(|n| n.strip_suffix(".wasm")) else {
            continue;
        };
        if let Ok(changed) = entry.metadata().and_then(|m| m.modified()) {
            held.insert(sha256.to_string(), changed + hold);
        }
    }
    held
}

/// The SHA-256 of a token, as tokens are compared.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Makes a folder and resolves its links; `what` names it in the error.
/// The tenant's root from its `root` (a folder, made, relative to the host
/// file's; or a URL, its options' `${VAR}` read from the host's
/// environment).
fn open_root(host: &HostConfig, config: &TenantConfig, field: &str) -> Result<TenantRoot, String> {
    if let Some(folder) = local_folder(&config.root) {
        if !config.root_options.is_empty() {
            return Err(format!(
                "{field}.root_options: set, but the root is a folder (options are for a URL)"
            ));
        }
        return Ok(TenantRoot::Folder(made(
            &host.resolve(&folder),
            &format!("{field}.root"),
        )?));
    }
    let env = |name: &str| std::env::var(name).ok();
    let mut options = BTreeMap::new();
    for (key, value) in &config.root_options {
        let value = weir_pipeline::config::interpolate(value, &env)
            .map_err(|e| format!("{field}.root_options.{key}: {e}"))?;
        options.insert(key.clone(), value);
    }
    let url = config.root.trim_end_matches('/').to_string();
    let place = url.split_once("://").map_or("", |(_, rest)| rest);
    if place.is_empty() || place.split('/').any(|part| part.is_empty() || part == "..") {
        return Err(format!(
            "{field}.root: `{}` names no place in the store (a bucket, and a prefix for the \
             tenant, without `..` or empty parts)",
            config.root
        ));
    }
    Ok(TenantRoot::Objects { url, options })
}

pub(super) fn made(path: &Path, what: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(path)
        .and_then(|()| path.canonicalize())
        .map_err(|e| format!("{what}: cannot make {}: {e}", path.display()))
}
