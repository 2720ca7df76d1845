//! Kills during the Postgres backfill, under a writer that keeps changing
//! the tables: updates that leave a TOASTed column unchanged, deletes, a key
//! deleted and inserted again in one transaction, transactions over several
//! tables. Each run dies at a crash point after a chosen sink commit, most
//! of them inside the backfill (fewer than two there makes the test
//! inconclusive); later runs resume the backfill outside the slot's
//! exported snapshot, then stream from the slot. After a draining run, the
//! sink, applied in commit order as an upsert table applies it, must equal
//! Postgres row by row.
//!
//! The window such a resume has: the slot moving past the backfill's start
//! while a sink still stands inside the backfill (an optional sink left out
//! of a run). Resuming for it then loses the changes in between for the rows
//! it had read; the last test builds that case step by step.
//!
//! `WEIR_BACKFILL_KILL_SEED` replays a kill schedule (the seed is printed).

use crate::common;
use crate::iceberg_support;
use crate::postgres_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow_array::cast::AsArray;
use postgres_support::*;
use weir_core::position::Position;
use weir_source::change::Value;
use weir_source::postgres::decode::PgKind;

const SCHEMA: &str = r#"
CREATE SCHEMA shop;
CREATE TABLE shop.accounts (
    code text PRIMARY KEY,
    owner bigint NOT NULL,
    balance numeric(12,2) NOT NULL,
    active boolean NOT NULL
);
CREATE TABLE shop.customers (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    balance numeric(12,2),
    active boolean,
    bio text
);
ALTER TABLE shop.customers ALTER COLUMN bio SET STORAGE EXTERNAL;
CREATE TABLE shop.devices (
    id uuid PRIMARY KEY,
    customer_id bigint NOT NULL,
    label text NOT NULL
);
CREATE TABLE shop.transfers (
    id bigint PRIMARY KEY,
    account text NOT NULL,
    amount numeric(10,2) NOT NULL
);
"#;

const TABLES: [&str; 4] = [
    "shop.accounts",
    "shop.customers",
    "shop.devices",
    "shop.transfers",
];

/// About 2 kB of text: stored out of line (STORAGE EXTERNAL).
const BIO: &str = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 70))";

const CUSTOMERS: u64 = 5000;
const ACCOUNTS: u64 = 1500;
const DEVICES: u64 = 800;
const TRANSFERS: u64 = 5000;

fn table_defs() -> Vec<TableDef> {
    use PgKind::*;
    let money = |precision| Decimal {
        precision,
        scale: 2,
    };
    vec![
        TableDef::new(
            "shop.accounts",
            &[
                ("code", Text),
                ("owner", Int64),
                ("balance", money(12)),
                ("active", Bool),
            ],
            &[0],
        ),
        TableDef::new(
            "shop.customers",
            &[
                ("id", Int64),
                ("name", Text),
                ("balance", money(12)),
                ("active", Bool),
                ("bio", Text),
            ],
            &[0],
        ),
        TableDef::new(
            "shop.devices",
            &[("id", Uuid), ("customer_id", Int64), ("label", Text)],
            &[0],
        ),
        TableDef::new(
            "shop.transfers",
            &[("id", Int64), ("account", Text), ("amount", money(10))],
            &[0],
        ),
    ]
}

fn initial_load() -> String {
    format!(
        "INSERT INTO shop.accounts SELECT 'acct-' || g, g % {CUSTOMERS}, g % 977, g % 3 = 0 \
           FROM generate_series(1, {ACCOUNTS}) g;\n\
         INSERT INTO shop.customers SELECT g, 'customer ' || g, g % 1000, g % 2 = 0, {BIO} \
           FROM generate_series(1, {CUSTOMERS}) g;\n\
         INSERT INTO shop.devices SELECT gen_random_uuid(), 1 + g % {CUSTOMERS}, 'device ' || g \
           FROM generate_series(1, {DEVICES}) g;\n\
         INSERT INTO shop.transfers SELECT g, 'acct-' || (1 + g % {ACCOUNTS}), g % 500 \
           FROM generate_series(1, {TRANSFERS}) g;\n"
    )
}

/// `n` random transactions; new keys start at `id_base`.
fn workload(rng: &mut Rng, n: usize, id_base: u64) -> String {
    let mut sql = String::new();
    for i in 0..n as u64 {
        let customer = 1 + rng.below(CUSTOMERS + 200);
        let account = format!("'acct-{}'", 1 + rng.below(ACCOUNTS + 200));
        sql.push_str("BEGIN;\n");
        match rng.below(8) {
            // The columns the workload updates; the bio stays unchanged
            // (pgoutput sends it as an unchanged TOAST value).
            0 | 1 => sql.push_str(&format!(
                "UPDATE shop.customers SET balance = {}.{:02}, active = NOT coalesce(active, false) \
                 WHERE id = {customer};\n",
                rng.below(100_000),
                rng.below(100)
            )),
            2 => sql.push_str(&format!(
                "DELETE FROM shop.customers WHERE id = {customer};\n"
            )),
            // The same key deleted and inserted again in one transaction.
            3 => sql.push_str(&format!(
                "DELETE FROM shop.customers WHERE id = {customer};\n\
                 INSERT INTO shop.customers VALUES ({customer}, 'again {i}', {}, true, {BIO});\n",
                rng.below(1000)
            )),
            // Several tables in one transaction.
            4 | 5 => sql.push_str(&format!(
                "UPDATE shop.accounts SET balance = balance + 1, active = NOT active WHERE code = {account};\n\
                 INSERT INTO shop.transfers VALUES ({}, {account}, {}) ON CONFLICT (id) DO NOTHING;\n\
                 UPDATE shop.customers SET balance = coalesce(balance, 0) - 1 WHERE id = {customer};\n\
                 DELETE FROM shop.transfers WHERE id = {};\n",
                id_base + i,
                rng.below(1000),
                1 + rng.below(TRANSFERS)
            )),
            6 => sql.push_str(&format!(
                "DELETE FROM shop.accounts WHERE code = {account};\n\
                 INSERT INTO shop.accounts VALUES ({account}, {customer}, 0, true) \
                   ON CONFLICT (code) DO UPDATE SET balance = 0;\n\
                 UPDATE shop.devices SET label = 'moved {i}' WHERE id = \
                   (SELECT id FROM shop.devices ORDER BY id OFFSET {} LIMIT 1);\n",
                rng.below(DEVICES)
            )),
            _ => sql.push_str(&format!(
                "DELETE FROM shop.devices WHERE id = \
                   (SELECT id FROM shop.devices ORDER BY id OFFSET {} LIMIT 1);\n\
                 INSERT INTO shop.devices VALUES (gen_random_uuid(), {customer}, 'new {i}');\n\
                 UPDATE shop.customers SET bio = {BIO} WHERE id = {customer};\n",
                rng.below(DEVICES)
            )),
        }
        sql.push_str("COMMIT;\n");
    }
    sql
}

fn writer(
    port: String,
    db: &'static str,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let pg = Pg { port };
        let mut rng = Rng::seeded(seed);
        let (mut n, mut base) = (0, 1_000_000);
        while !stop.load(Ordering::Relaxed) {
            let sql = workload(&mut rng, 10, base);
            base += 10;
            if pg.try_sql(db, &sql).is_ok() {
                n += 10;
            }
            std::thread::sleep(Duration::from_millis(15));
        }
        n
    })
}

/// The sink's lowest committed position over the tables, and whether every
/// table has one.
fn sink_low(pipeline: &std::path::Path) -> (Option<Position>, bool) {
    let status = common::status(pipeline);
    let positions = common::positions_of(&status, "exact");
    let mut low: Option<Position> = None;
    let mut all = true;
    for p in positions.values() {
        match p {
            Some(p) => {
                let p = Position::from_bytes(p.clone());
                if low.as_ref().is_none_or(|l| p < *l) {
                    low = Some(p);
                }
            }
            None => all = false,
        }
    }
    (low, all)
}

/// A table's rows as an upsert sink holds them: every committed batch
/// applied in commit order, last write per key winning, deletes removing.
fn upserted_rows(root: &std::path::Path, table: &TableDef) -> BTreeMap<String, Vec<Value>> {
    let mut state = BTreeMap::new();
    for batch in common::read_positioned(root, &table.name) {
        let ops = batch
            .column_by_name("__op")
            .expect("__op")
            .as_string::<i32>()
            .clone();
        for row in 0..batch.num_rows() {
            let values: Vec<Value> = table
                .columns
                .iter()
                .map(|(name, _)| match batch.column_by_name(name) {
                    Some(array) => common::value_at(array.as_ref(), row),
                    None => Value::Null,
                })
                .collect();
            let key = table.key_of(&values);
            if ops.value(row) == "delete" {
                state.remove(&key);
            } else {
                state.insert(key, values);
            }
        }
    }
    state
}

/// Compares every table; returns what differs, per table.
fn differences(pg: &Pg, db: &str, root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for table in table_defs() {
        let want = pg.rows(db, &table);
        let got = upserted_rows(root, &table);
        let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let stale: Vec<&String> = want
            .iter()
            .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
            .map(|(k, _)| k)
            .collect();
        println!(
            "{}: postgres {} rows, sink {}; {} deleted rows still in the sink, {} missing, {} stale",
            table.name,
            want.len(),
            got.len(),
            extra.len(),
            missing.len(),
            stale.len()
        );
        if !(extra.is_empty() && missing.is_empty() && stale.is_empty()) {
            out.push(format!(
                "{}: {} rows Postgres deleted are still in the sink (e.g. {:?}), {} missing \
                 (e.g. {:?}), {} with stale values (e.g. {:?})",
                table.name,
                extra.len(),
                extra.iter().take(3).collect::<Vec<_>>(),
                missing.len(),
                missing.iter().take(3).collect::<Vec<_>>(),
                stale.len(),
                stale.iter().take(3).collect::<Vec<_>>(),
            ));
        }
    }
    out
}

#[test]
fn kills_during_the_backfill_leave_the_sink_equal_to_postgres() {
    kills_during_the_backfill("weir_backfill_kills", false);
}

/// The same with an Iceberg sink beside the positioned one, its upsert
/// tables read back by DuckDB (as the external crash test did). About 35
/// seconds here.
#[test]
fn kills_during_the_backfill_leave_the_iceberg_tables_equal_to_postgres() {
    kills_during_the_backfill("weir_backfill_kills_lake", true);
}

fn kills_during_the_backfill(db: &'static str, with_lake: bool) {
    let pg = cluster();
    let dsn = pg.fresh_db(db);
    pg.sql(db, SCHEMA);
    pg.sql(db, &initial_load());

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let lake = iceberg_support::Lake {
        root: dir.path().join("lake"),
    };
    let mut p = PgPipeline::new(&dsn, &TABLES);
    p.chunk_rows = 40;
    p.max_rows = 40;
    if with_lake {
        std::fs::create_dir_all(&lake.root).unwrap();
        p.extra_sinks = lake_sink(&lake);
    }
    let pipeline = p.write(dir.path(), &root);

    let seed = std::env::var("WEIR_BACKFILL_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("seed: {seed} (set WEIR_BACKFILL_KILL_SEED to replay it)");
    let mut schedule = Rng::seeded(seed);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(pg.port.clone(), db, stop.clone(), seed ^ 0x5eed);

    let log = dir.path().join("weir.log");
    // The time budget runs from the end of the first run, which may
    // compile the plugins: on a loaded machine that alone took most of 40
    // seconds.
    let mut started: Option<Instant> = None;
    let (mut kills, mut in_backfill) = (0, 0);
    let mut before: Option<Position> = None;
    let mut slot_start = None;
    let (max_kills, budget) = (
        common::depth(6, 12),
        Duration::from_secs(common::depth(20, 40)),
    );
    while kills < max_kills && started.is_none_or(|s| s.elapsed() < budget) {
        // Early in each run: every run resumes the backfill, so small
        // counts walk the kills through it instead of past it.
        let hit = 3 + schedule.below(30);
        let out = common::weir(
            &["run", pipeline.to_str().unwrap()],
            &[
                ("WEIR_FAILPOINT", &format!("after-sink-commit@{hit}")),
                ("WEIR_LOG", "info"),
            ],
        );
        std::fs::write(&log, &out.stderr).unwrap();
        if out.status.code().is_some() {
            stop.store(true, Ordering::Relaxed);
            writes.join().unwrap();
            panic!(
                "run {} ended by itself instead of at the crash point: {}",
                kills + 1,
                common::text(&out)
            );
        }
        kills += 1;
        started.get_or_insert_with(Instant::now);
        let (after, every_table) = sink_low(&pipeline);
        let landed = after.as_ref().is_some_and(|p| p.as_snapshot().is_some()) && after != before;
        in_backfill += usize::from(landed);
        // Backfill positions release nothing: the slot stays at its start.
        let confirmed = pg.confirmed_flush(db, &slot_of(&dsn));
        if after.as_ref().is_none_or(|p| p.as_snapshot().is_some()) {
            let first = *slot_start.get_or_insert(confirmed);
            assert_eq!(
                confirmed, first,
                "seed {seed}, kill {kills}: the slot moved before the backfill was committed"
            );
        }
        println!(
            "kill {kills} at commit {hit}: sink at {} ({}every table committed){}",
            after.as_ref().map_or("-".into(), ToString::to_string),
            if every_table { "" } else { "not " },
            if landed { ", mid-backfill" } else { "" }
        );
        before = after;
    }
    // Let the writer run on while a last run finishes the backfill and
    // streams, then stop it and drain.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let written = writes.join().unwrap();
    if in_backfill < 2 {
        panic!("INCONCLUSIVE: only {in_backfill} of {kills} kills landed inside the backfill");
    }
    let out = common::weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    assert!(
        out.status.success(),
        "the draining run failed: {}",
        common::text(&out)
    );
    let mut wrong = differences(&pg, db, &root);
    if with_lake {
        wrong.extend(lake_differences(&pg, db, &lake));
    }
    assert!(
        wrong.is_empty(),
        "seed {seed}: after {kills} kills ({in_backfill} mid-backfill) under {written} written \
         transactions, the sink differs from Postgres:\n{}",
        wrong.join("\n")
    );
    println!(
        "{kills} kills ({in_backfill} mid-backfill), {written} transactions: sink equals Postgres"
    );
}

/// A second sink: the Iceberg tables of `lake`.
fn lake_sink(lake: &iceberg_support::Lake) -> String {
    format!(
        "  - name: lake\n    plugin: {}\n    blob_store: {{ url: {} }}\n    \
         config: {{ warehouse: \"{}\" }}\n    limits: {{ memory_mb: 1024, call_timeout_ms: 120000 }}\n",
        common::plugin("weir-iceberg-sink").display(),
        lake.root.display(),
        lake.warehouse()
    )
}

/// Compares the Iceberg tables, read by DuckDB, with Postgres: the keys, and
/// the columns the workload updates.
fn lake_differences(pg: &Pg, db: &str, lake: &iceberg_support::Lake) -> Vec<String> {
    let checks: [(&str, &[&str]); 4] = [
        ("shop.accounts", &["code", "balance", "active"]),
        ("shop.customers", &["id", "balance", "active"]),
        ("shop.devices", &["id", "label"]),
        ("shop.transfers", &["id", "amount"]),
    ];
    let mut out = Vec::new();
    for (table, columns) in checks {
        let metadata = lake.metadata(table).expect("the lake has the table");
        let read = iceberg_support::read_python("duckdb", &metadata)
            .unwrap_or_else(|e| panic!("duckdb cannot read {table}: {e}"));
        let plain: Vec<String> = columns
            .iter()
            .filter(|c| !c.contains('('))
            .map(|c| c.to_string())
            .collect();
        let got: std::collections::BTreeSet<Vec<Option<String>>> =
            read.project(&plain).into_iter().collect();
        let sql = format!(
            "COPY (SELECT {} FROM {table}) TO STDOUT",
            plain
                .iter()
                .map(|c| format!("{c}::text"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let text = pg.sql(db, &sql);
        let want: std::collections::BTreeSet<Vec<Option<String>>> = text
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.split('\t')
                    .map(|f| (f != "\\N").then(|| f.to_string()))
                    .collect()
            })
            .collect();
        let want_keys: std::collections::BTreeSet<&Option<String>> =
            want.iter().map(|r| &r[0]).collect();
        let got_keys: std::collections::BTreeSet<&Option<String>> =
            got.iter().map(|r| &r[0]).collect();
        let extra = got_keys.difference(&want_keys).count();
        let missing = want_keys.difference(&got_keys).count();
        let stale = want.difference(&got).count() - missing;
        println!(
            "lake {table}: postgres {} rows, duckdb {}; {extra} deleted rows still there, \
             {missing} missing, {stale} stale",
            want.len(),
            got.len()
        );
        if extra + missing + stale > 0 || got.len() != read.rows.len() {
            out.push(format!(
                "lake {table}: {extra} rows Postgres deleted are still there, {missing} \
                 missing, {stale} with stale values, {} duplicate rows (e.g. {:?})",
                read.rows.len() - got.len(),
                want.difference(&got).take(2).collect::<Vec<_>>()
            ));
        }
    }
    out
}

/// The window: a sink that stands inside the backfill while the slot has
/// moved past the backfill's start. An optional sink that could not load
/// in one run keeps its backfill position while the required sink
/// finishes, streams and lets the slot move; the next run resumes the
/// backfill for it from the current data, then streams from the slot's new
/// position. The rows it had read before lack every change made between
/// the slot's start and that position: Postgres deleted them, or updated
/// them, and the sink never hears of it. Such a sink must be left out with
/// the reason, or the run must stop; never be silently wrong.
#[test]
fn a_sink_left_inside_the_backfill_while_the_slot_moved_is_never_silently_wrong() {
    let pg = cluster();
    let db = "weir_backfill_behind";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL); \
         INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 2000) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let behind_root = dir.path().join("behind");
    let mut p = PgPipeline::new(&dsn, &["public.t"]);
    p.chunk_rows = 50;
    p.max_rows = 50;
    let entry = |plugin: &std::path::Path| {
        format!(
            "  - name: behind\n    plugin: {}\n    required: false\n    blob_store: {{ url: {} }}\n",
            plugin.display(),
            behind_root.display()
        )
    };
    p.extra_sinks = entry(&common::plugin("weir-fixture-positioned"));
    let pipeline = p.write(dir.path(), &root);

    // Both sinks commit a few chunks, then the run dies.
    let out = common::weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_FAILPOINT", "after-sink-commit@10")],
    );
    assert!(out.status.code().is_none(), "{}", common::text(&out));
    let (low, _) = sink_low(&pipeline);
    let Some(low) = low.clone().filter(|p| p.as_snapshot().is_some()) else {
        panic!("INCONCLUSIVE: the kill did not land inside the backfill ({low:?})");
    };
    let start = pg.confirmed_flush(db, &slot_of(&dsn)).expect("slot");
    println!("killed inside the backfill at {low}; slot at {start:X}");

    // Rows both sinks already hold change.
    pg.sql(
        db,
        "UPDATE t SET v = 'changed' WHERE id <= 100; DELETE FROM t WHERE id BETWEEN 101 AND 150;",
    );
    // A run without the optional sink (its plugin does not load): the
    // required sink finishes, streams, and the slot moves.
    p.extra_sinks = entry(&dir.path().join("missing.wasm"));
    p.write(dir.path(), &root);
    let out = common::weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    assert!(out.status.code().is_some(), "{}", common::text(&out));
    let moved = pg.confirmed_flush(db, &slot_of(&dsn)).expect("slot");
    assert!(
        moved > start,
        "INCONCLUSIVE: the slot did not move ({start:X})"
    );

    // The optional sink is back.
    p.extra_sinks = entry(&common::plugin("weir-fixture-positioned"));
    p.write(dir.path(), &root);
    let out = common::weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let said = common::text(&out);
    let def = TableDef::new(
        "public.t",
        &[("id", PgKind::Int32), ("v", PgKind::Text)],
        &[0],
    );
    assert_sink_equals_postgres(&pg, db, &root, std::slice::from_ref(&def));
    let want = pg.rows(db, &def);
    let got = upserted_rows(&behind_root, &def);
    if got == want {
        println!("the optional sink caught up exactly");
        return;
    }
    let deleted_still_there = got.keys().filter(|k| !want.contains_key(*k)).count();
    let stale = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
        .count();
    // Either the sink is left out with the reason (the others go on), or
    // the run stops before anything, saying why.
    let left_out = out.status.code() == Some(3) && said.contains("cannot catch up");
    let stopped = !out.status.success() && said.contains("where the backfill began");
    assert!(
        left_out || stopped,
        "the optional sink holds {deleted_still_there} rows Postgres deleted and {stale} stale \
         rows, and nothing said so: {said}"
    );
    println!("the window was refused: {said}");
}
