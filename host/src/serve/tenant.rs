//! One tenant of `weir serve`: its token, its root, its grants and bounds,
//! and how a pipeline file of its is admitted: read without the host's
//! environment, its state put where the host keeps the tenant's, its blob
//! roots and plugin paths held inside the tenant's folders, its grants
//! within the tenant's.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use weir_contract::grants::Grants;

use super::host_file::{HostConfig, TenantConfig};
use crate::config::PipelineConfig;
use crate::runtime::TenantShare;

pub struct Tenant {
    pub name: String,
    pub config: TenantConfig,
    token_digest: [u8; 32],
    /// The tenant's blob-store root, links resolved.
    pub root: PathBuf,
    /// `<pipelines_dir>/<tenant>`, links resolved: its pipeline files and
    /// the plugins they name.
    pub pipelines_dir: PathBuf,
    /// `<state_dir>/tenants/<tenant>`: its positions, epochs and uploads.
    pub state_dir: PathBuf,
    pub grants: Grants,
    pub share: Arc<TenantShare>,
}

impl Tenant {
    /// Makes the tenant's folders and reads its token; `host_state` and
    /// `watched` are the host's own folders (resolved), which no tenant
    /// root may overlap.
    pub fn open(host: &HostConfig, name: &str) -> Result<Tenant, String> {
        let config = host.tenants[name].clone();
        let field = format!("{}: tenants.{name}", host.file.display());
        let token = host.tenant_token(name)?;
        let root = made(&host.resolve(&config.root), &format!("{field}.root"))?;
        let pipelines_dir = made(
            &host.resolve(&host.pipelines_dir).join(name),
            &format!("{field}: its pipelines folder"),
        )?;
        let state_dir = made(
            &host.resolve(&host.state_dir).join("tenants").join(name),
            &format!("{field}: its state folder"),
        )?;
        let grants = config.grants.parse().map_err(|e| format!("{field}.{e}"))?;
        let stored_now = stored_bytes(&root);
        let share = Arc::new(TenantShare::new(
            name,
            config.max_stored_mb.saturating_mul(1 << 20),
            stored_now,
            config.log_lines_per_second,
            config.log_burst,
        ));
        Ok(Tenant {
            name: name.to_string(),
            token_digest: digest(&token),
            config,
            root,
            pipelines_dir,
            state_dir,
            grants,
            share,
        })
    }

    pub fn token_matches(&self, presented_digest: &[u8; 32]) -> bool {
        self.token_digest == *presented_digest
    }

    /// Where uploaded plugins of the tenant are kept, by digest.
    pub fn uploads_dir(&self) -> PathBuf {
        self.state_dir.join("plugins")
    }

    /// Reads a pipeline file of this tenant deployed as `name` and makes it
    /// safe to run: every error names `file` and the key.
    pub fn admit(&self, name: &str, text: &str, file: &Path) -> Result<PipelineConfig, String> {
        crate::config::check_name("pipeline name", name)?;
        // No `${VAR}`: the host's environment holds the tokens.
        let mut config = PipelineConfig::parse(text, file, &self.pipelines_dir, |_| None)
            .map_err(|e| e.to_string())?;
        let invalid = |detail: String| format!("{}: {detail}", file.display());
        if config.pipeline != name {
            return Err(invalid(format!(
                "pipeline: `{}` differs from the name it is deployed as (`{name}`)",
                config.pipeline
            )));
        }
        if config.state_dir != Path::new(".weir") {
            return Err(invalid(
                "state_dir: not allowed under weir serve (the host keeps every pipeline's \
                 positions and epochs in its own state folder)"
                    .into(),
            ));
        }
        config.state_dir = self.state_dir.join("pipelines").join(name);
        let pipeline_root = self.root.join(name);
        for (i, sink) in config.sinks.iter_mut().enumerate() {
            let field = format!("sinks[{i}]");
            let root = self
                .sink_root(&pipeline_root, &sink.blob_store.url)
                .map_err(|e| invalid(format!("{field}.blob_store.url: {e}")))?;
            if !sink.blob_store.options.is_empty() {
                return Err(invalid(format!(
                    "{field}.blob_store.options: not allowed under weir serve (roots are folders \
                     in the tenant's root)"
                )));
            }
            sink.blob_store.url = root.display().to_string();
            sink.plugin = self
                .plugin_path(&sink.plugin)
                .map_err(|e| invalid(format!("{field}.plugin: {e}")))?;
            let asked = sink
                .grants
                .parse()
                .map_err(|e| invalid(format!("{field}.{e}")))?;
            if let Err((kind, pattern)) = self.grants.check_within(&asked) {
                return Err(invalid(format!(
                    "{field}.{}: `{pattern}` is not within tenant `{}`'s grants \
                     (tenants.{}.{} in the host file)",
                    kind.key(),
                    self.name,
                    self.name,
                    kind.key()
                )));
            }
        }
        Ok(config)
    }

    /// The sum of `memory_mb` over a pipeline's sinks.
    pub fn memory_mb(config: &PipelineConfig) -> u64 {
        config.sinks.iter().map(|s| s.limits.memory_mb).sum()
    }

    /// A sink's root: a relative folder path inside `<root>/<pipeline>`,
    /// made if missing, that resolves (links too) inside the tenant's root.
    fn sink_root(&self, pipeline_root: &Path, url: &str) -> Result<PathBuf, String> {
        let relative = Path::new(url);
        let plain = !url.contains(':')
            && relative.is_relative()
            && relative
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            && relative
                .components()
                .any(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(format!(
                "`{url}` must be a relative folder path without `..` or a scheme: under weir \
                 serve a sink's root lies in its tenant's root"
            ));
        }
        let root = made(&pipeline_root.join(relative), "the root")?;
        if !root.starts_with(&self.root) {
            return Err(format!(
                "`{url}` leads out of tenant `{}`'s root (through a link)",
                self.name
            ));
        }
        Ok(root)
    }

    /// A plugin path, resolved inside the tenant's pipelines folder or its
    /// uploads.
    pub fn plugin_path(&self, path: &Path) -> Result<PathBuf, String> {
        let joined = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.pipelines_dir.join(path)
        };
        let resolved = joined
            .canonicalize()
            .map_err(|e| format!("`{}`: {e}", path.display()))?;
        let uploads = self.uploads_dir().canonicalize().ok();
        let inside = resolved.starts_with(&self.pipelines_dir)
            || uploads.is_some_and(|u| resolved.starts_with(u));
        if !inside {
            return Err(format!(
                "`{}` lies outside tenant `{}`'s pipelines folder",
                path.display(),
                self.name
            ));
        }
        Ok(resolved)
    }
}

/// The SHA-256 of a token, as tokens are compared.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Makes a folder and resolves its links.
fn made(path: &Path, what: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(path)
        .and_then(|()| path.canonicalize())
        .map_err(|e| format!("{what}: cannot make {}: {e}", path.display()))
}

/// What a folder holds, in bytes (files only; links are not followed).
fn stored_bytes(root: &Path) -> u64 {
    let mut total = 0;
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                folders.push(entry.path());
            } else if kind.is_file() {
                total += entry.metadata().map_or(0, |m| m.len());
            }
        }
    }
    total
}
