//! Setting the source up: the server's settings and the user's privileges,
//! each refused with one sentence that says what to change, and the tables
//! to read with their columns and keys.

use std::collections::BTreeSet;
use std::sync::Arc;

use mysql_async::Row;

use super::config::MysqlConfig;
use super::flavor::Flavor;
use super::position::BinlogCoord;
use super::session::{Session, error_code};
use super::types::Kind;
use crate::SourceError;
use crate::change::{Column, TableSchema};

/// A table the source reads.
#[derive(Debug)]
pub(super) struct Table {
    pub db: String,
    pub table: String,
    /// `db.table`.
    pub name: String,
    pub kinds: Vec<Kind>,
    pub schema: Arc<TableSchema>,
}

impl Table {
    /// `` `db`.`table` `` for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", ident(&self.db), ident(&self.table))
    }

    /// Its name, and each column's name and kind, for the schema file.
    pub fn shape(&self) -> (&str, Vec<(&str, &Kind)>) {
        (&self.name, self.column_names().zip(&self.kinds).collect())
    }

    pub fn column_names(&self) -> impl Iterator<Item = &str> {
        self.schema.columns.iter().map(|c| c.name.as_str())
    }
}

/// A name quoted for MySQL.
pub(super) fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The server settings the source needs, each with the sentence that says
/// how to set it.
pub(super) fn check_server(session: &mut Session) -> Result<(), SourceError> {
    let rows: Vec<(String, String)> = session.rows(
        "reading the server's settings",
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN \
         ('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata', 'version')",
    )?;
    let get = |name: &str| {
        rows.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_ascii_uppercase())
    };
    let version = get("version").unwrap_or_default();
    session.flavor = Flavor::of(&version);
    if get("log_bin").as_deref() != Some("ON") {
        return Err(SourceError::Config(
            "the server does not write a binlog (log_bin is OFF): start it with --log-bin \
             (and binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL)"
                .into(),
        ));
    }
    let format = get("binlog_format").unwrap_or_default();
    if format != "ROW" {
        return Err(SourceError::Config(format!(
            "binlog_format is {format}, and the source reads row events only: set \
             binlog_format=ROW in the server's configuration (SET GLOBAL binlog_format=ROW \
             applies to new sessions)"
        )));
    }
    let image = get("binlog_row_image").unwrap_or_default();
    if image != "FULL" {
        return Err(SourceError::Config(format!(
            "binlog_row_image is {image}, and the source needs whole rows in the binlog: set \
             binlog_row_image=FULL"
        )));
    }
    match get("binlog_row_metadata").as_deref() {
        Some("FULL") => {}
        Some(other) => {
            return Err(SourceError::Config(format!(
                "binlog_row_metadata is {other}, and the source reads column names and \
                 signedness from the binlog: set binlog_row_metadata=FULL"
            )));
        }
        None => {
            return Err(SourceError::Config(format!(
                "the server ({version}) has no binlog_row_metadata setting, so its binlog does \
                 not name columns: the source needs MariaDB 10.5 or newer (or MySQL 8.0.1 or \
                 newer)"
            )));
        }
    }
    Ok(())
}

/// The user's privileges: REPLICATION CLIENT (reading binlog positions),
/// REPLICATION SLAVE (reading the binlog). SELECT is checked per table.
pub(super) fn check_privileges(session: &mut Session) -> Result<(), SourceError> {
    match current_position(session) {
        Err(e) if error_code(&e) == Some(1227) => {
            return Err(SourceError::Config(format!(
                "the user cannot read the binlog position: grant it REPLICATION CLIENT \
                 (MariaDB 10.5+ also calls it BINLOG MONITOR): {e}"
            )));
        }
        other => other?,
    };
    let grants: Vec<String> = session.rows("reading the user's grants", "SHOW GRANTS")?;
    // `GRANT <privilege>, <privilege> ON *.* TO ...`: the privileges on
    // everything, one by one (REPLICATION SLAVE ADMIN is another one).
    let may_replicate = grants.iter().any(|g| {
        let g = g.to_ascii_uppercase();
        let Some(list) = g
            .strip_prefix("GRANT ")
            .and_then(|rest| rest.split_once(" ON *.* "))
        else {
            return false;
        };
        list.0.split(", ").any(|p| {
            matches!(
                p.trim(),
                "ALL PRIVILEGES" | "REPLICATION SLAVE" | "REPLICATION REPLICA"
            )
        })
    });
    if !may_replicate {
        return Err(SourceError::Config(
            "the user may not read the binlog: grant it REPLICATION SLAVE ON *.* \
             (GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO ...)"
                .into(),
        ));
    }
    Ok(())
}

/// Where the server's binlog ends now.
pub(super) fn current_position(session: &mut Session) -> Result<BinlogCoord, SourceError> {
    let sql = session.flavor.binlog_status_sql();
    let rows: Vec<Row> = session.rows("reading the binlog position", sql)?;
    let row = rows.into_iter().next().ok_or_else(|| {
        SourceError::Config(format!(
            "the server does not write a binlog ({sql} is empty)"
        ))
    })?;
    let file: String = row.get(0).unwrap_or_default();
    let offset: u64 = row.get(1).unwrap_or_default();
    BinlogCoord::at(&file, offset).map_err(SourceError::Invalid)
}

/// The binlog files the server still has, oldest first.
pub(super) fn binlog_files(session: &mut Session) -> Result<Vec<String>, SourceError> {
    let rows: Vec<Row> = session.rows("listing the binlog files", "SHOW BINARY LOGS")?;
    Ok(rows
        .into_iter()
        .filter_map(|r| r.get::<String, _>(0))
        .collect())
}

/// The name of the binlog file `coord` lies in, or the stop that names the
/// position and the oldest file left when it was purged.
pub(super) fn file_of(session: &mut Session, coord: BinlogCoord) -> Result<String, SourceError> {
    let files = binlog_files(session)?;
    if let Some(name) = files
        .iter()
        .find(|f| BinlogCoord::file_number(f) == Ok(coord.file))
    {
        return Ok(name.clone());
    }
    let oldest = files.first().cloned().unwrap_or_else(|| "none".into());
    Err(SourceError::Resume {
        position: coord.position(0),
        reason: format!(
            "the binlog file numbered {} (offset {}) is no longer on the server (the oldest it \
             has is {oldest}): the changes after the committed position are gone, and going \
             on would leave a gap. Back the tables up again with a new pipeline id (a fresh \
             backfill), and keep binlogs longer (binlog_expire_logs_seconds)",
            coord.file, coord.offset
        ),
    })
}

/// The tables `config` names, each with its columns and key, in name order.
pub(super) fn load_tables(
    session: &mut Session,
    config: &MysqlConfig,
    append_tables: &BTreeSet<String>,
) -> Result<Vec<Table>, SourceError> {
    let all: Vec<(String, String)> = session.rows(
        "listing the tables",
        "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
         WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN \
         ('mysql', 'information_schema', 'performance_schema', 'sys') \
         ORDER BY TABLE_SCHEMA, TABLE_NAME",
    )?;
    let patterns = config.patterns();
    for (i, pattern) in patterns.iter().enumerate() {
        if !all.iter().any(|(db, t)| pattern.matches(db, t)) {
            return Err(SourceError::Config(format!(
                "source.mysql.tables[{i}]: `{}` matches no table the user can see: check \
                 the name, and that the user has SELECT on it",
                config.tables[i]
            )));
        }
    }
    let mut chosen: Vec<(String, String)> = all
        .into_iter()
        .filter(|(db, t)| patterns.iter().any(|p| p.matches(db, t)))
        .collect();
    chosen.sort_by(|a, b| format!("{}.{}", a.0, a.1).cmp(&format!("{}.{}", b.0, b.1)));
    for name in config.keys.keys() {
        if !chosen.iter().any(|(db, t)| format!("{db}.{t}") == *name) {
            return Err(SourceError::Config(format!(
                "source.mysql.keys: `{name}` is not one of the tables read"
            )));
        }
    }
    chosen
        .into_iter()
        .map(|(db, table)| load_table(session, config, append_tables, db, table))
        .collect()
}

fn load_table(
    session: &mut Session,
    config: &MysqlConfig,
    append_tables: &BTreeSet<String>,
    db: String,
    table: String,
) -> Result<Table, SourceError> {
    let name = format!("{db}.{table}");
    let rows: Vec<ColumnRow> = session.exec(
        &format!("reading the columns of {name}"),
        COLUMNS_SQL,
        vec![db.clone().into(), table.clone().into()],
    )?;
    let mut columns = Vec::new();
    let mut kinds = Vec::new();
    for row in rows {
        let (column, kind) = column_of(&name, row)?;
        columns.push(column);
        kinds.push(kind);
    }
    // SELECT on the table, checked now rather than in the middle of a backfill.
    let probe = format!("SELECT 1 FROM {}.{} LIMIT 0", ident(&db), ident(&table));
    if let Err(e) = session.run(&format!("reading {name}"), &probe) {
        return Err(match error_code(&e) {
            Some(1142) | Some(1143) => SourceError::Config(format!(
                "the user may not read {name}: grant it SELECT on the table (or on {db}.*)"
            )),
            _ => e,
        });
    }
    let key = match config.keys.get(&name) {
        Some(names) => names
            .iter()
            .map(|k| {
                columns.iter().position(|c| c.name == *k).ok_or_else(|| {
                    SourceError::Config(format!(
                        "source.mysql.keys.{name}: `{k}` is not a column of the table"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => table_key(session, &db, &table, &columns)?,
    };
    if key.is_empty() {
        let append = append_tables.contains(&name);
        return Err(SourceError::Config(if append {
            format!(
                "table {name} has no primary key or unique key of not-null columns, and the \
                 MySQL source reads a table's backfill in key order: name key columns in \
                 source.mysql.keys (append mode without a key is not supported yet)"
            )
        } else {
            format!(
                "table {name} has no primary key or unique key of not-null columns, so its \
                 rows cannot be told apart for upserts: add a primary key, or name key columns \
                 in source.mysql.keys"
            )
        }));
    }
    let schema = Arc::new(TableSchema {
        name: name.clone(),
        columns,
        key,
    });
    Ok(Table {
        db,
        table,
        name,
        kinds,
        schema,
    })
}

/// A table's columns in order, as `information_schema` describes them.
pub(super) const COLUMNS_SQL: &str = "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, \
     NUMERIC_SCALE, CHARACTER_SET_NAME, CHARACTER_MAXIMUM_LENGTH, IS_NULLABLE \
     FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
     ORDER BY ORDINAL_POSITION";

/// A row of [`COLUMNS_SQL`].
pub(super) type ColumnRow = (
    String,
    String,
    String,
    Option<u64>,
    Option<u64>,
    Option<String>,
    Option<u64>,
    String,
);

/// The column and its kind from a row of [`COLUMNS_SQL`] of table `name`.
pub(super) fn column_of(name: &str, row: ColumnRow) -> Result<(Column, Kind), SourceError> {
    let (column, data_type, column_type, precision, scale, charset, length, nullable) = row;
    let kind = Kind::of_column(
        &data_type.to_ascii_lowercase(),
        &column_type.to_ascii_lowercase(),
        precision,
        scale,
        charset.as_deref(),
        length,
    )
    .map_err(|e| SourceError::Config(format!("table {name}, column `{column}`: {e}")))?;
    Ok((
        Column {
            name: column,
            data_type: kind.data_type(),
            nullable: nullable == "YES",
        },
        kind,
    ))
}

/// The primary key, else the first unique key whose columns are all NOT
/// NULL and whole (no prefix), as column indexes; empty when there is none.
fn table_key(
    session: &mut Session,
    db: &str,
    table: &str,
    columns: &[Column],
) -> Result<Vec<usize>, SourceError> {
    let rows: Vec<(String, String, Option<u64>)> = session.exec(
        &format!("reading the keys of {db}.{table}"),
        "SELECT INDEX_NAME, COLUMN_NAME, SUB_PART FROM information_schema.STATISTICS \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND NON_UNIQUE = 0 \
         ORDER BY INDEX_NAME <> 'PRIMARY', INDEX_NAME, SEQ_IN_INDEX",
        vec![db.into(), table.into()],
    )?;
    // Each unique index: its name, and its columns with their prefix length.
    type Index = (String, Vec<(String, Option<u64>)>);
    let mut indexes: Vec<Index> = Vec::new();
    for (index, column, part) in rows {
        match indexes.last_mut() {
            Some((name, cols)) if *name == index => cols.push((column, part)),
            _ => indexes.push((index, vec![(column, part)])),
        }
    }
    for (_, cols) in indexes {
        let picked: Option<Vec<usize>> = cols
            .iter()
            .map(|(c, part)| {
                let i = columns.iter().position(|col| col.name == *c)?;
                (part.is_none() && !columns[i].nullable).then_some(i)
            })
            .collect();
        if let Some(key) = picked {
            return Ok(key);
        }
    }
    Ok(Vec::new())
}
