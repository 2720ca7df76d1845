//! Shared helpers for the end-to-end tests: where the built artifacts are,
//! how to write a pipeline and run `weir`, and how to read what the sinks
//! wrote with readers we did not write (arrow-ipc, parquet) and compare it
//! with the generator's seed.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use weir::change::{TableSchema, Value};
use weir::source::Source;
use weir::source::generator::{ExpectedState, Generator, GeneratorConfig, KeyPart};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// The release `weir` binary (scripts/test builds it before the tests).
pub fn weir_bin() -> PathBuf {
    let bin = target_dir().join("release/weir");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p weir` (scripts/test does)",
        bin.display()
    );
    bin
}

/// A plugin built by scripts/build-plugins, by crate name.
pub fn plugin(crate_name: &str) -> PathBuf {
    let file = target_dir()
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    assert!(
        file.exists(),
        "{} is missing: run scripts/build-plugins",
        file.display()
    );
    file
}

/// Runs `weir` with arguments, returning its output.
pub fn weir(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(weir_bin());
    command.args(args).env("WEIR_LOG", "warn");
    for (k, v) in envs {
        command.env(k, v);
    }
    command.output().expect("weir runs")
}

pub fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The generator's tables, as the host sees them.
pub fn tables() -> Vec<std::sync::Arc<TableSchema>> {
    Generator::new(GeneratorConfig {
        seed: 1,
        max_changes: Some(1),
    })
    .tables()
}

/// Reads every Arrow IPC file the positioned fixture committed for a table,
/// in commit order.
pub fn read_positioned(root: &Path, table: &str) -> Vec<RecordBatch> {
    let dir = root.join(table);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => return Vec::new(),
    };
    files.retain(|p| p.extension().is_some_and(|e| e == "arrow"));
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let reader =
            arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&file).unwrap(), None)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for batch in reader {
            out.push(batch.unwrap());
        }
    }
    out
}

/// Reads every Parquet file the Parquet sink wrote for a table.
pub fn read_parquet(root: &Path, destination: &str) -> Vec<RecordBatch> {
    let dir = root.join(destination.replace('.', "/"));
    let mut files = Vec::new();
    collect_files(&dir, "parquet", &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&file).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap();
        for batch in reader {
            out.push(batch.unwrap());
        }
    }
    out
}

fn collect_files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// One change read back from a destination.
#[derive(Clone, Debug)]
pub struct ReadChange {
    pub op: String,
    pub pos: Vec<u8>,
    pub values: Vec<Value>,
}

/// Every row of the batches as a change, with the table's columns decoded.
pub fn changes(table: &TableSchema, batches: &[RecordBatch]) -> Vec<ReadChange> {
    let mut out = Vec::new();
    for batch in batches {
        if batch.num_rows() == 0 {
            continue;
        }
        let ops = batch.column_by_name("__op").expect("__op column");
        let ops = ops.as_string::<i32>();
        let positions = batch.column_by_name("__pos").expect("__pos column");
        let positions = positions.as_binary::<i32>();
        let columns: Vec<&dyn Array> = table
            .columns
            .iter()
            .map(|c| {
                batch
                    .column_by_name(&c.name)
                    .unwrap_or_else(|| panic!("{}: column {} missing", table.name, c.name))
                    .as_ref()
            })
            .collect();
        for row in 0..batch.num_rows() {
            out.push(ReadChange {
                op: ops.value(row).to_string(),
                pos: positions.value(row).to_vec(),
                values: columns.iter().map(|a| value_at(*a, row)).collect(),
            });
        }
    }
    out
}

/// One cell as a [`Value`], by the array's own type (lists recursively).
pub fn value_at(array: &dyn Array, row: usize) -> Value {
    if array.is_null(row) {
        return Value::Null;
    }
    match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
        DataType::Int32 => Value::Int32(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Value::Int64(array.as_primitive::<Int64Type>().value(row)),
        DataType::Float64 => Value::Float64(array.as_primitive::<Float64Type>().value(row)),
        DataType::Decimal128(_, _) => {
            Value::Decimal128(array.as_primitive::<Decimal128Type>().value(row))
        }
        DataType::Utf8 => Value::Utf8(array.as_string::<i32>().value(row).to_string()),
        DataType::Binary => Value::Binary(array.as_binary::<i32>().value(row).to_vec()),
        DataType::Date32 => Value::Date32(array.as_primitive::<Date32Type>().value(row)),
        DataType::Timestamp(_, _) => {
            Value::TimestampMicros(array.as_primitive::<TimestampMicrosecondType>().value(row))
        }
        DataType::List(_) => {
            let list = array.as_list::<i32>().value(row);
            Value::List(
                (0..list.len())
                    .map(|i| value_at(list.as_ref(), i))
                    .collect(),
            )
        }
        other => panic!("unexpected column type {other}"),
    }
}

/// What reducing a change log gave, and what was odd about it.
pub struct Reduced {
    pub state: BTreeMap<Vec<KeyPart>, Vec<Value>>,
    /// Changes seen more than once (same position).
    pub duplicates: usize,
}

/// Applies changes in position order: the last change per key wins and a
/// delete removes the key.
pub fn reduce(table: &TableSchema, mut log: Vec<ReadChange>) -> Reduced {
    log.sort_by(|a, b| a.pos.cmp(&b.pos));
    let before = log.len();
    log.dedup_by(|a, b| a.pos == b.pos);
    let duplicates = before - log.len();
    let mut state = BTreeMap::new();
    for change in log {
        let key: Vec<KeyPart> = table
            .key
            .iter()
            .map(|&i| KeyPart::from_value(&change.values[i]).expect("key value"))
            .collect();
        if change.op == "delete" {
            state.remove(&key);
        } else {
            state.insert(key, change.values);
        }
    }
    Reduced { state, duplicates }
}

/// Compares a destination table with the expected state, with a readable
/// account of the first differences.
pub fn assert_table_matches(
    label: &str,
    expected: &ExpectedState,
    table: &str,
    actual: &BTreeMap<Vec<KeyPart>, Vec<Value>>,
) {
    let want = &expected.tables[table];
    if want == actual {
        return;
    }
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !actual.contains_key(*k))
        .take(3)
        .collect();
    let extra: Vec<_> = actual
        .keys()
        .filter(|k| !want.contains_key(*k))
        .take(3)
        .collect();
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, v)| actual.get(*k).is_some_and(|a| a != *v))
        .take(2)
        .map(|(k, v)| format!("{k:?}: want {v:?}, got {:?}", actual[k]))
        .collect();
    panic!(
        "{label}, table {table}: {} rows expected, {} found; missing {missing:?}; extra {extra:?}; differing {differ:?}",
        want.len(),
        actual.len()
    );
}

/// One sink entry of a test pipeline.
pub struct SinkDef {
    pub name: &'static str,
    pub plugin: PathBuf,
    pub root: PathBuf,
    pub required: bool,
    pub config: Vec<(&'static str, String)>,
    pub memory_mb: u64,
    pub call_timeout_ms: u64,
}

impl SinkDef {
    pub fn new(name: &'static str, crate_name: &str, dir: &Path) -> Self {
        SinkDef {
            name,
            plugin: plugin(crate_name),
            root: dir.join("out").join(name),
            required: true,
            config: Vec::new(),
            memory_mb: 256,
            call_timeout_ms: 30_000,
        }
    }

    pub fn optional(mut self) -> Self {
        self.required = false;
        self
    }

    pub fn limits(mut self, memory_mb: u64, call_timeout_ms: u64) -> Self {
        self.memory_mb = memory_mb;
        self.call_timeout_ms = call_timeout_ms;
        self
    }

    pub fn config(mut self, key: &'static str, value: &str) -> Self {
        self.config.push((key, value.to_string()));
        self
    }
}

/// The generator workload and batching of a test pipeline.
pub struct Workload {
    pub seed: u64,
    pub max_changes: u64,
    pub max_rows: usize,
    pub linger_ms: u64,
    pub pace_us: u64,
}

/// Writes `pipeline.yaml` into `dir` and returns its path.
pub fn write_pipeline(dir: &Path, workload: &Workload, sinks: &[SinkDef]) -> PathBuf {
    let mut yaml = format!(
        "pipeline: test\nstate_dir: state\nsource:\n  generator: {{ seed: {}, max_changes: {}, pace_us: {} }}\nbatch: {{ max_rows: {}, linger_ms: {}, heartbeat_ms: 200 }}\nsinks:\n",
        workload.seed,
        workload.max_changes,
        workload.pace_us,
        workload.max_rows,
        workload.linger_ms
    );
    for sink in sinks {
        yaml.push_str(&format!(
            "  - name: {}\n    plugin: {}\n    required: {}\n    blob_store: {{ url: {} }}\n    limits: {{ memory_mb: {}, call_timeout_ms: {} }}\n    retries: 1\n",
            sink.name,
            sink.plugin.display(),
            sink.required,
            sink.root.display(),
            sink.memory_mb,
            sink.call_timeout_ms
        ));
        if !sink.config.is_empty() {
            yaml.push_str("    config:\n");
            for (k, v) in &sink.config {
                yaml.push_str(&format!("      {k}: \"{v}\"\n"));
            }
        }
    }
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// `weir status --json`, parsed.
pub fn status(pipeline: &Path) -> serde_json::Value {
    let out = weir(&["status", pipeline.to_str().unwrap(), "--json"], &[]);
    assert!(out.status.success(), "weir status failed: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("status is JSON")
}

/// A sink's committed position per table from a status, as raw bytes.
pub fn positions_of(status: &serde_json::Value, sink: &str) -> BTreeMap<String, Option<Vec<u8>>> {
    let sinks = status["sinks"].as_array().expect("sinks");
    let sink = sinks
        .iter()
        .find(|s| s["sink"] == sink)
        .unwrap_or_else(|| panic!("no sink {sink} in status"));
    sink["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let position = t["position_hex"].as_str().map(|h| hex::decode(h).unwrap());
            (t["table"].as_str().unwrap().to_string(), position)
        })
        .collect()
}

/// Checks every table of a positioned-fixture root against the seed:
/// exact contents and no change applied twice.
pub fn assert_positioned_exact(root: &Path, expected: &ExpectedState) {
    for table in tables() {
        let reduced = reduce(&table, changes(&table, &read_positioned(root, &table.name)));
        assert_eq!(
            reduced.duplicates, 0,
            "the positioned sink holds {} duplicated changes in {}",
            reduced.duplicates, table.name
        );
        assert_table_matches("positioned sink", expected, &table.name, &reduced.state);
    }
}

/// Checks every table of a Parquet-sink root against the seed: complete by
/// key. Returns how many duplicated changes replays left behind.
pub fn assert_parquet_complete(root: &Path, expected: &ExpectedState) -> usize {
    let mut duplicates = 0;
    for table in tables() {
        let reduced = reduce(&table, changes(&table, &read_parquet(root, &table.name)));
        duplicates += reduced.duplicates;
        assert_table_matches("parquet sink", expected, &table.name, &reduced.state);
    }
    duplicates
}

/// Kill delays for crash tests: a tiny xorshift generator seeded from the
/// clock, so every run probes other moments, or from `WEIR_CRASH_SEED` to
/// replay one; the seed is printed either way.
pub struct KillSchedule(u64);

impl KillSchedule {
    pub fn from_env_or_clock() -> Self {
        let seed = std::env::var("WEIR_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        println!("kill schedule seed: {seed} (set WEIR_CRASH_SEED to replay it)");
        KillSchedule(seed)
    }

    /// A delay in `low..high` milliseconds.
    pub fn next_ms(&mut self, low: u64, high: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        low + self.0 % (high - low)
    }
}
