//! Batches of changes, decoded from the Arrow IPC stream the host sends.

use arrow_array::{Array, BinaryArray, RecordBatch, StringArray};
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{Block, MessageHeader, MetadataVersion};
use arrow_schema::{DataType, SchemaRef};

use crate::{Mode, OP_COLUMN, Op, POS_COLUMN, Result, SinkError};

/// A context column the operator asked to see in the destination. It is
/// already present in every batch, under `name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MetadataColumn {
    /// Which context value: one of `op`, `pos`, `commit-ts`, `ingest-ts`,
    /// `snapshot`, `phase`.
    pub source: String,
    /// The column name the operator chose for it in the destination.
    pub name: String,
}

/// What a sink needs to know about the table a batch belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Table {
    /// The table's name in the source, for example `public.orders`. Commits
    /// name the table by this.
    pub name: String,
    /// The table's key columns, in key order. Empty: the table has no key,
    /// apply its changes as an append-only log.
    pub key_columns: Vec<String>,
    /// How to apply changes: at the key ([`Mode::Upsert`]) or as new rows
    /// ([`Mode::Append`]).
    pub mode: Mode,
    /// The destination name the operator chose, for example `sales.orders`;
    /// equal to `name` when not mapped. Name what you write after this.
    pub destination: String,
    /// Context columns the operator asked for, already in every batch.
    pub metadata: Vec<MetadataColumn>,
}

impl Table {
    /// A table named `name`, without keys, in [`Mode::Append`], written to a
    /// destination of the same name, without metadata columns. Handy in
    /// tests; change the fields you need.
    pub fn new(name: impl Into<String>) -> Table {
        let name = name.into();
        Table {
            destination: name.clone(),
            name,
            key_columns: Vec::new(),
            mode: Mode::Append,
            metadata: Vec::new(),
        }
    }
}

/// Everything the host says about a batch besides its rows: the WIT `batch`
/// record. You only build one yourself to drive
/// [`NativeSink::write`](crate::native::NativeSink::write) in tests.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BatchMeta {
    /// The table the batch belongs to.
    pub table: Table,
    /// Deterministic for the same table and position range, also across
    /// restarts.
    pub id: String,
    /// Position of the first change in the batch (inclusive).
    pub low: Vec<u8>,
    /// Position the table is committed at once this batch is committed.
    pub high: Vec<u8>,
    /// Number of rows in the Arrow stream; checked when decoding.
    pub rows: u32,
}

/// One batch of changes for one table, as [`Sink::write`](crate::Sink::write)
/// receives it.
///
/// The rows hold the table's columns, the metadata columns the operator asked
/// for, and the control columns [`OP_COLUMN`] and [`POS_COLUMN`]. Within a
/// batch there is at most one row per key: the last change to a key wins.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The table the batch belongs to.
    pub table: Table,
    /// Deterministic for the same table and position range, also across
    /// restarts: a sink without positions names what it writes after it so
    /// that a replayed batch overwrites instead of adding.
    pub id: String,
    /// Position of the first change in the batch (inclusive).
    pub low: Vec<u8>,
    /// Position the table is committed at once this batch is committed. It
    /// may lie beyond the last change in the batch.
    pub high: Vec<u8>,
    records: RecordBatch,
    ops: Vec<Op>,
    op_index: usize,
    pos_index: usize,
}

impl Batch {
    /// Decodes an Arrow IPC stream (what the host sends) into a batch. Several
    /// record batches in the stream are concatenated; a stream with a schema
    /// and no record batch is a batch of zero rows.
    ///
    /// Fails with [`SinkError::Poison`], naming the table and batch id, when
    /// the stream is malformed, a control column is missing, mistyped, null or
    /// holds an unknown operation, or the row count differs from
    /// [`BatchMeta::rows`].
    pub fn decode(meta: BatchMeta, ipc: &[u8]) -> Result<Batch> {
        Batch::decode_owned(meta, ipc.to_vec())
    }

    /// [`Batch::decode`] of bytes already in a buffer of their own, which
    /// the batch's columns then share.
    pub(crate) fn decode_owned(meta: BatchMeta, ipc: Vec<u8>) -> Result<Batch> {
        let records = match decode_stream(ipc) {
            Ok(records) => records,
            Err(why) => return Err(poison(&meta, &why)),
        };
        if records.num_rows() != meta.rows as usize {
            let why = format!(
                "the batch header says {} rows, the Arrow stream holds {}",
                meta.rows,
                records.num_rows()
            );
            return Err(poison(&meta, &why));
        }
        Batch::from_records(meta, records)
    }

    /// Builds a batch from rows already in memory, checking the control
    /// columns like [`Batch::decode`] (but not [`BatchMeta::rows`]).
    pub fn from_records(meta: BatchMeta, records: RecordBatch) -> Result<Batch> {
        let (op_index, ops) = match parse_ops(&records) {
            Ok(found) => found,
            Err(why) => return Err(poison(&meta, &why)),
        };
        let pos_index = match check_positions(&records) {
            Ok(index) => index,
            Err(why) => return Err(poison(&meta, &why)),
        };
        let BatchMeta {
            table,
            id,
            low,
            high,
            rows: _,
        } = meta;
        Ok(Batch {
            table,
            id,
            low,
            high,
            records,
            ops,
            op_index,
            pos_index,
        })
    }

    /// Every column, including the control columns [`OP_COLUMN`] and
    /// [`POS_COLUMN`]. Write this when the destination is a change log.
    pub fn records(&self) -> &RecordBatch {
        &self.records
    }

    /// The columns meant for the destination: everything but [`OP_COLUMN`]
    /// and [`POS_COLUMN`]. Cheap: the column data is shared, not copied.
    pub fn data(&self) -> RecordBatch {
        let keep: Vec<usize> = (0..self.records.num_columns())
            .filter(|&i| i != self.op_index && i != self.pos_index)
            .collect();
        self.records
            .project(&keep)
            .expect("projection of existing columns")
    }

    /// Each row's operation, in row order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Each row's position, in row order (never null).
    pub fn positions(&self) -> &BinaryArray {
        self.records
            .column(self.pos_index)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .expect("checked when the batch was built")
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.records.num_rows()
    }

    /// True when the batch has no rows (the host still commits it so that
    /// positions advance).
    pub fn is_empty(&self) -> bool {
        self.records.num_rows() == 0
    }

    /// Gives up the batch for its rows (all columns).
    pub fn into_records(self) -> RecordBatch {
        self.records
    }
}

fn poison(meta: &BatchMeta, why: &str) -> SinkError {
    SinkError::Poison(format!(
        "batch {} of table {}: {why}",
        meta.id, meta.table.name
    ))
}

/// Decodes without copying the column data out of `ipc` (aligned buffers
/// are used in place; arrow copies only a misaligned one).
///
/// The array contents are validated as any reader's would be, also for the
/// host's own batches: skipping that (arrow's `with_skip_validation`) needs
/// `unsafe` and measured under 2% of a sink's time.
fn decode_stream(ipc: Vec<u8>) -> std::result::Result<RecordBatch, String> {
    let malformed = |e: String| format!("malformed Arrow IPC stream: {e}");
    let framed = frame(&ipc).map_err(malformed)?;
    // `UInt8Array::from(Vec<u8>)` takes the allocation over as an arrow
    // buffer, which the decoder slices.
    let bytes = arrow_array::UInt8Array::from(ipc)
        .into_parts()
        .1
        .into_inner();
    let mut decoder = FileDecoder::new(framed.schema.clone(), framed.version);
    let mut batches = Vec::new();
    for message in &framed.messages {
        let block = Block::new(
            message.start as i64,
            message.header_len as i32,
            message.body_len as i64,
        );
        let buffer = bytes.slice_with_length(message.start, message.header_len + message.body_len);
        let read = match message.kind {
            MessageHeader::DictionaryBatch => decoder.read_dictionary(&block, &buffer),
            MessageHeader::RecordBatch => decoder
                .read_record_batch(&block, &buffer)
                .map(|batch| batches.extend(batch)),
            MessageHeader::Schema => return Err(malformed("a second schema message".into())),
            other => return Err(malformed(format!("unexpected {other:?} message"))),
        };
        read.map_err(|e| malformed(e.to_string()))?;
    }
    match batches.len() {
        0 => Ok(RecordBatch::new_empty(framed.schema)),
        1 => Ok(batches.pop().expect("one batch")),
        _ => arrow_select::concat::concat_batches(&framed.schema, &batches)
            .map_err(|e| format!("cannot concatenate the stream's record batches: {e}")),
    }
}

/// An IPC stream's schema and where each message after it lies.
struct Framed {
    schema: SchemaRef,
    version: MetadataVersion,
    messages: Vec<FramedMessage>,
}

struct FramedMessage {
    kind: MessageHeader,
    /// Where the message's length prefix starts.
    start: usize,
    /// The prefix and the flatbuffer header.
    header_len: usize,
    body_len: usize,
}

/// Walks the stream's messages and checks that every declared length stays
/// inside the bytes we have, before the Arrow decoder trusts them: a decoder
/// that allocates a declared 2 GiB or slices past the end would abort the
/// plugin instead of reporting a poison batch.
fn frame(ipc: &[u8]) -> std::result::Result<Framed, String> {
    let word = |at: usize| -> std::result::Result<u32, String> {
        ipc.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| "truncated message header".to_string())
    };
    let past_end = || "a message runs past the end of the stream".to_string();
    let mut schema = None;
    let mut messages = Vec::new();
    let mut at = 0;
    while at < ipc.len() {
        let start = at;
        let mut len = word(at)?;
        at += 4;
        if len == u32::MAX {
            // Continuation marker, then the length.
            len = word(at)?;
            at += 4;
        }
        if len == 0 {
            // End-of-stream marker.
            break;
        }
        let end = at.checked_add(len as usize).ok_or_else(past_end)?;
        let header = ipc.get(at..end).ok_or_else(past_end)?;
        let message =
            arrow_ipc::root_as_message(header).map_err(|e| format!("bad message header: {e}"))?;
        at = end;
        let body = usize::try_from(message.bodyLength()).map_err(|_| past_end())?;
        if body > ipc.len() - at {
            return Err(past_end());
        }
        let buffers = match message.header_type() {
            MessageHeader::RecordBatch => {
                message.header_as_record_batch().and_then(|b| b.buffers())
            }
            MessageHeader::DictionaryBatch => message
                .header_as_dictionary_batch()
                .and_then(|d| d.data())
                .and_then(|b| b.buffers()),
            _ => None,
        };
        for buffer in buffers.iter().flat_map(|b| b.iter()) {
            let inside = u64::try_from(buffer.offset())
                .ok()
                .zip(u64::try_from(buffer.length()).ok())
                .and_then(|(offset, length)| offset.checked_add(length))
                .is_some_and(|end| end <= body as u64);
            if !inside {
                return Err("a buffer lies outside its message body".into());
            }
        }
        if schema.is_none() {
            let fields = message
                .header_as_schema()
                .ok_or("the stream does not start with a schema message")?;
            schema = Some((
                std::sync::Arc::new(arrow_ipc::convert::fb_to_schema(fields)),
                message.version(),
            ));
        } else {
            messages.push(FramedMessage {
                kind: message.header_type(),
                start,
                header_len: end - start,
                body_len: body,
            });
        }
        at += body;
    }
    let (schema, version) = schema.ok_or("the stream holds no schema message")?;
    Ok(Framed {
        schema,
        version,
        messages,
    })
}

fn parse_ops(records: &RecordBatch) -> std::result::Result<(usize, Vec<Op>), String> {
    let index = control_column(records, OP_COLUMN, &DataType::Utf8)?;
    let column = records
        .column(index)
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| format!("control column `{OP_COLUMN}` is not utf8"))?;
    let mut ops = Vec::with_capacity(column.len());
    for (row, value) in column.iter().enumerate() {
        let value = value.ok_or_else(|| format!("`{OP_COLUMN}` is null in row {row}"))?;
        let op = Op::parse(value)
            .ok_or_else(|| format!("unknown operation {value:?} in `{OP_COLUMN}`, row {row}"))?;
        ops.push(op);
    }
    Ok((index, ops))
}

fn check_positions(records: &RecordBatch) -> std::result::Result<usize, String> {
    let index = control_column(records, POS_COLUMN, &DataType::Binary)?;
    let nulls = records.column(index).null_count();
    if nulls > 0 {
        return Err(format!("`{POS_COLUMN}` is null in {nulls} rows"));
    }
    Ok(index)
}

fn control_column(
    records: &RecordBatch,
    name: &str,
    expected: &DataType,
) -> std::result::Result<usize, String> {
    let (index, field) = records
        .schema_ref()
        .column_with_name(name)
        .ok_or_else(|| format!("control column `{name}` is missing"))?;
    if field.data_type() != expected {
        return Err(format!(
            "control column `{name}` has type {}, expected {expected}",
            field.data_type()
        ));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array};
    use arrow_ipc::writer::StreamWriter;
    use arrow_schema::Schema;

    use super::*;

    fn meta(rows: u32) -> BatchMeta {
        BatchMeta {
            table: Table::new("public.orders"),
            id: "b-1".into(),
            low: vec![1],
            high: vec![9],
            rows,
        }
    }

    fn sample(ids: &[i64], ops: &[&str]) -> RecordBatch {
        let positions: Vec<Vec<u8>> = (0..ids.len()).map(|i| vec![0, i as u8]).collect();
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef),
            (
                OP_COLUMN,
                Arc::new(StringArray::from(ops.to_vec())) as ArrayRef,
            ),
            (
                POS_COLUMN,
                Arc::new(BinaryArray::from_iter_values(positions)) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    fn stream(schema: &Schema, batches: &[RecordBatch]) -> Vec<u8> {
        let mut w = StreamWriter::try_new(Vec::new(), schema).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        w.into_inner().unwrap()
    }

    #[test]
    fn decodes_one_batch_and_parses_ops() {
        let rb = sample(&[1, 2, 3, 4], &["insert", "update", "delete", "read"]);
        let ipc = stream(&rb.schema(), std::slice::from_ref(&rb));
        let batch = Batch::decode(meta(4), &ipc).unwrap();
        assert_eq!(batch.records(), &rb);
        assert_eq!(batch.ops(), &[Op::Insert, Op::Update, Op::Delete, Op::Read]);
        assert_eq!(batch.positions().value(3), &[0, 3]);
        assert_eq!(batch.id, "b-1");
        assert_eq!(batch.high, vec![9]);
    }

    #[test]
    fn concatenates_several_batches() {
        let a = sample(&[1, 2], &["insert", "insert"]);
        let b = sample(&[3], &["delete"]);
        let ipc = stream(&a.schema(), &[a.clone(), b]);
        let batch = Batch::decode(meta(3), &ipc).unwrap();
        assert_eq!(batch.num_rows(), 3);
        assert_eq!(batch.ops(), &[Op::Insert, Op::Insert, Op::Delete]);
    }

    #[test]
    fn empty_stream_with_schema_is_zero_rows() {
        let schema = sample(&[], &[]).schema();
        let ipc = stream(&schema, &[]);
        let batch = Batch::decode(meta(0), &ipc).unwrap();
        assert!(batch.is_empty());
        assert_eq!(batch.records().schema(), schema);
        assert!(batch.ops().is_empty());
        assert_eq!(batch.data().num_columns(), 1);
    }

    #[test]
    fn data_strips_control_columns() {
        let rb = sample(&[1, 2], &["insert", "delete"]);
        let ipc = stream(&rb.schema(), std::slice::from_ref(&rb));
        let batch = Batch::decode(meta(2), &ipc).unwrap();
        let data = batch.data();
        let names: Vec<_> = data
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["id"]);
        assert_eq!(data.num_rows(), 2);
        // The full records keep them.
        assert_eq!(batch.records().num_columns(), 3);
    }

    fn expect_poison(result: Result<Batch>, needle: &str) {
        match result {
            Err(SinkError::Poison(m)) => {
                assert!(m.contains("b-1"), "{m}");
                assert!(m.contains("public.orders"), "{m}");
                assert!(m.contains(needle), "{m}");
            }
            other => panic!("expected poison, got {other:?}"),
        }
    }

    #[test]
    fn decoding_in_place_gives_what_the_stream_reader_gives() {
        use arrow_array::DictionaryArray;
        use arrow_array::types::Int32Type;

        let with_dictionary = |rb: RecordBatch| {
            let city: DictionaryArray<Int32Type> = (0..rb.num_rows())
                .map(|i| ["Oslo", "Lima"][i % 2])
                .collect();
            let mut columns = rb.columns().to_vec();
            columns.push(Arc::new(city));
            let mut fields: Vec<_> = rb.schema().fields().iter().cloned().collect();
            fields.push(Arc::new(arrow_schema::Field::new(
                "city",
                columns[3].data_type().clone(),
                false,
            )));
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
        };
        let a = with_dictionary(sample(&[1, 2], &["insert", "update"]));
        let b = with_dictionary(sample(&[3], &["delete"]));
        let ipc = stream(&a.schema(), &[a.clone(), b]);
        let in_place = Batch::decode(meta(3), &ipc).unwrap();
        // arrow's own stream reader, which copies every message body.
        let reader =
            arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(&ipc), None).unwrap();
        let schema = reader.schema();
        let read: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        let expected = arrow_select::concat::concat_batches(&schema, &read).unwrap();
        assert_eq!(in_place.records(), &expected);
        assert_eq!(in_place.records().num_rows(), 3);
    }

    #[test]
    fn untrusted_bytes_are_still_validated() {
        // A string column whose bytes are not UTF-8: the framing is fine,
        // only arrow's validation of the contents can catch it.
        let rb = sample(&[1], &["insert"]);
        let mut ipc = stream(&rb.schema(), &[rb]);
        let at = ipc
            .windows(6)
            .position(|w| w == b"insert")
            .expect("the op value in the body");
        ipc[at] = 0xFF;
        expect_poison(Batch::decode(meta(1), &ipc), "malformed");
    }

    #[test]
    fn malformed_stream_is_poison() {
        expect_poison(Batch::decode(meta(0), b"not arrow"), "malformed");
        expect_poison(Batch::decode(meta(0), b""), "malformed");
        let rb = sample(&[1], &["insert"]);
        let mut ipc = stream(&rb.schema(), &[rb]);
        ipc.truncate(ipc.len() - 20);
        expect_poison(Batch::decode(meta(1), &ipc), "malformed");
        // A header declaring a 2 GiB message must not be believed.
        let huge = [0xFF, 0xFF, 0xFF, 0xFF, 0xF0, 0xFF, 0xFF, 0x7F, 1, 2, 3, 4];
        expect_poison(Batch::decode(meta(0), &huge), "past the end");
        expect_poison(Batch::decode(meta(0), &[0xFF, 0xFF]), "truncated");
    }

    #[test]
    fn missing_or_bad_control_columns_are_poison() {
        let no_op = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            (
                POS_COLUMN,
                Arc::new(BinaryArray::from_iter_values([[1u8]])) as ArrayRef,
            ),
        ])
        .unwrap();
        let ipc = stream(&no_op.schema(), &[no_op]);
        expect_poison(Batch::decode(meta(1), &ipc), "`__op` is missing");

        let no_pos = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            (
                OP_COLUMN,
                Arc::new(StringArray::from(vec!["insert"])) as ArrayRef,
            ),
        ])
        .unwrap();
        let ipc = stream(&no_pos.schema(), &[no_pos]);
        expect_poison(Batch::decode(meta(1), &ipc), "`__pos` is missing");

        let rb = sample(&[1], &["upsert"]);
        let ipc = stream(&rb.schema(), &[rb]);
        expect_poison(Batch::decode(meta(1), &ipc), "unknown operation");

        let rb = sample(&[1], &["insert"]);
        let ipc = stream(&rb.schema(), &[rb]);
        expect_poison(Batch::decode(meta(2), &ipc), "2 rows");
    }

    #[test]
    fn modes_and_ops_round_trip() {
        for m in [Mode::Upsert, Mode::Append] {
            assert_eq!(Mode::parse(m.as_str()), Some(m));
        }
        for op in [Op::Insert, Op::Update, Op::Delete, Op::Read] {
            assert_eq!(Op::parse(&op.to_string()), Some(op));
        }
        assert_eq!(Mode::parse("merge"), None);
    }
}
