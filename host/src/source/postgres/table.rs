//! The replicated tables: what the catalog says of each, the schema the
//! pipeline sees, and the checks that decide whether weir can carry it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::catalog::{PgColumn, PgTableInfo};
use super::decode::PgKind;
use super::pgoutput::RelationColumn;
use crate::change::{Column, TableSchema};
use crate::source::SourceError;

/// One replicated table.
pub(super) struct Table {
    pub info: PgTableInfo,
    pub schema: Arc<TableSchema>,
    /// Written in append mode: may have no key (the backfill then goes by
    /// `ctid`), and a delete carries the whole old row.
    pub append: bool,
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
        if let Some(declared) = declared_key {
            info.key = declared
                .iter()
                .map(|k| {
                    info.columns
                        .iter()
                        .position(|c| &c.name == k)
                        .ok_or_else(|| {
                            SourceError::Config(format!(
                                "source.postgres.keys.{name}: the table has no column `{k}`"
                            ))
                        })
                })
                .collect::<Result<_, _>>()?;
        }
        if info.key.is_empty() && !append {
            return Err(SourceError::Config(format!(
                "table {name} has no primary key (nor a replica identity index): declare its key \
                 columns under source.postgres.keys.{name}, or opt into append mode with \
                 `tables: {{ {name}: {{ mode: append }} }}`"
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
            info,
            schema,
            append,
        })
    }

    /// Appends columns the stream announced (ADD COLUMN, see [`added_column`]);
    /// the pipeline sees them as new nullable columns.
    pub fn add_columns(&mut self, added: Vec<PgColumn>) {
        for column in added {
            tracing::warn!(
                table = %self.schema.name,
                column = %column.name,
                "column added; the sinks get it as a new nullable column"
            );
            self.info.columns.push(column);
        }
        let mut schema = (*self.schema).clone();
        for c in &self.info.columns[schema.columns.len()..] {
            schema.columns.push(column_of(c));
        }
        self.schema = Arc::new(schema);
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

fn column_of(c: &PgColumn) -> Column {
    Column {
        name: c.name.clone(),
        data_type: c.kind.data_type(),
        nullable: !c.not_null,
    }
}

/// The replicated tables in name order (the backfill's order), by index
/// and by `schema.table`.
#[derive(Default)]
pub(super) struct Tables {
    list: Vec<Table>,
    by_name: HashMap<String, usize>,
}

impl Tables {
    /// Adds a table after the others; callers add them in name order.
    pub fn push(&mut self, table: Table) {
        self.by_name
            .insert(table.schema.name.clone(), self.list.len());
        self.list.push(table);
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Table> {
        self.list.iter()
    }

    /// Every table's columns, by name (what [`super::setup::SchemaFile`] keeps).
    pub fn shapes(&self) -> BTreeMap<String, Vec<(String, u32, i32)>> {
        self.iter()
            .map(|t| (t.schema.name.clone(), t.shape()))
            .collect()
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

/// A change of a replicated table's shape that weir does not carry.
pub(super) fn ddl_error(table: &str, what: &str) -> SourceError {
    SourceError::Invalid(format!(
        "table {table}: {what}. weir carries only ADD COLUMN to the sinks; any other DDL on a \
         replicated table stops the pipeline rather than write wrong data. Bring the destination \
         in line by hand (or backfill into a new pipeline) and run again"
    ))
}
