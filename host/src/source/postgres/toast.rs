//! Unchanged TOAST values: pgoutput does not send a TOASTed column an
//! update left unchanged, and without REPLICA IDENTITY FULL the old row
//! does not carry it either. Such columns are read by key before the
//! transaction is handed on (see docs/postgres.md for why the current value
//! is good enough).

use std::collections::{BTreeMap, HashMap};

use super::decode::{decode, ident, literal};
use super::decoder::OpenTx;
use super::session::Session;
use super::table::{Table, Tables};
use crate::change::Value;
use crate::source::SourceError;

/// Keys per look-up statement.
const KEYS_PER_LOOKUP: usize = 200;

/// A table's current rows, by the text forms of their key: every column.
type FoundRows = HashMap<Vec<String>, Vec<Option<String>>>;

/// Fills every column the transaction's changes left out with its current
/// value, read by key.
pub(super) fn fill_unchanged(
    session: &mut Session,
    tables: &Tables,
    open: &mut OpenTx,
) -> Result<(), SourceError> {
    for (t, changes) in changes_to_fill(open) {
        let table = &tables[t];
        let mut found = FoundRows::new();
        for sql in lookup_statements(table, open, &changes)? {
            let rows = session.rows("reading unchanged TOAST values", &sql)?;
            found.extend(by_key(rows, table.info.key.len()));
        }
        fill_from(table, open, &changes, &found)?;
    }
    Ok(())
}

/// The changes with left-out columns, by table.
fn changes_to_fill(open: &OpenTx) -> BTreeMap<usize, Vec<usize>> {
    let mut wanted: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, p) in open.changes.iter().enumerate() {
        if !p.unchanged.is_empty() {
            wanted.entry(p.table).or_default().push(i);
        }
    }
    wanted
}

/// `SELECT key..., every column... WHERE (key) IN (...)` over the keys of
/// `changes`, in groups of [`KEYS_PER_LOOKUP`].
fn lookup_statements(
    table: &Table,
    open: &OpenTx,
    changes: &[usize],
) -> Result<Vec<String>, SourceError> {
    if table.info.key.is_empty() {
        return Err(SourceError::Invalid(format!(
            "table {}: an update left a TOASTed column out and the table has no key to \
             read it by; set REPLICA IDENTITY FULL on it",
            table.schema.name
        )));
    }
    let key_exprs = table.key_exprs().join(", ");
    let key_types = table.key_types();
    let all_columns = table
        .info
        .columns
        .iter()
        .map(|c| format!("w.{}", ident(&c.name)))
        .collect::<Vec<_>>()
        .join(", ");
    let statements = changes
        .chunks(KEYS_PER_LOOKUP)
        .map(|group| {
            let keys: Vec<String> = group
                .iter()
                .map(|&i| {
                    let literals: Vec<String> = open.changes[i]
                        .key_text
                        .iter()
                        .zip(&key_types)
                        .map(|(k, ty)| format!("{}::{ty}", literal(k)))
                        .collect();
                    format!("({})", literals.join(", "))
                })
                .collect();
            format!(
                "SELECT {key_exprs}, {all_columns} FROM {} AS w WHERE ({key_exprs}) IN ({})",
                table.info.sql_name(),
                keys.join(", ")
            )
        })
        .collect();
    Ok(statements)
}

/// Splits look-up rows into their key and their columns.
fn by_key(rows: Vec<Vec<Option<String>>>, key_len: usize) -> FoundRows {
    rows.into_iter()
        .map(|mut row| {
            let columns = row.split_off(key_len);
            let key = row.into_iter().map(Option::unwrap_or_default).collect();
            (key, columns)
        })
        .collect()
}

fn fill_from(
    table: &Table,
    open: &mut OpenTx,
    changes: &[usize],
    found: &FoundRows,
) -> Result<(), SourceError> {
    for &i in changes {
        let p = &mut open.changes[i];
        // A row gone by now is deleted later in the stream; until then it
        // keeps whatever the sink had.
        let Some(row) = found.get(&p.key_text) else {
            tracing::debug!(table = %table.schema.name, "row gone before its TOAST look-up");
            continue;
        };
        for &c in &p.unchanged {
            let col = &table.info.columns[c];
            p.values[c] = match row.get(c).cloned().flatten() {
                None => Value::Null,
                Some(text) => decode(&col.kind, &text).map_err(SourceError::Invalid)?,
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Op;
    use crate::source::postgres::decode::PgKind;
    use crate::source::postgres::decoder::Pending;
    use crate::source::postgres::decoder::tests::{column, table_of};

    fn update(key: &str, unchanged: Vec<usize>) -> Pending {
        Pending {
            table: 0,
            op: Op::Update,
            values: vec![Value::Int64(key.parse().unwrap()), Value::Null],
            unchanged,
            key_text: vec![key.to_string()],
        }
    }

    #[test]
    fn looks_up_left_out_columns_by_key_and_fills_them() {
        let table = table_of(
            "public.docs",
            vec![
                column("id", PgKind::Int64, "bigint"),
                column("body", PgKind::Text, "text"),
            ],
            vec![0],
        );
        let mut open = OpenTx {
            commit_lsn: 1,
            commit_ts: 0,
            changes: vec![
                update("1", vec![1]),
                update("2", vec![]),
                update("3", vec![1]),
            ],
        };
        let wanted = changes_to_fill(&open);
        assert_eq!(wanted, BTreeMap::from([(0, vec![0, 2])]));
        let sql = lookup_statements(&table, &open, &wanted[&0]).unwrap();
        assert_eq!(
            sql,
            vec![
                "SELECT w.\"id\", w.\"id\", w.\"body\" FROM \"public\".\"docs\" AS w \
                 WHERE (w.\"id\") IN (('1'::bigint), ('3'::bigint))"
                    .to_string()
            ]
        );
        // Row 3 is gone by now: it keeps its null until its delete arrives.
        let found = by_key(
            vec![vec![
                Some("1".into()),
                Some("1".into()),
                Some("long".into()),
            ]],
            1,
        );
        fill_from(&table, &mut open, &wanted[&0], &found).unwrap();
        assert_eq!(open.changes[0].values[1], Value::Utf8("long".into()));
        assert_eq!(open.changes[2].values[1], Value::Null);
    }

    #[test]
    fn a_table_without_a_key_cannot_be_looked_up() {
        let table = table_of(
            "public.log",
            vec![column("body", PgKind::Text, "text")],
            vec![],
        );
        let open = OpenTx {
            commit_lsn: 1,
            commit_ts: 0,
            changes: Vec::new(),
        };
        let err = lookup_statements(&table, &open, &[]).unwrap_err();
        assert!(err.to_string().contains("REPLICA IDENTITY FULL"), "{err}");
    }
}
