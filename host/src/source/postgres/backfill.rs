//! The backfill: every table of the publication in name order, each in
//! key order, read by one streaming `COPY ... TO STDOUT` per table. A reader
//! thread decodes its rows straight into Arrow arrays and hands them on in
//! pieces through a bounded channel, so the server goes on sending while
//! the pipeline commits; every `chunk_rows` rows are one transaction for
//! the pipeline.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow_array::ArrayRef;
use arrow_array::builder::{ArrayBuilder, BinaryBuilder, StringBuilder};
use arrow_schema::DataType;
use futures::StreamExt;
use tokio_postgres::{CancelToken, Client};

use super::Context;
use super::decode::{CopyLine, PgKind, decode, ident, literal};
use super::keys::{KeyOrder, append_key_texts, decode_key_texts, encode_key_part};
use super::session::classify;
use super::table::Table;
use crate::change::{SnapshotRows, Transaction, Value};
use crate::position::Position;
use crate::source::SourceError;

/// A piece of rows the reader hands on ends at this many bytes of COPY
/// text, or at [`PIECE_ROWS`] rows, or where a transaction ends.
const PIECE_BYTES: usize = 1 << 20;
const PIECE_ROWS: usize = 4096;
/// How many pieces the reader may be ahead of the pipeline: with
/// [`PIECE_BYTES`], what bounds the memory the read-ahead takes.
const PIECES_AHEAD: usize = 4;
/// Pause before reading a table again after its connection was lost.
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// Where the backfill stands.
pub(super) struct Backfill {
    /// Indexes of the tables still to read, in name order.
    queue: Vec<usize>,
    /// Within the first table of the queue: the key to read after.
    after_key: Option<Vec<String>>,
    /// The position of the last row the reader handed on, in the first
    /// table of the queue: where a read that lost its connection resumes.
    last_read: Option<Position>,
    /// The streaming read of the first table of the queue.
    reader: Option<Reader>,
    /// Set when a read failed in a way a new connection may get past:
    /// until when it is tried again.
    retry_until: Option<Instant>,
    /// The slot's exported snapshot, to read every table in.
    snapshot: Option<String>,
    /// Whether the query session is inside the transaction that imported it.
    in_snapshot_tx: bool,
    /// The query connection that imported the snapshot: a read on any other
    /// would not see the database as of the slot's start.
    snapshot_connection: Option<u64>,
    /// Shows on a terminal only.
    show_progress: bool,
    bar: Option<indicatif::ProgressBar>,
}

impl Backfill {
    /// A backfill of tables `first..table_count` (all of them, or from
    /// where a previous run stopped: after `key` in table `first`), read in
    /// `snapshot` when there is one.
    pub fn new(
        table_count: usize,
        resume: Option<(usize, Vec<String>)>,
        snapshot: Option<String>,
    ) -> Backfill {
        let (first, after_key) = match resume {
            Some((table, key)) => (table, Some(key)),
            None => (0, None),
        };
        Backfill {
            queue: (first..table_count).collect(),
            after_key,
            last_read: None,
            reader: None,
            retry_until: None,
            snapshot,
            in_snapshot_tx: false,
            snapshot_connection: None,
            show_progress: std::io::stderr().is_terminal(),
            bar: None,
        }
    }

    /// The next `chunk_rows` rows (fewer at a table's end) as one
    /// transaction; None once every table is read.
    pub fn next_chunk(&mut self, cx: &mut Context) -> Result<Option<Transaction>, SourceError> {
        let limit = cx.config.chunk_rows.max(1);
        let mut chunk: Vec<SnapshotRows> = Vec::new();
        loop {
            let Some(&t) = self.queue.first() else {
                self.finish(cx);
                return Ok(None);
            };
            if cx.tables[t].departed.is_some() {
                // No longer published, perhaps gone: the stream gives it
                // its last changes, there is nothing to read.
                self.queue.remove(0);
                (self.after_key, self.last_read) = (None, None);
                continue;
            }
            self.enter_snapshot(cx)?;
            self.show(&cx.tables[t]);
            if self.reader.is_none() {
                let in_chunk = chunk.iter().map(SnapshotRows::len).sum();
                self.reader = Some(self.start_reader(cx, t, in_chunk, limit)?);
            }
            let reader = self.reader.as_mut().expect("started above");
            match reader.next_piece() {
                Piece::Rows { rows, chunk_end } => {
                    self.retry_until = None;
                    if !rows.is_empty() {
                        self.last_read = Some(rows.position(rows.len() - 1));
                        chunk.push(rows);
                    }
                    if chunk_end {
                        self.check_still_in_snapshot(cx, &cx.tables[t])?;
                        return Ok(Some(self.hand_on(cx, chunk)));
                    }
                }
                Piece::End => {
                    self.reader = None;
                    self.check_still_in_snapshot(cx, &cx.tables[t])?;
                    self.table_done(&cx.tables[t]);
                    if !chunk.is_empty() {
                        return Ok(Some(self.hand_on(cx, chunk)));
                    }
                }
                Piece::Failed(e) => {
                    self.reader = None;
                    self.read_failed(cx, t, e)?;
                }
            }
        }
    }

    /// Starts the streaming read of table `t` after the last row read, on
    /// the query connection (in the snapshot's transaction when there is
    /// one); `in_chunk` rows of the current transaction are read already.
    fn start_reader(
        &mut self,
        cx: &mut Context,
        t: usize,
        in_chunk: usize,
        limit: usize,
    ) -> Result<Reader, SourceError> {
        let table = &cx.tables[t];
        if let Some(pos) = &self.last_read {
            let key = pos
                .as_snapshot()
                .and_then(|(_, key)| decode_key_texts(&table.key_orders(), key))
                .ok_or_else(|| {
                    SourceError::Invalid(format!(
                        "table {}: the backfill cannot read its own last position {pos} back",
                        table.info.qualified()
                    ))
                })?;
            self.after_key = Some(key);
        }
        let client = cx.session.shared_client("reading a table's backfill")?;
        let table = &cx.tables[t];
        self.check_still_in_snapshot(cx, table)?;
        let sql = copy_sql(table, self.after_key.as_deref());
        let rows = RowReader::new(table);
        let (pieces_in, pieces) = sync_channel(PIECES_AHEAD);
        let cancel = client.cancel_token();
        let rt = cx.session.runtime().clone();
        let thread_rt = rt.clone();
        let thread = std::thread::Builder::new()
            .name("weir-backfill".into())
            .spawn(move || {
                thread_rt.block_on(read_table(&client, &sql, rows, in_chunk, limit, &pieces_in))
            })?;
        Ok(Reader {
            pieces: Some(pieces),
            thread: Some(thread),
            cancel,
            rt,
            finished: false,
        })
    }

    /// A read that failed: the run stops, unless the failure was the
    /// connection and no snapshot is lost with it (then the table is read
    /// again after its last row read, within the reconnect timeout).
    fn read_failed(
        &mut self,
        cx: &mut Context,
        t: usize,
        e: SourceError,
    ) -> Result<(), SourceError> {
        if !e.is_transient() {
            return Err(e);
        }
        if self.snapshot.is_some() {
            return Err(lost_snapshot(&cx.tables[t], &e));
        }
        let until = *self
            .retry_until
            .get_or_insert_with(|| Instant::now() + cx.config.reconnect_timeout());
        if Instant::now() >= until {
            return Err(e);
        }
        tracing::warn!("{e}; reading the table again after its last row read");
        std::thread::sleep(RETRY_DELAY);
        Ok(())
    }

    /// The rows read as one transaction, ending at the last one.
    fn hand_on(&mut self, cx: &mut Context, reads: Vec<SnapshotRows>) -> Transaction {
        let last = reads.last().expect("a chunk has rows");
        let end = last.position(last.len() - 1);
        cx.emitted.advance(end.clone());
        let tx = Transaction {
            changes: Vec::new(),
            reads,
            end,
        };
        if let Some(bar) = &self.bar {
            bar.inc(tx.rows() as u64);
        }
        tx
    }

    /// Imports the slot's snapshot before the first read.
    fn enter_snapshot(&mut self, cx: &mut Context) -> Result<(), SourceError> {
        let Some(name) = &self.snapshot else {
            return Ok(());
        };
        if self.in_snapshot_tx {
            return Ok(());
        }
        let sql = format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
            literal(name)
        );
        cx.session.execute("importing the slot's snapshot", &sql)?;
        self.in_snapshot_tx = true;
        self.snapshot_connection = Some(cx.session.connection_number());
        tracing::info!(snapshot = %name, "backfill reads the slot's exported snapshot");
        Ok(())
    }

    /// A lost connection ends the transaction that held the snapshot, and
    /// the session reconnects on its own: rows read since come from the
    /// current data, not from the slot's start, so the run stops rather than
    /// mix the two. The next run resumes after the last committed chunk.
    fn check_still_in_snapshot(&self, cx: &Context, table: &Table) -> Result<(), SourceError> {
        match self.snapshot_connection {
            Some(n) if n != cx.session.connection_number() || cx.session.is_closed() => {
                Err(lost_snapshot(table, &"the connection was closed"))
            }
            _ => Ok(()),
        }
    }

    fn show(&mut self, table: &Table) {
        if self.bar.is_some() || !self.show_progress {
            return;
        }
        let estimate = table.info.estimated_rows;
        let bar = if estimate > 0.0 {
            indicatif::ProgressBar::new(estimate as u64)
        } else {
            indicatif::ProgressBar::new_spinner()
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "backfill {msg} [{bar:30}] {pos}/~{len} rows ({per_sec})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(table.info.qualified());
        self.bar = Some(bar);
    }

    fn table_done(&mut self, table: &Table) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
        tracing::info!(table = %table.schema.name, "backfill of the table complete");
        self.queue.remove(0);
        self.after_key = None;
        self.last_read = None;
    }

    fn finish(&mut self, cx: &mut Context) {
        if self.in_snapshot_tx {
            // Only a read-only snapshot ends here; a failure loses nothing.
            let _ = cx.session.execute("ending the backfill snapshot", "COMMIT");
            self.in_snapshot_tx = false;
        }
        tracing::info!("backfill complete; streaming");
    }
}

fn lost_snapshot(table: &Table, cause: &dyn std::fmt::Display) -> SourceError {
    SourceError::Unavailable(format!(
        "the backfill of table {} lost the connection that held the slot's exported snapshot \
         ({cause}), so what it reads now would not be the database as of the slot's start; \
         stopping rather than go on outside the snapshot. Run again: the backfill resumes after \
         its last committed chunk",
        table.schema.name
    ))
}

/// What the reader hands on, in order.
enum Piece {
    /// Rows in key order; `chunk_end`: the last row of a transaction.
    Rows { rows: SnapshotRows, chunk_end: bool },
    /// The table is read to its end.
    End,
    /// The read failed; nothing follows.
    Failed(SourceError),
}

/// One table's streaming read, on a thread of its own.
struct Reader {
    /// Taken on drop, so that a reader waiting to hand on a piece stops.
    pieces: Option<Receiver<Piece>>,
    thread: Option<JoinHandle<()>>,
    /// Ends the query on the server when the read is dropped unfinished.
    cancel: CancelToken,
    rt: tokio::runtime::Handle,
    /// Whether the reader said its last word (End or Failed).
    finished: bool,
}

impl Reader {
    fn next_piece(&mut self) -> Piece {
        let piece = self
            .pieces
            .as_ref()
            .and_then(|pieces| pieces.recv().ok())
            .unwrap_or_else(|| {
                Piece::Failed(SourceError::Invalid(
                    "the backfill's reader thread ended without handing on its rows".into(),
                ))
            });
        self.finished = !matches!(piece, Piece::Rows { .. });
        piece
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.pieces = None;
        if self.finished {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
            return;
        }
        // Stopped mid-table (the run stops, or failed): the server would
        // otherwise send the rest of the table before the connection could
        // serve anything else. The thread ends on its own once the query does.
        let cancel = self.cancel.clone();
        let cancelled = self.rt.block_on(async move {
            tokio::time::timeout(
                Duration::from_secs(5),
                cancel.cancel_query(tokio_postgres::NoTls),
            )
            .await
        });
        if !matches!(cancelled, Ok(Ok(()))) {
            tracing::debug!("could not cancel the backfill's COPY; its connection ends it");
        }
    }
}

/// Reads one table with `sql` (a `COPY ... TO STDOUT`) and hands its rows
/// on in pieces, `in_chunk` rows into a transaction of `limit` rows.
async fn read_table(
    client: &Client,
    sql: &str,
    mut rows: RowReader,
    mut in_chunk: usize,
    limit: usize,
    out: &SyncSender<Piece>,
) {
    let what = format!("reading the backfill of table {}", rows.table.schema.name);
    let read = async {
        let fail = |e: tokio_postgres::Error| classify(&what, client.is_closed(), &e);
        let stream = client.copy_out(sql).await.map_err(fail)?;
        let mut stream = std::pin::pin!(stream);
        let commit_ts = now_micros();
        let mut bytes = 0;
        while let Some(line) = stream.next().await {
            let line = line.map_err(fail)?;
            rows.read(&line)?;
            in_chunk += 1;
            bytes += line.len();
            let chunk_end = in_chunk >= limit;
            if chunk_end || bytes >= PIECE_BYTES || rows.len() >= PIECE_ROWS {
                let rows = rows.take(commit_ts);
                if out.send(Piece::Rows { rows, chunk_end }).is_err() {
                    // The backfill stopped reading: so does this thread.
                    return Ok(false);
                }
                if chunk_end {
                    in_chunk = 0;
                }
                bytes = 0;
            }
        }
        if rows.len() > 0 {
            let rows = Piece::Rows {
                rows: rows.take(commit_ts),
                chunk_end: false,
            };
            if out.send(rows).is_err() {
                return Ok(false);
            }
        }
        Ok::<bool, SourceError>(true)
    };
    let last = match read.await {
        Ok(true) => Piece::End,
        Ok(false) => return,
        Err(e) => Piece::Failed(e),
    };
    let _ = out.send(last);
}

/// Where a key column's text is found on a line of the backfill's COPY.
#[derive(Clone, Copy, Debug, PartialEq)]
enum KeyField {
    /// The column's own field; decoded there already for a `Native` order.
    Column(usize),
    /// An expression selected after the columns (`ctid`, or a key ordered
    /// by a text form its column does not print as such).
    Extra(usize),
}

/// Every column, then the key expressions a column's own field cannot
/// stand for; and where each key column's text is.
fn selected(table: &Table) -> (Vec<String>, Vec<KeyField>) {
    let width = table.info.columns.len();
    let mut select: Vec<String> = table
        .info
        .columns
        .iter()
        .map(|c| format!("w.{}", ident(&c.name)))
        .collect();
    let exprs = table.key_order_exprs();
    if table.info.key.is_empty() {
        select.extend(exprs);
        return (select, vec![KeyField::Extra(width)]);
    }
    let mut fields = Vec::new();
    for ((&c, order), expr) in table.info.key.iter().zip(table.key_orders()).zip(exprs) {
        let column = &table.info.columns[c];
        // COPY prints a column with its output function, which a cast to
        // text also uses, except for the types cast by their own rule
        // (char(n) drops its padding): only text and varchar are sure to
        // print as their text form orders.
        let prints_as_text = column.kind == PgKind::Text
            && (column.sql_type == "text" || column.sql_type.starts_with("character varying"));
        if matches!(order, KeyOrder::Native(_)) || prints_as_text {
            fields.push(KeyField::Column(c));
        } else {
            fields.push(KeyField::Extra(select.len()));
            select.push(expr);
        }
    }
    (select, fields)
}

/// `COPY (SELECT every column, then the key expressions it needs ... WHERE
/// (key) > (after) ORDER BY key) TO STDOUT`.
fn copy_sql(table: &Table, after_key: Option<&[String]>) -> String {
    let key_exprs = table.key_order_exprs();
    let (select, _) = selected(table);
    // The publication's row filter: rows outside it never stream, so a
    // backfilled one would stay in the sinks however Postgres changes it.
    let mut conditions: Vec<String> = table
        .info
        .row_filter
        .iter()
        .map(|f| format!("({f})"))
        .collect();
    if let Some(key) = after_key {
        conditions.push(format!(
            "({}) > ({})",
            key_exprs.join(", "),
            table.key_order_literals(key).join(", ")
        ));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    format!(
        "COPY (SELECT {} FROM {} AS w{filter} ORDER BY {}) TO STDOUT",
        select.join(", "),
        table.info.sql_name(),
        key_exprs.join(", "),
    )
}

/// One column of the rows a reader is building: text goes straight into
/// Arrow; any other type is kept as values, turned into Arrow when the
/// rows are handed on (as the batcher turns a change's values).
enum ColumnRows {
    Text(StringBuilder),
    Values(Vec<Value>),
}

/// Turns lines of the backfill's COPY into snapshot rows, columnar, with
/// no allocation per row: the rows of one piece accumulate in per-column
/// buffers until [`RowReader::take`].
struct RowReader {
    /// The table as the backfill started it.
    table: Table,
    orders: Vec<KeyOrder>,
    key_fields: Vec<KeyField>,
    /// Fields a line must have.
    expected: usize,
    line: CopyLine,
    key: Vec<u8>,
    position: Vec<u8>,
    columns: Vec<ColumnRows>,
    positions: BinaryBuilder,
    /// Rows read so far, for errors.
    number: u64,
}

impl RowReader {
    fn new(table: &Table) -> RowReader {
        let (select, key_fields) = selected(table);
        let columns = table
            .info
            .columns
            .iter()
            .zip(&table.schema.columns)
            .map(|(column, declared)| {
                if column.kind == PgKind::Text && declared.data_type == DataType::Utf8 {
                    ColumnRows::Text(StringBuilder::new())
                } else {
                    ColumnRows::Values(Vec::new())
                }
            })
            .collect();
        RowReader {
            table: Table {
                info: table.info.clone(),
                schema: table.schema.clone(),
                append: table.append,
                departed: table.departed,
            },
            orders: table.key_orders(),
            key_fields,
            expected: select.len(),
            line: CopyLine::default(),
            key: Vec::new(),
            position: Vec::new(),
            columns,
            positions: BinaryBuilder::new(),
            number: 0,
        }
    }

    /// Rows read since the last [`RowReader::take`].
    fn len(&self) -> usize {
        self.positions.len()
    }

    /// Adds the row on one line of COPY text (with or without its
    /// newline). After an error the reader is left half-way through a row
    /// and must not be used again.
    fn read(&mut self, line: &[u8]) -> Result<(), SourceError> {
        self.number += 1;
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let table = &self.table;
        let fields = self.line.split(text).map_err(|e| {
            SourceError::Invalid(format!(
                "table {}: row {} of the backfill: {e}",
                table.info.qualified(),
                self.number
            ))
        })?;
        if fields.len() != self.expected {
            return Err(SourceError::Invalid(format!(
                "table {}: line {} of the backfill has {} fields where the query selects {}: {:?}",
                table.info.qualified(),
                self.number,
                fields.len(),
                self.expected,
                String::from_utf8_lossy(text)
            )));
        }
        let key_text = |k: &KeyField| match *k {
            KeyField::Column(i) | KeyField::Extra(i) => fields.get(i),
        };
        let refused = |c: usize, text: &str, why: Option<String>| {
            let key: Vec<Option<&str>> = self.key_fields.iter().map(key_text).collect();
            let column = &table.info.columns[c];
            match (table.decode_column(c, text, &key), why) {
                (Err(e), _) => e,
                (Ok(_), Some(why)) => SourceError::Invalid(format!(
                    "table {}, column {}: {why}",
                    table.schema.name, column.name
                )),
                (Ok(_), None) => SourceError::Invalid(format!(
                    "table {}, column {}: a value that decodes once only",
                    table.schema.name, column.name
                )),
            }
        };
        for (c, (column, rows)) in table.info.columns.iter().zip(&mut self.columns).enumerate() {
            let text = fields.get(c);
            match rows {
                ColumnRows::Text(builder) => builder.append_option(text),
                ColumnRows::Values(values) => {
                    let value = match text {
                        None => Value::Null,
                        Some(text) => {
                            decode(&column.kind, text).map_err(|_| refused(c, text, None))?
                        }
                    };
                    let declared = &table.schema.columns[c].data_type;
                    if let Err(why) = crate::batch::fits(&value, declared) {
                        return Err(refused(c, text.unwrap_or_default(), Some(why)));
                    }
                    values.push(value);
                }
            }
        }
        self.key.clear();
        for (order, field) in self.orders.iter().zip(&self.key_fields) {
            let value = match (order, field) {
                (KeyOrder::Native(_), KeyField::Column(c)) => match &self.columns[*c] {
                    ColumnRows::Values(values) => values.last(),
                    ColumnRows::Text(_) => None,
                },
                _ => None,
            };
            let text = key_text(field).unwrap_or_default();
            encode_key_part(order, value, text, &mut self.key).map_err(|e| {
                SourceError::Invalid(format!("table {}: key: {e}", table.info.qualified()))
            })?;
        }
        append_key_texts(
            self.key_fields
                .iter()
                .map(|k| key_text(k).unwrap_or_default()),
            &mut self.key,
        );
        Position::write_snapshot(&table.schema.name, &self.key, &mut self.position);
        self.positions.append_value(&self.position);
        Ok(())
    }

    /// The rows read since the last call, as snapshot rows read at
    /// `commit_ts`; the buffers start again empty.
    fn take(&mut self, commit_ts: i64) -> SnapshotRows {
        let columns = self
            .columns
            .iter_mut()
            .zip(&self.table.schema.columns)
            .map(|(rows, declared)| match rows {
                ColumnRows::Text(builder) => Arc::new(builder.finish()) as ArrayRef,
                ColumnRows::Values(values) => {
                    let array = crate::batch::column_array(
                        &declared.data_type,
                        values.iter(),
                        values.len(),
                    );
                    values.clear();
                    array
                }
            })
            .collect();
        SnapshotRows {
            table: self.table.schema.clone(),
            columns,
            positions: self.positions.finish(),
            commit_ts_micros: commit_ts,
        }
    }
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{Change, Op};
    use crate::source::postgres::catalog::PgColumn;
    use crate::source::postgres::decoder::tests::{column, table_of};

    fn docs() -> Table {
        table_of(
            "public.docs",
            vec![
                column("id", PgKind::Int64, "bigint"),
                column("title", PgKind::Text, "text"),
            ],
            vec![0],
        )
    }

    fn text_column(name: &str, sql_type: &str) -> PgColumn {
        PgColumn {
            sql_type: sql_type.to_string(),
            ..column(name, PgKind::Text, "text")
        }
    }

    /// The rows of `data` (COPY text) as the reader hands them on, one
    /// piece, each row read back from its arrays as a change.
    fn read(table: &Table, data: &[u8]) -> Result<Vec<Change>, SourceError> {
        let mut reader = RowReader::new(table);
        for line in data.split_inclusive(|&b| b == b'\n') {
            reader.read(line)?;
        }
        let rows = reader.take(5);
        assert!(reader.take(6).is_empty(), "a piece takes every row read");
        Ok((0..rows.len())
            .map(|row| Change {
                table: rows.table.clone(),
                op: Op::Read,
                pos: rows.position(row),
                commit_ts_micros: rows.commit_ts_micros,
                snapshot: true,
                values: rows
                    .columns
                    .iter()
                    .map(|c| crate::batch::value_at(c.as_ref(), row))
                    .collect(),
            })
            .collect())
    }

    #[test]
    fn a_table_is_read_after_the_last_key_in_key_order_in_one_query() {
        assert_eq!(
            copy_sql(&docs(), None),
            "COPY (SELECT w.\"id\", w.\"title\" FROM \"public\".\"docs\" AS w ORDER BY w.\"id\") \
             TO STDOUT"
        );
        assert_eq!(
            copy_sql(&docs(), Some(&["7".to_string()])),
            "COPY (SELECT w.\"id\", w.\"title\" FROM \"public\".\"docs\" AS w \
             WHERE (w.\"id\") > ('7'::bigint) ORDER BY w.\"id\") TO STDOUT"
        );
    }

    #[test]
    fn a_table_is_read_only_where_the_publication_filter_keeps_rows() {
        let mut table = docs();
        table.info.row_filter = Some("(title <> 'secret'::text)".into());
        assert_eq!(
            copy_sql(&table, Some(&["7".to_string()])),
            "COPY (SELECT w.\"id\", w.\"title\" FROM \"public\".\"docs\" AS w \
             WHERE ((title <> 'secret'::text)) AND (w.\"id\") > ('7'::bigint) ORDER BY w.\"id\") \
             TO STDOUT"
        );
    }

    #[test]
    fn a_table_without_a_key_goes_by_ctid() {
        let log = table_of(
            "public.log",
            vec![column("body", PgKind::Text, "text")],
            vec![],
        );
        let sql = copy_sql(&log, Some(&["(0,3)".to_string()]));
        assert!(
            sql.starts_with("COPY (SELECT w.\"body\", w.ctid FROM")
                && sql.contains("WHERE (w.ctid) > ('(0,3)'::tid) ORDER BY w.ctid"),
            "{sql}"
        );
        let rows = read(&log, b"a\t(0,4)\n").unwrap();
        let (_, key) = rows[0].pos.as_snapshot().unwrap();
        assert_eq!(
            decode_key_texts(&log.key_orders(), key),
            Some(vec!["(0,4)".to_string()])
        );
    }

    #[test]
    fn a_key_that_prints_otherwise_than_its_text_order_is_selected_once_more() {
        let codes = table_of(
            "public.codes",
            vec![
                text_column("code", "character(4)"),
                text_column("name", "character varying(10)"),
                column("n", PgKind::Int32, "integer"),
            ],
            vec![0, 1, 2],
        );
        let (select, fields) = selected(&codes);
        assert_eq!(
            select[3..],
            ["(w.\"code\"::text) COLLATE \"C\"".to_string()]
        );
        assert_eq!(
            fields,
            vec![KeyField::Extra(3), KeyField::Column(1), KeyField::Column(2)]
        );
        // The padded column keeps its padding; the key its text form.
        let rows = read(&codes, b"ab  \tx\t3\tab\n").unwrap();
        assert_eq!(rows[0].values[0], Value::Utf8("ab  ".into()));
        let (_, key) = rows[0].pos.as_snapshot().unwrap();
        assert_eq!(
            decode_key_texts(&codes.key_orders(), key),
            Some(vec!["ab".to_string(), "x".into(), "3".into()])
        );
    }

    #[test]
    fn rows_become_snapshot_reads_at_their_key() {
        let table = docs();
        let changes = read(&table, b"1\ta\n2\t\\N\n").unwrap();
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[1].op, Op::Read);
        assert!(changes[1].snapshot);
        assert_eq!(changes[1].values, vec![Value::Int64(2), Value::Null]);
        assert!(changes[0].pos < changes[1].pos);
        let (name, key) = changes[1].pos.as_snapshot().unwrap();
        assert_eq!(name, "public.docs");
        assert_eq!(
            decode_key_texts(&table.key_orders(), key),
            Some(vec!["2".to_string()])
        );
        // The same bytes as a key made from its text alone.
        assert_eq!(
            key,
            crate::source::postgres::keys::encode_key(&table.key_orders(), &["2".into()]).unwrap()
        );
        let err = read(&table, b"x\ta\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("table public.docs, column id, row with key (id) = ('x'):"),
            "{err}"
        );
        let err = read(&table, b"\\N\ta\n").unwrap_err();
        assert!(err.to_string().contains("table public.docs: key:"), "{err}");
    }

    #[test]
    fn a_value_no_column_type_can_hold_names_its_column_and_row() {
        let table = table_of(
            "public.prices",
            vec![
                column("sku", PgKind::Text, "text"),
                column(
                    "price",
                    PgKind::Decimal {
                        precision: 12,
                        scale: 2,
                    },
                    "numeric(12,2)",
                ),
            ],
            vec![0],
        );
        let err = read(&table, b"a'1\tNaN\n").unwrap_err();
        assert!(
            err.to_string().contains(
                "table public.prices, column price, row with key (sku) = ('a''1'): numeric NaN \
                 has no decimal form"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_short_copy_line_is_an_error_naming_the_table_and_the_line() {
        let err = read(&docs(), b"1\ta\n2\n").unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("public.docs") && said.contains("line 2") && said.contains("\"2\""),
            "{said}"
        );
        let err = read(&docs(), b"3\ta\tb\n").unwrap_err();
        assert!(err.to_string().contains("public.docs"), "{err}");
    }
}
