//! Run a sink natively, without WebAssembly: for unit tests of a sink and for
//! measuring what the sandbox costs.
//!
//! [`NativeSink`] takes the same inputs the host sends to a plugin (batch
//! header plus Arrow IPC stream bytes) and decodes them with the same code the
//! WebAssembly build uses, so a test through it exercises what runs in
//! production. The blob store is a local directory with the host's path
//! rules; network grants ([`NativeSink::grant_http`],
//! [`NativeSink::grant_tcp`]) are decided by the host's rules too, so
//! [`weir_sdk::net`](crate::net) refuses natively what the host would refuse.
//!
//! ```no_run
//! use weir_sdk::native::{NativeSink, encode_ipc};
//! # use weir_sdk::{BatchMeta, CommitRequest, Table, Sink, Batch, Result};
//! # #[derive(Default)] struct MySink;
//! # impl Sink for MySink {
//! #     fn write(&mut self, _: Batch) -> Result<()> { Ok(()) }
//! #     fn commit(&mut self, _: CommitRequest) -> Result<()> { Ok(()) }
//! # }
//! # fn records() -> weir_sdk::RecordBatch { unimplemented!() }
//! let mut sink = NativeSink::new(MySink::default(), "/tmp/weir-test");
//! sink.open("p1", &[("prefix".into(), "out".into())])?;
//! let rows = records(); // with `__op` and `__pos` columns
//! let meta = BatchMeta {
//!     table: Table::new("public.orders"),
//!     id: "b1".into(),
//!     low: vec![1],
//!     high: vec![2],
//!     rows: rows.num_rows() as u32,
//! };
//! sink.write(meta, &encode_ipc(&rows))?;
//! sink.commit(CommitRequest {
//!     table: "public.orders".into(),
//!     high: vec![2],
//!     pipeline: "p1".into(),
//!     epoch: 1,
//! })?;
//! # Ok::<(), weir_sdk::SinkError>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weir_contract::grants::{Grants, HttpGrant, TcpGrant};

use crate::{
    Batch, BatchMeta, CommitRequest, Committed, Config, Maintenance, Positions, RecordBatch,
    Result, Sink,
};

/// A sink running natively, with a local directory as its blob store.
///
/// Every call installs the directory as the store that
/// [`weir_sdk::blob`](crate::blob) uses, and the sink's grants as those
/// [`weir_sdk::net`](crate::net) checks, for the duration of the call (on
/// the calling thread), so tests running in parallel each see their own.
/// Nothing is granted until you say so.
#[derive(Debug)]
pub struct NativeSink<S> {
    sink: S,
    root: PathBuf,
    grants: Arc<Grants>,
    crash: Arc<store::CrashPlan>,
}

impl<S: Sink> NativeSink<S> {
    /// Wraps `sink`, giving it `blob_root` as its blob store root. The
    /// directory is created when the sink first writes.
    pub fn new(sink: S, blob_root: impl Into<PathBuf>) -> Self {
        NativeSink {
            sink,
            root: blob_root.into(),
            grants: Arc::default(),
            crash: Arc::default(),
        }
    }

    /// Replaces the sink's network grants, as the operator's
    /// `grants: { http: [...], tcp: [...] }` would.
    pub fn with_grants(mut self, grants: Grants) -> Self {
        self.grants = Arc::new(grants);
        self
    }

    /// Adds one entry of `grants.http`, for example
    /// `"http://127.0.0.1:8080"` (see [`net::grants`](crate::net::grants)
    /// for the forms).
    ///
    /// Panics with the reason if `pattern` is not a valid HTTP grant: it is
    /// written by the test, not read from an operator.
    pub fn grant_http(mut self, pattern: &str) -> Self {
        let grant = HttpGrant::parse(pattern).unwrap_or_else(|e| panic!("{e}"));
        Arc::make_mut(&mut self.grants).http.push(grant);
        self
    }

    /// Adds one entry of `grants.tcp`, for example `"127.0.0.1:6379"`.
    ///
    /// Panics with the reason if `pattern` is not a valid TCP grant.
    pub fn grant_tcp(mut self, pattern: &str) -> Self {
        let grant = TcpGrant::parse(pattern).unwrap_or_else(|e| panic!("{e}"));
        Arc::make_mut(&mut self.grants).tcp.push(grant);
        self
    }

    /// The sink's network grants.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// Runs `f` on the sink with its blob root and grants installed on this
    /// thread, as the host runs a call with the sink's capabilities.
    fn call<R>(&mut self, f: impl FnOnce(&mut S) -> R) -> R {
        let _root = store::install(self.root.clone(), self.crash.clone());
        let _grants = network::install(self.grants.clone());
        f(&mut self.sink)
    }

    /// Calls [`Sink::open`] with the configuration as the host passes it.
    pub fn open(&mut self, pipeline: &str, config: &[(String, String)]) -> Result<()> {
        let config: Config = config.iter().cloned().collect();
        self.call(|sink| sink.open(pipeline, &config))
    }

    /// Decodes `ipc` (an Arrow IPC stream) like the WebAssembly glue does and
    /// calls [`Sink::write`]. Decoding failures are [`SinkError::Poison`](crate::SinkError::Poison).
    pub fn write(&mut self, meta: BatchMeta, ipc: &[u8]) -> Result<()> {
        let batch = Batch::decode(meta, ipc)?;
        self.call(|sink| sink.write(batch))
    }

    /// Calls [`Sink::commit`].
    pub fn commit(&mut self, request: CommitRequest) -> Result<()> {
        self.call(|sink| sink.commit(request))
    }

    /// Calls [`Sink::abort`].
    pub fn abort(&mut self, table: &str) {
        self.call(|sink| sink.abort(table))
    }

    /// Makes the sink "die" just before its `at`-th mutating blob call
    /// (`put`, `put_if_absent`, `delete`; 1 is the next one): that call and
    /// every blob call after it fail with [`BlobError::Io`](crate::BlobError::Io)
    /// and change nothing, so the store is left exactly as a process killed
    /// at that moment would leave it. Drop the sink afterwards and start a
    /// new one on the same root, as a restarted host would.
    pub fn crash_at_write(&mut self, at: u64) {
        self.crash.arm(at.max(1));
    }

    /// Whether the crash armed by [`crash_at_write`](Self::crash_at_write)
    /// happened, and how many mutating blob calls ran since it was armed
    /// (the one that crashed included).
    pub fn crashed(&self) -> (bool, u64) {
        self.crash.state()
    }

    /// The blob store root.
    pub fn blob_root(&self) -> &Path {
        &self.root
    }

    /// The wrapped sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// The wrapped sink, mutably.
    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }

    /// Gives the wrapped sink back.
    pub fn into_inner(self) -> S {
        self.sink
    }
}

impl<S: Positions> NativeSink<S> {
    /// Calls [`Positions::committed`].
    pub fn committed(&mut self, pipeline: &str, table: &str) -> Result<Option<Committed>> {
        self.call(|sink| sink.committed(pipeline, table))
    }
}

impl<S: Maintenance> NativeSink<S> {
    /// Calls [`Maintenance::maintain`].
    pub fn maintain(
        &mut self,
        pipeline: &str,
        tables: &[String],
        what: &[String],
    ) -> Result<String> {
        self.call(|sink| sink.maintain(pipeline, tables, what))
    }
}

/// Runs `f` with `root` as the blob store of [`weir_sdk::blob`](crate::blob)
/// on this thread, for example to read back in a test what a sink wrote.
/// Outside of this (and of [`NativeSink`] calls) blob calls fail with
/// [`BlobError::Denied`](crate::BlobError::Denied).
pub fn with_blob_root<R>(root: &Path, f: impl FnOnce() -> R) -> R {
    let _restore = store::install(root.to_path_buf(), Arc::default());
    f()
}

/// Runs `f` with `grants` as the network grants [`weir_sdk::net`](crate::net)
/// checks on this thread, for example to try a request outside a sink.
/// Outside of this (and of [`NativeSink`] calls) nothing is granted.
pub fn with_grants<R>(grants: &Grants, f: impl FnOnce() -> R) -> R {
    let _restore = network::install(Arc::new(grants.clone()));
    f()
}

/// Encodes rows as an Arrow IPC stream, the form the host sends to
/// [`Sink::write`] (the host encodes with the same function). Panics only if
/// Arrow cannot encode the batch.
pub fn encode_ipc(batch: &RecordBatch) -> Vec<u8> {
    weir_contract::ipc::encode(batch).expect("Arrow IPC stream of one record batch")
}

/// The grants of the native call running on this thread.
pub(crate) mod network {
    use std::cell::RefCell;
    use std::sync::Arc;

    use weir_contract::grants::Grants;

    thread_local! {
        static GRANTS: RefCell<Option<Arc<Grants>>> = const { RefCell::new(None) };
    }

    pub(crate) struct Restore(Option<Arc<Grants>>);

    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            GRANTS.with(|g| *g.borrow_mut() = previous);
        }
    }

    pub(crate) fn install(grants: Arc<Grants>) -> Restore {
        Restore(GRANTS.with(|g| g.borrow_mut().replace(grants)))
    }

    /// The grants in force: none outside a native call.
    pub(crate) fn current() -> Arc<Grants> {
        GRANTS.with(|g| g.borrow().clone()).unwrap_or_default()
    }
}

/// The native blob backend: a local directory.
pub(crate) mod store {
    use std::cell::RefCell;
    use std::fs;
    use std::io::{self, Read, Seek, SeekFrom, Write};
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use weir_contract::blob_path::{self, TEMP_MARKER};

    use crate::blob::{BlobError, ObjectMeta};

    /// The store of the call running on this thread: its root, and the
    /// crash planned for it.
    type Installed = (PathBuf, Arc<CrashPlan>);

    thread_local! {
        static ROOT: RefCell<Option<Installed>> = const { RefCell::new(None) };
    }

    pub(crate) struct Restore(Option<Installed>);

    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            ROOT.with(|r| *r.borrow_mut() = previous);
        }
    }

    pub(crate) fn install(root: PathBuf, crash: Arc<CrashPlan>) -> Restore {
        Restore(ROOT.with(|r| r.borrow_mut().replace((root, crash))))
    }

    /// A crash planned at a mutating call, as `NativeSink::crash_at_write`
    /// arms it.
    #[derive(Debug, Default)]
    pub(crate) struct CrashPlan {
        /// (the call to die at, mutating calls so far, whether it died).
        state: Mutex<(Option<u64>, u64, bool)>,
    }

    impl CrashPlan {
        pub(crate) fn arm(&self, at: u64) {
            *self.lock() = (Some(at), 0, false);
        }

        pub(crate) fn state(&self) -> (bool, u64) {
            let state = self.lock();
            (state.2, state.1)
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, (Option<u64>, u64, bool)> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Before any call: refused once the sink has died.
        fn check(&self, path: &str) -> Result<(), BlobError> {
            match self.lock().2 {
                true => Err(dead(path)),
                false => Ok(()),
            }
        }

        /// Before a mutating call: refused if this is the armed one.
        fn before_write(&self, path: &str) -> Result<(), BlobError> {
            let mut state = self.lock();
            if state.2 {
                return Err(dead(path));
            }
            let Some(at) = state.0 else {
                return Ok(());
            };
            state.1 += 1;
            if state.1 == at {
                state.2 = true;
                return Err(dead(path));
            }
            Ok(())
        }
    }

    fn dead(path: &str) -> BlobError {
        BlobError::Io(format!(
            "{path}: the sink crashed here (injected by the test)"
        ))
    }

    fn installed() -> Result<Installed, BlobError> {
        ROOT.with(|r| r.borrow().clone()).ok_or_else(|| {
            BlobError::Denied(
                "no blob store granted: run the sink through weir_sdk::native::NativeSink".into(),
            )
        })
    }

    fn root() -> Result<PathBuf, BlobError> {
        installed().map(|(root, _)| root)
    }

    /// Fails a read once the sink has died.
    fn reading(path: &str) -> Result<(), BlobError> {
        installed()?.1.check(path)
    }

    /// Fails a mutating call at the planned crash, and every one after it.
    fn writing(path: &str) -> Result<(), BlobError> {
        installed()?.1.before_write(path)
    }

    /// Checks a relative path against the host's rules.
    fn check(path: &str) -> Result<(), BlobError> {
        blob_path::check(path).map_err(|why| deny(path, why))
    }

    /// Refuses a path through a link that leads out of the root, as the
    /// host does.
    fn check_links(root: &Path, path: &str) -> Result<(), BlobError> {
        blob_path::check_links(root, path).map_err(|why| deny(path, why))
    }

    fn deny(path: &str, why: &str) -> BlobError {
        BlobError::Denied(format!("path `{path}` {why}"))
    }

    fn resolve(path: &str) -> Result<PathBuf, BlobError> {
        check(path)?;
        let root = root()?;
        check_links(&root, path)?;
        Ok(root.join(path))
    }

    fn io_error(path: &str, e: io::Error) -> BlobError {
        match e.kind() {
            io::ErrorKind::NotFound => BlobError::NotFound(path.to_string()),
            _ => BlobError::Io(format!("{path}: {e}")),
        }
    }

    pub fn get(path: &str) -> Result<Vec<u8>, BlobError> {
        let full = resolve(path)?;
        reading(path)?;
        if full.is_dir() {
            return Err(BlobError::NotFound(path.to_string()));
        }
        fs::read(&full).map_err(|e| io_error(path, e))
    }

    pub fn get_range(path: &str, offset: u64, len: u64) -> Result<Vec<u8>, BlobError> {
        let full = resolve(path)?;
        reading(path)?;
        if full.is_dir() {
            return Err(BlobError::NotFound(path.to_string()));
        }
        let mut file = fs::File::open(&full).map_err(|e| io_error(path, e))?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| io_error(path, e))?;
        let mut out = Vec::new();
        file.take(len)
            .read_to_end(&mut out)
            .map_err(|e| io_error(path, e))?;
        Ok(out)
    }

    /// Writes `data` to a fresh temporary file next to `full` and syncs it.
    fn write_temp(path: &str, full: &Path, data: &[u8]) -> Result<PathBuf, BlobError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let parent = full.parent().expect("a resolved path has a parent");
        fs::create_dir_all(parent).map_err(|e| io_error(path, e))?;
        let name = full
            .file_name()
            .expect("a resolved path has a file name")
            .to_string_lossy();
        let temp = parent.join(format!(
            "{TEMP_MARKER}{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut file = fs::File::create_new(&temp)?;
            file.write_all(data)?;
            file.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(io_error(path, e));
        }
        Ok(temp)
    }

    pub fn put(path: &str, data: &[u8]) -> Result<(), BlobError> {
        let full = resolve(path)?;
        writing(path)?;
        let temp = write_temp(path, &full, data)?;
        fs::rename(&temp, &full).map_err(|e| {
            let _ = fs::remove_file(&temp);
            io_error(path, e)
        })
    }

    pub fn put_if_absent(path: &str, data: &[u8]) -> Result<(), BlobError> {
        let full = resolve(path)?;
        writing(path)?;
        let temp = write_temp(path, &full, data)?;
        // A hard link fails if the target exists: the check and the write are
        // one atomic step.
        let linked = fs::hard_link(&temp, &full);
        let _ = fs::remove_file(&temp);
        match linked {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(BlobError::AlreadyExists(path.to_string()))
            }
            Err(e) => Err(io_error(path, e)),
        }
    }

    pub fn list(prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        // The folder part of the prefix must be a valid path; the rest is
        // matched as a plain string prefix.
        let folder = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        if !folder.is_empty() {
            check(folder)?;
        }
        if prefix.contains('\\') || prefix.starts_with('/') {
            return Err(BlobError::Denied(format!("{prefix:?}: malformed prefix")));
        }
        let root = root()?;
        reading(prefix)?;
        let start = if folder.is_empty() {
            root.clone()
        } else {
            check_links(&root, folder)?;
            root.join(folder)
        };
        let mut listing = Listing {
            root: &root,
            prefix,
            entered: Vec::new(),
            found: Vec::new(),
        };
        listing
            .walk(&start, folder)
            .map_err(|e| io_error(prefix, e))?;
        Ok(listing.found)
    }

    /// A walk of the folders under a prefix.
    struct Listing<'a> {
        root: &'a Path,
        prefix: &'a str,
        /// The resolved folders on the way down, so a link back to one of
        /// them ends the descent instead of looping.
        entered: Vec<PathBuf>,
        found: Vec<ObjectMeta>,
    }

    impl Listing<'_> {
        fn walk(&mut self, dir: &Path, rel: &str) -> io::Result<()> {
            let entries = match fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            };
            let resolved = dir.canonicalize()?;
            if self.entered.contains(&resolved) {
                return Ok(());
            }
            self.entered.push(resolved);
            for entry in entries {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let path = if rel.is_empty() {
                    name.clone()
                } else {
                    format!("{rel}/{name}")
                };
                // Same rule as a get: a link is followed only where it
                // resolves inside the root; one leading out is not listed.
                let meta = if entry.file_type()?.is_symlink() {
                    if blob_path::check_links(self.root, &path).is_err() {
                        continue;
                    }
                    fs::metadata(entry.path())?
                } else {
                    entry.metadata()?
                };
                if meta.is_dir() {
                    // Only descend where objects under the prefix can be.
                    let folder = format!("{path}/");
                    if folder.starts_with(self.prefix) || self.prefix.starts_with(&folder) {
                        self.walk(&entry.path(), &path)?;
                    }
                } else if meta.is_file()
                    && !blob_path::is_temporary(&path)
                    && path.starts_with(self.prefix)
                {
                    self.found.push(ObjectMeta {
                        path,
                        size: meta.len(),
                    });
                }
            }
            self.entered.pop();
            Ok(())
        }
    }

    pub fn delete(path: &str) -> Result<(), BlobError> {
        let full = resolve(path)?;
        writing(path)?;
        match fs::remove_file(&full) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::{self, BlobError};

    fn temp_root(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-sdk-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn blob_calls_need_a_root() {
        assert!(matches!(blob::get("a"), Err(BlobError::Denied(_))));
    }

    #[test]
    fn confinement() {
        let root = temp_root("confine");
        with_blob_root(&root, || {
            for bad in [
                "",
                "/etc/passwd",
                "a/../b",
                "../x",
                "./x",
                "a//b",
                "a/",
                "a\\b",
                "a/./b",
                "..",
            ] {
                assert!(
                    matches!(blob::put(bad, b"x"), Err(BlobError::Denied(_))),
                    "{bad:?} accepted by put"
                );
                assert!(
                    matches!(blob::get(bad), Err(BlobError::Denied(_))),
                    "{bad:?} accepted by get"
                );
            }
            assert!(matches!(blob::list("/"), Err(BlobError::Denied(_))));
            assert!(matches!(blob::list("../"), Err(BlobError::Denied(_))));
        });
        #[cfg(unix)]
        {
            let outside = temp_root("confine-outside");
            std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
            with_blob_root(&root, || {
                assert!(matches!(
                    blob::put("link/x", b"x"),
                    Err(BlobError::Denied(_))
                ));
            });
            assert!(!outside.join("x").exists());
            // Listing skips the link out; a link inside the root is followed.
            std::fs::write(outside.join("secret"), b"s").unwrap();
            std::fs::create_dir_all(root.join("real")).unwrap();
            std::os::unix::fs::symlink(root.join("real"), root.join("alias")).unwrap();
            with_blob_root(&root, || {
                blob::put("alias/y", b"y").unwrap();
                let mut listed: Vec<String> = blob::list("")
                    .unwrap()
                    .into_iter()
                    .map(|m| m.path)
                    .collect();
                listed.sort();
                assert_eq!(listed, ["alias/y", "real/y"]);
            });
            let _ = std::fs::remove_dir_all(&outside);
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn put_get_list_delete() {
        let root = temp_root("crud");
        with_blob_root(&root, || {
            blob::put("t/a.bin", b"hello").unwrap();
            blob::put("t/a.bin", b"hello world").unwrap();
            blob::put("t/sub/b.bin", b"b").unwrap();
            blob::put("tx/c.bin", b"c").unwrap();
            assert_eq!(blob::get("t/a.bin").unwrap(), b"hello world");
            assert_eq!(blob::get_range("t/a.bin", 6, 100).unwrap(), b"world");
            assert_eq!(blob::get_range("t/a.bin", 0, 5).unwrap(), b"hello");
            assert!(blob::get_range("t/a.bin", 50, 5).unwrap().is_empty());
            assert!(matches!(blob::get("t/none"), Err(BlobError::NotFound(_))));
            assert!(matches!(blob::get("t"), Err(BlobError::NotFound(_))));

            let mut listed = blob::list("t/").unwrap();
            listed.sort();
            assert_eq!(
                listed,
                vec![
                    blob::ObjectMeta {
                        path: "t/a.bin".into(),
                        size: 11
                    },
                    blob::ObjectMeta {
                        path: "t/sub/b.bin".into(),
                        size: 1
                    },
                ]
            );
            assert_eq!(blob::list("t").unwrap().len(), 3);
            assert_eq!(blob::list("").unwrap().len(), 3);
            assert_eq!(blob::list("t/a").unwrap().len(), 1);
            assert!(blob::list("nothing/").unwrap().is_empty());

            blob::delete("t/a.bin").unwrap();
            blob::delete("t/a.bin").unwrap();
            assert!(matches!(blob::get("t/a.bin"), Err(BlobError::NotFound(_))));
        });
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn put_if_absent_conflicts() {
        let root = temp_root("absent");
        with_blob_root(&root, || {
            blob::put_if_absent("x/1", b"first").unwrap();
            assert_eq!(
                blob::put_if_absent("x/1", b"second"),
                Err(BlobError::AlreadyExists("x/1".into()))
            );
            assert_eq!(blob::get("x/1").unwrap(), b"first");
            // No temporary files are left behind or listed.
            assert_eq!(blob::list("").unwrap().len(), 1);
            assert_eq!(std::fs::read_dir(root.join("x")).unwrap().count(), 1);
        });
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Writes one object per call, then reads them back, through a sink.
    #[derive(Default)]
    struct Writer;

    impl Sink for Writer {
        fn write(&mut self, batch: Batch) -> Result<()> {
            blob::put(&format!("w/{}", batch.id), b"x")?;
            Ok(())
        }

        fn commit(&mut self, _: CommitRequest) -> Result<()> {
            blob::list("w/")?;
            Ok(())
        }
    }

    #[test]
    fn a_planned_crash_stops_every_blob_call_from_its_write_on() {
        let root = temp_root("crash");
        let mut sink = NativeSink::new(Writer, &root);
        let rows = crate::RecordBatch::try_from_iter([
            (
                crate::OP_COLUMN,
                std::sync::Arc::new(arrow_array::StringArray::from(vec!["insert"]))
                    as arrow_array::ArrayRef,
            ),
            (
                crate::POS_COLUMN,
                std::sync::Arc::new(arrow_array::BinaryArray::from_iter_values([[1u8]])),
            ),
        ])
        .unwrap();
        let ipc = encode_ipc(&rows);
        let meta = |id: &str| BatchMeta {
            table: crate::Table::new("t"),
            id: id.into(),
            low: vec![1],
            high: vec![1],
            rows: 1,
        };
        sink.crash_at_write(2);
        sink.write(meta("a"), &ipc).unwrap();
        assert_eq!(sink.crashed(), (false, 1));
        assert!(sink.write(meta("b"), &ipc).is_err());
        assert_eq!(sink.crashed(), (true, 2));
        // Reads fail too once it died, and nothing more is written.
        let request = CommitRequest {
            table: "t".into(),
            high: vec![1],
            pipeline: "p".into(),
            epoch: 1,
        };
        assert!(sink.commit(request).is_err());
        assert!(sink.write(meta("c"), &ipc).is_err());
        assert!(root.join("w/a").exists());
        assert!(!root.join("w/b").exists() && !root.join("w/c").exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn blob_error_maps_to_sink_error() {
        use crate::SinkError;
        assert!(matches!(
            SinkError::from(BlobError::Io("x".into())),
            SinkError::Retryable(_)
        ));
        for e in [
            BlobError::NotFound("x".into()),
            BlobError::AlreadyExists("x".into()),
            BlobError::Denied("x".into()),
        ] {
            assert!(matches!(SinkError::from(e), SinkError::Fatal(_)));
        }
    }
}
