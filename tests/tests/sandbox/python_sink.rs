//! The Python SDK and its example sink (examples/python-sink), built by
//! scripts/build-plugins with componentize-py: the same generator stream
//! into the Python sink and the Rust hello-sink of one pipeline leaves the
//! same rows, deletes included; a bad config and a batch the SDK cannot
//! read get clear errors from the component; the SDK's own Python tests
//! (its Arrow reader checked against pyarrow) pass.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, BinaryArray, DictionaryArray, Int64Array, RecordBatch, StringArray};
use common::*;
use weir_core::position::Position;
use weir_runtime::network::SinkNetwork;
use weir_runtime::{
    BatchHeader, BlobScope, CallError, Limits, Plugin, SinkError, SinkInstance, TableDescription,
    WasmEngine,
};

const PYTHON_SINK: &str = "python-sink";

/// Every JSON object of every `.jsonl` file under `root`, by file (relative
/// path), each file's lines parsed.
fn json_lines(root: &Path) -> BTreeMap<String, Vec<serde_json::Value>> {
    let mut out = BTreeMap::new();
    let Ok(tables) = std::fs::read_dir(root) else {
        return out;
    };
    for table in tables {
        let table = table.unwrap().path();
        for file in std::fs::read_dir(&table).unwrap() {
            let file = file.unwrap().path();
            let text = std::fs::read_to_string(&file).unwrap();
            let rows = text
                .lines()
                .map(|line| {
                    serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("{}: {line:?}: {e}", file.display()))
                })
                .collect();
            let relative = file
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(relative, rows);
        }
    }
    out
}

/// The objects as a sorted list of their canonical text: a multiset.
fn as_multiset(files: &BTreeMap<String, Vec<serde_json::Value>>) -> Vec<String> {
    let mut all: Vec<String> = files.values().flatten().map(|v| v.to_string()).collect();
    all.sort();
    all
}

#[test]
fn python_sink_writes_the_rows_hello_sink_writes() {
    let dir = tempfile::tempdir().unwrap();
    let workload = workload(17, 3_000, 150)
        .sink(sink("python", PYTHON_SINK, dir.path()))
        .sink(sink("rust", "hello-sink", dir.path()));
    let pipeline = workload.write_in(dir.path());
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_COMPONENT_CACHE", &cache())],
    );
    assert!(out.status.success(), "{}", text(&out));

    let python = json_lines(&sink_root(dir.path(), "python"));
    let rust = json_lines(&sink_root(dir.path(), "rust"));
    assert!(!rust.is_empty(), "hello-sink wrote nothing");
    assert_eq!(
        python.keys().collect::<Vec<_>>(),
        rust.keys().collect::<Vec<_>>(),
        "the two sinks named their files differently"
    );
    let (python_rows, rust_rows) = (as_multiset(&python), as_multiset(&rust));
    assert!(
        rust_rows.len() as u64 >= expected_state(17, 3_000).rows() as u64,
        "fewer lines than rows"
    );
    if python_rows != rust_rows {
        let only_python: Vec<_> = python_rows
            .iter()
            .filter(|r| !rust_rows.contains(r))
            .take(3)
            .collect();
        let only_rust: Vec<_> = rust_rows
            .iter()
            .filter(|r| !python_rows.contains(r))
            .take(3)
            .collect();
        panic!(
            "{} rows from python-sink, {} from hello-sink; only in python: {only_python:?}; only in rust: {only_rust:?}",
            python_rows.len(),
            rust_rows.len()
        );
    }
    let deletes = python_rows
        .iter()
        .filter(|r| r.contains(r#""op":"delete""#))
        .count();
    assert!(
        deletes > 0,
        "the stream had no deletes: the comparison proves less than it says"
    );
    // Beyond equal objects: the same bytes, file by file.
    for file in rust.keys() {
        let read = |sink: &str| std::fs::read(sink_root(dir.path(), sink).join(file)).unwrap();
        assert!(read("python") == read("rust"), "{file} differs byte-wise");
    }
}

#[test]
fn a_config_key_python_sink_does_not_know_stops_the_run_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let workload =
        workload(3, 50, 50).sink(sink("python", PYTHON_SINK, dir.path()).config("folder", "x"));
    let pipeline = workload.write_in(dir.path());
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_COMPONENT_CACHE", &cache())],
    );
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    assert!(
        report.contains("`folder`") && report.contains("unknown"),
        "{report}"
    );
}

/// The Python sink loaded in process, the way the host loads it.
struct Loaded {
    _scratch: tempfile::TempDir,
    _io: tokio::runtime::Runtime,
    instance: SinkInstance,
}

fn load_python_sink() -> Loaded {
    let scratch = tempfile::tempdir().unwrap();
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let engine = WasmEngine::new(&shared_component_cache()).unwrap();
    let linker = weir_runtime::plugin::linker(&engine).unwrap();
    let plugin = Plugin::load(
        &engine,
        &linker,
        &plugin(PYTHON_SINK),
        None,
        &Default::default(),
        &Default::default(),
    )
    .unwrap();
    let root = scratch.path().join("root");
    let blob = BlobScope::open(
        root.to_str().unwrap(),
        &[],
        scratch.path(),
        io.handle().clone(),
    )
    .unwrap();
    let limits = Limits {
        memory_bytes: 256 << 20,
        call_timeout: Duration::from_secs(60),
        log: Default::default(),
    };
    let instance = SinkInstance::instantiate(
        &Arc::new(plugin),
        "python",
        Arc::new(blob),
        SinkNetwork::none("python"),
        &limits,
    )
    .unwrap();
    Loaded {
        _scratch: scratch,
        _io: io,
        instance,
    }
}

fn header(id: &str, rows: u32) -> BatchHeader {
    BatchHeader {
        table: Arc::new(TableDescription {
            name: "shop.orders".into(),
            key_columns: vec!["id".into()],
            mode: weir_sdk::Mode::Upsert,
            destination: "shop.orders".into(),
            metadata: Vec::new(),
        }),
        id: id.into(),
        low: Position::from_bytes(vec![1]),
        high: Position::from_bytes(vec![2]),
        rows,
    }
}

fn poison_of(result: Result<(), CallError>) -> String {
    match result {
        Err(CallError::Sink(SinkError::Poison(message))) => message,
        other => panic!("expected a poison error, got {other:?}"),
    }
}

#[test]
fn a_batch_the_python_sdk_cannot_read_is_poison_naming_the_column() {
    let mut loaded = load_python_sink();
    loaded.instance.open("p", &[]).unwrap();

    // A dictionary-encoded column: the host never sends one, the SDK refuses it.
    let tiers: DictionaryArray<Int32Type> = vec!["gold"].into_iter().collect();
    let rows = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        ("tier", Arc::new(tiers) as ArrayRef),
        (
            "__op",
            Arc::new(StringArray::from(vec!["insert"])) as ArrayRef,
        ),
        (
            "__pos",
            Arc::new(BinaryArray::from_iter_values([[1u8]])) as ArrayRef,
        ),
    ])
    .unwrap();
    let ipc = weir_sdk::native::encode_ipc(&rows);
    let message = poison_of(loaded.instance.write(&header("b-dict", 1), &ipc));
    assert!(
        message.contains("`tier`") && message.contains("dictionary"),
        "{message}"
    );
    assert!(message.contains("b-dict"), "{message}");

    // Bytes that are not an Arrow stream at all.
    let message = poison_of(loaded.instance.write(&header("b-junk", 1), b"not arrow"));
    assert!(message.contains("Arrow IPC stream"), "{message}");

    // A stream whose row count the header contradicts.
    let message = poison_of(
        loaded
            .instance
            .write(&header("b-count", 5), &ipc_of_one_row()),
    );
    assert!(message.contains("5 rows"), "{message}");

    // The instance is still usable after refusing: a good batch commits.
    loaded
        .instance
        .write(&header("b-good", 1), &ipc_of_one_row())
        .unwrap();
}

fn ipc_of_one_row() -> Vec<u8> {
    let rows = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        (
            "__op",
            Arc::new(StringArray::from(vec!["insert"])) as ArrayRef,
        ),
        (
            "__pos",
            Arc::new(BinaryArray::from_iter_values([[1u8]])) as ArrayRef,
        ),
    ])
    .unwrap();
    weir_sdk::native::encode_ipc(&rows)
}

/// The SDK's and the example's Python tests, under the .venv scripts/setup
/// makes (pyarrow is the reference reader there).
#[test]
fn the_python_sdk_tests_pass() {
    let workspace = workspace();
    let python = workspace.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup",
        python.display()
    );
    for folder in ["sdk/python/tests", "examples/python-sink"] {
        let out = std::process::Command::new(&python)
            .args(["-m", "unittest", "discover", "-s", folder])
            .current_dir(&workspace)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{folder}:\n{report}");
        assert!(
            report.contains("OK") && !report.contains("Ran 0 tests"),
            "{folder}:\n{report}"
        );
    }
}

/// The shared cache: the interpreter inside this sink compiles once for all
/// of its tests.
fn cache() -> String {
    shared_component_cache().display().to_string()
}
