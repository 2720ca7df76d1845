//! Setting the source up: the publication's tables, the shapes kept between
//! runs, the slot and the publication, and where the first run starts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig};

use super::backfill::Backfill;
use super::catalog::{self, SlotInfo, format_lsn};
use super::config::PostgresConfig;
use super::decode::ident;
use super::keys::decode_key_texts;
use super::session::{Session, session_options, unavailable};
use super::table::{Table, Tables, ddl_error};
use super::{Context, Emitted};
use crate::position::Position;
use crate::source::SourceError;

/// Reads the publication's tables (or, when it does not exist yet, the
/// tables it will be created for), in name order, as the publication sends
/// them: its column lists and row filters applied, and partitions it
/// publishes one by one gathered under their partitioned table.
///
/// `recorded` is what the last run kept: a table found under another name
/// than the one it had (by its OID) keeps its destination, and a table no
/// longer published is kept while the slot may still hold changes of it
/// (see [`Table::departed`]).
pub(super) fn load_tables(
    session: &mut Session,
    config: &PostgresConfig,
    append_tables: &BTreeSet<String>,
    recorded: &Recorded,
) -> Result<Tables, SourceError> {
    let publication = &config.publication;
    let wanted: Vec<Wanted> = if publication_exists(session, publication)? {
        let published = session.query("reading the publication's tables", |c| {
            let p = publication.clone();
            Box::pin(async move { catalog::publication_tables(c, &p).await })
        })?;
        gather_partitions(session, publication, published)?
    } else if config.create_publication_for.is_empty() {
        return Err(SourceError::Config(format!(
            "publication `{publication}` does not exist: create it \
             (CREATE PUBLICATION {publication} FOR TABLE ...) or list the tables under \
             source.postgres.create_publication_for"
        )));
    } else {
        session
            .query("listing the tables to publish", |c| {
                let wanted = config.create_publication_for.clone();
                Box::pin(async move { catalog::resolve_tables(c, &wanted).await })
            })?
            .into_iter()
            .map(|name| Wanted {
                name,
                columns: None,
                row_filter: None,
            })
            .collect()
    };
    if wanted.is_empty() {
        return Err(SourceError::Config(format!(
            "publication `{publication}` has no tables"
        )));
    }
    let mut list: Vec<Table> = Vec::with_capacity(wanted.len());
    for Wanted {
        name,
        columns,
        row_filter,
    } in wanted
    {
        let mut info = session
            .query("reading a table's columns", |c| {
                let n = name.clone();
                let columns = columns.clone();
                Box::pin(async move { catalog::load_table(c, &n, columns.as_deref()).await })
            })?
            .ok_or_else(|| SourceError::Config(format!("table {name} does not exist")))?;
        info.row_filter = row_filter;
        let destination = recorded.renamed(info.oid, &name).unwrap_or(&name).clone();
        if destination != name {
            tracing::warn!(
                table = %name,
                destination = %destination,
                "table {destination} was renamed to {name} in Postgres: its changes keep \
                 streaming into {destination}"
            );
        }
        // The config names a table as the sinks know it (or as Postgres does now).
        let declared_key = config
            .keys
            .get(&destination)
            .or_else(|| config.keys.get(&name))
            .map(Vec::as_slice);
        let append = append_tables.contains(&destination) || append_tables.contains(&name);
        let table = Table::new(info, declared_key, append)?;
        list.push(if destination == name {
            table
        } else {
            table.with_destination(&destination)
        });
    }
    list.extend(departed_tables(session, config, recorded, &list)?);
    // The backfill's order, which its positions follow: by destination name.
    list.sort_by(|a, b| a.schema.name.as_bytes().cmp(b.schema.name.as_bytes()));
    let mut tables = Tables::default();
    for table in list {
        if let Some(other) = tables.index_of(&table.schema.name) {
            return Err(SourceError::Config(format!(
                "tables {} and {} would both stream into {}: one was renamed to the other's \
                 old name, or dropped while another took its name. Take one of them out of \
                 publication `{publication}`, or start a new pipeline",
                tables[other].info.qualified(),
                table.info.qualified(),
                table.schema.name
            )));
        }
        tables.push(table);
    }
    Ok(tables)
}

/// The tables the last run replicated that the publication no longer has
/// (it left, or was dropped), kept while the slot may still hold changes
/// made to them before: those were published when they were made, so they
/// are applied. Once the slot is past the point where weir found a table
/// gone, it is forgotten.
fn departed_tables(
    session: &mut Session,
    config: &PostgresConfig,
    recorded: &Recorded,
    current: &[Table],
) -> Result<Vec<Table>, SourceError> {
    let gone: Vec<(&String, &RecordedTable)> = recorded
        .tables
        .iter()
        .filter(|(destination, r)| {
            r.oid != 0
                && !current
                    .iter()
                    .any(|t| t.info.oid == r.oid || t.schema.name == **destination)
        })
        .collect();
    if gone.is_empty() {
        return Ok(Vec::new());
    }
    let (slot, _) = slot_and_publication(session, config)?;
    let confirmed = slot.and_then(|s| s.confirmed_flush);
    let mut now = None;
    let mut kept = Vec::new();
    for (destination, r) in gone {
        let departed = match r.departed.as_deref().and_then(catalog::parse_lsn) {
            Some(lsn) => lsn,
            None => match now {
                Some(lsn) => lsn,
                None => {
                    let lsn = current_wal_lsn(session)?.unwrap_or(0);
                    now = Some(lsn);
                    lsn
                }
            },
        };
        if confirmed.is_none_or(|c| c >= departed) {
            tracing::warn!(
                table = %destination,
                publication = %config.publication,
                "table {destination} is no longer replicated: it left publication `{}` (or was \
                 dropped), and the slot is past every change it had; its destination keeps \
                 the rows it has",
                config.publication
            );
            continue;
        }
        tracing::warn!(
            table = %destination,
            until = %format_lsn(departed),
            "table {destination} left publication `{}` (or was dropped) while weir was \
             behind: the changes made to it before, still in the WAL, are applied; after them \
             it is no longer replicated",
            config.publication
        );
        kept.push(r.rebuild(session, destination, departed)?);
    }
    Ok(kept)
}

/// A table to replicate, with what the publication sends of it.
struct Wanted {
    /// `schema.table`.
    name: String,
    /// The column list's names (every column's when it has none).
    columns: Option<Vec<String>>,
    row_filter: Option<String>,
}

/// Turns the publication's relations into the tables to replicate. Without
/// `publish_via_partition_root`, the publication lists a partitioned
/// table's leaf partitions instead of the table, and its changes arrive
/// under their names: when every leaf is listed, the table is replicated
/// under its own name (its changes mapped back to it, see
/// [`Tables::index_of`]); leaves listed alone stay tables of their own.
fn gather_partitions(
    session: &mut Session,
    publication: &str,
    published: Vec<catalog::PublishedRelation>,
) -> Result<Vec<Wanted>, SourceError> {
    let mut by_root: BTreeMap<String, Vec<catalog::PublishedRelation>> = BTreeMap::new();
    for relation in published {
        by_root
            .entry(relation.root.clone())
            .or_default()
            .push(relation);
    }
    let mut wanted = Vec::new();
    for (root, relations) in by_root {
        let alone = |relations: Vec<catalog::PublishedRelation>| {
            relations
                .into_iter()
                .map(|r| {
                    Ok(Wanted {
                        columns: r.columns().map_err(SourceError::Invalid)?,
                        name: r.qualified,
                        row_filter: r.row_filter,
                    })
                })
                .collect::<Result<Vec<_>, SourceError>>()
        };
        if relations.len() == 1 && relations[0].qualified == root {
            wanted.extend(alone(relations)?);
            continue;
        }
        let leaves = session
            .query("reading a partitioned table's partitions", |c| {
                let root = root.clone();
                Box::pin(async move { catalog::load_table(c, &root, None).await })
            })?
            .map(|info| info.partitions)
            .unwrap_or_default();
        let listed: BTreeSet<&str> = relations.iter().map(|r| r.qualified.as_str()).collect();
        if leaves.is_empty() || !leaves.iter().all(|l| listed.contains(l.qualified.as_str())) {
            wanted.extend(alone(relations)?);
            continue;
        }
        // One table in the sinks: its partitions must send the same.
        let first = &relations[0];
        let columns = first.columns().map_err(SourceError::Invalid)?;
        for other in &relations[1..] {
            let mut mine = other.columns().map_err(SourceError::Invalid)?;
            let mut theirs = columns.clone();
            if let (Some(a), Some(b)) = (&mut mine, &mut theirs) {
                a.sort();
                b.sort();
            }
            if mine != theirs || other.row_filter != first.row_filter {
                return Err(SourceError::Config(format!(
                    "publication `{publication}` publishes the partitions of {root} with \
                     different column lists or row filters ({} and {}), so they cannot be \
                     replicated as one table: ALTER PUBLICATION {publication} SET \
                     (publish_via_partition_root = true) to publish {root} as one table",
                    first.qualified, other.qualified
                )));
            }
        }
        wanted.push(Wanted {
            name: root,
            columns,
            row_filter: first.row_filter.clone(),
        });
    }
    Ok(wanted)
}

fn publication_exists(session: &mut Session, publication: &str) -> Result<bool, SourceError> {
    session.query("reading the publication", |c| {
        let p = publication.to_string();
        Box::pin(async move { catalog::publication_exists(c, &p).await })
    })
}

/// The shapes of the tables this pipeline last streamed, kept in the
/// state directory so that DDL done while weir was stopped is caught too;
/// beside them, where the backfill's stream starts ([`BackfillStart`]).
pub(super) struct SchemaFile {
    path: PathBuf,
    backfill_start: BackfillStart,
}

/// The slot's position when the backfill began: its stream must start
/// there. A backfill resumed in a later run reads the current data, which
/// is exact only when the stream that follows still replays every change
/// since the first chunk was read; once the slot has moved past that
/// start, the changes in between are gone from the server, and the rows a
/// sink read before the kill would keep their old values (and rows deleted
/// since) for good.
struct BackfillStart {
    path: PathBuf,
}

impl BackfillStart {
    fn read(&self) -> Option<u64> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        catalog::parse_lsn(text.trim())
    }

    /// Best effort, like the shapes: a file that cannot be written only
    /// costs the check of a later resume (a warning then says so).
    fn save(&self, lsn: u64) {
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
pub(super) struct Recorded {
    tables: BTreeMap<String, RecordedTable>,
}

/// One replicated table, as the last run saw it: enough to map its
/// relation by OID after a rename, to catch DDL done while weir was
/// stopped, and to decode the changes still in the WAL after it left the
/// publication (or was dropped), when the catalog no longer describes it.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct RecordedTable {
    /// `pg_class.oid` (0: written by a weir that did not keep it).
    #[serde(default)]
    oid: u32,
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
    departed: Option<String>,
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
    fn renamed(&self, oid: u32, name: &str) -> Option<&String> {
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
        }
    }

    /// The table as it was, for the changes to it still in the WAL; the
    /// kinds of its columns' types come from the catalog (a type outlives
    /// a dropped table unless it was the table's own).
    fn rebuild(
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

/// The replication session's settings, confirming `acked` at the start.
pub(super) fn replication_config(
    dsn: &tokio_postgres::Config,
    config: &PostgresConfig,
    acked: u64,
) -> ReplicationConfig {
    let host = match dsn.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = dsn.get_ports().first().copied().unwrap_or(5432);
    let user = dsn
        .get_user()
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default();
    let password = dsn
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let dbname = dsn
        .get_dbname()
        .map(str::to_string)
        .unwrap_or_else(|| user.clone());
    ReplicationConfig::new(
        host,
        user,
        password,
        dbname,
        config.slot.clone(),
        config.publication.clone(),
    )
    .with_port(port)
    .with_start_lsn(Lsn::ZERO)
    .with_ack_lsn(Lsn::from_u64(acked))
    .with_status_interval(config.status_interval())
    .with_wakeup_interval(config.status_interval())
    .with_options(session_options())
    .with_application_name("weir")
}

/// The replication slot (if it exists) and whether the publication does.
fn slot_and_publication(
    session: &mut Session,
    config: &PostgresConfig,
) -> Result<(Option<SlotInfo>, bool), SourceError> {
    session.query("checking the slot", |c| {
        let s = config.slot.clone();
        let p = config.publication.clone();
        Box::pin(async move {
            Ok((
                catalog::slot(c, &s).await?,
                catalog::publication_exists(c, &p).await?,
            ))
        })
    })
}

/// Fails when the slot or the publication this pipeline already started
/// from is gone: weir never backfills again silently.
pub(super) fn check_slot_and_publication(
    session: &mut Session,
    config: &PostgresConfig,
    emitted: &Emitted,
) -> Result<(), SourceError> {
    let (slot, publication_exists) = slot_and_publication(session, config)?;
    match gone_error(config, slot.is_some(), publication_exists, emitted) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn gone_error(
    config: &PostgresConfig,
    slot_exists: bool,
    publication_exists: bool,
    emitted: &Emitted,
) -> Option<SourceError> {
    let (slot, publication) = (&config.slot, &config.publication);
    let position = emitted.last().cloned().unwrap_or_default();
    if !slot_exists {
        return Some(SourceError::Resume {
            position,
            reason: format!(
                "replication slot `{slot}` no longer exists, but this pipeline has already \
                 started from it: the changes it held are gone, and weir will not silently \
                 backfill again. To start over, delete the sinks' data and the state directory \
                 (or use a new pipeline id) and run again; weir then creates the slot and backfills"
            ),
        });
    }
    if !publication_exists {
        return Some(SourceError::Resume {
            position,
            reason: format!(
                "publication `{publication}` no longer exists, but this pipeline has already \
                 started from it. Re-create it with the same tables \
                 (CREATE PUBLICATION {publication} FOR TABLE ...) and run again"
            ),
        });
    }
    None
}

/// Where the run starts, as [`start`] decided it.
pub(super) struct Start {
    /// The slot's confirmed position (its consistent point when this run
    /// created it).
    pub acked: u64,
    /// The WAL position to stop at (`exit_when_caught_up`).
    pub catch_up_lsn: Option<u64>,
    /// The session that created the slot, kept open until the backfill has
    /// read its exported snapshot; it then streams.
    pub gated: Option<ReplicationClient>,
    pub backfill: Option<Backfill>,
    /// The commit LSN of the transaction to leave out whole
    /// (`skip_transaction_at`), for the stream's decoder.
    pub skip_transaction_at: Option<u64>,
}

/// The slot's confirmed position, if the slot exists.
pub(super) fn confirmed_flush(cx: &mut Context) -> Result<Option<u64>, SourceError> {
    let (slot, _) = slot_and_publication(&mut cx.session, &cx.config)?;
    Ok(slot.and_then(|info| info.confirmed_flush))
}

/// Creates what is missing on a first run (the publication, the slot) and
/// decides where the run starts: a backfill from the start, a backfill
/// resumed after a committed row, or the stream.
pub(super) fn start(cx: &mut Context, after: Option<&Position>) -> Result<Start, SourceError> {
    let (slot, publication_exists) = slot_and_publication(&mut cx.session, &cx.config)?;
    if let Some(after) = after {
        cx.emitted.advance(after.clone());
        if let Some(e) = gone_error(&cx.config, slot.is_some(), publication_exists, &cx.emitted) {
            return Err(e);
        }
    }
    if !publication_exists {
        create_publication(cx)?;
    }
    let mut start = Start {
        acked: 0,
        catch_up_lsn: None,
        gated: None,
        backfill: None,
        skip_transaction_at: cx.config.skip_transaction_lsn(),
    };
    if let Some(info) = &slot {
        check_slot(&cx.config, cx.session.dsn(), info)?;
        start.acked = info.confirmed_flush.unwrap_or(0);
    }
    if cx.config.exit_when_caught_up {
        start.catch_up_lsn = current_wal_lsn(&mut cx.session)?;
    }
    match after {
        None if slot.is_none() => {
            let (gated, consistent_point, snapshot) = create_slot(cx)?;
            start.acked = consistent_point;
            start.gated = Some(gated);
            start.backfill = Some(Backfill::new(cx.tables.len(), None, snapshot));
            cx.schema_file.backfill_start.save(consistent_point);
        }
        None => {
            tracing::info!(
                slot = %cx.config.slot,
                "no sink has a position yet: backfilling every table from the current data, \
                 then streaming from the slot's confirmed position"
            );
            start.backfill = Some(Backfill::new(cx.tables.len(), None, None));
            cx.schema_file.backfill_start.save(start.acked);
        }
        Some(p) if p.as_snapshot().is_some() => {
            let backfill_start = cx.schema_file.backfill_start.read();
            check_slot_still_at_backfill_start(p, backfill_start, start.acked, &cx.config.slot)?;
            let (t, key) = backfill_resume_point(&cx.tables, p)?;
            start.backfill = Some(Backfill::new(cx.tables.len(), Some((t, key)), None));
        }
        Some(p) => check_not_behind_the_slot(p, start.acked, &cx.config.slot)?,
    }
    Ok(start)
}

fn create_publication(cx: &mut Context) -> Result<(), SourceError> {
    let publication = &cx.config.publication;
    let tables: Vec<String> = cx
        .tables
        .iter()
        .filter(|t| t.departed.is_none())
        .map(|t| t.info.sql_name())
        .collect();
    let sql = format!(
        "CREATE PUBLICATION {} FOR TABLE {}",
        ident(publication),
        tables.join(", ")
    );
    cx.session.execute("creating the publication", &sql)?;
    tracing::info!(%publication, "publication created");
    Ok(())
}

/// An existing slot must be ours to use: pgoutput, in this database.
fn check_slot(
    config: &PostgresConfig,
    dsn: &tokio_postgres::Config,
    info: &SlotInfo,
) -> Result<(), SourceError> {
    let slot = &config.slot;
    if info.plugin.as_deref() != Some("pgoutput") {
        return Err(SourceError::Config(format!(
            "replication slot `{slot}` exists but is not a pgoutput logical slot \
             (plugin {:?}); drop it or name another slot",
            info.plugin
        )));
    }
    if let Some(db) = &info.database
        && let Some(mine) = dsn.get_dbname()
        && db != mine
    {
        return Err(SourceError::Config(format!(
            "replication slot `{slot}` belongs to database `{db}`, not `{mine}`"
        )));
    }
    Ok(())
}

pub(super) fn current_wal_lsn(session: &mut Session) -> Result<Option<u64>, SourceError> {
    let rows = session.rows(
        "reading the current WAL position",
        "SELECT pg_current_wal_insert_lsn()::text",
    )?;
    Ok(rows
        .first()
        .and_then(|r| r[0].as_deref())
        .and_then(catalog::parse_lsn))
}

/// Creates the slot with an exported snapshot, on a session that stays
/// open until the backfill has imported it. Returns that session, the
/// slot's consistent point and the snapshot's name.
fn create_slot(cx: &mut Context) -> Result<(ReplicationClient, u64, Option<String>), SourceError> {
    let slot = &cx.config.slot;
    let cfg = replication_config(cx.session.dsn(), &cx.config, 0);
    let sql = format!(
        "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT",
        ident(slot)
    );
    let (client, rows) = cx
        .reader
        .block_on(async {
            let mut client = ReplicationClient::connect_gated(cfg).await?;
            let rows = client.simple_query(&sql).await?;
            Ok::<_, pgwire_replication::PgWireError>((client, rows))
        })
        .map_err(|e| unavailable("cannot create the replication slot", e))?;
    let text = |i: usize| {
        rows.first()
            .and_then(|r| r.get(i).cloned().flatten())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let consistent = text(1).as_deref().and_then(catalog::parse_lsn).unwrap_or(0);
    tracing::info!(slot = %slot, consistent_point = %format_lsn(consistent), "replication slot created");
    Ok((client, consistent, text(2)))
}

/// The table and key a backfill position stands at.
fn backfill_resume_point(
    tables: &Tables,
    p: &Position,
) -> Result<(usize, Vec<String>), SourceError> {
    let (table, key) = p.as_snapshot().expect("a backfill position");
    let Some(t) = tables.index_of(table) else {
        return Err(SourceError::Resume {
            position: p.clone(),
            reason: format!(
                "the backfill stopped in table {table}, which the publication no longer has"
            ),
        });
    };
    let key =
        decode_key_texts(&tables[t].key_orders(), key).ok_or_else(|| SourceError::Resume {
            position: p.clone(),
            reason: format!(
                "its key bytes do not decode as table {table}'s key, so the backfill cannot \
                 find where it stopped (a weir that orders this key's type differently wrote \
                 it: uuid and time keys are ordered by value now, by text before). Finish the \
                 backfill with the weir that started it, or start the pipeline over: empty the \
                 sinks, drop the slot and delete the state directory"
            ),
        })?;
    tracing::info!(%table, "resuming the backfill after the last committed row");
    Ok((t, key))
}

/// A backfill resumes from the current data and then streams from the
/// slot: exact only while the slot still stands where the backfill began
/// (see [`BackfillStart`]). It has moved when the required sinks finished
/// the backfill and streamed while another sink stayed inside it (an
/// optional sink left out of a run, or restored from a backup): resuming
/// for that sink would leave it wrong without a word, so the run stops,
/// before anything is acknowledged.
fn check_slot_still_at_backfill_start(
    p: &Position,
    backfill_start: Option<u64>,
    acked: u64,
    slot: &str,
) -> Result<(), SourceError> {
    let Some(began) = backfill_start else {
        tracing::warn!(
            %slot,
            "resuming the backfill without knowing where its stream starts (the state \
             directory does not say): exact only if the slot has not moved since it began"
        );
        return Ok(());
    };
    if acked <= began {
        return Ok(());
    }
    let (began, confirmed) = (format_lsn(began), format_lsn(acked));
    Err(SourceError::Resume {
        position: p.clone(),
        reason: format!(
            "a sink stands inside the backfill, but replication slot `{slot}` has moved from \
             where the backfill began (LSN {began}) to {confirmed}: the changes committed in \
             between are no longer on the server, so the rows that sink read before would keep \
             stale values, and rows deleted since, for good. This happens when an optional \
             sink was left out of a run (or restored from a backup) while the others finished \
             the backfill. Nothing was acknowledged. Re-create that sink's data: empty its \
             destination and its positions (or remove it from the pipeline), and run again"
        ),
    })
}

/// A stream position older than the slot's confirmed position means a
/// sink needs changes the server has already released: going on would lose
/// them without a word, so the run stops there, before anything is
/// acknowledged. Anything else is not a position of ours.
fn check_not_behind_the_slot(p: &Position, acked: u64, slot: &str) -> Result<(), SourceError> {
    let Some((lsn, ordinal)) = p.as_stream() else {
        return Err(SourceError::Resume {
            position: p.clone(),
            reason: "not a position of the Postgres source".into(),
        });
    };
    // The first commit LSN the sinks at `p` still need.
    let needed = if ordinal == u32::MAX { lsn + 1 } else { lsn };
    if needed < acked {
        let (resume, confirmed) = (format_lsn(lsn), format_lsn(acked));
        return Err(SourceError::Resume {
            position: p.clone(),
            reason: format!(
                "a sink stands at LSN {resume}, behind replication slot `{slot}` \
                 (confirmed_flush_lsn {confirmed}): the changes committed between {resume} and \
                 {confirmed} are no longer on the server, so that sink would miss them. This \
                 happens when a sink's data was restored from an older backup, or an optional \
                 sink fell behind while the required ones were acknowledged. Nothing was \
                 acknowledged. To repair it, restore a backup of that sink taken at or after \
                 {confirmed}, or re-create its data: empty its destination, drop the slot (or \
                 name a new one) and delete the pipeline's state directory, so that the next \
                 run backfills every table again from a new slot"
            ),
        });
    }
    Ok(())
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
    fn a_backfill_resumes_only_while_the_slot_stands_where_it_began() {
        let inside = Position::snapshot("public.t", b"k");
        assert!(check_slot_still_at_backfill_start(&inside, Some(0x200), 0x200, "weir").is_ok());
        // Nothing recorded (an older state directory): a warning, not a stop.
        assert!(check_slot_still_at_backfill_start(&inside, None, 0x300, "weir").is_ok());
        let said = check_slot_still_at_backfill_start(&inside, Some(0x200), 0x300, "weir")
            .unwrap_err()
            .to_string();
        assert!(
            said.contains("backfill public.t")
                && said.contains("0/200")
                && said.contains("0/300")
                && said.contains("no longer on the server"),
            "{said}"
        );
    }

    #[test]
    fn a_stream_position_behind_the_slot_is_an_error_naming_both_positions() {
        let resume = Position::stream(0x1_0000_0100, 2);
        let err = check_not_behind_the_slot(&resume, 0x1_0000_0200, "weir").unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("1/100")
                && said.contains("confirmed_flush_lsn 1/200")
                && said.contains("no longer on the server"),
            "{said}"
        );
        // At or after the slot: nothing is missing.
        assert!(
            check_not_behind_the_slot(&Position::stream(0x1_0000_0200, 0), 0x1_0000_0200, "weir")
                .is_ok()
        );
        assert!(
            check_not_behind_the_slot(
                &Position::stream(0x1_0000_01ff, u32::MAX),
                0x1_0000_0200,
                "weir"
            )
            .is_ok()
        );
        assert!(
            check_not_behind_the_slot(&Position::stream(0x1_0000_0300, 0), 0x1_0000_0200, "weir")
                .is_ok()
        );
    }
}
