//! The cluster's plugin store (`cluster.plugin_store`): plugins' bytes by
//! tenant and digest, `<tenant>/<sha256>.wasm`, in a folder every host
//! mounts or on object storage, opened as a blob root. The mirror keeps the
//! plugins of the pipelines folders there; a plugin uploaded through the
//! API is kept there too, so a pipeline file naming it as `sha256:<digest>`
//! loads on whichever host the pipeline runs.

use sha2::{Digest, Sha256};
use weir_runtime::capability::blobstore::{BlobError, BlobLimits, BlobScope};

use crate::host_file::{HostConfig, local_folder};

/// The largest plugin kept.
pub const MAX_PLUGIN: u64 = 512 << 20;

pub struct PluginStore {
    root: BlobScope,
}

impl PluginStore {
    /// The host file's plugin store (a folder, relative to the host file's,
    /// or object storage by URL with its options, `${VAR}` read from this
    /// host's environment); None without one.
    pub fn open(
        host: &HostConfig,
        io: &tokio::runtime::Handle,
    ) -> Result<Option<PluginStore>, String> {
        let Some(cluster) = &host.cluster else {
            return Ok(None);
        };
        let Some(store) = &cluster.plugin_store else {
            return Ok(None);
        };
        let at = |what: &str, e: &dyn std::fmt::Display| {
            format!("{}: cluster.{what}: {e}", host.file.display())
        };
        let env = |name: &str| std::env::var(name).ok();
        let mut options = Vec::new();
        for (key, value) in &cluster.plugin_store_options {
            let value = weir_pipeline::config::interpolate(value, &env)
                .map_err(|e| at(&format!("plugin_store_options.{key}"), &e))?;
            options.push((key.clone(), value));
        }
        let url = match local_folder(store) {
            Some(folder) => host.resolve(&folder).display().to_string(),
            None => store.clone(),
        };
        let root = BlobScope::open(&url, &options, &host.base_dir, io.clone())
            .map_err(|e| at("plugin_store", &e))?;
        // A plugin as large as any kept, and no quota: what the store holds
        // is the operator's, not a tenant's.
        let limits = BlobLimits {
            sink: "cluster.plugin_store".into(),
            max_stored_bytes: u64::MAX,
            max_put_bytes: MAX_PLUGIN,
            max_read_bytes: MAX_PLUGIN,
            max_list_entries: BlobLimits::DEFAULT_MAX_LIST_ENTRIES,
        };
        Ok(Some(PluginStore {
            root: root.with_limits(limits),
        }))
    }

    fn path(tenant: &str, sha256: &str) -> String {
        format!("{tenant}/{sha256}.wasm")
    }

    /// Keeps a plugin's bytes unless they are there already (the name is
    /// their digest: what is there is the same).
    pub fn put(&self, tenant: &str, sha256: &str, bytes: Vec<u8>) -> Result<(), String> {
        let path = PluginStore::path(tenant, sha256);
        let listed = self
            .root
            .list(&path)
            .map_err(|e| format!("looking for {path} in the plugin store: {e}"))?;
        if listed.iter().any(|object| object.path == path) {
            return Ok(());
        }
        self.root
            .put(&path, bytes)
            .map_err(|e| format!("writing {path} to the plugin store: {e}"))
    }

    /// A plugin's bytes, checked against their digest; None when the store
    /// does not hold it.
    pub fn get(&self, tenant: &str, sha256: &str) -> Result<Option<Vec<u8>>, String> {
        let path = PluginStore::path(tenant, sha256);
        let bytes = match self.root.get(&path) {
            Ok(bytes) => bytes,
            Err(BlobError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(format!("reading {path} from the plugin store: {e}")),
        };
        if hex::encode(Sha256::digest(&bytes)) != sha256 {
            return Err(format!(
                "{path} in the plugin store does not have the digest it is named by"
            ));
        }
        Ok(Some(bytes))
    }
}
