//! A batch turned into Redis changes, staged per table until its commit.
//!
//! Rendering happens in `write`, not in `commit`: a value Redis cannot take
//! is reported as poison for the batch that carries it, and the sink keeps
//! the rendered bytes instead of the Arrow batch.

use std::collections::HashMap;

use weir_sdk::arrow_array::RecordBatch;
use weir_sdk::{Batch, Mode, Op, Result, SinkError};

use crate::keys::{Layout, RESERVED_DESTINATION};
use crate::render;

/// Redis refuses a string longer than this (`proto-max-bulk-len`'s default).
pub const MAX_VALUE_BYTES: usize = 512 * 1024 * 1024;
/// The script passes one stream entry's fields to `XADD` in one Lua
/// `unpack`, which holds at most about 8000 values; this leaves room.
pub const MAX_ENTRY_FIELDS: usize = 3_000;
/// A stream entry needs at least one field; a change whose every column is
/// null is stored with this one, its value empty.
pub const EMPTY_ENTRY_FIELD: &[u8] = b"__empty";

/// One field of a hash or stream entry: name and rendered value.
pub type FieldValue = (Vec<u8>, Vec<u8>);

/// What one change does in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Replace the hash at `key` with these fields (`DEL` then `HSET`).
    Hash {
        key: Vec<u8>,
        fields: Vec<FieldValue>,
    },
    /// Remove the hash at `key`.
    Delete { key: Vec<u8> },
    /// Add an entry with these fields to the stream at `key`.
    Entry {
        key: Vec<u8>,
        fields: Vec<FieldValue>,
    },
}

impl Change {
    pub fn key(&self) -> &[u8] {
        match self {
            Change::Hash { key, .. } | Change::Delete { key } | Change::Entry { key, .. } => key,
        }
    }

    pub fn fields(&self) -> &[FieldValue] {
        match self {
            Change::Hash { fields, .. } | Change::Entry { fields, .. } => fields,
            Change::Delete { .. } => &[],
        }
    }

    /// About what the change costs in the command that commits it.
    fn size(&self) -> usize {
        let fields: usize = self
            .fields()
            .iter()
            .map(|(f, v)| f.len() + v.len() + 32)
            .sum();
        self.key().len() + fields + 32
    }
}

/// Everything staged for one table since its last commit.
#[derive(Debug, Default)]
pub struct Staged {
    /// In arrival order. An upsert key appears once: a later change to it
    /// replaces the earlier one in place, since only the last one shows.
    changes: Vec<Change>,
    /// Where each upsert key sits in `changes`.
    by_key: HashMap<Vec<u8>, usize>,
    /// Sum of [`Change::size`] over `changes`.
    bytes: usize,
    /// The position of the first change staged (the lowest `low` of the
    /// batches that brought changes).
    low: Option<Vec<u8>>,
}

impl Staged {
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// The position of the first change staged, if any was.
    pub fn low(&self) -> Option<&[u8]> {
        self.low.as_deref()
    }

    /// A batch whose first change is at `low` brought changes.
    pub fn starts_at(&mut self, low: &[u8]) {
        if self.low.as_deref().is_none_or(|l| low < l) {
            self.low = Some(low.to_vec());
        }
    }

    /// Adds a batch's changes, all or none. `limit` bounds the staged bytes;
    /// the check counts a change that will replace a staged one as extra,
    /// which errs on the safe side by at most that batch.
    pub fn add(
        &mut self,
        changes: Vec<Change>,
        limit: usize,
        what: impl Fn() -> String,
    ) -> Result<()> {
        let incoming: usize = changes.iter().map(Change::size).sum();
        let bound = self.bytes + incoming;
        if bound > limit {
            return Err(SinkError::Poison(format!(
                "{}: one commit of this table would carry {} MiB of Redis commands, more than \
                 config key `max_commit_mb` allows ({} MiB); make batches smaller (the \
                 pipeline's batch limits) or raise it",
                what(),
                bound.div_ceil(1 << 20),
                limit >> 20
            )));
        }
        for change in changes {
            self.bytes += change.size();
            let Some(key) = compaction_key(&change) else {
                self.changes.push(change);
                continue;
            };
            match self.by_key.get(key) {
                Some(&at) => {
                    self.bytes -= self.changes[at].size();
                    self.changes[at] = change;
                }
                None => {
                    self.by_key.insert(key.to_vec(), self.changes.len());
                    self.changes.push(change);
                }
            }
        }
        Ok(())
    }
}

/// The key a change is compacted by: hashes and deletes, not stream entries.
fn compaction_key(change: &Change) -> Option<&[u8]> {
    match change {
        Change::Hash { key, .. } | Change::Delete { key } => Some(key),
        Change::Entry { .. } => None,
    }
}

/// Renders a batch into its changes. Fails with [`SinkError::Poison`],
/// naming the batch, its table and the column or row, when Redis cannot
/// take it.
pub fn prepare(batch: &Batch, layout: &Layout) -> Result<Vec<Change>> {
    let poison = |why: String| {
        SinkError::Poison(format!(
            "batch {} of table {}: {why}",
            batch.id, batch.table.name
        ))
    };
    let table = &batch.table;
    if table.destination == RESERVED_DESTINATION {
        return Err(poison(format!(
            "the destination name `{RESERVED_DESTINATION}` is reserved for the sink's positions; \
             map the table to another name"
        )));
    }
    let data = batch.data();
    let schema = data.schema();
    for field in schema.fields() {
        render::check_type(field.data_type())
            .map_err(|why| poison(format!("column `{}`: {why}", field.name())))?;
    }
    let names: Vec<&[u8]> = schema
        .fields()
        .iter()
        .map(|f| f.name().as_bytes())
        .collect();
    let row_fields = |row: usize| -> Result<Vec<FieldValue>> {
        let mut fields = Vec::with_capacity(names.len());
        for (column, name) in data.columns().iter().zip(&names) {
            let value = render::field(column.as_ref(), row)
                .map_err(|why| poison(format!("column `{}`, row {row}: {why}", to_text(name))))?;
            if let Some(value) = value {
                if value.len() > MAX_VALUE_BYTES {
                    return Err(poison(format!(
                        "column `{}`, row {row}: {} bytes, more than the {MAX_VALUE_BYTES} a \
                         Redis string can hold",
                        to_text(name),
                        value.len()
                    )));
                }
                fields.push((name.to_vec(), value));
            }
        }
        Ok(fields)
    };

    let appends = table.mode == Mode::Append || table.key_columns.is_empty();
    if appends {
        if names.len() > MAX_ENTRY_FIELDS {
            return Err(poison(format!(
                "{} columns; a stream entry of this sink holds at most {MAX_ENTRY_FIELDS}",
                names.len()
            )));
        }
        let key = layout.stream_key(&table.destination);
        return (0..data.num_rows())
            .map(|row| {
                let mut fields = row_fields(row)?;
                if fields.is_empty() {
                    fields.push((EMPTY_ENTRY_FIELD.to_vec(), Vec::new()));
                }
                Ok(Change::Entry {
                    key: key.clone(),
                    fields,
                })
            })
            .collect();
    }

    let key_columns = key_indices(&data, &table.key_columns).map_err(poison)?;
    let mut changes = Vec::with_capacity(data.num_rows());
    for (row, op) in batch.ops().iter().enumerate() {
        let mut key_values = Vec::with_capacity(key_columns.len());
        for &(index, name) in &key_columns {
            let value = render::field(data.column(index).as_ref(), row)
                .map_err(|why| poison(format!("key column `{name}`, row {row}: {why}")))?
                .ok_or_else(|| poison(format!("key column `{name}` is null in row {row}")))?;
            key_values.push(value);
        }
        let key = layout.row_key(&table.destination, key_values.iter().map(Vec::as_slice));
        if key.len() > MAX_VALUE_BYTES {
            return Err(poison(format!(
                "row {row}: its Redis key is longer than {MAX_VALUE_BYTES} bytes"
            )));
        }
        changes.push(match op {
            Op::Delete => Change::Delete { key },
            Op::Insert | Op::Update | Op::Read => Change::Hash {
                key,
                fields: row_fields(row)?,
            },
        });
    }
    Ok(changes)
}

/// The positions of the key columns in `data`, with their names.
fn key_indices<'t>(
    data: &RecordBatch,
    key_columns: &'t [String],
) -> Result<Vec<(usize, &'t str)>, String> {
    key_columns
        .iter()
        .map(|name| {
            data.schema()
                .index_of(name)
                .map(|index| (index, name.as_str()))
                .map_err(|_| format!("key column `{name}` is not in the batch"))
        })
        .collect()
}

fn to_text(name: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(name)
}
