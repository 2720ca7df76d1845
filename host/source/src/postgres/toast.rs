//! Unchanged TOAST values: pgoutput does not send a TOASTed column an
//! update left unchanged, and without REPLICA IDENTITY FULL the old row
//! does not carry it either. Such columns are read by key before the
//! transaction is handed on (see docs/postgres.md for why the current value
//! is good enough).
//!
//! The keys are sent as typed literals and joined in the server, and the
//! rows come back tagged with the change they answer: nothing compares how
//! two sessions print a key (a timestamptz in another time zone, a float
//! with other digits would never match).
//!
//! A row can be gone by the time it is read (deleted, or its key changed,
//! in a later transaction while weir lagged). An update of an upsert table
//! is then left out: the row's delete or key change follows in the stream
//! and takes the row out, and until then readers see the row as it was
//! before that update, never a null Postgres did not hold. An append table
//! (a change log) keeps the update, the columns left out null, and says so
//! in a warning.

use std::collections::{BTreeMap, HashMap};

use super::catalog::format_lsn;
use super::decode::{ident, literal};
use super::decoder::OpenTx;
use super::session::Session;
use super::table::{Table, Tables};
use crate::SourceError;
use crate::change::Value;

/// Keys per look-up statement.
const KEYS_PER_LOOKUP: usize = 200;

/// Current rows by the index of the change (in [`OpenTx::changes`]) whose
/// key found them: every column, as text.
type FoundRows = HashMap<usize, Vec<Option<String>>>;

/// Fills every column the transaction's changes left out with its current
/// value, read by key; drops or keeps (append tables) the updates of rows
/// gone by now.
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
            found.extend(by_change(rows, table)?);
        }
        tracing::debug!(
            table = %table.schema.name, changes = changes.len(),
            "read unchanged TOAST values by key"
        );
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

/// `WITH wanted(change, k0, ...) AS (VALUES (i, key literal::type, ...), ...)
/// SELECT wanted.change, every column... FROM wanted JOIN table ON key = k`
/// over the keys of `changes`, in groups of [`KEYS_PER_LOOKUP`]: the server
/// compares keys as values of their own type.
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
    let key_types = table.key_types();
    let wanted_columns: Vec<String> = (0..key_types.len()).map(|k| format!("k{k}")).collect();
    let join = format!(
        "({}) = ({})",
        table.key_exprs().join(", "),
        wanted_columns
            .iter()
            .map(|k| format!("wanted.{k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
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
            let rows: Vec<String> = group
                .iter()
                .map(|&i| {
                    let mut row = vec![i.to_string()];
                    row.extend(
                        open.changes[i]
                            .key_text
                            .iter()
                            .zip(&key_types)
                            .map(|(k, ty)| format!("{}::{ty}", literal(k))),
                    );
                    format!("({})", row.join(", "))
                })
                .collect();
            format!(
                "WITH wanted(change, {}) AS (VALUES {}) SELECT wanted.change, {all_columns} \
                 FROM wanted JOIN {} AS w ON {join}",
                wanted_columns.join(", "),
                rows.join(", "),
                table.info.sql_name(),
            )
        })
        .collect();
    Ok(statements)
}

/// Splits look-up rows into the change they answer and their columns.
fn by_change(rows: Vec<Vec<Option<String>>>, table: &Table) -> Result<FoundRows, SourceError> {
    rows.into_iter()
        .map(|mut row| {
            let columns = row.split_off(1);
            let change = row
                .pop()
                .flatten()
                .and_then(|c| c.parse::<usize>().ok())
                .ok_or_else(|| {
                    SourceError::Invalid(format!(
                        "table {}: a TOAST look-up row came back without the number of its change",
                        table.schema.name
                    ))
                })?;
            Ok((change, columns))
        })
        .collect()
}

fn fill_from(
    table: &Table,
    open: &mut OpenTx,
    changes: &[usize],
    found: &FoundRows,
) -> Result<(), SourceError> {
    let mut gone = 0usize;
    for &i in changes {
        let p = &mut open.changes[i];
        let Some(row) = found.get(&i) else {
            gone += 1;
            if !table.append {
                // Its delete or key change follows in the stream.
                p.dropped = true;
            }
            continue;
        };
        let key: Vec<Option<&str>> = p.key_text.iter().map(|k| Some(k.as_str())).collect();
        for &c in &p.unchanged {
            p.values[c] = match row.get(c).cloned().flatten() {
                None => Value::Null,
                Some(text) => table.decode_column(c, &text, &key)?,
            };
        }
    }
    if gone == 0 {
        return Ok(());
    }
    let lsn = format_lsn(open.commit_lsn);
    if table.append {
        tracing::warn!(
            table = %table.schema.name,
            commit_lsn = %lsn,
            changes = gone,
            "row gone before its TOAST look-up: the change is kept with its unchanged \
             TOASTed columns left out as null (REPLICA IDENTITY FULL carries them)"
        );
    } else {
        tracing::debug!(
            table = %table.schema.name,
            commit_lsn = %lsn,
            changes = gone,
            "row gone before its TOAST look-up: its update is left out, the row's later \
             delete or key change follows"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Op;
    use crate::commit_order::stream_position;
    use crate::postgres::Emitted;
    use crate::postgres::decode::PgKind;
    use crate::postgres::decoder::Pending;
    use crate::postgres::decoder::tests::{column, table_of};

    fn update(key: &str, unchanged: Vec<usize>) -> Pending {
        Pending {
            table: 0,
            op: Op::Update,
            values: vec![Value::Int64(key.parse().unwrap()), Value::Null],
            unchanged,
            key_text: vec![key.to_string()],
            dropped: false,
        }
    }

    fn docs() -> Table {
        table_of(
            "public.docs",
            vec![
                column("id", PgKind::Int64, "bigint"),
                column("body", PgKind::Text, "text"),
            ],
            vec![0],
        )
    }

    fn three_updates() -> OpenTx {
        OpenTx {
            commit_lsn: 1,
            commit_ts: 0,
            missing_columns: Default::default(),
            changes: vec![
                update("1", vec![1]),
                update("2", vec![]),
                update("3", vec![1]),
            ],
        }
    }

    /// The server's answer: change 0 found its row, change 2 did not.
    fn found_only_change_0(table: &Table) -> FoundRows {
        by_change(
            vec![vec![
                Some("0".into()),
                Some("1".into()),
                Some("long".into()),
            ]],
            table,
        )
        .unwrap()
    }

    #[test]
    fn looks_up_left_out_columns_by_typed_key_and_fills_them() {
        let table = docs();
        let mut open = three_updates();
        let wanted = changes_to_fill(&open);
        assert_eq!(wanted, BTreeMap::from([(0, vec![0, 2])]));
        let sql = lookup_statements(&table, &open, &wanted[&0]).unwrap();
        assert_eq!(
            sql,
            vec![
                "WITH wanted(change, k0) AS (VALUES (0, '1'::bigint), (2, '3'::bigint)) \
                 SELECT wanted.change, w.\"id\", w.\"body\" FROM wanted JOIN \"public\".\"docs\" \
                 AS w ON (w.\"id\") = (wanted.k0)"
                    .to_string()
            ]
        );
        fill_from(&table, &mut open, &wanted[&0], &found_only_change_0(&table)).unwrap();
        assert_eq!(open.changes[0].values[1], Value::Utf8("long".into()));
        assert!(!open.changes[0].dropped && !open.changes[1].dropped);
    }

    #[test]
    fn an_upsert_update_of_a_row_gone_is_dropped_and_keeps_the_others_positions() {
        let table = docs();
        let mut open = three_updates();
        open.changes.push(update("4", vec![]));
        let wanted = changes_to_fill(&open);
        fill_from(&table, &mut open, &wanted[&0], &found_only_change_0(&table)).unwrap();
        assert!(
            open.changes[2].dropped,
            "row 3 is gone: its update is left out"
        );
        let mut tables = Tables::default();
        tables.push(table);
        let tx = open.seal(&tables, &mut Emitted::default()).unwrap();
        let kept: Vec<_> = tx
            .changes
            .iter()
            .map(|c| (c.values[0].clone(), c.pos.clone()))
            .collect();
        assert_eq!(
            kept,
            vec![
                (Value::Int64(1), stream_position(1, 0)),
                (Value::Int64(2), stream_position(1, 1)),
                (Value::Int64(4), stream_position(1, 3)),
            ]
        );
    }

    #[test]
    fn an_append_update_of_a_row_gone_is_kept_with_the_column_null() {
        let mut table = docs();
        table.append = true;
        let mut open = three_updates();
        let wanted = changes_to_fill(&open);
        fill_from(&table, &mut open, &wanted[&0], &found_only_change_0(&table)).unwrap();
        assert!(!open.changes[2].dropped);
        assert_eq!(open.changes[2].values[1], Value::Null);
    }

    #[test]
    fn a_composite_key_is_joined_column_by_column() {
        let table = table_of(
            "public.items",
            vec![
                column("at", PgKind::TimestampTz, "timestamp with time zone"),
                column("line", PgKind::Int32, "integer"),
                column("body", PgKind::Text, "text"),
            ],
            vec![0, 1],
        );
        let mut change = update("1", vec![2]);
        change.key_text = vec!["2024-03-01 05:30:00+05:30".into(), "7".into()];
        let open = OpenTx {
            commit_lsn: 1,
            commit_ts: 0,
            missing_columns: Default::default(),
            changes: vec![change],
        };
        let sql = lookup_statements(&table, &open, &[0]).unwrap();
        assert!(
            sql[0].contains(
                "wanted(change, k0, k1) AS (VALUES (0, '2024-03-01 05:30:00+05:30'::timestamp \
                 with time zone, '7'::integer))"
            ) && sql[0].ends_with("ON (w.\"at\", w.\"line\") = (wanted.k0, wanted.k1)"),
            "{}",
            sql[0]
        );
    }

    #[test]
    fn a_look_up_row_without_its_change_number_is_an_error() {
        let err = by_change(vec![vec![None, Some("1".into())]], &docs()).unwrap_err();
        assert!(err.to_string().contains("public.docs"), "{err}");
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
            missing_columns: Default::default(),
        };
        let err = lookup_statements(&table, &open, &[]).unwrap_err();
        assert!(err.to_string().contains("REPLICA IDENTITY FULL"), "{err}");
    }
}
