//! A file-system catalog on the host's blob store (the `iceberg` crate has
//! none that works over an arbitrary store).
//!
//! A table lives at `<warehouse>/<namespace...>/<table>`; its metadata at
//! `metadata/v<N>.metadata.json`, N counting from 1. Committing version N+1 is
//! one atomic `put_if_absent` of its file: of two writers racing from version
//! N exactly one wins, the other learns it lost and retries on the new base.
//! `metadata/version-hint.text` (N, for readers such as DuckDB's
//! `iceberg_scan` on the table folder) is written after each commit; it may lag
//! after a crash, so loading starts at the hint and probes forward.
//!
//! The [`Catalog`] trait is the seam for a REST catalog later: same calls,
//! the commit becomes the REST `updateTable` with its own conflict answer.

use iceberg::spec::TableMetadata;
use iceberg::{Error, ErrorKind, Result};
use weir_sdk::blob::{self, BlobError};

use crate::storage::{Warehouse, blob_error};

/// One loaded version of a table's metadata.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The version number N of `v<N>.metadata.json`.
    pub version: u64,
    /// The absolute location of that file.
    pub location: String,
    pub metadata: TableMetadata,
}

/// How a commit ended when it did not succeed.
#[derive(Debug)]
pub enum CommitError {
    /// Another writer committed the version first: reload and try again.
    Conflict,
    Failed(Error),
}

impl From<Error> for CommitError {
    fn from(e: Error) -> Self {
        CommitError::Failed(e)
    }
}

/// What the sink needs from a catalog.
pub trait Catalog {
    /// The current metadata of the table at `table_path` (relative to the
    /// warehouse), or `None` if it does not exist.
    fn load(&self, table_path: &str) -> Result<Option<Loaded>>;
    /// Creates the table with its first metadata.
    fn create(
        &self,
        table_path: &str,
        metadata: &TableMetadata,
    ) -> std::result::Result<Loaded, CommitError>;
    /// Replaces `base` by `metadata` atomically, or fails with
    /// [`CommitError::Conflict`] if `base` is no longer current.
    fn commit(
        &self,
        table_path: &str,
        base: &Loaded,
        metadata: TableMetadata,
    ) -> std::result::Result<Loaded, CommitError>;
    /// The absolute location of a table.
    fn table_location(&self, table_path: &str) -> String;
}

/// The file-system catalog: commits are `put_if_absent` of the next version.
#[derive(Debug, Clone)]
pub struct FsCatalog {
    warehouse: Warehouse,
}

const HINT: &str = "version-hint.text";

fn metadata_file(table_path: &str, version: u64) -> String {
    format!("{table_path}/metadata/v{version}.metadata.json")
}

/// The version of a `.../metadata/v<N>.metadata.json` path.
fn parse_version(table_path: &str, path: &str) -> Option<u64> {
    let name = path
        .strip_prefix(table_path)?
        .strip_prefix("/metadata/v")?
        .strip_suffix(".metadata.json")?;
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

impl FsCatalog {
    pub fn new(warehouse: Warehouse) -> Self {
        FsCatalog { warehouse }
    }

    fn read_version(&self, table_path: &str, version: u64) -> Result<Option<Loaded>> {
        let path = metadata_file(table_path, version);
        let bytes = match blob::get(&path) {
            Ok(bytes) => bytes,
            Err(BlobError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(blob_error(e)),
        };
        let metadata: TableMetadata = serde_json::from_slice(&bytes).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("{path}: not valid Iceberg table metadata: {e}"),
            )
        })?;
        Ok(Some(Loaded {
            version,
            location: self.warehouse.location(&path),
            metadata,
        }))
    }

    /// The hinted version, if the hint exists and parses.
    fn hint(&self, table_path: &str) -> Result<Option<u64>> {
        match blob::get(&format!("{table_path}/metadata/{HINT}")) {
            Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).trim().parse().ok()),
            Err(BlobError::NotFound(_)) => Ok(None),
            Err(e) => Err(blob_error(e)),
        }
    }

    fn newest_listed(&self, table_path: &str) -> Result<Option<u64>> {
        let listed = blob::list(&format!("{table_path}/metadata/")).map_err(blob_error)?;
        Ok(listed
            .iter()
            .filter_map(|o| parse_version(table_path, &o.path))
            .max())
    }

    fn write_hint(&self, table_path: &str, version: u64) {
        // Only a hint: readers that use it see the table one commit late at
        // worst, and our own loads probe past it.
        let _ = blob::put(
            &format!("{table_path}/metadata/{HINT}"),
            version.to_string().as_bytes(),
        );
    }

    fn put_version(
        &self,
        table_path: &str,
        version: u64,
        metadata: TableMetadata,
    ) -> std::result::Result<Loaded, CommitError> {
        let path = metadata_file(table_path, version);
        let bytes = serde_json::to_vec(&metadata).map_err(|e| {
            Error::new(
                ErrorKind::Unexpected,
                format!("cannot serialize table metadata: {e}"),
            )
        })?;
        match blob::put_if_absent(&path, &bytes) {
            Ok(()) => {}
            Err(BlobError::AlreadyExists(_)) => return Err(CommitError::Conflict),
            Err(e) => return Err(CommitError::Failed(blob_error(e))),
        }
        self.write_hint(table_path, version);
        Ok(Loaded {
            version,
            location: self.warehouse.location(&path),
            metadata,
        })
    }
}

impl Catalog for FsCatalog {
    fn load(&self, table_path: &str) -> Result<Option<Loaded>> {
        let start = match self.hint(table_path)? {
            Some(v) if v >= 1 => Some(v),
            _ => self.newest_listed(table_path)?,
        };
        let Some(mut version) = start else {
            return Ok(None);
        };
        let Some(mut loaded) = self.read_version(table_path, version)? else {
            // A hint ahead of the files (written by hand?): trust the files.
            return match self.newest_listed(table_path)? {
                Some(v) => self.read_version(table_path, v),
                None => Ok(None),
            };
        };
        // The hint may lag behind the newest commit.
        loop {
            version += 1;
            match self.read_version(table_path, version)? {
                Some(next) => loaded = next,
                None => return Ok(Some(loaded)),
            }
        }
    }

    fn create(
        &self,
        table_path: &str,
        metadata: &TableMetadata,
    ) -> std::result::Result<Loaded, CommitError> {
        self.put_version(table_path, 1, metadata.clone())
    }

    fn commit(
        &self,
        table_path: &str,
        base: &Loaded,
        metadata: TableMetadata,
    ) -> std::result::Result<Loaded, CommitError> {
        self.put_version(table_path, base.version + 1, metadata)
    }

    fn table_location(&self, table_path: &str) -> String {
        self.warehouse.location(table_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        assert_eq!(
            parse_version("a/b", "a/b/metadata/v12.metadata.json"),
            Some(12)
        );
        assert_eq!(parse_version("a/b", "a/b/metadata/v.metadata.json"), None);
        assert_eq!(parse_version("a/b", "a/bc/metadata/v1.metadata.json"), None);
        assert_eq!(parse_version("a/b", "a/b/metadata/version-hint.text"), None);
        assert_eq!(parse_version("a/b", "a/b/metadata/v1x.metadata.json"), None);
    }
}
