//! A table's backfill COPY: the query that selects its rows in key order,
//! and the reader that turns the lines it sends into snapshot rows, in
//! Arrow.

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_array::builder::{ArrayBuilder, BinaryBuilder, StringBuilder};
use arrow_schema::DataType;

use crate::SourceError;
use crate::change::{SnapshotRows, Value};
use crate::postgres::copy_binary::{
    BinaryFields, decode_binary, key_text, prints_key, reads_binary,
};
use crate::postgres::decode::{CopyLine, PgKind, decode, ident};
use crate::postgres::keys::{KeyOrder, append_key_texts, encode_key_part};
use crate::postgres::table::Table;
use weir_core::position::Position;

/// Where a key column's text is found on a line of the backfill's COPY.
#[derive(Clone, Copy, Debug, PartialEq)]
enum KeyField {
    /// The column's own field; decoded there already for a `Native` order.
    Column(usize),
    /// An expression selected after the columns (`ctid`, or a key ordered
    /// by a text form its column does not print as such).
    Extra(usize),
}

/// How the backfill's COPY sends a table's rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum CopyFormat {
    Text,
    /// When every column's type is one `copy_binary` reads, and every key
    /// column's text form (kept in positions) follows from its value.
    Binary,
}

impl CopyFormat {
    fn of(table: &Table) -> CopyFormat {
        let columns =
            table
                .info
                .columns
                .iter()
                .zip(&table.schema.columns)
                .all(|(column, declared)| {
                    reads_binary(column.type_oid, &column.kind)
                        && (column.kind != PgKind::Text || declared.data_type == DataType::Utf8)
                });
        let (_, fields) = selected(table, CopyFormat::Text);
        let keys =
            fields
                .iter()
                .zip(table.key_orders())
                .all(|(field, order)| match (field, order) {
                    (KeyField::Column(_), KeyOrder::Native(kind)) => prints_key(&kind),
                    // A text column's bytes, or an expression selected as text.
                    _ => true,
                });
        if columns && keys {
            CopyFormat::Binary
        } else {
            CopyFormat::Text
        }
    }
}

/// Every column, then the key expressions a column's own field cannot
/// stand for (as text, in binary); and where each key column's text is.
fn selected(table: &Table, format: CopyFormat) -> (Vec<String>, Vec<KeyField>) {
    let extra = |expr: String| match format {
        CopyFormat::Text => expr,
        CopyFormat::Binary => format!("({expr})::text"),
    };
    let width = table.info.columns.len();
    let mut select: Vec<String> = table
        .info
        .columns
        .iter()
        .map(|c| format!("w.{}", ident(&c.name)))
        .collect();
    let exprs = table.key_order_exprs();
    if table.info.key.is_empty() {
        select.extend(exprs.into_iter().map(extra));
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
            select.push(extra(expr));
        }
    }
    (select, fields)
}

/// `COPY (SELECT every column, then the key expressions it needs ... WHERE
/// (key) > (after) ORDER BY key) TO STDOUT`, in `format`.
pub(super) fn copy_sql(table: &Table, after_key: Option<&[String]>, format: CopyFormat) -> String {
    let key_exprs = table.key_order_exprs();
    let (select, _) = selected(table, format);
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
    let with = match format {
        CopyFormat::Text => "",
        CopyFormat::Binary => " WITH (FORMAT binary)",
    };
    format!(
        "COPY (SELECT {} FROM {} AS w{filter} ORDER BY {}) TO STDOUT{with}",
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
pub(super) struct RowReader {
    /// The table as the backfill started it.
    pub(super) table: Table,
    pub(super) format: CopyFormat,
    orders: Vec<KeyOrder>,
    key_fields: Vec<KeyField>,
    /// Fields a line must have.
    expected: usize,
    line: CopyLine,
    /// A binary row's key texts, made from its values.
    key_texts: Vec<String>,
    key: Vec<u8>,
    position: Vec<u8>,
    columns: Vec<ColumnRows>,
    positions: BinaryBuilder,
    /// Rows read so far, for errors.
    number: u64,
}

impl RowReader {
    pub(super) fn new(table: &Table) -> RowReader {
        let format = CopyFormat::of(table);
        let (select, key_fields) = selected(table, format);
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
                present_since: table.present_since.clone(),
            },
            format,
            orders: table.key_orders(),
            key_texts: vec![String::new(); key_fields.len()],
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
    pub(super) fn len(&self) -> usize {
        self.positions.len()
    }

    /// Adds the row on one line of COPY text (with or without its
    /// newline). After an error the reader is left half-way through a row
    /// and must not be used again.
    pub(super) fn read(&mut self, line: &[u8]) -> Result<(), SourceError> {
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
            let got = fields.len();
            let line = format!(": {:?}", String::from_utf8_lossy(text));
            return Err(self.wrong_width("line", got, &line));
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
        for (text, field) in self.key_texts.iter_mut().zip(&self.key_fields) {
            text.clear();
            text.push_str(key_text(field).unwrap_or_default());
        }
        self.add_position()
    }

    /// A `line` (text) or `row` (binary) of `got` fields, `shown` after
    /// the count, where the query selects another number.
    fn wrong_width(&self, unit: &str, got: usize, shown: &str) -> SourceError {
        SourceError::Invalid(format!(
            "table {}: {unit} {} of the backfill has {got} fields where the query selects {}{shown}",
            self.table.info.qualified(),
            self.number,
            self.expected,
        ))
    }

    /// Adds the position of the row just read: its key, encoded from the
    /// key columns' values where the order is theirs, else from
    /// `key_texts`, then those texts.
    fn add_position(&mut self) -> Result<(), SourceError> {
        self.key.clear();
        let key = self
            .orders
            .iter()
            .zip(&self.key_fields)
            .zip(&self.key_texts);
        for ((order, field), text) in key {
            let value = match (order, field) {
                (KeyOrder::Native(_), KeyField::Column(c)) => match &self.columns[*c] {
                    ColumnRows::Values(values) => values.last(),
                    ColumnRows::Text(_) => None,
                },
                _ => None,
            };
            encode_key_part(order, value, text, &mut self.key).map_err(|e| {
                SourceError::Invalid(format!("table {}: key: {e}", self.table.info.qualified()))
            })?;
        }
        append_key_texts(self.key_texts.iter().map(String::as_str), &mut self.key);
        Position::write_snapshot(&self.table.schema.name, &self.key, &mut self.position);
        self.positions.append_value(&self.position);
        Ok(())
    }

    /// Adds the row of a binary COPY. After an error the reader is left
    /// half-way through a row and must not be used again.
    pub(super) fn read_binary(&mut self, fields: &BinaryFields) -> Result<(), SourceError> {
        self.number += 1;
        if fields.len() != self.expected {
            return Err(self.wrong_width("row", fields.len(), ""));
        }
        let table = &self.table;
        let invalid = |why: String| {
            SourceError::Invalid(format!(
                "table {}: row {} of the backfill: {why}",
                table.info.qualified(),
                self.number
            ))
        };
        // The key's texts first, so that an error names the row.
        for ((text, field), order) in self
            .key_texts
            .iter_mut()
            .zip(&self.key_fields)
            .zip(&self.orders)
        {
            let (KeyField::Column(i) | KeyField::Extra(i)) = *field;
            let bytes = fields.get(i).ok_or_else(|| invalid("a null key".into()))?;
            match order {
                KeyOrder::Native(kind) => {
                    let value = decode_binary(kind, bytes).map_err(&invalid)?;
                    key_text(&value, text);
                }
                _ => {
                    text.clear();
                    text.push_str(
                        std::str::from_utf8(bytes)
                            .map_err(|e| invalid(format!("a key that is not UTF-8 ({e})")))?,
                    );
                }
            }
        }
        let key_texts = &self.key_texts;
        let refused = |c: usize, why: &str| {
            let key: Vec<Option<&str>> = key_texts.iter().map(|t| Some(t.as_str())).collect();
            table.value_refused(c, why, &key)
        };
        for (c, (column, rows)) in table.info.columns.iter().zip(&mut self.columns).enumerate() {
            let bytes = fields.get(c);
            match rows {
                ColumnRows::Text(builder) => match bytes {
                    None => builder.append_null(),
                    Some(bytes) => builder.append_value(
                        std::str::from_utf8(bytes)
                            .map_err(|e| refused(c, &format!("text that is not UTF-8 ({e})")))?,
                    ),
                },
                ColumnRows::Values(values) => {
                    let value = match bytes {
                        None => Value::Null,
                        Some(bytes) => {
                            decode_binary(&column.kind, bytes).map_err(|why| refused(c, &why))?
                        }
                    };
                    let declared = &table.schema.columns[c].data_type;
                    crate::batch::fits(&value, declared).map_err(|why| refused(c, &why))?;
                    values.push(value);
                }
            }
        }
        self.add_position()
    }

    /// The rows read since the last call, as snapshot rows read at
    /// `commit_ts`; the buffers start again empty.
    pub(super) fn take(&mut self, commit_ts: i64) -> SnapshotRows {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{Change, Op};
    use crate::postgres::catalog::PgColumn;
    use crate::postgres::copy_binary::BinaryRows;
    use crate::postgres::decoder::tests::{column, table_of};
    use crate::postgres::keys::decode_key_texts;

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
        Ok(changes_of(&rows))
    }

    /// Each row of a piece, read back from its arrays as a change.
    fn changes_of(rows: &SnapshotRows) -> Vec<Change> {
        (0..rows.len())
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
            .collect()
    }

    #[test]
    fn a_table_is_read_after_the_last_key_in_key_order_in_one_query() {
        assert_eq!(
            copy_sql(&docs(), None, CopyFormat::Text),
            "COPY (SELECT w.\"id\", w.\"title\" FROM \"public\".\"docs\" AS w ORDER BY w.\"id\") \
             TO STDOUT"
        );
        assert_eq!(
            copy_sql(&docs(), Some(&["7".to_string()]), CopyFormat::Text),
            "COPY (SELECT w.\"id\", w.\"title\" FROM \"public\".\"docs\" AS w \
             WHERE (w.\"id\") > ('7'::bigint) ORDER BY w.\"id\") TO STDOUT"
        );
    }

    /// A binary COPY's data: header, `rows` (each field's bytes, None for
    /// NULL), trailer.
    fn binary_copy(rows: &[Vec<Option<Vec<u8>>>]) -> Vec<u8> {
        let mut b = b"PGCOPY\n\xff\r\n\0".to_vec();
        b.extend_from_slice(&[0; 8]);
        for row in rows {
            b.extend_from_slice(&(row.len() as u16).to_be_bytes());
            for field in row {
                match field {
                    Some(bytes) => {
                        b.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
                        b.extend_from_slice(bytes);
                    }
                    None => b.extend_from_slice(&u32::MAX.to_be_bytes()),
                }
            }
        }
        b.extend_from_slice(&u16::MAX.to_be_bytes());
        b
    }

    /// The rows of a binary COPY's `data`, as [`read`] gives them.
    fn read_binary(table: &Table, data: &[u8]) -> Result<Vec<Change>, SourceError> {
        let mut reader = RowReader::new(table);
        assert_eq!(reader.format, CopyFormat::Binary);
        let mut rows = BinaryRows::default();
        rows.push(bytes::Bytes::copy_from_slice(data));
        while let Some(fields) = rows.next_row().map_err(SourceError::Invalid)? {
            reader.read_binary(&fields)?;
        }
        rows.finish().map_err(SourceError::Invalid)?;
        Ok(changes_of(&reader.take(5)))
    }

    fn money(name: &str) -> PgColumn {
        let kind = PgKind::Decimal {
            precision: 12,
            scale: 2,
        };
        column(name, kind, "numeric(12,2)")
    }

    fn many_types() -> Table {
        table_of(
            "public.many",
            vec![
                column("id", PgKind::Int64, "bigint"),
                column("title", PgKind::Text, "text"),
                money("price"),
                column("at", PgKind::TimestampTz, "timestamp with time zone"),
                column("day", PgKind::Date, "date"),
                column("ok", PgKind::Bool, "boolean"),
                column("ratio", PgKind::Float64, "double precision"),
                column("raw", PgKind::Bytea, "bytea"),
                column("n", PgKind::Int32, "integer"),
            ],
            vec![0],
        )
    }

    #[test]
    fn a_binary_copy_reads_as_its_text_copy_does() {
        let table = many_types();
        let text = read(
            &table,
            b"1\ta\\tb\t-12.50\t2024-01-01 00:00:00.000001+00\t1999-12-31\tt\t1.5\t\\\\x0102\t-3\n\
              2\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\n",
        )
        .unwrap();
        // -12.50: base-10000 digits [12, 5000], weight 0, negative, dscale 2.
        let numeric = [0, 2, 0, 0, 0x40, 0, 0, 2, 0, 12, 0x13, 0x88].to_vec();
        // 2024-01-01 is 8766 days after 2000-01-01.
        let micros: i64 = 8766 * 86_400_000_000 + 1;
        let data = binary_copy(&[
            vec![
                Some(1i64.to_be_bytes().to_vec()),
                Some(b"a\tb".to_vec()),
                Some(numeric),
                Some(micros.to_be_bytes().to_vec()),
                Some((-1i32).to_be_bytes().to_vec()),
                Some(vec![1]),
                Some(1.5f64.to_be_bytes().to_vec()),
                Some(vec![1, 2]),
                Some((-3i32).to_be_bytes().to_vec()),
            ],
            std::iter::once(Some(2i64.to_be_bytes().to_vec()))
                .chain(std::iter::repeat_n(None, 8))
                .collect(),
        ]);
        let binary = read_binary(&table, &data).unwrap();
        assert_eq!(binary.len(), 2);
        assert_eq!(binary[0].values, text[0].values);
        assert_eq!(binary[1].values, text[1].values);
        // The same positions: the key's text form is the same.
        assert_eq!(binary[0].pos, text[0].pos);
        assert_eq!(binary[1].pos, text[1].pos);
    }

    #[test]
    fn a_binary_value_that_cannot_be_carried_names_its_row() {
        let table = many_types();
        let mut row: Vec<Option<Vec<u8>>> = vec![None; 9];
        row[0] = Some(7i64.to_be_bytes().to_vec());
        // numeric NaN.
        row[2] = Some(vec![0, 0, 0, 0, 0xC0, 0, 0, 0]);
        let e = read_binary(&table, &binary_copy(&[row]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("column price, row with key (id) = ('7')")
                && e.contains("numeric NaN has no decimal form"),
            "{e}"
        );
    }

    #[test]
    fn binary_is_chosen_only_where_every_column_and_key_text_follow_from_it() {
        assert_eq!(CopyFormat::of(&many_types()), CopyFormat::Binary);
        assert_eq!(
            copy_sql(&docs(), None, CopyFormat::Binary),
            "COPY (SELECT w.\"id\", w.\"title\" FROM \"public\".\"docs\" AS w ORDER BY w.\"id\") \
             TO STDOUT WITH (FORMAT binary)"
        );
        // An array column: text.
        let tags = table_of(
            "public.tags",
            vec![
                column("id", PgKind::Int64, "bigint"),
                column("tags", PgKind::Array(Box::new(PgKind::Int32)), "integer[]"),
            ],
            vec![0],
        );
        assert_eq!(CopyFormat::of(&tags), CopyFormat::Text);
        // A timestamptz key prints by the session's settings: text.
        let events = table_of(
            "public.events",
            vec![column(
                "at",
                PgKind::TimestampTz,
                "timestamp with time zone",
            )],
            vec![0],
        );
        assert_eq!(CopyFormat::of(&events), CopyFormat::Text);
        // No key: ctid, selected as text.
        let log = table_of(
            "public.log",
            vec![column("body", PgKind::Text, "text")],
            vec![],
        );
        assert_eq!(CopyFormat::of(&log), CopyFormat::Binary);
        let (select, _) = selected(&log, CopyFormat::Binary);
        assert_eq!(select[1], "(w.ctid)::text");
        let data = binary_copy(&[vec![Some(b"x".to_vec()), Some(b"(0,4)".to_vec())]]);
        let rows = read_binary(&log, &data).unwrap();
        let (_, key) = rows[0].pos.as_snapshot().unwrap();
        assert_eq!(
            decode_key_texts(&log.key_orders(), key),
            Some(vec!["(0,4)".to_string()])
        );
    }

    #[test]
    fn a_table_is_read_only_where_the_publication_filter_keeps_rows() {
        let mut table = docs();
        table.info.row_filter = Some("(title <> 'secret'::text)".into());
        assert_eq!(
            copy_sql(&table, Some(&["7".to_string()]), CopyFormat::Text),
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
        let sql = copy_sql(&log, Some(&["(0,3)".to_string()]), CopyFormat::Text);
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
        let (select, fields) = selected(&codes, CopyFormat::Text);
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
            crate::postgres::keys::encode_key(&table.key_orders(), &["2".into()]).unwrap()
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
            vec![column("sku", PgKind::Text, "text"), money("price")],
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
