//! The backfill: every table in name order, each in key order as one
//! result cut into chunks of `chunk_rows` rows, all read in one consistent
//! snapshot whose binlog coordinates the server reports (MariaDB's
//! `binlog_snapshot_file` and `_position` for `START TRANSACTION WITH
//! CONSISTENT SNAPSHOT`), so no lock is taken. Each chunk becomes one
//! transaction of Arrow columns.
//!
//! A backfill resumed after a crash reads on after the last committed key
//! in a new snapshot, and keeps the first snapshot's coordinates for the
//! stream: the stream then replays every change since the first snapshot,
//! which whole-row images (binlog_row_image=FULL) make converge on the
//! server's rows (docs/mysql.md).

use std::time::{SystemTime, UNIX_EPOCH};

use arrow_array::builder::BinaryBuilder;
use arrow_array::{Array, BinaryArray};
use mysql_async::Row;

use super::flavor::Coordinates;
use super::position::{BackfillPlace, BinlogCoord, PositionWriter};
use super::session::{RowStream, Session};
use super::setup::current_position;
use super::setup::{Table, ident};
use super::types::{Origin, convert, show};
use crate::SourceError;
use crate::batch::ColumnBuilder;
use crate::change::{SnapshotRows, Transaction, Value};

pub(super) struct Backfill {
    /// Indexes of the tables still to read, in name order.
    queue: Vec<usize>,
    /// In the first table of the queue: the key to read after.
    after: Option<Vec<mysql_async::Value>>,
    /// Where the stream starts once the backfill is done.
    pub stream_from: BinlogCoord,
    /// Whether the session is inside the snapshot's transaction.
    in_snapshot: bool,
    chunk_rows: usize,
    /// The rows of the first table of the queue, read on the runtime in
    /// chunks while the last chunk is turned into Arrow.
    reading: Option<RowStream>,
}

fn reading(table: &Table) -> String {
    format!("reading {} for the backfill", table.name)
}

impl Backfill {
    /// A backfill of every table, from the start. The stream starts at
    /// `stream_from` when an earlier run already began one (its tables may
    /// hold rows of that run's snapshot whose later changes only the
    /// binlog since then has), else at this snapshot's coordinates.
    pub fn fresh(
        tables: usize,
        chunk_rows: usize,
        stream_from: Option<BinlogCoord>,
        session: &mut Session,
    ) -> Result<Backfill, SourceError> {
        let mut backfill = Backfill {
            queue: (0..tables).collect(),
            after: None,
            stream_from: BinlogCoord { file: 0, offset: 0 },
            in_snapshot: false,
            chunk_rows,
            reading: None,
        };
        let snapshot = backfill.open_snapshot(session)?;
        backfill.stream_from = stream_from.unwrap_or(snapshot);
        Ok(backfill)
    }

    /// A backfill resumed after `place` in table `first`.
    pub fn resumed(
        tables: usize,
        first: usize,
        place: BackfillPlace,
        chunk_rows: usize,
    ) -> Backfill {
        Backfill {
            queue: (first..tables).collect(),
            after: Some(place.key),
            stream_from: place.stream_from,
            in_snapshot: false,
            chunk_rows,
            reading: None,
        }
    }

    /// Starts the snapshot the tables are read in; its binlog coordinates
    /// (how depends on the server: [`Flavor::snapshot_steps`]).
    fn open_snapshot(&mut self, session: &mut Session) -> Result<BinlogCoord, SourceError> {
        self.reading = None;
        session.reset();
        let steps = session.flavor.snapshot_steps();
        for statement in steps.before {
            session.run("starting the backfill's snapshot", statement)?;
        }
        self.in_snapshot = true;
        let coordinates = match steps.coordinates {
            Coordinates::StatusVariables(sql) => {
                let rows: Vec<(String, String)> =
                    session.rows("reading the snapshot's binlog position", sql)?;
                let get = |name: &str| {
                    rows.iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.clone())
                };
                match (get("binlog_snapshot_file"), get("binlog_snapshot_position")) {
                    (Some(file), Some(offset)) if !file.is_empty() => {
                        let offset: u64 = offset.parse().map_err(|_| {
                            SourceError::Invalid(format!(
                                "binlog_snapshot_position `{offset}` is not a number"
                            ))
                        })?;
                        BinlogCoord::at(&file, offset).map_err(SourceError::Invalid)
                    }
                    _ => Err(SourceError::Config(
                        "the server does not report the binlog position of a consistent \
                         snapshot (binlog_snapshot_file)"
                            .into(),
                    )),
                }
            }
            Coordinates::BinlogStatus(_) => current_position(session),
        };
        if coordinates.is_err() {
            // Closing the connection ends the transaction and any lock.
            session.reset();
            self.in_snapshot = false;
            return coordinates;
        }
        for statement in steps.after {
            session.run("starting the backfill's snapshot", statement)?;
        }
        coordinates
    }

    /// The next chunk, or None when every table has been read.
    pub fn next_chunk(
        &mut self,
        tables: &[Table],
        session: &mut Session,
    ) -> Result<Option<Transaction>, SourceError> {
        loop {
            let Some(&index) = self.queue.first() else {
                if self.in_snapshot {
                    session.run("ending the backfill's snapshot", "COMMIT")?;
                    self.in_snapshot = false;
                }
                return Ok(None);
            };
            if !self.in_snapshot {
                self.open_snapshot(session)?;
            }
            let table = &tables[index];
            if self.reading.is_none() {
                let (sql, params) = self.table_query(table);
                let stream = session
                    .stream_rows(&reading(table), sql, params, self.chunk_rows)
                    .inspect_err(|_| self.in_snapshot = false)?;
                self.reading = Some(stream);
            }
            let stream = self.reading.as_mut().expect("started above");
            let rows = match session.next_rows(stream) {
                Ok(rows) => rows,
                Err(e) => {
                    // A new snapshot reads on after the last key handed on.
                    self.reading = None;
                    self.in_snapshot = false;
                    return Err(e);
                }
            };
            let Some(rows) = rows else {
                self.reading = None;
                self.queue.remove(0);
                self.after = None;
                continue;
            };
            if let Some(last) = rows.last() {
                self.after = Some(
                    table
                        .schema
                        .key
                        .iter()
                        .map(|&k| last.as_ref(k).cloned().unwrap_or(mysql_async::Value::NULL))
                        .collect(),
                );
            }
            return self.chunk(table, rows).map(Some);
        }
    }

    /// `SELECT … ORDER BY key`, after the last key read: the server sends
    /// the table as one result, cut into chunks as it is read. Text keys
    /// are read in the order of their UTF-8 bytes (what their positions
    /// encode), not their collation's: the server then sorts them itself
    /// rather than walk the index, so such tables read slower.
    fn table_query(&self, table: &Table) -> (String, Vec<mysql_async::Value>) {
        let columns: Vec<String> = table.column_names().map(ident).collect();
        let key = &table.schema.key;
        let key_names: Vec<String> = key
            .iter()
            .map(|&k| {
                let column = ident(&table.schema.columns[k].name);
                if table.kinds[k].orders_by_value() {
                    column
                } else {
                    format!("CAST(CONVERT({column} USING utf8mb4) AS BINARY)")
                }
            })
            .collect();
        let mut sql = format!("SELECT {} FROM {}", columns.join(", "), table.quoted());
        let mut params = Vec::new();
        if let Some(after) = &self.after {
            // (k1, k2) > (a, b) spelled out, so the index range is used.
            let mut alternatives = Vec::new();
            for last in 0..key.len() {
                let mut terms = Vec::new();
                for (i, &k) in key.iter().enumerate().take(last + 1) {
                    let op = if i == last { ">" } else { "=" };
                    terms.push(format!(
                        "{} {op} {}",
                        key_names[i],
                        table.kinds[k].parameter()
                    ));
                    params.push(after[i].clone());
                }
                alternatives.push(format!("({})", terms.join(" AND ")));
            }
            sql.push_str(&format!(" WHERE {}", alternatives.join(" OR ")));
        }
        sql.push_str(&format!(" ORDER BY {}", key_names.join(", ")));
        (sql, params)
    }

    /// The rows as Arrow columns with their positions, each value
    /// converted straight into its column.
    fn chunk(&mut self, table: &Table, rows: Vec<Row>) -> Result<Transaction, SourceError> {
        let width = table.kinds.len();
        let key = &table.schema.key;
        let mut columns: Vec<ColumnBuilder> = table
            .schema
            .columns
            .iter()
            .map(|c| ColumnBuilder::new(&c.data_type, rows.len()))
            .collect();
        let mut positions = BinaryBuilder::with_capacity(rows.len(), 0);
        let mut writer = PositionWriter::new(&table.name, self.stream_from);
        // One row's converted values, kept from row to row.
        let mut converted: Vec<Value> = Vec::with_capacity(width);
        for row in rows {
            let raw = row.unwrap();
            if raw.len() != width {
                return Err(SourceError::Invalid(format!(
                    "{}: the backfill read {} columns, the table has {width}",
                    table.name,
                    raw.len()
                )));
            }
            writer.read_key(key.iter().map(|&k| &raw[k]));
            converted.clear();
            for (i, value) in raw.into_iter().enumerate() {
                let v = convert(&table.kinds[i], value, Origin::Query).map_err(|e| {
                    SourceError::Invalid(format!(
                        "{}, column `{}`, backfill row with key {}: {e}",
                        table.name,
                        table.schema.columns[i].name,
                        writer
                            .key_values()
                            .iter()
                            .map(show)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
                converted.push(v);
            }
            positions.append_value(writer.position(key.iter().map(|&k| &converted[k])));
            for (column, value) in columns.iter_mut().zip(converted.drain(..)) {
                column.push(value);
            }
        }
        let arrays = columns.into_iter().map(ColumnBuilder::finish).collect();
        let positions: BinaryArray = positions.finish();
        let end = weir_core::position::Position::from_bytes(
            positions.value(positions.len() - 1).to_vec(),
        );
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        Ok(Transaction::of_reads(
            vec![SnapshotRows {
                table: table.schema.clone(),
                columns: arrays,
                positions,
                commit_ts_micros: now,
            }],
            end,
        ))
    }
}
