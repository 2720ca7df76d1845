//! Stops that used to replay after every restart, against a real server
//! (scripts/pg): the stream decodes with the catalog and the publication
//! as they were in the WAL, so a table renamed, taken out of the
//! publication or dropped while weir lagged, or a TRUNCATE, stopped every
//! later run at the same place. Now a renamed table keeps its destination,
//! a table that left gets the changes it still has in the WAL and is then
//! let go, and a TRUNCATE is skipped only when the operator says so
//! (`skip_transaction_at`), with the destination checked against Postgres.

use crate::common;
use crate::postgres_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{text, weir};
use postgres_support::*;
use weir_source::change::Value;
use weir_source::postgres::decode::PgKind;

/// `(id int primary key, v text)` under `name`.
fn def(name: &str) -> TableDef {
    TableDef::new(name, &[("id", PgKind::Int32), ("v", PgKind::Text)], &[0])
}

/// A run that ends once caught up; its output (the log at `warn`).
fn drain_output(pipeline: &Path) -> std::process::Output {
    weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    )
}

fn drain_ok(pipeline: &Path) -> String {
    let out = drain_output(pipeline);
    let said = text(&out);
    assert!(out.status.success(), "the run failed: {said}");
    said
}

/// The sink's rows of `table` (destination name) equal Postgres' rows of
/// `postgres` (a table, optionally with a WHERE clause).
fn assert_same(pg: &Pg, db: &str, root: &Path, table: &str, postgres: &str) {
    let want = pg.rows(db, &def(postgres));
    let (got, duplicates) = sink_rows(root, &def(table));
    assert_eq!(duplicates, 0, "{table}: changes held twice");
    assert_eq!(
        got, want,
        "{table} in the sink against {postgres} in Postgres"
    );
}

fn wait_for(what: &str, child: &mut Running, log: &Path, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "{what}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_table_renamed_while_weir_lags_keeps_streaming_into_its_destination() {
    let pg = cluster();
    let db = "weir_stops_rename";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, v text); \
         INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 3) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.t"]).write(dir.path(), &root);
    drain_ok(&pipeline);

    // While weir is stopped: changes before and after a rename. The WAL
    // still names the table `t` for the first ones, the catalog `t2`.
    pg.sql(
        db,
        "INSERT INTO t VALUES (4, 'before'); \
         ALTER TABLE t RENAME TO t2; \
         INSERT INTO t2 VALUES (5, 'after'); \
         UPDATE t2 SET v = 'changed' WHERE id = 1;",
    );
    let said = drain_ok(&pipeline);
    assert!(
        said.contains("renamed") && said.contains("public.t2"),
        "the rename is logged naming both names: {said}"
    );
    assert_same(&pg, db, &root, "public.t", "public.t2");
    assert!(
        !root.join("public.t2").exists(),
        "a destination table was made for the new name"
    );

    // While weir runs: the stream describes the table anew under its new
    // name, with the same OID.
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&pipeline, &log);
    pg.sql(db, "INSERT INTO t2 VALUES (6, 'live');");
    wait_for("the run did not stream", &mut child, &log, || {
        sink_rows(&root, &def("public.t")).0.len() == 6
    });
    pg.sql(
        db,
        "ALTER TABLE t2 RENAME TO t3; INSERT INTO t3 VALUES (7, 'renamed live');",
    );
    wait_for(
        "the change after a rename while running did not arrive",
        &mut child,
        &log,
        || sink_rows(&root, &def("public.t")).0.len() == 7,
    );
    interrupt(&mut child);
    pg.sql(db, "DELETE FROM t3 WHERE id = 2;");
    drain_ok(&pipeline);
    assert_same(&pg, db, &root, "public.t", "public.t3");
}

#[test]
fn tables_that_left_the_publication_get_their_last_changes_and_are_then_let_go() {
    let pg = cluster();
    let db = "weir_stops_left";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE a (id int PRIMARY KEY, v text); \
         CREATE TABLE b (id int PRIMARY KEY, v text); \
         CREATE TABLE c (id int PRIMARY KEY, v text); \
         INSERT INTO a VALUES (1, 'a1'), (2, 'a2'); \
         INSERT INTO b VALUES (1, 'b1'), (2, 'b2'); \
         INSERT INTO c VALUES (1, 'c1'), (2, 'c2');",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline =
        PgPipeline::new(&dsn, &["public.a", "public.b", "public.c"]).write(dir.path(), &root);
    drain_ok(&pipeline);

    // While weir is stopped: b leaves the publication and c is dropped,
    // each after changes that were published when they were made.
    pg.sql(
        db,
        "INSERT INTO a VALUES (3, 'a3'); \
         INSERT INTO b VALUES (3, 'b3'); UPDATE b SET v = 'b1 changed' WHERE id = 1; \
         INSERT INTO c VALUES (3, 'c3'); DELETE FROM c WHERE id = 2;",
    );
    let c_last = pg.rows(db, &def("public.c"));
    pg.sql(
        db,
        "ALTER PUBLICATION weir_pub DROP TABLE b; \
         INSERT INTO b VALUES (4, 'not published'); \
         DROP TABLE c; \
         INSERT INTO a VALUES (4, 'a4');",
    );
    let said = drain_ok(&pipeline);
    for table in ["public.b", "public.c"] {
        assert!(
            said.contains(&format!("table {table} left publication")),
            "{table}: {said}"
        );
    }
    assert_same(&pg, db, &root, "public.a", "public.a");
    assert_same(&pg, db, &root, "public.b", "public.b WHERE id <> 4");
    let (c_sink, _) = sink_rows(&root, &def("public.c"));
    assert_eq!(
        c_sink, c_last,
        "public.c lacks the changes made before its drop"
    );

    // Once the slot is past the point where they were found gone (a run
    // that streamed past it and was acknowledged), the next run lets them
    // go, once, and streams the rest. Which run that is depends on timing:
    // the run above may already have stood at a heartbeat written after
    // that point (a slow run idles long enough to write one), and then
    // the next one lets them go; else the one after it.
    pg.sql(
        db,
        "INSERT INTO a VALUES (5, 'a5'); UPDATE a SET v = 'a1 changed' WHERE id = 1;",
    );
    let mut said = drain_ok(&pipeline);
    pg.sql(db, "INSERT INTO a VALUES (6, 'a6');");
    said.push_str(&drain_ok(&pipeline));
    for table in ["public.b", "public.c"] {
        assert_eq!(
            said.matches(&format!("table {table} is no longer replicated"))
                .count(),
            1,
            "{table}: {said}"
        );
    }
    assert_same(&pg, db, &root, "public.a", "public.a");
    pg.sql(db, "INSERT INTO a VALUES (7, 'a7');");
    let said = drain_ok(&pipeline);
    assert!(
        !said.contains("public.b") && !said.contains("public.c"),
        "{said}"
    );
    assert_same(&pg, db, &root, "public.a", "public.a");
}

/// The LSN a stop names after `skip_transaction_at: `.
fn named_lsn(said: &str) -> String {
    let (_, tail) = said
        .split_once("skip_transaction_at: ")
        .unwrap_or_else(|| panic!("no skip_transaction_at in: {said}"));
    tail.split(|c: char| !(c.is_ascii_hexdigit() || c == '/'))
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_truncate_stops_every_run_at_its_lsn_until_the_operator_skips_that_transaction() {
    let pg = cluster();
    let db = "weir_stops_truncate";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, v text); \
         INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 3) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut p = PgPipeline::new(&dsn, &["public.t"]);
    let pipeline = p.write(dir.path(), &root);
    drain_ok(&pipeline);

    // While weir is stopped: a change, the TRUNCATE, and changes after it.
    pg.sql(db, "INSERT INTO t VALUES (4, 'before the truncate');");
    pg.sql(db, "TRUNCATE t;");
    let truncated_at = pg.value(db, "SELECT pg_current_wal_insert_lsn()::text");
    pg.sql(
        db,
        "INSERT INTO t VALUES (10, 'after'), (11, 'after'); \
         UPDATE t SET v = 'after, changed' WHERE id = 10;",
    );
    let mut lsns = Vec::new();
    for _ in 0..2 {
        let out = drain_output(&pipeline);
        let said = text(&out);
        assert!(
            !out.status.success(),
            "a run went past the TRUNCATE: {said}"
        );
        assert!(said.contains("TRUNCATE of public.t"), "{said}");
        lsns.push(named_lsn(&said));
    }
    assert_eq!(lsns[0], lsns[1], "the stop moved between runs");
    let lsn = lsns[0].clone();
    assert!(
        parse_lsn(&lsn).unwrap() < parse_lsn(&truncated_at).unwrap(),
        "{lsn} is not the TRUNCATE's commit (WAL was at {truncated_at} after it)"
    );

    // A key that is not an LSN is refused, naming the key.
    p.extra_source = "    skip_transaction_at: \"last tuesday\"\n".into();
    let wrong = p.write(dir.path(), &root);
    let out = drain_output(&wrong);
    let said = text(&out);
    assert!(
        !out.status.success() && said.contains("source.postgres.skip_transaction_at"),
        "{said}"
    );

    p.extra_source = format!("    skip_transaction_at: \"{lsn}\"\n");
    let pipeline = p.write(dir.path(), &root);
    let said = drain_ok(&pipeline);
    assert!(
        said.contains("left out whole") && said.contains(&lsn),
        "the skip is not logged with its LSN: {said}"
    );
    // The rows after the TRUNCATE are exactly Postgres'; the change before
    // it arrived; the sink keeps the rows the TRUNCATE removed (the
    // operator empties them by hand when the destination should match).
    let want = pg.rows(db, &def("public.t"));
    let (got, duplicates) = sink_rows(&root, &def("public.t"));
    assert_eq!(duplicates, 0);
    let after: BTreeMap<String, Vec<Value>> = got
        .iter()
        .filter(|(k, _)| want.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(after, want, "the rows after the TRUNCATE");
    let kept: Vec<&Vec<Value>> = got
        .values()
        .filter(|v| !want.contains_key(&def("public.t").key_of(v)))
        .collect();
    assert_eq!(kept.len(), 4, "rows 1-4 stay in the sink: {kept:?}");
    assert!(
        kept.iter()
            .any(|v| v[1] == Value::Utf8("before the truncate".into())),
        "the change before the TRUNCATE was lost: {kept:?}"
    );

    // The key left in place is harmless, and said to be stale.
    pg.sql(db, "INSERT INTO t VALUES (12, 'later');");
    let said = drain_ok(&pipeline);
    assert!(said.contains("remove the key"), "{said}");
    let (got, _) = sink_rows(&root, &def("public.t"));
    assert!(got.contains_key(&def("public.t").key_of(&[Value::Int32(12), Value::Null])));
}
