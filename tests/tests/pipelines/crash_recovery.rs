//! SIGKILL `weir run` at random moments mid-backlog, restart it, and compare
//! both sinks with the generator's seed: the positioned sink exact (no change
//! missing, none applied twice), the Parquet sink complete by key.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// Lag summed over the exact sink's tables, and whether it has committed.
fn exact_progress(pipeline: &std::path::Path) -> (u64, bool) {
    sink_progress(pipeline, "exact")
}

#[test]
fn sigkill_mid_backlog_loses_nothing_and_duplicates_nothing_in_the_positioned_sink() {
    let dir = tempfile::tempdir().unwrap();
    let workload = workload(7, 60_000, 400)
        .pace_us(300)
        .sink(sink("exact", "weir-fixture-positioned", dir.path()))
        .sink(sink("lake", "weir-parquet-sink", dir.path()));
    let pipeline = workload.write_in(dir.path());

    let mut delays = KillSchedule::from_env_or_random();

    let mut landed = 0;
    let mut attempts = 0;
    let mut last_lag = u64::MAX;
    while landed < 6 && attempts < 20 {
        attempts += 1;
        let mut child = weir_command()
            .args(["run", pipeline.to_str().unwrap()])
            .env("WEIR_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let delay = Duration::from_millis(delays.next_ms(600, 1800));
        let started = Instant::now();
        while started.elapsed() < delay {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let finished_first = child.try_wait().unwrap().is_some();
        child.kill().ok(); // SIGKILL
        child.wait().unwrap();
        let (lag, committed_any) = exact_progress(&pipeline);
        // Landed mid-backlog: this run committed something, and not everything.
        let mid_backlog = !finished_first && committed_any && lag > 0 && lag < last_lag;
        println!(
            "kill {attempts} after {delay:?}: lag {lag} transactions -> {}",
            if mid_backlog {
                "mid-backlog"
            } else {
                "not mid-backlog"
            }
        );
        if mid_backlog {
            landed += 1;
        }
        last_lag = lag;
        if lag == 0 && committed_any {
            break;
        }
    }
    if landed < 5 {
        panic!(
            "INCONCLUSIVE: only {landed} of {attempts} kills landed mid-backlog (need 5); \
             nothing was proven about recovery"
        );
    }

    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "the final run failed: {}", text(&out));
    let expected = expected_state(workload.seed(), workload.max_changes());
    assert_positioned_exact(&sink_root(dir.path(), "exact"), &expected);
    let duplicates = assert_parquet_complete(&sink_root(dir.path(), "lake"), &expected);
    println!(
        "{landed} kills landed mid-backlog; positioned sink exact; parquet sink complete by key with {duplicates} replayed changes"
    );
}

#[test]
fn a_kill_between_the_sink_commit_and_the_store_write_replays_only_into_the_plain_sink() {
    let dir = tempfile::tempdir().unwrap();
    // Batches cut by size alone, never by time: on a loaded machine a
    // linger could cut the replayed batch where the killed run cut it, give
    // it the same id, and let the Parquet sink overwrite instead of
    // duplicate.
    let workload = workload(11, 3_000, 200)
        .linger_ms(600_000)
        .sink(sink("exact", "weir-fixture-positioned", dir.path()))
        .sink(sink("lake", "weir-parquet-sink", dir.path()));
    let pipeline = workload.write_in(dir.path());

    // Both sinks commit in the same wave, so after the 9th acknowledged
    // commit both hold data the store has not recorded.
    run_killed_at(&pipeline, "after-sink-commit@9");
    // Proof the kill landed between the sinks' commit and the store write:
    // the positioned sink reports a position the store never recorded.
    let status = status(&pipeline);
    let (exact_at, lake_at) = (
        positions_of(&status, "exact"),
        positions_of(&status, "lake"),
    );
    assert!(
        exact_at.iter().any(|(table, p)| *p > lake_at[table]),
        "INCONCLUSIVE: no table shows the sink ahead of the store: {exact_at:?} vs {lake_at:?}"
    );
    // Recover with other batch limits, so replayed batches get other ids and
    // the plain sink cannot overwrite them: its duplicates become visible.
    let workload = workload.max_rows(137);
    workload.write(&pipeline);
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "the recovery run failed: {}",
        text(&out)
    );
    let expected = expected_state(workload.seed(), workload.max_changes());
    assert_positioned_exact(&sink_root(dir.path(), "exact"), &expected);
    let duplicates = assert_parquet_complete(&sink_root(dir.path(), "lake"), &expected);
    assert!(
        duplicates > 0,
        "the plain sink's commit was not in the store, so its batch must have been replayed"
    );
}

#[test]
fn losing_the_position_store_keeps_the_positioned_sink_exact_and_shows_replays_in_the_plain_one() {
    let dir = tempfile::tempdir().unwrap();
    let workload = workload(5, 2_000, 150)
        .sink(sink("exact", "weir-fixture-positioned", dir.path()))
        .sink(sink("lake", "weir-parquet-sink", dir.path()));
    let pipeline = workload.write_in(dir.path());

    run_killed_at(&pipeline, "after-store-write@20");
    std::fs::remove_file(dir.path().join("state/positions.redb")).unwrap();
    let workload = workload.max_rows(91);
    workload.write(&pipeline);
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "the run after losing the store failed: {}",
        text(&out)
    );
    let expected = expected_state(workload.seed(), workload.max_changes());
    assert_positioned_exact(&sink_root(dir.path(), "exact"), &expected);
    let duplicates = assert_parquet_complete(&sink_root(dir.path(), "lake"), &expected);
    assert!(
        duplicates > 0,
        "without the store the plain sink restarts from the beginning: duplicates, not loss"
    );
    // The positioned sink's positions were repaired into the new store.
    let status = status(&pipeline);
    for (table, position) in positions_of(&status, "exact") {
        assert!(position.is_some(), "exact has no position for {table}");
    }
}
