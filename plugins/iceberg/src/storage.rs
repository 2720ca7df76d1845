//! The `iceberg` crate's storage trait over the host's scoped blob store.
//!
//! Iceberg metadata records absolute locations, and readers (DuckDB,
//! pyiceberg, Spark) open those locations themselves. The plugin only sees
//! relative paths under the root the operator granted, so the operator tells
//! it under which URL readers see that root (`warehouse`, for example
//! `file:///srv/lake` or `s3://bucket/lake`). Every location the crate hands
//! us starts with that URL; the rest is the blob path.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use weir_sdk::blob::{self, BlobError};

/// Maps between the absolute locations Iceberg records and blob paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warehouse {
    /// The URL readers reach the blob store root at, without a trailing `/`.
    url: String,
}

impl Warehouse {
    /// `url` is where readers see the granted root, e.g. `file:///srv/lake`.
    pub fn new(url: &str) -> std::result::Result<Warehouse, String> {
        let url = url.trim().trim_end_matches('/');
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(format!(
                "{url:?} is not a URL: use the address readers reach the blob store at, \
                 such as file:///srv/lake or s3://bucket/lake"
            ));
        };
        if scheme.is_empty() || rest.is_empty() {
            return Err(format!("{url:?}: a scheme and a location are required"));
        }
        Ok(Warehouse { url: url.into() })
    }

    /// The absolute location of a blob path.
    pub fn location(&self, path: &str) -> String {
        format!("{}/{}", self.url, path)
    }

    /// The blob path of an absolute location under the warehouse.
    pub fn path<'a>(&self, location: &'a str) -> Result<&'a str> {
        location
            .strip_prefix(self.url.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|rest| !rest.is_empty())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!(
                        "{location} lies outside the warehouse {}: the table was written with \
                         another `warehouse` setting",
                        self.url
                    ),
                )
            })
    }

    /// A FileIO whose every call goes to the blob store.
    pub fn file_io(&self) -> FileIO {
        FileIOBuilder::new(Arc::new(BlobStorageFactory {
            warehouse: self.clone(),
        }))
        .build()
    }
}

thread_local! {
    /// Set when a blob call failed with `io` (cleared by [`take_io_failure`]).
    /// A component instance runs one call at a time on one thread; per
    /// thread (not per process) keeps native tests that run side by side
    /// from seeing each other's failures.
    static IO_FAILED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set when a read found no file where the table's metadata named one
    /// (cleared by [`take_missing_file`]): the crate's Parquet reader wraps
    /// the error and loses its retryable flag on the way.
    static MISSING_FILE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a file named by table metadata was found missing on this thread
/// since the last time this was asked.
pub fn take_missing_file() -> bool {
    MISSING_FILE.with(|missing| missing.replace(false))
}

/// Whether a blob call failed with `io` on this thread since the last time
/// this was asked.
pub fn take_io_failure() -> bool {
    IO_FAILED.with(|failed| failed.replace(false))
}

/// Converts a blob error, keeping "not found" recognizable for the crate.
///
/// A file that is not found was named by the table metadata the reader
/// loaded (a check for existence does not come here). Snapshot expiry
/// deletes only files the newest metadata no longer names, so the usual
/// reason is an expiry in another process (`weir maintain` beside `weir
/// run`) since that load: retryable, and the retry reloads the table. A
/// file missing from the newest metadata too fails every retry, naming it.
pub fn blob_error(e: BlobError) -> Error {
    let kind = match e {
        BlobError::NotFound(_) => ErrorKind::DataInvalid,
        BlobError::AlreadyExists(_) => ErrorKind::CatalogCommitConflicts,
        BlobError::Denied(_) => ErrorKind::Unexpected,
        BlobError::Io(_) => ErrorKind::Unexpected,
    };
    let io = matches!(e, BlobError::Io(_));
    let missing = matches!(e, BlobError::NotFound(_));
    if io {
        IO_FAILED.with(|failed| failed.set(true));
    }
    if missing {
        MISSING_FILE.with(|flag| flag.set(true));
    }
    let error = Error::new(kind, e.to_string());
    if io || missing {
        error.with_retryable(true)
    } else {
        error
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct BlobStorageFactory {
    warehouse: Warehouse,
}

#[typetag::serde(name = "weir-blob")]
impl StorageFactory for BlobStorageFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(BlobStorage {
            warehouse: self.warehouse.clone(),
        }))
    }
}

/// The host's blob store as Iceberg storage. Calls are synchronous host calls
/// wrapped in futures that are ready at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlobStorage {
    warehouse: Warehouse,
}

#[async_trait]
#[typetag::serde(name = "weir-blob")]
impl Storage for BlobStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        let path = self.warehouse.path(path)?;
        match blob::get_range(path, 0, 0) {
            Ok(_) => Ok(true),
            Err(BlobError::NotFound(_)) => Ok(false),
            Err(e) => Err(blob_error(e)),
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let path = self.warehouse.path(path)?;
        // The blob store has no stat call; listing the exact path finds it.
        let found = blob::list(path).map_err(blob_error)?;
        found
            .into_iter()
            .find(|o| o.path == path)
            .map(|o| FileMetadata { size: o.size })
            .ok_or_else(|| Error::new(ErrorKind::DataInvalid, format!("no object at {path}")))
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let path = self.warehouse.path(path)?;
        blob::get(path).map(Bytes::from).map_err(blob_error)
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let path = self.warehouse.path(path)?;
        Ok(Box::new(BlobRead { path: path.into() }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let path = self.warehouse.path(path)?;
        blob::put(path, &bs).map_err(blob_error)
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let path = self.warehouse.path(path)?;
        Ok(Box::new(BlobWrite {
            path: path.into(),
            buffer: Vec::new(),
            closed: false,
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let path = self.warehouse.path(path)?;
        blob::delete(path).map_err(blob_error)
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let prefix = self.warehouse.path(path)?;
        let prefix = format!("{}/", prefix.trim_end_matches('/'));
        for object in blob::list(&prefix).map_err(blob_error)? {
            blob::delete(&object.path).map_err(blob_error)?;
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        self.warehouse.path(path)?;
        Ok(InputFile::new(Arc::new(self.clone()), path.into()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        self.warehouse.path(path)?;
        Ok(OutputFile::new(Arc::new(self.clone()), path.into()))
    }
}

struct BlobRead {
    path: String,
}

#[async_trait]
impl FileRead for BlobRead {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let len = range.end.saturating_sub(range.start);
        blob::get_range(&self.path, range.start, len)
            .map(Bytes::from)
            .map_err(blob_error)
    }
}

/// Buffers a file and puts it in one atomic call on close: a reader (or a
/// crash) never sees half a file.
struct BlobWrite {
    path: String,
    buffer: Vec<u8>,
    closed: bool,
}

#[async_trait]
impl FileWrite for BlobWrite {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        if self.closed {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("{}: write after close", self.path),
            ));
        }
        self.buffer.extend_from_slice(&bs);
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        if self.closed {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("{}: closed twice", self.path),
            ));
        }
        self.closed = true;
        let data = std::mem::take(&mut self.buffer);
        blob::put(&self.path, &data).map_err(blob_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_map_to_blob_paths() {
        let w = Warehouse::new("file:///srv/lake/").unwrap();
        assert_eq!(w.location("a/b"), "file:///srv/lake/a/b");
        assert_eq!(w.path("file:///srv/lake/a/b").unwrap(), "a/b");
        assert!(w.path("file:///srv/lakehouse/a").is_err());
        assert!(w.path("file:///srv/lake").is_err());
        assert!(w.path("s3://other/a").is_err());
        assert!(Warehouse::new("/srv/lake").is_err());
    }
}
