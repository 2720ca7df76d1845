//! The embedded position store (redb): one file per host, every write a
//! durable (fsync'd), atomic transaction.

// redb's error type is large; its errors are rare and end the run, so
// boxing them buys nothing.
#![allow(clippy::result_large_err)]

use std::path::{Path, PathBuf};

use redb::{Database, ReadableTable, TableDefinition};

use weir_core::commit::MAX_EPOCH;
use weir_core::position::Position;

use super::{Entry, PositionStore, StoreError, Stored};

const POSITIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("positions");
const EPOCHS: TableDefinition<&str, u64> = TableDefinition::new("epochs");
const SEPARATOR: char = '\u{1f}';

/// The embedded store: one redb file per host, every write a durable
/// (fsync'd), atomic transaction. Keys are `pipeline / sink / table`.
pub struct EmbeddedStore {
    db: Database,
    path: PathBuf,
}

impl EmbeddedStore {
    /// Opens (or creates) the store file. A second host opening the same
    /// file gets a clear error: the file is locked while open.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| StoreError::Io {
                path: path.to_path_buf(),
                detail: format!("cannot create its folder: {e}"),
            })?;
        }
        let db = Database::create(path).map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let store = EmbeddedStore {
            db,
            path: path.to_path_buf(),
        };
        // Create both tables up front so readers never see them missing.
        store.write(|txn| {
            txn.open_table(POSITIONS)?;
            txn.open_table(EPOCHS)?;
            Ok(())
        })?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write<T>(
        &self,
        body: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.io(e.into()))?;
        let value = body(&txn).map_err(|e| self.io(e))?;
        txn.commit().map_err(|e| self.io(e.into()))?;
        Ok(value)
    }

    fn read<T>(
        &self,
        body: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.io(e.into()))?;
        body(&txn).map_err(|e| self.io(e))
    }

    fn io(&self, error: redb::Error) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            detail: error.to_string(),
        }
    }
}

impl PositionStore for EmbeddedStore {
    fn next_epoch(&self, pipeline: &str) -> Result<u64, StoreError> {
        let next = self.write(|txn| {
            let mut epochs = txn.open_table(EPOCHS)?;
            let current = epochs.get(pipeline)?.map_or(0, |v| v.value());
            // Checked: an epoch store at the top of the range must refuse,
            // not wrap to an epoch every sink has already seen.
            let Some(next) = current.checked_add(1).filter(|n| *n <= MAX_EPOCH) else {
                return Ok(None);
            };
            epochs.insert(pipeline, next)?;
            Ok(Some(next))
        })?;
        next.ok_or_else(|| StoreError::EpochsExhausted {
            pipeline: pipeline.to_string(),
        })
    }

    fn raise_epoch(&self, pipeline: &str, at_least: u64) -> Result<u64, StoreError> {
        self.write(|txn| {
            let mut epochs = txn.open_table(EPOCHS)?;
            let current = epochs.get(pipeline)?.map_or(0, |v| v.value());
            let epoch = current.max(at_least);
            epochs.insert(pipeline, epoch)?;
            Ok(epoch)
        })
    }

    fn current_epoch(&self, pipeline: &str) -> Result<Option<u64>, StoreError> {
        self.read(|txn| {
            let epochs = txn.open_table(EPOCHS)?;
            Ok(epochs.get(pipeline)?.map(|v| v.value()))
        })
    }

    fn get(&self, pipeline: &str, sink: &str, table: &str) -> Result<Option<Position>, StoreError> {
        let key = key(pipeline, sink, table);
        self.read(|txn| {
            let positions = txn.open_table(POSITIONS)?;
            Ok(positions
                .get(key.as_str())?
                .map(|v| Position::from_bytes(v.value().to_vec())))
        })
    }

    fn put_all(&self, pipeline: &str, entries: &[Entry]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        self.write(|txn| {
            let mut positions = txn.open_table(POSITIONS)?;
            for entry in entries {
                let key = key(pipeline, &entry.sink, &entry.table);
                match &entry.position {
                    Some(p) => {
                        positions.insert(key.as_str(), p.as_bytes())?;
                    }
                    None => {
                        positions.remove(key.as_str())?;
                    }
                }
            }
            Ok(())
        })
    }

    fn list(&self, pipeline: &str) -> Result<Vec<Stored>, StoreError> {
        let prefix = format!("{pipeline}{SEPARATOR}");
        self.read(|txn| {
            let positions = txn.open_table(POSITIONS)?;
            let mut out = Vec::new();
            for item in positions.range(prefix.as_str()..)? {
                let (k, v) = item?;
                let Some(rest) = k.value().strip_prefix(prefix.as_str()) else {
                    break;
                };
                let Some((sink, table)) = rest.split_once(SEPARATOR) else {
                    continue;
                };
                out.push(Stored {
                    sink: sink.to_string(),
                    table: table.to_string(),
                    position: Position::from_bytes(v.value().to_vec()),
                });
            }
            Ok(out)
        })
    }
}

fn key(pipeline: &str, sink: &str, table: &str) -> String {
    format!("{pipeline}{SEPARATOR}{sink}{SEPARATOR}{table}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_source::commit_order::stream_position;

    #[test]
    fn positions_survive_reopening_and_epochs_grow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/weir.redb");
        {
            let store = EmbeddedStore::open(&path).unwrap();
            assert_eq!(store.next_epoch("p").unwrap(), 1);
            assert_eq!(store.next_epoch("p").unwrap(), 2);
            assert_eq!(store.next_epoch("other").unwrap(), 1);
            store
                .put_all(
                    "p",
                    &[
                        Entry {
                            sink: "lake".into(),
                            table: "shop.orders".into(),
                            position: Some(stream_position(7, 1)),
                        },
                        Entry {
                            sink: "lake".into(),
                            table: "shop.items".into(),
                            position: Some(stream_position(3, 0)),
                        },
                    ],
                )
                .unwrap();
        }
        let store = EmbeddedStore::open(&path).unwrap();
        assert_eq!(store.current_epoch("p").unwrap(), Some(2));
        assert_eq!(store.raise_epoch("p", 9).unwrap(), 9);
        assert_eq!(store.raise_epoch("p", 3).unwrap(), 9);
        assert_eq!(store.next_epoch("p").unwrap(), 10);
        assert_eq!(
            store.get("p", "lake", "shop.orders").unwrap(),
            Some(stream_position(7, 1))
        );
        assert_eq!(store.get("q", "lake", "shop.orders").unwrap(), None);
        assert_eq!(store.list("p").unwrap().len(), 2);
        assert!(store.list("other").unwrap().is_empty());
        store
            .put_all(
                "p",
                &[Entry {
                    sink: "lake".into(),
                    table: "shop.orders".into(),
                    position: None,
                }],
            )
            .unwrap();
        assert_eq!(store.get("p", "lake", "shop.orders").unwrap(), None);
    }

    #[test]
    fn the_last_epoch_is_refused_rather_than_wrapped() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("weir.redb")).unwrap();
        assert_eq!(store.raise_epoch("p", MAX_EPOCH).unwrap(), MAX_EPOCH);
        let error = store.next_epoch("p").unwrap_err().to_string();
        assert!(error.contains("pipeline `p`"), "{error}");
        assert_eq!(store.current_epoch("p").unwrap(), Some(MAX_EPOCH));
    }

    #[test]
    fn a_second_host_on_the_same_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weir.redb");
        let _first = EmbeddedStore::open(&path).unwrap();
        let second = EmbeddedStore::open(&path);
        assert!(second.is_err());
    }
}
