//! The key index of an upsert table: for every live key, the data file and
//! row that hold it, so a commit can delete the old row of a key by position
//! instead of by an equality delete every reader must apply to every older
//! file.
//!
//! - A key is identified by a 128-bit SipHash-1-3 of its key columns' Arrow
//!   row bytes, keyed by a random secret per index (stored with its
//!   checkpoint, new on every rebuild), so nobody can choose keys that
//!   collide. For n keys the chance that any two collide is below
//!   n² / 2¹²⁹: under 10⁻²¹ at a billion keys. A collision would make a
//!   change to one key delete the row of the other.
//! - An entry is the hash and a (file number, row) pair: 24 bytes in a
//!   hash table that takes the hash's low bits as its bucket hash. With the
//!   table's control bytes and load factor that is 29 to 57 bytes per key
//!   (half-full right after the table doubled), plus one path per data
//!   file (42 bytes per key at 10M keys: `benches/index_memory.rs`).
//! - The index reflects one snapshot. It is a cache; the table is the truth.
//!   [`Index::rebuild`] reads it back from the table (key columns of every
//!   live data file, minus rows in live position-delete files and rows
//!   killed by a newer equality delete, so tables written with equality
//!   deletes index right too). [`Index::catch_up`] replays the snapshots
//!   after the index's own: only their added files, and only when every one
//!   of them is an append or overwrite that removed no file (anything else,
//!   such as a compaction's `replace`, needs a rebuild).
//! - Checkpoints (see [`Index::encode`]) go to `_weir/index/<table path>/
//!   <snapshot id>.idx` in the blob store, outside the table's folder so no
//!   reader or orphan-file clean-up of the table meets them. One is written
//!   only for a snapshot already committed, and older ones are removed only
//!   after it, so after a crash at any point the newest readable checkpoint
//!   names a snapshot of the table and replaying from there gives the index
//!   of the current snapshot.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::DataType;
use futures::TryStreamExt;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::{FileIO, FileMetadata};
use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, ManifestList, ManifestStatus, Operation, SnapshotRef,
    Struct, TableMetadata,
};
use iceberg::{Error, ErrorKind, Result};
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use siphasher::sip128::SipHasher13;
use weir_sdk::blob::{self, BlobError};

/// Field id of `file_path` in a position-delete file (Iceberg spec).
pub const FILE_PATH_FIELD_ID: i32 = 2147483546;
/// Field id of `pos` in a position-delete file (Iceberg spec).
pub const POS_FIELD_ID: i32 = 2147483545;

/// The 128-bit identity of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash(pub u64, pub u64);

impl Hash for KeyHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already a keyed hash: its low half is as good as any bucket hash.
        state.write_u64(self.0);
    }
}

/// A hasher that passes a `u64` through: [`KeyHash`] is already random.
#[derive(Default)]
pub struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Where a key's live row is: a file of the index's file table and a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    pub file: u32,
    pub row: u32,
}

/// The entries of an index.
pub type KeyMap = HashMap<KeyHash, Location, BuildHasherDefault<PassThrough>>;

/// Turns key columns into [`KeyHash`]es.
pub struct KeyHasher {
    secret: [u8; 16],
    field_ids: Vec<i32>,
    types: Vec<DataType>,
    converter: RowConverter,
}

impl KeyHasher {
    /// A hasher for keys of `types` (the table's Arrow types of the key
    /// fields `field_ids`), keyed by `secret`.
    pub fn new(secret: [u8; 16], field_ids: Vec<i32>, types: Vec<DataType>) -> Result<Self> {
        let converter = RowConverter::new(types.iter().cloned().map(SortField::new).collect())
            .map_err(|e| arrow_error("cannot encode the key columns", e))?;
        Ok(KeyHasher {
            secret,
            field_ids,
            types,
            converter,
        })
    }

    /// A hasher with a fresh random secret.
    pub fn random(field_ids: Vec<i32>, types: Vec<DataType>) -> Result<Self> {
        Self::new(*uuid::Uuid::new_v4().as_bytes(), field_ids, types)
    }

    /// The secret the hashes are keyed with.
    #[cfg(test)]
    pub(crate) fn secret(&self) -> [u8; 16] {
        self.secret
    }

    /// The key fields' ids, in key order.
    pub fn field_ids(&self) -> &[i32] {
        &self.field_ids
    }

    /// The hash of every row of `columns` (the key columns in key order;
    /// cast to the key types where a file holds them narrower).
    pub fn hash_columns(&self, columns: &[ArrayRef]) -> Result<Vec<KeyHash>> {
        let mut cast = Vec::with_capacity(columns.len());
        for (column, data_type) in columns.iter().zip(&self.types) {
            cast.push(if column.data_type() == data_type {
                column.clone()
            } else {
                arrow_cast::cast(column, data_type)
                    .map_err(|e| arrow_error("cannot cast a key column", e))?
            });
        }
        let rows = self
            .converter
            .convert_columns(&cast)
            .map_err(|e| arrow_error("cannot encode the key columns", e))?;
        let sip = SipHasher13::new_with_key(&self.secret);
        Ok(rows
            .iter()
            .map(|row| {
                let (a, b) = sip.hash(row.as_ref()).as_u64();
                KeyHash(a, b)
            })
            .collect())
    }

    /// What a checkpoint must match to be usable with this table's keys.
    fn signature(&self) -> String {
        format!("{:?} {:?}", self.field_ids, self.types)
    }
}

/// One data file the index points into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedFile {
    /// Its absolute location, as the manifests record it.
    pub path: String,
    /// Its data sequence number.
    pub sequence_number: i64,
    /// Its partition (empty for an unpartitioned table): a position delete
    /// against the file must be of the same partition.
    pub partition: Struct,
}

/// The key index of one table at one snapshot.
pub struct Index {
    table_uuid: uuid::Uuid,
    snapshot_id: Option<i64>,
    hasher: KeyHasher,
    files: Vec<IndexedFile>,
    file_numbers: HashMap<String, u32>,
    entries: KeyMap,
    /// Commits and changed rows applied since the newest stored checkpoint.
    commits_since_checkpoint: u64,
    changes_since_checkpoint: u64,
}

/// The key (identifier) field ids of `schema`, in ascending order: the
/// order in which key columns are hashed. The iceberg crate keeps them in a
/// hash set, whose order differs from one load of the same metadata to the
/// next; a key hashed in one order is not found by a look-up in the other,
/// and the commit would write no position delete for it (a duplicate row).
pub fn key_field_ids(schema: &iceberg::spec::Schema) -> Vec<i32> {
    let mut ids: Vec<i32> = schema.identifier_field_ids().collect();
    ids.sort_unstable();
    ids
}

/// The key field ids and their Arrow types in the table's current schema.
pub fn key_types(metadata: &TableMetadata, key_ids: &[i32]) -> Result<Vec<DataType>> {
    let schema = metadata.current_schema();
    let arrow =
        crate::schema::arrow_schema(schema).map_err(|e| Error::new(ErrorKind::DataInvalid, e))?;
    key_ids
        .iter()
        .map(|id| {
            let at = schema
                .as_struct()
                .fields()
                .iter()
                .position(|f| f.id == *id)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::DataInvalid,
                        format!("key field id {id} is not a top-level field of the table"),
                    )
                })?;
            Ok(arrow.field(at).data_type().clone())
        })
        .collect()
}

fn arrow_error(context: &str, e: arrow_schema::ArrowError) -> Error {
    Error::new(ErrorKind::DataInvalid, format!("{context}: {e}"))
}

fn parquet_error(path: &str, e: parquet::errors::ParquetError) -> Error {
    Error::new(ErrorKind::DataInvalid, format!("{path}: {e}"))
}

/// Why the index cannot be brought to the current snapshot by replay.
pub type RebuildReason = String;

impl Index {
    /// An empty index for `metadata`'s table, at no snapshot.
    pub fn empty(metadata: &TableMetadata, key_ids: &[i32]) -> Result<Index> {
        let types = key_types(metadata, key_ids)?;
        Ok(Index {
            table_uuid: metadata.uuid(),
            snapshot_id: None,
            hasher: KeyHasher::random(key_ids.to_vec(), types)?,
            files: Vec::new(),
            file_numbers: HashMap::new(),
            entries: KeyMap::default(),
            commits_since_checkpoint: 0,
            changes_since_checkpoint: 0,
        })
    }

    /// The snapshot the index reflects (`None`: a table without snapshots).
    pub fn snapshot_id(&self) -> Option<i64> {
        self.snapshot_id
    }

    /// Live keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    /// The file and row of a live key.
    pub fn get(&self, key: &KeyHash) -> Option<(&str, u32)> {
        self.entries
            .get(key)
            .map(|l| (self.files[l.file as usize].path.as_str(), l.row))
    }

    /// The data file and row of a live key.
    pub fn locate(&self, key: &KeyHash) -> Option<(&IndexedFile, u32)> {
        self.entries
            .get(key)
            .map(|l| (&self.files[l.file as usize], l.row))
    }

    /// Every live key and where it is (for tests and checks).
    pub fn locations(&self) -> impl Iterator<Item = (KeyHash, &str, u32)> {
        self.entries
            .iter()
            .map(|(k, l)| (*k, self.files[l.file as usize].path.as_str(), l.row))
    }

    fn add_file(&mut self, path: &str, sequence_number: i64, partition: &Struct) -> Result<u32> {
        if let Some(&n) = self.file_numbers.get(path) {
            return Ok(n);
        }
        let n = u32::try_from(self.files.len()).map_err(|_| {
            Error::new(
                ErrorKind::Unexpected,
                "more than 2^32 data files in one index",
            )
        })?;
        self.files.push(IndexedFile {
            path: path.to_string(),
            sequence_number,
            partition: partition.clone(),
        });
        self.file_numbers.insert(path.to_string(), n);
        Ok(n)
    }

    /// Reads the index of `metadata`'s current snapshot from the table
    /// itself: every live data file's key columns, minus position-deleted
    /// rows and rows an equality delete with a larger sequence number
    /// removes; where two live rows share a key, the newer one.
    pub async fn rebuild(
        file_io: &FileIO,
        metadata: &TableMetadata,
        key_ids: &[i32],
    ) -> Result<Index> {
        let hasher = KeyHasher::random(key_ids.to_vec(), key_types(metadata, key_ids)?)?;
        Self::rebuild_with(file_io, metadata, hasher).await
    }

    /// [`Index::rebuild`] with a given hasher (the same secret gives the
    /// same hashes, so two indexes can be compared).
    pub async fn rebuild_with(
        file_io: &FileIO,
        metadata: &TableMetadata,
        hasher: KeyHasher,
    ) -> Result<Index> {
        let mut index = Index::empty(metadata, hasher.field_ids())?;
        index.hasher = hasher;
        let Some(snapshot) = metadata.current_snapshot() else {
            return Ok(index);
        };
        let mut data = Vec::new();
        let mut position_deletes = Vec::new();
        let mut equality_deletes = Vec::new();
        for (file, sequence_number) in live_files(file_io, snapshot).await? {
            match file.content_type() {
                DataContentType::Data => data.push((file, sequence_number)),
                DataContentType::PositionDeletes => position_deletes.push(file),
                DataContentType::EqualityDeletes => equality_deletes.push((file, sequence_number)),
            }
        }
        let data_paths: HashSet<&str> = data.iter().map(|(f, _)| f.file_path()).collect();
        let mut deleted: HashMap<String, Vec<u64>> = HashMap::new();
        for file in &position_deletes {
            read_position_deletes(file_io, file, |path, pos| {
                if data_paths.contains(path) {
                    deleted.entry(path.to_string()).or_default().push(pos);
                }
            })
            .await?;
        }
        for rows in deleted.values_mut() {
            rows.sort_unstable();
            rows.dedup();
        }
        let mut killed: HashMap<KeyHash, i64, BuildHasherDefault<PassThrough>> = HashMap::default();
        for (file, sequence_number) in &equality_deletes {
            index
                .read_equality_deletes(file_io, file, |key| {
                    let newest = killed.entry(key).or_insert(*sequence_number);
                    *newest = (*newest).max(*sequence_number);
                })
                .await?;
        }
        data.sort_by_key(|(_, sequence_number)| *sequence_number);
        for (file, sequence_number) in &data {
            let number = index.add_file(file.file_path(), *sequence_number, file.partition())?;
            let gone = deleted
                .get(file.file_path())
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let mut keys = Vec::new();
            read_key_hashes(file_io, file, &index.hasher, |row, key| {
                keys.push((row, key))
            })
            .await?;
            for (row, key) in keys {
                if gone.binary_search(&row).is_ok()
                    || killed.get(&key).is_some_and(|k| *k > *sequence_number)
                {
                    continue;
                }
                index.entries.insert(key, location(number, row, file)?);
            }
        }
        index.snapshot_id = Some(snapshot.snapshot_id());
        Ok(index)
    }

    /// Brings the index to `metadata`'s current snapshot by replaying the
    /// snapshots after its own. `Ok(Some(reason))` when that is not possible
    /// and a rebuild is needed; the index is then unusable.
    pub async fn catch_up(
        &mut self,
        file_io: &FileIO,
        metadata: &TableMetadata,
    ) -> Result<Option<RebuildReason>> {
        if metadata.uuid() != self.table_uuid {
            return Ok(Some(format!(
                "the index is of table {}, the table is {}",
                self.table_uuid,
                metadata.uuid()
            )));
        }
        let fields = key_field_ids(metadata.current_schema());
        if fields != self.hasher.field_ids {
            return Ok(Some(format!(
                "the index hashes key fields {:?}, the table's are {fields:?}",
                self.hasher.field_ids
            )));
        }
        let types = key_types(metadata, &self.hasher.field_ids)?;
        if types != self.hasher.types {
            return Ok(Some("the key columns changed type".into()));
        }
        let mut after = Vec::new();
        let mut snapshot = metadata.current_snapshot();
        while let Some(s) = snapshot {
            if Some(s.snapshot_id()) == self.snapshot_id {
                break;
            }
            after.push(s.clone());
            snapshot = s
                .parent_snapshot_id()
                .and_then(|id| metadata.snapshot_by_id(id));
        }
        if snapshot.is_none()
            && let Some(own) = self.snapshot_id
        {
            return Ok(Some(format!(
                "snapshot {own} is not an ancestor of the current snapshot"
            )));
        }
        let mut deleted_rows: HashSet<Location> = HashSet::new();
        let replayed = after.len() as u64;
        for snapshot in after.iter().rev() {
            if let Some(reason) = self.replay(file_io, snapshot, &mut deleted_rows).await? {
                return Ok(Some(reason));
            }
        }
        if !deleted_rows.is_empty() {
            // A deleted location never holds another row (files are never
            // rewritten in place), so removing the entries that still point at
            // one after all replays is the same as removing them in order.
            self.entries.retain(|_, l| !deleted_rows.contains(l));
        }
        self.commits_since_checkpoint += replayed;
        Ok(None)
    }

    /// Applies the files `snapshot` added; `Some(reason)` if it did more.
    async fn replay(
        &mut self,
        file_io: &FileIO,
        snapshot: &SnapshotRef,
        deleted_rows: &mut HashSet<Location>,
    ) -> Result<Option<RebuildReason>> {
        let id = snapshot.snapshot_id();
        match &snapshot.summary().operation {
            Operation::Append | Operation::Overwrite => {}
            other => {
                return Ok(Some(format!("snapshot {id} is a `{}`", other.as_str())));
            }
        }
        let sequence_number = snapshot.sequence_number();
        let bytes = file_io.new_input(snapshot.manifest_list())?.read().await?;
        let list = ManifestList::parse_with_version(&bytes, FormatVersion::V2)?;
        let mut data = Vec::new();
        let mut position_deletes = Vec::new();
        let mut equality_deletes = Vec::new();
        for manifest in list.entries() {
            if manifest.added_snapshot_id != id {
                continue;
            }
            let loaded = manifest.load_manifest(file_io).await?;
            for entry in loaded.entries() {
                match entry.status() {
                    ManifestStatus::Added => {}
                    ManifestStatus::Existing => continue,
                    ManifestStatus::Deleted => {
                        return Ok(Some(format!("snapshot {id} removed {}", entry.file_path())));
                    }
                }
                let file = entry.data_file().clone();
                match file.content_type() {
                    DataContentType::Data => data.push(file),
                    DataContentType::PositionDeletes => position_deletes.push(file),
                    DataContentType::EqualityDeletes => equality_deletes.push(file),
                }
            }
        }
        let mut changes = 0u64;
        // Equality deletes remove older rows only: apply them before the rows
        // of their own snapshot arrive.
        for file in &equality_deletes {
            let mut keys = Vec::new();
            self.read_equality_deletes(file_io, file, |key| keys.push(key))
                .await?;
            for key in keys {
                if let Some(l) = self.entries.get(&key)
                    && self.files[l.file as usize].sequence_number < sequence_number
                {
                    self.entries.remove(&key);
                    changes += 1;
                }
            }
        }
        for file in &data {
            let number = self.add_file(file.file_path(), sequence_number, file.partition())?;
            let mut keys = Vec::new();
            read_key_hashes(file_io, file, &self.hasher, |row, key| {
                keys.push((row, key))
            })
            .await?;
            changes += keys.len() as u64;
            for (row, key) in keys {
                self.entries.insert(key, location(number, row, file)?);
            }
        }
        for file in &position_deletes {
            let numbers = &self.file_numbers;
            read_position_deletes(file_io, file, |path, pos| {
                if let (Some(&file), Ok(row)) = (numbers.get(path), u32::try_from(pos)) {
                    deleted_rows.insert(Location { file, row });
                }
            })
            .await?;
            changes += file.record_count();
        }
        self.changes_since_checkpoint += changes;
        self.snapshot_id = Some(id);
        Ok(None)
    }

    async fn read_equality_deletes(
        &self,
        file_io: &FileIO,
        file: &DataFile,
        mut each: impl FnMut(KeyHash),
    ) -> Result<()> {
        let mut ids = file.equality_ids().unwrap_or_default();
        let mut key_ids = self.hasher.field_ids.clone();
        ids.sort_unstable();
        key_ids.sort_unstable();
        if ids != key_ids {
            return Err(Error::new(
                ErrorKind::FeatureUnsupported,
                format!(
                    "{}: an equality delete on fields {ids:?}, not on the key {key_ids:?}, \
                     cannot be indexed",
                    file.file_path()
                ),
            ));
        }
        read_key_hashes(file_io, file, &self.hasher, |_, key| each(key)).await
    }

    /// Records a commit this sink made on top of the index's snapshot:
    /// `deleted` keys are gone, each written file holds its keys in row
    /// order. The caller makes sure `snapshot_id`'s parent is the index's.
    pub fn record_commit(
        &mut self,
        snapshot_id: i64,
        sequence_number: i64,
        deleted: &[KeyHash],
        written: &[(String, Vec<KeyHash>)],
    ) -> Result<()> {
        let empty = Struct::empty();
        self.record(
            snapshot_id,
            sequence_number,
            deleted,
            written
                .iter()
                .map(|(path, keys)| (path.as_str(), &empty, keys.as_slice())),
        )
    }

    /// [`Index::record_commit`] of a partitioned table: each written file
    /// with its partition.
    pub fn record_partitioned_commit(
        &mut self,
        snapshot_id: i64,
        sequence_number: i64,
        deleted: &[KeyHash],
        written: &[(String, Struct, Vec<KeyHash>)],
    ) -> Result<()> {
        self.record(
            snapshot_id,
            sequence_number,
            deleted,
            written
                .iter()
                .map(|(path, partition, keys)| (path.as_str(), partition, keys.as_slice())),
        )
    }

    fn record<'a>(
        &mut self,
        snapshot_id: i64,
        sequence_number: i64,
        deleted: &[KeyHash],
        written: impl Iterator<Item = (&'a str, &'a Struct, &'a [KeyHash])>,
    ) -> Result<()> {
        for key in deleted {
            self.entries.remove(key);
        }
        let mut changes = deleted.len() as u64;
        for (path, partition, keys) in written {
            let file = self.add_file(path, sequence_number, partition)?;
            for (row, key) in keys.iter().enumerate() {
                let row = u32::try_from(row).map_err(|_| {
                    Error::new(
                        ErrorKind::Unexpected,
                        format!("{path}: more than 2^32 rows"),
                    )
                })?;
                self.entries.insert(*key, Location { file, row });
            }
            changes += keys.len() as u64;
        }
        self.snapshot_id = Some(snapshot_id);
        self.commits_since_checkpoint += 1;
        self.changes_since_checkpoint += changes;
        Ok(())
    }

    /// Whether enough happened since the last checkpoint to write one: every
    /// `every_commits` commits, or once replaying them would mean reading
    /// many rows again.
    pub fn checkpoint_due(&self, every_commits: u64) -> bool {
        self.snapshot_id.is_some()
            && (self.commits_since_checkpoint >= every_commits
                || self.changes_since_checkpoint >= CHANGES_PER_CHECKPOINT)
    }

    /// Stores the index as the checkpoint of its snapshot. Call it only for
    /// a committed snapshot; then [`Index::remove_older_checkpoints`].
    pub fn write_checkpoint(&mut self, table_path: &str) -> std::result::Result<(), BlobError> {
        let Some(snapshot_id) = self.snapshot_id else {
            return Ok(());
        };
        blob::put(&checkpoint_path(table_path, snapshot_id), &self.encode())?;
        self.commits_since_checkpoint = 0;
        self.changes_since_checkpoint = 0;
        Ok(())
    }

    /// Removes every checkpoint of the table but this index's own.
    pub fn remove_older_checkpoints(&self, table_path: &str) -> std::result::Result<(), BlobError> {
        let keep = self.snapshot_id.map(|id| checkpoint_path(table_path, id));
        for object in blob::list(&checkpoint_folder(table_path))? {
            if Some(&object.path) != keep.as_ref() {
                blob::delete(&object.path)?;
            }
        }
        Ok(())
    }

    /// Loads the table's newest usable checkpoint and catches it up; when
    /// there is none (or it cannot be used) rebuilds from the table and
    /// stores a checkpoint of the result.
    pub async fn open(
        file_io: &FileIO,
        table_path: &str,
        metadata: &TableMetadata,
        key_ids: &[i32],
    ) -> Result<Index> {
        let name = format!("table {table_path}");
        match Self::from_checkpoint(file_io, table_path, metadata, key_ids).await {
            Ok(Ok(index)) => return Ok(index),
            Ok(Err(why)) => weir_sdk::log::info(format!("{name}: rebuilding the key index: {why}")),
            Err(e) => weir_sdk::log::info(format!(
                "{name}: rebuilding the key index: its checkpoint could not be replayed: {e}"
            )),
        }
        let mut index = Self::rebuild(file_io, metadata, key_ids).await?;
        weir_sdk::log::info(format!(
            "{name}: rebuilt the key index of snapshot {:?} ({} keys)",
            index.snapshot_id,
            index.len()
        ));
        if index.snapshot_id.is_some() {
            // The rebuilt index names a committed snapshot: safe to store.
            let stored = index
                .write_checkpoint(table_path)
                .and_then(|()| index.remove_older_checkpoints(table_path));
            if let Err(e) = stored {
                weir_sdk::log::warn(format!("{name}: cannot store the key index: {e}"));
            }
        }
        Ok(index)
    }

    /// The newest checkpoint on the current snapshot's ancestry, caught up;
    /// `Ok(Err(why))` when there is none that can be used.
    async fn from_checkpoint(
        file_io: &FileIO,
        table_path: &str,
        metadata: &TableMetadata,
        key_ids: &[i32],
    ) -> Result<std::result::Result<Index, RebuildReason>> {
        let stored: HashSet<i64> = match blob::list(&checkpoint_folder(table_path)) {
            Ok(objects) => objects
                .iter()
                .filter_map(|o| checkpoint_snapshot(table_path, &o.path))
                .collect(),
            Err(e) => return Ok(Err(format!("cannot list its checkpoints: {e}"))),
        };
        if stored.is_empty() {
            return Ok(Err("no checkpoint is stored".into()));
        }
        let types = key_types(metadata, key_ids)?;
        let mut why = format!(
            "no stored checkpoint names a snapshot of the current history ({} stored)",
            stored.len()
        );
        let mut snapshot = metadata.current_snapshot();
        while let Some(s) = snapshot {
            let id = s.snapshot_id();
            snapshot = s
                .parent_snapshot_id()
                .and_then(|p| metadata.snapshot_by_id(p));
            if !stored.contains(&id) {
                continue;
            }
            let path = checkpoint_path(table_path, id);
            let bytes = match blob::get(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    why = format!("checkpoint {path} cannot be read: {e}");
                    continue;
                }
            };
            let mut index = match Index::decode(&bytes, metadata.uuid(), id, key_ids, &types) {
                Ok(index) => index,
                Err(e) => {
                    why = format!("checkpoint {path} is not usable: {e}");
                    weir_sdk::log::info(format!("table {table_path}: {why}"));
                    continue;
                }
            };
            return Ok(match index.catch_up(file_io, metadata).await? {
                None => Ok(index),
                Some(reason) => Err(format!("checkpoint {path} cannot be caught up: {reason}")),
            });
        }
        Ok(Err(why))
    }

    /// The checkpoint format, little-endian:
    ///
    /// ```text
    /// magic "WEIRIDX\0", version u32 (1), table uuid [16], snapshot id i64,
    /// hash secret [16], key signature (u32 length + UTF-8),
    /// file count u32, per file: sequence number i64, path (u32 length +
    ///   UTF-8), partition (u32 length + bytes),
    /// entry count u64, per entry: hash u64 u64, file u32, row u32,
    /// body length u64, SipHash-1-3 of the body u64
    /// ```
    ///
    /// The trailer makes a torn or truncated write fail to load.
    pub fn encode(&self) -> Vec<u8> {
        let signature = self.hasher.signature();
        let paths: usize = self.files.iter().map(|f| f.path.len() + 16).sum();
        let mut out = Vec::with_capacity(96 + signature.len() + paths + self.entries.len() * 24);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(self.table_uuid.as_bytes());
        out.extend_from_slice(&self.snapshot_id.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.hasher.secret);
        put_bytes(&mut out, signature.as_bytes());
        out.extend_from_slice(&(self.files.len() as u32).to_le_bytes());
        for file in &self.files {
            out.extend_from_slice(&file.sequence_number.to_le_bytes());
            put_bytes(&mut out, file.path.as_bytes());
            put_bytes(&mut out, &crate::partition::encode(&file.partition));
        }
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for (key, l) in &self.entries {
            out.extend_from_slice(&key.0.to_le_bytes());
            out.extend_from_slice(&key.1.to_le_bytes());
            out.extend_from_slice(&l.file.to_le_bytes());
            out.extend_from_slice(&l.row.to_le_bytes());
        }
        let body = out.len() as u64;
        let sum = checksum(&out);
        out.extend_from_slice(&body.to_le_bytes());
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Reads a checkpoint, checking that it is whole and that it is the one
    /// expected: of table `uuid`, snapshot `snapshot_id`, these keys.
    pub fn decode(
        bytes: &[u8],
        uuid: uuid::Uuid,
        snapshot_id: i64,
        key_ids: &[i32],
        types: &[DataType],
    ) -> std::result::Result<Index, String> {
        if bytes.len() < MAGIC.len() + 16 {
            return Err(format!("{} bytes: truncated", bytes.len()));
        }
        let (body, trailer) = bytes.split_at(bytes.len() - 16);
        let length = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes"));
        let sum = u64::from_le_bytes(trailer[8..].try_into().expect("8 bytes"));
        if length != body.len() as u64 || sum != checksum(body) {
            return Err("torn or corrupt (length or checksum does not match)".into());
        }
        let mut r = Reader { bytes: body };
        if r.take(MAGIC.len())? != MAGIC {
            return Err("not a weir key index".into());
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(format!(
                "format version {version}, expected {FORMAT_VERSION}"
            ));
        }
        let table = uuid::Uuid::from_slice(r.take(16)?).map_err(|e| e.to_string())?;
        if table != uuid {
            return Err(format!("of table {table}, not {uuid}"));
        }
        let snapshot = r.i64()?;
        if snapshot != snapshot_id {
            return Err(format!("of snapshot {snapshot}, not {snapshot_id}"));
        }
        let secret: [u8; 16] = r.take(16)?.try_into().expect("16 bytes");
        let hasher =
            KeyHasher::new(secret, key_ids.to_vec(), types.to_vec()).map_err(|e| e.to_string())?;
        let signature = r.bytes()?;
        if signature != hasher.signature().as_bytes() {
            return Err(format!(
                "made for keys {}, the table's keys are {}",
                String::from_utf8_lossy(signature),
                hasher.signature()
            ));
        }
        let file_count = r.u32()?;
        let mut files = Vec::with_capacity(file_count.min(1 << 20) as usize);
        let mut file_numbers = HashMap::new();
        for n in 0..file_count {
            let sequence_number = r.i64()?;
            let path = String::from_utf8(r.bytes()?.to_vec()).map_err(|e| e.to_string())?;
            let partition =
                crate::partition::decode(r.bytes()?).map_err(|e| format!("file {path}: {e}"))?;
            file_numbers.insert(path.clone(), n);
            files.push(IndexedFile {
                path,
                sequence_number,
                partition,
            });
        }
        let count = r.u64()?;
        if count.checked_mul(24) != Some(r.bytes.len() as u64) {
            return Err(format!(
                "says {count} entries but holds {} bytes of them",
                r.bytes.len()
            ));
        }
        let mut entries = KeyMap::with_capacity_and_hasher(count as usize, Default::default());
        for _ in 0..count {
            let key = KeyHash(r.u64()?, r.u64()?);
            let file = r.u32()?;
            let row = r.u32()?;
            if file >= file_count {
                return Err(format!("an entry names file {file} of {file_count}"));
            }
            entries.insert(key, Location { file, row });
        }
        Ok(Index {
            table_uuid: table,
            snapshot_id: Some(snapshot),
            hasher,
            files,
            file_numbers,
            entries,
            commits_since_checkpoint: 0,
            changes_since_checkpoint: 0,
        })
    }
}

/// Changed rows since the last checkpoint after which one is written even
/// before `index_checkpoint_commits` commits.
const CHANGES_PER_CHECKPOINT: u64 = 2_000_000;

const MAGIC: &[u8; 8] = b"WEIRIDX\0";
const FORMAT_VERSION: u32 = 1;

/// The blob folder of a table's index checkpoints.
pub fn checkpoint_folder(table_path: &str) -> String {
    format!("_weir/index/{table_path}/")
}

/// The blob path of the checkpoint of `snapshot_id`.
pub fn checkpoint_path(table_path: &str, snapshot_id: i64) -> String {
    format!("{}{snapshot_id}.idx", checkpoint_folder(table_path))
}

fn checkpoint_snapshot(table_path: &str, path: &str) -> Option<i64> {
    path.strip_prefix(&checkpoint_folder(table_path))?
        .strip_suffix(".idx")?
        .parse()
        .ok()
}

fn checksum(bytes: &[u8]) -> u64 {
    SipHasher13::new_with_keys(0x7765_6972_6964_7800, 0)
        .hash(bytes)
        .as_u64()
        .0
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err("truncated".into());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn i64(&mut self) -> std::result::Result<i64, String> {
        Ok(self.u64()? as i64)
    }

    fn bytes(&mut self) -> std::result::Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

fn location(file: u32, row: u64, data: &DataFile) -> Result<Location> {
    let row = u32::try_from(row).map_err(|_| {
        Error::new(
            ErrorKind::FeatureUnsupported,
            format!("{}: more than 2^32 rows in one data file", data.file_path()),
        )
    })?;
    Ok(Location { file, row })
}

/// Every live file of `snapshot` with its data sequence number.
pub async fn live_files(file_io: &FileIO, snapshot: &SnapshotRef) -> Result<Vec<(DataFile, i64)>> {
    let bytes = file_io.new_input(snapshot.manifest_list())?.read().await?;
    let list = ManifestList::parse_with_version(&bytes, FormatVersion::V2)?;
    let mut out = Vec::new();
    for manifest in list.entries() {
        let loaded = manifest.load_manifest(file_io).await?;
        for entry in loaded.entries() {
            if !entry.is_alive() {
                continue;
            }
            let sequence_number = entry.sequence_number().ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!(
                        "{}: a live file without a sequence number",
                        entry.file_path()
                    ),
                )
            })?;
            out.push((entry.data_file().clone(), sequence_number));
        }
    }
    Ok(out)
}

/// Reads the top-level columns `field_ids` (in that order) of a Parquet
/// file, batch by batch, with the file's row number of each batch's first
/// row.
async fn read_columns(
    file_io: &FileIO,
    path: &str,
    size: u64,
    field_ids: &[i32],
    mut each: impl FnMut(u64, Vec<ArrayRef>) -> Result<()>,
) -> Result<()> {
    let reader = ArrowFileReader::new(
        FileMetadata { size },
        file_io.new_input(path)?.reader().await?,
    );
    let builder = ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(|e| parquet_error(path, e))?;
    let descr = builder.parquet_schema();
    // Leaf index of each wanted field id; leaves come back in file order.
    let mut leaves = Vec::with_capacity(field_ids.len());
    for id in field_ids {
        let leaf = (0..descr.num_columns()).find(|&i| {
            let info = descr.column(i).self_type().get_basic_info().clone();
            info.has_id() && info.id() == *id
        });
        match leaf {
            Some(leaf) => leaves.push(leaf),
            None => {
                return Err(Error::new(
                    ErrorKind::DataInvalid,
                    format!("{path}: no column with field id {id}"),
                ));
            }
        }
    }
    let mut sorted = leaves.clone();
    sorted.sort_unstable();
    sorted.dedup();
    let order: Vec<usize> = leaves
        .iter()
        .map(|l| sorted.binary_search(l).expect("present"))
        .collect();
    let mask = ProjectionMask::leaves(descr, sorted.iter().copied());
    let mut stream = builder
        .with_projection(mask)
        .with_batch_size(8192)
        .build()
        .map_err(|e| parquet_error(path, e))?;
    let mut row = 0u64;
    while let Some(batch) = stream
        .try_next()
        .await
        .map_err(|e| parquet_error(path, e))?
    {
        let batch: RecordBatch = batch;
        let n = batch.num_rows() as u64;
        each(
            row,
            order.iter().map(|&i| batch.column(i).clone()).collect(),
        )?;
        row += n;
    }
    Ok(())
}

/// The key hash of every row of a data (or equality-delete) file, with its
/// row number.
async fn read_key_hashes(
    file_io: &FileIO,
    file: &DataFile,
    hasher: &KeyHasher,
    mut each: impl FnMut(u64, KeyHash),
) -> Result<()> {
    read_columns(
        file_io,
        file.file_path(),
        file.file_size_in_bytes(),
        &hasher.field_ids,
        |first, columns| {
            for (i, key) in hasher.hash_columns(&columns)?.into_iter().enumerate() {
                each(first + i as u64, key);
            }
            Ok(())
        },
    )
    .await
}

/// Every (data file path, row) of a position-delete file.
pub(crate) async fn read_position_deletes(
    file_io: &FileIO,
    file: &DataFile,
    mut each: impl FnMut(&str, u64),
) -> Result<()> {
    let path = file.file_path();
    read_columns(
        file_io,
        path,
        file.file_size_in_bytes(),
        &[FILE_PATH_FIELD_ID, POS_FIELD_ID],
        |_, columns| {
            let paths =
                arrow_cast::cast(&columns[0], &DataType::Utf8).map_err(|e| arrow_error(path, e))?;
            let paths = paths.as_string::<i32>();
            let rows = columns[1].as_primitive_opt::<Int64Type>().ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!("{path}: `pos` is not a long"),
                )
            })?;
            for i in 0..paths.len() {
                if paths.is_null(i) || rows.is_null(i) || rows.value(i) < 0 {
                    return Err(Error::new(
                        ErrorKind::DataInvalid,
                        format!("{path}: row {i} is not a valid position delete"),
                    ));
                }
                each(paths.value(i), rows.value(i) as u64);
            }
            Ok(())
        },
    )
    .await
}

#[cfg(test)]
thread_local! {
    /// The crash point a test armed on this thread.
    pub(crate) static CRASH_AT: std::cell::Cell<Option<&'static str>> =
        const { std::cell::Cell::new(None) };
}

/// Whether a test armed a crash at `at` (then disarmed); never in a build.
pub(crate) fn crash_now(at: &'static str) -> bool {
    #[cfg(test)]
    {
        if CRASH_AT.with(|c| c.get()) == Some(at) {
            CRASH_AT.with(|c| c.set(None));
            return true;
        }
    }
    let _ = at;
    false
}
