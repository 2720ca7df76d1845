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

use iceberg::spec::TableMetadata;
use iceberg::{Error, ErrorKind, Result};
use weir_sdk::blob::{self, BlobError};

use super::{Catalog, CommitError, Loaded, Next};
use crate::storage::{Warehouse, blob_error};

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

    /// Whether `v<version>.metadata.json` exists (one byte read, not the file).
    fn exists(&self, table_path: &str, version: u64) -> Result<bool> {
        match blob::get_range(&metadata_file(table_path, version), 0, 1) {
            Ok(_) => Ok(true),
            Err(BlobError::NotFound(_)) => Ok(false),
            Err(e) => Err(blob_error(e)),
        }
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
        next: Next,
    ) -> std::result::Result<Loaded, CommitError> {
        // Snapshot expiry deletes the metadata files older than the
        // metadata log (100 versions by default). A writer that far behind
        // would find its next version's name free again, and its
        // `put_if_absent` would succeed beside a newer history that no load
        // ever reads. The hint (written after every commit, lagging by a
        // few at most) says whether a newer version exists; it is believed
        // only if that version's file is there, so a hint written by hand
        // cannot block every commit.
        if let Some(hinted) = self.hint(table_path)?
            && hinted > base.version
            && self.exists(table_path, hinted)?
        {
            return Err(CommitError::Conflict);
        }
        self.put_version(table_path, base.version + 1, next.metadata)
    }

    fn table_location(&self, table_path: &str) -> String {
        self.warehouse.location(table_path)
    }

    /// Deletes the `v<N>.metadata.json` files older than the oldest one the
    /// metadata log still names; returns how many went.
    fn remove_old_metadata(&self, table_path: &str, loaded: &Loaded) -> usize {
        let version = |name: &str| -> Option<u64> {
            let file = name.rsplit('/').next()?;
            file.strip_prefix('v')?
                .strip_suffix(".metadata.json")?
                .parse()
                .ok()
        };
        let Some(oldest) = loaded
            .metadata
            .metadata_log()
            .iter()
            .filter_map(|log| version(&log.metadata_file))
            .min()
        else {
            return 0;
        };
        let Ok(listed) = blob::list(&format!("{table_path}/metadata/")) else {
            return 0;
        };
        let mut removed = 0;
        for object in listed {
            if version(&object.path).is_some_and(|v| v < oldest && v < loaded.version)
                && blob::delete(&object.path).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{
        FormatVersion, NestedField, PrimitiveType, Schema, SortOrder, TableMetadataBuilder, Type,
        UnboundPartitionSpec,
    };

    fn metadata(location: &str) -> TableMetadata {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            ])
            .build()
            .unwrap();
        TableMetadataBuilder::new(
            schema,
            UnboundPartitionSpec::builder().build(),
            SortOrder::unsorted_order(),
            location.to_string(),
            FormatVersion::V2,
            Default::default(),
        )
        .unwrap()
        .build()
        .unwrap()
        .metadata
    }

    /// The same metadata again, as a next version.
    fn same(loaded: &Loaded) -> Next {
        Next {
            metadata: loaded.metadata.clone(),
            changes: Vec::new(),
        }
    }

    #[test]
    fn a_writer_behind_versions_removed_as_old_loses_the_race() {
        let dir = crate::tests::root("catalog-behind");
        let url = format!("file://{}", dir.display());
        weir_sdk::native::with_blob_root(&dir, || {
            let catalog = FsCatalog::new(Warehouse::new(&url).unwrap());
            let table = "ns/t";
            let first = catalog
                .create(table, &metadata(&catalog.table_location(table)))
                .unwrap();
            let mut head = first.clone();
            for _ in 0..5 {
                head = catalog.commit(table, &head, same(&head)).unwrap();
            }
            assert_eq!(head.version, 6);
            // What expiry does to versions older than the metadata log.
            for old in 1..=3 {
                blob::delete(&metadata_file(table, old)).unwrap();
            }
            // A writer still at version 1: its next name, v2, is free again.
            match catalog.commit(table, &first, same(&first)) {
                Err(CommitError::Conflict) => {}
                other => panic!("a writer five versions behind committed: {other:?}"),
            }
            assert!(!catalog.exists(table, 2).unwrap(), "v2 was written again");
            assert_eq!(catalog.load(table).unwrap().unwrap().version, 6);
            // A hint naming a version that does not exist blocks nobody.
            blob::put(&format!("{table}/metadata/{HINT}"), b"99").unwrap();
            let next = catalog.commit(table, &head, same(&head)).unwrap();
            assert_eq!(next.version, 7);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

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
