//! One commit of one table: the staged batches become data files (and, for
//! upsert tables, position-delete or equality-delete files) and a new
//! metadata version that carries the position, pipeline and epoch in its
//! snapshot summary.
//!
//! In position mode the key index says which file and row hold the current
//! row of each changed key. It is touched only after the metadata commit
//! succeeded, and dropped on any failure, so it never runs ahead of the
//! table; its checkpoints name committed snapshots only.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
use arrow_row::{Row, RowConverter, SortField};
use iceberg::spec::{
    DataFile, FormatVersion, Schema, SortOrder, Struct, TableMetadata, TableMetadataBuilder,
    UnboundPartitionSpec,
};
use weir_sdk::{Batch, CommitRequest, Mode, Op, SinkError};

use crate::catalog::{CommitError, Loaded};
use crate::index::{Index, KeyHash};
use crate::partition::{Partitioner, split};
use crate::*;

/// One commit of one table, from the staged batches to the new metadata.
pub(crate) struct TableCommit<'a> {
    pub(crate) settings: &'a Settings,
    pub(crate) request: &'a CommitRequest,
    pub(crate) table: &'a weir_sdk::Table,
    pub(crate) path: &'a str,
    pub(crate) staged: &'a [Batch],
    /// The table's key index (position mode), if this instance has one.
    pub(crate) key_index: &'a mut Option<Index>,
}

/// What a position-mode commit changes in the key index once it is
/// committed.
struct IndexChange {
    /// Keys whose last change is a delete.
    deleted: Vec<KeyHash>,
    /// The key of every data row, in the order the rows were written.
    written: Vec<KeyHash>,
    /// `written` split by data file: (file location, its partition, its keys
    /// in row order).
    files: Vec<(String, Struct, Vec<KeyHash>)>,
}

/// An error, and whether the cached table metadata must be dropped.
type Failed = (SinkError, bool);

impl TableCommit<'_> {
    fn name(&self) -> &str {
        &self.table.name
    }

    fn poison(&self, why: String) -> Failed {
        (
            SinkError::Poison(format!(
                "table {} (Iceberg table {}), batch up to position {}: {why}",
                self.table.name,
                self.table.destination,
                hex::encode(&self.request.high)
            )),
            false,
        )
    }

    fn failed(&self, what: &str, e: iceberg::Error) -> Failed {
        (
            iceberg_error(
                &format!(
                    "table {} (Iceberg table {}): {what}",
                    self.name(),
                    self.path
                ),
                e,
            ),
            true,
        )
    }

    /// Whether the table's last commit of this pipeline (`last`) already
    /// covers the batch being committed (positions only grow).
    fn covered(&self, last: Option<&Committed>) -> bool {
        last.is_some_and(|l| l.position.as_slice() >= self.request.high.as_slice())
    }

    /// Refuses a commit from an older epoch than the table's last one.
    fn fence(&self, metadata: &TableMetadata) -> std::result::Result<Option<Committed>, Failed> {
        let last = last_commit(metadata, &self.settings.pipeline, self.name())
            .transpose()
            .map_err(|e| (e, true))?;
        if let Some(last) = &last
            && last.epoch > self.request.epoch
        {
            return Err((
                SinkError::Fenced(format!(
                    "table {}: Iceberg table {} was committed by epoch {} of pipeline {}; \
                     this host has epoch {} and must stop",
                    self.name(),
                    self.path,
                    last.epoch,
                    self.settings.pipeline,
                    self.request.epoch
                )),
                true,
            ));
        }
        Ok(last)
    }

    pub(crate) async fn run(
        &mut self,
        known: Option<Option<Loaded>>,
    ) -> std::result::Result<Loaded, Failed> {
        let catalog = &self.settings.catalog;
        let loaded = match known {
            Some(loaded) => loaded,
            None => catalog
                .load(self.path)
                .map_err(|e| self.failed("cannot load the table", e))?,
        };
        let mut base = match loaded {
            Some(loaded) => loaded,
            None => self.create().await?,
        };
        let last = self.fence(&base.metadata)?;
        let has_rows = self.staged.iter().any(|b| b.num_rows() > 0);
        if !has_rows
            && last
                .as_ref()
                .is_some_and(|l| l.position == self.request.high)
        {
            // Already recorded (a heartbeat at the same position).
            return Ok(base);
        }
        if has_rows && self.covered(last.as_ref()) {
            // The table holds this batch already: a commit of this pipeline
            // landed whose answer never came back (a request that reached
            // the catalog after its host gave up on it). Writing it again
            // would double an append table's rows.
            weir_sdk::log::info(format!(
                "table {}: Iceberg table {} already holds this batch (up to position {}); \
                 nothing is written again",
                self.name(),
                self.path,
                hex::encode(&self.request.high)
            ));
            return Ok(base);
        }
        if has_rows && let Some(last) = &last {
            let low = self.staged.iter().map(|b| b.low.as_slice()).min();
            if low.is_some_and(|low| last.position.as_slice() >= low) {
                // Part of the staged changes is in the table: another host
                // of this pipeline committed them after this one read where
                // the table stood (a commit frozen until the pipeline
                // moved). Writing them again would hold them twice.
                return Err((
                    SinkError::Fatal(format!(
                        "table {}: Iceberg table {} stands at position {} (epoch {}), inside \
                         the staged changes (from {}): another host of pipeline {} committed \
                         part of them after this host read the table; restart the pipeline to \
                         recover from the table",
                        self.name(),
                        self.path,
                        hex::encode(&last.position),
                        last.epoch,
                        hex::encode(low.unwrap_or_default()),
                        self.settings.pipeline
                    )),
                    true,
                ));
            }
        }

        // The schema the files are written with: the table's, grown to hold
        // every staged batch.
        let mut table_schema: Schema = base.metadata.current_schema().as_ref().clone();
        for batch in self.staged {
            if let Some(next) =
                schema::evolve(&table_schema, &batch.data().schema()).map_err(|e| self.poison(e))?
            {
                table_schema = next;
            }
        }
        let table_schema = Arc::new(table_schema);
        let arrow = schema::arrow_schema(&table_schema).map_err(|e| self.poison(e))?;
        let mut conformed = Vec::with_capacity(self.staged.len());
        for batch in self.staged {
            conformed.push(schema::conform(&batch.data(), &arrow).map_err(|e| self.poison(e))?);
        }

        let upsert = self.table.mode == Mode::Upsert && !self.table.key_columns.is_empty();
        let by_position = upsert && self.settings.delete_mode == DeleteMode::Position;
        let prefix = uuid::Uuid::new_v4().to_string();
        let spec = files::FileSpec {
            file_io: &self.settings.file_io,
            table_location: base.metadata.location(),
            prefix: &prefix,
            target_file_size: self.settings.target_file_size,
        };
        let partitioner = Partitioner::new(
            base.metadata.default_partition_spec().clone(),
            table_schema.clone(),
        )
        .map_err(|e| self.failed("cannot compute the table's partitions", e))?;
        let partitioner = partitioner.as_ref();
        let mut index_change = None;
        let new_files = if upsert {
            let ids = crate::index::key_field_ids(&table_schema);
            if ids.is_empty() {
                return Err(self.poison(
                    "the Iceberg table has no identifier fields (it was created in append \
                     mode), so it cannot be written in upsert mode"
                        .into(),
                ));
            }
            let key_index: Vec<usize> = ids
                .iter()
                .map(|id| {
                    table_schema
                        .as_struct()
                        .fields()
                        .iter()
                        .position(|f| f.id == *id)
                        .expect("identifier fields are fields")
                })
                .collect();
            let ops: Vec<&[Op]> = self.staged.iter().map(|b| b.ops()).collect();
            let winners = fold_by_key(&conformed, &key_index)
                .map_err(|e| self.poison(format!("cannot fold the batch by key: {e}")))?;
            let (data, deletes) = split_winners(&conformed, &ops, &winners, !by_position)
                .map_err(|e| self.poison(format!("cannot fold the batch by key: {e}")))?;
            if by_position {
                let (files, change) = self
                    .write_by_position(
                        &spec,
                        &base.metadata,
                        &table_schema,
                        partitioner,
                        &ids,
                        &key_index,
                        &conformed,
                        &ops,
                        &winners,
                        &data,
                    )
                    .await?;
                index_change = Some(change);
                files
            } else {
                let mut files: Vec<DataFile> = self
                    .write_rows(&spec, &table_schema, partitioner, &data)
                    .await?
                    .into_iter()
                    .flat_map(|(_, _, files)| files)
                    .collect();
                let groups = split(partitioner, &deletes)
                    .map_err(|e| self.failed("cannot split the deletes by partition", e))?;
                for (n, group) in groups.into_iter().enumerate() {
                    let key = group
                        .partition
                        .zip(partitioner)
                        .map(|(value, p)| p.key(value));
                    files.extend(
                        files::write_deletes(
                            &spec,
                            table_schema.clone(),
                            ids.clone(),
                            key,
                            n,
                            &group.batches,
                        )
                        .await
                        .map_err(|e| self.failed("cannot write equality-delete files", e))?,
                    );
                }
                files
            }
        } else {
            self.write_rows(&spec, &table_schema, partitioner, &conformed)
                .await?
                .into_iter()
                .flat_map(|(_, _, files)| files)
                .collect()
        };
        let properties = HashMap::from([
            (POSITION_KEY.to_string(), hex::encode(&self.request.high)),
            (EPOCH_KEY.to_string(), self.request.epoch.to_string()),
            (PIPELINE_KEY.to_string(), self.settings.pipeline.clone()),
            (TABLE_KEY.to_string(), self.table.name.clone()),
        ]);
        let snapshot_id = commit::new_snapshot_id(&base.metadata);
        let delta = commit::write_manifests(
            &self.settings.file_io,
            &base.metadata,
            table_schema.clone(),
            new_files,
            snapshot_id,
            properties,
        )
        .await
        .map_err(|e| self.failed("cannot write manifests", e))?;

        let base_schema = base.metadata.current_schema().clone();
        for _ in 0..COMMIT_ATTEMPTS {
            let next = commit::next_metadata(
                &self.settings.file_io,
                &base.metadata,
                &base.location,
                &delta,
            )
            .await
            .map_err(|e| self.failed("cannot build the next table metadata", e))?;
            match catalog.commit(self.path, &base, next) {
                Ok(committed) => {
                    if by_position {
                        self.record_in_index(&committed, index_change.as_ref())?;
                    }
                    return Ok(committed);
                }
                Err(CommitError::Failed(e)) => {
                    return Err(self.failed("cannot commit the table metadata", e));
                }
                Err(CommitError::Conflict) => {}
            }
            // Another writer made this version first. If it was a newer host
            // of this pipeline we are fenced; if this pipeline's position
            // moved otherwise, an older host committed after we read the
            // table and our batch is no longer the next one: stop, and let
            // a restart recover from the table.
            let newer = catalog
                .load(self.path)
                .map_err(|e| self.failed("cannot reload the table after a lost race", e))?
                .ok_or_else(|| {
                    (
                        SinkError::Fatal(format!(
                            "table {}: Iceberg table {} disappeared during a commit",
                            self.name(),
                            self.path
                        )),
                        true,
                    )
                })?;
            let now = self.fence(&newer.metadata)?;
            if self.covered(now.as_ref()) {
                // This batch landed by another request of this pipeline
                // (one whose answer was lost): it is committed.
                *self.key_index = None;
                return Ok(newer);
            }
            if now != last {
                return Err((
                    SinkError::Fatal(format!(
                        "table {}: another host of pipeline {} committed Iceberg table {} \
                         (now at position {}) after this host read it; restart the pipeline \
                         to recover from the table",
                        self.name(),
                        self.settings.pipeline,
                        self.path,
                        now.map(|c| hex::encode(&c.position)).unwrap_or_default()
                    )),
                    true,
                ));
            }
            if newer.metadata.current_schema() != &base_schema
                || newer.metadata.snapshot_by_id(delta.snapshot_id).is_some()
            {
                return Err((
                    SinkError::Retryable(format!(
                        "table {}: Iceberg table {} changed its schema during the commit",
                        self.name(),
                        self.path
                    )),
                    true,
                ));
            }
            if by_position && !deletes_still_apply(&base.metadata, &newer.metadata) {
                // Our position deletes were computed against the files of
                // the version we read; another writer committed a snapshot
                // (a compaction, another pipeline's rows): recompute on retry.
                *self.key_index = None;
                return Err((
                    SinkError::Retryable(format!(
                        "table {}: Iceberg table {} took a new snapshot during the commit; \
                         the commit is recomputed against it",
                        self.name(),
                        self.path
                    )),
                    true,
                ));
            }
            // Another writer's snapshot (not this pipeline's): our commit
            // goes on top of it.
            weir_sdk::log::info(format!(
                "table {}: another writer committed Iceberg table {} first; rebasing this \
                 commit onto its snapshot",
                self.name(),
                self.path
            ));
            base = newer;
        }
        Err((
            SinkError::Retryable(format!(
                "table {}: lost the race for the next metadata version of {} {COMMIT_ATTEMPTS} \
                 times",
                self.name(),
                self.path
            )),
            true,
        ))
    }

    /// Makes the key index reflect `metadata`'s current snapshot: catches up
    /// the one in memory, or loads the stored checkpoint (or rebuilds).
    async fn prepare_index(
        &mut self,
        metadata: &TableMetadata,
        ids: &[i32],
    ) -> std::result::Result<(), Failed> {
        let settings = self.settings;
        if let Some(index) = self.key_index.as_mut() {
            match index.catch_up(&settings.file_io, metadata).await {
                Ok(None) => return Ok(()),
                Ok(Some(why)) => weir_sdk::log::info(format!(
                    "table {}: reloading the key index of {}: {why}",
                    self.table.name, self.path
                )),
                Err(e) => {
                    *self.key_index = None;
                    return Err(self.failed("cannot catch up the key index", e));
                }
            }
            *self.key_index = None;
        }
        let index = Index::open(&settings.file_io, self.path, metadata, ids)
            .await
            .map_err(|e| self.failed("cannot load the key index", e))?;
        *self.key_index = Some(index);
        Ok(())
    }

    /// Writes the data files of the winning rows and one position-delete
    /// file for the keys the index knows, and says what the commit will
    /// change in the index.
    #[allow(clippy::too_many_arguments)]
    async fn write_by_position(
        &mut self,
        spec: &files::FileSpec<'_>,
        metadata: &TableMetadata,
        schema: &Arc<Schema>,
        partitioner: Option<&Partitioner>,
        ids: &[i32],
        key_columns: &[usize],
        conformed: &[RecordBatch],
        ops: &[&[Op]],
        winners: &[Vec<u32>],
        data: &[RecordBatch],
    ) -> std::result::Result<(Vec<iceberg::spec::DataFile>, IndexChange), Failed> {
        let mut change = IndexChange {
            deleted: Vec::new(),
            written: Vec::new(),
            files: Vec::new(),
        };
        if winners.iter().all(Vec::is_empty) {
            return Ok((Vec::new(), change));
        }
        self.prepare_index(metadata, ids).await?;
        let index = self.key_index.as_ref().expect("prepared above");
        // The rows to delete, by the data file holding them (with its
        // partition): one path per file, not one per row, so that sorting
        // them compares row numbers and not long paths with one prefix.
        let mut doomed: HashMap<&str, (&Struct, Vec<i64>)> = HashMap::new();
        for (b, rows) in winners.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let take = UInt32Array::from(rows.clone());
            let mut keys: Vec<ArrayRef> = Vec::with_capacity(key_columns.len());
            for &c in key_columns {
                keys.push(
                    arrow_select::take::take(conformed[b].column(c), &take, None)
                        .map_err(|e| self.poison(format!("cannot take the key columns: {e}")))?,
                );
            }
            let hashes = index
                .hasher()
                .hash_columns(&keys)
                .map_err(|e| self.poison(format!("cannot hash the keys: {e}")))?;
            for (&r, key) in rows.iter().zip(hashes) {
                if let Some((file, row)) = index.locate(&key) {
                    doomed
                        .entry(file.path.as_str())
                        .or_insert_with(|| (&file.partition, Vec::new()))
                        .1
                        .push(i64::from(row));
                }
                if ops[b][r as usize] == Op::Delete {
                    change.deleted.push(key);
                } else {
                    change.written.push(key);
                }
            }
        }
        let mut written = Vec::new();
        let mut mapped = 0usize;
        for (partition, rows, files) in self.write_rows(spec, schema, partitioner, data).await? {
            // Rows went into each partition's files in order (see
            // `files::write_data`): the first file holds the partition's
            // first rows, and so on.
            let mut at = 0usize;
            for file in &files {
                let count = file.record_count() as usize;
                let numbers = rows.get(at..at + count).ok_or_else(|| {
                    self.failed(
                        "cannot map rows to data files",
                        iceberg::Error::new(
                            iceberg::ErrorKind::Unexpected,
                            format!(
                                "the data files of a partition hold more rows than its {}",
                                rows.len()
                            ),
                        ),
                    )
                })?;
                let mut keys = Vec::with_capacity(count);
                for &n in numbers {
                    keys.push(*change.written.get(n).ok_or_else(|| {
                        self.failed(
                            "cannot map rows to data files",
                            iceberg::Error::new(
                                iceberg::ErrorKind::Unexpected,
                                format!("row {n} of {} written", change.written.len()),
                            ),
                        )
                    })?);
                }
                change.files.push((
                    file.file_path().to_string(),
                    partition.clone().unwrap_or_else(Struct::empty),
                    keys,
                ));
                at += count;
            }
            if at != rows.len() {
                return Err(self.failed(
                    "cannot map rows to data files",
                    iceberg::Error::new(
                        iceberg::ErrorKind::Unexpected,
                        format!(
                            "{} rows of a partition written, its data files hold {at}",
                            rows.len()
                        ),
                    ),
                ));
            }
            mapped += at;
            written.extend(files);
        }
        if mapped != change.written.len() {
            return Err(self.failed(
                "cannot map rows to data files",
                iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    format!(
                        "{} rows written, the data files hold {mapped}",
                        change.written.len()
                    ),
                ),
            ));
        }
        // Files by path (one comparison per file, not per row), and the
        // partitions in the order of their first file, so the delete files'
        // names do not depend on a hash map's order.
        let mut doomed: Vec<(&str, (&Struct, Vec<i64>))> = doomed.into_iter().collect();
        doomed.sort_unstable_by_key(|(path, _)| *path);
        let mut positions: Vec<(Struct, Vec<files::FileDeletes>)> = Vec::new();
        let mut slots: HashMap<&Struct, usize> = HashMap::new();
        for (path, (partition, rows)) in doomed {
            let slot = *slots.entry(partition).or_insert_with(|| {
                positions.push((partition.clone(), Vec::new()));
                positions.len() - 1
            });
            positions[slot].1.push((path.to_string(), rows));
        }
        let arity = partitioner.map_or(0, Partitioner::arity);
        if let Some((value, rows)) = positions.iter().find(|(v, _)| v.fields().len() != arity) {
            // A file of another partition spec (the table's spec was changed
            // by another writer): its deletes cannot be described in ours.
            return Err((
                SinkError::Fatal(format!(
                    "table {} (Iceberg table {}): data file {} has a partition of {} fields, \
                     the table's current spec has {arity}; position deletes against files of \
                     an older partition spec are not supported",
                    self.table.name,
                    self.path,
                    rows.first().map(|f| f.0.as_str()).unwrap_or_default(),
                    value.fields().len()
                )),
                true,
            ));
        }
        for (n, (value, rows)) in positions.into_iter().enumerate() {
            let partition = partitioner.map(|p| files::DeletePartition {
                value,
                spec_id: p.spec_id(),
                part: n,
            });
            written.extend(
                files::write_position_deletes(spec, partition, rows)
                    .await
                    .map_err(|e| self.failed("cannot write a position-delete file", e))?,
            );
        }
        Ok((written, change))
    }

    /// Writes `batches` as data files, one set per partition: (partition,
    /// the numbers of its rows among all rows of `batches`, its files).
    async fn write_rows(
        &self,
        spec: &files::FileSpec<'_>,
        schema: &Arc<Schema>,
        partitioner: Option<&Partitioner>,
        batches: &[RecordBatch],
    ) -> std::result::Result<Vec<(Option<Struct>, Vec<usize>, Vec<DataFile>)>, Failed> {
        let groups = split(partitioner, batches)
            .map_err(|e| self.failed("cannot split the rows by partition", e))?;
        let mut out = Vec::with_capacity(groups.len());
        for (n, group) in groups.into_iter().enumerate() {
            let key = group
                .partition
                .clone()
                .zip(partitioner)
                .map(|(value, p)| p.key(value));
            let files = files::write_partition_data(spec, schema.clone(), key, n, &group.batches)
                .await
                .map_err(|e| self.failed("cannot write data files", e))?;
            out.push((group.partition, group.rows, files));
        }
        Ok(out)
    }

    /// After a successful metadata commit: the index follows it (when it
    /// was at the parent; otherwise it catches up next time) and is stored
    /// when a checkpoint is due. Failing to store it costs a longer catch-up
    /// later, never the commit.
    fn record_in_index(
        &mut self,
        committed: &Loaded,
        change: Option<&IndexChange>,
    ) -> std::result::Result<(), Failed> {
        let Some(index) = self.key_index.as_mut() else {
            return Ok(());
        };
        let Some(snapshot) = committed.metadata.current_snapshot() else {
            return Ok(());
        };
        if snapshot.parent_snapshot_id() != index.snapshot_id() {
            return Ok(());
        }
        let (deleted, files) = change
            .map(|c| (c.deleted.as_slice(), c.files.as_slice()))
            .unwrap_or((&[], &[]));
        if let Err(e) = index.record_partitioned_commit(
            snapshot.snapshot_id(),
            snapshot.sequence_number(),
            deleted,
            files,
        ) {
            weir_sdk::log::warn(format!(
                "table {}: dropping the key index of {}: {e}",
                self.table.name, self.path
            ));
            *self.key_index = None;
            return Ok(());
        }
        crash_point(self.table, "after-metadata-commit")?;
        if index.checkpoint_due(self.settings.checkpoint_every) {
            match index.write_checkpoint(self.path) {
                Ok(()) => {
                    crash_point(self.table, "after-checkpoint-write")?;
                    if let Err(e) = index.remove_older_checkpoints(self.path) {
                        weir_sdk::log::warn(format!(
                            "table {}: cannot remove older key index checkpoints of {}: {e}",
                            self.table.name, self.path
                        ));
                    }
                }
                Err(e) => weir_sdk::log::warn(format!(
                    "table {}: cannot store the key index of {}: {e}",
                    self.table.name, self.path
                )),
            }
        }
        Ok(())
    }

    /// Creates the table from the first staged batch.
    async fn create(&self) -> std::result::Result<Loaded, Failed> {
        let first = &self.staged[0];
        let keys: &[String] = if self.table.mode == Mode::Upsert {
            &self.table.key_columns
        } else {
            &[]
        };
        let schema =
            schema::new_schema(&first.data().schema(), keys).map_err(|e| self.poison(e))?;
        let partition_spec = match self.settings.partitions.get(self.path) {
            None => UnboundPartitionSpec::builder().build(),
            Some(configured) => {
                let upsert_keys = (!keys.is_empty()).then_some(keys);
                partition::unbound_spec(&configured.terms, &schema, upsert_keys).map_err(|e| {
                    (
                        SinkError::Fatal(format!(
                            "table {} (Iceberg table {}): config key `{}`: {e}",
                            self.table.name, self.table.destination, configured.key
                        )),
                        false,
                    )
                })?
            }
        };
        let catalog = &self.settings.catalog;
        let properties = HashMap::from([
            ("write.format.default".to_string(), "parquet".to_string()),
            (
                "write.parquet.compression-codec".to_string(),
                "zstd".to_string(),
            ),
        ]);
        let metadata = TableMetadataBuilder::new(
            schema,
            partition_spec,
            SortOrder::unsorted_order(),
            catalog.table_location(self.path),
            FormatVersion::V2,
            properties,
        )
        .and_then(|b| b.build())
        .map_err(|e| self.failed("cannot build the new table's metadata", e))?
        .metadata;
        match catalog.create(self.path, &metadata) {
            Ok(loaded) => {
                weir_sdk::log::info(format!(
                    "table {}: created Iceberg table {}",
                    self.name(),
                    loaded.location
                ));
                Ok(loaded)
            }
            Err(CommitError::Conflict) => catalog
                .load(self.path)
                .map_err(|e| self.failed("cannot load the table", e))?
                .ok_or_else(|| {
                    (
                        SinkError::Retryable(format!(
                            "table {}: {} exists but cannot be read yet",
                            self.name(),
                            self.path
                        )),
                        true,
                    )
                }),
            Err(CommitError::Failed(e)) => Err(self.failed("cannot create the table", e)),
        }
    }
}

/// Folds staged batches by key: the last change to a key wins, across
/// batches. The winning rows of each batch, in row order.
fn fold_by_key(
    batches: &[RecordBatch],
    key_index: &[usize],
) -> std::result::Result<Vec<Vec<u32>>, arrow_schema::ArrowError> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let sort_fields = key_index
        .iter()
        .map(|&i| SortField::new(first.schema().field(i).data_type().clone()))
        .collect();
    let converter = RowConverter::new(sort_fields)?;
    // Every batch's keys converted first, so the map can borrow them rather
    // than own a copy of each key.
    let mut converted = Vec::with_capacity(batches.len());
    for batch in batches {
        let keys: Vec<_> = key_index.iter().map(|&i| batch.column(i).clone()).collect();
        converted.push(converter.convert_columns(&keys)?);
    }
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let mut last: HashMap<Row<'_>, (usize, u32)> = HashMap::with_capacity(total);
    for (b, rows) in converted.iter().enumerate() {
        for (r, row) in rows.iter().enumerate() {
            last.insert(row, (b, r as u32));
        }
    }
    let mut winners: Vec<Vec<u32>> = vec![Vec::new(); batches.len()];
    for (b, r) in last.into_values() {
        winners[b].push(r);
    }
    for rows in &mut winners {
        rows.sort_unstable();
    }
    Ok(winners)
}

/// The rows to add (every winner but deletes, batch by batch in row order)
/// and, when `equality_deletes`, the keys to delete first (every winner: the
/// equality delete removes the older row, the added row has a newer
/// sequence number).
fn split_winners(
    batches: &[RecordBatch],
    ops: &[&[Op]],
    winners: &[Vec<u32>],
    equality_deletes: bool,
) -> std::result::Result<(Vec<RecordBatch>, Vec<RecordBatch>), arrow_schema::ArrowError> {
    let mut data = Vec::new();
    let mut deletes = Vec::new();
    for (b, rows) in winners.iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let keep: Vec<u32> = rows
            .iter()
            .copied()
            .filter(|&r| ops[b][r as usize] != Op::Delete)
            .collect();
        if equality_deletes {
            let all = UInt32Array::from(rows.clone());
            deletes.push(arrow_select::take::take_record_batch(&batches[b], &all)?);
        }
        if !keep.is_empty() {
            data.push(arrow_select::take::take_record_batch(
                &batches[b],
                &UInt32Array::from(keep),
            )?);
        }
    }
    Ok((data, deletes))
}

/// Whether position deletes computed against `base` still name the right
/// rows in `newer`: only if the table's current snapshot is the same one
/// (another writer changed metadata alone, as an expiry does). Any new
/// snapshot may have moved rows between files (a compaction can rewrite
/// files while keeping every count the summaries carry), so the deletes
/// are computed again.
fn deletes_still_apply(base: &TableMetadata, newer: &TableMetadata) -> bool {
    base.current_snapshot_id() == newer.current_snapshot_id()
}

/// A test stops the sink here as a crash would: the call fails and the test
/// drops the instance.
fn crash_point(table: &weir_sdk::Table, at: &'static str) -> std::result::Result<(), Failed> {
    if crate::index::crash_now(at) {
        return Err((
            SinkError::Fatal(format!("table {}: injected crash {at}", table.name)),
            true,
        ));
    }
    Ok(())
}

weir_sdk::export_positioned_sink!(IcebergSink, maintenance);
