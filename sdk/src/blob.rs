//! Object storage under the root the operator granted this sink.
//!
//! Paths are relative and `/`-separated, for example `orders/0001.parquet`,
//! and stay inside the root: absolute paths, `.`, `..` and empty segments,
//! backslashes, and links leading out of the root are refused with
//! [`BlobError::Denied`]. Inside WebAssembly these calls go to the host's
//! store (a local directory, S3, GCS, Azure, ...); natively they go to the
//! directory given to [`NativeSink`](crate::native::NativeSink).

use std::fmt;

/// Why a blob call failed. Converts into a [`SinkError`](crate::SinkError)
/// with `?`: [`BlobError::Io`] becomes `Retryable`, the others `Fatal`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BlobError {
    /// No object at that path.
    NotFound(String),
    /// [`put_if_absent`] found an object already there.
    AlreadyExists(String),
    /// The path is outside the granted root, or malformed, or no store was
    /// granted.
    Denied(String),
    /// The store failed; usually worth a retry.
    Io(String),
}

impl fmt::Display for BlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobError::NotFound(m) => write!(f, "blob not found: {m}"),
            BlobError::AlreadyExists(m) => write!(f, "blob already exists: {m}"),
            BlobError::Denied(m) => write!(f, "blob access denied: {m}"),
            BlobError::Io(m) => write!(f, "blob store failed: {m}"),
        }
    }
}

impl std::error::Error for BlobError {}

/// An object found by [`list`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectMeta {
    /// Path relative to the granted root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// Reads a whole object.
pub fn get(path: &str) -> Result<Vec<u8>, BlobError> {
    imp::get(path)
}

/// Reads `len` bytes starting at `offset` (fewer at the end of the object,
/// none past it).
pub fn get_range(path: &str, offset: u64, len: u64) -> Result<Vec<u8>, BlobError> {
    imp::get_range(path, offset, len)
}

/// Writes an object, replacing any object at that path. Atomic: a reader sees
/// the old object or the new one, never a part.
pub fn put(path: &str, data: &[u8]) -> Result<(), BlobError> {
    imp::put(path, data)
}

/// Writes an object only if none exists at that path, atomically; fails with
/// [`BlobError::AlreadyExists`] otherwise. The building block for a commit
/// that two writers may race for.
pub fn put_if_absent(path: &str, data: &[u8]) -> Result<(), BlobError> {
    imp::put_if_absent(path, data)
}

/// Lists every object whose path starts with `prefix` (a folder path such as
/// `orders/`, or empty for everything), in no particular order.
pub fn list(prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
    imp::list(prefix)
}

/// Deletes an object; deleting a missing object is success.
pub fn delete(path: &str) -> Result<(), BlobError> {
    imp::delete(path)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{BlobError, ObjectMeta};
    use crate::__private::sink_plugin::weir::sink::blobstore as wit;

    fn convert(e: wit::BlobError) -> BlobError {
        match e {
            wit::BlobError::NotFound(m) => BlobError::NotFound(m),
            wit::BlobError::AlreadyExists(m) => BlobError::AlreadyExists(m),
            wit::BlobError::Denied(m) => BlobError::Denied(m),
            wit::BlobError::Io(m) => BlobError::Io(m),
        }
    }

    pub fn get(path: &str) -> Result<Vec<u8>, BlobError> {
        wit::get(path).map_err(convert)
    }

    pub fn get_range(path: &str, offset: u64, len: u64) -> Result<Vec<u8>, BlobError> {
        wit::get_range(path, offset, len).map_err(convert)
    }

    pub fn put(path: &str, data: &[u8]) -> Result<(), BlobError> {
        wit::put(path, data).map_err(convert)
    }

    pub fn put_if_absent(path: &str, data: &[u8]) -> Result<(), BlobError> {
        wit::put_if_absent(path, data).map_err(convert)
    }

    pub fn list(prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        let found = wit::list(prefix).map_err(convert)?;
        Ok(found
            .into_iter()
            .map(|m| ObjectMeta {
                path: m.path,
                size: m.size,
            })
            .collect())
    }

    pub fn delete(path: &str) -> Result<(), BlobError> {
        wit::delete(path).map_err(convert)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    pub use crate::native::store::{delete, get, get_range, list, put, put_if_absent};
}
