//! The Postgres source against a real server (scripts/pg): a typed workload
//! of inserts, updates, deletes, key changes, multi-table transactions,
//! unchanged TOAST values and an ADD COLUMN ends with the positioned sink
//! equal to the source tables, compared row by row with what Postgres
//! itself returns. Plus the refusals: other DDL, tables without a key, a
//! slot dropped after the start; and an idle database that still releases WAL.

use crate::common;
use crate::postgres_support;
use weir_source::commit_order::StreamPosition;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{text, weir};
use postgres_support::*;
use weir_source::postgres::decode::PgKind;

#[test]
fn a_typed_workload_reaches_the_sink_equal_to_postgres_row_by_row() {
    let pg = cluster();
    let db = "weir_types";
    let dsn = pg.fresh_db(db);
    typed_workload_reaches_the_sink(&pg, db, &dsn);
}

/// The same over the Unix socket, as a weir on the database's own host
/// connects: that session is read unpaced (`source/postgres/reader.rs`),
/// the backfill and look-ups go the same way.
#[test]
fn a_typed_workload_over_the_unix_socket_reaches_the_sink_equal_to_postgres() {
    let pg = cluster();
    let db = "weir_types_unix";
    pg.fresh_db(db);
    let dsn = pg.unix_dsn(db);
    typed_workload_reaches_the_sink(&pg, db, &dsn);
}

/// Backfills a seeded load, streams a workload with an ADD COLUMN in it,
/// stops, streams more, drains; then the sink must equal Postgres and the
/// slot must be confirmed exactly up to what the sink committed.
fn typed_workload_reaches_the_sink(pg: &Pg, db: &str, dsn: &str) {
    pg.sql(db, SCHEMA);
    let mut rng = Rng::seeded(0x5eed_1234_abcd_0001);
    pg.sql(db, &initial_load(400, 300, 30, &mut rng));

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(dsn, &TABLES).write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&pipeline, &log);

    pg.sql(db, &workload(&mut rng, 300, 1_000, false));
    assert_eq!(
        replication_over_unix_socket(pg, db, &slot_of(dsn)),
        dsn.contains("host=/"),
        "the replication session did not go the way {dsn:?} says"
    );
    pg.sql(db, "ALTER TABLE shop.orders ADD COLUMN priority int4;");
    pg.sql(db, &workload(&mut rng, 300, 2_000, true));
    std::thread::sleep(Duration::from_millis(1500));
    interrupt(&mut child);
    assert!(
        child.wait().unwrap().success(),
        "the streaming run failed: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // More after the stop, then a run that drains to the current WAL position.
    pg.sql(db, &workload(&mut rng, 100, 3_000, true));
    drain(&pipeline);

    assert_sink_equals_postgres(pg, db, &root, &table_defs(true));
    let toast_untouched = pg.value(
        db,
        "SELECT count(*) FROM shop.docs WHERE body IS NOT NULL AND title LIKE 'title %' AND length(body) > 10000",
    );
    assert_ne!(
        toast_untouched, "0",
        "no document kept a TOASTed body through title-only updates"
    );

    // The slot was acknowledged up to what the sink committed, never past
    // it: the clean exit leaves the server with its last acknowledgement.
    assert_slot_confirmed_where_the_sink_stands(pg, db, dsn, &pipeline);
}

/// The slot's confirmed position is exactly where the sink `exact` of
/// `pipeline` stands on its least advanced table: never past it, and, after
/// a clean exit, not short of it either.
fn assert_slot_confirmed_where_the_sink_stands(
    pg: &Pg,
    db: &str,
    dsn: &str,
    pipeline: &std::path::Path,
) {
    let status = common::status(pipeline);
    let positions = common::positions_of(&status, "exact");
    let lowest = positions
        .values()
        .map(|p| {
            weir_core::position::Position::from_bytes(p.clone().expect("every table committed"))
        })
        .min()
        .unwrap();
    let (lsn, ordinal) = lowest
        .as_stream()
        .expect("streaming positions after the drain");
    let lsn = if ordinal == u32::MAX { lsn + 1 } else { lsn };
    let confirmed = pg.confirmed_flush(db, &slot_of(dsn)).expect("slot");
    assert!(
        confirmed <= lsn,
        "confirmed_flush_lsn {confirmed:X} passed the sink's {lsn:X}"
    );
    assert_eq!(
        confirmed, lsn,
        "confirmed_flush_lsn {confirmed:X} short of the sink's {lsn:X} after a clean exit"
    );
}

/// `exit_when_caught_up` ends the run as soon as the sinks hold what the
/// server had when it started, and the server has the last acknowledgement
/// at once: the replication client sends acknowledgements once per
/// `status_interval_ms` (a minute here), and the run does not wait for the
/// next one. Prints what an already caught-up run costs against
/// `weir status` of the same pipeline (both start the process, load the
/// compiled plugin and connect; the run also starts replication and stops
/// it): a ratio, not an assertion.
#[test]
fn a_caught_up_run_ends_with_the_slot_confirmed_without_waiting_for_a_status_update() {
    let pg = cluster();
    let db = "weir_caught_up";
    let dsn = pg.fresh_db(db);
    pg.sql(db, "CREATE TABLE t (id int PRIMARY KEY, v text)");
    pg.sql(
        db,
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g",
    );

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.t"]).write(dir.path(), &root);
    let yaml = std::fs::read_to_string(&pipeline).unwrap();
    let slow_updates = yaml.replace("status_interval_ms: 200", "status_interval_ms: 60000");
    assert_ne!(
        yaml, slow_updates,
        "the pipeline file names no status_interval_ms"
    );
    std::fs::write(&pipeline, slow_updates).unwrap();

    drain(&pipeline); // the backfill
    pg.sql(db, "UPDATE t SET v = v || '!' WHERE id % 3 = 0");
    pg.sql(db, "DELETE FROM t WHERE id % 7 = 0");
    let started = Instant::now();
    drain(&pipeline);
    let streamed = started.elapsed();
    assert_sink_equals_postgres(
        &pg,
        db,
        &root,
        &[TableDef::new(
            "public.t",
            &[("id", PgKind::Int32), ("v", PgKind::Text)],
            &[0],
        )],
    );
    assert_slot_confirmed_where_the_sink_stands(&pg, db, &dsn, &pipeline);

    let median = |mut times: Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let (mut caught_up, mut status) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let started = Instant::now();
        drain(&pipeline);
        caught_up.push(started.elapsed());
        let started = Instant::now();
        common::status(&pipeline);
        status.push(started.elapsed());
    }
    let (caught_up, status) = (median(caught_up), median(status));
    println!(
        "a caught-up run {caught_up:?} against `weir status` {status:?}: {:.2}x \
         (the run that streamed two transactions: {streamed:?})",
        caught_up.as_secs_f64() / status.as_secs_f64()
    );
}

/// Whether the walsender serving `slot` talks to a Unix socket (Postgres
/// shows no client address for one), once it is up.
fn replication_over_unix_socket(pg: &Pg, db: &str, slot: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = pg.value(
            db,
            &format!(
                "SELECT r.client_addr IS NULL FROM pg_stat_replication r \
                 JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = '{slot}'"
            ),
        );
        match seen.as_str() {
            "t" => return true,
            "f" => return false,
            _ => {}
        }
        assert!(Instant::now() < deadline, "slot {slot} never became active");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Table `t (id, a, b)` with a row, in a fresh database `db`, and a
/// pipeline of it into `root` (`exact` in the returned folder).
fn table_of_three_columns(pg: &Pg, db: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, a text, b text); INSERT INTO t VALUES (1, 'a', 'b');",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.t"]).write(dir.path(), &root);
    (dir, root, pipeline)
}

#[test]
fn ddl_other_than_add_column_stops_the_pipeline_with_a_clear_message() {
    let pg = cluster();
    let db = "weir_ddl";
    let (_dir, _root, pipeline) = table_of_three_columns(&pg, db);
    drain(&pipeline);
    pg.sql(
        db,
        "ALTER TABLE t DROP COLUMN b; INSERT INTO t VALUES (2, 'x');",
    );
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("public.t") && said.contains("dropped") && said.contains("DDL"),
        "the message should name the table and the DDL: {said}"
    );
}

/// The last column dropped while weir streams: Postgres then describes
/// the table as it was before that column was added, and the rows after
/// the drop look like WAL from before an ADD COLUMN. The run must stop
/// naming the column, not write null into it and go on.
#[test]
fn the_last_column_dropped_while_weir_streams_stops_the_pipeline_naming_it() {
    let pg = cluster();
    let db = "weir_ddl_live";
    let (dir, root, pipeline) = table_of_three_columns(&pg, db);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&pipeline, &log);
    // Streaming: the backfill, read in the slot's snapshot, is committed.
    let committed = root.join("public.t");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&committed).map_or(true, |mut d| d.next().is_none()) {
        assert!(
            Instant::now() < deadline,
            "the backfill was not committed in 30 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    pg.sql(
        db,
        "ALTER TABLE t DROP COLUMN b; INSERT INTO t VALUES (2, 'x');",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            interrupt(&mut child);
            child.wait().unwrap();
            panic!(
                "weir went on streaming after the drop: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("public.t") && said.contains("`b`") && said.contains("dropped"),
        "the message should name the table and the column: {said}"
    );
}

#[test]
fn a_table_without_a_key_is_refused_unless_its_key_is_declared_or_it_is_append_only() {
    let pg = cluster();
    let db = "weir_nokey";
    let dsn = pg.fresh_db(db);
    pg.sql(db, "CREATE TABLE events (id int NOT NULL, what text); CREATE UNIQUE INDEX ON events (id); INSERT INTO events VALUES (1, 'a'), (2, 'b');");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut p = PgPipeline::new(&dsn, &["public.events"]);
    let pipeline = p.write(dir.path(), &root);
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("public.events has no primary key"), "{said}");
    assert!(said.contains("keys") && said.contains("append"), "{said}");

    // Declared key: works, and streams updates by it.
    p.extra_source = "    keys: { public.events: [id] }\n".into();
    let pipeline = p.write(dir.path(), &root);
    pg.sql(db, "ALTER TABLE events REPLICA IDENTITY FULL;");
    drain(&pipeline);
    pg.sql(
        db,
        "UPDATE events SET what = 'c' WHERE id = 2; INSERT INTO events VALUES (3, 'd');",
    );
    drain(&pipeline);
    let def = TableDef::new(
        "public.events",
        &[("id", PgKind::Int32), ("what", PgKind::Text)],
        &[0],
    );
    assert_sink_equals_postgres(&pg, db, &root, &[def]);

    // Append mode: accepted without a key.
    let db2 = "weir_append";
    let dsn2 = pg.fresh_db(db2);
    pg.sql(
        db2,
        "CREATE TABLE events (id int, what text); INSERT INTO events VALUES (1, 'a');",
    );
    let dir2 = tempfile::tempdir().unwrap();
    let mut p2 = PgPipeline::new(&dsn2, &["public.events"]);
    p2.extra_top = "tables:\n  public.events: { mode: append }\n".into();
    let pipeline2 = p2.write(dir2.path(), &dir2.path().join("exact"));
    drain(&pipeline2);
    pg.sql(db2, "INSERT INTO events VALUES (2, 'b');");
    drain(&pipeline2);
    let rows = common::read_positioned(&dir2.path().join("exact"), "public.events");
    let n: usize = rows.iter().map(|b| b.num_rows()).sum();
    assert_eq!(n, 2, "append mode carries every row");
}

#[test]
fn a_dropped_slot_after_the_start_is_an_error_that_says_what_to_do() {
    let pg = cluster();
    let db = "weir_noslot";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1);",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.t"]).write(dir.path(), &root);
    drain(&pipeline);
    pg.sql(db, "INSERT INTO t VALUES (2);");
    drain(&pipeline);
    pg.sql(db, "SELECT pg_drop_replication_slot('weir_noslot_slot');");
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&slot_of(&dsn))
            && said.contains("no longer exists")
            && said.contains("state directory"),
        "{said}"
    );
    // Nothing was backfilled again.
    let rows: usize = common::read_positioned(&root, "public.t")
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(rows, 2);
}

#[test]
fn an_idle_database_with_unpublished_writes_still_advances_the_slot() {
    let pg = cluster();
    let db = "weir_idle";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE published (id int PRIMARY KEY); CREATE TABLE other (id serial PRIMARY KEY, pad text); INSERT INTO published VALUES (1);",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.published"]).write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&pipeline, &log);
    // The first run compiles the sink and creates the slot.
    let deadline = Instant::now() + Duration::from_secs(60);
    let start = loop {
        if let Some(lsn) = pg.confirmed_flush(db, &slot_of(&dsn)) {
            break lsn;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not create the slot: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for _ in 0..5 {
        pg.sql(
            db,
            "INSERT INTO other (pad) SELECT repeat('x', 500) FROM generate_series(1, 2000);",
        );
    }
    let written = parse_lsn(&pg.value(db, "SELECT pg_current_wal_lsn()")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut now = start;
    while Instant::now() < deadline {
        now = pg.confirmed_flush(db, &slot_of(&dsn)).unwrap();
        if now >= written {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    child.kill().ok();
    child.wait().ok();
    assert!(
        now >= written,
        "confirmed_flush_lsn stayed at {now:X} (started {start:X}) while the WAL grew to {written:X}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
