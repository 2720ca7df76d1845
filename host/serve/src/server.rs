//! The pipelines of every tenant, and what can be done to them: create,
//! change, pause, resume, stop, start, delete, and swap a sink's plugin.
//! The admin API and the folder watcher both come here; every operation
//! is checked against the tenant it is done for.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::api::{PipelineSummary, RejectedFile, Swapped, Uploaded};
use super::host_file::HostConfig;
use super::policy::Refusal;
use super::supervisor::{Context, PluginVersion, Slot, State, SwapRecord};
use super::tenant::{self, Tenant};
use super::watch;
use weir_metrics::Metrics;
use weir_pipeline::SwapRequest;
use weir_pipeline::control::RUN_ENDED;
use weir_pipeline::plugin_ref;
use weir_pipeline::setup::SinkFactory;
use weir_runtime::{Plugin, plugin};

/// The largest pipeline file taken, through the API or the folder.
pub const MAX_PIPELINE_FILE: usize = 1 << 20;

/// How long a swap may wait for its pipeline's next commit boundary.
const SWAP_WAIT: Duration = Duration::from_secs(120);

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Tenant(String),
}

impl Caller {
    fn reaches(&self, tenant: &str) -> bool {
        match self {
            Caller::Operator => true,
            Caller::Tenant(own) => own == tenant,
        }
    }
}

/// Where a definition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Folder,
    Api,
}

pub struct Server {
    pub host: HostConfig,
    operator_digest: [u8; 32],
    pub tenants: BTreeMap<String, Arc<Tenant>>,
    pipelines: Mutex<BTreeMap<(String, String), Arc<Slot>>>,
    /// Pipeline files that could not be admitted, with why (for `/ready`).
    pub rejected: Mutex<BTreeMap<PathBuf, String>>,
    pub metrics: Arc<Metrics>,
    context: Context,
}

impl Server {
    pub fn new(
        host: HostConfig,
        tenants: BTreeMap<String, Arc<Tenant>>,
        metrics: Arc<Metrics>,
        context: Context,
    ) -> Result<Server, String> {
        let operator = host.operator_token()?;
        Ok(Server {
            operator_digest: tenant::digest(&operator),
            host,
            tenants,
            pipelines: Mutex::new(BTreeMap::new()),
            rejected: Mutex::new(BTreeMap::new()),
            metrics,
            context,
        })
    }

    fn pipelines(&self) -> MutexGuard<'_, BTreeMap<(String, String), Arc<Slot>>> {
        self.pipelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Who presents `token`, if anyone.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        let presented = tenant::digest(token);
        // Every digest is compared, so the time taken does not tell which.
        let mut found = None;
        if presented == self.operator_digest {
            found = Some(Caller::Operator);
        }
        for (name, tenant) in &self.tenants {
            if tenant.token_matches(&presented) {
                found = Some(Caller::Tenant(name.clone()));
            }
        }
        found
    }

    /// Notes a pipeline file that could not be admitted.
    pub fn reject(&self, file: &Path, why: String) {
        self.rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(file.to_path_buf(), why);
    }

    /// Whether `file` is already noted as refused for `why`.
    pub fn is_rejected(&self, file: &Path, why: &str) -> bool {
        self.rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(file)
            .is_some_and(|noted| noted == why)
    }

    pub fn rejected_files(&self) -> Vec<PathBuf> {
        self.rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    pub fn forget_rejected(&self, file: &Path) {
        self.rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(file);
    }

    /// Every slot, for the watcher and `/ready`.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        self.pipelines().values().cloned().collect()
    }

    /// The pipeline files of the watched folder that were refused, with
    /// why: those of the tenants the caller reaches (a file's tenant is
    /// the folder it lies in).
    pub fn rejected_for(&self, caller: &Caller) -> Vec<RejectedFile> {
        self.rejected
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(file, _)| {
                let tenant = file.parent().and_then(Path::file_name);
                tenant.is_some_and(|t| caller.reaches(&t.to_string_lossy()))
            })
            .map(|(file, why)| RejectedFile {
                file: file.display().to_string(),
                error: why.clone(),
            })
            .collect()
    }

    pub fn list(&self, caller: &Caller) -> Vec<PipelineSummary> {
        self.slots()
            .into_iter()
            .filter(|s| caller.reaches(&s.tenant.name))
            .map(|s| {
                let (state, reason) = s.state();
                PipelineSummary {
                    tenant: s.tenant.name.clone(),
                    pipeline: s.name.clone(),
                    state,
                    reason,
                }
            })
            .collect()
    }

    /// In a cluster, this host's session.
    pub fn cluster(&self) -> Option<&Arc<weir_cluster::Session>> {
        self.context.cluster.as_ref()
    }

    /// The slot of `tenant/name` if the caller reaches it; another tenant's
    /// pipeline is "not found", exactly like one that does not exist.
    pub fn slot(&self, caller: &Caller, tenant: &str, name: &str) -> Result<Arc<Slot>, Refusal> {
        let missing = || Refusal::NotFound(format!("no pipeline `{tenant}/{name}`"));
        if !caller.reaches(tenant) {
            return Err(missing());
        }
        self.pipelines()
            .get(&(tenant.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(missing)
    }

    fn tenant(&self, caller: &Caller, tenant: &str) -> Result<Arc<Tenant>, Refusal> {
        if !caller.reaches(tenant) {
            return Err(Refusal::NotFound(format!("no tenant `{tenant}`")));
        }
        self.tenants
            .get(tenant)
            .cloned()
            .ok_or_else(|| Refusal::NotFound(format!("no tenant `{tenant}`")))
    }

    /// Creates or changes `tenant/name` from a pipeline file's text. From
    /// the API the text is also written into the watched folder, so the
    /// folder stays the one record of what runs.
    pub fn apply(
        &self,
        caller: &Caller,
        tenant_name: &str,
        name: &str,
        text: &str,
        origin: Origin,
    ) -> Result<bool, Refusal> {
        let tenant = self.tenant(caller, tenant_name)?;
        let applied = self.define(&tenant, tenant_name, name, text, origin);
        // The definition it replaced may have named uploads nothing else
        // keeps; and an upload held for an apply may be past its hold.
        self.prune_uploads(&tenant);
        applied
    }

    fn define(
        &self,
        tenant: &Arc<Tenant>,
        tenant_name: &str,
        name: &str,
        text: &str,
        origin: Origin,
    ) -> Result<bool, Refusal> {
        self.fetch_uploads(tenant, text);
        // Held from admission until the file is written and its slot holds
        // its plugins: an upload the file names is not pruned in between.
        let _no_pruning = tenant.uploads();
        if origin == Origin::Api {
            // The name comes from the request's path: say so, before it
            // names a file.
            weir_pipeline::config::check_name("pipeline name", name).map_err(|e| {
                Refusal::Invalid(format!("PUT /v1/pipelines/{tenant_name}/{{pipeline}}: {e}"))
            })?;
        }
        let file = tenant.pipelines_dir.join(format!("{name}.yaml"));
        let config = tenant.admit(name, text, &file).map_err(Refusal::Invalid)?;
        let definition = hex::encode(Sha256::digest(text.as_bytes()));
        let mut plugins = file_versions(&config).map_err(Refusal::Invalid)?;
        keep_saved_versions(&config, &mut plugins);
        let mut pipelines = self.pipelines();
        let key = (tenant_name.to_string(), name.to_string());
        let existing = pipelines.get(&key).cloned();
        let others: Vec<u64> = pipelines
            .values()
            .filter(|s| s.tenant.name == tenant_name && s.name != name)
            .map(|s| s.memory_mb())
            .collect();
        tenant.check_counts(&config, &file, &others, existing.is_some())?;
        if origin == Origin::Api {
            write_atomically(&file, text.as_bytes()).map_err(Refusal::Invalid)?;
        }
        self.rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&file);
        match existing {
            Some(slot) if slot.definition() == definition => Ok(false),
            Some(slot) => {
                tracing::info!(pipeline = %slot.id(), "definition changed: restarting at a commit boundary");
                slot.redefine(config, definition, plugins);
                Ok(true)
            }
            None => {
                let metrics = self.metrics.pipeline(tenant_name, name);
                let slot = Slot::new(tenant.clone(), name, config, definition, plugins, metrics);
                slot.spawn(self.context.clone())
                    .map_err(|e| Refusal::Conflict(format!("cannot start a thread: {e}")))?;
                tracing::info!(pipeline = %slot.id(), "created");
                pipelines.insert(key, slot);
                Ok(true)
            }
        }
    }

    /// Stops `tenant/name`, waits for its run to end (within the host's
    /// grace), forgets it and, from the API, removes its file.
    pub fn delete(
        &self,
        caller: &Caller,
        tenant: &str,
        name: &str,
        origin: Origin,
    ) -> Result<(), Refusal> {
        let slot = self.slot(caller, tenant, name)?;
        slot.delete();
        let grace = Duration::from_millis(self.host.shutdown_grace_ms);
        if !slot.wait_ended(grace) {
            tracing::warn!(pipeline = %slot.id(), "its run did not end within the grace; forgotten anyway");
        }
        self.pipelines()
            .remove(&(tenant.to_string(), name.to_string()));
        let sinks: Vec<String> = slot.config().sinks.iter().map(|s| s.name.clone()).collect();
        let tables: Vec<String> = slot
            .live()
            .map(|live| {
                let mut tables: Vec<String> = live
                    .sinks
                    .values()
                    .flat_map(|s| s.tables.keys().cloned())
                    .collect();
                tables.sort();
                tables.dedup();
                tables
            })
            .unwrap_or_default();
        slot.metrics.forget(&sinks, &tables);
        if origin == Origin::Api {
            let file = slot.tenant.pipelines_dir.join(format!("{name}.yaml"));
            let _ = std::fs::remove_file(file);
        }
        tracing::info!(pipeline = %slot.id(), "deleted");
        // Its file and its sinks no longer keep the uploads they named.
        self.prune_uploads(&slot.tenant);
        Ok(())
    }

    /// Replaces `sink`'s plugin of `tenant/name` with `wasm`, at the next
    /// commit boundary. The new version is loaded, checked, instantiated
    /// and opened beside the old one first; if any of that fails, the old
    /// one runs on and the refusal says why.
    pub fn replace(
        &self,
        caller: &Caller,
        tenant: &str,
        name: &str,
        sink: &str,
        wasm: &[u8],
        pin: Option<&str>,
    ) -> Result<Swapped, Refusal> {
        let slot = self.slot(caller, tenant, name)?;
        let sha256 = hex::encode(Sha256::digest(wasm));
        if let Some(pin) = pin
            && !pin.eq_ignore_ascii_case(&sha256)
        {
            return Err(self.refused(
                &slot,
                sink,
                &sha256,
                format!("the plugin's sha256 is {sha256}, not the {pin} it was pinned to"),
            ));
        }
        let tenant = slot.tenant.clone();
        let (path, _) = self.keep_upload(&tenant, &sha256, wasm, Keep::UnderWay)?;
        let swapped = self.swap_to(&slot, sink, path, sha256.clone(), "swapped");
        {
            let under_way = &mut tenant.uploads().under_way;
            if let Some(count) = under_way.get_mut(&sha256) {
                *count -= 1;
                if *count == 0 {
                    under_way.remove(&sha256);
                }
            }
        }
        // A refused upload goes (unless a sink runs it, or may roll back
        // to it); a swap may have left a version no sink can roll back to.
        self.prune_uploads(&tenant);
        swapped
    }

    /// Keeps a plugin uploaded on its own (`PUT /v1/tenants/{tenant}/
    /// plugins/{sha256}`), for pipeline files to name as `sha256:<digest>`.
    /// The body must have the digest its path names. Uploading the same
    /// bytes again is no error: it holds them for longer. An upload no
    /// pipeline file names is held for the host's `admin.upload_hold_ms`.
    pub fn upload_plugin(
        &self,
        caller: &Caller,
        tenant_name: &str,
        named: &str,
        wasm: &[u8],
    ) -> Result<Uploaded, Refusal> {
        let tenant = self.tenant(caller, tenant_name)?;
        let route = format!("PUT /v1/tenants/{tenant_name}/plugins/{named}");
        if !plugin_ref::is_digest(named) {
            return Err(Refusal::Invalid(format!(
                "{route}: `{named}` is not a sha256 digest (64 hex digits, as `weir plugin \
                 inspect` prints)"
            )));
        }
        let named = named.to_ascii_lowercase();
        let sha256 = hex::encode(Sha256::digest(wasm));
        if sha256 != named {
            return Err(Refusal::Invalid(format!(
                "{route}: the body's sha256 is {sha256}, not the {named} the path names (a \
                 changed or truncated upload); nothing was kept"
            )));
        }
        if !wasm.starts_with(WASM_MAGIC) {
            return Err(Refusal::Invalid(format!(
                "{route}: the body ({} bytes) is not WebAssembly (it does not start with \
                 `\\0asm`); nothing was kept",
                wasm.len()
            )));
        }
        let until = SystemTime::now() + self.host.admin.upload_hold();
        let (_, new) = self.keep_upload(&tenant, &sha256, wasm, Keep::HeldUntil(until))?;
        // In a cluster, every host that runs a pipeline naming it finds it.
        if let Some(store) = &self.context.plugin_store {
            store.put(&tenant.name, &sha256, wasm.to_vec()).map_err(|e| {
                Refusal::Conflict(format!(
                    "{route}: kept on this host, but not in the cluster's plugin store, so other \
                     hosts cannot load it ({e}); upload it again"
                ))
            })?;
        }
        tracing::info!(tenant = %tenant.name, %sha256, bytes = wasm.len(), new, "plugin uploaded");
        // A good moment to give back what holds have run out on.
        self.prune_uploads(&tenant);
        Ok(Uploaded {
            sha256,
            size: wasm.len() as u64,
            new,
        })
    }

    /// In a cluster with a plugin store: takes each upload `text` names
    /// that this host does not hold from the store (where the host it was
    /// uploaded to put it), so the pipeline loads here too. What cannot be
    /// taken is said in the log; admission then names the missing upload.
    fn fetch_uploads(&self, tenant: &Tenant, text: &str) {
        let Some(store) = &self.context.plugin_store else {
            return;
        };
        for sha256 in uploads_named(text) {
            if tenant
                .uploads_dir()
                .join(format!("{sha256}.wasm"))
                .is_file()
            {
                continue;
            }
            let fetched = match store.get(&tenant.name, &sha256) {
                Ok(Some(wasm)) => {
                    let until = SystemTime::now() + self.host.admin.upload_hold();
                    self.keep_upload(tenant, &sha256, &wasm, Keep::HeldUntil(until))
                        .map(|_| ())
                        .map_err(|refused| refused.to_string())
                }
                Ok(None) => Err("the plugin store does not hold it".to_string()),
                Err(e) => Err(e),
            };
            match fetched {
                Ok(()) => tracing::info!(
                    tenant = %tenant.name, %sha256,
                    "uploaded plugin taken from the cluster's plugin store"
                ),
                Err(e) => tracing::warn!(
                    tenant = %tenant.name, %sha256,
                    "cannot take the uploaded plugin from the cluster's plugin store: {e}"
                ),
            }
        }
    }

    /// Writes an upload into the tenant's uploads, counted against its
    /// storage quota, and notes why pruning keeps it; true when it was not
    /// kept already.
    fn keep_upload(
        &self,
        tenant: &Tenant,
        sha256: &str,
        wasm: &[u8],
        keep: Keep,
    ) -> Result<(PathBuf, bool), Refusal> {
        let path = tenant.uploads_dir().join(format!("{sha256}.wasm"));
        let mut uploads = tenant.uploads();
        // The same digest already kept is the same bytes: nothing to add.
        let kept = std::fs::metadata(&path).is_ok_and(|m| m.len() == wasm.len() as u64);
        if !kept {
            let bytes = wasm.len() as u64;
            if let Err(total) = tenant.share.claim_storage(bytes) {
                return Err(Refusal::Conflict(format!(
                    "the plugin ({}) would bring tenant `{}`'s stored bytes (its uploads and its \
                     sinks' blob stores) to {}, over its quota of {} ({})",
                    mib(bytes),
                    tenant.name,
                    mib(total),
                    mib(tenant.share.max_stored_bytes),
                    tenant.share.config_key("max_stored_mb")
                )));
            }
            if let Err(e) = write_atomically(&path, wasm) {
                tenant.share.release_storage(bytes);
                return Err(Refusal::Conflict(e));
            }
        }
        match keep {
            Keep::UnderWay => *uploads.under_way.entry(sha256.to_string()).or_default() += 1,
            Keep::HeldUntil(until) => {
                if kept {
                    // After a restart the hold is read back from the file's
                    // last change (tenant.rs).
                    let touched = std::fs::File::options()
                        .write(true)
                        .open(&path)
                        .and_then(|file| file.set_modified(SystemTime::now()));
                    if let Err(e) = touched {
                        tracing::warn!(tenant = %tenant.name, %sha256, "cannot touch the upload again; after a restart its hold counts from its first upload: {e}");
                    }
                }
                uploads.held_until.insert(sha256.to_string(), until);
            }
        }
        Ok((path, !kept))
    }

    /// Removes the tenant's uploads that no sink runs or may roll back to,
    /// that none of its pipeline files names (`sha256:<digest>`), that no
    /// upload under way uses and that are not held for an apply, giving
    /// their bytes back to its quota. A pipeline whose file is in the
    /// watched folder but that is not loaded now (its file refused, say)
    /// keeps the versions it saved. When a pipeline file cannot be read,
    /// nothing is removed.
    pub fn prune_uploads(&self, tenant: &Tenant) {
        let mut uploads = tenant.uploads();
        let now = SystemTime::now();
        uploads.held_until.retain(|_, until| *until > now);
        let named = match uploads_named_by_files(&tenant.pipelines_dir) {
            Ok(named) => named,
            Err(e) => {
                tracing::warn!(tenant = %tenant.name, "uploaded plugins are not pruned now: {e}");
                return;
            }
        };
        let mut kept: Vec<PathBuf> = Vec::new();
        let mut keep = |version: &PluginVersion| {
            kept.push(version.path.clone());
            if let Some((previous, _)) = &version.previous {
                kept.push(previous.clone());
            }
        };
        let loaded: Vec<Arc<Slot>> = self
            .slots()
            .into_iter()
            .filter(|s| s.tenant.name == tenant.name)
            .collect();
        for slot in &loaded {
            slot.plugins().values().for_each(&mut keep);
        }
        let saved = std::fs::read_dir(tenant.state_dir.join("pipelines"))
            .into_iter()
            .flatten()
            .flatten();
        for pipeline in saved {
            let name = pipeline.file_name().to_string_lossy().into_owned();
            let deployed = tenant.pipelines_dir.join(format!("{name}.yaml")).exists()
                || tenant.pipelines_dir.join(format!("{name}.yml")).exists();
            if !deployed || loaded.iter().any(|s| s.name == name) {
                continue;
            }
            let versions = std::fs::read(pipeline.path().join("plugins.json"))
                .ok()
                .and_then(|json| {
                    serde_json::from_slice::<BTreeMap<String, PluginVersion>>(&json).ok()
                });
            versions.iter().flat_map(|v| v.values()).for_each(&mut keep);
        }
        let folder = tenant.uploads_dir();
        let Ok(entries) = std::fs::read_dir(&folder) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(sha256) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".wasm"))
            else {
                continue;
            };
            if kept.contains(&path)
                || named.contains(sha256)
                || uploads.under_way.contains_key(sha256)
                || uploads.held_until.contains_key(sha256)
            {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_file() && std::fs::remove_file(&path).is_ok() {
                tenant.share.release_storage(meta.len());
                tracing::info!(tenant = %tenant.name, %sha256, "uploaded plugin removed: no sink runs it or may roll back to it, and no pipeline file names it");
            }
        }
    }

    /// Swaps `sink` back to the version it ran before.
    pub fn rollback(
        &self,
        caller: &Caller,
        tenant: &str,
        name: &str,
        sink: &str,
    ) -> Result<Swapped, Refusal> {
        let slot = self.slot(caller, tenant, name)?;
        let current = slot.plugin(sink).ok_or_else(|| {
            Refusal::NotFound(format!("pipeline `{}` has no sink `{sink}`", slot.id()))
        })?;
        let Some((path, sha256)) = current.previous else {
            return Err(Refusal::Conflict(format!(
                "sink `{sink}` has no previous version to roll back to"
            )));
        };
        let parked = matches!(slot.state().0, State::Parked | State::Backoff);
        let mut swapped = self.swap_to(&slot, sink, path, sha256, "rolled_back");
        self.prune_uploads(&slot.tenant);
        // A pipeline parked (or backing off) after a swap is most often
        // parked by the version swapped in: rolled back, it runs again with
        // the one before, its failures forgotten. The reply says so.
        if parked && let Ok(rolled) = &mut swapped {
            slot.start();
            rolled.restarted = true;
            tracing::info!(pipeline = %slot.id(), sink, "rolled back while parked: the pipeline starts again");
        }
        swapped
    }

    /// Swaps `sink` to the plugin file it names in the pipeline file, whose
    /// content changed (the watcher saw it).
    pub fn reload_from_file(
        &self,
        slot: &Arc<Slot>,
        sink: &str,
        path: PathBuf,
        sha256: String,
    ) -> Result<Swapped, Refusal> {
        let swapped = self.swap_to(slot, sink, path, sha256, "swapped");
        self.prune_uploads(&slot.tenant);
        swapped
    }

    fn swap_to(
        &self,
        slot: &Arc<Slot>,
        sink: &str,
        path: PathBuf,
        sha256: String,
        outcome: &'static str,
    ) -> Result<Swapped, Refusal> {
        let _one_at_a_time = slot.swapping.try_lock().map_err(|_| {
            Refusal::Conflict(format!(
                "a plugin swap of `{}` is already under way; try again when it is answered",
                slot.id()
            ))
        })?;
        let config = slot.config();
        let Some(sink_config) = config.sinks.iter().find(|s| s.name == sink).cloned() else {
            return Err(Refusal::NotFound(format!(
                "pipeline `{}` has no sink `{sink}`",
                slot.id()
            )));
        };
        if let Some(pinned) = &sink_config.sha256
            && !pinned.eq_ignore_ascii_case(&sha256)
        {
            return Err(self.refused(slot, sink, &sha256, format!(
                "sink `{sink}` is pinned to sha256 {pinned} in the pipeline file; change the pin \
                 there to run another version"
            )));
        }
        let current = slot.plugin(sink);
        if current.as_ref().is_some_and(|c| c.sha256 == sha256) {
            return Err(Refusal::Conflict(format!(
                "sink `{sink}` already runs {sha256}"
            )));
        }
        let version = PluginVersion {
            path: path.clone(),
            sha256: sha256.clone(),
            previous: current.as_ref().map(|c| (c.path.clone(), c.sha256.clone())),
            swaps: current.as_ref().map_or(0, |c| c.swaps) + 1,
            file_sha256: current
                .as_ref()
                .map(|c| c.file_sha256.clone())
                .unwrap_or_default(),
        };
        let previous_sha256 = current.map(|c| c.sha256);
        let factory = SinkFactory::new(
            &self.context.engine,
            &self.context.io,
            slot.metrics.clone(),
            Some(slot.tenant.share.clone()),
        )
        .map_err(|e| Refusal::Plugin(e.to_string()))?;
        let control = slot.control().filter(|c| !c.stopping());
        let Some(control) = control else {
            // Not running: check that it loads, and take it at the next start.
            let grants = sink_config.grants.parse().map_err(Refusal::Invalid)?;
            let linker =
                plugin::linker(&self.context.engine).map_err(|e| Refusal::Plugin(e.to_string()))?;
            Plugin::load(
                &self.context.engine,
                &linker,
                &path,
                Some(&sha256),
                &sink_config.limits.compile_limits(),
                &grants,
            )
            .map_err(|e| self.refused(slot, sink, &sha256, e.to_string()))?;
            return Ok(take_at_next_start(
                slot,
                sink,
                version,
                outcome,
                previous_sha256,
            ));
        };
        let worker = factory
            .start(&config, &sink_config, &path, Some(&sha256))
            .map_err(|e| self.refused(slot, sink, &sha256, e))?;
        let (reply, answer) = channel();
        control.request_swap(SwapRequest {
            sink: sink.to_string(),
            worker,
            reply,
        });
        let done = match answer.recv_timeout(SWAP_WAIT) {
            Ok(Ok(done)) => done,
            // It loaded, instantiated and opened; the run ended first.
            Ok(Err(e)) if e == RUN_ENDED => {
                return Ok(take_at_next_start(
                    slot,
                    sink,
                    version,
                    outcome,
                    previous_sha256,
                ));
            }
            Ok(Err(e)) => return Err(self.refused(slot, sink, &sha256, e)),
            Err(_) => {
                let why = format!(
                    "the pipeline reached no commit boundary within {} s",
                    SWAP_WAIT.as_secs()
                );
                return Err(self.refused(slot, sink, &sha256, why));
            }
        };
        slot.set_plugin(
            sink,
            version,
            record(
                sink,
                outcome,
                &sha256,
                Some(done.pause_ms),
                done.at.clone(),
                None,
            ),
        );
        save_versions(slot);
        // Every outcome is counted here, once: `swapped` or `rolled_back`
        // as it landed, `refused` in `refused`.
        slot.metrics.swap(sink, outcome);
        Ok(Swapped {
            sink: sink.to_string(),
            sha256,
            previous_sha256,
            pause_ms: Some(done.pause_ms),
            at: done.at,
            restarted: false,
        })
    }

    /// Records a refused swap and makes the refusal.
    fn refused(&self, slot: &Slot, sink: &str, sha256: &str, reason: String) -> Refusal {
        let reason = format!("sink `{sink}`: {}", slot.tenant.explain(reason));
        tracing::warn!(pipeline = %slot.id(), sink, "plugin {sha256} refused: {reason}");
        slot.metrics.swap(sink, "refused");
        slot.record_swap(record(
            sink,
            "refused",
            sha256,
            None,
            None,
            Some(reason.clone()),
        ));
        Refusal::Plugin(reason)
    }

    /// Asks every pipeline to stop at a commit boundary and waits for all
    /// of them, at most `grace`. False when one did not end in time.
    pub fn stop_all(&self, grace: Duration) -> bool {
        let slots = self.slots();
        for slot in &slots {
            slot.delete();
        }
        let deadline = std::time::Instant::now() + grace;
        slots.iter().all(|slot| {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            slot.wait_ended(left)
        })
    }
}

/// What every WebAssembly binary starts with.
const WASM_MAGIC: &[u8] = b"\0asm";

/// Why an upload is kept while no sink runs it.
enum Keep {
    /// A swap to it is under way.
    UnderWay,
    /// It was uploaded on its own, for an apply to name.
    HeldUntil(SystemTime),
}

/// The digests of the uploads the pipeline files in `folder` name as
/// `sha256:<digest>`. The whole text is searched, comments too: a name
/// that only looks like a reference keeps an upload longer, never
/// shorter. An error when the folder or one of its files cannot be read.
fn uploads_named_by_files(folder: &Path) -> Result<BTreeSet<String>, String> {
    let mut named = BTreeSet::new();
    let files = watch::pipeline_files(folder)
        .map_err(|e| format!("cannot list {}: {e}", folder.display()))?;
    for (file, _) in files {
        let text = match watch::read_pipeline_file(&file) {
            Ok(text) => text,
            // Too large or not text: the host does not run it either.
            Err(watch::Unread::Refused(_)) => continue,
            Err(watch::Unread::Failed(e)) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(watch::Unread::Failed(e)) => {
                return Err(format!("cannot read {}: {e}", file.display()));
            }
        };
        named.extend(uploads_named(&text));
    }
    Ok(named)
}

/// Every `sha256:<64 hex digits>` in `text`, the digest in lower case.
fn uploads_named(text: &str) -> impl Iterator<Item = String> + '_ {
    text.match_indices(plugin_ref::PREFIX)
        .filter_map(|(at, prefix)| {
            let start = at + prefix.len();
            let digest = text.get(start..start + 64)?;
            plugin_ref::is_digest(digest).then(|| digest.to_ascii_lowercase())
        })
}

/// Makes `version` the one `sink` runs from its pipeline's next start (the
/// pipeline is not running now).
fn take_at_next_start(
    slot: &Slot,
    sink: &str,
    version: PluginVersion,
    outcome: &'static str,
    previous_sha256: Option<String>,
) -> Swapped {
    let sha256 = version.sha256.clone();
    slot.set_plugin(
        sink,
        version,
        record(sink, outcome, &sha256, None, None, None),
    );
    save_versions(slot);
    slot.metrics.swap(sink, outcome);
    Swapped {
        sink: sink.to_string(),
        sha256,
        previous_sha256,
        pause_ms: None,
        at: None,
        restarted: false,
    }
}

fn record(
    sink: &str,
    outcome: &'static str,
    sha256: &str,
    pause_ms: Option<f64>,
    at: Option<String>,
    reason: Option<String>,
) -> SwapRecord {
    SwapRecord {
        sink: sink.to_string(),
        outcome: Cow::Borrowed(outcome),
        sha256: sha256.to_string(),
        pause_ms,
        at,
        reason,
    }
}

/// Where the plugin versions a pipeline's sinks run are kept across
/// restarts of the host.
fn versions_file(config: &weir_pipeline::config::PipelineConfig) -> PathBuf {
    config.state_dir.join("plugins.json")
}

/// Records which plugin version each sink runs, so a version swapped in
/// through the API is still the one run after the host restarts.
fn save_versions(slot: &Slot) {
    save_plugin_versions(&slot.id(), &slot.config(), &slot.plugins());
}

/// Records `plugins` as the versions pipeline `id` (defined by `config`)
/// runs; a failure to is logged, and the host then starts from the
/// pipeline file's plugins after a restart.
pub(crate) fn save_plugin_versions(
    id: &str,
    config: &weir_pipeline::config::PipelineConfig,
    plugins: &BTreeMap<String, PluginVersion>,
) {
    let file = versions_file(config);
    let saved = serde_json::to_vec_pretty(plugins)
        .map_err(|e| e.to_string())
        .and_then(|json| write_atomically(&file, &json));
    if let Err(e) = saved {
        tracing::warn!(pipeline = %id, "cannot record the plugin versions: {e}");
    }
}

/// Takes the saved version of each sink whose pipeline file still names
/// the plugin it named when that version was swapped in (and whose file is
/// still there).
fn keep_saved_versions(
    config: &weir_pipeline::config::PipelineConfig,
    plugins: &mut BTreeMap<String, PluginVersion>,
) {
    let Ok(json) = std::fs::read(versions_file(config)) else {
        return;
    };
    let Ok(saved) = serde_json::from_slice::<BTreeMap<String, PluginVersion>>(&json) else {
        tracing::warn!(pipeline = %config.pipeline, "the saved plugin versions cannot be read; the pipeline file's are run");
        return;
    };
    for (sink, version) in saved {
        let Some(from_file) = plugins.get_mut(&sink) else {
            continue;
        };
        let pinned = config
            .sinks
            .iter()
            .any(|s| s.name == sink && s.sha256.is_some());
        let still_there = file_digest(&version.path).is_ok_and(|d| d == version.sha256);
        if version.file_sha256 == from_file.sha256 && still_there && !pinned {
            *from_file = version;
        }
    }
}

/// The plugin each sink names in its definition, with its digest.
pub fn file_versions(
    config: &weir_pipeline::config::PipelineConfig,
) -> Result<BTreeMap<String, PluginVersion>, String> {
    let mut versions = BTreeMap::new();
    for sink in &config.sinks {
        let sha256 = file_digest(&sink.plugin).map_err(|e| {
            format!(
                "sink `{}`: plugin {}: {e}",
                sink.name,
                sink.plugin.display()
            )
        })?;
        if let Some(pin) = &sink.sha256
            && !pin.eq_ignore_ascii_case(&sha256)
        {
            return Err(format!(
                "sink `{}`: plugin {} has sha256 {sha256}, not the {pin} it is pinned to",
                sink.name,
                sink.plugin.display()
            ));
        }
        versions.insert(
            sink.name.clone(),
            PluginVersion {
                path: sink.plugin.clone(),
                file_sha256: sha256.clone(),
                sha256,
                previous: None,
                swaps: 0,
            },
        );
    }
    Ok(versions)
}

pub fn file_digest(path: &Path) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// Writes beside the target and renames over it, so a reader sees the old
/// file or the new one, never half of it.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let folder = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(folder)
        .map_err(|e| format!("cannot make {}: {e}", folder.display()))?;
    let temporary = folder.join(format!(
        ".{}.partial",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    std::fs::write(&temporary, bytes)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| {
            // A half-written file is not left behind.
            let _ = std::fs::remove_file(&temporary);
            format!("cannot write {}: {e}", path.display())
        })
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uploads_a_file_names_are_every_full_reference_in_it() {
        let one = "ab".repeat(32);
        let two = "CD".repeat(32);
        let text = format!(
            "sinks:\n  - plugin: sha256:{one}\n    sha256: {one}\n  - plugin: \"sha256:{two}\" # \
             sha256:{}\n  - plugin: sha256:{}\n",
            "e".repeat(63),
            "f".repeat(63)
        );
        let named: Vec<String> = uploads_named(&text).collect();
        assert_eq!(named, [one, two.to_ascii_lowercase()]);
    }
}
