//! The Postgres source carries what the publication sends, and nothing
//! else, against a real server (scripts/pg): generated columns (which
//! pgoutput never sends), column lists, row filters, and partitioned tables
//! published without `publish_via_partition_root`. Each test backfills,
//! then streams inserts, updates and deletes, and compares the positioned
//! sink with what Postgres itself has.

use crate::common;
use crate::postgres_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{text, weir};
use postgres_support::*;
use weir_source::change::Value;
use weir_source::postgres::decode::{PgKind, copy_fields, decode};

/// The rows Postgres has in `table` that satisfy `filter` (an SQL
/// condition), keyed as [`sink_rows`] keys them.
fn postgres_rows_where(
    pg: &Pg,
    db: &str,
    table: &TableDef,
    filter: &str,
) -> BTreeMap<String, Vec<Value>> {
    let columns: Vec<String> = table
        .columns
        .iter()
        .map(|(n, _)| format!("{n}::text"))
        .collect();
    let sql = format!(
        "COPY (SELECT {} FROM {} WHERE {filter}) TO STDOUT",
        columns.join(", "),
        table.name
    );
    let out = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &pg.dsn(db), "-c", &sql])
        .env("PGOPTIONS", "-c DateStyle=ISO -c TimeZone=UTC")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "reading {} back failed", table.name);
    let mut rows = BTreeMap::new();
    for line in out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let values: Vec<Value> = table
            .columns
            .iter()
            .zip(copy_fields(line).unwrap())
            .map(|((_, kind), field)| match field {
                None => Value::Null,
                Some(t) => decode(kind, &t).unwrap(),
            })
            .collect();
        rows.insert(table.key_of(&values), values);
    }
    rows
}

/// The sink's rows of `table` equal Postgres' rows that satisfy `filter`,
/// and no change reached the sink twice.
fn assert_sink_equals_postgres_where(
    pg: &Pg,
    db: &str,
    root: &Path,
    table: &TableDef,
    filter: &str,
) {
    let want = postgres_rows_where(pg, db, table, filter);
    let (got, duplicates) = sink_rows(root, table);
    assert_eq!(duplicates, 0, "{}: changes delivered twice", table.name);
    assert!(
        !want.is_empty(),
        "{}: the test needs rows to compare",
        table.name
    );
    assert_eq!(
        got, want,
        "{}: the sink (left) differs from postgres WHERE {filter} (right)",
        table.name
    );
    println!("{}: {} rows equal", table.name, want.len());
}

/// The column names of every batch the sink holds for `table`.
fn sink_column_names(root: &Path, table: &str) -> BTreeSet<String> {
    common::read_positioned(root, table)
        .iter()
        .flat_map(|b| {
            b.schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Drains the pipeline (backfill and stream up to now), failing the test
/// with weir's output when the run fails.
fn drain_or_fail(pipeline: &Path) {
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    assert!(out.status.success(), "the run failed: {}", text(&out));
}

/// pgoutput never sends a generated column: the source must not carry one
/// either, or streamed rows would null it (when it is last) or fail on a
/// "dropped" column (when it is not).
#[test]
fn generated_columns_are_not_carried_and_streamed_changes_apply() {
    let pg = cluster();
    let db = "weir_pub_generated";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE mid (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED, b text); \
         CREATE TABLE last (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED); \
         INSERT INTO mid (id, a, b) SELECT g, g, 'b' || g FROM generate_series(1, 50) g; \
         INSERT INTO last (id, a) SELECT g, g FROM generate_series(1, 50) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.last", "public.mid"]).write(dir.path(), &root);
    drain_or_fail(&pipeline);
    pg.sql(
        db,
        "UPDATE mid SET a = a + 100 WHERE id <= 10; UPDATE last SET a = a + 100 WHERE id <= 10; \
         INSERT INTO mid (id, a, b) VALUES (51, 7, 'new'); INSERT INTO last (id, a) VALUES (51, 7); \
         DELETE FROM mid WHERE id = 20; DELETE FROM last WHERE id = 20;",
    );
    drain_or_fail(&pipeline);

    for table in ["public.mid", "public.last"] {
        let columns = sink_column_names(&root, table);
        assert!(
            !columns.contains("twice"),
            "{table}: the sink got the generated column, which the stream never sends: {columns:?}"
        );
    }
    let mid = TableDef::new(
        "public.mid",
        &[
            ("id", PgKind::Int32),
            ("a", PgKind::Int32),
            ("b", PgKind::Text),
        ],
        &[0],
    );
    let last = TableDef::new(
        "public.last",
        &[("id", PgKind::Int32), ("a", PgKind::Int32)],
        &[0],
    );
    assert_sink_equals_postgres(&pg, db, &root, &[mid, last]);
}

/// A column list leaves columns out of the publication (here personal
/// data): the backfill must not copy them either.
#[test]
fn a_publication_column_list_limits_the_backfill_too() {
    let pg = cluster();
    let db = "weir_pub_columns";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE people (id int PRIMARY KEY, name text, email text, city text); \
         INSERT INTO people SELECT g, 'name ' || g, 'p' || g || '@example.com', 'city ' || g FROM generate_series(1, 40) g; \
         CREATE PUBLICATION weir_pub FOR TABLE people (id, name, city);",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.people"]).write(dir.path(), &root);
    drain_or_fail(&pipeline);
    pg.sql(
        db,
        "UPDATE people SET name = 'renamed', email = 'x@example.com' WHERE id <= 5; \
         INSERT INTO people VALUES (41, 'new', 'new@example.com', 'c'); DELETE FROM people WHERE id = 9;",
    );
    drain_or_fail(&pipeline);

    let columns = sink_column_names(&root, "public.people");
    let data_columns: Vec<&str> = columns
        .iter()
        .map(String::as_str)
        .filter(|c| !c.starts_with("__"))
        .collect();
    assert_eq!(
        data_columns,
        ["city", "id", "name"],
        "the sink must hold exactly the published columns"
    );
    let people = TableDef::new(
        "public.people",
        &[
            ("id", PgKind::Int32),
            ("name", PgKind::Text),
            ("city", PgKind::Text),
        ],
        &[0],
    );
    assert_sink_equals_postgres(&pg, db, &root, &[people]);
}

/// A row filter publishes some rows only: the backfill copies those, so
/// the sink never holds a row the stream will not keep up to date.
#[test]
fn a_publication_row_filter_limits_the_backfill_too() {
    let pg = cluster();
    let db = "weir_pub_rows";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE accounts (id int PRIMARY KEY, region text NOT NULL, balance int); \
         INSERT INTO accounts SELECT g, CASE WHEN g % 3 = 0 THEN 'us' ELSE 'eu' END, g FROM generate_series(1, 60) g; \
         ALTER TABLE accounts REPLICA IDENTITY FULL; \
         CREATE PUBLICATION weir_pub FOR TABLE accounts WHERE (region = 'eu');",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut p = PgPipeline::new(&dsn, &["public.accounts"]);
    p.chunk_rows = 7;
    let pipeline = p.write(dir.path(), &root);
    drain_or_fail(&pipeline);
    // Rows of either region change; some move in or out of the filter.
    pg.sql(
        db,
        "UPDATE accounts SET balance = balance + 1000; DELETE FROM accounts WHERE id IN (3, 4); \
         UPDATE accounts SET region = 'eu' WHERE id = 6; UPDATE accounts SET region = 'us' WHERE id = 7; \
         INSERT INTO accounts VALUES (61, 'eu', 1), (62, 'us', 2);",
    );
    drain_or_fail(&pipeline);
    let accounts = TableDef::new(
        "public.accounts",
        &[
            ("id", PgKind::Int32),
            ("region", PgKind::Text),
            ("balance", PgKind::Int32),
        ],
        &[0],
    );
    assert_sink_equals_postgres_where(&pg, db, &root, &accounts, "region = 'eu'");
}

/// The partitioned table `public.events`, one partition with its columns in
/// another order (attached after being created on its own).
const EVENTS: &str = "CREATE TABLE events (id int, region text, payload text, PRIMARY KEY (id, region)) PARTITION BY LIST (region); \
     CREATE TABLE events_eu PARTITION OF events FOR VALUES IN ('eu'); \
     CREATE TABLE events_us (payload text, region text NOT NULL, id int NOT NULL); \
     ALTER TABLE events ATTACH PARTITION events_us FOR VALUES IN ('us'); \
     INSERT INTO events SELECT g, CASE WHEN g % 2 = 0 THEN 'us' ELSE 'eu' END, 'p' || g FROM generate_series(1, 40) g;";

/// Changes to both partitions, and rows moving between them.
const EVENT_CHANGES: &str = "INSERT INTO events VALUES (41, 'eu', 'new'), (42, 'us', 'new'); \
     UPDATE events SET payload = 'changed' WHERE id <= 6; DELETE FROM events WHERE id IN (7, 8); \
     UPDATE events SET region = 'us' WHERE id = 9; UPDATE events SET region = 'eu' WHERE id = 10;";

fn events() -> TableDef {
    TableDef::new(
        "public.events",
        &[
            ("id", PgKind::Int32),
            ("region", PgKind::Text),
            ("payload", PgKind::Text),
        ],
        &[0, 1],
    )
}

/// Without `publish_via_partition_root`, changes arrive under each
/// partition's name and OID: the source maps them onto the partitioned
/// table, which is what the publication (and the sink) names.
#[test]
fn a_partitioned_table_published_without_the_root_arrives_as_the_root() {
    let pg = cluster();
    let db = "weir_pub_partitions";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        &format!("{EVENTS} CREATE PUBLICATION weir_pub FOR TABLE events;"),
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.events"]).write(dir.path(), &root);
    drain_or_fail(&pipeline);
    pg.sql(db, EVENT_CHANGES);
    drain_or_fail(&pipeline);
    assert_sink_equals_postgres(&pg, db, &root, &[events()]);
}

/// The same when weir creates the publication itself
/// (`create_publication_for`).
#[test]
fn a_partitioned_table_in_a_publication_weir_creates_arrives_as_the_root() {
    let pg = cluster();
    let db = "weir_pub_partitions_created";
    let dsn = pg.fresh_db(db);
    pg.sql(db, EVENTS);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.events"]).write(dir.path(), &root);
    drain_or_fail(&pipeline);
    pg.sql(db, EVENT_CHANGES);
    drain_or_fail(&pipeline);
    assert_sink_equals_postgres(&pg, db, &root, &[events()]);
}
