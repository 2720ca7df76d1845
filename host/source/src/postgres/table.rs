//! The replicated tables: what the catalog says of each, the schema the
//! pipeline sees, and the checks that decide whether weir can carry it.

use std::collections::HashMap;
use std::sync::Arc;

use super::catalog::{PgColumn, PgTableInfo, format_lsn};
use super::decode::PgKind;
use super::pgoutput::RelationColumn;
use crate::SourceError;
use crate::change::{Column, TableSchema};

/// One replicated table.
pub(super) struct Table {
    pub info: PgTableInfo,
    pub schema: Arc<TableSchema>,
    /// Written in append mode: may have no key (the backfill then goes by
    /// `ctid`), and a delete carries the whole old row.
    pub append: bool,
    /// Set when the table has left the publication (or was dropped) since
    /// the last run, while changes made before may still wait in the WAL:
    /// the WAL insert position when weir found it gone. Every change it
    /// still gets committed before that, so it is streamed (never
    /// backfilled) until the slot has passed it, and then forgotten.
    pub departed: Option<u64>,
    /// For each column, a WAL position from which on every change of the
    /// table was written with that column: a commit after it that decodes
    /// without the column is not WAL from before an ADD COLUMN (see
    /// `Decoder::mark_lacking`). `u64::MAX` until weir knows one.
    pub present_since: Vec<u64>,
}

impl Table {
    /// Checks the catalog's description against what weir can carry, with
    /// `declared_key` (from `source.postgres.keys`) overriding the table's own.
    pub fn new(
        mut info: PgTableInfo,
        declared_key: Option<&[String]>,
        append: bool,
    ) -> Result<Table, SourceError> {
        let name = info.qualified();
        if declared_key.is_none() && !info.unsent_key_columns.is_empty() {
            return Err(SourceError::Config(format!(
                "table {name}: key column(s) {} are not sent by the publication (generated, or \
                 left out of its column list), so updates and deletes could not be matched to \
                 rows: publish them, or declare other key columns under \
                 source.postgres.keys.{name}",
                quoted(
                    &info
                        .unsent_key_columns
                        .iter()
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                )
            )));
        }
        if let Some(declared) = declared_key {
            info.key = declared
                .iter()
                .map(|k| {
                    info.columns
                        .iter()
                        .position(|c| &c.name == k)
                        .ok_or_else(|| {
                            SourceError::Config(format!(
                                "source.postgres.keys.{name}: the table has no column `{k}` \
                                 that the publication sends"
                            ))
                        })
                })
                .collect::<Result<_, _>>()?;
            check_declared_key(&info, append)?;
        }
        if info.key.is_empty() && !append {
            return Err(SourceError::Config(format!(
                "table {name} has no primary key (nor a replica identity index): declare its key \
                 columns under source.postgres.keys.{name}, or opt into append mode with \
                 `tables: {{ {name}: {{ mode: append }} }}`"
            )));
        }
        if info.key.is_empty() && !info.partitions.is_empty() {
            // A ctid names a row within one partition only: paging the
            // backfill by it across partitions would skip rows.
            return Err(SourceError::Config(format!(
                "table {name} is partitioned and has no key, so its backfill cannot page by \
                 ctid: declare its key columns under source.postgres.keys.{name}"
            )));
        }
        if let Some(&k) = info.key.iter().find(|&&k| !info.columns[k].kind.keyable()) {
            return Err(SourceError::Config(format!(
                "table {name}: key column `{}` has a type weir cannot order a backfill by",
                info.columns[k].name
            )));
        }
        let schema = Arc::new(TableSchema {
            name,
            columns: info.columns.iter().map(column_of).collect(),
            key: if append { Vec::new() } else { info.key.clone() },
        });
        Ok(Table {
            present_since: vec![u64::MAX; info.columns.len()],
            info,
            schema,
            append,
            departed: None,
        })
    }

    /// A table the sinks know as `destination` while Postgres names it
    /// otherwise: it was renamed since weir first replicated it, and its
    /// changes go on into the same destination table.
    pub fn with_destination(mut self, destination: &str) -> Table {
        let mut schema = (*self.schema).clone();
        schema.name = destination.to_string();
        self.schema = Arc::new(schema);
        self
    }

    /// A table no longer published that the stream may still carry changes
    /// of (see [`Table::departed`]): described as the last run kept it, not
    /// checked again against the catalog, which may no longer have it.
    pub fn departed(info: PgTableInfo, destination: &str, append: bool, departed: u64) -> Table {
        let schema = Arc::new(TableSchema {
            name: destination.to_string(),
            columns: info.columns.iter().map(column_of).collect(),
            key: if append { Vec::new() } else { info.key.clone() },
        });
        Table {
            present_since: vec![u64::MAX; info.columns.len()],
            info,
            schema,
            append,
            departed: Some(departed),
        }
    }

    /// The name Postgres gives relation `oid` (the table or one of its leaf
    /// partitions), as weir last read it from the catalog.
    pub fn postgres_name_of(&self, oid: u32) -> Option<String> {
        if oid == self.info.oid {
            return Some(self.info.qualified());
        }
        self.info
            .partitions
            .iter()
            .find(|p| p.oid == oid)
            .map(|p| p.qualified.clone())
    }

    /// Records that every column the table has now existed at WAL position
    /// `lsn` (the catalog was read at or before it).
    pub fn columns_present_at(&mut self, lsn: u64) {
        for since in &mut self.present_since {
            *since = (*since).min(lsn);
        }
    }

    /// Appends columns the stream announced (ADD COLUMN, see [`added_column`]),
    /// present in every change committed after `present_since`; the
    /// pipeline sees them as new nullable columns.
    pub fn add_columns(&mut self, added: Vec<PgColumn>, present_since: u64) {
        for column in added {
            tracing::warn!(
                table = %self.schema.name,
                column = %column.name,
                "column added; the sinks get it as a new nullable column"
            );
            self.info.columns.push(column);
            self.present_since.push(present_since);
        }
        let mut schema = (*self.schema).clone();
        for c in &self.info.columns[schema.columns.len()..] {
            schema.columns.push(column_of(c));
        }
        self.schema = Arc::new(schema);
    }

    /// Decodes column `column`'s text form; a value it cannot carry is an
    /// error naming the table, the column and the row by `key` (the key
    /// columns' text forms in key order, or the row's `ctid` in an append
    /// table without a key; None where the caller does not have them).
    pub fn decode_column(
        &self,
        column: usize,
        text: &str,
        key: &[Option<&str>],
    ) -> Result<crate::change::Value, SourceError> {
        let c = &self.info.columns[column];
        super::decode::decode(&c.kind, text).map_err(|why| self.value_refused(column, &why, key))
    }

    /// A value of `column` that cannot be carried, `why`, in the row with
    /// key texts `key`.
    pub fn value_refused(&self, column: usize, why: &str, key: &[Option<&str>]) -> SourceError {
        SourceError::Invalid(format!(
            "table {}, column {}, row {}: {why}. The pipeline stops rather than write another \
             value: change the row in Postgres, or leave the column out of the publication, \
             and run again",
            self.schema.name,
            self.info.columns[column].name,
            self.row_name(key)
        ))
    }

    /// `with key (id, name) = ('5', 'x')`: the row, as a reader finds it.
    fn row_name(&self, key: &[Option<&str>]) -> String {
        let names: Vec<&str> = if self.info.key.is_empty() {
            if key.is_empty() {
                return "of a table without a key".to_string();
            }
            vec!["ctid"]
        } else {
            self.info
                .key
                .iter()
                .map(|&k| self.info.columns[k].name.as_str())
                .collect()
        };
        if key.len() != names.len() || key.iter().any(Option::is_none) {
            return format!("with key ({}) unknown", names.join(", "));
        }
        let values: Vec<String> = key
            .iter()
            .map(|k| super::decode::literal(k.unwrap_or_default()))
            .collect();
        format!("with key ({}) = ({})", names.join(", "), values.join(", "))
    }

    /// The columns as `(name, type oid, typmod)`: what must stay the same
    /// between runs (see [`super::setup::SchemaFile`]).
    pub fn shape(&self) -> Vec<(String, u32, i32)> {
        self.info
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.type_oid, c.typmod))
            .collect()
    }
}

/// A declared key must identify one row (NOT NULL, and a unique index on
/// exactly its columns: the backfill pages by it and the sinks upsert by
/// it) and, unless the table is append-only, be in the replica identity
/// (so that updates and deletes carry it). Every gap is named at once.
fn check_declared_key(info: &PgTableInfo, append: bool) -> Result<(), SourceError> {
    let name = info.qualified();
    let key_names: Vec<&str> = info
        .key
        .iter()
        .map(|&k| info.columns[k].name.as_str())
        .collect();
    let mut gaps = Vec::new();
    if !append && info.replica_identity != b'f' {
        let missing: Vec<&str> = info
            .key
            .iter()
            .filter(|k| !info.identity_columns.contains(k))
            .map(|&k| info.columns[k].name.as_str())
            .collect();
        if !missing.is_empty() {
            gaps.push(identity_error(&name, &missing, info.replica_identity));
        }
    }
    let nullable: Vec<&str> = info
        .key
        .iter()
        .filter(|&&k| !info.columns[k].not_null)
        .map(|&k| info.columns[k].name.as_str())
        .collect();
    if !nullable.is_empty() {
        gaps.push(format!(
            "key column(s) {} may be null: declare them NOT NULL",
            quoted(&nullable)
        ));
    }
    let mut wanted = info.key.clone();
    wanted.sort_unstable();
    let unique = info.unique_indexes.iter().any(|index| {
        let mut columns = index.clone();
        columns.sort_unstable();
        columns == wanted
    });
    if !unique {
        gaps.push(format!(
            "no unique index on exactly ({}), so two rows may share a key: \
             CREATE UNIQUE INDEX ON {name} ({})",
            key_names.join(", "),
            key_names.join(", ")
        ));
    }
    if gaps.is_empty() {
        return Ok(());
    }
    Err(SourceError::Config(format!(
        "source.postgres.keys.{name} = [{}] cannot serve as the key: {}",
        key_names.join(", "),
        gaps.join("; ")
    )))
}

fn column_of(c: &PgColumn) -> Column {
    Column {
        name: c.name.clone(),
        data_type: c.kind.data_type(),
        nullable: !c.not_null,
    }
}

/// The replicated tables in name order (the backfill's order), by index,
/// by `schema.table` and by the OIDs of their relations.
#[derive(Default)]
pub(super) struct Tables {
    list: Vec<Table>,
    by_name: HashMap<String, usize>,
    by_oid: HashMap<u32, usize>,
}

impl Tables {
    /// Adds a table after the others; callers add them in name order.
    pub fn push(&mut self, table: Table) {
        let index = self.list.len();
        self.by_name.insert(table.schema.name.clone(), index);
        self.by_oid.insert(table.info.oid, index);
        for partition in &table.info.partitions {
            self.by_oid.insert(partition.oid, index);
        }
        self.list.push(table);
    }

    /// The table whose relation (the table itself, or a leaf partition of
    /// it) has OID `oid`: what a Relation message is mapped by, since the
    /// OID stays when a table is renamed, and changes when it is dropped
    /// and created again under the same name.
    pub fn index_of_oid(&self, oid: u32) -> Option<usize> {
        self.by_oid.get(&oid).copied()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The table named `name`, or the partitioned table whose leaf partition
    /// it is: changes of a partitioned table published without
    /// `publish_via_partition_root` arrive under the leaf's name.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied().or_else(|| {
            self.list
                .iter()
                .position(|t| t.info.partitions.iter().any(|p| p.qualified == name))
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Table> {
        self.list.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Table> {
        self.list.iter_mut()
    }
}
impl std::ops::Index<usize> for Tables {
    type Output = Table;
    fn index(&self, index: usize) -> &Table {
        &self.list[index]
    }
}

impl std::ops::IndexMut<usize> for Tables {
    fn index_mut(&mut self, index: usize) -> &mut Table {
        &mut self.list[index]
    }
}

/// A column the stream describes that the table did not have yet, with
/// the kind and SQL type the catalog gives for its type.
pub(super) fn added_column(rc: &RelationColumn, kind: PgKind, sql_type: String) -> PgColumn {
    PgColumn {
        name: rc.name.clone(),
        type_oid: rc.type_oid,
        typmod: rc.typmod,
        kind,
        sql_type,
        not_null: false,
    }
}

/// Why a key the replica identity (`relreplident`: `d`, `n`, `i`, `f`) does
/// not cover cannot be streamed, and what to do about it.
pub(super) fn identity_error(table: &str, missing: &[&str], identity: u8) -> String {
    let identity = match identity {
        b'd' => "DEFAULT, the primary key",
        b'n' => "REPLICA IDENTITY NOTHING",
        b'i' => "USING INDEX",
        b'f' => "FULL",
        _ => "of an unknown kind",
    };
    format!(
        "table {table}: key column(s) {} not in its replica identity ({identity}): Postgres \
         would send an update of the key without the old key, leaving the old row in the \
         sinks, and a delete without the key. Make the replica identity cover the key \
         (ALTER TABLE {table} REPLICA IDENTITY FULL, or REPLICA IDENTITY USING INDEX on a \
         unique index of exactly the key) and run again",
        quoted(missing)
    )
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A change of a replicated table's shape that weir does not carry: found
/// in the stream, in the transaction committed at `at`, or at the start.
pub(super) fn ddl_error(table: &str, what: &str, at: Option<u64>) -> SourceError {
    let Some(lsn) = at.map(format_lsn) else {
        return SourceError::Invalid(format!(
            "table {table}: {what}. weir carries only ADD COLUMN to the \
             sinks; any other DDL on a replicated table stops the pipeline rather than write \
             wrong data. Bring the destination in line by hand (or backfill into a new \
             pipeline) and run again"
        ));
    };
    // Leaving this one transaction out (skip_transaction_at) would not help:
    // every later change of the table comes in the new shape.
    SourceError::Invalid(format!(
        "table {table}: {what}, as the stream shows in the transaction committed at LSN {lsn}. \
         weir carries only ADD COLUMN to the sinks; any other DDL on a replicated table stops \
         the pipeline rather than write wrong data, and the change stays in the WAL, so every \
         run stops here again. Bring the destination in line by hand and start a new pipeline \
         (a new slot and state directory: it backfills)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::decode::PgKind;

    /// `public.orders (id bigint PRIMARY KEY, order_no bigint, note text)`
    /// with the default replica identity, no other index, and `order_no`
    /// declared as the key.
    fn orders() -> PgTableInfo {
        let column = |name: &str, not_null: bool| PgColumn {
            name: name.into(),
            type_oid: 20,
            typmod: -1,
            kind: PgKind::Int64,
            sql_type: "bigint".into(),
            not_null,
        };
        PgTableInfo {
            oid: 1,
            schema: "public".into(),
            name: "orders".into(),
            columns: vec![
                column("id", true),
                column("order_no", false),
                column("note", false),
            ],
            key: vec![0],
            estimated_rows: -1.0,
            replica_identity: b'd',
            identity_columns: vec![0],
            unique_indexes: vec![vec![0]],
            row_filter: None,
            partitions: Vec::new(),
            unsent_columns: Vec::new(),
            unsent_key_columns: Vec::new(),
        }
    }

    /// The key the table ends up with, or why the declared one is refused.
    fn declare(info: PgTableInfo, append: bool) -> Result<Vec<usize>, String> {
        Table::new(info, Some(&["order_no".to_string()]), append)
            .map(|t| t.info.key)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_declared_key_names_every_gap_at_once() {
        let said = declare(orders(), false).unwrap_err();
        for part in [
            "source.postgres.keys.public.orders",
            "`order_no` not in its replica identity (DEFAULT, the primary key)",
            "NOT NULL",
            "no unique index on exactly (order_no)",
        ] {
            assert!(said.contains(part), "missing {part:?} in: {said}");
        }
    }

    #[test]
    fn a_declared_key_in_the_identity_not_null_and_unique_is_taken() {
        let mut info = orders();
        info.columns[1].not_null = true;
        info.unique_indexes.push(vec![1]);
        // The identity: FULL, or the index on the key.
        info.replica_identity = b'f';
        assert_eq!(declare(info.clone(), false), Ok(vec![1]));
        info.replica_identity = b'i';
        info.identity_columns = vec![1];
        assert!(declare(info.clone(), false).is_ok());
        // Append-only tables carry whole rows: the identity does not matter.
        info.identity_columns = vec![0];
        assert!(declare(info.clone(), true).is_ok());
        let refused = declare(info.clone(), false).unwrap_err();
        assert!(refused.contains("(USING INDEX)"), "{refused}");
        // A unique index on more columns than the key does not make it unique.
        info.unique_indexes = vec![vec![0], vec![1, 2]];
        let refused = declare(info, true).unwrap_err();
        assert!(refused.contains("no unique index"), "{refused}");
    }
}
