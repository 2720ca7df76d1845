//! Shared helpers for the tests against a real PostgreSQL server: the
//! private cluster (scripts/pg), a database per test, SQL through `psql`,
//! and reading Postgres itself and the positioned sink back as rows to
//! compare.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;
use weir_source::change::Value;
use weir_source::postgres::decode::{PgKind, copy_fields, decode};

use crate::common::{self, text, weir, weir_command};

/// Starts the private cluster if needed and returns the admin DSN pieces.
pub struct Pg {
    pub port: String,
}

pub fn cluster() -> Pg {
    let out = Command::new(common::workspace().join("scripts/pg"))
        .arg("start")
        .output()
        .expect("scripts/pg runs");
    assert!(
        out.status.success(),
        "scripts/pg start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dsn = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let port = dsn
        .split_whitespace()
        .find_map(|p| p.strip_prefix("port="))
        .expect("port in the DSN")
        .to_string();
    Pg { port }
}

pub fn restart_cluster() {
    let out = Command::new(common::workspace().join("scripts/pg"))
        .arg("restart")
        .output()
        .expect("scripts/pg runs");
    assert!(
        out.status.success(),
        "scripts/pg restart failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pg {
    /// Over loopback TCP, unless `WEIR_PG_HOST` names another host or the
    /// cluster's socket directory (to run a test or the benchmark over the
    /// Unix socket: see `unix_dsn`).
    pub fn dsn(&self, db: &str) -> String {
        let host = std::env::var("WEIR_PG_HOST").unwrap_or_else(|_| "127.0.0.1".into());
        self.dsn_at(&host, db)
    }

    fn dsn_at(&self, host: &str, db: &str) -> String {
        format!("host={host} port={} user=weir dbname={db}", self.port)
    }

    /// The same database by way of the cluster's Unix socket, as a weir on
    /// the database's own host would connect.
    pub fn unix_dsn(&self, db: &str) -> String {
        let dirs = self.value("weir", "SHOW unix_socket_directories");
        let dir = dirs.split(',').next().unwrap_or_default().trim();
        assert!(
            dir.starts_with('/'),
            "the cluster has no Unix socket directory: {dirs:?}"
        );
        self.dsn_at(dir, db)
    }

    /// A fresh database (and no slot left from an earlier run of the test).
    pub fn fresh_db(&self, db: &str) -> String {
        self.sql(
            "weir",
            &format!(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = '{db}' AND active_pid IS NOT NULL;\n\
                 SELECT pg_sleep(0.5);\n\
                 SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{db}';\n\
                 DROP DATABASE IF EXISTS {db} WITH (FORCE);\nCREATE DATABASE {db};"
            ),
        );
        self.dsn(db)
    }

    /// Runs SQL through psql, stopping at the first error; returns stdout.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        self.try_sql(db, sql)
            .unwrap_or_else(|e| panic!("psql failed: {e}\nSQL: {}", clip(sql)))
    }

    pub fn try_sql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut child = Command::new("psql")
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                &self.dsn(db),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("psql runs");
        // A failing statement ends psql early: its stderr says why.
        let _ = child.stdin.take().unwrap().write_all(sql.as_bytes());
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// One value from a query.
    pub fn value(&self, db: &str, sql: &str) -> String {
        self.sql(db, sql).trim().to_string()
    }

    /// The slot's confirmed_flush_lsn, if the slot exists.
    pub fn confirmed_flush(&self, db: &str, slot: &str) -> Option<u64> {
        let text = self.value(
            db,
            &format!(
                "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
            ),
        );
        parse_lsn(&text)
    }

    /// A table's rows as Postgres has them, keyed by the key columns'
    /// values, decoded with the same kinds the source uses.
    pub fn rows(&self, db: &str, table: &TableDef) -> BTreeMap<String, Vec<Value>> {
        let cols: Vec<String> = table
            .columns
            .iter()
            .map(|(n, _)| format!("{n}::text"))
            .collect();
        let sql = format!(
            "COPY (SELECT {} FROM {}) TO STDOUT",
            cols.join(", "),
            table.name
        );
        let mut child = Command::new("psql")
            .args([
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                &self.dsn(db),
                "-c",
                &sql,
            ])
            .env(
                "PGOPTIONS",
                "-c DateStyle=ISO -c TimeZone=UTC -c bytea_output=hex -c extra_float_digits=3",
            )
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut data = Vec::new();
        std::io::Read::read_to_end(child.stdout.as_mut().unwrap(), &mut data).unwrap();
        assert!(child.wait().unwrap().success());
        let mut out = BTreeMap::new();
        for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let fields = copy_fields(line).unwrap();
            let values: Vec<Value> = table
                .columns
                .iter()
                .zip(fields)
                .map(|((_, kind), f)| match f {
                    None => Value::Null,
                    Some(t) => decode(kind, &t).unwrap(),
                })
                .collect();
            out.insert(table.key_of(&values), values);
        }
        out
    }
}

pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.trim().split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

fn clip(s: &str) -> &str {
    let mut end = s.len().min(2000);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A table under test: its name, columns (with the kind the source maps
/// them to) and key column indexes.
#[derive(Clone)]
pub struct TableDef {
    pub name: String,
    pub columns: Vec<(String, PgKind)>,
    pub key: Vec<usize>,
}

impl TableDef {
    pub fn new(name: &str, columns: &[(&str, PgKind)], key: &[usize]) -> Self {
        TableDef {
            name: name.into(),
            columns: columns
                .iter()
                .map(|(n, k)| (n.to_string(), k.clone()))
                .collect(),
            key: key.to_vec(),
        }
    }

    pub fn key_of(&self, values: &[Value]) -> String {
        format!(
            "{:?}",
            self.key.iter().map(|&k| &values[k]).collect::<Vec<_>>()
        )
    }
}

/// The rows of a positioned-sink table after applying its changes in
/// position order (last write per key wins, deletes remove), plus how many
/// changes were seen twice. Columns the batches lack read as null.
pub fn sink_rows(root: &Path, table: &TableDef) -> (BTreeMap<String, Vec<Value>>, usize) {
    let batches = common::read_positioned(root, &table.name);
    let mut log: Vec<(Vec<u8>, String, Vec<Value>)> = Vec::new();
    for batch in &batches {
        if batch.num_rows() == 0 {
            continue;
        }
        let ops = batch
            .column_by_name("__op")
            .expect("__op")
            .as_string::<i32>()
            .clone();
        let pos = batch
            .column_by_name("__pos")
            .expect("__pos")
            .as_binary::<i32>()
            .clone();
        for row in 0..batch.num_rows() {
            let values = table
                .columns
                .iter()
                .map(|(name, _)| match batch.column_by_name(name) {
                    Some(array) => common::value_at(array.as_ref(), row),
                    None => Value::Null,
                })
                .collect();
            log.push((pos.value(row).to_vec(), ops.value(row).to_string(), values));
        }
    }
    log.sort_by(|a, b| a.0.cmp(&b.0));
    let before = log.len();
    log.dedup_by(|a, b| a.0 == b.0);
    let duplicates = before - log.len();
    let mut state = BTreeMap::new();
    for (_, op, values) in log {
        let key = table.key_of(&values);
        if op == "delete" {
            state.remove(&key);
        } else {
            state.insert(key, values);
        }
    }
    (state, duplicates)
}

/// Compares the sink with Postgres, table by table, row by row.
pub fn assert_sink_equals_postgres(pg: &Pg, db: &str, root: &Path, tables: &[TableDef]) {
    for table in tables {
        let want = pg.rows(db, table);
        let (got, duplicates) = sink_rows(root, table);
        assert_eq!(
            duplicates, 0,
            "{}: the positioned sink holds {duplicates} changes twice",
            table.name
        );
        let missing: Vec<_> = want
            .keys()
            .filter(|k| !got.contains_key(*k))
            .take(3)
            .collect();
        let extra: Vec<_> = got
            .keys()
            .filter(|k| !want.contains_key(*k))
            .take(3)
            .collect();
        let differ: Vec<String> = want
            .iter()
            .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
            .take(2)
            .map(|(k, v)| {
                format!(
                    "{k}:\n  postgres {}\n  sink     {}",
                    clip_dbg(v),
                    clip_dbg(&got[k])
                )
            })
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty() && differ.is_empty(),
            "{}: postgres has {} rows, the sink {}; missing {missing:?}; extra {extra:?}; differing:\n{}",
            table.name,
            want.len(),
            got.len(),
            differ.join("\n")
        );
        println!("{}: {} rows equal", table.name, want.len());
    }
}

fn clip_dbg(v: &[Value]) -> String {
    let s = format!("{v:?}");
    if s.len() > 600 {
        let mut end = 600;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    } else {
        s
    }
}

/// Slots are per cluster: each test database gets its own, `<db>_slot`.
pub fn slot_of(dsn: &str) -> String {
    let db = dsn
        .split_whitespace()
        .find_map(|p| p.strip_prefix("dbname="))
        .expect("dbname in the DSN");
    format!("{db}_slot")
}

/// Writes a pipeline config for the Postgres source into `dir`.
pub struct PgPipeline {
    pub dsn: String,
    pub publication: String,
    pub slot: String,
    pub create_for: Vec<String>,
    pub chunk_rows: usize,
    pub max_rows: usize,
    pub extra_source: String,
    pub extra_top: String,
    /// More entries of `sinks:`, as YAML list items.
    pub extra_sinks: String,
}

impl PgPipeline {
    pub fn new(dsn: &str, tables: &[&str]) -> Self {
        PgPipeline {
            dsn: dsn.into(),
            publication: "weir_pub".into(),
            slot: slot_of(dsn),
            create_for: tables.iter().map(|t| t.to_string()).collect(),
            chunk_rows: 500,
            max_rows: 2000,
            extra_source: String::new(),
            extra_top: String::new(),
            extra_sinks: String::new(),
        }
    }

    /// `exit_when_caught_up` comes from WEIR_PG_EXIT (default false), so one
    /// file serves both the endless runs and the draining run.
    pub fn write(&self, dir: &Path, sink_root: &Path) -> PathBuf {
        let yaml = format!(
            "pipeline: pgtest\nstate_dir: state\nsource:\n  postgres:\n    dsn: \"{}\"\n    publication: {}\n    slot: {}\n    create_publication_for: [{}]\n    chunk_rows: {}\n    status_interval_ms: 200\n    heartbeat_ms: 500\n    reconnect_timeout_ms: 60000\n    exit_when_caught_up: ${{WEIR_PG_EXIT:-false}}\n{}batch: {{ max_rows: {}, linger_ms: 50, heartbeat_ms: 300 }}\n{}sinks:\n  - name: exact\n    plugin: {}\n    blob_store: {{ url: {} }}\n    retries: 1\n{}",
            self.dsn,
            self.publication,
            self.slot,
            self.create_for.join(", "),
            self.chunk_rows,
            self.extra_source,
            self.max_rows,
            self.extra_top,
            common::plugin("weir-fixture-positioned").display(),
            sink_root.display(),
            self.extra_sinks
        );
        let path = dir.join("pipeline.yaml");
        std::fs::write(&path, yaml).unwrap();
        path
    }
}

/// A seeded random stream for workloads and kill delays: the same seed
/// gives the same workload, so a failing run can be replayed.
pub struct Rng(ChaCha8Rng);

impl Rng {
    pub fn seeded(seed: u64) -> Self {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }
    pub fn next(&mut self) -> u64 {
        self.0.random()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n.max(1))
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// ------------------------------------------------------------ workload

pub const SCHEMA: &str = r#"
CREATE SCHEMA shop;
CREATE TABLE shop.customers (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    email varchar(80),
    balance numeric(12,2),
    active boolean,
    born date,
    updated_at timestamptz,
    seen_at timestamp,
    uid uuid,
    prefs jsonb,
    tags text[],
    scores int4[],
    avatar bytea,
    small int2,
    ratio float8,
    exact numeric
);
CREATE TABLE shop.orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL,
    amount numeric(10,2) NOT NULL,
    note text,
    meta json,
    placed_at timestamptz NOT NULL
);
CREATE TABLE shop.items (
    order_id bigint,
    line int4,
    sku text NOT NULL,
    qty int4 NOT NULL,
    PRIMARY KEY (order_id, line)
);
CREATE TABLE shop.docs (
    id int4 PRIMARY KEY,
    title text NOT NULL,
    body text
);
ALTER TABLE shop.docs ALTER COLUMN body SET STORAGE EXTERNAL;
"#;

pub const TABLES: [&str; 4] = ["shop.customers", "shop.docs", "shop.items", "shop.orders"];

pub fn table_defs(with_priority: bool) -> Vec<TableDef> {
    use PgKind::*;
    let mut orders = vec![
        ("id", Int64),
        ("customer_id", Int64),
        (
            "amount",
            Decimal {
                precision: 10,
                scale: 2,
            },
        ),
        ("note", Text),
        ("meta", Text),
        ("placed_at", TimestampTz),
    ];
    if with_priority {
        orders.push(("priority", Int32));
    }
    vec![
        TableDef::new(
            "shop.customers",
            &[
                ("id", Int64),
                ("name", Text),
                ("email", Text),
                (
                    "balance",
                    Decimal {
                        precision: 12,
                        scale: 2,
                    },
                ),
                ("active", Bool),
                ("born", Date),
                ("updated_at", TimestampTz),
                ("seen_at", Timestamp),
                ("uid", Uuid),
                ("prefs", Text),
                ("tags", Array(Box::new(Text))),
                ("scores", Array(Box::new(Int32))),
                ("avatar", Bytea),
                ("small", Int32),
                ("ratio", Float64),
                (
                    "exact",
                    weir_source::postgres::decode::UNCONSTRAINED_NUMERIC,
                ),
            ],
            &[0],
        ),
        TableDef::new("shop.orders", &orders, &[0]),
        TableDef::new(
            "shop.items",
            &[
                ("order_id", Int64),
                ("line", Int32),
                ("sku", Text),
                ("qty", Int32),
            ],
            &[0, 1],
        ),
        TableDef::new(
            "shop.docs",
            &[("id", Int32), ("title", Text), ("body", Text)],
            &[0],
        ),
    ]
}

fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A customer row's values as SQL, some of them null.
fn customer_values(rng: &mut Rng, id: u64) -> String {
    fn maybe(null: bool, v: String) -> String {
        if null { "NULL".to_string() } else { v }
    }
    let name = lit(&format!("Name {id} O'Brien ✓ {}", rng.below(1000)));
    let email = maybe(rng.chance(15), lit(&format!("c{id}@example.com")));
    let balance = maybe(
        rng.chance(15),
        format!(
            "{}.{:02}",
            rng.below(100_000) as i64 - 50_000,
            rng.below(100)
        ),
    );
    let active = maybe(rng.chance(15), (rng.below(2) == 0).to_string());
    let born = maybe(
        rng.chance(15),
        format!("date '1950-01-01' + {}", rng.below(25_000)),
    );
    let updated = maybe(
        rng.chance(15),
        format!(
            "timestamptz '2024-01-01 00:00:00+00' + interval '{} microseconds'",
            rng.below(10_000_000_000_000)
        ),
    );
    let seen = maybe(
        rng.chance(15),
        format!(
            "timestamp '1999-12-31 23:00:00' + interval '{} seconds'",
            rng.below(100_000_000)
        ),
    );
    let uid = maybe(rng.chance(15), "gen_random_uuid()".to_string());
    let prefs = maybe(
        rng.chance(15),
        lit(&format!(
            r#"{{"theme": "dark", "n": {}, "list": [1, "two", null], "q": "a\"b"}}"#,
            rng.below(100)
        )),
    );
    let tags = maybe(
        rng.chance(15),
        format!(
            "ARRAY[{}, NULL, {}]::text[]",
            lit(&format!("t{}", rng.below(9))),
            lit("with, comma \"quoted\"")
        ),
    );
    let scores = maybe(
        rng.chance(15),
        format!("ARRAY[{}, {}, -3]", rng.below(100), rng.below(100)),
    );
    let avatar = maybe(
        rng.chance(15),
        format!("decode('{:08x}00ff', 'hex')", rng.next() as u32),
    );
    let small = maybe(
        rng.chance(15),
        (rng.below(60_000) as i64 - 30_000).to_string(),
    );
    let ratio = maybe(rng.chance(15), format!("{}::float8 / 7", rng.below(1000)));
    let exact = maybe(
        rng.chance(15),
        format!("{}.{}", rng.below(1_000_000_000), rng.below(1_000_000)),
    );
    format!(
        "({id}, {name}, {email}, {balance}, {active}, {born}, {updated}, {seen}, {uid}, {prefs}, {tags}, {scores}, {avatar}, {small}, {ratio}, {exact})"
    )
}

const BIG_BODY: &str = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 700))";

/// The initial contents, read by the backfill.
pub fn initial_load(customers: u64, orders: u64, docs: u64, rng: &mut Rng) -> String {
    let mut sql = String::new();
    for chunk in (1..=customers).collect::<Vec<_>>().chunks(500) {
        let rows: Vec<String> = chunk.iter().map(|&id| customer_values(rng, id)).collect();
        sql.push_str(&format!(
            "INSERT INTO shop.customers VALUES {};\n",
            rows.join(",\n")
        ));
    }
    sql.push_str(&format!(
        "INSERT INTO shop.orders SELECT g, 1 + g % {customers}, (g % 1000) + 0.25, 'note ' || g, \
         json_build_object('g', g), timestamptz '2024-06-01 00:00:00+00' + g * interval '1 minute' \
         FROM generate_series(1, {orders}) g;\n\
         INSERT INTO shop.items SELECT o, l, 'sku-' || o || '-' || l, l FROM generate_series(1, {orders}) o, generate_series(1, 3) l;\n"
    ));
    sql.push_str(&format!(
        "INSERT INTO shop.docs SELECT g, 'title ' || g, {BIG_BODY} FROM generate_series(1, {docs}) g;\n"
    ));
    sql
}

/// `n` random transactions over every table: inserts, updates, deletes,
/// key changes, orders with their items in one transaction, title-only
/// updates of documents whose bodies are TOASTed.
pub fn workload(rng: &mut Rng, n: usize, id_base: u64, with_priority: bool) -> String {
    let mut sql = String::new();
    for i in 0..n {
        let new_id = id_base + i as u64;
        sql.push_str("BEGIN;\n");
        for _ in 0..1 + rng.below(4) {
            match rng.below(10) {
                0 | 1 => {
                    let id = 1 + rng.below(id_base);
                    sql.push_str(&format!(
                        "INSERT INTO shop.customers VALUES {} ON CONFLICT (id) DO NOTHING;\n",
                        customer_values(rng, id)
                    ))
                }
                2 => {
                    let id = 1 + rng.below(id_base);
                    sql.push_str(&format!(
                        "UPDATE shop.customers SET balance = {}.{:02}, tags = ARRAY['u{}'], prefs = '{{\"v\": {}}}' WHERE id = {id};\n",
                        rng.below(1000),
                        rng.below(100),
                        rng.below(99),
                        rng.below(99)
                    ));
                }
                3 => sql.push_str(&format!(
                    "DELETE FROM shop.customers WHERE id = {};\n",
                    1 + rng.below(id_base)
                )),
                4 | 5 => {
                    let priority = if with_priority {
                        format!(", {}", rng.below(5))
                    } else {
                        String::new()
                    };
                    let cols = if with_priority { ", priority" } else { "" };
                    sql.push_str(&format!(
                        "INSERT INTO shop.orders (id, customer_id, amount, note, meta, placed_at{cols}) VALUES ({new_id}, {}, {}.{:02}, {}, '{{\"n\": {i}}}', now(){priority}) ON CONFLICT DO NOTHING;\n",
                        1 + rng.below(id_base),
                        rng.below(5000),
                        rng.below(100),
                        if rng.chance(30) { "NULL".to_string() } else { lit(&format!("order {new_id}")) }
                    ));
                    for line in 1..=1 + rng.below(3) {
                        sql.push_str(&format!(
                            "INSERT INTO shop.items VALUES ({new_id}, {line}, 'sku-{}', {}) ON CONFLICT DO NOTHING;\n",
                            rng.below(500),
                            1 + rng.below(9)
                        ));
                    }
                }
                6 => {
                    let id = 1 + rng.below(new_id);
                    sql.push_str(&format!(
                        "UPDATE shop.orders SET amount = amount + 1, note = {} WHERE id = {id};\n",
                        lit(&format!("changed {i}"))
                    ));
                    if with_priority {
                        sql.push_str(&format!(
                            "UPDATE shop.orders SET priority = {} WHERE id = {};\n",
                            rng.below(9),
                            1 + rng.below(new_id)
                        ));
                    }
                }
                7 => {
                    let id = 1 + rng.below(new_id);
                    sql.push_str(&format!(
                        "DELETE FROM shop.items WHERE order_id = {id};\nDELETE FROM shop.orders WHERE id = {id};\n"
                    ));
                }
                8 => {
                    // A key change: the row moves to another line number.
                    let id = 1 + rng.below(new_id);
                    sql.push_str(&format!(
                        "UPDATE shop.items SET line = line + 100, qty = qty + 1 WHERE order_id = {id} AND line = 1;\n"
                    ));
                }
                _ => {
                    let doc = 1 + rng.below(40);
                    if rng.chance(20) {
                        sql.push_str(&format!(
                            "INSERT INTO shop.docs VALUES ({doc}, 'new {i}', {BIG_BODY}) ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, title = EXCLUDED.title;\n"
                        ));
                    } else {
                        // The body is left unchanged: pgoutput sends it as "unchanged TOAST".
                        sql.push_str(&format!(
                            "UPDATE shop.docs SET title = 'title {i}' WHERE id = {doc};\n"
                        ));
                    }
                }
            }
        }
        sql.push_str("COMMIT;\n");
    }
    sql
}

/// A `weir run` in the background, killed (SIGKILL) when dropped, so a
/// failing test leaves no process behind.
pub struct Running(pub Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn_weir(pipeline: &std::path::Path, log: &std::path::Path) -> Running {
    Running(
        weir_command()
            .args(["run", pipeline.to_str().unwrap()])
            .env("WEIR_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

pub fn drain(pipeline: &std::path::Path) {
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    assert!(
        out.status.success(),
        "the draining run failed: {}",
        text(&out)
    );
}

pub fn interrupt(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
