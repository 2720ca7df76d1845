//! The batcher: whole source transactions in, one Arrow record batch per
//! table out, flushed at boundaries every sink can commit and resume from.
//!
//! A flush's `high` is always a position the source can resume after without
//! losing or re-splitting anything: the end of the last whole transaction, or
//! the last change of a piece of a transaction too big for one batch.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow_array::{Array, BinaryArray, BooleanArray, RecordBatch};
use arrow_schema::SchemaRef;
use sha2::{Digest, Sha256};

use crate::change::{Change, SnapshotRows, TableSchema, Transaction, Value};
use weir_core::position::Position;

mod arrow;
#[cfg(any(test, feature = "test-support"))]
mod readback;

pub(crate) use arrow::{ColumnBuilder, column_array, fits};
use arrow::{arrow_schema, record_batch, snapshot_record_batch};
#[cfg(any(test, feature = "test-support"))]
pub use readback::value_at;
pub use weir_contract::{CONTROL_COLUMNS, ContextField, MetadataColumn, OP_COLUMN, POS_COLUMN};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most changes buffered for one flush, over all tables, counted before
    /// last-write-wins folds them (so the rows of every batch stay below it).
    pub max_rows: usize,
    /// Most estimated bytes buffered for one flush, over all tables.
    pub max_bytes: usize,
    /// Longest a buffered change waits before the pipeline should flush.
    pub linger: Duration,
}

/// The Arrow schema of `table`'s batches: its columns (all nullable, as
/// delete rows carry only the key), then the `metadata` columns, then the
/// control columns.
pub fn batch_schema(table: &TableSchema, metadata: &[MetadataColumn]) -> SchemaRef {
    arrow_schema(table, metadata)
}

/// Checks that no metadata column name clashes with a table column, a
/// control column or another metadata column, and that table columns leave
/// the control column names free.
pub fn validate_metadata(
    tables: &[Arc<TableSchema>],
    metadata: &[MetadataColumn],
) -> Result<(), String> {
    for (i, column) in metadata.iter().enumerate() {
        if column.name.is_empty() {
            return Err(format!(
                "metadata column for `{}` has an empty name",
                column.field
            ));
        }
        if CONTROL_COLUMNS.contains(&column.name.as_str()) {
            return Err(format!(
                "metadata column `{}` clashes with a control column",
                column.name
            ));
        }
        if metadata[..i].iter().any(|other| other.name == column.name) {
            return Err(format!("metadata column `{}` is named twice", column.name));
        }
    }
    for table in tables {
        for column in &table.columns {
            if CONTROL_COLUMNS.contains(&column.name.as_str()) {
                return Err(format!(
                    "table {}: column `{}` clashes with a control column",
                    table.name, column.name
                ));
            }
            if let Some(meta) = metadata.iter().find(|m| m.name == column.name) {
                return Err(format!(
                    "table {}: metadata column `{}` ({}) clashes with the table's column of that name",
                    table.name, meta.name, meta.field
                ));
            }
        }
    }
    Ok(())
}

/// One table's share of a flush.
#[derive(Clone, Debug)]
pub struct TableBatch {
    pub table: Arc<TableSchema>,
    /// Deterministic from (table, low, high), so a sink without positions
    /// can recognize a replayed batch.
    pub id: String,
    /// Position of the first row (== high for an empty batch).
    pub low: Position,
    /// Where the table stands once this batch is committed: the flush boundary.
    pub high: Position,
    pub records: RecordBatch,
}

impl TableBatch {
    fn new(table: Arc<TableSchema>, low: Position, high: Position, records: RecordBatch) -> Self {
        let id = batch_id(&table.name, &low, &high);
        TableBatch {
            table,
            id,
            low,
            high,
            records,
        }
    }

    pub fn rows(&self) -> usize {
        self.records.num_rows()
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// The `__pos` column: each row's position bytes.
    pub fn positions(&self) -> &BinaryArray {
        self.records
            .columns()
            .last()
            .and_then(|c| c.as_any().downcast_ref())
            .expect("a batch ends with the binary __pos column")
    }

    /// Only the rows after `after`: a replayed batch straddling what a sink
    /// has already committed. Keeps `high`; `low` and `id` follow the rows kept.
    pub fn filter_after(&self, after: &Position) -> TableBatch {
        let positions = self.positions();
        let keep: BooleanArray = positions
            .iter()
            .map(|p| Some(p.is_some_and(|p| p > after.as_bytes())))
            .collect();
        let records = arrow_select::filter::filter_record_batch(&self.records, &keep)
            .expect("the mask has one entry per row");
        let low = positions
            .iter()
            .flatten()
            .find(|p| *p > after.as_bytes())
            .map_or_else(|| self.high.clone(), |p| Position::from_bytes(p.to_vec()));
        TableBatch::new(self.table.clone(), low, self.high.clone(), records)
    }
}

/// First 32 hex characters of sha256 over the table name, low and high, each
/// preceded by its length (8 bytes, big-endian) so that no two different
/// triples hash the same input, whatever bytes positions contain.
pub fn batch_id(table: &str, low: &Position, high: &Position) -> String {
    let mut hasher = Sha256::new();
    for part in [table.as_bytes(), low.as_bytes(), high.as_bytes()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hex::encode(&hasher.finalize()[..16])
}

/// Batches that commit together: every one of them has the flush's `high`.
#[derive(Clone, Debug)]
pub struct Flush {
    pub high: Position,
    pub batches: Vec<TableBatch>,
}

/// A change the batcher cannot turn into Arrow: the source is broken for
/// this row, and the pipeline must stop rather than skip it.
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
#[error("cannot batch the change to {table} at position {pos}: {reason}")]
pub struct BatchError {
    pub table: String,
    pub pos: Position,
    pub reason: String,
}

/// The batcher's maps are looked up once or twice per change: foldhash,
/// seeded per process, costs a fraction of the standard library's SipHash
/// on short keys. The keys are table names and row keys, not a peer's
/// choosing alone; the per-process seed keeps collisions unplanned.
type HashMap<K, V> = foldhash::HashMap<K, V>;

pub struct Batcher {
    limits: BatchLimits,
    metadata: Vec<MetadataColumn>,
    tables: Vec<TableBuffer>,
    by_name: HashMap<String, usize>,
    /// The table of the last change looked up: a transaction's changes
    /// mostly share their table's schema (one `Arc`), which is then found
    /// without hashing its name.
    last_table: usize,
    /// Changes and estimated bytes buffered, before last-write-wins.
    rows: usize,
    /// Of `rows`, the snapshot rows buffered columnar.
    read_rows: usize,
    bytes: usize,
    oldest: Option<Instant>,
    consumed: Option<Position>,
    /// A heartbeat is due: the next flush, whatever makes it, also brings
    /// idle tables to its high.
    idle_due: bool,
}

struct TableBuffer {
    table: Arc<TableSchema>,
    schema: SchemaRef,
    /// Buffered snapshot rows, columnar, in position order. A table buffers
    /// these or `changes`, never both: a change to it flushes them first.
    reads: Vec<SnapshotRows>,
    /// Buffered changes in position order.
    changes: Vec<Change>,
    /// Per change: true where a later change to the same key won.
    superseded: Vec<bool>,
    superseded_count: usize,
    /// Encoded key -> index into `changes` of the key's latest change, for
    /// `changes[..indexed]`. Snapshot reads are indexed only once a streamed
    /// change follows them in the buffer: a snapshot reads each key once, so
    /// until then there is nothing for them to fold with, and a backfill
    /// need not hash every row it reads.
    latest: HashMap<Vec<u8>, usize>,
    indexed: usize,
    /// The high of the last batch flushed for this table.
    high: Option<Position>,
    /// Append-mode tables keep every change: each becomes a row downstream,
    /// so folding them per key would lose history.
    keep_every_change: bool,
}

impl Batcher {
    /// `metadata` should have passed [`validate_metadata`] for `tables`.
    pub fn new(
        tables: Vec<Arc<TableSchema>>,
        limits: BatchLimits,
        metadata: Vec<MetadataColumn>,
    ) -> Self {
        let mut batcher = Batcher {
            limits,
            metadata,
            tables: Vec::new(),
            by_name: HashMap::default(),
            last_table: 0,
            rows: 0,
            read_rows: 0,
            bytes: 0,
            oldest: None,
            consumed: None,
            idle_due: false,
        };
        for table in tables {
            batcher.table_index(&table);
        }
        batcher
    }

    /// Add a whole transaction. Returns the flushes this forced (0, 1 or
    /// more), oldest first. A change whose values do not fit its table is an
    /// error, and then nothing of the transaction is buffered.
    pub fn push(&mut self, tx: Transaction) -> Result<Vec<Flush>, BatchError> {
        if !tx.reads.is_empty() {
            return self.push_reads(tx);
        }
        let mut flushes = Vec::new();
        if self.read_rows > 0
            && tx.changes.iter().any(|c| {
                self.by_name
                    .get(&c.table.name)
                    .is_some_and(|&i| !self.tables[i].reads.is_empty())
            })
        {
            // Streamed changes after a table's snapshot rows: those rows
            // are committed first, as they are not indexed by key to fold
            // with, and before a change can widen the table's shape.
            flushes.extend(self.flush(false));
        }
        let sizes = tx
            .changes
            .iter()
            .map(|c| self.check(c))
            .collect::<Result<Vec<(usize, usize)>, _>>()?;
        let (rows, bytes) = (tx.changes.len(), sizes.iter().map(|s| s.1).sum::<usize>());
        let max_rows = self.limits.max_rows.max(1);
        let max_bytes = self.limits.max_bytes.max(1);

        if rows > max_rows || bytes > max_bytes {
            // Too big for any batch: commit it in pieces, each ending at its
            // last change, so that a resume inside the transaction works.
            flushes.extend(self.flush(false));
            let (mut piece_rows, mut piece_bytes) = (0, 0);
            for (change, (table, size)) in tx.changes.into_iter().zip(sizes) {
                if piece_rows > 0 && (piece_rows == max_rows || piece_bytes + size > max_bytes) {
                    flushes.extend(self.flush(false));
                    (piece_rows, piece_bytes) = (0, 0);
                }
                self.consumed = Some(change.pos.clone());
                self.add(change, table, size);
                (piece_rows, piece_bytes) = (piece_rows + 1, piece_bytes + size);
            }
            self.consumed = Some(tx.end);
            flushes.extend(self.flush(false));
            return Ok(flushes);
        }

        if self.rows + rows > max_rows || self.bytes + bytes > max_bytes {
            flushes.extend(self.flush(false));
        }
        for (change, (table, size)) in tx.changes.into_iter().zip(sizes) {
            self.add(change, table, size);
        }
        self.consumed = Some(tx.end);
        if self.rows >= max_rows || self.bytes >= max_bytes {
            flushes.extend(self.flush(false));
        }
        Ok(flushes)
    }

    /// Adds a transaction of snapshot rows, as [`Batcher::push`] does a
    /// transaction of changes: whole when it fits a batch, else in pieces
    /// each ending at its last row.
    fn push_reads(&mut self, tx: Transaction) -> Result<Vec<Flush>, BatchError> {
        let sizes = tx
            .reads
            .iter()
            .map(|rows| self.check_reads(rows, &tx))
            .collect::<Result<Vec<usize>, _>>()?;
        let (rows, bytes) = (tx.rows(), sizes.iter().sum::<usize>());
        let max_rows = self.limits.max_rows.max(1);
        let max_bytes = self.limits.max_bytes.max(1);
        let mut flushes = Vec::new();
        if tx
            .reads
            .iter()
            .any(|r| !self.tables[self.by_name[&r.table.name]].changes.is_empty())
        {
            flushes.extend(self.flush(false));
        }

        if rows > max_rows || bytes > max_bytes {
            flushes.extend(self.flush(false));
            for (reads, size) in tx.reads.into_iter().zip(sizes) {
                let row_bytes = size.div_ceil(reads.len()).max(1);
                let mut offset = 0;
                while offset < reads.len() {
                    let room = (max_rows - self.rows)
                        .min(max_bytes.saturating_sub(self.bytes) / row_bytes)
                        .min(reads.len() - offset);
                    if room == 0 && self.rows > 0 {
                        flushes.extend(self.flush(false));
                        continue;
                    }
                    let piece = reads.slice(offset, room.max(1));
                    offset += piece.len();
                    self.consumed = Some(piece.position(piece.len() - 1));
                    self.add_reads(piece.len() * row_bytes, piece);
                }
            }
            self.consumed = Some(tx.end);
            flushes.extend(self.flush(false));
            return Ok(flushes);
        }

        if self.rows + rows > max_rows || self.bytes + bytes > max_bytes {
            flushes.extend(self.flush(false));
        }
        for (reads, size) in tx.reads.into_iter().zip(sizes) {
            self.add_reads(size, reads);
        }
        self.consumed = Some(tx.end);
        if self.rows >= max_rows || self.bytes >= max_bytes {
            flushes.extend(self.flush(false));
        }
        Ok(flushes)
    }

    /// Checks that snapshot rows have their table's shape and types (the
    /// batch is built from their arrays as they are), and returns their bytes.
    fn check_reads(&mut self, reads: &SnapshotRows, tx: &Transaction) -> Result<usize, BatchError> {
        let index = self.table_index(&reads.table);
        let buffer = &self.tables[index];
        let fail = |reason: String| BatchError {
            table: reads.table.name.clone(),
            pos: tx.end.clone(),
            reason,
        };
        if !tx.changes.is_empty() {
            return Err(fail(
                "a transaction carries both changes and snapshot rows".into(),
            ));
        }
        if !Arc::ptr_eq(&buffer.table, &reads.table) && *buffer.table != *reads.table {
            // Added columns the source found before it read the rows (a
            // column added while it started), carried as for changes; the
            // rows buffered already are arrays of the old shape, which
            // cannot be widened here.
            if !buffer.reads.is_empty() {
                return Err(fail(format!(
                    "snapshot rows of shape ({}) where the table is ({})",
                    column_list(&reads.table),
                    column_list(&buffer.table)
                )));
            }
            self.evolve(index, &reads.table, &tx.end)?;
        }
        let buffer = &self.tables[index];
        if reads.columns.len() != buffer.table.columns.len() {
            return Err(fail(format!(
                "{} arrays of snapshot rows for {} columns",
                reads.columns.len(),
                buffer.table.columns.len()
            )));
        }
        for (array, column) in reads.columns.iter().zip(&buffer.table.columns) {
            if array.data_type() != &column.data_type || array.len() != reads.len() {
                return Err(fail(format!(
                    "column `{}`: {} snapshot values of type {} for {} rows of type {}",
                    column.name,
                    array.len(),
                    array.data_type(),
                    reads.len(),
                    column.data_type
                )));
            }
        }
        if reads.is_empty() || reads.positions.null_count() > 0 {
            return Err(fail("snapshot rows without positions".into()));
        }
        Ok(reads.bytes())
    }

    fn add_reads(&mut self, size: usize, reads: SnapshotRows) {
        if self.rows == 0 {
            self.oldest = Some(Instant::now());
        }
        let rows = reads.len();
        (self.rows, self.read_rows, self.bytes) =
            (self.rows + rows, self.read_rows + rows, self.bytes + size);
        let index = self.by_name[&reads.table.name];
        self.tables[index].reads.push(reads);
    }

    /// True once the oldest buffered change has waited `linger`.
    pub fn linger_expired(&self, now: Instant) -> bool {
        self.oldest
            .is_some_and(|since| now.saturating_duration_since(since) >= self.limits.linger)
    }

    /// Marks a heartbeat due: the next flush, made for whatever reason,
    /// brings idle tables along as `flush(true)` does. A run whose commits
    /// are always in flight (a backfill in batch-sized pieces, a slow sink)
    /// flushes only when a batch fills or lingers, and its idle tables
    /// advance all the same.
    pub fn heartbeat_due(&mut self) {
        self.idle_due = true;
    }

    /// True while a heartbeat is due and no flush has carried it yet.
    pub fn is_heartbeat_due(&self) -> bool {
        self.idle_due
    }

    /// Flush what is buffered: one batch per table with changes. With
    /// `include_idle` (or a heartbeat due), also an empty batch for every
    /// other table not yet at this flush's high, so idle tables advance too
    /// (heartbeat, end of a bounded run). None when there is nothing to flush.
    pub fn flush(&mut self, include_idle: bool) -> Option<Flush> {
        let include_idle = include_idle || std::mem::take(&mut self.idle_due);
        let high = self.consumed.clone()?;
        let ingest_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        let metadata = &self.metadata;
        let batches: Vec<TableBatch> = self
            .tables
            .iter_mut()
            .filter_map(|buffer| {
                buffer.drop_superseded();
                let changes = &buffer.changes;
                if changes.is_empty()
                    && buffer.reads.is_empty()
                    && !(include_idle && buffer.high.as_ref() != Some(&high))
                {
                    return None;
                }
                buffer.high = Some(high.clone());
                let records = if buffer.reads.is_empty() {
                    record_batch(
                        &buffer.table,
                        &buffer.schema,
                        metadata,
                        changes,
                        ingest_micros,
                    )
                } else {
                    debug_assert!(changes.is_empty(), "changes flush a table's reads first");
                    snapshot_record_batch(&buffer.schema, metadata, &buffer.reads, ingest_micros)
                };
                let low = match (buffer.reads.first(), changes.first()) {
                    (Some(reads), _) => reads.position(0),
                    (None, Some(change)) => change.pos.clone(),
                    (None, None) => high.clone(),
                };
                buffer.reads.clear();
                // Cleared, not dropped: the next batch reuses the capacity.
                buffer.changes.clear();
                Some(TableBatch::new(
                    buffer.table.clone(),
                    low,
                    high.clone(),
                    records,
                ))
            })
            .collect();
        (self.rows, self.read_rows, self.bytes, self.oldest) = (0, 0, 0, None);
        (!batches.is_empty()).then_some(Flush { high, batches })
    }

    /// The position of the last change (or transaction end) consumed.
    pub fn consumed(&self) -> Option<&Position> {
        self.consumed.as_ref()
    }

    /// Changes waiting for the next flush, before last-write-wins.
    pub fn buffered_changes(&self) -> usize {
        self.rows
    }

    /// Keeps every change of `table` in its batches instead of the last per
    /// key: for tables the pipeline maps in append mode.
    pub fn keep_every_change(&mut self, table: &str) {
        if let Some(&index) = self.by_name.get(table) {
            self.tables[index].keep_every_change = true;
        }
    }

    /// The buffer of `table`, registering a table the source did not announce.
    fn table_index(&mut self, table: &Arc<TableSchema>) -> usize {
        if self
            .tables
            .get(self.last_table)
            .is_some_and(|t| Arc::ptr_eq(&t.table, table))
        {
            return self.last_table;
        }
        if let Some(&index) = self.by_name.get(&table.name) {
            self.last_table = index;
            return index;
        }
        self.tables.push(TableBuffer {
            table: table.clone(),
            schema: arrow_schema(table, &self.metadata),
            reads: Vec::new(),
            changes: Vec::new(),
            superseded: Vec::new(),
            superseded_count: 0,
            latest: HashMap::default(),
            indexed: 0,
            high: None,
            keep_every_change: false,
        });
        self.by_name
            .insert(table.name.clone(), self.tables.len() - 1);
        self.tables.len() - 1
    }

    /// Checks that the change fits its table and estimates its size in bytes.
    /// The index of the change's table and the change's size.
    fn check(&mut self, change: &Change) -> Result<(usize, usize), BatchError> {
        let index = self.table_index(&change.table);
        if !Arc::ptr_eq(&self.tables[index].table, &change.table)
            && *self.tables[index].table != *change.table
        {
            self.evolve(index, &change.table, &change.pos)?;
        }
        let table = self.tables[index].table.clone();
        let fail = |reason: String| BatchError {
            table: table.name.clone(),
            pos: change.pos.clone(),
            reason,
        };
        if change.values.len() != table.columns.len() {
            return Err(fail(format!(
                "{} values for {} columns",
                change.values.len(),
                table.columns.len()
            )));
        }
        for (value, column) in change.values.iter().zip(&table.columns) {
            fits(value, &column.data_type)
                .map_err(|why| fail(format!("column `{}`: {why}", column.name)))?;
        }
        Ok((index, change_bytes(change)))
    }

    /// A source added columns to a table (Postgres: `ALTER TABLE ... ADD
    /// COLUMN`): from here on the table's batches carry them, as nullable
    /// columns, and the changes already buffered get nulls there. Any other
    /// change of shape is refused: the sink would get wrong data.
    fn evolve(
        &mut self,
        index: usize,
        new: &Arc<TableSchema>,
        pos: &Position,
    ) -> Result<(), BatchError> {
        let old = self.tables[index].table.clone();
        let new = new.clone();
        let fail = |reason: String| BatchError {
            table: old.name.clone(),
            pos: pos.clone(),
            reason,
        };
        if new.columns.len() < old.columns.len()
            || new.columns[..old.columns.len()] != old.columns[..]
            || new.key != old.key
        {
            return Err(fail(format!(
                "the table's shape changed from ({}) to ({}); only added columns can be carried",
                column_list(&old),
                column_list(&new)
            )));
        }
        for column in &new.columns[old.columns.len()..] {
            if CONTROL_COLUMNS.contains(&column.name.as_str())
                || self.metadata.iter().any(|m| m.name == column.name)
            {
                return Err(fail(format!(
                    "added column `{}` clashes with a control or metadata column",
                    column.name
                )));
            }
        }
        let buffer = &mut self.tables[index];
        let width = new.columns.len();
        for change in buffer.changes.iter_mut() {
            change.values.resize(width, Value::Null);
            change.table = new.clone();
        }
        buffer.schema = arrow_schema(&new, &self.metadata);
        buffer.table = new;
        Ok(())
    }

    /// Buffers `change` of table `table` (an index from [`Batcher::check`]).
    fn add(&mut self, change: Change, table: usize, size: usize) {
        if self.rows == 0 {
            self.oldest = Some(Instant::now());
        }
        (self.rows, self.bytes) = (self.rows + 1, self.bytes + size);
        let buffer = &mut self.tables[table];
        let snapshot = change.snapshot;
        buffer.changes.push(change);
        buffer.superseded.push(false);
        if !buffer.table.key.is_empty() && !buffer.keep_every_change && !snapshot {
            buffer.index_to_end();
        }
    }
}

impl TableBuffer {
    /// Folds every change not yet indexed into `latest`, in order: the
    /// last change to a key wins.
    fn index_to_end(&mut self) {
        for index in self.indexed..self.changes.len() {
            if let Some(previous) = self.latest.insert(key_bytes(&self.changes[index]), index) {
                self.superseded[previous] = true;
                self.superseded_count += 1;
            }
        }
        self.indexed = self.changes.len();
    }

    /// Leaves only the changes no later change to their key won, and
    /// forgets the index, before a flush.
    fn drop_superseded(&mut self) {
        if self.superseded_count > 0 {
            let mut superseded = self.superseded.iter();
            self.changes
                .retain(|_| !superseded.next().copied().unwrap_or(false));
        }
        self.superseded.clear();
        self.superseded_count = 0;
        self.latest.clear();
        self.indexed = 0;
    }
}

fn column_list(table: &TableSchema) -> String {
    table
        .columns
        .iter()
        .map(|c| format!("{} {}", c.name, c.data_type))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A rough size: values, the position, and a little for op and timestamps.
fn change_bytes(change: &Change) -> usize {
    change.values.iter().map(value_bytes).sum::<usize>() + change.pos.as_bytes().len() + 16
}

fn value_bytes(value: &Value) -> usize {
    match value {
        Value::Null => 1,
        Value::Utf8(s) => s.len(),
        Value::Binary(b) => b.len(),
        Value::List(items) => 8 + items.iter().map(value_bytes).sum::<usize>(),
        Value::Decimal128(_) => 16,
        _ => 8,
    }
}

/// The key columns' values as bytes, for last-write-wins lookups (Value is
/// not Hash because of floats).
fn key_bytes(change: &Change) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    for &k in &change.table.key {
        let value = &change.values[k];
        let mut put = |tag: u8, bytes: &[u8]| {
            out.push(tag);
            out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(bytes);
        };
        match value {
            Value::Null => put(0, &[]),
            Value::Bool(v) => put(1, &[*v as u8]),
            Value::Int32(v) => put(2, &v.to_be_bytes()),
            Value::Int64(v) => put(3, &v.to_be_bytes()),
            Value::Float64(v) => put(4, &v.to_bits().to_be_bytes()),
            Value::Decimal128(v) => put(5, &v.to_be_bytes()),
            Value::Utf8(v) => put(6, v.as_bytes()),
            Value::Binary(v) => put(7, v),
            Value::Date32(v) => put(8, &v.to_be_bytes()),
            Value::TimestampMicros(v) => put(9, &v.to_be_bytes()),
            // Lists cannot be key columns (sources refuse them); any stable bytes do.
            Value::List(items) => put(10, format!("{items:?}").as_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests;
