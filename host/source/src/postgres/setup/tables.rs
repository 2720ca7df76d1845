//! The tables to replicate: the publication's (or those it will be
//! created for), its partitions gathered under their table, and the tables
//! that left it while the slot still holds changes to them.

use std::collections::{BTreeMap, BTreeSet};

use super::schema_file::{Recorded, RecordedTable};
use super::slot::{current_wal_lsn, slot_and_publication};
use crate::SourceError;
use crate::postgres::catalog::{self, format_lsn};
use crate::postgres::config::PostgresConfig;
use crate::postgres::decoder::OpenTx;
use crate::postgres::session::Session;
use crate::postgres::table::{Table, Tables, ddl_error};

/// Reads the publication's tables (or, when it does not exist yet, the
/// tables it will be created for), in name order, as the publication sends
/// them: its column lists and row filters applied, and partitions it
/// publishes one by one gathered under their partitioned table.
///
/// `recorded` is what the last run kept: a table found under another name
/// than the one it had (by its OID) keeps its destination, and a table no
/// longer published is kept while the slot may still hold changes of it
/// (see [`Table::departed`]).
pub(in crate::postgres) fn load_tables(
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

/// Columns added to the tables between the source reading them (at open)
/// and the slot's snapshot: `ALTER TABLE ... ADD COLUMN` committed while
/// weir started (loading its sinks can take seconds). Read inside the
/// snapshot's transaction, where the catalog is as the snapshot sees it,
/// and added to the tables, so that the backfill reads those columns and
/// the stream, which starts after the snapshot, finds the shape it is sent.
/// Without this the backfill read the older column list, and a value set
/// in an added column before the snapshot reached no sink: the row arrived
/// with a null there. Any other change of shape in that window stops the
/// run, naming the table.
pub(in crate::postgres) fn add_columns_seen_by_snapshot(
    session: &mut Session,
    config: &PostgresConfig,
    tables: &mut Tables,
    consistent_point: u64,
) -> Result<bool, SourceError> {
    let published = published_relations(session, config)?;
    let mut changed = false;
    for t in 0..tables.len() {
        if tables[t].departed.is_some() {
            continue;
        }
        let name = tables[t].info.qualified();
        let Some(seen) = published_columns(session, &published, &name)? else {
            return Err(SourceError::Config(format!(
                "table {name} does not exist in the slot's snapshot: it was dropped while \
                 weir started; run again"
            )));
        };
        let known = &tables[t].info.columns;
        let same = |a: &catalog::PgColumn, b: &catalog::PgColumn| {
            a.name == b.name && a.type_oid == b.type_oid && a.typmod == b.typmod
        };
        let grew = seen.columns.len() >= known.len()
            && known.iter().zip(&seen.columns).all(|(a, b)| same(a, b));
        if !grew {
            let list = |columns: &[catalog::PgColumn]| {
                columns
                    .iter()
                    .map(|c| format!("{} {}", c.name, c.sql_type))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(SourceError::Config(format!(
                "table {name} changed shape while weir started, from ({}) to ({}) in the \
                 slot's snapshot; only added columns can be carried: run again",
                list(known),
                list(&seen.columns)
            )));
        }
        if seen.columns.len() > known.len() {
            let added = seen.columns[known.len()..].to_vec();
            tables[t].add_columns(added, consistent_point);
            changed = true;
        }
        tables[t].columns_present_at(consistent_point);
    }
    Ok(changed)
}

/// The publication's relations as the catalog lists them now (none when
/// the publication does not exist yet).
fn published_relations(
    session: &mut Session,
    config: &PostgresConfig,
) -> Result<Vec<catalog::PublishedRelation>, SourceError> {
    let publication = &config.publication;
    if !publication_exists(session, publication)? {
        return Ok(Vec::new());
    }
    session.query("reading the publication's tables", |c| {
        let p = publication.clone();
        Box::pin(async move { catalog::publication_tables(c, &p).await })
    })
}

/// Table `name` as the catalog describes it now, with the columns
/// `published` sends of it; None when it does not exist.
fn published_columns(
    session: &mut Session,
    published: &[catalog::PublishedRelation],
    name: &str,
) -> Result<Option<catalog::PgTableInfo>, SourceError> {
    let columns = published
        .iter()
        .find(|r| r.qualified == name)
        .or_else(|| published.iter().find(|r| r.root == name))
        .map(|r| r.columns())
        .transpose()
        .map_err(SourceError::Invalid)?
        .flatten();
    session.query("reading a table's columns", |c| {
        let n = name.to_string();
        let columns = columns.clone();
        Box::pin(async move { catalog::load_table(c, &n, columns.as_deref()).await })
    })
}

/// Checks that the columns a transaction's changes were decoded without
/// (`OpenTx::missing_columns`) are still published: a column dropped, or
/// taken out of the publication's column list, while weir streamed is a
/// change of shape that stops the run, naming it; one that is still there
/// is read by key with the unchanged TOAST values.
pub(in crate::postgres) fn check_missing_columns(
    session: &mut Session,
    config: &PostgresConfig,
    tables: &Tables,
    open: &OpenTx,
) -> Result<(), SourceError> {
    if open.missing_columns.is_empty() {
        return Ok(());
    }
    let published = published_relations(session, config)?;
    let mut by_table: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &(t, c) in &open.missing_columns {
        by_table.entry(t).or_default().push(c);
    }
    for (t, columns) in by_table {
        let table = &tables[t];
        let name = table.info.qualified();
        let now = published_columns(session, &published, &name)?;
        let gone: Vec<&str> = columns
            .iter()
            .map(|&c| table.info.columns[c].name.as_str())
            .filter(|&column| {
                now.as_ref()
                    .is_none_or(|info| info.columns.iter().all(|c| c.name != column))
            })
            .collect();
        if !gone.is_empty() {
            return Err(ddl_error(
                &name,
                &format!(
                    "column(s) {} were dropped or left the publication's column list",
                    gone.iter()
                        .map(|c| format!("`{c}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some(open.commit_lsn),
            ));
        }
        tracing::warn!(
            table = %table.schema.name,
            commit_lsn = %format_lsn(open.commit_lsn),
            columns = %columns
                .iter()
                .map(|&c| table.info.columns[c].name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            "Postgres decoded a transaction without columns the table already had when it \
             committed (a catalog snapshot older than the change); their values are read by \
             key, as unchanged TOAST values are"
        );
    }
    Ok(())
}
