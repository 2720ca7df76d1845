//! What happens to the tables while weir starts: a column added after the
//! source read the table but before the slot's snapshot was taken reaches
//! the sink with the values set in it before the snapshot (the backfill
//! used to read the older column list, and those rows arrived with a null
//! there; CI caught it once in a typed workload run under load).

use crate::postgres_support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::weir_command;
use postgres_support::*;
use weir_source::postgres::decode::PgKind;

/// Waits up to 30 s for `sql` (one value) to say `t`.
fn wait_until(pg: &Pg, db: &str, sql: &str, what: &str) {
    let started = Instant::now();
    while pg.value(db, sql) != "t" {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "waited 30 s for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_column_added_before_the_slots_snapshot_reaches_the_sink_with_its_values() {
    let pg = cluster();
    let db = "weir_start_add";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE t (id int4 PRIMARY KEY, v text);\n\
         CREATE TABLE hold (id int4);\n\
         INSERT INTO t SELECT i, 'row ' || i FROM generate_series(1, 20) i;",
    );

    // A transaction left open (it has written, so it has an id): creating
    // the slot waits for it to end before it takes its snapshot, which
    // opens the window between weir reading the table and the snapshot.
    let mut holder = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &dsn])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut holding = holder.stdin.take().unwrap();
    holding
        .write_all(b"BEGIN;\nINSERT INTO hold VALUES (1);\n")
        .unwrap();
    holding.flush().unwrap();
    wait_until(
        &pg,
        db,
        &format!(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = '{db}' \
             AND state = 'idle in transaction' AND backend_xid IS NOT NULL"
        ),
        "the holding transaction",
    );

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.t"]).write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut run = spawn_weir(&pipeline, &log);
    // The source reads the table before it creates the slot: once the
    // slot's creation waits, the table was read with two columns.
    wait_until(
        &pg,
        db,
        &format!(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = '{db}' \
             AND pid <> pg_backend_pid() \
             AND (query ILIKE '%CREATE_REPLICATION_SLOT%' \
                  OR query ILIKE '%pg_create_logical_replication_slot%')"
        ),
        "weir to wait in creating its slot",
    );
    pg.sql(
        db,
        "ALTER TABLE t ADD COLUMN extra int4;\n\
         UPDATE t SET extra = id * 10 WHERE id <= 5;",
    );
    holding.write_all(b"COMMIT;\n").unwrap();
    drop(holding);
    assert!(holder.wait().unwrap().success(), "the holding psql failed");

    // Changes after the snapshot, streamed in the new shape.
    pg.sql(db, "UPDATE t SET extra = -1 WHERE id = 20;");
    std::thread::sleep(Duration::from_millis(1500));
    interrupt(&mut run);
    assert!(
        run.wait().unwrap().success(),
        "the run failed: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let drain_log = dir.path().join("drain.log");
    let drained = weir_command()
        .args(["run", pipeline.to_str().unwrap()])
        .env("WEIR_PG_EXIT", "true")
        .env("WEIR_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&drain_log).unwrap())
        .status()
        .unwrap();
    let logs = || {
        format!(
            "--- the first run ---\n{}\n--- the draining run ---\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            std::fs::read_to_string(&drain_log).unwrap_or_default()
        )
    };
    assert!(drained.success(), "the draining run failed\n{}", logs());

    let table = TableDef::new(
        "public.t",
        &[
            ("id", PgKind::Int32),
            ("v", PgKind::Text),
            ("extra", PgKind::Int32),
        ],
        &[0],
    );
    // Once seen in CI under load: the update streamed after the snapshot
    // (row 20) missing from the sink. The logs say what each run did.
    let compared =
        std::panic::catch_unwind(|| assert_sink_equals_postgres(&pg, db, &root, &[table]));
    if let Err(failure) = compared {
        eprintln!("{}", logs());
        std::panic::resume_unwind(failure);
    }
}
