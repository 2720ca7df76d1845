//! Row changes as sources produce them, before they are batched into Arrow.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BinaryArray};
use arrow_schema::{DataType, Field};

use weir_core::position::Position;

/// What happened to a row, and the time zone of zoned timestamps: the
/// contract's, so sources, batches and sinks spell them alike.
pub use weir_contract::{Op, UTC_ZONE};

/// One column value. Sources convert their native values into these; the
/// batcher turns them into Arrow arrays of the column's declared type.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int32(i32),
    /// A bigint; in a `Time64(Microsecond)` column, microseconds since midnight.
    Int64(i64),
    Float64(f64),
    /// Unscaled value; precision and scale come from the column's type.
    Decimal128(i128),
    Utf8(String),
    /// Bytes; in a `FixedSizeBinary` column (a uuid), exactly its width.
    Binary(Vec<u8>),
    /// Days since the Unix epoch.
    Date32(i32),
    /// Microseconds since the Unix epoch; the column's type says whether it
    /// is zoned (UTC) or not.
    TimestampMicros(i64),
    /// The items of a list column (Postgres: a one-dimensional array), each
    /// a value of the list's item type or null.
    List(Vec<Value>),
}

impl Value {
    /// Appends a boolean, integer, decimal, date or timestamp as bytes whose
    /// order is the value's (big-endian, the sign bit flipped), for keys
    /// that must sort as the source sorts them; false, appending nothing,
    /// for any other value.
    pub(crate) fn push_ordered(&self, out: &mut Vec<u8>) -> bool {
        match self {
            Value::Bool(v) => out.push(u8::from(*v)),
            Value::Int32(v) | Value::Date32(v) => {
                out.extend_from_slice(&((*v as u32) ^ (1 << 31)).to_be_bytes())
            }
            Value::Int64(v) | Value::TimestampMicros(v) => {
                out.extend_from_slice(&((*v as u64) ^ (1 << 63)).to_be_bytes())
            }
            Value::Decimal128(v) => {
                out.extend_from_slice(&((*v as u128) ^ (1 << 127)).to_be_bytes())
            }
            _ => return false,
        }
        true
    }
}

/// The Arrow type of a uuid: its 16 bytes. Every field of this type the
/// host builds is marked with Arrow's canonical `arrow.uuid` extension (see
/// [`field`]), so a sink can tell a uuid from other 16 bytes.
pub fn uuid_type() -> DataType {
    DataType::FixedSizeBinary(16)
}

/// Arrow's extension-name metadata key and the canonical name of a uuid.
pub const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
pub const UUID_EXTENSION: &str = "arrow.uuid";

/// The Arrow field of a column or list item, with the uuid extension on
/// fields of [`uuid_type`].
pub fn field(name: &str, data_type: DataType, nullable: bool) -> Field {
    let is_uuid = data_type == uuid_type();
    let field = Field::new(name, data_type, nullable);
    if is_uuid {
        field.with_metadata([(EXTENSION_NAME_KEY.to_string(), UUID_EXTENSION.to_string())].into())
    } else {
        field
    }
}

/// A column of a source table.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    pub name: String,
    pub data_type: DataType,
    pub nullable: bool,
}

/// The shape of a source table.
#[derive(Clone, Debug, PartialEq)]
pub struct TableSchema {
    /// Source name, for example `public.orders`.
    pub name: String,
    pub columns: Vec<Column>,
    /// Indexes into `columns` of the key, in key order.
    pub key: Vec<usize>,
}

impl TableSchema {
    pub fn key_names(&self) -> Vec<String> {
        self.key
            .iter()
            .map(|&i| self.columns[i].name.clone())
            .collect()
    }
}

/// One row change. `values` follows the table's column order; a delete
/// carries the key values and nulls elsewhere.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub table: Arc<TableSchema>,
    pub op: Op,
    pub pos: Position,
    /// Commit time of the source transaction, microseconds since the epoch.
    pub commit_ts_micros: i64,
    /// True for rows read by a snapshot rather than streamed. A snapshot
    /// reads each key of a table at most once (the batcher folds snapshot
    /// rows only with the streamed changes that follow them).
    pub snapshot: bool,
    pub values: Vec<Value>,
}

impl Change {
    /// The values of the key columns, used for last-write-wins per key.
    pub fn key_values(&self) -> Vec<&Value> {
        self.table.key.iter().map(|&i| &self.values[i]).collect()
    }
}

/// Rows a snapshot read (`Op::Read`), already columnar: what a backfill
/// hands on instead of one [`Change`] per row, so that a row costs no
/// allocation of its own on its way to the sinks. A snapshot reads each key
/// of a table at most once.
#[derive(Clone, Debug)]
pub struct SnapshotRows {
    pub table: Arc<TableSchema>,
    /// One array per column of `table`, in column order, each of the
    /// column's declared type, all of one length.
    pub columns: Vec<ArrayRef>,
    /// Each row's position, ascending, none null.
    pub positions: BinaryArray,
    /// When the snapshot was read, microseconds since the epoch.
    pub commit_ts_micros: i64,
}

impl SnapshotRows {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// The position of row `row`.
    pub fn position(&self, row: usize) -> Position {
        Position::from_bytes(self.positions.value(row).to_vec())
    }

    /// Rows `offset..offset + len`, sharing this one's buffers.
    pub fn slice(&self, offset: usize, len: usize) -> SnapshotRows {
        SnapshotRows {
            table: self.table.clone(),
            columns: self.columns.iter().map(|c| c.slice(offset, len)).collect(),
            positions: self.positions.slice(offset, len),
            commit_ts_micros: self.commit_ts_micros,
        }
    }

    /// The bytes of the rows' values and positions (a slice counts only
    /// its own rows).
    pub fn bytes(&self) -> usize {
        self.columns
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
            .sum::<usize>()
            + self
                .positions
                .to_data()
                .get_slice_memory_size()
                .unwrap_or(0)
    }
}

/// A source transaction, delivered whole: every change in it, in order.
/// `end` is the position the source stands at once the transaction has been
/// applied (the last change's position, or a heartbeat position when empty).
/// A backfill's transactions carry their rows in `reads` instead (one
/// transaction holds changes or reads, not both).
#[derive(Clone, Debug)]
pub struct Transaction {
    pub changes: Vec<Change>,
    pub reads: Vec<SnapshotRows>,
    pub end: Position,
    /// This continues a source transaction whose first changes came in an
    /// earlier `Transaction` (a big one, handed on in pieces): for counting
    /// transactions without reading positions.
    pub continued: bool,
}

impl Transaction {
    /// A transaction of row changes (none: a heartbeat at `end`).
    pub fn of_changes(changes: Vec<Change>, end: Position) -> Transaction {
        Transaction {
            changes,
            reads: Vec::new(),
            end,
            continued: false,
        }
    }

    /// A chunk of backfill rows, read in one snapshot, ending at `end`.
    pub fn of_reads(reads: Vec<SnapshotRows>, end: Position) -> Transaction {
        Transaction {
            changes: Vec::new(),
            reads,
            end,
            continued: false,
        }
    }

    /// Rows changed or read.
    pub fn rows(&self) -> usize {
        self.changes.len() + self.reads.iter().map(SnapshotRows::len).sum::<usize>()
    }
}
