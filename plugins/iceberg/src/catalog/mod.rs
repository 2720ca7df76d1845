//! Where the sink's tables are found and committed: the [`Catalog`] seam.
//!
//! - [`fs`]: a file-system catalog on the blob store itself (the default):
//!   a commit is one `put_if_absent` of the next `vN.metadata.json`.
//! - [`rest`]: an Iceberg REST catalog (Polaris, Lakekeeper, Nessie, Glue's
//!   endpoint, ...), reached over HTTP from inside the component: a commit
//!   is the REST `updateTable` call, its requirements checked by the
//!   catalog.
//!
//! Both answer a lost race the same way ([`CommitError::Conflict`]), so the
//! sink's fencing and rebase logic (`table_commit.rs`) is the same for both.

pub mod fs;
pub mod rest;

use iceberg::spec::{TableMetadata, TableMetadataBuildResult};
use iceberg::{Result, TableUpdate};

pub use fs::FsCatalog;
pub use rest::RestCatalog;

/// One loaded version of a table's metadata.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The version number N of the metadata file (`vN.metadata.json` in the
    /// file-system catalog, `NNNNN-<uuid>.metadata.json` in most REST
    /// catalogs; 0 when the name carries none).
    pub version: u64,
    /// The absolute location of that file.
    pub location: String,
    pub metadata: TableMetadata,
}

/// The metadata a commit makes current, with the changes that lead to it
/// from its base: the file-system catalog writes the metadata, a REST
/// catalog is sent the changes (and builds the same metadata itself).
#[derive(Debug, Clone)]
pub struct Next {
    pub metadata: TableMetadata,
    pub changes: Vec<TableUpdate>,
}

impl From<TableMetadataBuildResult> for Next {
    fn from(built: TableMetadataBuildResult) -> Next {
        Next {
            metadata: built.metadata,
            changes: built.changes,
        }
    }
}

/// How a commit ended when it did not succeed.
#[derive(Debug)]
pub enum CommitError {
    /// Another writer committed first: reload and try again.
    Conflict,
    Failed(iceberg::Error),
}

impl From<iceberg::Error> for CommitError {
    fn from(e: iceberg::Error) -> Self {
        CommitError::Failed(e)
    }
}

/// What the sink needs from a catalog. A table is named by its path,
/// `namespace/.../table` (see `destination_path`).
pub trait Catalog {
    /// The current metadata of the table at `table_path`, or `None` if it
    /// does not exist.
    fn load(&self, table_path: &str) -> Result<Option<Loaded>>;
    /// Creates the table with its first metadata (its schema, partition
    /// spec, sort order and properties; a REST catalog chooses the
    /// location and may number the fields anew). [`CommitError::Conflict`]
    /// if it exists already.
    fn create(
        &self,
        table_path: &str,
        metadata: &TableMetadata,
    ) -> std::result::Result<Loaded, CommitError>;
    /// Makes `next` current if `base` still is, or fails with
    /// [`CommitError::Conflict`] if another writer committed since.
    fn commit(
        &self,
        table_path: &str,
        base: &Loaded,
        next: Next,
    ) -> std::result::Result<Loaded, CommitError>;
    /// Where a new table would live if the catalog leaves it to us.
    fn table_location(&self, table_path: &str) -> String;
    /// Deletes metadata files that `loaded` no longer lists, where the sink
    /// owns them (the file-system catalog); a REST catalog keeps its own.
    /// Returns how many were deleted.
    fn remove_old_metadata(&self, table_path: &str, loaded: &Loaded) -> usize;
}
