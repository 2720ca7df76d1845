//! Changes into Arrow: the schema of a table's batches and the record batch
//! of its buffered changes, column by column, with the values checked
//! against the declared types before anything is built.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Date32Builder, Decimal128Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, FixedSizeBinaryArray,
    Float64Array, Int32Array, Int64Array, RecordBatch, StringArray, Time64MicrosecondArray,
    TimestampMicrosecondArray, new_null_array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::{ContextField, MetadataColumn, OP_COLUMN, POS_COLUMN};
use crate::change::{Change, SnapshotRows, TableSchema, Value};

/// Table columns (all nullable: delete rows carry nulls), then the
/// operator's metadata columns, then the control columns.
pub(super) fn arrow_schema(table: &TableSchema, metadata: &[MetadataColumn]) -> SchemaRef {
    let columns = table
        .columns
        .iter()
        .map(|c| crate::change::field(&c.name, c.data_type.clone(), true));
    let metadata = metadata
        .iter()
        .map(|m| Field::new(&m.name, m.field.data_type(), false));
    let control = [
        Field::new(OP_COLUMN, DataType::Utf8, false),
        Field::new(POS_COLUMN, DataType::Binary, false),
    ];
    Arc::new(Schema::new(
        columns.chain(metadata).chain(control).collect::<Vec<_>>(),
    ))
}

pub(super) fn record_batch(
    table: &TableSchema,
    schema: &SchemaRef,
    metadata: &[MetadataColumn],
    changes: &[Change],
    ingest_micros: i64,
) -> RecordBatch {
    let columns = (0..table.columns.len())
        .map(|i| {
            column_array(
                &table.columns[i].data_type,
                changes.iter().map(|c| &c.values[i]),
                changes.len(),
            )
        })
        .chain(
            metadata
                .iter()
                .map(|m| context_array(m.field, changes, ingest_micros)),
        )
        .chain(
            [ContextField::Op, ContextField::Pos].map(|f| context_array(f, changes, ingest_micros)),
        )
        .collect();
    RecordBatch::try_new(schema.clone(), columns).expect("columns are built to the schema's types")
}

/// One column from values already checked by [`fits`]: anything that is not
/// the column's own variant is null.
pub(crate) fn column_array<'a>(
    data_type: &DataType,
    values: impl Iterator<Item = &'a Value>,
    len: usize,
) -> ArrayRef {
    macro_rules! collect {
        ($array:ty, $variant:ident) => {
            collect!($array, $variant, x => *x)
        };
        ($array:ty, $variant:ident, $x:ident => $map:expr) => {
            values
                .map(|v| match v {
                    Value::$variant($x) => Some($map),
                    _ => None,
                })
                .collect::<$array>()
        };
    }
    match data_type {
        DataType::Boolean => Arc::new(collect!(BooleanArray, Bool)),
        DataType::Int32 => Arc::new(collect!(Int32Array, Int32)),
        DataType::Int64 => Arc::new(collect!(Int64Array, Int64)),
        DataType::Float64 => Arc::new(collect!(Float64Array, Float64)),
        DataType::Date32 => Arc::new(collect!(Date32Array, Date32)),
        DataType::Decimal128(precision, scale) => Arc::new(
            collect!(Decimal128Array, Decimal128)
                .with_precision_and_scale(*precision, *scale)
                .expect("a Decimal128 type from a table schema is valid"),
        ),
        DataType::Timestamp(TimeUnit::Microsecond, zone) => Arc::new(
            collect!(TimestampMicrosecondArray, TimestampMicros).with_timezone_opt(zone.clone()),
        ),
        DataType::Utf8 => Arc::new(collect!(StringArray, Utf8, s => s.as_str())),
        DataType::Binary => Arc::new(collect!(BinaryArray, Binary, b => b.as_slice())),
        DataType::FixedSizeBinary(width) => Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                values.map(|v| match v {
                    Value::Binary(b) => Some(b.as_slice()),
                    _ => None,
                }),
                *width,
            )
            .expect("fixed-size values are checked by `fits`"),
        ),
        DataType::Time64(TimeUnit::Microsecond) => {
            Arc::new(collect!(Time64MicrosecondArray, Int64))
        }
        DataType::List(item) => {
            let mut lengths = Vec::with_capacity(len);
            let mut nulls = Vec::with_capacity(len);
            let mut items: Vec<&Value> = Vec::new();
            for value in values {
                match value {
                    Value::List(list) => {
                        lengths.push(list.len());
                        nulls.push(true);
                        items.extend(list.iter());
                    }
                    _ => {
                        lengths.push(0);
                        nulls.push(false);
                    }
                }
            }
            let count = items.len();
            let child = column_array(item.data_type(), items.into_iter(), count);
            Arc::new(arrow_array::ListArray::new(
                item.clone(),
                arrow_buffer::OffsetBuffer::from_lengths(lengths),
                child,
                Some(arrow_buffer::NullBuffer::from(nulls)),
            ))
        }
        // Only nulls pass `fits` for any other type.
        other => new_null_array(other, len),
    }
}

/// The record batch of a table's buffered snapshot rows: their arrays as
/// they are (concatenated when there are several pieces), then the
/// metadata and control columns, as [`record_batch`] builds them for reads.
pub(super) fn snapshot_record_batch(
    schema: &SchemaRef,
    metadata: &[MetadataColumn],
    reads: &[SnapshotRows],
    ingest_micros: i64,
) -> RecordBatch {
    let joined = |arrays: Vec<&dyn Array>| -> ArrayRef {
        match arrays[..] {
            [one] => one.slice(0, one.len()),
            _ => arrow_select::concat::concat(&arrays).expect("the batcher checked the types"),
        }
    };
    let width = reads.first().map_or(0, |r| r.columns.len());
    let rows: usize = reads.iter().map(SnapshotRows::len).sum();
    let repeat = |value: i64| TimestampMicrosecondArray::from_value(value, rows);
    let columns = (0..width)
        .map(|i| joined(reads.iter().map(|r| r.columns[i].as_ref()).collect()))
        .chain(metadata.iter().map(|m| -> ArrayRef {
            match m.field {
                ContextField::Op => Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    crate::change::Op::Read.as_str(),
                    rows,
                ))),
                ContextField::Pos => {
                    joined(reads.iter().map(|r| &r.positions as &dyn Array).collect())
                }
                ContextField::CommitTs => Arc::new(
                    TimestampMicrosecondArray::from_iter_values(
                        reads
                            .iter()
                            .flat_map(|r| std::iter::repeat_n(r.commit_ts_micros, r.len())),
                    )
                    .with_timezone(crate::change::UTC_ZONE),
                ),
                ContextField::IngestTs => {
                    Arc::new(repeat(ingest_micros).with_timezone(crate::change::UTC_ZONE))
                }
                ContextField::Snapshot => Arc::new(BooleanArray::from(vec![true; rows])),
                ContextField::Phase => Arc::new(StringArray::from_iter_values(
                    std::iter::repeat_n("snapshot", rows),
                )),
            }
        }))
        .chain([
            Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                crate::change::Op::Read.as_str(),
                rows,
            ))) as ArrayRef,
            joined(reads.iter().map(|r| &r.positions as &dyn Array).collect()),
        ])
        .collect();
    RecordBatch::try_new(schema.clone(), columns).expect("the batcher checked the types")
}

fn context_array(field: ContextField, changes: &[Change], ingest_micros: i64) -> ArrayRef {
    let each = changes.iter();
    match field {
        ContextField::Op => Arc::new(StringArray::from_iter_values(each.map(|c| c.op.as_str()))),
        ContextField::Pos => Arc::new(BinaryArray::from_iter_values(
            each.map(|c| c.pos.as_bytes()),
        )),
        ContextField::CommitTs => Arc::new(
            TimestampMicrosecondArray::from_iter_values(each.map(|c| c.commit_ts_micros))
                .with_timezone(crate::change::UTC_ZONE),
        ),
        ContextField::IngestTs => Arc::new(
            TimestampMicrosecondArray::from_iter_values(each.map(|_| ingest_micros))
                .with_timezone(crate::change::UTC_ZONE),
        ),
        ContextField::Snapshot => {
            Arc::new(each.map(|c| Some(c.snapshot)).collect::<BooleanArray>())
        }
        ContextField::Phase => Arc::new(StringArray::from_iter_values(
            each.map(|c| if c.snapshot { "snapshot" } else { "stream" }),
        )),
    }
}

/// Whether `value` can be stored in a column of `data_type`.
pub(crate) fn fits(value: &Value, data_type: &DataType) -> Result<(), String> {
    match (value, data_type) {
        (Value::Null, _)
        | (Value::Bool(_), DataType::Boolean)
        | (Value::Int32(_), DataType::Int32)
        | (Value::Int64(_), DataType::Int64)
        | (Value::Float64(_), DataType::Float64)
        | (Value::Utf8(_), DataType::Utf8)
        | (Value::Binary(_), DataType::Binary)
        | (Value::Date32(_), DataType::Date32)
        | (Value::TimestampMicros(_), DataType::Timestamp(TimeUnit::Microsecond, _)) => Ok(()),
        (Value::Binary(bytes), DataType::FixedSizeBinary(width)) => {
            if usize::try_from(*width) == Ok(bytes.len()) {
                Ok(())
            } else {
                Err(format!(
                    "{} bytes do not fit a fixed-size binary of {width}",
                    bytes.len()
                ))
            }
        }
        (Value::Int64(micros), DataType::Time64(TimeUnit::Microsecond)) => {
            if (0..86_400_000_000).contains(micros) {
                Ok(())
            } else {
                Err(format!("{micros} microseconds is not a time of day"))
            }
        }
        (Value::Decimal128(unscaled), DataType::Decimal128(precision, _)) => {
            match 10u128.checked_pow((*precision).into()) {
                Some(limit) if unscaled.unsigned_abs() >= limit => Err(format!(
                    "decimal {unscaled} (unscaled) has more than {precision} digits"
                )),
                _ => Ok(()),
            }
        }
        (Value::List(items), DataType::List(item)) => items
            .iter()
            .try_for_each(|v| fits(v, item.data_type()).map_err(|why| format!("list item: {why}"))),
        (value, data_type) => Err(format!("value {value:?} does not fit type {data_type}")),
    }
}

/// One column built a value at a time, for a source that converts rows
/// straight into columns: the array [`column_array`] makes of the same
/// values (anything that is not the column's own variant is null), without
/// holding the values in between. Types without a builder of their own
/// keep the values and go through [`column_array`].
pub(crate) enum ColumnBuilder {
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float64(Float64Builder),
    Date32(Date32Builder),
    Time64(Time64MicrosecondBuilder),
    Decimal128(Decimal128Builder, u8, i8),
    Timestamp(TimestampMicrosecondBuilder, Option<Arc<str>>),
    Utf8(StringBuilder),
    Binary(BinaryBuilder),
    Values(Vec<Value>, DataType),
}

impl ColumnBuilder {
    pub(crate) fn new(data_type: &DataType, capacity: usize) -> ColumnBuilder {
        match data_type {
            DataType::Int32 => ColumnBuilder::Int32(Int32Builder::with_capacity(capacity)),
            DataType::Int64 => ColumnBuilder::Int64(Int64Builder::with_capacity(capacity)),
            DataType::Float64 => ColumnBuilder::Float64(Float64Builder::with_capacity(capacity)),
            DataType::Date32 => ColumnBuilder::Date32(Date32Builder::with_capacity(capacity)),
            DataType::Time64(TimeUnit::Microsecond) => {
                ColumnBuilder::Time64(Time64MicrosecondBuilder::with_capacity(capacity))
            }
            DataType::Decimal128(precision, scale) => ColumnBuilder::Decimal128(
                Decimal128Builder::with_capacity(capacity),
                *precision,
                *scale,
            ),
            DataType::Timestamp(TimeUnit::Microsecond, zone) => ColumnBuilder::Timestamp(
                TimestampMicrosecondBuilder::with_capacity(capacity),
                zone.clone(),
            ),
            // The bytes of text and binary values are not known ahead.
            DataType::Utf8 => ColumnBuilder::Utf8(StringBuilder::with_capacity(capacity, 0)),
            DataType::Binary => ColumnBuilder::Binary(BinaryBuilder::with_capacity(capacity, 0)),
            other => ColumnBuilder::Values(Vec::with_capacity(capacity), other.clone()),
        }
    }

    pub(crate) fn push(&mut self, value: Value) {
        match (self, value) {
            (ColumnBuilder::Int32(b), Value::Int32(v)) => b.append_value(v),
            (ColumnBuilder::Int64(b), Value::Int64(v)) => b.append_value(v),
            (ColumnBuilder::Float64(b), Value::Float64(v)) => b.append_value(v),
            (ColumnBuilder::Date32(b), Value::Date32(v)) => b.append_value(v),
            (ColumnBuilder::Time64(b), Value::Int64(v)) => b.append_value(v),
            (ColumnBuilder::Decimal128(b, ..), Value::Decimal128(v)) => b.append_value(v),
            (ColumnBuilder::Timestamp(b, _), Value::TimestampMicros(v)) => b.append_value(v),
            (ColumnBuilder::Utf8(b), Value::Utf8(v)) => b.append_value(v),
            (ColumnBuilder::Binary(b), Value::Binary(v)) => b.append_value(v),
            (ColumnBuilder::Values(values, _), v) => values.push(v),
            (ColumnBuilder::Int32(b), _) => b.append_null(),
            (ColumnBuilder::Int64(b), _) => b.append_null(),
            (ColumnBuilder::Float64(b), _) => b.append_null(),
            (ColumnBuilder::Date32(b), _) => b.append_null(),
            (ColumnBuilder::Time64(b), _) => b.append_null(),
            (ColumnBuilder::Decimal128(b, ..), _) => b.append_null(),
            (ColumnBuilder::Timestamp(b, _), _) => b.append_null(),
            (ColumnBuilder::Utf8(b), _) => b.append_null(),
            (ColumnBuilder::Binary(b), _) => b.append_null(),
        }
    }

    pub(crate) fn finish(self) -> ArrayRef {
        match self {
            ColumnBuilder::Int32(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Int64(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Float64(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Date32(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Time64(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Decimal128(mut b, precision, scale) => Arc::new(
                b.finish()
                    .with_precision_and_scale(precision, scale)
                    .expect("a Decimal128 type from a table schema is valid"),
            ),
            ColumnBuilder::Timestamp(mut b, zone) => Arc::new(b.finish().with_timezone_opt(zone)),
            ColumnBuilder::Utf8(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Binary(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Values(values, data_type) => {
                column_array(&data_type, values.iter(), values.len())
            }
        }
    }
}
