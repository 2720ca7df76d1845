//! The blob store capability: object storage confined to the one root the
//! operator granted a sink, backed by `object_store` (a local folder, memory,
//! or S3 and friends by URL). Each instance of a sink gets the sink's
//! [`BlobScope`]; the contract's `blobstore` interface calls it.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{GetOptions, GetRange, ObjectStore, PutMode, PutOptions, PutPayload};
use tokio::runtime::Handle;
use wasmtime::component::Linker;
use weir_contract::blob_path::{self, TEMP_MARKER};

use super::{Capability, Grants};
use crate::runtime::instance::HostState;
use crate::runtime::wit;

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
}

/// An object found by `list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Relative to the root.
    pub path: String,
    /// In bytes.
    pub size: u64,
}

/// One sink's view of storage: every path is relative to the granted root.
pub struct BlobScope {
    store: Arc<dyn ObjectStore>,
    /// For a local folder, its canonical path, to refuse links leading out.
    local_root: Option<PathBuf>,
    description: String,
    runtime: Handle,
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
        if url == "memory://" || url == "memory:" {
            return Ok(BlobScope {
                store: Arc::new(InMemory::new()),
                local_root: None,
                description: "memory://".into(),
                runtime,
            });
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
            let store = LocalFileSystem::new_with_prefix(&root)
                .map_err(|e| fail(e.to_string()))?
                .with_automatic_cleanup(true);
            return Ok(BlobScope {
                store: Arc::new(store),
                description: root.display().to_string(),
                local_root: Some(root),
                runtime,
            });
        }
        let parsed = url::Url::parse(url).map_err(|e| fail(format!("not a URL: {e}")))?;
        let (store, prefix) = object_store::parse_url_opts(&parsed, options.iter().cloned())
            .map_err(|e| fail(e.to_string()))?;
        let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
            Arc::from(store)
        } else {
            Arc::new(PrefixStore::new(store, prefix))
        };
        Ok(BlobScope {
            store,
            local_root: None,
            description: url.to_string(),
            runtime,
        })
    }

    /// The root, as an operator recognises it in a message.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// Reads a whole object.
    pub fn get(&self, path: &str) -> Result<Vec<u8>, BlobError> {
        let location = self.check(path)?;
        self.block(async {
            let result = self.store.get(&location).await?;
            Ok(result.bytes().await?.to_vec())
        })
        .map_err(|e| map_error(path, e))
    }

    /// Reads up to `length` bytes from `offset`; fewer at the object's end.
    pub fn get_range(&self, path: &str, offset: u64, length: u64) -> Result<Vec<u8>, BlobError> {
        let location = self.check(path)?;
        self.block(async {
            let size = self.store.head(&location).await?.size;
            let start = offset.min(size);
            let end = offset.saturating_add(length).min(size);
            if start == end {
                return Ok(Vec::new());
            }
            let options = GetOptions {
                range: Some(GetRange::Bounded(start..end)),
                ..Default::default()
            };
            let result = self.store.get_opts(&location, options).await?;
            Ok(result.bytes().await?.to_vec())
        })
        .map_err(|e| map_error(path, e))
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
        if let Some(root) = &self.local_root {
            return put_durably(root, path, &data, mode);
        }
        self.block(async {
            let options = PutOptions {
                mode,
                ..Default::default()
            };
            self.store
                .put_opts(&location, PutPayload::from(data), options)
                .await?;
            Ok(())
        })
        .map_err(|e| map_error(path, e))
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
        let listed: Vec<object_store::ObjectMeta> = self
            .block(async { self.store.list(folder_path.as_ref()).try_collect().await })
            .map_err(|e| map_error(prefix, e))?;
        Ok(listed
            .into_iter()
            .map(|m| ObjectMeta {
                path: m.location.to_string(),
                size: m.size,
            })
            .filter(|m| {
                m.path.starts_with(prefix)
                    && !blob_path::is_temporary(&m.path)
                    && self.may_list(&m.path)
            })
            .collect())
    }

    /// Deletes an object; a missing one is success.
    pub fn delete(&self, path: &str) -> Result<(), BlobError> {
        let location = self.check(path)?;
        match self.block(self.store.delete(&location)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_error(path, e)),
        }
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
        if let Some(root) = &self.local_root {
            blob_path::check_links(root, path).map_err(deny)?;
        }
        Path::parse(path).map_err(|e| BlobError::Denied(format!("path `{path}`: {e}")))
    }

    /// Whether a listed object may be shown: in a local root, object_store
    /// follows every link, also one planted to lead out of the root.
    fn may_list(&self, path: &str) -> bool {
        match &self.local_root {
            Some(root) => blob_path::check_links(root, path).is_ok(),
            None => true,
        }
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
    let io = |e: std::io::Error| BlobError::Io(format!("{path}: {e}"));
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

/// The blob store capability.
pub struct Blobstore;

impl Capability for Blobstore {
    const INTERFACE: &'static str = "blobstore";
    type State = Arc<BlobScope>;

    fn instance_state(grants: &Grants) -> Arc<BlobScope> {
        grants.blob.clone()
    }

    fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        wit::link_blobstore(linker, |state| state.capabilities.blobstore.as_ref())
    }
}

fn map_error(path: &str, error: object_store::Error) -> BlobError {
    match error {
        object_store::Error::NotFound { .. } => BlobError::NotFound(path.to_string()),
        object_store::Error::AlreadyExists { .. } => BlobError::AlreadyExists(path.to_string()),
        other => BlobError::Io(format!("{path}: {other}")),
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
    fn memory_root_works() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let s = BlobScope::open("memory://", &[], FsPath::new("."), rt.handle().clone()).unwrap();
        s.put_if_absent("x/1", b"a".to_vec()).unwrap();
        assert_eq!(s.get("x/1").unwrap(), b"a");
    }
}
