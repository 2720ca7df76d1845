//! Partitioned Iceberg tables from one pipeline: upsert tables partitioned
//! on their keys (position deletes land in the partition of the rows they
//! delete) and an append table partitioned by day of a timestamp, read back
//! by the `iceberg` crate, DuckDB and pyiceberg. The generator's change log
//! is the truth; the metadata and the manifests must show the partitioning.

use crate::common;
use crate::iceberg_support;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use common::{TableMode, tables, text, weir};
use iceberg::spec::{DataContentType, TableMetadata};
use iceberg_support::*;
use weir_test_support::{PipelineBuilder, SinkBuilder};

const SEED: u64 = 17;
/// One change per batch (an append table holds every change only when no
/// batch folds two changes to a key), so every upsert key changes across
/// many commits.
const CHANGES: u64 = 600;

const APPEND_TABLE: &str = "shop.orders";

/// The partition spec each destination gets.
fn specs() -> [(&'static str, &'static str, &'static str); 3] {
    [
        (
            "shop.customers",
            "partition.lake.customers",
            "bucket(4, id)",
        ),
        (
            "shop.order_items",
            "partition.lake.order_items",
            "bucket(3, order_id), identity(line)",
        ),
        (APPEND_TABLE, "partition.lake.orders", "day(placed_at)"),
    ]
}

/// The partition fields of the table's default spec: (name, transform).
fn spec_fields(metadata: &Path) -> Vec<(String, String)> {
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(metadata).unwrap()).unwrap();
    let default = json["default-spec-id"].clone();
    let spec = json["partition-specs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["spec-id"] == default)
        .unwrap();
    spec["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["transform"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The distinct partitions of the live data files, and whether every live
/// file (data and delete) carries a partition of the spec's arity, as the
/// `iceberg` crate reads the manifests.
fn manifest_partitions(metadata: &Path, arity: usize) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let metadata: TableMetadata =
        serde_json::from_slice(&std::fs::read(metadata).unwrap()).unwrap();
    let snapshot = metadata.current_snapshot().expect("a snapshot");
    let files = runtime
        .block_on(weir_iceberg_sink::index::live_files(
            &iceberg::io::FileIO::new_with_fs(),
            snapshot,
        ))
        .unwrap();
    let mut distinct = HashSet::new();
    for (file, _) in &files {
        assert_eq!(
            file.partition().fields().len(),
            arity,
            "{} has no partition value",
            file.file_path()
        );
        if file.content_type() == DataContentType::Data {
            distinct.insert(file.partition().clone());
        }
    }
    distinct.len()
}

/// The number of partitions pyiceberg's `inspect.partitions()` lists.
fn pyiceberg_partitions(metadata: &Path) -> usize {
    let script = "import sys\n\
                  from pyiceberg.table import StaticTable\n\
                  t = StaticTable.from_metadata(sys.argv[1])\n\
                  print(t.inspect.partitions().num_rows)\n";
    let out = Command::new(python())
        .args(["-c", script])
        .arg(metadata)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "pyiceberg cannot list the partitions of {}: {}",
        metadata.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn partitioned_upsert_and_append_tables_read_the_same_in_all_three_readers() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    let sink = specs().iter().fold(
        SinkBuilder::new("iceberg", common::plugin("weir-iceberg-sink"))
            .blob_store(&lake.root)
            .limits(1024, 120_000)
            .retries(2)
            .config("warehouse", &lake.warehouse())
            .config("index_checkpoint_commits", "20")
            // Compaction at commit boundaries, often: it must rewrite
            // each partition's files back into that partition.
            .config("compact_min_files", "4"),
        |sink, (_, key, spec)| sink.config(key, spec),
    );
    let pipeline = tables()
        .iter()
        .fold(PipelineBuilder::generator(SEED, CHANGES), |p, t| {
            let mode = if t.name == APPEND_TABLE {
                TableMode::Append
            } else {
                TableMode::Upsert
            };
            p.table(&t.name, mode, &destination(&t.name))
        })
        .name("parts")
        .sink(sink)
        .max_rows(1)
        .linger_ms(20)
        .heartbeat_ms(500)
        .metadata("op", "change_op")
        .metadata("pos", "change_pos")
        .state_dir("state-parts")
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "weir run failed: {}", text(&out));

    let committed = lake.committed_positions("parts");
    let upserted = upsert_state_at(SEED, CHANGES, &committed);
    let appended = append_rows(SEED, CHANGES);
    let mut position_deletes = 0u64;
    for table in tables() {
        let (_, _, spec) = specs()
            .into_iter()
            .find(|(t, _, _)| *t == table.name)
            .unwrap();
        let metadata = lake.metadata(&destination(&table.name)).unwrap();
        let (want, columns) = if table.name == APPEND_TABLE {
            (
                &appended[&table.name],
                column_names(&table, &["change_op", "change_pos"]),
            )
        } else {
            (
                &upserted[&table.name],
                column_names(&table, &["change_pos"]),
            )
        };
        let native = read_native(&metadata).project(&columns);
        if table.name != APPEND_TABLE {
            assert_eq!(duplicate_keys(&table, &native), 0, "{}", table.name);
        }
        assert_rows(&format!("iceberg crate, {}", table.name), want, &native);
        for reader in ["duckdb", "pyiceberg"] {
            let read = read_python(reader, &metadata)
                .unwrap_or_else(|e| panic!("{reader} cannot read {}: {e}", metadata.display()));
            assert_rows(
                &format!("{reader}, {}", table.name),
                want,
                &read.project(&columns),
            );
        }

        // The table has the configured spec, its files carry partition
        // values, and readers see more than one partition.
        let fields = spec_fields(&metadata);
        assert_eq!(fields.len(), spec.split("),").count(), "{}", table.name);
        let in_manifests = manifest_partitions(&metadata, fields.len());
        let in_pyiceberg = pyiceberg_partitions(&metadata);
        assert!(in_manifests > 1, "{}: one partition only", table.name);
        assert_eq!(in_pyiceberg, in_manifests, "{}", table.name);
        // Every snapshot: no equality delete ever; position deletes added
        // along the way (compaction at commit boundaries folds them into
        // data files again, so the current totals may be zero). Compaction
        // must have run at least once on each table.
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&metadata).unwrap()).unwrap();
        let mut compactions = 0;
        for snapshot in json["snapshots"].as_array().unwrap() {
            let summary = &snapshot["summary"];
            let number = |key: &str| -> u64 {
                summary[key]
                    .as_str()
                    .map(|v| v.parse().unwrap())
                    .unwrap_or(0)
            };
            assert_eq!(number("added-equality-deletes"), 0, "{}", table.name);
            position_deletes += number("added-position-deletes");
            compactions += usize::from(summary["operation"] == "replace");
        }
        assert!(compactions > 0, "{}: never compacted", table.name);
        println!(
            "{}: `{spec}` -> {fields:?}; {} rows in {in_manifests} partitions, equal in the \
             iceberg crate, DuckDB and pyiceberg",
            table.name,
            want.len()
        );
    }
    // The stream must have updated and deleted keys across commits.
    assert!(position_deletes > 0, "no position delete was written");
}
