//! The Iceberg plugin, run as WASM by `weir run` from the generator, read
//! back by readers we did not write: the `iceberg` crate, DuckDB's iceberg
//! extension and pyiceberg. Upsert tables must equal the generator's state,
//! append tables its whole change log.

use crate::common;
use crate::iceberg_support;

use common::{TableMode, depth, tables, text, weir};
use iceberg_support::*;

const SEED: u64 = 3;
const CHANGES: u64 = 6_000;

#[test]
fn upsert_tables_equal_the_generator_state_in_all_three_readers() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    let pipeline = iceberg_pipeline("up", SEED, CHANGES, TableMode::Upsert, &lake)
        .max_rows(700)
        .linger_ms(20)
        .heartbeat_ms(500)
        .metadata("pos", "change_pos")
        .state_dir("state-up")
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "weir run failed: {}", text(&out));

    let committed = lake.committed_positions("up");
    let want = upsert_state_at(SEED, CHANGES, &committed);
    for table in tables() {
        let dest = destination(&table.name);
        let metadata = lake.metadata(&dest).unwrap();
        let columns = column_names(&table, &["change_pos"]);
        let native = read_native(&metadata).project(&columns);
        assert_eq!(duplicate_keys(&table, &native), 0, "{}", table.name);
        assert_rows(
            &format!("iceberg crate, {}", table.name),
            &want[&table.name],
            &native,
        );
        let duck = read_python("duckdb", &metadata)
            .unwrap_or_else(|e| panic!("DuckDB cannot read {}: {e}", metadata.display()));
        assert_rows(
            &format!("DuckDB, {}", table.name),
            &want[&table.name],
            &duck.project(&columns),
        );
        // Upserts are position deletes, which pyiceberg 0.12 applies too.
        let read = read_python("pyiceberg", &metadata)
            .unwrap_or_else(|e| panic!("pyiceberg cannot read {}: {e}", metadata.display()));
        assert_rows(
            &format!("pyiceberg, {}", table.name),
            &want[&table.name],
            &read.project(&columns),
        );
        println!(
            "{}: {} rows, equal in the iceberg crate, DuckDB and pyiceberg",
            table.name,
            want[&table.name].len()
        );
    }
}

/// The host folds changes to one key within a batch (the last one wins, as
/// the WIT contract says), so an append table holds every change of the
/// source only when no batch holds two changes to a key: one change per
/// batch here, on a smaller stream (one Iceberg commit per change).
fn append_changes() -> u64 {
    depth(400, 1_200)
}

#[test]
fn append_tables_hold_every_change_in_all_three_readers() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    let pipeline = iceberg_pipeline("log", SEED, append_changes(), TableMode::Append, &lake)
        .max_rows(1)
        .linger_ms(20)
        .heartbeat_ms(500)
        .metadata("op", "change_op")
        .metadata("pos", "change_pos")
        .state_dir("state-log")
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "weir run failed: {}", text(&out));

    let want = append_rows(SEED, append_changes());
    for table in tables() {
        let metadata = lake.metadata(&destination(&table.name)).unwrap();
        let columns = column_names(&table, &["change_op", "change_pos"]);
        assert_rows(
            &format!("iceberg crate, {}", table.name),
            &want[&table.name],
            &read_native(&metadata).project(&columns),
        );
        for reader in ["duckdb", "pyiceberg"] {
            let read = read_python(reader, &metadata)
                .unwrap_or_else(|e| panic!("{reader} cannot read {}: {e}", metadata.display()));
            assert_rows(
                &format!("{reader}, {}", table.name),
                &want[&table.name],
                &read.project(&columns),
            );
        }
        println!(
            "{}: {} changes, equal in the iceberg crate, DuckDB and pyiceberg",
            table.name,
            want[&table.name].len()
        );
    }
}
