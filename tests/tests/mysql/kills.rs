//! SIGKILLs against the MySQL source, each landed by a failpoint where it
//! is meant to land (a kill that missed reports INCONCLUSIVE): in the
//! backfill, in a resumed backfill, and inside a transaction bigger than a
//! batch; then the positioned sink must equal MariaDB with no change twice.

use crate::common::{positions_of, run_killed_at, status, text};
use crate::mysql_support::*;

use super::cdc::{Rng, SCHEMA, initial_load, tables, workload};

#[test]
fn kills_in_the_backfill_and_inside_a_big_transaction_lose_and_repeat_nothing() {
    let maria = server();
    let db = "weir_my_kills";
    maria.fresh_db(db);
    maria.sql(db, SCHEMA);
    let mut rng = Rng::seeded(0x6b69_6c6c_0000_0001);
    maria.sql(db, &initial_load(2_000, &mut rng));
    let mut next_id = 2_000;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut pipeline = MyPipeline::new(
        &maria,
        &[&format!("{db}.customers"), &format!("{db}.items")],
        5102,
    );
    pipeline.chunk_rows = 100;
    pipeline.max_rows = 100;
    let file = pipeline.write(dir.path(), &root);

    // In the backfill: some of customers committed, not all.
    run_killed_at(&file, "after-sink-commit@4");
    let at = positions_of(&status(&file), "exact");
    let customers = at.get(&format!("{db}.customers")).cloned().flatten();
    assert!(
        customers.as_ref().is_some_and(|p| p.first() == Some(&0)),
        "INCONCLUSIVE: the kill did not land inside the backfill of customers: {at:?}"
    );

    // Changes while stopped, then a kill in the resumed backfill, before
    // a sink commit.
    maria.sql(db, &workload(&mut rng, 150, &mut next_id));
    run_killed_at(&file, "before-sink-commit@3");
    let out = drain(&file);
    assert!(
        out.status.success(),
        "the draining run failed: {}",
        text(&out)
    );

    // A transaction of 1,500 rows, in pieces of a batch: killed after the
    // sixth piece's commit.
    let mut big = String::from("BEGIN;\n");
    for i in 0..1_500u64 {
        big.push_str(&format!(
            "INSERT INTO items VALUES ({}, 'bulk', {i});\n",
            5_000_000 + i
        ));
    }
    big.push_str("COMMIT;\n");
    maria.sql(db, &big);
    run_killed_at(&file, "after-sink-commit@6");
    let (items, _) = tables(db)[1].sink_rows(&root);
    let bulk = items
        .values()
        .filter(|r| r[1].as_deref() == Some("bulk"))
        .count();
    assert!(
        bulk > 0 && bulk < 1_500,
        "INCONCLUSIVE: the kill did not land inside the big transaction ({bulk} of its rows committed)"
    );

    maria.sql(db, &workload(&mut rng, 100, &mut next_id));
    let out = drain(&file);
    assert!(
        out.status.success(),
        "the last draining run failed: {}",
        text(&out)
    );
    assert_sink_equals_server(&maria, &root, &tables(db));
}

/// The server restarts while weir streams: the binlog connection breaks,
/// and the run reads again from the start of the transaction it was in,
/// within `reconnect_timeout_ms`, losing and repeating nothing. nextest
/// runs it alone (.config/nextest.toml): every connection to the server
/// breaks.
#[test]
fn a_server_restart_mid_stream_is_survived_without_loss_or_duplicates() {
    let maria = server();
    let db = "weir_my_restart";
    maria.fresh_db(db);
    maria.sql(db, SCHEMA);
    let mut rng = Rng::seeded(0x7265_7374_6172_7401);
    maria.sql(db, &initial_load(300, &mut rng));
    let mut next_id = 300;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let file = MyPipeline::new(&maria, &[&format!("{db}.*")], 5103).write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&file, &log);
    maria.sql(db, &workload(&mut rng, 150, &mut next_id));
    std::thread::sleep(std::time::Duration::from_millis(800));
    restart_server();
    maria.sql(db, &workload(&mut rng, 150, &mut next_id));
    std::thread::sleep(std::time::Duration::from_millis(3000));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended when the server restarted: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    interrupt(&mut child);
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        child.wait().unwrap().success(),
        "the streaming run failed: {said}"
    );
    assert!(
        said.contains("binlog stream lost") || said.contains("trying again"),
        "INCONCLUSIVE: the run never lost its binlog connection: {said}"
    );
    // The run streamed the changes after the restart itself.
    let (rows, _) = tables(db)[0].sink_rows(&root);
    assert!(
        rows.keys().any(|k| k[0]
            .as_deref()
            .and_then(|id| id.parse::<u64>().ok())
            .is_some_and(|id| id >= 300)),
        "nothing written after the restart reached the sink before the drain"
    );
    let out = drain(&file);
    assert!(
        out.status.success(),
        "the draining run failed: {}",
        text(&out)
    );
    assert_sink_equals_server(&maria, &root, &tables(db));
}
