//! The Postgres source refuses what would lose or corrupt changes without a
//! word, against a real server (scripts/pg): a required sink restored
//! behind the slot, a backfill that lost its snapshot, and declared keys
//! (`source.postgres.keys`) that the replica identity does not cover, at
//! the start and when the replica identity changes while streaming.

use crate::common;
use crate::postgres_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{text, weir};
use postgres_support::*;
use weir_source::postgres::decode::PgKind;

/// The positioned sink's data files, by path.
fn sink_files(root: &Path) -> BTreeSet<PathBuf> {
    let mut files = BTreeSet::new();
    let Ok(tables) = std::fs::read_dir(root) else {
        return files;
    };
    for table in tables.flatten() {
        if let Ok(entries) = std::fs::read_dir(table.path()) {
            files.extend(entries.flatten().map(|e| e.path()));
        }
    }
    files
}

/// Waits until `child` exits, up to `limit`; None if it is still running.
fn exit_within(child: &mut Running, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn a_required_sink_restored_behind_the_slot_stops_the_run_naming_both_positions() {
    let pg = cluster();
    let db = "weir_fid_restore";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a');",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.t"]).write(dir.path(), &root);
    pg.sql(db, "INSERT INTO t VALUES (2, 'b');");
    drain(&pipeline);
    pg.sql(db, "INSERT INTO t VALUES (3, 'c');");
    drain(&pipeline);
    // The sink as a backup taken now would hold it.
    let backup = sink_files(&root);
    pg.sql(
        db,
        "INSERT INTO t VALUES (4, 'd'); UPDATE t SET v = 'z' WHERE id = 1;",
    );
    drain(&pipeline);
    let confirmed = pg.confirmed_flush(db, &slot_of(&dsn)).expect("slot");

    // Restore the backup: the sink forgets what it committed since.
    for file in sink_files(&root).difference(&backup) {
        std::fs::remove_file(file).unwrap();
    }
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let confirmed_text = format!("{:X}/{:X}", confirmed >> 32, confirmed & 0xffff_ffff);
    assert!(
        said.contains("confirmed_flush_lsn")
            && said.contains(&confirmed_text)
            && said.contains("no longer on the server"),
        "the error should name the slot's position and say the changes are gone: {said}"
    );
    // Nothing was acknowledged past where the restored sink stands.
    assert_eq!(pg.confirmed_flush(db, &slot_of(&dsn)), Some(confirmed));
}

/// An optional sink restored behind the slot cannot catch up: it is left
/// out of the run with the reason (exit 3), and the required sink goes on
/// and stays equal to Postgres; the slot still moves for it.
#[test]
fn an_optional_sink_restored_behind_the_slot_is_left_out_and_the_rest_goes_on() {
    let pg = cluster();
    let db = "weir_fid_restore_optional";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a');",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let behind_root = dir.path().join("behind");
    let mut p = PgPipeline::new(&dsn, &["public.t"]);
    p.extra_sinks = format!(
        "  - name: behind\n    plugin: {}\n    required: false\n    blob_store: {{ url: {} }}\n",
        common::plugin("weir-fixture-positioned").display(),
        behind_root.display()
    );
    let pipeline = p.write(dir.path(), &root);
    pg.sql(db, "INSERT INTO t VALUES (2, 'b');");
    drain(&pipeline);
    let backup = sink_files(&behind_root);
    pg.sql(
        db,
        "INSERT INTO t VALUES (3, 'c'); UPDATE t SET v = 'z' WHERE id = 1;",
    );
    drain(&pipeline);
    let confirmed = pg.confirmed_flush(db, &slot_of(&dsn)).expect("slot");
    for file in sink_files(&behind_root).difference(&backup) {
        std::fs::remove_file(file).unwrap();
    }
    pg.sql(db, "INSERT INTO t VALUES (4, 'd');");
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("behind") && said.contains("cannot catch up"),
        "the report should say why the optional sink was left out: {said}"
    );
    let def = TableDef::new(
        "public.t",
        &[("id", PgKind::Int32), ("v", PgKind::Text)],
        &[0],
    );
    assert_sink_equals_postgres(&pg, db, &root, &[def]);
    let after = pg.confirmed_flush(db, &slot_of(&dsn)).expect("slot");
    assert!(
        after > confirmed,
        "the slot should move for the required sink"
    );
}

#[test]
fn a_backfill_that_loses_its_snapshot_fails_the_run_and_the_next_run_completes_it() {
    let pg = cluster();
    let db = "weir_fid_snapshot";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, v text); \
         INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 60000) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut p = PgPipeline::new(&dsn, &["public.t"]);
    p.chunk_rows = 50;
    let pipeline = p.write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&pipeline, &log);

    // The backfill's session holds the imported snapshot in an open
    // transaction, reading a COPY or idle between chunks: end that
    // connection under it. Any statement has a transaction, so the catalog
    // reads before the snapshot is imported must not match: the log says
    // when it is, and the session's state says it is that transaction.
    let find = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = '{db}' AND application_name = 'weir' AND backend_type = 'client backend' \
         AND (state = 'idle in transaction' OR query LIKE 'COPY %') AND pid <> pg_backend_pid()"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !said.contains("backfill complete"),
            "inconclusive: the backfill ended before its snapshot session was seen: {said}"
        );
        if said.contains("backfill reads the slot's exported snapshot")
            && pg.value(db, &find) == "t"
        {
            break;
        }
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "never saw the backfill's snapshot session: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let backfilled_rows: usize = common::read_positioned(&root, "public.t")
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert!(
        backfilled_rows < 60_000,
        "inconclusive: the backfill had already ended"
    );

    let status = exit_within(&mut child, Duration::from_secs(60));
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the run went on outside the snapshot ({status:?}): {said}"
    );
    assert!(
        said.contains("snapshot") && said.contains("public.t"),
        "the error should say the backfill lost its snapshot: {said}"
    );

    // The next run resumes after the last committed chunk and ends equal.
    drain(&pipeline);
    let def = TableDef::new(
        "public.t",
        &[("id", PgKind::Int32), ("v", PgKind::Text)],
        &[0],
    );
    assert_sink_equals_postgres(&pg, db, &root, &[def]);
}

/// A run of the `orders` pipeline with `order_no` declared as the key;
/// returns its output when it fails, None when it drains.
fn run_with_declared_key(pg: &Pg, db: &str, dir: &Path) -> Option<String> {
    let mut p = PgPipeline::new(&pg.dsn(db), &["public.orders"]);
    p.extra_source = "    keys: { public.orders: [order_no] }\n".into();
    let pipeline = p.write(dir, &dir.join("exact"));
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    (!out.status.success()).then(|| text(&out))
}

#[test]
fn a_declared_key_must_be_in_the_replica_identity_not_null_and_unique() {
    let pg = cluster();
    let db = "weir_fid_keys";
    pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE orders (id int PRIMARY KEY, order_no int, note text); \
         INSERT INTO orders VALUES (1, 10, 'a'), (2, 20, 'b');",
    );
    let dir = tempfile::tempdir().unwrap();

    // The replica identity is the primary key: an update of order_no would
    // leave the old row behind, a delete would come without order_no.
    let said = run_with_declared_key(&pg, db, dir.path()).expect("refused");
    assert!(
        said.contains("public.orders")
            && said.contains("order_no")
            && said.contains("replica identity"),
        "{said}"
    );

    pg.sql(db, "ALTER TABLE orders REPLICA IDENTITY FULL;");
    let said = run_with_declared_key(&pg, db, dir.path()).expect("refused");
    assert!(
        said.contains("public.orders") && said.contains("order_no") && said.contains("NOT NULL"),
        "{said}"
    );

    pg.sql(db, "ALTER TABLE orders ALTER COLUMN order_no SET NOT NULL;");
    let said = run_with_declared_key(&pg, db, dir.path()).expect("refused");
    assert!(
        said.contains("public.orders") && said.contains("order_no") && said.contains("unique"),
        "{said}"
    );

    pg.sql(db, "CREATE UNIQUE INDEX orders_no ON orders (order_no);");
    assert_eq!(run_with_declared_key(&pg, db, dir.path()), None);

    // The identity may also be that index rather than FULL.
    pg.sql(
        db,
        "ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_no; \
         UPDATE orders SET order_no = 11 WHERE id = 1; DELETE FROM orders WHERE id = 2;",
    );
    assert_eq!(run_with_declared_key(&pg, db, dir.path()), None);
    let def = TableDef::new(
        "public.orders",
        &[
            ("id", PgKind::Int32),
            ("order_no", PgKind::Int32),
            ("note", PgKind::Text),
        ],
        &[1],
    );
    assert_sink_equals_postgres(&pg, db, &dir.path().join("exact"), &[def]);
}

#[test]
fn a_replica_identity_that_stops_covering_the_key_while_streaming_stops_the_run() {
    let pg = cluster();
    let db = "weir_fid_identity";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE orders (id int PRIMARY KEY, order_no int NOT NULL, note text); \
         CREATE UNIQUE INDEX orders_no ON orders (order_no); \
         ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_no; \
         INSERT INTO orders VALUES (1, 10, 'a'), (2, 20, 'b');",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut p = PgPipeline::new(&dsn, &["public.orders"]);
    p.extra_source = "    keys: { public.orders: [order_no] }\n".into();
    let pipeline = p.write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&pipeline, &log);
    // Streaming once a change made after the start has reached the sink.
    pg.sql(db, "INSERT INTO orders VALUES (3, 30, 'c');");
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink_rows(
        &root,
        &TableDef::new(
            "public.orders",
            &[
                ("id", PgKind::Int32),
                ("order_no", PgKind::Int32),
                ("note", PgKind::Text),
            ],
            &[1],
        ),
    )
    .0
    .len()
        < 3
    {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the run did not stream: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    pg.sql(
        db,
        "ALTER TABLE orders REPLICA IDENTITY DEFAULT; \
         UPDATE orders SET order_no = 12 WHERE id = 1;",
    );
    let status = exit_within(&mut child, Duration::from_secs(30));
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the run went on with a key the replica identity no longer covers ({status:?}): {said}"
    );
    assert!(
        said.contains("public.orders")
            && said.contains("order_no")
            && said.contains("replica identity"),
        "{said}"
    );
}
