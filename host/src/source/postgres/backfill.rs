//! The backfill: every table of the publication in name order, each in
//! key order, in chunks of `chunk_rows` rows read with `COPY ... TO
//! STDOUT`; every chunk is one transaction for the pipeline.

use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use super::Context;
use super::decode::{copy_fields, ident, literal};
use super::keys::encode_key;
use super::table::Table;
use crate::change::{Change, Op, Transaction, Value};
use crate::position::Position;
use crate::source::SourceError;

/// Where the backfill stands.
pub(super) struct Backfill {
    /// Indexes of the tables still to read, in name order.
    queue: Vec<usize>,
    /// Within the first table of the queue: the key to read after.
    after_key: Option<Vec<String>>,
    /// The slot's exported snapshot, to read every chunk in.
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
            snapshot,
            in_snapshot_tx: false,
            snapshot_connection: None,
            show_progress: std::io::stderr().is_terminal(),
            bar: None,
        }
    }

    /// The next chunk as one transaction; None once every table is read.
    pub fn next_chunk(&mut self, cx: &mut Context) -> Result<Option<Transaction>, SourceError> {
        loop {
            let Some(&t) = self.queue.first() else {
                self.finish(cx);
                return Ok(None);
            };
            self.enter_snapshot(cx)?;
            let table = &cx.tables[t];
            self.show(table);
            let limit = cx.config.chunk_rows;
            let sql = chunk_sql(table, self.after_key.as_deref(), limit);
            let data = cx.session.copy_out("reading a backfill chunk", &sql)?;
            let table = &cx.tables[t];
            self.check_still_in_snapshot(cx, table)?;
            let (changes, last_key) = chunk_changes(table, &data, now_micros())?;
            if last_key.is_some() {
                self.after_key = last_key;
            }
            if let Some(bar) = &self.bar {
                bar.inc(changes.len() as u64);
            }
            if changes.len() < limit {
                self.table_done(table);
            }
            if let Some(last) = changes.last() {
                let end = last.pos.clone();
                cx.emitted.advance(end.clone());
                return Ok(Some(Transaction { changes, end }));
            }
        }
    }

    /// Imports the slot's snapshot before the first chunk.
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
            Some(n) if n != cx.session.connection_number() => {
                Err(SourceError::Unavailable(format!(
                    "the backfill of table {} lost the connection that held the slot's exported \
                     snapshot, so what it reads now would not be the database as of the slot's \
                     start; stopping rather than go on outside the snapshot. Run again: the \
                     backfill resumes after its last committed chunk",
                    table.schema.name
                )))
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

/// `COPY (SELECT every column, then the key's order expressions ... WHERE
/// (key) > (after) ORDER BY key LIMIT n) TO STDOUT`.
fn chunk_sql(table: &Table, after_key: Option<&[String]>, limit: usize) -> String {
    let key_exprs = table.key_order_exprs();
    let mut select: Vec<String> = table
        .info
        .columns
        .iter()
        .map(|c| format!("w.{}", ident(&c.name)))
        .collect();
    select.extend(key_exprs.iter().cloned());
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
        "COPY (SELECT {} FROM {} AS w{filter} ORDER BY {} LIMIT {limit}) TO STDOUT",
        select.join(", "),
        table.info.sql_name(),
        key_exprs.join(", "),
    )
}

/// The rows of a chunk as snapshot reads, and the last row's key texts.
fn chunk_changes(
    table: &Table,
    data: &[u8],
    commit_ts: i64,
) -> Result<(Vec<Change>, Option<Vec<String>>), SourceError> {
    let orders = table.key_orders();
    let width = table.info.columns.len();
    let mut changes = Vec::new();
    let mut last_key = None;
    let expected = width + orders.len();
    let lines = data.split(|&b| b == b'\n').filter(|l| !l.is_empty());
    for (number, line) in (1..).zip(lines) {
        let fields = copy_fields(line).map_err(SourceError::Invalid)?;
        if fields.len() != expected {
            return Err(SourceError::Invalid(format!(
                "table {}: line {number} of a backfill chunk has {} fields where the query \
                 selects {expected}: {:?}",
                table.info.qualified(),
                fields.len(),
                String::from_utf8_lossy(line)
            )));
        }
        let key: Vec<Option<&str>> = fields[width..].iter().map(Option::as_deref).collect();
        let values = fields[..width]
            .iter()
            .enumerate()
            .map(|(c, f)| match f {
                None => Ok(Value::Null),
                Some(text) => table.decode_column(c, text, &key),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let key_text: Vec<String> = fields[width..]
            .iter()
            .map(|f| f.clone().unwrap_or_default())
            .collect();
        let key = encode_key(&orders, &key_text).map_err(|e| {
            SourceError::Invalid(format!("table {}: key: {e}", table.info.qualified()))
        })?;
        changes.push(Change {
            table: table.schema.clone(),
            op: Op::Read,
            pos: Position::snapshot(&table.schema.name, &key),
            commit_ts_micros: commit_ts,
            snapshot: true,
            values,
        });
        last_key = Some(key_text);
    }
    Ok((changes, last_key))
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::postgres::decode::PgKind;
    use crate::source::postgres::decoder::tests::{column, table_of};
    use crate::source::postgres::keys::decode_key_texts;

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

    #[test]
    fn a_chunk_reads_after_the_last_key_in_key_order() {
        assert_eq!(
            chunk_sql(&docs(), None, 10),
            "COPY (SELECT w.\"id\", w.\"title\", w.\"id\" FROM \"public\".\"docs\" AS w \
             ORDER BY w.\"id\" LIMIT 10) TO STDOUT"
        );
        assert_eq!(
            chunk_sql(&docs(), Some(&["7".to_string()]), 10),
            "COPY (SELECT w.\"id\", w.\"title\", w.\"id\" FROM \"public\".\"docs\" AS w \
             WHERE (w.\"id\") > ('7'::bigint) ORDER BY w.\"id\" LIMIT 10) TO STDOUT"
        );
    }

    #[test]
    fn a_chunk_reads_only_the_rows_the_publication_filter_keeps() {
        let mut table = docs();
        table.info.row_filter = Some("(title <> 'secret'::text)".into());
        assert_eq!(
            chunk_sql(&table, Some(&["7".to_string()]), 10),
            "COPY (SELECT w.\"id\", w.\"title\", w.\"id\" FROM \"public\".\"docs\" AS w \
             WHERE ((title <> 'secret'::text)) AND (w.\"id\") > ('7'::bigint) ORDER BY w.\"id\" \
             LIMIT 10) TO STDOUT"
        );
    }

    #[test]
    fn a_table_without_a_key_goes_by_ctid() {
        let log = table_of(
            "public.log",
            vec![column("body", PgKind::Text, "text")],
            vec![],
        );
        let sql = chunk_sql(&log, Some(&["(0,3)".to_string()]), 5);
        assert!(
            sql.contains("WHERE (w.ctid) > ('(0,3)'::tid) ORDER BY w.ctid"),
            "{sql}"
        );
    }

    #[test]
    fn chunk_rows_become_snapshot_reads_at_their_key() {
        let table = docs();
        let (changes, last) = chunk_changes(&table, b"1\ta\t1\n2\t\\N\t2\n", 5).unwrap();
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
        assert_eq!(last, Some(vec!["2".to_string()]));
        let err = chunk_changes(&table, b"x\ta\tx\n", 5).unwrap_err();
        assert!(
            err.to_string()
                .contains("table public.docs, column id, row with key (id) = ('x'):"),
            "{err}"
        );
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
        let err = chunk_changes(&table, b"a'1\tNaN\ta'1\n", 5).unwrap_err();
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
        let err = chunk_changes(&docs(), b"1\ta\t1\n2\tb\n", 5).unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("public.docs") && said.contains("line 2") && said.contains("2\\tb"),
            "{said}"
        );
        let err = chunk_changes(&docs(), b"3\n", 5).unwrap_err();
        assert!(err.to_string().contains("public.docs"), "{err}");
    }
}
