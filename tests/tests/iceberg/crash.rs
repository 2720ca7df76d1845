//! Exactly-once into Iceberg under SIGKILL: `weir run` (generator into the
//! WASM Iceberg sink, upsert mode, three tables) is killed mid-backlog again
//! and again, once right between the Iceberg commit and the host's store
//! write; after every kill each table, read by DuckDB's iceberg extension
//! (and at the end by the `iceberg` crate too), must equal the generator's
//! state at the position its last snapshot records: no duplicate key, no missing row, no row from a
//! later position, no deleted row back. Plus: losing the host's store, and a
//! zombie host with an older epoch.

use crate::common;
use crate::iceberg_support;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{
    KillSchedule, TableMode, depth, expected_state, run_killed_at, status, tables, text, weir,
    weir_command,
};
use iceberg_support::*;

/// Where every table stands according to its Iceberg snapshots.
fn committed(lake: &Lake, pipeline: &str) -> BTreeMap<String, Vec<u8>> {
    tables()
        .iter()
        .filter_map(|t| {
            lake.committed(&destination(&t.name), pipeline, &t.name)
                .map(|(p, _)| (t.name.clone(), p))
        })
        .collect()
}

/// Reads every table with DuckDB (and the `iceberg` crate when `native`)
/// and compares it with the generator's state at the committed positions.
fn assert_exact(lake: &Lake, pipeline: &str, seed: u64, changes: u64, native: bool, label: &str) {
    let at = committed(lake, pipeline);
    let want = upsert_state_at(seed, changes, &at);
    for table in tables() {
        let Some(metadata) = lake.metadata(&destination(&table.name)) else {
            assert!(
                want[&table.name].is_empty(),
                "{label}: {} missing",
                table.name
            );
            continue;
        };
        let columns = column_names(&table, &["change_pos"]);
        let read = read_python("duckdb", &metadata)
            .unwrap_or_else(|e| panic!("{label}: DuckDB cannot read {}: {e}", table.name))
            .project(&columns);
        let dups = duplicate_keys(&table, &read);
        assert_eq!(dups, 0, "{label}: {dups} duplicate keys in {}", table.name);
        // Equal to the state at the committed position: nothing missing,
        // nothing from later, no deleted key back.
        assert_rows(
            &format!("{label}, DuckDB, {}", table.name),
            &want[&table.name],
            &read,
        );
        if native {
            let read = read_native(&metadata).project(&columns);
            assert_eq!(duplicate_keys(&table, &read), 0, "{label}: {}", table.name);
            assert_rows(
                &format!("{label}, iceberg crate, {}", table.name),
                &want[&table.name],
                &read,
            );
        }
    }
}

/// Sum of the lag (in source transactions) over the sink's tables, and
/// whether it committed anything.
fn progress(pipeline: &Path) -> (u64, bool) {
    let status = status(pipeline);
    let sink = &status["sinks"][0];
    let mut lag = 0;
    let mut any = false;
    for table in sink["tables"].as_array().unwrap() {
        lag += table["lag_transactions"].as_u64().unwrap_or(0);
        any |= !table["position"].is_null();
    }
    (lag, any)
}

#[test]
fn sigkill_mid_backlog_keeps_every_iceberg_table_exact() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    // Paced so the backlog outlasts the kills; few, large commits, since the
    // iceberg crate's scan slows down with the number of equality-delete
    // files (DuckDB much less so).
    let (seed, changes) = (17, 30_000);
    let pipeline = iceberg_pipeline("crash", seed, changes, TableMode::Upsert, &lake)
        .pace_us(1_500)
        .max_rows(5_000)
        .linger_ms(600)
        .heartbeat_ms(2_000)
        .metadata("pos", "change_pos")
        .write_in(dir.path());
    let pipeline_arg = pipeline.to_str().unwrap();

    let mut delays = KillSchedule::from_env_or_random();
    let kills = depth(5, 10);

    // The first run compiles the component (cached afterwards): let it get
    // going before the kills start.
    let mut landed = 0;
    let mut failpoint_landed = false;
    let mut attempts = 0;
    let mut last_lag = u64::MAX;
    while (landed < kills || !failpoint_landed) && attempts < 3 * kills {
        attempts += 1;
        // Once, after a few kills: die between the Iceberg commit and the
        // host's store write.
        let use_failpoint = landed >= 4 && !failpoint_landed;
        let mut command = weir_command();
        command
            .args(["run", pipeline_arg])
            .env("WEIR_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if use_failpoint {
            command.env("WEIR_FAILPOINT", "after-sink-commit@8");
        }
        let mut child = command.spawn().unwrap();
        let delay = Duration::from_millis(if attempts == 1 {
            8_000
        } else if use_failpoint {
            // Let it run into its failpoint.
            60_000
        } else {
            delays.next_ms(900, 2_200)
        });
        let started = Instant::now();
        while started.elapsed() < delay && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let exited = child.try_wait().unwrap();
        child.kill().ok(); // SIGKILL
        let exit = child.wait().unwrap();
        let (lag, any) = progress(&pipeline);
        let label = format!("kill {attempts}");
        if use_failpoint {
            if exit.signal() != Some(9) || exited.is_none() {
                panic!("INCONCLUSIVE: the failpoint run did not die by its failpoint: {exit:?}");
            }
            // Proof it landed between the sink's commit and the store: the
            // sink is ahead of the store for some table.
            let status = status(&pipeline);
            let ahead = status["sinks"][0]["tables"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| !t["store_position"].is_null());
            assert!(
                ahead,
                "INCONCLUSIVE: after the failpoint no table shows the sink ahead of the store: {status}"
            );
            failpoint_landed = true;
            println!("{label}: failpoint after-sink-commit landed; lag {lag}");
        } else {
            let mid = exited.is_none() && any && lag > 0 && lag < last_lag;
            println!(
                "{label} after {delay:?}: lag {lag} transactions -> {}",
                if mid {
                    "mid-backlog"
                } else {
                    "not mid-backlog"
                }
            );
            if mid {
                landed += 1;
            }
        }
        last_lag = lag;
        // Verify after every kill with an external reader.
        assert_exact(&lake, "crash", seed, changes, false, &label);
        if lag == 0 && any {
            break;
        }
    }
    if landed < kills || !failpoint_landed {
        panic!(
            "INCONCLUSIVE: {landed} of {attempts} kills landed mid-backlog (need {kills}), \
             failpoint landed: {failpoint_landed}; nothing was proven about recovery"
        );
    }
    let out = weir(&["run", pipeline_arg], &[]);
    assert!(out.status.success(), "the final run failed: {}", text(&out));
    assert_exact(&lake, "crash", seed, changes, true, "final");
    // The final state is the generator's whole stream.
    let at = committed(&lake, "crash");
    let full = upsert_state_at(seed, changes, &at);
    let expected = expected_state(seed, changes);
    for table in tables() {
        assert_eq!(
            full[&table.name].len(),
            expected.tables[&table.name].len(),
            "{} is not at the end of the stream",
            table.name
        );
    }
    println!(
        "{landed} kills landed mid-backlog plus one failpoint kill; every table exact after each"
    );
}

#[test]
fn losing_the_host_store_keeps_iceberg_tables_exact() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    let (seed, changes) = (23, 4_000);
    let pipeline = iceberg_pipeline("lost", seed, changes, TableMode::Upsert, &lake)
        .max_rows(150)
        .linger_ms(20)
        .heartbeat_ms(500)
        .metadata("pos", "change_pos")
        .write_in(dir.path());
    run_killed_at(&pipeline, "after-sink-commit@12");
    assert_exact(&lake, "lost", seed, changes, false, "after the kill");
    let before = committed(&lake, "lost");
    assert!(
        !before.is_empty(),
        "INCONCLUSIVE: nothing committed before the kill"
    );
    std::fs::remove_file(dir.path().join("state/positions.redb")).unwrap();
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "the run after losing the store failed: {}",
        text(&out)
    );
    assert_exact(&lake, "lost", seed, changes, true, "after losing the store");
    let expected = expected_state(seed, changes);
    let at = committed(&lake, "lost");
    let state = upsert_state_at(seed, changes, &at);
    for table in tables() {
        assert_eq!(state[&table.name].len(), expected.tables[&table.name].len());
    }
}

#[test]
fn a_zombie_host_with_an_older_epoch_is_fenced_and_writes_nothing_visible() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    let (seed, changes) = (29, 6_000);
    let host = |state_dir: &str, pace_us| {
        iceberg_pipeline("zombie", seed, changes, TableMode::Upsert, &lake)
            .pace_us(pace_us)
            .max_rows(400)
            .linger_ms(20)
            .heartbeat_ms(500)
            .metadata("pos", "change_pos")
            .state_dir(state_dir)
    };
    // Host A starts (epoch 1), commits a little, and freezes: a host that
    // lost its lease without knowing it (a long GC pause, a partition).
    let a = host("state-a", 1_000).write_in(dir.path());
    let mut zombie = weir_command()
        .args(["run", a.to_str().unwrap()])
        .env("WEIR_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let committed_by_a = loop {
        let epochs: Vec<u64> = tables()
            .iter()
            .filter_map(|t| lake.committed(&destination(&t.name), "zombie", &t.name))
            .map(|(_, e)| e)
            .collect();
        if !epochs.is_empty() {
            break epochs;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "INCONCLUSIVE: host A committed nothing within a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(zombie.id() as i32, libc::SIGSTOP) };
    assert!(committed_by_a.iter().all(|e| *e == 1), "{committed_by_a:?}");

    // Host B, with its own store, takes over: it sees epoch 1 in the tables,
    // so it runs as epoch 2, and drains the whole stream.
    let b_dir = dir.path().join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    let b = host("state-b", 0).write_in(&b_dir);
    let out = weir(&["run", b.to_str().unwrap(), "--json"], &[]);
    assert!(out.status.success(), "host B failed: {}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["epoch"], 2, "host B did not take over: {report}");
    let after_b: BTreeMap<String, std::path::PathBuf> = tables()
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                lake.metadata(&destination(&t.name)).unwrap(),
            )
        })
        .collect();

    // The zombie wakes up and tries to go on: its next commit is refused.
    let (status, message) = wake_and_wait(&mut zombie);
    assert!(!status.success(), "the zombie was not refused: {message}");
    assert!(
        message.contains("fenced"),
        "the zombie's failure does not say it was fenced: {message}"
    );
    // Nothing it wrote is visible: every table is still at host B's
    // metadata version, and exact at the end of the stream.
    for table in tables() {
        assert_eq!(
            lake.metadata(&destination(&table.name)).unwrap(),
            after_b[&table.name],
            "the zombie committed to {}",
            table.name
        );
    }
    assert_exact(&lake, "zombie", seed, changes, true, "after the zombie");
}
