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

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, Time64MicrosecondType,
    TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use weir_contract::{OP_COLUMN, POS_COLUMN};
use weir_runtime::{BatchHeader, BlobScope, CallError, SinkError, SinkWorker};
use weir_source::batch::TableBatch;
use weir_source::change::{EXTENSION_NAME_KEY, UUID_EXTENSION};

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

/// The row's columns (not the control columns) as a JSON object: numbers
/// as numbers, decimals, times and dates as text (ISO 8601, `Z` for a
/// zoned timestamp), binary as hex, a uuid as its usual text, lists as
/// arrays, nulls as null.
fn row_as_json(records: &RecordBatch, row: usize) -> Result<serde_json::Value, ValveError> {
    let schema = records.schema();
    let mut object = serde_json::Map::new();
    for (field, column) in schema.fields().iter().zip(records.columns()) {
        if field.name() == OP_COLUMN || field.name() == POS_COLUMN {
            continue;
        }
        let uuid =
            field.metadata().get(EXTENSION_NAME_KEY).map(String::as_str) == Some(UUID_EXTENSION);
        object.insert(field.name().clone(), cell(column.as_ref(), row, uuid)?);
    }
    Ok(serde_json::Value::Object(object))
}

/// One cell as JSON, by the array's type: the types the host's sources
/// put in a batch. Any other is said to be unsupported rather than lost.
fn cell(array: &dyn Array, row: usize, uuid: bool) -> Result<serde_json::Value, ValveError> {
    use serde_json::Value as Json;
    if array.is_null(row) {
        return Ok(Json::Null);
    }
    Ok(match array.data_type() {
        DataType::Boolean => Json::Bool(array.as_boolean().value(row)),
        DataType::Int32 => Json::from(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Json::from(array.as_primitive::<Int64Type>().value(row)),
        DataType::Float64 => {
            let value = array.as_primitive::<Float64Type>().value(row);
            serde_json::Number::from_f64(value)
                .map(Json::Number)
                // NaN and the infinities have no JSON number.
                .unwrap_or_else(|| Json::String(value.to_string()))
        }
        DataType::Decimal128(_, scale) => Json::String(decimal_text(
            array.as_primitive::<Decimal128Type>().value(row),
            *scale,
        )),
        DataType::Utf8 => Json::String(array.as_string::<i32>().value(row).to_string()),
        DataType::Binary => Json::String(hex(array.as_binary::<i32>().value(row))),
        DataType::FixedSizeBinary(_) => {
            let bytes = array.as_fixed_size_binary().value(row);
            Json::String(if uuid && bytes.len() == 16 {
                uuid_text(bytes)
            } else {
                hex(bytes)
            })
        }
        DataType::Date32 => Json::String(date_text(
            array.as_primitive::<Date32Type>().value(row) as i64
        )),
        DataType::Time64(TimeUnit::Microsecond) => Json::String(time_text(
            array.as_primitive::<Time64MicrosecondType>().value(row),
        )),
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            let micros = array.as_primitive::<TimestampMicrosecondType>().value(row);
            let (days, in_day) = (
                micros.div_euclid(86_400_000_000),
                micros.rem_euclid(86_400_000_000),
            );
            let zone = if zone.is_some() { "Z" } else { "" };
            Json::String(format!("{}T{}{zone}", date_text(days), time_text(in_day)))
        }
        DataType::List(_) => {
            let items = array.as_list::<i32>().value(row);
            Json::Array(
                (0..items.len())
                    .map(|i| cell(items.as_ref(), i, false))
                    .collect::<Result<_, _>>()?,
            )
        }
        other => {
            return Err(ValveError::Store(format!(
                "cannot write a column of type {other} in a dead-letter record"
            )));
        }
    })
}

fn decimal_text(unscaled: i128, scale: i8) -> String {
    if scale <= 0 {
        let zeros = "0".repeat(scale.unsigned_abs() as usize);
        return if unscaled == 0 {
            "0".into()
        } else {
            format!("{unscaled}{zeros}")
        };
    }
    let digits = unscaled.unsigned_abs().to_string();
    let scale = scale as usize;
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = digits.split_at(digits.len() - scale);
    let sign = if unscaled < 0 { "-" } else { "" };
    format!("{sign}{whole}.{fraction}")
}

/// `YYYY-MM-DD` of a day counted from 1970-01-01, in the proleptic
/// Gregorian calendar (the civil-from-days conversion over 400-year eras).
fn date_text(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// `HH:MM:SS.ffffff` of microseconds since midnight.
fn time_text(micros: i64) -> String {
    let seconds = micros / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        seconds / 3_600,
        seconds / 60 % 60,
        seconds % 60,
        micros % 1_000_000
    )
}

fn uuid_text(bytes: &[u8]) -> String {
    let h = hex(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

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
    fn values_are_written_as_their_usual_text() {
        assert_eq!(decimal_text(12345, 2), "123.45");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        assert_eq!(decimal_text(0, 2), "0.00");
        assert_eq!(decimal_text(7, -2), "700");
        assert_eq!(date_text(0), "1970-01-01");
        assert_eq!(date_text(19_783), "2024-03-01");
        assert_eq!(date_text(19_782), "2024-02-29");
        assert_eq!(date_text(-1), "1969-12-31");
        assert_eq!(date_text(-719_528), "0000-01-01");
        assert_eq!(time_text(3_723_000_042), "01:02:03.000042");
        assert_eq!(
            uuid_text(&(0u8..16).collect::<Vec<_>>()),
            "00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
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
