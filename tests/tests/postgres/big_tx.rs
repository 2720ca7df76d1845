//! A transaction bigger than a batch against a real server (scripts/pg):
//! the source hands it on in pieces of a batch as it arrives, so memory
//! stays bounded, and a kill between two pieces loses nothing and repeats
//! nothing.
//!
//! While a sink takes longer to commit a piece than the server's
//! `wal_sender_timeout`, the replication session must keep answering the
//! server, or the server drops it and sends the transaction again.
//!
//! The transaction inserts 200,000 rows, updates and deletes some of them
//! again in later pieces (the last value per key must win), and updates
//! rows of a second table leaving their TOASTed column out (looked up per
//! piece).

use crate::common;
use crate::postgres_support;
use weir_source::commit_order::StreamPosition;

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use postgres_support::*;
use weir_core::position::Position;
use weir_source::postgres::decode::PgKind;

const BIG_ROWS: u64 = 200_000;

const SCHEMA: &str = r#"
CREATE TABLE big (id bigint PRIMARY KEY, n int4 NOT NULL, note text);
CREATE TABLE docs (id int4 PRIMARY KEY, title text NOT NULL, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
INSERT INTO docs SELECT g, 'title ' || g,
    (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 200) i)
  FROM generate_series(1, 50) g;
"#;

/// One transaction of 206,050 changes in both tables; the docs updates
/// come last and leave `body` out (unchanged TOAST).
fn big_transaction() -> String {
    format!(
        "BEGIN;\n\
         INSERT INTO big SELECT g, g % 7, 'row ' || g FROM generate_series(1, {BIG_ROWS}) g;\n\
         UPDATE big SET n = -1, note = 'again' WHERE id <= 5000;\n\
         DELETE FROM big WHERE id BETWEEN 5001 AND 6000;\n\
         UPDATE docs SET title = 'in the big transaction ' || id;\n\
         COMMIT;\n"
    )
}

fn table_defs() -> Vec<TableDef> {
    use PgKind::*;
    vec![
        TableDef::new(
            "public.big",
            &[("id", Int64), ("n", Int32), ("note", Text)],
            &[0],
        ),
        TableDef::new(
            "public.docs",
            &[("id", Int32), ("title", Text), ("body", Text)],
            &[0],
        ),
    ]
}

/// A pipeline into the positioned fixture with batches of `batch_rows`.
fn pipeline(dsn: &str, dir: &Path, root: &Path, batch_rows: usize) -> PathBuf {
    let mut config = PgPipeline::new(dsn, &["public.big", "public.docs"]);
    config.max_rows = batch_rows;
    config.write(dir, root)
}

/// The position each committed batch of a table stands at, in commit order.
fn batch_positions(root: &Path, table: &str) -> Vec<Position> {
    common::read_positioned(root, table)
        .iter()
        .map(|b| {
            let hex = b.schema().metadata()["weir.position"].clone();
            Position::from_hex(&hex).unwrap()
        })
        .collect()
}

/// The commit LSN of the big transaction and the position of its last
/// change, as the sink holds them after a full run.
fn big_transaction_span(root: &Path) -> (u64, Position) {
    let mut lsn = None;
    let mut last: Option<Position> = None;
    for table in ["public.big", "public.docs"] {
        for batch in common::read_positioned(root, table) {
            let ids = batch.column_by_name("id").unwrap();
            let positions = batch.column_by_name("__pos").unwrap().as_binary::<i32>();
            for row in 0..batch.num_rows() {
                let pos = Position::from_bytes(positions.value(row).to_vec());
                let Some((at, _)) = pos.as_stream() else {
                    continue;
                };
                // Row 1 of `big` is inserted only by the big transaction.
                if table == "public.big"
                    && common::value_at(ids.as_ref(), row) == weir_source::change::Value::Int64(1)
                {
                    lsn = Some(at);
                }
                if last.as_ref().is_none_or(|l| pos > *l) {
                    last = Some(pos);
                }
            }
        }
    }
    let lsn = lsn.expect("the big transaction's first row reached the sink");
    let last = last.unwrap();
    assert_eq!(
        last.as_stream().unwrap().0,
        lsn,
        "the last change is the big transaction's"
    );
    (lsn, last)
}

/// Backfills the (small) tables and leaves the pipeline streaming.
fn set_up(db: &str, batch_rows: usize) -> (Pg, String, tempfile::TempDir, PathBuf, PathBuf) {
    let pg = cluster();
    let dsn = pg.fresh_db(db);
    pg.sql(db, SCHEMA);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = pipeline(&dsn, dir.path(), &root, batch_rows);
    drain(&pipeline);
    (pg, dsn, dir, root, pipeline)
}

/// Runs `weir run` until caught up and returns its output and peak RSS in
/// MiB (the process's own high-water mark, see `common::measure`).
fn run_measured(pipeline: &Path) -> (String, f64) {
    let dir = pipeline.parent().unwrap();
    let (out_path, err_path) = (dir.join("run.stdout"), dir.join("run.stderr"));
    let child = common::weir_command()
        .args(["run", pipeline.to_str().unwrap()])
        .env("WEIR_LOG", "warn")
        .env("WEIR_PG_EXIT", "true")
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("weir runs");
    let usage = common::measure::wait_measured(child);
    let said = format!(
        "{}{}",
        std::fs::read_to_string(&out_path).unwrap_or_default(),
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    assert!(
        usage.status.success(),
        "weir run failed ({}): {said}",
        usage.status
    );
    (said, usage.peak_rss_mb)
}

/// How much more than a run of no rows the run of the big transaction may
/// hold at its peak. Held whole, its 206,050 changes take about 70 MB more;
/// in pieces of a 2,000-row batch, a few.
const BIG_TX_EXTRA_MB: f64 = 40.0;

#[test]
fn a_big_transaction_reaches_the_sink_in_pieces_in_bounded_memory() {
    let (pg, _dsn, _dir, root, pipeline) = set_up("weir_big_tx", 2_000);
    let (_, idle_mb) = run_measured(&pipeline);
    pg.sql("weir_big_tx", &big_transaction());
    let (said, big_mb) = run_measured(&pipeline);

    assert_sink_equals_postgres(&pg, "weir_big_tx", &root, &table_defs());
    // Handed on in pieces, it is still one source transaction to the report.
    assert!(
        said.contains(" changes in 1 transactions,"),
        "the run's report did not count one transaction: {said}"
    );
    let (lsn, last) = big_transaction_span(&root);
    let inside = batch_positions(&root, "public.big")
        .into_iter()
        .chain(batch_positions(&root, "public.docs"))
        .filter(|p| p.as_stream().is_some_and(|(at, _)| at == lsn) && *p < last)
        .count();
    assert!(
        inside > 0,
        "every commit of the transaction at LSN {lsn:X} stood at its end ({last})"
    );
    println!(
        "{inside} commits inside the transaction; peak RSS {big_mb:.0} MB, {idle_mb:.0} MB for \
         a run of no rows"
    );
    assert!(
        big_mb - idle_mb < BIG_TX_EXTRA_MB,
        "streaming the big transaction peaked at {big_mb:.0} MB, {:.0} MB over a run of no rows \
         ({idle_mb:.0} MB): it was held, not handed on in pieces",
        big_mb - idle_mb
    );
}

#[test]
fn a_kill_between_pieces_of_a_big_transaction_loses_and_repeats_nothing() {
    let (pg, dsn, _dir, root, pipeline) = set_up("weir_big_tx_kill", 2_000);
    pg.sql("weir_big_tx_kill", &big_transaction());
    let before = batch_positions(&root, "public.big").len();

    // Killed after a few commits of the run that receives the transaction.
    let out = common::weir(
        &["run", pipeline.to_str().unwrap()],
        &[
            ("WEIR_PG_EXIT", "true"),
            ("WEIR_FAILPOINT", "after-sink-commit@6"),
        ],
    );
    let killed = String::from_utf8_lossy(&out.stderr).contains("failpoint after-sink-commit");
    let at_kill = batch_positions(&root, "public.big");
    let committed_at_kill = at_kill.last().cloned();
    let new_commits = at_kill.len() - before;
    let confirmed = pg.confirmed_flush("weir_big_tx_kill", &slot_of(&dsn));

    drain(&pipeline);
    assert_sink_equals_postgres(&pg, "weir_big_tx_kill", &root, &table_defs());
    let (lsn, last) = big_transaction_span(&root);
    let inside = committed_at_kill
        .as_ref()
        .is_some_and(|p| p.as_stream().is_some_and(|(at, _)| at == lsn) && *p < last);
    if !killed || !inside {
        panic!(
            "INCONCLUSIVE: the kill (landed: {killed}) did not fall inside the transaction at LSN \
             {lsn:X}: the sink stood at {committed_at_kill:?} after {new_commits} commits \
             ({})",
            common::text(&out)
        );
    }
    // The slot was never confirmed past a transaction only partly committed:
    // the server must send it again.
    let confirmed = confirmed.expect("the slot");
    assert!(
        confirmed <= lsn,
        "confirmed_flush_lsn {confirmed:X} passed the partly committed transaction at {lsn:X}"
    );
    println!(
        "killed with the sink at {} inside the transaction at LSN {lsn:X}: sink equals Postgres",
        committed_at_kill.unwrap()
    );
}

#[test]
fn the_server_is_answered_while_a_slow_sink_commits_the_pieces() {
    let db = "weir_big_tx_slow";
    let pg = cluster();
    let dsn = pg.fresh_db(db);
    // Walsenders of this database drop a client silent for a second.
    pg.sql(
        "weir",
        &format!("ALTER DATABASE {db} SET wal_sender_timeout = '1s';"),
    );
    pg.sql(db, SCHEMA);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut config = PgPipeline::new(&dsn, &["public.big", "public.docs"]);
    config.max_rows = 10_000;
    // Each commit into it takes 2.5 s, during which nothing reads the
    // stream: only the replication client's own status updates keep the
    // session alive.
    config.extra_sinks = format!(
        "  - name: slow\n    plugin: {}\n    blob_store: {{ url: \"memory://\" }}\n    config: {{ mode: sleep-in-commit, sleep_ms: \"2500\" }}\n",
        common::plugin("weir-fixture-stall").display()
    );
    let pipeline = config.write(dir.path(), &root);
    drain(&pipeline);
    pg.sql(
        db,
        "INSERT INTO big SELECT g, g % 7, 'row ' || g FROM generate_series(1, 25000) g;",
    );
    let out = common::weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true")],
    );
    let said = common::text(&out);
    assert!(out.status.success(), "the run failed: {said}");
    assert!(
        !said.contains("replication stream lost"),
        "the server dropped the session while the sink committed: {said}"
    );
    let defs = table_defs();
    assert_sink_equals_postgres(&pg, db, &root, &defs);
    let (lsn, last) = big_transaction_span(&root);
    let pieces = batch_positions(&root, "public.big")
        .into_iter()
        .filter(|p| p.as_stream().is_some_and(|(at, _)| at == lsn) && *p < last)
        .count();
    assert!(
        pieces > 0,
        "the transaction was committed whole: no commit waited inside it"
    );
}
