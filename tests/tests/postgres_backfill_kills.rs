//! Kills during the Postgres backfill, under a writer that keeps changing
//! the tables: updates that leave a TOASTed column unchanged, deletes, a key
//! deleted and inserted again in one transaction, transactions over several
//! tables. Each run dies at a crash point after a chosen sink commit that
//! lands inside the backfill (a kill elsewhere makes the test inconclusive);
//! later runs resume the backfill outside the slot's exported snapshot,
//! then stream from the slot. After a draining run, the sink, applied in
//! commit order as an upsert table applies it, must equal Postgres row by
//! row.
//!
//! `WEIR_BACKFILL_KILL_SEED` replays a schedule (the seed is printed).

mod common;
mod postgres_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow_array::cast::AsArray;
use postgres_support::*;
use weir::change::Value;
use weir::position::Position;
use weir::source::postgres::decode::PgKind;

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

const CUSTOMERS: u64 = 1500;
const ACCOUNTS: u64 = 1500;
const DEVICES: u64 = 800;
const TRANSFERS: u64 = 2500;

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
    let pg = cluster();
    let db = "weir_backfill_kills";
    let dsn = pg.fresh_db(db);
    pg.sql(db, SCHEMA);
    pg.sql(db, &initial_load());

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut p = PgPipeline::new(&dsn, &TABLES);
    p.chunk_rows = 40;
    p.max_rows = 40;
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
    let started = Instant::now();
    let (mut kills, mut in_backfill) = (0, 0);
    let mut before: Option<Position> = None;
    while kills < 10 && started.elapsed() < Duration::from_secs(45) {
        let hit = 2 + schedule.below(60);
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
        let (after, every_table) = sink_low(&pipeline);
        let landed = after.as_ref().is_some_and(|p| p.as_snapshot().is_some()) && after != before;
        in_backfill += usize::from(landed);
        let status = common::status(&pipeline);
        for (table, p) in common::positions_of(&status, "exact") {
            let p = p.map(Position::from_bytes);
            println!("  {table}: {}", p.map_or("-".into(), |p| format!("{p} {}", p.to_hex())));
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
    let wrong = differences(&pg, db, &root);
    assert!(
        wrong.is_empty(),
        "seed {seed}: after {kills} kills ({in_backfill} mid-backfill) under {written} written \
         transactions, the sink differs from Postgres:\n{}",
        wrong.join("\n")
    );
    println!("{kills} kills ({in_backfill} mid-backfill), {written} transactions: sink equals Postgres");
}
