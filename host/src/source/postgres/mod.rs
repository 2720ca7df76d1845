//! The Postgres source: a backfill of every published table, then the
//! logical replication stream (pgoutput), as whole transactions in commit
//! order.
//!
//! ## Crates
//!
//! The replication stream runs on `pgwire-replication`: a maintained,
//! tokio-based client of the streaming replication protocol that leaves the
//! LSN it reports as flushed entirely to us (`update_applied_lsn`, monotonic;
//! never the received LSN), answers keepalives itself, and offers a "gated"
//! session on which `CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT` can run
//! and stay open until the backfill has imported the snapshot. It forwards
//! the row messages (Relation, Insert, ...) raw; [`pgoutput`] parses them.
//! Ordinary queries (catalog, backfill `COPY`, TOAST look-ups) use
//! `tokio-postgres`, which has no replication protocol of its own.
//!
//! ## Positions
//!
//! Streaming: [`Position::stream`]`(commit LSN, ordinal of the change in
//! its transaction)`. Backfill: [`Position::snapshot`]`(table, key)`, the
//! key encoded so that byte order is the order the backfill reads rows in
//! (see [`encode_key`]): a position then means "every key up to here" in
//! every run, whatever was deleted in between (a chunk or row counter
//! would shift and skip rows on a re-read). It sorts before every streaming
//! position. The source emits all backfill chunks (tables in name order,
//! each in key order) and then streams from the slot, so the positions it
//! emits only ever grow.
//!
//! ## Snapshot consistency
//!
//! On a fresh start the slot is created with an exported snapshot and the
//! backfill reads every chunk inside that snapshot: the backfill is exactly
//! the database at the slot's consistent point, and the stream carries
//! everything after it. After a crash mid-backfill that snapshot is gone;
//! the remaining chunks are then read from the current data, while the
//! stream still starts at the slot's consistent point (the slot is never
//! acknowledged during the backfill). That is still correct for the final
//! state: every stream change sorts after every backfill row, carries the
//! full row (see TOAST below), and is applied by key, so a row read "too
//! late" is overwritten by the replayed changes that made it, and a row
//! deleted before it was read is deleted (a no-op) again. We chose this over
//! a DBLog watermark reconciliation because it needs no writes to the source
//! database and no per-key bookkeeping, at the cost of a stream replay of
//! what changed during the backfill.
//!
//! ## Unchanged TOAST values
//!
//! pgoutput does not send a TOASTed column an update left unchanged. With
//! REPLICA IDENTITY FULL the old row carries it and we take it from there;
//! otherwise we read the column's current value by key before the
//! transaction is handed on. The current value can be newer than the one at
//! that position, but then the change that made it follows in the stream, so
//! the final state is exact; a null is never written in its place.

mod catalog;
pub mod decode;
mod pgoutput;

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use serde::Deserialize;

use super::{Source, SourceError};
use crate::change::{Change, Column, Op, TableSchema, Transaction, Value};
use crate::config::{PipelineConfig, TableMode};
use crate::position::Position;
use catalog::{PgColumn, PgTableInfo, format_lsn};
use decode::{PgKind, copy_fields, decode, ident, literal};
use pgoutput::{Datum, Message, Relation};

/// Microseconds from the Unix epoch to Postgres' epoch (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// `source.postgres` in a pipeline config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// libpq-style connection string or URL (`host=... user=... dbname=...`).
    pub dsn: String,
    /// The publication whose tables are replicated; created if missing
    /// (from `create_publication_for`).
    pub publication: String,
    /// The logical replication slot; created if missing on the first run.
    pub slot: String,
    /// Tables to create the publication for when it does not exist yet:
    /// `schema.table`, `schema.*` (every table of the schema) or `*` (every
    /// table of the database outside the system schemas).
    #[serde(default)]
    pub create_publication_for: Vec<String>,
    /// Key columns for tables without a primary key, by `schema.table`.
    #[serde(default)]
    pub keys: BTreeMap<String, Vec<String>>,
    /// Rows per backfill chunk.
    #[serde(default = "default_chunk_rows")]
    pub chunk_rows: usize,
    /// End the run once the stream has reached the WAL position the
    /// database had when the run started (for batch-style runs and tests).
    #[serde(default)]
    pub exit_when_caught_up: bool,
    /// How often the acknowledged position is reported to the server.
    #[serde(default = "default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// When nothing arrived for this long, write a logical decoding message
    /// (`pg_logical_emit_message`) so that an idle or filtered database
    /// still moves the acknowledged position; 0 turns it off.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// How long to keep trying to reconnect after the server went away.
    #[serde(default = "default_reconnect_ms")]
    pub reconnect_timeout_ms: u64,
}

fn default_chunk_rows() -> usize {
    5_000
}
fn default_status_interval_ms() -> u64 {
    1_000
}
fn default_heartbeat_ms() -> u64 {
    10_000
}
fn default_reconnect_ms() -> u64 {
    120_000
}

impl PostgresConfig {
    pub fn validate(&self) -> Result<(), String> {
        tokio_postgres::Config::from_str(&self.dsn).map_err(|e| format!("dsn: {e}"))?;
        for (field, name) in [("publication", &self.publication), ("slot", &self.slot)] {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                return Err(format!(
                    "{field}: `{name}` must be lower-case letters, digits and `_`"
                ));
            }
        }
        if self.chunk_rows == 0 {
            return Err("chunk_rows: must be at least 1".into());
        }
        if self.status_interval_ms == 0 {
            return Err("status_interval_ms: must be at least 1".into());
        }
        Ok(())
    }
}

/// One replicated table.
struct Table {
    info: PgTableInfo,
    schema: Arc<TableSchema>,
    /// Key columns for backfill order (the table key, or `ctid` for append
    /// tables without one).
    append: bool,
}

impl Table {
    /// How each key column orders the backfill.
    fn key_orders(&self) -> Vec<KeyOrder> {
        if self.info.key.is_empty() {
            return vec![KeyOrder::Tid];
        }
        self.info
            .key
            .iter()
            .map(|&i| match &self.info.columns[i].kind {
                k @ (PgKind::Int32
                | PgKind::Int64
                | PgKind::Date
                | PgKind::Timestamp
                | PgKind::TimestampTz
                | PgKind::Decimal { .. }
                | PgKind::Bool) => KeyOrder::Native(k.clone()),
                _ => KeyOrder::Text,
            })
            .collect()
    }

    /// The backfill's order: expressions on the table aliased `w`
    /// (qualified, so ORDER BY never picks an output column of that name).
    /// Keys without a native order we can encode are ordered by their text
    /// form in byte order (`COLLATE "C"`).
    fn key_order_exprs(&self) -> Vec<String> {
        if self.info.key.is_empty() {
            return vec!["w.ctid".to_string()];
        }
        self.info
            .key
            .iter()
            .zip(self.key_orders())
            .map(|(&i, order)| {
                let column = format!("w.{}", ident(&self.info.columns[i].name));
                match order {
                    KeyOrder::Text => format!("({column}::text) COLLATE \"C\""),
                    _ => column,
                }
            })
            .collect()
    }

    /// Literals comparable with [`Table::key_order_exprs`].
    fn key_order_literals(&self, texts: &[String]) -> Vec<String> {
        let orders = self.key_orders();
        texts
            .iter()
            .zip(orders)
            .enumerate()
            .map(|(n, (text, order))| match order {
                KeyOrder::Tid => format!("{}::tid", literal(text)),
                KeyOrder::Text => format!("{} COLLATE \"C\"", literal(text)),
                KeyOrder::Native(_) => format!(
                    "{}::{}",
                    literal(text),
                    self.info.columns[self.info.key[n]].sql_type
                ),
            })
            .collect()
    }

    /// The key columns as plain expressions, and their SQL types (look-ups).
    fn key_exprs(&self) -> Vec<String> {
        self.info
            .key
            .iter()
            .map(|&i| format!("w.{}", ident(&self.info.columns[i].name)))
            .collect()
    }

    fn key_types(&self) -> Vec<String> {
        self.info
            .key
            .iter()
            .map(|&i| self.info.columns[i].sql_type.clone())
            .collect()
    }
}

/// How a key column orders the backfill, and so how its position bytes are made.
#[derive(Clone, Debug)]
enum KeyOrder {
    /// The column's own order, encoded from its value.
    Native(PgKind),
    /// The byte order of its text form.
    Text,
    /// `ctid`, for append tables without a key.
    Tid,
}

/// The backfill position's key bytes: an order-preserving encoding of the
/// key (self-delimiting per column), then the key's text forms (for the
/// resume query; never reached by a comparison, the encoding is unique).
fn encode_key(orders: &[KeyOrder], texts: &[String]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for (order, text) in orders.iter().zip(texts) {
        match order {
            KeyOrder::Native(kind) => match decode(kind, text)? {
                Value::Bool(v) => out.push(u8::from(v)),
                Value::Int32(v) | Value::Date32(v) => {
                    out.extend_from_slice(&((v as u32) ^ (1 << 31)).to_be_bytes())
                }
                Value::Int64(v) | Value::TimestampMicros(v) => {
                    out.extend_from_slice(&((v as u64) ^ (1 << 63)).to_be_bytes())
                }
                Value::Decimal128(v) => {
                    out.extend_from_slice(&((v as u128) ^ (1 << 127)).to_be_bytes())
                }
                other => return Err(format!("key value {other:?} has no encoding")),
            },
            KeyOrder::Text => {
                for &b in text.as_bytes() {
                    out.push(b);
                    if b == 0 {
                        out.push(0xff);
                    }
                }
                out.extend_from_slice(&[0, 0]);
            }
            KeyOrder::Tid => {
                let inner = text.trim_start_matches('(').trim_end_matches(')');
                let (block, offset) = inner.split_once(',').ok_or("bad ctid")?;
                let block: u32 = block.parse().map_err(|_| "bad ctid")?;
                let offset: u16 = offset.parse().map_err(|_| "bad ctid")?;
                out.extend_from_slice(&block.to_be_bytes());
                out.extend_from_slice(&offset.to_be_bytes());
            }
        }
    }
    for text in texts {
        out.extend_from_slice(&(text.len() as u32).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    Ok(out)
}

/// The key's text forms back from [`encode_key`]'s bytes.
fn decode_key_texts(orders: &[KeyOrder], bytes: &[u8]) -> Option<Vec<String>> {
    let mut rest = bytes;
    for order in orders {
        let skip = match order {
            KeyOrder::Native(PgKind::Bool) => 1,
            KeyOrder::Native(PgKind::Int32 | PgKind::Date) => 4,
            KeyOrder::Native(PgKind::Decimal { .. }) => 16,
            KeyOrder::Native(_) => 8,
            KeyOrder::Tid => 6,
            KeyOrder::Text => {
                let mut i = 0;
                loop {
                    match (rest.get(i)?, rest.get(i + 1)?) {
                        (0, 0) => break i + 2,
                        (0, _) => i += 2,
                        _ => i += 1,
                    }
                }
            }
        };
        rest = rest.get(skip..)?;
    }
    let mut texts = Vec::new();
    for _ in orders {
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        texts.push(String::from_utf8(rest.get(4..4 + len)?.to_vec()).ok()?);
        rest = &rest[4 + len..];
    }
    Some(texts)
}

/// Where the backfill stands.
struct Backfill {
    /// Indexes into `tables`, in name order, still to read.
    queue: Vec<usize>,
    /// Within the first table of the queue: the key to read after, and
    /// the rows read this run (progress).
    after_key: Option<Vec<String>>,
    rows: u64,
    /// The exported snapshot, while its transaction is open.
    snapshot: Option<String>,
    in_snapshot_tx: bool,
    bar: Option<indicatif::ProgressBar>,
}

struct OpenTx {
    commit_lsn: u64,
    commit_ts: i64,
    changes: Vec<Pending>,
}

/// A change waiting for its transaction's commit.
struct Pending {
    table: usize,
    op: Op,
    values: Vec<Value>,
    /// Columns pgoutput left out (unchanged TOAST), filled before handing on.
    unchanged: Vec<usize>,
    /// The key's text forms, for the TOAST look-up.
    key_text: Vec<String>,
}

/// How the stream maps one relation's columns onto the table's.
struct Mapping {
    table: usize,
    /// For each relation column: the table column it fills.
    columns: Vec<usize>,
}

pub struct PostgresSource {
    config: PostgresConfig,
    rt: tokio::runtime::Runtime,
    dsn: tokio_postgres::Config,
    query: Option<tokio_postgres::Client>,
    tables: Vec<Table>,
    by_name: HashMap<String, usize>,
    backfill: Option<Backfill>,
    stream: Option<ReplicationClient>,
    /// The session that created the slot, waiting for the backfill to end
    /// before it starts streaming.
    pending_gated: Option<ReplicationClient>,
    relations: HashMap<u32, Mapping>,
    open: Option<OpenTx>,
    /// Nothing at or before this is emitted (the resume point, then the last
    /// emitted position).
    skip_until: Option<Position>,
    /// The newest position known safe to stand at while idle.
    heartbeat: Option<Position>,
    /// Stop once this LSN has been reached (exit_when_caught_up).
    target: Option<u64>,
    reached: u64,
    done: bool,
    /// The slot's confirmed_flush_lsn when we started, and the last LSN acknowledged.
    acked: u64,
    acked_at: Option<Instant>,
    last_event: Instant,
    progress: bool,
    /// Where the shapes of the replicated tables are kept between runs.
    schema_file: Option<std::path::PathBuf>,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> SourceError {
    SourceError::Unavailable(format!("{what}: {e}"))
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl PostgresSource {
    /// Connects and reads the publication's tables. Creates nothing: the
    /// slot and a missing publication are made by `resume_after`.
    pub fn open(config: &PostgresConfig, pipeline: &PipelineConfig) -> Result<Self, SourceError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weir-postgres")
            .enable_all()
            .build()
            .map_err(SourceError::Io)?;
        let mut dsn = tokio_postgres::Config::from_str(&config.dsn)
            .map_err(|e| SourceError::Config(format!("dsn: {e}")))?;
        dsn.options(session_options());
        dsn.application_name("weir");
        let mut source = PostgresSource {
            config: config.clone(),
            rt,
            dsn,
            query: None,
            tables: Vec::new(),
            by_name: HashMap::new(),
            backfill: None,
            stream: None,
            pending_gated: None,
            relations: HashMap::new(),
            open: None,
            skip_until: None,
            heartbeat: None,
            target: None,
            reached: 0,
            done: false,
            acked: 0,
            acked_at: None,
            last_event: Instant::now(),
            progress: std::io::stderr().is_terminal(),
            schema_file: None,
        };
        source.load_tables(pipeline)?;
        source.schema_file = Some(
            pipeline
                .state_dir()
                .join(format!("postgres-{}-schema.json", config.slot)),
        );
        source.check_saved_schema()?;
        Ok(source)
    }

    /// The shapes this pipeline last streamed, so that DDL done while weir
    /// was stopped is caught too: only added trailing columns may differ.
    fn check_saved_schema(&self) -> Result<(), SourceError> {
        let Some(path) = &self.schema_file else {
            return Ok(());
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return Ok(());
        };
        let saved: BTreeMap<String, Vec<(String, u32, i32)>> =
            serde_json::from_str(&text).unwrap_or_default();
        for table in &self.tables {
            let Some(before) = saved.get(&table.schema.name) else {
                continue;
            };
            let now: Vec<(String, u32, i32)> = table
                .info
                .columns
                .iter()
                .map(|c| (c.name.clone(), c.type_oid, c.typmod))
                .collect();
            if before.len() > now.len() || before[..] != now[..before.len()] {
                let gone: Vec<&str> = before
                    .iter()
                    .filter(|b| !now.iter().any(|n| n.0 == b.0))
                    .map(|b| b.0.as_str())
                    .collect();
                let what = if gone.is_empty() {
                    "a column was renamed, reordered or changed type since the last run".to_string()
                } else {
                    format!(
                        "column(s) {} dropped or renamed since the last run",
                        gone.join(", ")
                    )
                };
                return Err(ddl_error(&table.schema.name, &what));
            }
        }
        Ok(())
    }

    fn save_schema(&self) {
        let Some(path) = &self.schema_file else {
            return;
        };
        let shapes: BTreeMap<&str, Vec<(&str, u32, i32)>> = self
            .tables
            .iter()
            .map(|t| {
                (
                    t.schema.name.as_str(),
                    t.info
                        .columns
                        .iter()
                        .map(|c| (c.name.as_str(), c.type_oid, c.typmod))
                        .collect(),
                )
            })
            .collect();
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = path.with_extension("tmp");
        let written = serde_json::to_vec_pretty(&shapes)
            .ok()
            .and_then(|bytes| std::fs::write(&tmp, bytes).ok())
            .and_then(|()| std::fs::rename(&tmp, path).ok());
        if written.is_none() {
            tracing::warn!(path = %path.display(), "cannot save the replicated tables' shapes");
        }
    }

    fn connect_query(&mut self) -> Result<(), SourceError> {
        if self.query.as_ref().is_none_or(|c| c.is_closed()) {
            let dsn = self.dsn.clone();
            let client = self.rt.block_on(async move {
                let (client, connection) = dsn.connect(tokio_postgres::NoTls).await?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!("postgres query connection ended: {e}");
                    }
                });
                Ok::<_, tokio_postgres::Error>(client)
            });
            self.query = Some(client.map_err(|e| unavailable("cannot connect to Postgres", e))?);
        }
        Ok(())
    }

    /// Runs `f` on the query connection, reconnecting (within the reconnect
    /// timeout) when the connection is lost.
    fn with_client<T>(
        &mut self,
        what: &str,
        f: impl for<'c> Fn(
            &'c tokio_postgres::Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, tokio_postgres::Error>> + 'c>,
        >,
    ) -> Result<T, SourceError> {
        let deadline = Instant::now() + Duration::from_millis(self.config.reconnect_timeout_ms);
        loop {
            let attempt = match self.connect_query() {
                Ok(()) => {
                    let client = self.query.as_ref().expect("connected");
                    self.rt.block_on(f(client)).map_err(|e| {
                        if client.is_closed() || e.as_db_error().is_none() {
                            unavailable(what, e)
                        } else if e.code().is_some_and(|c| {
                            c.code().starts_with("57") || c.code().starts_with("08")
                        }) {
                            unavailable(what, db_message(&e))
                        } else {
                            SourceError::Invalid(format!("{what}: {}", db_message(&e)))
                        }
                    })
                }
                Err(e) => Err(e),
            };
            match attempt {
                Err(e) if e.is_transient() && Instant::now() < deadline => {
                    tracing::warn!("{e}; retrying");
                    self.query = None;
                    std::thread::sleep(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    fn load_tables(&mut self, pipeline: &PipelineConfig) -> Result<(), SourceError> {
        let publication = self.config.publication.clone();
        let exists = self.with_client("reading the publication", |c| {
            let p = publication.clone();
            Box::pin(async move { catalog::publication_exists(c, &p).await })
        })?;
        let names = if exists {
            self.with_client("reading the publication's tables", |c| {
                let p = publication.clone();
                Box::pin(async move { catalog::publication_tables(c, &p).await })
            })?
        } else if self.config.create_publication_for.is_empty() {
            return Err(SourceError::Config(format!(
                "publication `{publication}` does not exist: create it \
                 (CREATE PUBLICATION {publication} FOR TABLE ...) or list the tables under \
                 source.postgres.create_publication_for"
            )));
        } else {
            let wanted = self.config.create_publication_for.clone();
            self.with_client("listing the tables to publish", |c| {
                let wanted = wanted.clone();
                Box::pin(async move { catalog::resolve_tables(c, &wanted).await })
            })?
        };
        if names.is_empty() {
            return Err(SourceError::Config(format!(
                "publication `{publication}` has no tables"
            )));
        }
        let mut sorted = names;
        sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in sorted {
            let n = name.clone();
            let info = self
                .with_client("reading a table's columns", |c| {
                    let n = n.clone();
                    Box::pin(async move { catalog::load_table(c, &n).await })
                })?
                .ok_or_else(|| SourceError::Config(format!("table {name} does not exist")))?;
            let table = self.make_table(info, pipeline)?;
            self.by_name.insert(name, self.tables.len());
            self.tables.push(table);
        }
        Ok(())
    }

    fn make_table(
        &self,
        mut info: PgTableInfo,
        pipeline: &PipelineConfig,
    ) -> Result<Table, SourceError> {
        let name = info.qualified();
        let append = pipeline
            .tables
            .get(&name)
            .is_some_and(|t| t.mode == TableMode::Append);
        if let Some(declared) = self.config.keys.get(&name) {
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
        for &k in &info.key {
            if !info.columns[k].kind.keyable() {
                return Err(SourceError::Config(format!(
                    "table {name}: key column `{}` has a type weir cannot order a backfill by",
                    info.columns[k].name
                )));
            }
        }
        let schema = Arc::new(TableSchema {
            name: name.clone(),
            columns: info
                .columns
                .iter()
                .map(|c| Column {
                    name: c.name.clone(),
                    data_type: c.kind.data_type(),
                    nullable: !c.not_null,
                })
                .collect(),
            key: if append { Vec::new() } else { info.key.clone() },
        });
        Ok(Table {
            info,
            schema,
            append,
        })
    }

    fn replication_config(&self) -> Result<ReplicationConfig, SourceError> {
        let host = match self.dsn.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => "localhost".to_string(),
        };
        let port = self.dsn.get_ports().first().copied().unwrap_or(5432);
        let user = self
            .dsn
            .get_user()
            .map(str::to_string)
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_default();
        let password = self
            .dsn
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let dbname = self
            .dsn
            .get_dbname()
            .map(str::to_string)
            .unwrap_or_else(|| user.clone());
        Ok(ReplicationConfig::new(
            host,
            user,
            password,
            dbname,
            self.config.slot.clone(),
            self.config.publication.clone(),
        )
        .with_port(port)
        .with_start_lsn(Lsn::ZERO)
        .with_ack_lsn(Lsn::from_u64(self.acked))
        .with_status_interval(Duration::from_millis(self.config.status_interval_ms))
        .with_wakeup_interval(Duration::from_millis(self.config.status_interval_ms))
        .with_options(session_options())
        .with_application_name("weir"))
    }

    // ------------------------------------------------------------ backfill

    fn start_backfill(&mut self, from: Option<(usize, Vec<String>)>, snapshot: Option<String>) {
        let (first, key) = match from {
            Some((t, k)) => (t, Some(k)),
            None => (0, None),
        };
        self.backfill = Some(Backfill {
            queue: (first..self.tables.len()).collect(),
            after_key: key,
            rows: 0,
            snapshot,
            in_snapshot_tx: false,
            bar: None,
        });
    }

    /// The next chunk of the backfill as one transaction; None once done.
    fn next_chunk(&mut self) -> Result<Option<Transaction>, SourceError> {
        loop {
            let Some(bf) = self.backfill.as_mut() else {
                return Ok(None);
            };
            let Some(&t) = bf.queue.first() else {
                let snapshot_tx = bf.in_snapshot_tx;
                self.backfill = None;
                if snapshot_tx {
                    let _ = self.with_client("ending the backfill snapshot", |c| {
                        Box::pin(async move { c.batch_execute("COMMIT").await })
                    });
                }
                tracing::info!("backfill complete; streaming");
                return Ok(None);
            };
            if bf.snapshot.is_some() && !bf.in_snapshot_tx {
                let name = bf.snapshot.clone().unwrap_or_default();
                let sql = format!(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
                    literal(&name)
                );
                self.with_client("importing the slot's snapshot", |c| {
                    let sql = sql.clone();
                    Box::pin(async move { c.batch_execute(&sql).await })
                })?;
                let bf = self.backfill.as_mut().expect("set");
                bf.in_snapshot_tx = true;
                tracing::info!(snapshot = %name, "backfill reads the slot's exported snapshot");
            }
            let progress = self.progress;
            let bf = self.backfill.as_mut().expect("set");
            let table = &self.tables[t];
            if bf.bar.is_none() && progress {
                let estimate = table.info.estimated_rows;
                let bar = if estimate > 0.0 {
                    indicatif::ProgressBar::new(estimate as u64)
                } else {
                    indicatif::ProgressBar::new_spinner()
                };
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "backfill {msg} [{bar:30}] {pos}/~{len} rows ({per_sec})",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                bar.set_message(table.info.qualified());
                bf.bar = Some(bar);
            }
            let limit = self.config.chunk_rows;
            let key_exprs = table.key_order_exprs();
            let mut select: Vec<String> = table
                .info
                .columns
                .iter()
                .map(|c| format!("w.{}", ident(&c.name)))
                .collect();
            select.extend(key_exprs.iter().cloned());
            let filter = match &bf.after_key {
                Some(key) => format!(
                    " WHERE ({}) > ({})",
                    key_exprs.join(", "),
                    table.key_order_literals(key).join(", ")
                ),
                None => String::new(),
            };
            let sql = format!(
                "COPY (SELECT {} FROM {} AS w{filter} ORDER BY {} LIMIT {limit}) TO STDOUT",
                select.join(", "),
                table.info.sql_name(),
                key_exprs.join(", "),
            );
            let in_tx = bf.in_snapshot_tx;
            let data = self.with_client("reading a backfill chunk", |c| {
                let sql = sql.clone();
                Box::pin(async move { copy_out(c, &sql).await })
            });
            let data = match data {
                Ok(d) => d,
                Err(e) if in_tx && e.is_transient() => {
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            let table = &self.tables[t];
            let bf = self.backfill.as_mut().expect("set");
            let commit_ts = now_micros();
            let mut changes = Vec::new();
            for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let fields = copy_fields(line).map_err(SourceError::Invalid)?;
                let values = table
                    .info
                    .columns
                    .iter()
                    .zip(&fields)
                    .map(|(c, f)| match f {
                        None => Ok(Value::Null),
                        Some(text) => decode(&c.kind, text).map_err(|e| {
                            SourceError::Invalid(format!(
                                "table {} column {}: {e}",
                                table.info.qualified(),
                                c.name
                            ))
                        }),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let width = table.info.columns.len();
                let key_text: Vec<String> = fields[width..]
                    .iter()
                    .map(|f| f.clone().unwrap_or_default())
                    .collect();
                let key = encode_key(&table.key_orders(), &key_text).map_err(|e| {
                    SourceError::Invalid(format!("table {}: key: {e}", table.info.qualified()))
                })?;
                let pos = Position::snapshot(&table.schema.name, &key);
                bf.rows += 1;
                bf.after_key = Some(key_text);
                changes.push(Change {
                    table: table.schema.clone(),
                    op: Op::Read,
                    pos,
                    commit_ts_micros: commit_ts,
                    snapshot: true,
                    values,
                });
            }
            let read = changes.len();
            if let Some(bar) = &bf.bar {
                bar.inc(read as u64);
            }
            if read < limit {
                // The table is done.
                if let Some(bar) = bf.bar.take() {
                    bar.finish();
                }
                tracing::info!(table = %table.schema.name, "backfill of the table complete");
                bf.queue.remove(0);
                bf.after_key = None;
                bf.rows = 0;
            }
            if changes.is_empty() {
                continue;
            }
            let end = changes.last().expect("not empty").pos.clone();
            self.skip_until = Some(end.clone());
            return Ok(Some(Transaction { changes, end }));
        }
    }

    // ------------------------------------------------------------ stream

    fn connect_stream(&mut self) -> Result<(), SourceError> {
        let deadline = Instant::now() + Duration::from_millis(self.config.reconnect_timeout_ms);
        loop {
            self.check_slot_and_publication()?;
            let cfg = self.replication_config()?;
            let attempt = self.rt.block_on(async {
                let mut client = ReplicationClient::connect(cfg).await?;
                client.wait_started().await?;
                Ok::<_, pgwire_replication::PgWireError>(client)
            });
            match attempt {
                Ok(client) => {
                    self.stream = Some(client);
                    self.relations.clear();
                    self.open = None;
                    self.last_event = Instant::now();
                    tracing::info!(slot = %self.config.slot, "streaming from the slot");
                    return Ok(());
                }
                Err(e) => {
                    let text = e.to_string();
                    let retry = e.is_transient()
                        || text.contains("55006")
                        || text.contains("is active for PID")
                        || text.contains("57P03")
                        || text.contains("the database system is");
                    if retry && Instant::now() < deadline {
                        tracing::warn!("cannot start streaming yet ({text}); retrying");
                        std::thread::sleep(Duration::from_millis(500));
                        continue;
                    }
                    return Err(unavailable("cannot start streaming from the slot", text));
                }
            }
        }
    }

    /// The replication slot (if it exists) and whether the publication does.
    fn slot_and_publication(&mut self) -> Result<(Option<catalog::SlotInfo>, bool), SourceError> {
        let slot_name = self.config.slot.clone();
        let publication = self.config.publication.clone();
        self.with_client("checking the slot", |c| {
            let s = slot_name.clone();
            let p = publication.clone();
            Box::pin(async move {
                Ok((
                    catalog::slot(c, &s).await?,
                    catalog::publication_exists(c, &p).await?,
                ))
            })
        })
    }

    fn check_slot_and_publication(&mut self) -> Result<(), SourceError> {
        let (slot_name, publication) = (self.config.slot.clone(), self.config.publication.clone());
        let (slot, publication_exists) = self.slot_and_publication()?;
        let position = self.skip_until.clone().unwrap_or_default();
        if slot.is_none() {
            return Err(SourceError::Resume {
                position,
                reason: format!(
                    "replication slot `{slot_name}` no longer exists, but this pipeline has already \
                     started from it: the changes it held are gone, and weir will not silently \
                     backfill again. To start over, delete the sinks' data and the state directory \
                     (or use a new pipeline id) and run again; weir then creates the slot and backfills"
                ),
            });
        }
        if !publication_exists {
            return Err(SourceError::Resume {
                position,
                reason: format!(
                    "publication `{publication}` no longer exists, but this pipeline has already \
                     started from it. Re-create it with the same tables \
                     (CREATE PUBLICATION {publication} FOR TABLE ...) and run again"
                ),
            });
        }
        Ok(())
    }

    fn lost_stream(&mut self, why: String) {
        tracing::warn!("replication stream lost ({why}); reconnecting");
        if let Some(mut client) = self.stream.take() {
            client.abort();
        }
        self.open = None;
        self.relations.clear();
    }

    /// The next whole transaction from the stream, or an empty one standing
    /// at a heartbeat position after a quiet spell.
    fn stream_next(&mut self) -> Result<Option<Transaction>, SourceError> {
        let mut deadline = Instant::now() + Duration::from_millis(200);
        loop {
            if self.done {
                return Ok(None);
            }
            if self.stream.is_none() {
                self.connect_stream()?;
            }
            if self.open.is_none()
                && let Some(target) = self.target
                && self.reached >= target
            {
                self.done = true;
                if let Some(tx) = self.idle_tx() {
                    return Ok(Some(tx));
                }
                return Ok(None);
            }
            if self.config.heartbeat_ms > 0
                && self.last_event.elapsed() >= Duration::from_millis(self.config.heartbeat_ms)
            {
                self.last_event = Instant::now();
                let _ = self.with_client("writing a heartbeat message", |c| {
                    Box::pin(async move {
                        c.batch_execute(
                            "SELECT pg_logical_emit_message(false, 'weir.heartbeat', '')",
                        )
                        .await
                    })
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                match self.idle_tx() {
                    Some(tx) => return Ok(Some(tx)),
                    // No position to stand at yet: wait on.
                    None => {
                        deadline = Instant::now() + Duration::from_millis(200);
                        continue;
                    }
                }
            }
            let client = self.stream.as_mut().expect("connected");
            let event = self
                .rt
                .block_on(async { tokio::time::timeout(left, client.recv()).await });
            let event = match event {
                Err(_) => continue,
                Ok(Err(e)) => {
                    let text = e.to_string();
                    if text.contains("does not exist") {
                        return Err(SourceError::Resume {
                            position: self.skip_until.clone().unwrap_or_default(),
                            reason: format!("the server stopped the stream: {text}"),
                        });
                    }
                    self.lost_stream(text);
                    continue;
                }
                Ok(Ok(None)) => {
                    self.lost_stream("the server ended the stream".into());
                    continue;
                }
                Ok(Ok(Some(event))) => event,
            };
            match event {
                ReplicationEvent::KeepAlive { wal_end, .. } if self.open.is_none() => {
                    self.at_heartbeat(wal_end.as_u64());
                }
                ReplicationEvent::Begin {
                    final_lsn,
                    commit_time_micros,
                    ..
                } => {
                    self.last_event = Instant::now();
                    self.open = Some(OpenTx {
                        commit_lsn: final_lsn.as_u64(),
                        commit_ts: commit_time_micros + PG_EPOCH_MICROS,
                        changes: Vec::new(),
                    });
                }
                ReplicationEvent::XLogData { data, .. } => self.on_data(&data)?,
                ReplicationEvent::Commit { end_lsn, .. } => {
                    self.last_event = Instant::now();
                    self.reached = self.reached.max(end_lsn.as_u64());
                    if let Some(tx) = self.finish()? {
                        return Ok(Some(tx));
                    }
                }
                ReplicationEvent::Message {
                    transactional: false,
                    lsn,
                    ..
                } if self.open.is_none() => {
                    self.at_heartbeat(lsn.as_u64());
                }
                _ => {}
            }
        }
    }

    /// Everything before `lsn` has been sent (a keepalive's or a message's
    /// position, received between transactions).
    fn at_heartbeat(&mut self, lsn: u64) {
        if lsn == 0 {
            return;
        }
        self.reached = self.reached.max(lsn);
        let pos = Position::stream(lsn - 1, u32::MAX);
        if self.skip_until.as_ref().is_none_or(|s| pos > *s)
            && self.heartbeat.as_ref().is_none_or(|h| pos > *h)
        {
            self.heartbeat = Some(pos);
        }
    }

    fn idle_tx(&mut self) -> Option<Transaction> {
        if let Some(hb) = self.heartbeat.take()
            && self.skip_until.as_ref().is_none_or(|s| hb > *s)
        {
            self.skip_until = Some(hb.clone());
            return Some(Transaction {
                changes: Vec::new(),
                end: hb,
            });
        }
        self.skip_until.clone().map(|end| Transaction {
            changes: Vec::new(),
            end,
        })
    }

    fn on_data(&mut self, data: &[u8]) -> Result<(), SourceError> {
        let message = pgoutput::parse(data).map_err(SourceError::Invalid)?;
        match message {
            Message::Relation(rel) => self.on_relation(rel),
            Message::Insert { oid, new } => {
                let (table, values, unchanged) = self.row(oid, &new, None)?;
                self.push(table, Op::Insert, values, unchanged, &new)
            }
            Message::Update { oid, old, new } => {
                let old_row = match &old {
                    Some((b'O', tuple)) => Some(tuple),
                    _ => None,
                };
                let (table, values, unchanged) = self.row(oid, &new, old_row)?;
                if let Some((_, old_tuple)) = &old {
                    // A changed key: the row leaves its old key.
                    let (_, old_values, _) = self.row(oid, old_tuple, None)?;
                    let key = &self.tables[table].info.key;
                    if !self.tables[table].append && key.iter().any(|&k| old_values[k] != values[k])
                    {
                        let mut gone = vec![Value::Null; old_values.len()];
                        for &k in key {
                            gone[k] = old_values[k].clone();
                        }
                        self.push(table, Op::Delete, gone, Vec::new(), old_tuple)?;
                    }
                }
                self.push(table, Op::Update, values, unchanged, &new)
            }
            Message::Delete { oid, old } => {
                let (table, values, _) = self.row(oid, &old.1, None)?;
                let mut gone = vec![Value::Null; values.len()];
                for &k in &self.tables[table].info.key {
                    gone[k] = values[k].clone();
                }
                if self.tables[table].append {
                    gone = values;
                }
                self.push(table, Op::Delete, gone, Vec::new(), &old.1)
            }
            Message::Truncate { oids } => {
                let names: Vec<String> = oids
                    .iter()
                    .filter_map(|o| self.relations.get(o))
                    .map(|m| self.tables[m.table].schema.name.clone())
                    .collect();
                Err(SourceError::Invalid(format!(
                    "TRUNCATE of {} in the transaction committed at LSN {}: weir does not replicate \
                     TRUNCATE (the sinks would keep the rows). Empty the destination tables by hand, \
                     or drop the table from the publication (ALTER PUBLICATION ... SET (publish = \
                     'insert, update, delete')) and run again",
                    if names.is_empty() {
                        "a table".to_string()
                    } else {
                        names.join(", ")
                    },
                    format_lsn(self.open.as_ref().map_or(0, |o| o.commit_lsn))
                )))
            }
            Message::Other(_) => Ok(()),
        }
    }

    fn push(
        &mut self,
        table: usize,
        op: Op,
        values: Vec<Value>,
        unchanged: Vec<usize>,
        tuple: &[Datum],
    ) -> Result<(), SourceError> {
        let mapping = &self.relations[&self.tables[table].info.oid];
        let key_text = self.tables[table]
            .info
            .key
            .iter()
            .map(|&k| {
                mapping
                    .columns
                    .iter()
                    .position(|&c| c == k)
                    .and_then(|i| match tuple.get(i) {
                        Some(Datum::Text(t)) => Some(t.clone()),
                        _ => None,
                    })
                    .unwrap_or_default()
            })
            .collect();
        let open = self.open.as_mut().ok_or_else(|| {
            SourceError::Invalid("a row change arrived outside a transaction".into())
        })?;
        open.changes.push(Pending {
            table,
            op,
            values,
            unchanged,
            key_text,
        });
        Ok(())
    }

    /// Decodes a tuple into the table's column order. Returns the table,
    /// the values, and the columns pgoutput left out as unchanged TOAST
    /// (filled from `old` when it has them).
    fn row(
        &self,
        oid: u32,
        tuple: &[Datum],
        old: Option<&Vec<Datum>>,
    ) -> Result<(usize, Vec<Value>, Vec<usize>), SourceError> {
        let mapping = self.relations.get(&oid).ok_or_else(|| {
            SourceError::Invalid(format!(
                "a change to relation {oid} arrived before its description"
            ))
        })?;
        let table = &self.tables[mapping.table];
        let mut values = vec![Value::Null; table.info.columns.len()];
        let mut unchanged = Vec::new();
        for (i, datum) in tuple.iter().enumerate() {
            let Some(&column) = mapping.columns.get(i) else {
                return Err(SourceError::Invalid(format!(
                    "table {}: a row has more columns than its description",
                    table.schema.name
                )));
            };
            let datum = match (datum, old.and_then(|o| o.get(i))) {
                (Datum::Unchanged, Some(d @ Datum::Text(_))) => d,
                (d, _) => d,
            };
            values[column] = match datum {
                Datum::Null => Value::Null,
                Datum::Unchanged => {
                    unchanged.push(column);
                    Value::Null
                }
                Datum::Text(text) => {
                    let c = &table.info.columns[column];
                    decode(&c.kind, text).map_err(|e| {
                        SourceError::Invalid(format!(
                            "table {} column {}: {e}",
                            table.schema.name, c.name
                        ))
                    })?
                }
            };
        }
        Ok((mapping.table, values, unchanged))
    }

    /// A Relation message: map its columns onto the table's, carrying added
    /// columns and refusing any other change of shape.
    fn on_relation(&mut self, rel: Relation) -> Result<(), SourceError> {
        let name = rel.qualified();
        let Some(&index) = self.by_name.get(&name) else {
            return Err(SourceError::Invalid(format!(
                "table {name} joined publication `{}` while weir was running: restart weir to \
                 backfill it and stream it",
                self.config.publication
            )));
        };
        let known = self.tables[index].info.columns.len();
        let mut columns = Vec::with_capacity(rel.columns.len());
        let mut added = Vec::new();
        for (i, rc) in rel.columns.iter().enumerate() {
            let table = &self.tables[index];
            match table.info.columns.iter().position(|c| c.name == rc.name) {
                Some(c) => {
                    let col = &table.info.columns[c];
                    if col.type_oid != rc.type_oid || (col.typmod != rc.typmod && rc.typmod != -1) {
                        return Err(ddl_error(
                            &name,
                            &format!("the type of column `{}` changed", rc.name),
                        ));
                    }
                    columns.push(c);
                }
                None if i >= known => {
                    added.push(rc.clone());
                    columns.push(known + added.len() - 1);
                }
                None => {
                    return Err(ddl_error(
                        &name,
                        &format!(
                            "column `{}` is new but not at the end, or another column was dropped or \
                             renamed",
                            rc.name
                        ),
                    ));
                }
            }
        }
        // Known columns the relation lacks must be trailing ones the table
        // gained after this part of the stream (they read as null here).
        if columns.iter().enumerate().any(|(i, &c)| i != c) {
            return Err(ddl_error(
                &name,
                "a column was dropped, renamed or reordered",
            ));
        }
        if !added.is_empty() {
            for rc in added {
                let oid = rc.type_oid;
                let typmod = rc.typmod;
                let (kind, sql_type) = self.with_client("reading an added column's type", |c| {
                    Box::pin(async move { catalog::type_kind(c, oid, typmod).await })
                })?;
                tracing::warn!(table = %name, column = %rc.name, "column added; the sinks get it as a new nullable column");
                let table = &mut self.tables[index];
                table.info.columns.push(PgColumn {
                    name: rc.name.clone(),
                    type_oid: rc.type_oid,
                    typmod: rc.typmod,
                    kind,
                    sql_type,
                    not_null: false,
                });
            }
            let table = &mut self.tables[index];
            let mut schema = (*table.schema).clone();
            for c in &table.info.columns[schema.columns.len()..] {
                schema.columns.push(Column {
                    name: c.name.clone(),
                    data_type: c.kind.data_type(),
                    nullable: true,
                });
            }
            table.schema = Arc::new(schema);
            self.save_schema();
        }
        self.relations.insert(
            rel.oid,
            Mapping {
                table: index,
                columns,
            },
        );
        if self.tables[index].info.oid != rel.oid {
            // The table was dropped and created again under the same name.
            return Err(ddl_error(&name, "the table was dropped and re-created"));
        }
        Ok(())
    }

    /// Closes the open transaction: fills unchanged TOAST values, numbers
    /// the changes, and drops what lies at or before `skip_until`.
    fn finish(&mut self) -> Result<Option<Transaction>, SourceError> {
        let Some(mut open) = self.open.take() else {
            return Ok(None);
        };
        self.fill_unchanged(&mut open)?;
        let mut changes = Vec::with_capacity(open.changes.len());
        for (ordinal, p) in open.changes.into_iter().enumerate() {
            let pos = Position::stream(open.commit_lsn, ordinal as u32);
            if self.skip_until.as_ref().is_some_and(|s| pos <= *s) {
                continue;
            }
            let table = &self.tables[p.table];
            let mut values = p.values;
            values.resize(table.info.columns.len(), Value::Null);
            changes.push(Change {
                table: table.schema.clone(),
                op: p.op,
                pos,
                commit_ts_micros: open.commit_ts,
                snapshot: false,
                values,
            });
        }
        let end = match changes.last() {
            Some(c) => c.pos.clone(),
            None => {
                // Nothing new for us in it: stand after it.
                let pos = Position::stream(open.commit_lsn, u32::MAX);
                if self.skip_until.as_ref().is_some_and(|s| pos <= *s) {
                    return Ok(None);
                }
                pos
            }
        };
        self.skip_until = Some(end.clone());
        self.heartbeat = None;
        Ok(Some(Transaction { changes, end }))
    }

    fn fill_unchanged(&mut self, open: &mut OpenTx) -> Result<(), SourceError> {
        let mut wanted: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, p) in open.changes.iter().enumerate() {
            if !p.unchanged.is_empty() {
                wanted.entry(p.table).or_default().push(i);
            }
        }
        for (t, indexes) in wanted {
            let table = &self.tables[t];
            if table.info.key.is_empty() {
                return Err(SourceError::Invalid(format!(
                    "table {}: an update left a TOASTed column out and the table has no key to \
                     read it by; set REPLICA IDENTITY FULL on it",
                    table.schema.name
                )));
            }
            let columns: Vec<usize> = (0..table.info.columns.len()).collect();
            let key_exprs = table.key_exprs();
            let key_types = table.key_types();
            let nkey = table.info.key.len();
            let statements: Vec<String> = indexes
                .chunks(200)
                .map(|group| {
                    let keys: Vec<String> = group
                        .iter()
                        .map(|&i| {
                            format!(
                                "({})",
                                open.changes[i]
                                    .key_text
                                    .iter()
                                    .zip(&key_types)
                                    .map(|(k, ty)| format!("{}::{ty}", literal(k)))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        })
                        .collect();
                    format!(
                        "SELECT {}, {} FROM {} AS w WHERE ({}) IN ({})",
                        table
                            .info
                            .key
                            .iter()
                            .map(|&k| format!("w.{}", ident(&table.info.columns[k].name)))
                            .collect::<Vec<_>>()
                            .join(", "),
                        columns
                            .iter()
                            .map(|&c| format!("w.{}", ident(&table.info.columns[c].name)))
                            .collect::<Vec<_>>()
                            .join(", "),
                        table.info.sql_name(),
                        key_exprs.join(", "),
                        keys.join(", ")
                    )
                })
                .collect();
            let mut found: HashMap<Vec<String>, Vec<Option<String>>> = HashMap::new();
            for sql in statements {
                let rows = self.with_client("reading unchanged TOAST values", |c| {
                    let sql = sql.clone();
                    Box::pin(async move { catalog::rows(c, &sql).await })
                })?;
                for row in rows {
                    let key: Vec<String> = row[..nkey]
                        .iter()
                        .map(|k| k.clone().unwrap_or_default())
                        .collect();
                    found.insert(key, row[nkey..].to_vec());
                }
            }
            let table = &self.tables[t];
            for i in indexes {
                let p = &mut open.changes[i];
                // A row gone by now is deleted later in the stream; until
                // then it keeps whatever the sink had.
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
        }
        Ok(())
    }

    fn begin_stream_or_backfill(&mut self, after: Option<&Position>) -> Result<(), SourceError> {
        let (slot_name, publication) = (self.config.slot.clone(), self.config.publication.clone());
        let (slot, publication_exists) = self.slot_and_publication()?;
        if let Some(after) = after
            && (slot.is_none() || !publication_exists)
        {
            self.skip_until = Some(after.clone());
            return self.check_slot_and_publication();
        }
        if !publication_exists {
            let tables: Vec<String> = self.tables.iter().map(|t| t.info.sql_name()).collect();
            let sql = format!(
                "CREATE PUBLICATION {} FOR TABLE {}",
                ident(&publication),
                tables.join(", ")
            );
            self.with_client("creating the publication", |c| {
                let sql = sql.clone();
                Box::pin(async move { c.batch_execute(&sql).await })
            })?;
            tracing::info!(%publication, "publication created");
        }
        if let Some(info) = &slot {
            if info.plugin.as_deref() != Some("pgoutput") {
                return Err(SourceError::Config(format!(
                    "replication slot `{slot_name}` exists but is not a pgoutput logical slot \
                     (plugin {:?}); drop it or name another slot",
                    info.plugin
                )));
            }
            if let Some(db) = &info.database
                && let Some(mine) = self.dsn.get_dbname()
                && db != mine
            {
                return Err(SourceError::Config(format!(
                    "replication slot `{slot_name}` belongs to database `{db}`, not `{mine}`"
                )));
            }
            self.acked = info.confirmed_flush.unwrap_or(0);
        }
        if self.config.exit_when_caught_up {
            let target = self.with_client("reading the current WAL position", |c| {
                Box::pin(async move {
                    catalog::rows(c, "SELECT pg_current_wal_insert_lsn()::text").await
                })
            })?;
            self.target = target
                .first()
                .and_then(|r| r[0].as_deref())
                .and_then(catalog::parse_lsn);
        }
        match after {
            None if slot.is_none() => {
                // First run: create the slot with an exported snapshot on a
                // session that stays open until the backfill has imported it.
                let cfg = self.replication_config()?;
                let sql = format!(
                    "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT",
                    ident(&slot_name)
                );
                let (client, row) = self
                    .rt
                    .block_on(async {
                        let mut client = ReplicationClient::connect_gated(cfg).await?;
                        let rows = client.simple_query(&sql).await?;
                        Ok::<_, pgwire_replication::PgWireError>((client, rows))
                    })
                    .map_err(|e| unavailable("cannot create the replication slot", e))?;
                let text = |i: usize| {
                    row.first()
                        .and_then(|r| r.get(i).cloned().flatten())
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                };
                let consistent = text(1).as_deref().and_then(catalog::parse_lsn).unwrap_or(0);
                self.acked = consistent;
                tracing::info!(slot = %slot_name, consistent_point = %format_lsn(consistent), "replication slot created");
                self.pending_gated = Some(client);
                self.start_backfill(None, text(2));
            }
            None => {
                tracing::info!(
                    slot = %slot_name,
                    "no sink has a position yet: backfilling every table from the current data, \
                     then streaming from the slot's confirmed position"
                );
                self.start_backfill(None, None);
            }
            Some(p) => {
                self.skip_until = Some(p.clone());
                if let Some((table, key)) = p.as_snapshot() {
                    let Some(&t) = self.by_name.get(table) else {
                        return Err(SourceError::Resume {
                            position: p.clone(),
                            reason: format!(
                                "the backfill stopped in table {table}, which the publication no longer has"
                            ),
                        });
                    };
                    let key =
                        decode_key_texts(&self.tables[t].key_orders(), key).ok_or_else(|| {
                            SourceError::Resume {
                                position: p.clone(),
                                reason: format!("not a backfill position of table {table}'s key"),
                            }
                        })?;
                    tracing::info!(%table, "resuming the backfill after the last committed row");
                    self.start_backfill(Some((t, key)), None);
                } else if let Some((lsn, ordinal)) = p.as_stream() {
                    // The first commit LSN the sinks at `p` still need.
                    let needed = if ordinal == u32::MAX { lsn + 1 } else { lsn };
                    if needed < self.acked {
                        tracing::warn!(
                            resume = %format_lsn(lsn),
                            confirmed_flush = %format_lsn(self.acked),
                            "some sink is behind what the slot still holds (an optional sink that \
                             was behind while the required ones were acknowledged): it misses the \
                             changes in between"
                        );
                    }
                } else {
                    return Err(SourceError::Resume {
                        position: p.clone(),
                        reason: "not a position of the Postgres source".into(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn ddl_error(table: &str, what: &str) -> SourceError {
    SourceError::Invalid(format!(
        "table {table}: {what}. weir carries only ADD COLUMN to the sinks; any other DDL on a \
         replicated table stops the pipeline rather than write wrong data. Bring the destination \
         in line by hand (or backfill into a new pipeline) and run again"
    ))
}

fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

fn session_options() -> String {
    decode::SESSION_SETTINGS
        .iter()
        .map(|(k, v)| format!("-c {k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn copy_out(
    client: &tokio_postgres::Client,
    sql: &str,
) -> Result<Vec<u8>, tokio_postgres::Error> {
    use futures::StreamExt;
    let stream = client.copy_out(sql).await?;
    let mut stream = std::pin::pin!(stream);
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

impl Source for PostgresSource {
    fn tables(&self) -> Vec<Arc<TableSchema>> {
        self.tables.iter().map(|t| t.schema.clone()).collect()
    }

    fn resume_after(&mut self, after: Option<&Position>) -> Result<(), SourceError> {
        self.begin_stream_or_backfill(after)?;
        self.save_schema();
        Ok(())
    }

    fn next_transaction(&mut self) -> Result<Option<Transaction>, SourceError> {
        if self.backfill.is_some() {
            if let Some(tx) = self.next_chunk()? {
                return Ok(Some(tx));
            }
            if let Some(mut gated) = self.pending_gated.take() {
                // The slot was created by this run: stream on its session.
                let started = self.rt.block_on(async {
                    gated.start().await?;
                    gated.wait_started().await?;
                    Ok::<_, pgwire_replication::PgWireError>(gated)
                });
                match started {
                    Ok(client) => {
                        self.stream = Some(client);
                        self.last_event = Instant::now();
                    }
                    Err(e) => tracing::warn!(
                        "cannot stream on the slot's first session ({e}); reconnecting"
                    ),
                }
            }
        }
        self.stream_next()
    }

    fn head(&self) -> Option<Position> {
        None
    }

    fn acknowledge(&mut self, pos: &Position) -> Result<(), SourceError> {
        // Backfill positions release nothing: the slot stays at its start.
        // A position standing after a whole transaction (or at a heartbeat),
        // ordinal u32::MAX, covers everything that commits at or before its
        // LSN, so the server may skip those: confirm the next byte. That
        // also lets a stopping server see us caught up with it (it waits for
        // confirmed == sent before shutting down).
        let confirm = match pos.as_stream() {
            Some((lsn, u32::MAX)) => Some(lsn + 1),
            Some((lsn, _)) => Some(lsn),
            None => None,
        };
        if let Some(lsn) = confirm
            && lsn > self.acked
        {
            self.acked = lsn;
            self.acked_at = Some(Instant::now());
            if let Some(client) = &self.stream {
                client.update_applied_lsn(Lsn::from_u64(lsn));
            }
        }
        Ok(())
    }
}

impl Drop for PostgresSource {
    fn drop(&mut self) {
        // Let the last acknowledgement reach the server before the session ends.
        if let Some(at) = self.acked_at
            && self.stream.is_some()
        {
            let due = at + Duration::from_millis(self.config.status_interval_ms + 200);
            let wait = due.saturating_duration_since(Instant::now());
            std::thread::sleep(wait.min(Duration::from_secs(5)));
        }
        if let Some(mut client) = self.stream.take() {
            let _ = self.rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backfill_key_bytes_sort_like_the_backfill_reads_and_give_the_key_back() {
        let orders = vec![
            KeyOrder::Native(PgKind::Int64),
            KeyOrder::Text,
            KeyOrder::Native(PgKind::Decimal {
                precision: 10,
                scale: 2,
            }),
        ];
        let key = |a: &str, b: &str, c: &str| {
            encode_key(&orders, &[a.into(), b.into(), c.into()]).unwrap()
        };
        let sorted = [
            key("-5", "zz", "1.00"),
            key("9", "", "1.00"),
            key("9", "a", "-2.50"),
            key("9", "a", "1.00"),
            key("9", "ab", "0.00"),
            key("10", "a", "0.00"),
        ];
        for pair in sorted.windows(2) {
            assert!(pair[0] < pair[1], "{:?} !< {:?}", pair[0], pair[1]);
        }
        assert_eq!(
            decode_key_texts(&orders, &key("9", "ab", "0.00")).unwrap(),
            vec!["9".to_string(), "ab".into(), "0.00".into()]
        );
        let tid = [KeyOrder::Tid];
        assert!(
            encode_key(&tid, &["(1,10)".into()]).unwrap()
                < encode_key(&tid, &["(2,1)".into()]).unwrap()
        );
    }
}
