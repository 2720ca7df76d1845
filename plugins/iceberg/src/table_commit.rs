//! One commit of one table: the staged batches become data (and, for
//! upsert tables, equality-delete) files and a new metadata version that
//! carries the position, pipeline and epoch in its snapshot summary.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_row::{OwnedRow, RowConverter, SortField};
use iceberg::spec::{
    FormatVersion, Schema, SortOrder, TableMetadata, TableMetadataBuilder, UnboundPartitionSpec,
};
use weir_sdk::{Batch, CommitRequest, Mode, Op, SinkError};

use crate::catalog::{Catalog, CommitError, Loaded};
use crate::*;

/// One commit of one table, from the staged batches to the new metadata.
pub(crate) struct TableCommit<'a> {
    pub(crate) settings: &'a Settings,
    pub(crate) request: &'a CommitRequest,
    pub(crate) table: &'a weir_sdk::Table,
    pub(crate) path: &'a str,
    pub(crate) staged: &'a [Batch],
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
        let (data, deletes, equality_ids) = if upsert {
            let ids: Vec<i32> = table_schema.identifier_field_ids().collect();
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
            let (data, deletes) = split_upsert(&conformed, &ops, &key_index)
                .map_err(|e| self.poison(format!("cannot fold the batch by key: {e}")))?;
            (data, deletes, ids)
        } else {
            (conformed, Vec::new(), Vec::new())
        };

        let prefix = uuid::Uuid::new_v4().to_string();
        let spec = files::FileSpec {
            file_io: &self.settings.file_io,
            table_location: base.metadata.location(),
            prefix: &prefix,
            target_file_size: self.settings.target_file_size,
        };
        let mut new_files = files::write_data(&spec, table_schema.clone(), &data)
            .await
            .map_err(|e| self.failed("cannot write data files", e))?;
        if !deletes.is_empty() {
            new_files.extend(
                files::write_deletes(&spec, table_schema.clone(), equality_ids, &deletes)
                    .await
                    .map_err(|e| self.failed("cannot write equality-delete files", e))?,
            );
        }
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
                Ok(committed) => return Ok(committed),
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
            UnboundPartitionSpec::builder().build(),
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

/// Folds staged batches by key (the last change to a key wins, across
/// batches) and splits them into the rows to add (everything but deletes)
/// and the keys to delete first (every changed key: the equality delete
/// removes the older row, the added row has a newer sequence number).
fn split_upsert(
    batches: &[RecordBatch],
    ops: &[&[Op]],
    key_index: &[usize],
) -> std::result::Result<(Vec<RecordBatch>, Vec<RecordBatch>), arrow_schema::ArrowError> {
    let Some(first) = batches.first() else {
        return Ok((Vec::new(), Vec::new()));
    };
    let sort_fields = key_index
        .iter()
        .map(|&i| SortField::new(first.schema().field(i).data_type().clone()))
        .collect();
    let converter = RowConverter::new(sort_fields)?;
    let mut last: HashMap<OwnedRow, (usize, u32)> = HashMap::new();
    for (b, batch) in batches.iter().enumerate() {
        let keys: Vec<_> = key_index.iter().map(|&i| batch.column(i).clone()).collect();
        let rows = converter.convert_columns(&keys)?;
        for (r, row) in rows.iter().enumerate() {
            last.insert(row.owned(), (b, r as u32));
        }
    }
    let mut winners: Vec<Vec<u32>> = vec![Vec::new(); batches.len()];
    for (b, r) in last.into_values() {
        winners[b].push(r);
    }
    let mut data = Vec::new();
    let mut deletes = Vec::new();
    for (b, mut rows) in winners.into_iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        rows.sort_unstable();
        let keep: Vec<u32> = rows
            .iter()
            .copied()
            .filter(|&r| ops[b][r as usize] != Op::Delete)
            .collect();
        let all = UInt32Array::from(rows);
        deletes.push(arrow_select::take::take_record_batch(&batches[b], &all)?);
        if !keep.is_empty() {
            data.push(arrow_select::take::take_record_batch(
                &batches[b],
                &UInt32Array::from(keep),
            )?);
        }
    }
    Ok((data, deletes))
}

weir_sdk::export_positioned_sink!(IcebergSink);
