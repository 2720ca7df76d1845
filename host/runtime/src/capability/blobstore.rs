//! The blob store capability: object storage confined to the one root the
//! operator granted a sink: a local folder (the file system, directly), or
//! memory or S3 and friends by URL (`object_store`). Each instance of a sink gets the sink's
//! [`BlobScope`]; the contract's `blobstore` interface calls it.

use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{GetOptions, GetRange, ObjectStore, PutMode, PutOptions, PutPayload};
use tokio::runtime::Handle;
use weir_contract::blob_path::{self, TEMP_MARKER};

use super::blob_faults::{BlobFaults, FaultKind};
pub use super::blob_walk::ObjectMeta;
use super::blob_walk::{self, WalkError};
use super::{Capability, Grants, Provides};
use crate::guest_error::for_guest;
use crate::tenant::TenantShare;

/// Why a blob call failed; mirrors the WIT `blob-error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    /// No object at that path.
    #[error("not found: {0}")]
    NotFound(String),
    /// `put_if_absent` found an object there.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The path is malformed or leads out of the root.
    #[error("denied: {0}")]
    Denied(String),
    /// The store failed.
    #[error("store failed: {0}")]
    Io(String),
    /// A crash a test host injected ([`BlobFaults`]): never an answer to
    /// the sink, whose call traps instead.
    #[error("{0}")]
    Crash(String),
}

/// What one sink may make the host store or hold through its blob store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobLimits {
    /// The sink's name, so the host's own report of a refusal names it.
    pub sink: String,
    /// The most bytes the root may hold (`limits.max_stored_mb`).
    pub max_stored_bytes: u64,
    /// The largest single put (`limits.max_object_mb`).
    pub max_put_bytes: u64,
    /// The largest single get or ranged get (`limits.max_object_mb`, and
    /// at most `limits.memory_mb`: the sink could not hold more).
    pub max_read_bytes: u64,
    /// The most entries one list returns (`limits.max_list_entries`).
    pub max_list_entries: usize,
}

impl BlobLimits {
    /// The quota of a folder or object-store root when none is set.
    pub const DEFAULT_MAX_STORED_BYTES: u64 = 10 << 30;
    /// The quota of a `memory://` root when none is set: it is the host's RAM.
    pub const DEFAULT_MAX_STORED_BYTES_MEMORY: u64 = 256 << 20;
    /// The largest single put or get when none is set.
    pub const DEFAULT_MAX_OBJECT_BYTES: u64 = 256 << 20;
    /// The most entries one list returns when none is set.
    pub const DEFAULT_MAX_LIST_ENTRIES: usize = 100_000;

    /// The quota of a root at `url` when the operator set none.
    pub fn default_max_stored_bytes(url: &str) -> u64 {
        match url.starts_with("memory:") {
            true => Self::DEFAULT_MAX_STORED_BYTES_MEMORY,
            false => Self::DEFAULT_MAX_STORED_BYTES,
        }
    }

    /// The defaults, for a root at `url`.
    pub fn defaults(url: &str) -> Self {
        BlobLimits {
            sink: String::new(),
            max_stored_bytes: Self::default_max_stored_bytes(url),
            max_put_bytes: Self::DEFAULT_MAX_OBJECT_BYTES,
            max_read_bytes: Self::DEFAULT_MAX_OBJECT_BYTES,
            max_list_entries: Self::DEFAULT_MAX_LIST_ENTRIES,
        }
    }
}

/// Where a root's objects are.
enum Backend {
    /// A folder, by its canonical path (also to refuse links leading out),
    /// read and written with the file system on the calling thread:
    /// object_store's local backend hands every call to the runtime's
    /// blocking pool, two hand-overs between threads each, and a sink
    /// reading its table's metadata at every commit makes hundreds (a
    /// fifth of the Iceberg sink's time as a component: `iceberg_overhead`
    /// 1.40x its native time through object_store, 1.14x without); it also
    /// renames without fsync.
    Local(PathBuf),
    /// Memory, or any store object_store knows by URL.
    Store(Arc<dyn ObjectStore>),
}

/// One sink's view of storage: every path is relative to the granted root.
pub struct BlobScope {
    backend: Backend,
    description: String,
    runtime: Handle,
    limits: BlobLimits,
    /// The bytes the root holds, counted at the first write and kept up to
    /// date by every put and delete; the lock also orders them.
    stored: Mutex<Option<u64>>,
    /// Whether the host already reported a refused write (once is enough:
    /// a sink may retry forever).
    reported: std::sync::atomic::AtomicBool,
    /// The tenant whose quota bounds this root with its other sinks' roots
    /// (`weir serve`).
    tenant: Option<Arc<TenantShare>>,
    /// Faults a test host arms (`weir plugin test`); none in a pipeline.
    faults: Option<Arc<BlobFaults>>,
}

/// Why a granted root cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("blob store `{url}`: {detail}")]
pub struct ScopeError {
    /// The root as the operator wrote it.
    pub url: String,
    /// What went wrong.
    pub detail: String,
}

impl BlobScope {
    /// Opens the root an operator granted: `memory://`, a folder path or
    /// `file://` URL (created if missing), or any URL `object_store` knows
    /// (`s3://bucket/prefix`, with `options` such as `aws_region`).
    pub fn open(
        url: &str,
        options: &[(String, String)],
        base_dir: &FsPath,
        runtime: Handle,
    ) -> Result<Self, ScopeError> {
        let fail = |detail: String| ScopeError {
            url: url.to_string(),
            detail,
        };
        let scope = |backend, description| BlobScope {
            backend,
            description,
            runtime: runtime.clone(),
            limits: BlobLimits::defaults(url),
            stored: Mutex::new(None),
            reported: Default::default(),
            tenant: None,
            faults: None,
        };
        if url == "memory://" || url == "memory:" {
            let store = Backend::Store(Arc::new(InMemory::new()));
            return Ok(scope(store, "memory://".into()));
        }
        let local = match url.strip_prefix("file://") {
            Some(rest) => Some(PathBuf::from(rest)),
            None if !url.contains("://") => Some(PathBuf::from(url)),
            None => None,
        };
        if let Some(path) = local {
            let path = if path.is_absolute() {
                path
            } else {
                base_dir.join(path)
            };
            std::fs::create_dir_all(&path)
                .map_err(|e| fail(format!("cannot create folder {}: {e}", path.display())))?;
            let root = path
                .canonicalize()
                .map_err(|e| fail(format!("cannot resolve {}: {e}", path.display())))?;
            let description = root.display().to_string();
            return Ok(scope(Backend::Local(root), description));
        }
        let parsed = url::Url::parse(url).map_err(|e| fail(format!("not a URL: {e}")))?;
        let (store, prefix) = object_store::parse_url_opts(&parsed, options.iter().cloned())
            .map_err(|e| fail(e.to_string()))?;
        let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
            Arc::from(store)
        } else {
            Arc::new(PrefixStore::new(store, prefix))
        };
        Ok(scope(Backend::Store(store), url.to_string()))
    }

    /// Replaces the default limits with the operator's.
    pub fn with_limits(mut self, limits: BlobLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Makes every write also count against `share`'s quota, which the
    /// tenant's other sinks' roots share; the root's own quota still holds.
    pub fn with_tenant(mut self, share: Arc<TenantShare>) -> Self {
        self.tenant = Some(share);
        self
    }

    /// Lets `faults` fail this root's writes when armed.
    pub fn with_faults(mut self, faults: Arc<BlobFaults>) -> Self {
        self.faults = Some(faults);
        self
    }

    /// The armed fault, if this write is the one it was armed for.
    fn injected_fault(&self, path: &str) -> Result<(), BlobError> {
        match self.faults.as_ref().and_then(|f| f.before_write(path)) {
            None => Ok(()),
            Some(fired) => Err(match fired.kind {
                FaultKind::TransientIo => BlobError::Io(fired.message),
                FaultKind::Crash => BlobError::Crash(fired.message),
            }),
        }
    }

    /// The root, as an operator recognises it in a message.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// Reads a whole object.
    pub fn get(&self, path: &str) -> Result<Vec<u8>, BlobError> {
        self.get_range(path, 0, u64::MAX)
    }

    /// Reads up to `length` bytes from `offset`; fewer at the object's end.
    pub fn get_range(&self, path: &str, offset: u64, length: u64) -> Result<Vec<u8>, BlobError> {
        let location = self.check(path)?;
        let store = match &self.backend {
            Backend::Local(root) => return self.read_local(root, path, offset, length),
            Backend::Store(store) => store,
        };
        self.block(async {
            let size = store.head(&location).await?.size;
            let (start, end) = match self.read_span(path, offset, length, size) {
                Ok(Some(span)) => span,
                Ok(None) => return Ok(Ok(Vec::new())),
                Err(refused) => return Ok(Err(refused)),
            };
            let options = GetOptions {
                range: Some(GetRange::Bounded(start..end)),
                ..Default::default()
            };
            let result = store.get_opts(&location, options).await?;
            Ok(Ok(result.bytes().await?.to_vec()))
        })
        .map_err(|e| self.map_error(path, e))?
    }

    /// A read of a local root: a folder is not an object.
    fn read_local(
        &self,
        root: &FsPath,
        path: &str,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, BlobError> {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let io = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound => BlobError::NotFound(path.to_string()),
            _ => BlobError::Io(format!("{path}: {}", for_guest(&e))),
        };
        let mut file = std::fs::File::open(root.join(path)).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(BlobError::NotFound(path.to_string()));
        }
        let Some((start, end)) = self.read_span(path, offset, length, meta.len())? else {
            return Ok(Vec::new());
        };
        file.seek(SeekFrom::Start(start)).map_err(io)?;
        let mut bytes = vec![0; (end - start) as usize];
        file.read_exact(&mut bytes).map_err(io)?;
        Ok(bytes)
    }

    /// The bytes a read of `length` from `offset` takes of an object of
    /// `size`, as `(start, end)`; none past its end; refused over the
    /// largest read.
    fn read_span(
        &self,
        path: &str,
        offset: u64,
        length: u64,
        size: u64,
    ) -> Result<Option<(u64, u64)>, BlobError> {
        let start = offset.min(size);
        let end = offset.saturating_add(length).min(size);
        if start == end {
            return Ok(None);
        }
        if end - start > self.limits.max_read_bytes {
            return Err(self.refuse(format!(
                "reading {} of `{path}` is over the largest read of {} \
                 (limits.max_object_mb, and at most limits.memory_mb)",
                mib(end - start),
                mib(self.limits.max_read_bytes)
            )));
        }
        Ok(Some((start, end)))
    }

    /// Writes an object atomically, replacing any object at `path`.
    pub fn put(&self, path: &str, data: Vec<u8>) -> Result<(), BlobError> {
        self.put_with(path, data, PutMode::Overwrite)
    }

    /// Writes an object atomically, only if none is at `path`.
    pub fn put_if_absent(&self, path: &str, data: Vec<u8>) -> Result<(), BlobError> {
        self.put_with(path, data, PutMode::Create)
    }

    fn put_with(&self, path: &str, data: Vec<u8>, mode: PutMode) -> Result<(), BlobError> {
        let location = self.check(path)?;
        self.injected_fault(path)?;
        let size = data.len() as u64;
        if size > self.limits.max_put_bytes {
            return Err(self.refuse(format!(
                "put of {} to `{path}` is over the largest object of {} (limits.max_object_mb)",
                mib(size),
                mib(self.limits.max_put_bytes)
            )));
        }
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        let before = self.stored_bytes(&mut stored)?;
        let replaced = self.size_of(path, &location)?;
        let after = before.saturating_sub(replaced).saturating_add(size);
        if after > self.limits.max_stored_bytes && size > replaced {
            return Err(self.refuse(format!(
                "put of {} to `{path}` would bring the root to {}, over its quota of {} \
                 (limits.max_stored_mb)",
                mib(size),
                mib(after),
                mib(self.limits.max_stored_bytes)
            )));
        }
        let grows = size.saturating_sub(replaced);
        let tenant = self.tenant.as_deref();
        // Claimed before the write, so sinks writing at once cannot pass
        // the tenant's quota together; given back if the write fails.
        if let Some(tenant) = tenant
            && grows > 0
            && let Err(total) = tenant.claim_storage(grows)
        {
            let name = &tenant.tenant;
            return Err(self.refuse(format!(
                "put of {} to `{path}` would bring the blob stores of tenant `{name}` to {}, \
                 over tenant `{name}`'s quota of {} ({})",
                mib(size),
                mib(total),
                mib(tenant.max_stored_bytes),
                tenant.config_key("max_stored_mb")
            )));
        }
        let written = self.put_unchecked(path, &location, data, mode);
        if let Some(tenant) = tenant {
            match written {
                Ok(()) => tenant.release_storage(replaced.saturating_sub(size)),
                Err(_) => tenant.release_storage(grows),
            }
        }
        written?;
        *stored = Some(after);
        Ok(())
    }

    fn put_unchecked(
        &self,
        path: &str,
        location: &Path,
        data: Vec<u8>,
        mode: PutMode,
    ) -> Result<(), BlobError> {
        let store = match &self.backend {
            Backend::Local(root) => return put_durably(root, path, &data, mode),
            Backend::Store(store) => store,
        };
        self.block(async {
            let options = PutOptions {
                mode,
                ..Default::default()
            };
            store
                .put_opts(location, PutPayload::from(data), options)
                .await?;
            Ok(())
        })
        .map_err(|e| self.map_error(path, e))
    }

    /// Every object whose path starts with `prefix`, in no order.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        // object_store lists whole folders; a prefix may end inside a name
        // (`orders/0001`), so list its folder and filter by the full prefix.
        let folder = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let folder_path = if folder.is_empty() {
            None
        } else {
            Some(self.check(folder)?)
        };
        if !prefix.is_empty() && !prefix.ends_with('/') {
            self.check(prefix)?;
        }
        let most = self.limits.max_list_entries;
        let too_many = || {
            self.refuse(format!(
                "listing `{prefix}` found more than {most} entries (limits.max_list_entries); \
                 list a narrower prefix"
            ))
        };
        let store = match &self.backend {
            Backend::Local(root) => {
                return blob_walk::list(root, folder, prefix, most.saturating_mul(2))
                    .map_err(|e| match e {
                        WalkError::TooMany => too_many(),
                        WalkError::Io(e) => BlobError::Io(format!("{prefix}: {}", for_guest(&e))),
                    })
                    .and_then(|found| match found.len() > most {
                        true => Err(too_many()),
                        false => Ok(found),
                    });
            }
            Backend::Store(store) => store,
        };
        // Stop reading the listing at the bound, so a huge prefix cannot
        // make the host hold it all.
        let listed = self
            .block(async {
                let mut found = Vec::new();
                let mut stream = store.list(folder_path.as_ref());
                while let Some(meta) = stream.next().await {
                    let meta = meta?;
                    let path = meta.location.to_string();
                    if path.starts_with(prefix) && !blob_path::is_temporary(&path) {
                        if found.len() == most {
                            return Ok(None);
                        }
                        found.push(ObjectMeta {
                            path,
                            size: meta.size,
                        });
                    }
                }
                Ok(Some(found))
            })
            .map_err(|e| self.map_error(prefix, e))?;
        listed.ok_or_else(too_many)
    }

    /// Deletes an object; a missing one is success.
    pub fn delete(&self, path: &str) -> Result<(), BlobError> {
        let location = self.check(path)?;
        self.injected_fault(path)?;
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        let before = self.stored_bytes(&mut stored)?;
        let removed = self.size_of(path, &location)?;
        let deleted = match &self.backend {
            Backend::Local(root) => delete_local(root, path),
            Backend::Store(store) => match self.block(store.delete(&location)) {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.map_error(path, e)),
            },
        };
        deleted?;
        *stored = Some(before.saturating_sub(removed));
        if let Some(tenant) = &self.tenant {
            tenant.release_storage(removed);
        }
        Ok(())
    }

    /// The bytes the root holds, counted once (at the first write) by
    /// listing it; later writes keep the count.
    /// What the root holds, in bytes (counted once, then kept up to date
    /// by this scope's own writes).
    pub fn total_bytes(&self) -> Result<u64, BlobError> {
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        self.stored_bytes(&mut stored)
    }

    fn stored_bytes(&self, stored: &mut Option<u64>) -> Result<u64, BlobError> {
        if let Some(bytes) = *stored {
            return Ok(bytes);
        }
        let io = |e: String| BlobError::Io(format!("counting what the root holds: {e}"));
        let bytes = match &self.backend {
            Backend::Local(root) => blob_walk::stored_bytes(root).map_err(|e| io(for_guest(&e)))?,
            Backend::Store(store) => self
                .block(async {
                    let mut total = 0u64;
                    let mut stream = store.list(None);
                    while let Some(meta) = stream.next().await {
                        total = total.saturating_add(meta?.size);
                    }
                    Ok(total)
                })
                .map_err(|e| io(for_guest(&e)))?,
        };
        *stored = Some(bytes);
        Ok(bytes)
    }

    /// The size of the object at `path`, 0 if there is none.
    fn size_of(&self, path: &str, location: &Path) -> Result<u64, BlobError> {
        let store = match &self.backend {
            Backend::Local(root) => {
                return match std::fs::symlink_metadata(root.join(path)) {
                    Ok(meta) if meta.is_file() => Ok(meta.len()),
                    Ok(_) => Ok(0),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
                    Err(e) => Err(BlobError::Io(format!("{path}: {}", for_guest(&e)))),
                };
            }
            Backend::Store(store) => store,
        };
        match self.block(store.head(location)) {
            Ok(meta) => Ok(meta.size),
            Err(object_store::Error::NotFound { .. }) => Ok(0),
            Err(e) => Err(self.map_error(path, e)),
        }
    }

    /// A refusal the sink sees as `denied`; the host reports the first
    /// one itself, naming the sink, since the sink may swallow it.
    fn refuse(&self, detail: String) -> BlobError {
        use std::sync::atomic::Ordering;
        if !self.reported.swap(true, Ordering::Relaxed) {
            tracing::warn!(sink = %self.limits.sink, "sink `{}` refused: {detail}", self.limits.sink);
        }
        BlobError::Denied(detail)
    }

    fn block<T>(
        &self,
        future: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> object_store::Result<T> {
        self.runtime.block_on(future)
    }

    /// Turns a guest's path into a location inside the root, or refuses it,
    /// by the contract's rules (the SDK's native runner applies the same).
    fn check(&self, path: &str) -> Result<Path, BlobError> {
        let deny = |why: &str| BlobError::Denied(format!("path `{path}` {why}"));
        blob_path::check(path).map_err(deny)?;
        if let Backend::Local(root) = &self.backend {
            blob_path::check_links(root, path).map_err(deny)?;
        }
        Path::parse(path).map_err(|e| BlobError::Denied(format!("path `{path}`: {e}")))
    }
}

/// A local put that survives a power cut, not only a crash of the process:
/// object_store's local backend renames without fsync, and a sink's commit
/// is only as durable as this call. Write a temporary file, fsync it, move
/// it into place (rename to overwrite; hard link to create, which fails if
/// the name exists), then fsync the folder so the new name is durable too.
fn put_durably(root: &FsPath, path: &str, data: &[u8], mode: PutMode) -> Result<(), BlobError> {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let io = |e: std::io::Error| BlobError::Io(format!("{path}: {}", for_guest(&e)));
    let target = root.join(path);
    let folder = target.parent().expect("a checked path has a file name");
    std::fs::create_dir_all(folder).map_err(io)?;
    let temp = folder.join(format!(
        "{TEMP_MARKER}{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(data)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(io(e));
    }
    let placed = match mode {
        PutMode::Create => {
            let linked = std::fs::hard_link(&temp, &target);
            let _ = std::fs::remove_file(&temp);
            match linked {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(BlobError::AlreadyExists(path.to_string()));
                }
                other => other,
            }
        }
        _ => std::fs::rename(&temp, &target),
    };
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temp);
        return Err(io(e));
    }
    std::fs::File::open(folder)
        .and_then(|dir| dir.sync_all())
        .map_err(io)
}

/// Deletes a local object (a missing one is success), then the folders
/// that leaves empty, up to the root, as object_store's local backend did.
fn delete_local(root: &FsPath, path: &str) -> Result<(), BlobError> {
    let target = root.join(path);
    match std::fs::remove_file(&target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(BlobError::Io(format!("{path}: {}", for_guest(&e)))),
        Ok(()) => {}
    }
    // A folder that still holds something stays, and ends the walk.
    let mut folder = target.parent();
    while let Some(dir) = folder
        && dir != root
        && std::fs::remove_dir(dir).is_ok()
    {
        folder = dir.parent();
    }
    Ok(())
}

/// Bytes as an operator reads them in a message.
fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// The blob store capability.
pub struct Blobstore;

impl Capability for Blobstore {
    const PROVIDES: Provides = Provides::ContractInterface("blobstore");
    type State = Arc<BlobScope>;

    fn instance_state(grants: &Grants) -> Arc<BlobScope> {
        grants.blob.clone()
    }
}

impl BlobScope {
    /// A store's error as the sink sees it. An object store's I/O failure
    /// names the root's URL as the operator wrote it (a local root's folder
    /// is not told to the sink: it is the host's business).
    fn map_error(&self, path: &str, error: object_store::Error) -> BlobError {
        match error {
            object_store::Error::NotFound { .. } => BlobError::NotFound(path.to_string()),
            object_store::Error::AlreadyExists { .. } => BlobError::AlreadyExists(path.to_string()),
            other if matches!(self.backend, Backend::Store(_)) => BlobError::Io(format!(
                "{} at `{path}`: {}",
                self.description,
                for_guest(&other)
            )),
            other => BlobError::Io(format!("{path}: {}", for_guest(&other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(dir: &FsPath) -> (tokio::runtime::Runtime, BlobScope) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let scope = BlobScope::open(
            dir.join("root").to_str().unwrap(),
            &[],
            dir,
            rt.handle().clone(),
        )
        .unwrap();
        (rt, scope)
    }

    #[test]
    fn round_trips_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let (_rt, s) = scope(dir.path());
        s.put("t/a.bin", b"hello world".to_vec()).unwrap();
        assert_eq!(s.get("t/a.bin").unwrap(), b"hello world");
        assert_eq!(s.get_range("t/a.bin", 6, 100).unwrap(), b"world");
        assert_eq!(s.get_range("t/a.bin", 50, 5).unwrap(), b"");
        assert_eq!(
            s.put_if_absent("t/a.bin", b"x".to_vec()),
            Err(BlobError::AlreadyExists("t/a.bin".into()))
        );
        s.put_if_absent("t/b.bin", b"x".to_vec()).unwrap();
        let mut listed: Vec<_> = s.list("t/").unwrap().into_iter().map(|m| m.path).collect();
        listed.sort();
        assert_eq!(listed, ["t/a.bin", "t/b.bin"]);
        assert_eq!(s.list("t/a").unwrap().len(), 1);
        s.delete("t/a.bin").unwrap();
        s.delete("t/a.bin").unwrap();
        assert!(matches!(s.get("t/a.bin"), Err(BlobError::NotFound(_))));
        assert!(dir.path().join("root/t/b.bin").exists());
        assert_eq!(s.get("t"), Err(BlobError::NotFound("t".into())), "a folder");
        assert_eq!(s.get_range("t/b.bin", 0, 1).unwrap(), b"x");
        s.put("t/deep/er/c.bin", b"c".to_vec()).unwrap();
        s.delete("t/deep/er/c.bin").unwrap();
        assert!(
            !dir.path().join("root/t/deep").exists(),
            "a delete takes the folders it empties"
        );
        assert!(
            dir.path().join("root/t").exists(),
            "but not one still holding b.bin"
        );
    }

    #[test]
    fn escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_rt, s) = scope(dir.path());
        std::fs::write(dir.path().join("secret"), b"top secret").unwrap();
        for path in [
            "../secret",
            "t/../../secret",
            "/etc/passwd",
            "./secret",
            "a//b",
            "a\\..\\secret",
            "",
        ] {
            assert!(
                matches!(s.get(path), Err(BlobError::Denied(_))),
                "{path:?} was not refused"
            );
            assert!(
                matches!(s.put(path, b"x".to_vec()), Err(BlobError::Denied(_))),
                "{path:?} was not refused for put"
            );
        }
        std::os::unix::fs::symlink(dir.path(), dir.path().join("root/out")).unwrap();
        assert!(matches!(s.get("out/secret"), Err(BlobError::Denied(_))));
        assert!(matches!(
            s.put("out/planted", b"x".to_vec()),
            Err(BlobError::Denied(_))
        ));
        assert!(!dir.path().join("planted").exists());
        assert!(matches!(s.list("out/"), Err(BlobError::Denied(_))));
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("root/file-link"))
            .unwrap();
        assert!(matches!(s.get("file-link"), Err(BlobError::Denied(_))));
        // A link that stays inside the root is fine.
        std::fs::create_dir_all(dir.path().join("root/real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("root/real"), dir.path().join("root/alias"))
            .unwrap();
        s.put("alias/ok", b"y".to_vec()).unwrap();
    }

    #[test]
    fn listing_leaves_out_links_out_of_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let (_rt, s) = scope(dir.path());
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"top secret").unwrap();
        let root = dir.path().join("root");
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), root.join("file-link")).unwrap();
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("alias")).unwrap();
        s.put("real/ok", b"y".to_vec()).unwrap();
        // Listing shows what a get may read: links out of the root are left out.
        let mut listed: Vec<_> = s.list("").unwrap().into_iter().map(|m| m.path).collect();
        listed.sort();
        assert_eq!(listed, ["alias/ok", "real/ok"]);
    }

    #[test]
    fn a_link_loop_does_not_break_listing() {
        let dir = tempfile::tempdir().unwrap();
        let (_rt, s) = scope(dir.path());
        let root = dir.path().join("root");
        s.put("a/one", b"1".to_vec()).unwrap();
        s.put("b/two", b"2".to_vec()).unwrap();
        std::os::unix::fs::symlink(&root, root.join("a/up")).unwrap();
        std::os::unix::fs::symlink(root.join("b"), root.join("a/to-b")).unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("b/to-a")).unwrap();
        let mut listed: Vec<_> = s.list("").unwrap().into_iter().map(|m| m.path).collect();
        listed.sort();
        assert_eq!(listed, ["a/one", "a/to-b/two", "b/to-a/one", "b/two"]);
    }

    #[test]
    fn stores_are_bounded_by_the_quota_and_calls_by_their_limits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        std::fs::write(dir.path().join("root/old"), vec![1; 400]).unwrap();
        let (_rt, s) = scope(dir.path());
        let s = s.with_limits(BlobLimits {
            sink: "s".into(),
            max_stored_bytes: 1000,
            max_put_bytes: 500,
            max_read_bytes: 300,
            max_list_entries: 3,
        });
        s.put("a", vec![0; 500]).unwrap();
        let denied = |r: Result<(), BlobError>| match r {
            Err(BlobError::Denied(m)) => m,
            other => panic!("not denied: {other:?}"),
        };
        assert!(denied(s.put("b", vec![0; 200])).contains("limits.max_stored_mb"));
        assert!(denied(s.put("b", vec![0; 501])).contains("limits.max_object_mb"));
        // Overwriting and deleting give room back.
        s.put("a", vec![0; 100]).unwrap();
        s.put("b", vec![0; 450]).unwrap();
        s.delete("old").unwrap();
        s.put("c", vec![0; 400]).unwrap();
        assert!(matches!(s.get("b"), Err(BlobError::Denied(m)) if m.contains("max_object_mb")));
        assert_eq!(s.get_range("b", 0, 300).unwrap().len(), 300);
        assert_eq!(s.list("").unwrap().len(), 3);
        s.put("d", vec![0; 1]).unwrap();
        assert!(matches!(s.list(""), Err(BlobError::Denied(m)) if m.contains("max_list_entries")));
    }

    #[test]
    fn the_roots_of_a_tenant_share_its_quota() {
        let dir = tempfile::tempdir().unwrap();
        let tenant_root = dir.path().join("acme");
        std::fs::create_dir_all(tenant_root.join("orders")).unwrap();
        std::fs::write(tenant_root.join("orders/old"), vec![1; 100]).unwrap();
        let share = Arc::new(crate::tenant::acme(1000, 100, 10, 10));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let open = |pipeline: &str, sink: &str| {
            BlobScope::open(
                tenant_root.join(pipeline).to_str().unwrap(),
                &[],
                dir.path(),
                rt.handle().clone(),
            )
            .unwrap()
            .with_limits(BlobLimits {
                sink: sink.into(),
                max_stored_bytes: 700,
                max_put_bytes: 1000,
                max_read_bytes: 1000,
                max_list_entries: 100,
            })
            .with_tenant(share.clone())
        };
        let lake = open("orders", "lake");
        let files = open("users", "files");
        let denied = |r: Result<(), BlobError>| match r {
            Err(BlobError::Denied(m)) => m,
            other => panic!("not denied: {other:?}"),
        };
        // Each under its own quota of 700, together at the tenant's 1000.
        lake.put("a", vec![0; 500]).unwrap();
        files.put("a", vec![0; 400]).unwrap();
        assert_eq!(share.stored_bytes(), 1000);
        let refused = denied(files.put("b", vec![0; 1]));
        assert!(
            refused
                .contains("over tenant `acme`'s quota of 1000 bytes (tenants.acme.max_stored_mb)"),
            "{refused}"
        );
        assert!(refused.contains("to 1001 bytes"), "{refused}");
        assert!(denied(lake.put_if_absent("b", vec![0; 10])).contains("tenant `acme`"));
        // The sink's own quota is still its own.
        assert!(denied(lake.put("a", vec![0; 701])).contains("limits.max_stored_mb"));
        // A refused put_if_absent over an existing object claims nothing.
        assert_eq!(
            files.put_if_absent("a", vec![0; 10]),
            Err(BlobError::AlreadyExists("a".into()))
        );
        assert_eq!(share.stored_bytes(), 1000);
        // Shrinking an object, or deleting one in another root, makes room
        // for every root of the tenant.
        lake.put("a", vec![0; 300]).unwrap();
        files.put("b", vec![0; 200]).unwrap();
        assert!(denied(files.put("c", vec![0; 1])).contains("tenant `acme`"));
        lake.delete("old").unwrap();
        lake.delete("old").unwrap();
        files.put("c", vec![0; 100]).unwrap();
        assert_eq!(share.stored_bytes(), 1000);
        // What the roots hold is what the tenant counted.
        let on_disk = |root: &str| blob_walk::stored_bytes(&tenant_root.join(root)).unwrap();
        assert_eq!(on_disk("orders") + on_disk("users"), share.stored_bytes());
    }

    #[test]
    fn memory_root_works() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let s = BlobScope::open("memory://", &[], FsPath::new("."), rt.handle().clone()).unwrap();
        s.put_if_absent("x/1", b"a".to_vec()).unwrap();
        assert_eq!(s.get("x/1").unwrap(), b"a");
    }
}
