//! What the source reads from Postgres' catalog: the publication's tables,
//! their columns and types, and their keys.

use tokio_postgres::{Client, SimpleQueryMessage};

use super::decode::{PgKind, ident, kind_of, literal};

#[derive(Clone, Debug)]
pub struct PgColumn {
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
    pub kind: PgKind,
    /// `format_type(type, typmod)`, for casts of key literals.
    pub sql_type: String,
    pub not_null: bool,
}

#[derive(Clone, Debug)]
pub struct PgTableInfo {
    pub oid: u32,
    pub schema: String,
    pub name: String,
    pub columns: Vec<PgColumn>,
    /// Key column indexes: the replica identity index, else the primary key.
    pub key: Vec<usize>,
    /// `pg_class.reltuples`, for progress (negative: never analyzed).
    pub estimated_rows: f64,
    /// `pg_class.relreplident`: `d` (default: the primary key), `n`
    /// (nothing), `i` (an index), `f` (full, every column).
    pub replica_identity: u8,
    /// The columns the replica identity covers (every one with `f`).
    pub identity_columns: Vec<usize>,
    /// The column sets of the table's valid unique indexes without
    /// expressions or predicates (the primary key among them).
    pub unique_indexes: Vec<Vec<usize>>,
    /// The publication's row filter (PG15+), as the server prints it: the
    /// stream sends only rows it holds for, so the backfill reads only those.
    pub row_filter: Option<String>,
    /// A partitioned table's leaf partitions, under whose OIDs and names
    /// its changes arrive unless the publication sets
    /// `publish_via_partition_root`.
    pub partitions: Vec<Partition>,
    /// The columns the publication does not send (generated, or left out
    /// of its column list), which the source leaves out too.
    pub unsent_columns: Vec<String>,
    /// Those of them in the table's own key: such a key cannot be used.
    pub unsent_key_columns: Vec<String>,
}

/// A leaf partition of a partitioned table.
#[derive(Clone, Debug)]
pub struct Partition {
    pub oid: u32,
    /// `schema.table`, as Relation messages name it.
    pub qualified: String,
}

impl PgTableInfo {
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    pub fn sql_name(&self) -> String {
        format!("{}.{}", ident(&self.schema), ident(&self.name))
    }
}

/// Rows of a simple query, as text.
pub async fn rows(
    client: &Client,
    sql: &str,
) -> Result<Vec<Vec<Option<String>>>, tokio_postgres::Error> {
    let mut out = Vec::new();
    for message in client.simple_query(sql).await? {
        if let SimpleQueryMessage::Row(row) = message {
            out.push(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_string))
                    .collect(),
            );
        }
    }
    Ok(out)
}

pub async fn publication_exists(
    client: &Client,
    publication: &str,
) -> Result<bool, tokio_postgres::Error> {
    let sql = format!(
        "SELECT 1 FROM pg_publication WHERE pubname = {}",
        literal(publication)
    );
    Ok(!rows(client, &sql).await?.is_empty())
}

/// One relation as `pg_publication_tables` lists it: a table, or (unless
/// the publication sets `publish_via_partition_root`) a leaf partition.
#[derive(Clone, Debug)]
pub struct PublishedRelation {
    /// `schema.table`.
    pub qualified: String,
    /// The columns the publication sends (PG15+; None before) as a JSON
    /// array: its column list, else every column (generated ones included,
    /// which pgoutput leaves out all the same). See [`Self::columns`].
    columns_json: Option<String>,
    /// The row filter (PG15+).
    pub row_filter: Option<String>,
    /// The top of its partition tree as `schema.table` (itself when it is
    /// not a partition).
    pub root: String,
}

impl PublishedRelation {
    /// The names of the columns the publication sends, if the server says.
    pub fn columns(&self) -> Result<Option<Vec<String>>, String> {
        self.columns_json
            .as_deref()
            .map(|json| {
                serde_json::from_str(json).map_err(|e| {
                    format!(
                        "pg_publication_tables.attnames of {} is not a list of names ({e}): {json}",
                        self.qualified
                    )
                })
            })
            .transpose()
    }
}

/// The publication's relations, with what it sends of each.
pub async fn publication_tables(
    client: &Client,
    publication: &str,
) -> Result<Vec<PublishedRelation>, tokio_postgres::Error> {
    let version = server_version(client).await?;
    // Column lists and row filters came with PG15, pg_partition_root with PG12.
    let (columns, filter) = if version >= 150_000 {
        ("array_to_json(pt.attnames)::text", "pt.rowfilter")
    } else {
        ("NULL::text", "NULL::text")
    };
    let root = if version >= 120_000 {
        "COALESCE(pg_partition_root(c.oid), c.oid)"
    } else {
        "c.oid"
    };
    let sql = format!(
        "SELECT pt.schemaname, pt.tablename, {columns}, {filter}, rn.nspname, r.relname \
         FROM pg_publication_tables pt \
         JOIN pg_namespace n ON n.nspname = pt.schemaname \
         JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename \
         JOIN pg_class r ON r.oid = {root} \
         JOIN pg_namespace rn ON rn.oid = r.relnamespace \
         WHERE pt.pubname = {} ORDER BY 1, 2",
        literal(publication)
    );
    let mut out = Vec::new();
    for r in rows(client, &sql).await? {
        let get = |i: usize| r[i].clone().unwrap_or_default();
        out.push(PublishedRelation {
            qualified: format!("{}.{}", get(0), get(1)),
            columns_json: r[2].clone(),
            row_filter: r[3].clone(),
            root: format!("{}.{}", get(4), get(5)),
        });
    }
    Ok(out)
}

/// `server_version_num`, e.g. 150018.
async fn server_version(client: &Client) -> Result<u32, tokio_postgres::Error> {
    let found = rows(client, "SHOW server_version_num").await?;
    Ok(found
        .first()
        .and_then(|r| r[0].as_deref())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// Expands `schema.table`, `schema.*` and `*` into existing tables, sorted.
pub async fn resolve_tables(
    client: &Client,
    wanted: &[String],
) -> Result<Vec<String>, tokio_postgres::Error> {
    let mut out = Vec::new();
    for entry in wanted {
        let filter = match entry.as_str() {
            "*" => "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'".to_string(),
            e if e.ends_with(".*") => format!("n.nspname = {}", literal(&e[..e.len() - 2])),
            e => {
                let (s, t) = split_name(e);
                out.push(format!("{s}.{t}"));
                continue;
            }
        };
        let sql = format!(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND {filter}"
        );
        for r in rows(client, &sql).await? {
            out.push(format!(
                "{}.{}",
                r[0].clone().unwrap_or_default(),
                r[1].clone().unwrap_or_default()
            ));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Splits `schema.table` (no quoting; a name without a dot is in `public`).
pub fn split_name(name: &str) -> (String, String) {
    match name.split_once('.') {
        Some((s, t)) => (s.to_string(), t.to_string()),
        None => ("public".to_string(), name.to_string()),
    }
}

/// Loads one table's columns and key, as the publication sends them: no
/// generated column (pgoutput never sends one), and only the columns in
/// `published` when given (a publication's column list). None when the
/// table does not exist.
pub async fn load_table(
    client: &Client,
    qualified: &str,
    published: Option<&[String]>,
) -> Result<Option<PgTableInfo>, tokio_postgres::Error> {
    let (schema, name) = split_name(qualified);
    let sql = format!(
        "SELECT c.oid, c.reltuples, c.relreplident, c.relkind FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = {} AND c.relname = {}",
        literal(&schema),
        literal(&name)
    );
    let found = rows(client, &sql).await?;
    let Some(row) = found.first() else {
        return Ok(None);
    };
    let oid: u32 = row[0].as_deref().unwrap_or("0").parse().unwrap_or(0);
    let estimated_rows: f64 = row[1].as_deref().unwrap_or("-1").parse().unwrap_or(-1.0);
    let replica_identity = row[2]
        .as_deref()
        .and_then(|r| r.bytes().next())
        .unwrap_or(b'd');
    let partitioned = row[3].as_deref() == Some("p");
    // Generated columns came with PG12.
    let generated = if server_version(client).await? >= 120_000 {
        "a.attgenerated <> ''"
    } else {
        "false"
    };
    // Domains resolve to their base type; arrays name their element type.
    let sql = format!(
        "SELECT a.attname, a.atttypid, a.atttypmod, a.attnotnull, \
                format_type(a.atttypid, a.atttypmod), \
                COALESCE(bt.typname, t.typname), t.typcategory, et.typname, \
                a.attnum, {generated} \
         FROM pg_attribute a \
         JOIN pg_type t ON t.oid = a.atttypid \
         LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype \
         LEFT JOIN pg_type et ON et.oid = COALESCE(bt.typelem, t.typelem) \
              AND COALESCE(bt.typcategory, t.typcategory) = 'A' \
         WHERE a.attrelid = {oid} AND a.attnum > 0 AND NOT a.attisdropped \
         ORDER BY a.attnum"
    );
    let mut columns = Vec::new();
    // The attribute numbers of the columns kept, in order (attnum counts
    // dropped and unsent columns too), and the names of those left out.
    let mut sent: Vec<usize> = Vec::new();
    let mut unsent: Vec<(usize, String)> = Vec::new();
    for r in rows(client, &sql).await? {
        let get = |i: usize| r[i].clone().unwrap_or_default();
        let attnum: usize = get(8).parse().unwrap_or(0);
        let generated = get(9) == "t";
        let listed = published.is_none_or(|names| names.contains(&get(0)));
        if generated || !listed {
            unsent.push((attnum, get(0)));
            continue;
        }
        let typmod: i32 = get(2).parse().unwrap_or(-1);
        let kind = match r[7].as_deref() {
            Some(elem) => PgKind::Array(Box::new(kind_of(elem, typmod))),
            None => kind_of(&get(5), typmod),
        };
        sent.push(attnum);
        columns.push(PgColumn {
            name: get(0),
            type_oid: get(1).parse().unwrap_or(0),
            typmod,
            kind,
            sql_type: get(4),
            not_null: get(3) == "t",
        });
    }
    let column_of = |attnum: &usize| sent.iter().position(|l| l == attnum);
    let sql = format!(
        "SELECT i.indkey::text, i.indisreplident FROM pg_index i \
         WHERE i.indrelid = {oid} AND (i.indisprimary OR i.indisreplident) \
         ORDER BY i.indisreplident DESC LIMIT 1"
    );
    let attnums: Vec<usize> = rows(client, &sql)
        .await?
        .first()
        .and_then(|r| r[0].clone())
        .map(|text| {
            text.split_whitespace()
                .filter_map(|n| n.parse::<usize>().ok())
                .collect()
        })
        .unwrap_or_default();
    let key = attnums.iter().filter_map(column_of).collect();
    let unsent_key_columns = unsent
        .iter()
        .filter(|(attnum, _)| attnums.contains(attnum))
        .map(|(_, name)| name.clone())
        .collect();
    let sql = format!(
        "SELECT i.indkey::text, i.indisprimary, i.indisreplident FROM pg_index i \
         WHERE i.indrelid = {oid} AND i.indisunique AND i.indisvalid \
         AND i.indexprs IS NULL AND i.indpred IS NULL"
    );
    let mut unique_indexes = Vec::new();
    let mut identity_columns = Vec::new();
    for r in rows(client, &sql).await? {
        // An index on a column the publication does not send identifies
        // nothing the sinks can see: it is left out whole.
        let Some(columns) = r[0]
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(|n| n.parse::<usize>().ok().and_then(|n| column_of(&n)))
            .collect::<Option<Vec<usize>>>()
        else {
            continue;
        };
        let flag = |i: usize| r[i].as_deref() == Some("t");
        let is_identity = match replica_identity {
            b'd' => flag(1),
            b'i' => flag(2),
            _ => false,
        };
        if is_identity {
            identity_columns = columns.clone();
        }
        unique_indexes.push(columns);
    }
    if replica_identity == b'f' {
        identity_columns = (0..columns.len()).collect();
    }
    let partitions = if partitioned {
        leaf_partitions(client, oid).await?
    } else {
        Vec::new()
    };
    Ok(Some(PgTableInfo {
        oid,
        schema,
        name,
        columns,
        key,
        estimated_rows,
        replica_identity,
        identity_columns,
        unique_indexes,
        row_filter: None,
        partitions,
        unsent_columns: unsent.into_iter().map(|(_, name)| name).collect(),
        unsent_key_columns,
    }))
}

/// The leaf partitions of partitioned table `oid`, at any depth.
async fn leaf_partitions(
    client: &Client,
    oid: u32,
) -> Result<Vec<Partition>, tokio_postgres::Error> {
    let sql = format!(
        "WITH RECURSIVE tree(relid) AS ( \
             SELECT {oid}::oid \
             UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.relid) \
         SELECT c.oid, n.nspname, c.relname FROM tree \
         JOIN pg_class c ON c.oid = tree.relid JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'f') ORDER BY 2, 3"
    );
    Ok(rows(client, &sql)
        .await?
        .into_iter()
        .map(|r| Partition {
            oid: r[0].as_deref().and_then(|o| o.parse().ok()).unwrap_or(0),
            qualified: format!(
                "{}.{}",
                r[1].clone().unwrap_or_default(),
                r[2].clone().unwrap_or_default()
            ),
        })
        .collect())
}

/// The base type name of a type oid (for columns added while streaming).
pub async fn type_kind(
    client: &Client,
    type_oid: u32,
    typmod: i32,
) -> Result<(PgKind, String), tokio_postgres::Error> {
    let sql = format!(
        "SELECT COALESCE(bt.typname, t.typname), et.typname, format_type(t.oid, {typmod}) \
         FROM pg_type t \
         LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype \
         LEFT JOIN pg_type et ON et.oid = COALESCE(bt.typelem, t.typelem) \
              AND COALESCE(bt.typcategory, t.typcategory) = 'A' \
         WHERE t.oid = {type_oid}"
    );
    let found = rows(client, &sql).await?;
    let row = found.first().cloned().unwrap_or_default();
    let name = row.first().cloned().flatten().unwrap_or_default();
    let kind = match row.get(1).cloned().flatten() {
        Some(elem) => PgKind::Array(Box::new(kind_of(&elem, typmod))),
        None => kind_of(&name, typmod),
    };
    Ok((kind, row.get(2).cloned().flatten().unwrap_or(name)))
}

/// What `pg_replication_slots` says about a slot.
#[derive(Clone, Debug)]
pub struct SlotInfo {
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub confirmed_flush: Option<u64>,
}

pub async fn slot(client: &Client, slot: &str) -> Result<Option<SlotInfo>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT plugin, database, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = {}",
        literal(slot)
    );
    Ok(rows(client, &sql)
        .await?
        .into_iter()
        .next()
        .map(|r| SlotInfo {
            plugin: r[0].clone(),
            database: r[1].clone(),
            confirmed_flush: r[2].as_deref().and_then(parse_lsn),
        }))
}

/// Moves a logical slot's confirmed position forward to `lsn` (the server
/// stops at its flushed end if `lsn` lies past it). `Ok(false)` while a
/// replication session still holds the slot.
pub async fn advance_slot(
    client: &Client,
    slot: &str,
    lsn: u64,
) -> Result<bool, tokio_postgres::Error> {
    let sql = format!(
        "SELECT pg_replication_slot_advance({}, '{}')",
        literal(slot),
        format_lsn(lsn)
    );
    match client.simple_query(&sql).await {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `16/B374D848` -> u64.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}
