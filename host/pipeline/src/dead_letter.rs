//! The dead-letter valve of one sink (off unless the sink's `dead_letter`
//! is set; docs/dead-letter.md).
//!
//! When the sink refuses a batch as poison, the shell asks the valve which
//! rows it refuses: the valve writes parts of the batch (the contract lets
//! a sink receive a table's changes in as many writes as the host likes
//! before a commit), halving the parts that are refused until single rows
//! remain. The refused rows are written here, one object each, and the
//! rest of the batch is staged again for the commit that follows. A batch
//! with more refused rows than the bound allows still stops the pipeline.
//!
//! Each object is named by the row's position, so a batch replayed after a
//! crash writes the same objects again instead of adding copies; and they
//! are durable before the sink is asked to commit, so no position moves
//! past a row that is in neither place.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_schema::Schema;
use weir_contract::{OP_COLUMN, POS_COLUMN};
use weir_runtime::{BatchHeader, BlobScope, CallError, SinkError, SinkWorker};
use weir_source::batch::TableBatch;

use crate::config::DeadLetterConfig;

/// A row the sink refused on its own, with the sink's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The row's index in the batch offered to the sink.
    pub row: usize,
    pub reason: String,
}

/// What stopped the valve from setting a batch's refused rows aside.
#[derive(Debug)]
pub enum ValveError {
    /// More rows are refused than the bound allows (or the rows that were
    /// not refused one by one are still refused together): the batch stays
    /// poison.
    Poison(String),
    /// A call into the sink failed otherwise (trap, deadline, fatal).
    Call(CallError),
    /// The dead-letter location could not be written.
    Store(String),
}

/// One sink's valve: where its refused rows go, and how many may.
pub struct DeadLetter {
    pipeline: String,
    sink: String,
    config: DeadLetterConfig,
    store: BlobScope,
}

impl DeadLetter {
    pub fn new(pipeline: &str, sink: &str, config: DeadLetterConfig, store: BlobScope) -> Self {
        DeadLetter {
            pipeline: pipeline.to_string(),
            sink: sink.to_string(),
            config,
            store,
        }
    }

    /// Finds the rows of `batch` (as offered to the sink: `header` and the
    /// records) that `worker` refuses, sets them aside, and leaves the rest
    /// staged in the sink. `first` is the sink's reason for refusing the
    /// whole batch. Returns the refused rows.
    pub fn set_aside(
        &self,
        worker: &SinkWorker,
        header: &BatchHeader,
        batch: &TableBatch,
        first: String,
    ) -> Result<Vec<Refused>, ValveError> {
        let records = &batch.records;
        let allowed = self.config.allowed(records.num_rows());
        let refused = find_refused(worker, header, records, first, allowed, |n| {
            self.over_bound(header, records.num_rows(), n)
        })?;
        // Whatever the probes left staged goes; the rest is staged anew.
        worker.abort(&header.table.name);
        let rest = without_rows(records, &refused);
        if rest.num_rows() > 0 {
            worker
                .write(part_header(header, &rest), encode(&rest)?)
                .wait()
                .map_err(|e| match e {
                    CallError::Sink(SinkError::Poison(why)) => ValveError::Poison(format!(
                        "sink `{}` refused each of {} row(s) of batch {} of `{}` alone, and \
                         then the other {} rows together ({why}); the dead-letter valve cannot \
                         tell which rows it refuses",
                        self.sink,
                        refused.len(),
                        header.id,
                        header.table.name,
                        rest.num_rows()
                    )),
                    other => ValveError::Call(other),
                })?;
        }
        for one in &refused {
            self.write(header, records, one)?;
        }
        Ok(refused)
    }

    /// How many rows of `table` this sink has set aside: the records in
    /// the dead-letter location.
    pub fn count(&self, table: &str) -> Result<u64, String> {
        let folder = format!("{}/{}/{table}/", self.pipeline, self.sink);
        self.store
            .list(&folder)
            .map(|found| found.iter().filter(|o| o.path.ends_with(".json")).count() as u64)
            .map_err(|e| {
                format!(
                    "cannot count the rows set aside in {} ({folder}): {e}",
                    self.store.describe()
                )
            })
    }

    fn over_bound(&self, header: &BatchHeader, rows: usize, found: usize) -> ValveError {
        ValveError::Poison(format!(
            "sink `{}` refused at least {found} of the {rows} rows of batch {} of `{}`, more \
             than its dead-letter valve sets aside ({}; dead_letter.max_rows is {}, \
             dead_letter.max_share {}): the batch stays poison",
            self.sink,
            header.id,
            header.table.name,
            self.config.allowed(rows),
            self.config.max_rows,
            self.config.max_share
        ))
    }

    /// Writes one refused row, durably, at a path named by its position.
    fn write(
        &self,
        header: &BatchHeader,
        records: &RecordBatch,
        refused: &Refused,
    ) -> Result<(), ValveError> {
        let position = records
            .column_by_name(POS_COLUMN)
            .map(|c| hex(c.as_binary::<i32>().value(refused.row)))
            .unwrap_or_default();
        let op = records
            .column_by_name(OP_COLUMN)
            .map(|c| c.as_string::<i32>().value(refused.row).to_string())
            .unwrap_or_default();
        let row = row_as_json(records, refused.row)?;
        let record = serde_json::json!({
            "pipeline": self.pipeline,
            "sink": self.sink,
            "table": header.table.name,
            "destination": header.table.destination,
            "position": position,
            "op": op,
            "batch": header.id,
            "error": refused.reason,
            "row": row,
        });
        let path = record_path(&self.pipeline, &self.sink, &header.table.name, &position);
        let bytes = serde_json::to_vec_pretty(&record)
            .map_err(|e| ValveError::Store(format!("cannot encode a dead-letter record: {e}")))?;
        self.store.put(&path, bytes).map_err(|e| {
            ValveError::Store(format!(
                "cannot write the refused row at position {position} to the dead-letter \
                 location {} ({path}): {e}",
                self.store.describe()
            ))
        })
    }
}

/// Where a refused row is kept under the dead-letter root. A position is
/// unique within a table, so a replay writes the same object again.
pub fn record_path(pipeline: &str, sink: &str, table: &str, position_hex: &str) -> String {
    format!("{pipeline}/{sink}/{table}/{position_hex}.json")
}

/// Bisects: a part the sink refuses is halved until single rows remain;
/// each probe starts from nothing staged. Stops with `over(n)` as soon as
/// more than `allowed` rows are refused.
fn find_refused(
    worker: &SinkWorker,
    header: &BatchHeader,
    records: &RecordBatch,
    first: String,
    allowed: usize,
    over: impl Fn(usize) -> ValveError,
) -> Result<Vec<Refused>, ValveError> {
    let mut suspects = vec![(0, records.num_rows(), first)];
    let mut refused = Vec::new();
    while let Some((start, len, reason)) = suspects.pop() {
        if len == 1 {
            refused.push(Refused { row: start, reason });
            if refused.len() > allowed {
                return Err(over(refused.len()));
            }
            continue;
        }
        let half = len / 2;
        for (part_start, part_len) in [(start + half, len - half), (start, half)] {
            let part = records.slice(part_start, part_len);
            worker.abort(&header.table.name);
            match worker
                .write(part_header(header, &part), encode(&part)?)
                .wait()
            {
                Ok(()) => {}
                Err(CallError::Sink(SinkError::Poison(why))) => {
                    suspects.push((part_start, part_len, why))
                }
                Err(other) => return Err(ValveError::Call(other)),
            }
        }
    }
    refused.sort_by_key(|r| r.row);
    Ok(refused)
}

/// The batch's header for a part of its rows: its first position, the
/// batch's end and id (a sink names what it stages by the id, and every
/// part is one attempt at the same batch).
fn part_header(header: &BatchHeader, part: &RecordBatch) -> BatchHeader {
    let low = part
        .column_by_name(POS_COLUMN)
        .filter(|c| !c.is_empty())
        .map(|c| weir_core::position::Position::from_bytes(c.as_binary::<i32>().value(0).to_vec()))
        .unwrap_or_else(|| header.high.clone());
    BatchHeader {
        table: header.table.clone(),
        id: header.id.clone(),
        low,
        high: header.high.clone(),
        rows: part.num_rows() as u32,
    }
}

fn without_rows(records: &RecordBatch, refused: &[Refused]) -> RecordBatch {
    let keep: arrow_array::BooleanArray = (0..records.num_rows())
        .map(|row| Some(refused.binary_search_by_key(&row, |r| r.row).is_err()))
        .collect();
    arrow_select::filter::filter_record_batch(records, &keep)
        .expect("the mask has one entry per row")
}

fn encode(records: &RecordBatch) -> Result<Arc<Vec<u8>>, ValveError> {
    weir_contract::ipc::encode(records)
        .map(Arc::new)
        .map_err(|e| ValveError::Store(format!("cannot encode a batch as Arrow IPC: {e}")))
}

/// The row's columns (not the control columns) as a JSON object, written
/// by arrow-json: numbers as numbers, decimals and times as text, binary
/// as hex, nulls as null.
fn row_as_json(records: &RecordBatch, row: usize) -> Result<serde_json::Value, ValveError> {
    let keep: Vec<usize> = records
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.name() != OP_COLUMN && f.name() != POS_COLUMN)
        .map(|(i, _)| i)
        .collect();
    let one = records
        .project(&keep)
        .map(|r| r.slice(row, 1))
        .map_err(|e| ValveError::Store(format!("cannot pick the refused row: {e}")))?;
    let one = RecordBatch::try_new(
        Arc::new(Schema::new(one.schema().fields().clone())),
        one.columns().to_vec(),
    )
    .map_err(|e| ValveError::Store(format!("cannot pick the refused row: {e}")))?;
    let mut writer = arrow_json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow_json::writer::JsonArray>(Vec::new());
    writer
        .write(&one)
        .and_then(|_| writer.finish())
        .map_err(|e| ValveError::Store(format!("cannot write the refused row as JSON: {e}")))?;
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&writer.into_inner())
        .map_err(|e| ValveError::Store(format!("cannot read back the refused row: {e}")))?;
    Ok(rows.into_iter().next().unwrap_or(serde_json::Value::Null))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Int64Array, StringArray};
    use arrow_schema::{DataType, Field};

    fn batch(ids: &[i64]) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(OP_COLUMN, DataType::Utf8, false),
            Field::new(POS_COLUMN, DataType::Binary, false),
        ]);
        let positions: Vec<Vec<u8>> = ids.iter().map(|i| vec![0, *i as u8]).collect();
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(vec!["insert"; ids.len()])),
                Arc::new(BinaryArray::from_iter_values(positions)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_row_is_written_as_json_without_the_control_columns() {
        let json = row_as_json(&batch(&[4, 5, 6]), 1).unwrap();
        assert_eq!(json, serde_json::json!({"id": 5}));
    }

    #[test]
    fn the_rest_of_a_batch_keeps_every_row_not_refused_in_order() {
        let refused = [1, 3].map(|row| Refused {
            row,
            reason: String::new(),
        });
        let rest = without_rows(&batch(&[10, 11, 12, 13, 14]), &refused);
        let ids = rest
            .column(0)
            .as_primitive::<arrow_array::types::Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![10, 12, 14]);
    }

    #[test]
    fn the_bound_is_the_smaller_of_rows_and_share() {
        let config = |max_rows, max_share| DeadLetterConfig {
            url: "dlq".into(),
            options: Default::default(),
            max_rows,
            max_share,
        };
        assert_eq!(config(100, 1.0).allowed(10), 10);
        assert_eq!(config(3, 1.0).allowed(10), 3);
        assert_eq!(config(100, 0.25).allowed(10), 2);
        assert_eq!(config(100, 0.25).allowed(3), 0);
    }
}
