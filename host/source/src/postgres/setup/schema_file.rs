//! What the state directory keeps of the last run: the shapes of the
//! tables it replicated, and where the backfill's stream starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::SourceError;
use crate::postgres::catalog::{self, format_lsn};
use crate::postgres::session::Session;
use crate::postgres::table::{Table, Tables, ddl_error};

/// The shapes of the tables this pipeline last streamed, kept in the
/// state directory so that DDL done while weir was stopped is caught too;
/// beside them, where the backfill's stream starts ([`BackfillStart`]).
pub(in crate::postgres) struct SchemaFile {
    path: PathBuf,
    pub(super) backfill_start: BackfillStart,
}

/// The slot's position when the backfill began: its stream must start
/// there. A backfill resumed in a later run reads the current data, which
/// is exact only when the stream that follows still replays every change
/// since the first chunk was read; once the slot has moved past that
/// start, the changes in between are gone from the server, and the rows a
/// sink read before the kill would keep their old values (and rows deleted
/// since) for good.
pub(super) struct BackfillStart {
    path: PathBuf,
}

impl BackfillStart {
    pub(super) fn read(&self) -> Option<u64> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        catalog::parse_lsn(text.trim())
    }

    /// Best effort, like the shapes: a file that cannot be written only
    /// costs the check of a later resume (a warning then says so).
    pub(super) fn save(&self, lsn: u64) {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = self.path.with_extension("tmp");
        let written =
            std::fs::write(&tmp, format_lsn(lsn)).and_then(|()| std::fs::rename(&tmp, &self.path));
        if written.is_err() {
            tracing::warn!(path = %self.path.display(), "cannot save where the backfill's stream starts");
        }
    }
}

/// What the state directory keeps of the tables the last run replicated,
/// by the name the sinks know each by.
#[derive(Default)]
pub(in crate::postgres) struct Recorded {
    pub(super) tables: BTreeMap<String, RecordedTable>,
}

/// One replicated table, as the last run saw it: enough to map its
/// relation by OID after a rename, to catch DDL done while weir was
/// stopped, and to decode the changes still in the WAL after it left the
/// publication (or was dropped), when the catalog no longer describes it.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct RecordedTable {
    /// `pg_class.oid` (0: written by a weir that did not keep it).
    #[serde(default)]
    pub(super) oid: u32,
    /// `schema.table` in Postgres.
    #[serde(default)]
    postgres_name: String,
    /// `(name, type oid, typmod)`: what must stay the same between runs.
    columns: Vec<(String, u32, i32)>,
    #[serde(default)]
    not_null: Vec<String>,
    #[serde(default)]
    key: Vec<String>,
    #[serde(default)]
    append: bool,
    /// Leaf partitions as `(oid, schema.table)`.
    #[serde(default)]
    partitions: Vec<(u32, String)>,
    /// See [`Table::departed`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) departed: Option<String>,
    /// Per column of `columns`: the WAL position after which every change
    /// of the table was written with it ([`Table::present_since`]). A later
    /// run streams from the slot's confirmed position, before its own
    /// start: without these it would know its columns present only from
    /// that start, and take a change Postgres decoded without one (with a
    /// catalog older than the change) for WAL from before an ADD COLUMN.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) present_since: Vec<u64>,
}

/// A table's entry in the file: an older weir kept only the columns.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum SavedTable {
    Recorded(RecordedTable),
    Columns(Vec<(String, u32, i32)>),
}

impl Recorded {
    /// The destination of the table with OID `oid` when the last run knew
    /// it under another name than `name`: it was renamed since.
    pub(super) fn renamed(&self, oid: u32, name: &str) -> Option<&String> {
        self.tables
            .iter()
            .find(|(destination, r)| r.oid == oid && oid != 0 && *destination != name)
            .map(|(destination, _)| destination)
    }
}

impl RecordedTable {
    fn of(table: &Table) -> RecordedTable {
        let info = &table.info;
        let column_name = |&k: &usize| info.columns[k].name.clone();
        RecordedTable {
            oid: info.oid,
            postgres_name: info.qualified(),
            columns: table.shape(),
            not_null: info
                .columns
                .iter()
                .filter(|c| c.not_null)
                .map(|c| c.name.clone())
                .collect(),
            key: info.key.iter().map(column_name).collect(),
            append: table.append,
            partitions: info
                .partitions
                .iter()
                .map(|p| (p.oid, p.qualified.clone()))
                .collect(),
            departed: table.departed.map(format_lsn),
            present_since: table.present_since.clone(),
        }
    }

    /// The table as it was, for the changes to it still in the WAL; the
    /// kinds of its columns' types come from the catalog (a type outlives
    /// a dropped table unless it was the table's own).
    pub(super) fn rebuild(
        &self,
        session: &mut Session,
        destination: &str,
        departed: u64,
    ) -> Result<Table, SourceError> {
        let mut columns = Vec::with_capacity(self.columns.len());
        for (name, type_oid, typmod) in &self.columns {
            let (oid, typmod) = (*type_oid, *typmod);
            let (kind, sql_type) = session.query("reading a column's type", |c| {
                Box::pin(async move { catalog::type_kind(c, oid, typmod).await })
            })?;
            columns.push(catalog::PgColumn {
                name: name.clone(),
                type_oid: oid,
                typmod,
                kind,
                sql_type,
                not_null: self.not_null.contains(name),
            });
        }
        let key: Vec<usize> = self
            .key
            .iter()
            .filter_map(|k| columns.iter().position(|c| &c.name == k))
            .collect();
        let postgres_name = if self.postgres_name.is_empty() {
            destination
        } else {
            &self.postgres_name
        };
        let (schema, name) = catalog::split_name(postgres_name);
        let info = catalog::PgTableInfo {
            oid: self.oid,
            schema,
            name,
            identity_columns: key.clone(),
            unique_indexes: vec![key.clone()],
            key,
            columns,
            estimated_rows: -1.0,
            replica_identity: b'd',
            row_filter: None,
            partitions: self
                .partitions
                .iter()
                .map(|(oid, qualified)| catalog::Partition {
                    oid: *oid,
                    qualified: qualified.clone(),
                })
                .collect(),
            unsent_columns: Vec::new(),
            unsent_key_columns: Vec::new(),
        };
        Ok(Table::departed(info, destination, self.append, departed))
    }
}

impl SchemaFile {
    pub fn new(state_dir: &Path, slot: &str) -> SchemaFile {
        SchemaFile {
            path: state_dir.join(format!("postgres-{slot}-schema.json")),
            backfill_start: BackfillStart {
                path: state_dir.join(format!("postgres-{slot}-backfill-start")),
            },
        }
    }

    /// What the last run kept (nothing on a first run, or when the file
    /// cannot be read: the checks it serves are then skipped).
    pub fn read(&self) -> Recorded {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return Recorded::default();
        };
        let saved: BTreeMap<String, SavedTable> = serde_json::from_str(&text).unwrap_or_default();
        Recorded {
            tables: saved
                .into_iter()
                .map(|(name, saved)| {
                    let table = match saved {
                        SavedTable::Recorded(r) => r,
                        SavedTable::Columns(columns) => RecordedTable {
                            columns,
                            ..RecordedTable::default()
                        },
                    };
                    (name, table)
                })
                .collect(),
        }
    }

    /// Only added trailing columns may differ from the last run.
    pub fn check(&self, recorded: &Recorded, tables: &Tables) -> Result<(), SourceError> {
        for table in tables.iter().filter(|t| t.departed.is_none()) {
            let Some(before) = recorded.tables.get(&table.schema.name) else {
                continue;
            };
            let before = &before.columns;
            let now = table.shape();
            if before.len() > now.len() || before[..] != now[..before.len()] {
                let gone: Vec<&str> = before
                    .iter()
                    .filter(|b| !now.iter().any(|n| n.0 == b.0))
                    .map(|b| b.0.as_str())
                    .collect();
                let unsent = |name: &str| table.info.unsent_columns.iter().any(|u| u == name);
                let what = if gone.is_empty() {
                    "a column was renamed, reordered or changed type since the last run".to_string()
                } else if gone.iter().all(|g| unsent(g)) {
                    format!(
                        "column(s) {} are no longer sent by the publication (generated, or left \
                         out of its column list) but were before",
                        gone.join(", ")
                    )
                } else {
                    format!(
                        "column(s) {} dropped or renamed since the last run",
                        gone.join(", ")
                    )
                };
                return Err(ddl_error(&table.schema.name, &what, None));
            }
        }
        Ok(())
    }

    /// Carries the last run's [`RecordedTable::present_since`] over to the
    /// same columns now ([`SchemaFile::check`] has made sure the columns
    /// it recorded are still the table's first ones, in order, same type).
    pub fn carry_present_since(&self, recorded: &Recorded, tables: &mut Tables) {
        for table in tables.iter_mut() {
            let Some(before) = recorded.tables.get(&table.schema.name) else {
                continue;
            };
            let now = table.shape();
            for (i, since) in before.present_since.iter().enumerate() {
                if before.columns.get(i) == now.get(i) {
                    table.present_since[i] = table.present_since[i].min(*since);
                }
            }
        }
    }

    /// Best effort: a file that cannot be written only costs the checks of
    /// the next run.
    pub fn save(&self, tables: &Tables) {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let recorded: BTreeMap<&str, RecordedTable> = tables
            .iter()
            .map(|t| (t.schema.name.as_str(), RecordedTable::of(t)))
            .collect();
        let tmp = self.path.with_extension("tmp");
        let written = serde_json::to_vec_pretty(&recorded)
            .ok()
            .and_then(|bytes| std::fs::write(&tmp, bytes).ok())
            .and_then(|()| std::fs::rename(&tmp, &self.path).ok());
        if written.is_none() {
            tracing::warn!(path = %self.path.display(), "cannot save the replicated tables' shapes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_tables_read_older_files_and_find_a_renamed_table_by_oid() {
        let dir = tempfile::tempdir().unwrap();
        let file = SchemaFile::new(dir.path(), "weir");
        // An older weir kept only the columns: no OID, so no rename is guessed.
        std::fs::write(&file.path, r#"{"public.t": [["id", 23, -1]]}"#).unwrap();
        let old = file.read();
        assert_eq!(old.tables["public.t"].columns, vec![("id".into(), 23, -1)]);
        assert_eq!(old.renamed(0, "public.t2"), None);
        let recorded = RecordedTable {
            oid: 41,
            postgres_name: "public.t".into(),
            columns: vec![("id".into(), 23, -1)],
            departed: Some("0/10".into()),
            ..RecordedTable::default()
        };
        std::fs::write(
            &file.path,
            serde_json::to_vec(&BTreeMap::from([("public.t", recorded)])).unwrap(),
        )
        .unwrap();
        let now = file.read();
        assert_eq!(now.tables["public.t"].departed.as_deref(), Some("0/10"));
        assert_eq!(
            now.renamed(41, "public.t2").map(String::as_str),
            Some("public.t")
        );
        // Under its own name, or another OID: not a rename.
        assert_eq!(now.renamed(41, "public.t"), None);
        assert_eq!(now.renamed(42, "public.t2"), None);
    }

    #[test]
    fn a_later_run_knows_its_columns_present_from_where_the_last_run_knew_them() {
        use crate::postgres::decode::PgKind;
        use crate::postgres::decoder::tests::{column, table_of};
        let dir = tempfile::tempdir().unwrap();
        let file = SchemaFile::new(dir.path(), "weir");
        let two = || {
            vec![
                column("id", PgKind::Int64, "bigint"),
                column("title", PgKind::Text, "text"),
            ]
        };
        let mut first = Tables::default();
        first.push(table_of("public.docs", two(), vec![0]));
        first.iter_mut().next().unwrap().columns_present_at(100);
        file.save(&first);

        // The next run reads a third column the last one never saw.
        let mut three = two();
        three.push(column("body", PgKind::Text, "text"));
        let mut next = Tables::default();
        next.push(table_of("public.docs", three, vec![0]));
        let recorded = file.read();
        file.check(&recorded, &next).unwrap();
        file.carry_present_since(&recorded, &mut next);
        let table = next.iter_mut().next().unwrap();
        assert_eq!(table.present_since, vec![100, 100, u64::MAX]);
        // Its own start, later, leaves the earlier positions alone.
        table.columns_present_at(500);
        assert_eq!(table.present_since, vec![100, 100, 500]);
    }
}
