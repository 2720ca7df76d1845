//! Control columns, operations, table modes and context fields, with their
//! spellings in configs, in the WIT contract and in Arrow batches.
//!
//! A sink author meets these through `weir-sdk`, which re-exports
//! [`OP_COLUMN`], [`POS_COLUMN`], [`Op`] and [`Mode`]: every batch a sink
//! receives ends with the two control columns, and its table says which
//! [`Mode`] to apply it in.

use std::fmt;
use std::str::FromStr;

use arrow_schema::{DataType, TimeUnit};

/// Name of the control column holding each row's operation (utf8: `insert`,
/// `update`, `delete` or `read`). Every batch ends with it; it is not meant
/// for the destination.
pub const OP_COLUMN: &str = "__op";

/// Name of the control column holding each row's position (binary; comparing
/// the bytes compares source order). Every batch ends with it; it is not
/// meant for the destination.
pub const POS_COLUMN: &str = "__pos";

/// The control columns every batch ends with, in this order.
pub const CONTROL_COLUMNS: [&str; 2] = [OP_COLUMN, POS_COLUMN];

/// The time zone of every zoned timestamp column weir produces. An offset
/// rather than the name `UTC`: Arrow readers without a time-zone database
/// (arrow-rs without `chrono-tz`, which sinks built for WebAssembly usually
/// are) can only read offset zones.
pub const UTC_ZONE: &str = "+00:00";

/// The Arrow type of every zoned timestamp weir produces: microseconds in
/// [`UTC_ZONE`].
pub fn utc_micros() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some(UTC_ZONE.into()))
}

/// What happened to a row, as spelled in [`OP_COLUMN`]. Within a batch the
/// last change to a key wins, so a sink sees at most one row per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A new row.
    Insert,
    /// A changed row; it carries the new values.
    Update,
    /// A removed row; it carries the key columns, the others are null.
    /// Deleting a key the destination does not have is success.
    Delete,
    /// A row read by a snapshot or backfill: treat it like an upsert.
    Read,
}

impl Op {
    /// Every operation, in declaration order.
    pub const ALL: [Op; 4] = [Op::Insert, Op::Update, Op::Delete, Op::Read];

    /// Parses the spelling used in [`OP_COLUMN`].
    pub fn parse(text: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == text)
    }

    /// The spelling used in [`OP_COLUMN`].
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Read => "read",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a pipeline maps a table onto the destination; a sink reads it from
/// the table description of each batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// The destination mirrors the source: inserts and updates are an
    /// upsert at the key, a delete removes the row.
    #[default]
    Upsert,
    /// Every change becomes a new row, deletes included.
    Append,
}

impl Mode {
    /// Every mode, in declaration order.
    pub const ALL: [Mode; 2] = [Mode::Upsert, Mode::Append];

    /// Parses the spelling used in configs and in the WIT `table.mode`.
    pub fn parse(text: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|mode| mode.as_str() == text)
    }

    /// The spelling used in configs and in the WIT `table.mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Upsert => "upsert",
            Mode::Append => "append",
        }
    }

    /// A table without a key cannot be upserted: whatever the operator
    /// configured, it is kept as an append-only log.
    pub fn for_table(configured: Mode, has_key: bool) -> Mode {
        if has_key { configured } else { Mode::Append }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A context value a pipeline may materialize in the destination, under a
/// column name the operator chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContextField {
    /// The row's operation, as in [`OP_COLUMN`] (utf8).
    Op,
    /// The row's position, as in [`POS_COLUMN`] (binary).
    Pos,
    /// When the source committed the change (timestamp, UTC).
    CommitTs,
    /// When weir read the change (timestamp, UTC).
    IngestTs,
    /// Whether the row comes from a snapshot or backfill (boolean).
    Snapshot,
    /// `snapshot` for a row read by a snapshot or backfill, `stream` for a
    /// streamed change (utf8).
    Phase,
}

impl ContextField {
    /// Every context field, in declaration order.
    pub const ALL: [ContextField; 6] = [
        ContextField::Op,
        ContextField::Pos,
        ContextField::CommitTs,
        ContextField::IngestTs,
        ContextField::Snapshot,
        ContextField::Phase,
    ];

    /// The spelling in pipeline configs (`metadata[].from`): `commit_ts`.
    pub fn as_str(self) -> &'static str {
        match self {
            ContextField::Op => "op",
            ContextField::Pos => "pos",
            ContextField::CommitTs => "commit_ts",
            ContextField::IngestTs => "ingest_ts",
            ContextField::Snapshot => "snapshot",
            ContextField::Phase => "phase",
        }
    }

    /// The spelling in the WIT `metadata-column.source`: `commit-ts`.
    pub fn wit_name(self) -> &'static str {
        match self {
            ContextField::Op => "op",
            ContextField::Pos => "pos",
            ContextField::CommitTs => "commit-ts",
            ContextField::IngestTs => "ingest-ts",
            ContextField::Snapshot => "snapshot",
            ContextField::Phase => "phase",
        }
    }

    /// Parses the WIT spelling.
    pub fn from_wit_name(text: &str) -> Option<ContextField> {
        ContextField::ALL.into_iter().find(|f| f.wit_name() == text)
    }

    /// The Arrow type of the column this field materializes as.
    pub fn data_type(self) -> DataType {
        match self {
            ContextField::Op | ContextField::Phase => DataType::Utf8,
            ContextField::Pos => DataType::Binary,
            ContextField::CommitTs | ContextField::IngestTs => utc_micros(),
            ContextField::Snapshot => DataType::Boolean,
        }
    }

    /// The config spellings, for error messages.
    pub fn known() -> String {
        let known: Vec<&str> = ContextField::ALL.iter().map(|f| f.as_str()).collect();
        known.join(", ")
    }
}

impl FromStr for ContextField {
    type Err = String;

    /// Parses the config spelling.
    fn from_str(text: &str) -> Result<Self, String> {
        ContextField::ALL
            .into_iter()
            .find(|f| f.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown context field `{text}` (expected one of {})",
                    ContextField::known()
                )
            })
    }
}

impl fmt::Display for ContextField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A context column present in every batch, under the name the operator
/// chose for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MetadataColumn {
    /// Which context value the column holds.
    pub field: ContextField,
    /// The column's name in the batch and in the destination.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for field in ContextField::ALL {
            assert_eq!(field.as_str().parse::<ContextField>(), Ok(field));
            assert_eq!(ContextField::from_wit_name(field.wit_name()), Some(field));
        }
        for op in Op::ALL {
            assert_eq!(Op::parse(op.as_str()), Some(op));
        }
        for mode in Mode::ALL {
            assert_eq!(Mode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(ContextField::CommitTs.wit_name(), "commit-ts");
        assert!("commit-ts".parse::<ContextField>().is_err());
    }

    #[test]
    fn keyless_tables_are_append() {
        assert_eq!(Mode::for_table(Mode::Upsert, false), Mode::Append);
        assert_eq!(Mode::for_table(Mode::Upsert, true), Mode::Upsert);
        assert_eq!(Mode::for_table(Mode::Append, true), Mode::Append);
    }
}
