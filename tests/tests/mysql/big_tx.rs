//! A transaction bigger than a batch: the MySQL source hands it on in
//! pieces of a batch as the binlog brings it, so memory stays bounded. The
//! transaction inserts `WEIR_MY_BIG_ROWS` rows (200,000 by default; the
//! issue's 5,000,000 on demand), then updates and deletes some of them
//! again in later pieces; the sink must equal MariaDB, the run's peak RSS
//! must stay within a bound over a run of no rows, and with five million
//! rows under 500 MB.
//!
//!     WEIR_MY_BIG_ROWS=5000000 cargo nextest run -p weir-tests --test mysql big_tx

use std::path::Path;

use crate::common;
use crate::mysql_support::*;
use weir_core::position::Position;

/// How much more than a run of no rows the big transaction's run may hold
/// at its peak: pieces of 2,000 rows and a few in flight.
const BIG_TX_EXTRA_MB: f64 = 40.0;
/// The bound for five million rows, for the whole process.
const FIVE_MILLION_MB: f64 = 500.0;

fn big_rows() -> u64 {
    std::env::var("WEIR_MY_BIG_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

/// Runs `weir run` until caught up: its output and peak RSS in MiB.
fn run_measured(pipeline: &Path) -> (String, f64) {
    let dir = pipeline.parent().unwrap();
    let (out_path, err_path) = (dir.join("run.stdout"), dir.join("run.stderr"));
    let child = common::weir_command()
        .args(["run", pipeline.to_str().unwrap()])
        .env("WEIR_LOG", "warn")
        .env("WEIR_MY_EXIT", "true")
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

#[test]
fn a_big_transaction_reaches_the_sink_in_pieces_in_bounded_memory() {
    let rows = big_rows();
    let maria = server();
    let db = "weir_my_big_tx";
    maria.fresh_db(db);
    maria.sql(
        db,
        "CREATE TABLE big (id BIGINT PRIMARY KEY, n INT NOT NULL, note VARCHAR(40));",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut pipeline = MyPipeline::new(&maria, &[&format!("{db}.big")], 5601);
    pipeline.max_rows = 2_000;
    let file = pipeline.write(dir.path(), &root);
    let (_, idle_mb) = run_measured(&file);

    maria.sql(
        db,
        &format!(
            "BEGIN;\n\
             INSERT INTO big SELECT seq, seq % 7, CONCAT('row ', seq) FROM seq_1_to_{rows};\n\
             UPDATE big SET n = -1, note = 'again' WHERE id <= 5000;\n\
             DELETE FROM big WHERE id BETWEEN 5001 AND 6000;\n\
             COMMIT;"
        ),
    );
    let (said, big_mb) = run_measured(&file);
    assert!(
        said.contains(" changes in 1 transactions,"),
        "the run's report did not count one transaction: {said}"
    );
    let table = MyTable::new(
        db,
        "big",
        &[("id", Canon::Int), ("n", Canon::Int), ("note", Canon::Text)],
        &[0],
    );
    assert_sink_equals_server(&maria, &root, &[table]);

    // Committed in pieces: batches that stand inside the transaction.
    let positions: Vec<Position> = common::read_positioned(&root, &format!("{db}.big"))
        .iter()
        .map(|b| Position::from_hex(&b.schema().metadata()["weir.position"]).unwrap())
        .filter(|p| !p.is_snapshot())
        .collect();
    let inside = positions.len().saturating_sub(1);
    assert!(
        inside > 0,
        "the transaction was committed whole, in {} batches",
        positions.len()
    );
    println!(
        "{rows} rows: {inside} commits inside the transaction; peak RSS {big_mb:.0} MB, {idle_mb:.0} MB for a run of no rows"
    );
    assert!(
        big_mb - idle_mb < BIG_TX_EXTRA_MB,
        "streaming the big transaction peaked at {big_mb:.0} MB, {:.0} MB over a run of no rows ({idle_mb:.0} MB): it was held, not handed on in pieces",
        big_mb - idle_mb
    );
    if rows >= 5_000_000 {
        assert!(
            big_mb < FIVE_MILLION_MB,
            "{rows} rows peaked at {big_mb:.0} MB"
        );
    }
}
