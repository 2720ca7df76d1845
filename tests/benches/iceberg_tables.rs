//! What the Iceberg sink's tables cost to write and to read, by delete mode.
//!
//! One workload, seeded: a table of `KEYS` keys loaded in chunks of 10,000,
//! then `COMMITS` commits of `PER_COMMIT` changes each (updates, with a few
//! deletes and re-inserts of deleted keys). It is written three ways by the
//! sink as WebAssembly (the compiled component is cached before timing):
//!
//! - `position`: upsert with position deletes (the default), no
//!   maintenance at commit boundaries;
//! - `equality`: upsert with `delete_mode: equality`;
//! - `position+policy`: position deletes with the sink's default
//!   maintenance policy, which compacts at commit boundaries (what a user
//!   gets without configuring anything);
//! - `once`: the same final rows, each written once (the baseline readers
//!   are compared with).
//!
//! Printed, all in one run:
//! - write cost: rows/s of the update commits, position against equality;
//! - DuckDB and pyiceberg full-scan times (best of `ROUNDS`, reader start-up
//!   excluded, planning and delete files included) of each table, as ratios
//!   to the `once` table, before and after compaction (`weir maintain`'s
//!   code, run through the sink's maintenance export; the policy that
//!   compacts at commit boundaries is off, so "before" is what the commits
//!   alone leave: their data and delete files, with the manifests merged
//!   every 32 commits).
//!
//! Every scan's row count and balance sum are checked against the model the
//! seed gives: a reader returning wrong rows fails the run.
//!
//! `cargo bench -p weir-tests --bench iceberg_tables` (after scripts/build-plugins).
//! `ICEBERG_TABLES_KEYS`, `ICEBERG_TABLES_COMMITS`, `ICEBERG_TABLES_PER_COMMIT`,
//! `ICEBERG_TABLES_ROUNDS` change the size (defaults 100000, 1000, 100, 3).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_source::commit_order::stream_position;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use weir_core::position::Position;
use weir_runtime::network::SinkNetwork;
use weir_runtime::{BatchHeader, CommitRequest, Limits, SinkInstance, TableDescription};
use weir_sdk::native::encode_ipc;

// Only the in-process host: the generator's batches are not used here.
#[allow(dead_code)]
mod support;
use support::{InProcess, components_dir};

const DESTINATION: &str = "bench.accounts";
const LOAD_CHUNK: u64 = 10_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// splitmix64: the whole workload follows from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// One change: key, balance (None = delete).
type Change = (i64, Option<i64>);

/// The load and the update commits, and the final rows they leave.
struct Workload {
    load: Vec<Vec<Change>>,
    updates: Vec<Vec<Change>>,
    /// Balance per key after everything, None where deleted.
    last: Vec<Option<i64>>,
}

impl Workload {
    fn new(keys: u64, commits: u64, per_commit: u64) -> Workload {
        let mut rng = Rng(20261201);
        let mut last: Vec<Option<i64>> = Vec::with_capacity(keys as usize);
        let mut load = Vec::new();
        for start in (0..keys).step_by(LOAD_CHUNK as usize) {
            let chunk: Vec<Change> = (start..(start + LOAD_CHUNK).min(keys))
                .map(|k| {
                    let balance = (rng.next() % 1_000_000) as i64;
                    last.push(Some(balance));
                    (k as i64, Some(balance))
                })
                .collect();
            load.push(chunk);
        }
        let mut updates = Vec::new();
        for _ in 0..commits {
            let mut commit = Vec::with_capacity(per_commit as usize);
            for _ in 0..per_commit {
                let key = rng.next() % keys;
                let roll = rng.next() % 100;
                let change = if last[key as usize].is_some() && roll < 4 {
                    None
                } else {
                    Some((rng.next() % 1_000_000) as i64)
                };
                last[key as usize] = change;
                commit.push((key as i64, change));
            }
            updates.push(commit);
        }
        Workload {
            load,
            updates,
            last,
        }
    }

    /// The final rows as inserts, in load-sized chunks.
    fn once(&self) -> Vec<Vec<Change>> {
        let live: Vec<Change> = self
            .last
            .iter()
            .enumerate()
            .filter_map(|(k, b)| b.map(|b| (k as i64, Some(b))))
            .collect();
        live.chunks(LOAD_CHUNK as usize)
            .map(|c| c.to_vec())
            .collect()
    }

    fn live_rows(&self) -> u64 {
        self.last.iter().flatten().count() as u64
    }

    fn balance_sum(&self) -> i64 {
        self.last.iter().flatten().sum()
    }
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("balance", DataType::Int64, true),
        Field::new("note", DataType::Utf8, true),
        Field::new("__op", DataType::Utf8, false),
        Field::new("__pos", DataType::Binary, false),
    ]))
}

/// Commit number `n` of `changes`, as the host would hand it to the sink.
fn batch(n: u64, changes: &[Change]) -> (BatchHeader, Vec<u8>) {
    let positions: Vec<Position> = (0..changes.len())
        .map(|i| stream_position(n, i as u32))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(changes.iter().map(|c| c.0))),
        Arc::new(Int64Array::from_iter(changes.iter().map(|c| c.1))),
        Arc::new(StringArray::from_iter(
            changes
                .iter()
                .map(|c| c.1.map(|b| format!("account {} at {b}", c.0))),
        )),
        Arc::new(StringArray::from_iter_values(
            changes
                .iter()
                .map(|c| if c.1.is_some() { "update" } else { "delete" }),
        )),
        Arc::new(BinaryArray::from_iter_values(
            positions.iter().map(|p| p.as_bytes()),
        )),
    ];
    let records = RecordBatch::try_new(schema(), columns).unwrap();
    let header = BatchHeader {
        table: Arc::new(TableDescription {
            name: "public.accounts".into(),
            key_columns: vec!["id".into()],
            mode: weir_sdk::Mode::Upsert,
            destination: DESTINATION.into(),
            metadata: Vec::new(),
        }),
        id: format!("b{n}"),
        low: positions[0].clone(),
        high: positions[positions.len() - 1].clone(),
        rows: changes.len() as u32,
    };
    (header, encode_ipc(&records))
}

/// Writes `commits` through `instance`, numbering them from `first`;
/// returns the time and rows written.
fn write(instance: &mut SinkInstance, first: u64, commits: &[Vec<Change>]) -> (Duration, u64) {
    let started = Instant::now();
    let mut rows = 0;
    for (i, changes) in commits.iter().enumerate() {
        let (header, ipc) = batch(first + i as u64, changes);
        instance.write(&header, &ipc).unwrap();
        instance
            .commit(&CommitRequest {
                table: header.table.name.clone(),
                high: header.high.clone(),
                pipeline: "bench".into(),
                epoch: 1,
            })
            .unwrap();
        rows += changes.len() as u64;
    }
    (started.elapsed(), rows)
}

/// The newest metadata file of the bench table under `root`.
fn metadata(root: &Path) -> PathBuf {
    let dir = root.join(DESTINATION.replace('.', "/")).join("metadata");
    let mut version: u64 = std::fs::read_to_string(dir.join("version-hint.text"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    while dir.join(format!("v{}.metadata.json", version + 1)).exists() {
        version += 1;
    }
    dir.join(format!("v{version}.metadata.json"))
}

/// Best full-scan seconds of `reader` on the table under `root`, after
/// checking its rows against the model; None if the reader refuses.
fn scan(reader: &str, root: &Path, rounds: u64, model: &Workload) -> Option<f64> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(workspace.join(".venv/bin/python"))
        .arg(workspace.join("tests/readers/time_scan.py"))
        .arg(reader)
        .arg(metadata(root))
        .arg(rounds.to_string())
        .arg("balance")
        .output()
        .expect("the project's .venv (scripts/setup)");
    if !out.status.success() {
        let error = String::from_utf8_lossy(&out.stderr);
        println!(
            "  {reader} refuses {}: {}",
            root.display(),
            error.lines().last().unwrap_or_default()
        );
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["rows"].as_u64(),
        Some(model.live_rows()),
        "{reader} read a wrong row count from {}",
        root.display()
    );
    assert_eq!(
        json["sum"].as_i64(),
        Some(model.balance_sum()),
        "{reader} read wrong balances from {}",
        root.display()
    );
    json["best"].as_f64()
}

fn main() {
    let keys = env_or("ICEBERG_TABLES_KEYS", 100_000);
    let commits = env_or("ICEBERG_TABLES_COMMITS", 1_000);
    let per_commit = env_or("ICEBERG_TABLES_PER_COMMIT", 100);
    let rounds = env_or("ICEBERG_TABLES_ROUNDS", 3);
    let model = Workload::new(keys, commits, per_commit);
    println!(
        "{keys} keys loaded, then {commits} commits of {per_commit} changes; {} live rows at the end",
        model.live_rows()
    );

    let scratch = tempfile::tempdir().unwrap();
    let host = InProcess::new(scratch.path());
    let wasm = components_dir().join("weir_iceberg_sink.wasm");
    let started = Instant::now();
    let plugin = host.load(&wasm, &Default::default());
    println!(
        "component compiled in {:?} (not in any time below)",
        started.elapsed()
    );
    let limits = Limits {
        memory_bytes: 2 << 30,
        call_timeout: Duration::from_secs(300),
        log: Default::default(),
    };
    // `policy`: the sink's default maintenance at commit boundaries, or none.
    let open = |name: &str, delete_mode: &str, policy: bool| -> (PathBuf, SinkInstance) {
        let root = scratch.path().join(name);
        std::fs::create_dir_all(&root).unwrap();
        let mut instance = host.instance(&plugin, &root, SinkNetwork::none("bench"), &limits);
        let mut config = vec![
            (
                "warehouse".to_string(),
                format!("file://{}", root.display()),
            ),
            ("delete_mode".to_string(), delete_mode.to_string()),
        ];
        if !policy {
            // "Before compaction" is what the commits alone leave.
            config.push(("compact_min_files".to_string(), "0".to_string()));
            config.push((
                "expire_snapshots_older_than".to_string(),
                "never".to_string(),
            ));
        }
        instance.open("bench", &config).unwrap();
        (root, instance)
    };

    let mut tables = Vec::new();
    let mut write_rates = Vec::new();
    for (mode, delete_mode, policy) in [
        ("position", "position", false),
        ("equality", "equality", false),
        ("position+policy", "position", true),
    ] {
        let (root, mut instance) = open(mode, delete_mode, policy);
        write(&mut instance, 1, &model.load);
        let (took, rows) = write(&mut instance, 1 + model.load.len() as u64, &model.updates);
        let rate = rows as f64 / took.as_secs_f64();
        println!("write {mode}: {rows} changes in {took:.2?}, {rate:.0} rows/s");
        write_rates.push(rate);
        tables.push((mode, root, instance));
    }
    println!(
        "write cost: position deletes at {:.2}x the rate of equality deletes; with the default \
         maintenance policy (compaction at commit boundaries) at {:.2}x",
        write_rates[0] / write_rates[1],
        write_rates[2] / write_rates[1]
    );
    let (once_root, mut once) = open("once", "position", false);
    write(&mut once, 1, &model.once());
    drop(once);

    let readers = ["duckdb", "pyiceberg"];
    let baseline: Vec<Option<f64>> = readers
        .iter()
        .map(|r| scan(r, &once_root, rounds, &model))
        .collect();
    for (reader, base) in readers.iter().zip(&baseline) {
        println!(
            "read {reader}, table written once: {}",
            base.map(|b| format!("{b:.3} s"))
                .unwrap_or("refused".into())
        );
    }
    let report = |stage: &str, tables: &[(&str, PathBuf, SinkInstance)]| {
        for (mode, root, _) in tables {
            for (reader, base) in readers.iter().zip(&baseline) {
                match (scan(reader, root, rounds, &model), base) {
                    (Some(t), Some(b)) => println!(
                        "read {reader}, {mode}, {stage}: {t:.3} s, {:.2}x the table written once",
                        t / b
                    ),
                    _ => println!("read {reader}, {mode}, {stage}: not readable"),
                }
            }
        }
    };
    report("before compaction", &tables);
    // `weir maintain --compact --expire` as an operator runs it: a fresh
    // instance on the same root, old snapshots expired at once.
    for (mode, root, _) in &tables {
        let mut maintainer = host.instance(&plugin, root, SinkNetwork::none("bench"), &limits);
        let config = vec![
            (
                "warehouse".to_string(),
                format!("file://{}", root.display()),
            ),
            ("expire_snapshots_older_than".to_string(), "0s".to_string()),
            ("keep_snapshots".to_string(), "1".to_string()),
        ];
        maintainer.open("bench", &config).unwrap();
        let started = Instant::now();
        let said = maintainer
            .maintain(
                "bench",
                &["public.accounts".to_string()],
                &["compact".to_string(), "expire".to_string()],
            )
            .unwrap_or_else(|e| panic!("maintaining the {mode} table failed: {e}"))
            .expect("the Iceberg sink exports maintenance");
        println!(
            "compaction and expiry of the {mode} table: {:.2?}: {}",
            started.elapsed(),
            said.trim().replace('\n', "; ")
        );
    }
    report("after compaction and expiry", &tables);
}
