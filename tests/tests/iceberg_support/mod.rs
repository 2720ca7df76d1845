//! Helpers for the Iceberg end-to-end tests: pipelines that write Iceberg
//! tables with the WASM plugin, three readers we did not write (the
//! `iceberg` crate, pyiceberg, DuckDB's iceberg extension), and the
//! generator's truth at any committed position.
//!
//! Every reader's rows are compared in one canonical form (see
//! tests/readers/read_iceberg.py): text for numbers and decimals, IEEE bits
//! for floats, hex for binary, days and microseconds for dates and times.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use futures::TryStreamExt;
use weir_source::change::{TableSchema, Value};
use weir_test_support::{
    PipelineBuilder, SinkBuilder, TableMode, apply_change, change_log, row_key,
};

use crate::common;
use weir_test_support::moto::MotoServer;

/// A row in canonical form: one entry per column, `None` for null.
pub type Row = Vec<Option<String>>;

/// Rows read by one reader, with its column names.
#[derive(Debug, Clone)]
pub struct Read {
    pub columns: Vec<String>,
    pub rows: Vec<Row>,
}

impl Read {
    /// The rows restricted to `names`, in that order, sorted.
    pub fn project(&self, names: &[String]) -> Vec<Row> {
        let index: Vec<usize> = names
            .iter()
            .map(|n| {
                self.columns
                    .iter()
                    .position(|c| c == n)
                    .unwrap_or_else(|| panic!("column {n} missing from {:?}", self.columns))
            })
            .collect();
        let mut out: Vec<Row> = self
            .rows
            .iter()
            .map(|r| index.iter().map(|&i| r[i].clone()).collect())
            .collect();
        out.sort();
        out
    }
}

/// The blob root folder, the warehouse URL readers use for it, and the blob
/// path of each generator table's Iceberg table.
pub struct Lake {
    pub root: PathBuf,
}

impl Lake {
    pub fn warehouse(&self) -> String {
        format!("file://{}", self.root.display())
    }

    /// Folder of the Iceberg table a source table is mapped to (`<ns>/<table>`).
    pub fn table_dir(&self, destination: &str) -> PathBuf {
        self.root.join(destination.replace('.', "/"))
    }

    /// The newest metadata file of a table (hint, then probe forward).
    pub fn metadata(&self, destination: &str) -> Option<PathBuf> {
        let dir = self.table_dir(destination).join("metadata");
        let mut version: u64 = std::fs::read_to_string(dir.join("version-hint.text"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        while dir.join(format!("v{}.metadata.json", version + 1)).exists() {
            version += 1;
        }
        Some(dir.join(format!("v{version}.metadata.json")))
    }

    /// The position (and epoch) the table's snapshots say `pipeline`
    /// committed for `table`, read from the metadata JSON.
    pub fn committed(
        &self,
        destination: &str,
        pipeline: &str,
        table: &str,
    ) -> Option<(Vec<u8>, u64)> {
        let path = self.metadata(destination)?;
        let metadata: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let snapshots = metadata["snapshots"].as_array()?;
        let mut id = metadata["current-snapshot-id"].as_i64();
        while let Some(current) = id {
            let s = snapshots
                .iter()
                .find(|s| s["snapshot-id"].as_i64() == Some(current))?;
            let summary = &s["summary"];
            if summary["weir.pipeline"] == pipeline && summary["weir.table"] == table {
                let hex = summary["weir.position"].as_str().unwrap();
                let epoch = summary["weir.epoch"].as_str().unwrap().parse().unwrap();
                return Some((hex::decode(hex).unwrap(), epoch));
            }
            id = s["parent-snapshot-id"].as_i64();
        }
        None
    }
}

impl Lake {
    /// Where each generator table stands in `pipeline`'s Iceberg tables, by
    /// their snapshots; every table must have a commit.
    pub fn committed_positions(&self, pipeline: &str) -> BTreeMap<String, Vec<u8>> {
        common::tables()
            .into_iter()
            .map(|table| {
                let (position, _) = self
                    .committed(&destination(&table.name), pipeline, &table.name)
                    .unwrap_or_else(|| panic!("{pipeline}, {}: nothing committed", table.name));
                (table.name.clone(), position)
            })
            .collect()
    }
}

/// Reads every generator table's Iceberg table under `s3://<bucket>/
/// <prefix>` (its newest metadata among the bucket's keys) through S3 with
/// DuckDB and pyiceberg, and compares each with `want`; returns the keys
/// listed.
pub fn assert_tables_read_through_s3(
    moto: &MotoServer,
    bucket: &str,
    prefix: &str,
    want: &BTreeMap<String, Vec<Row>>,
) -> BTreeMap<String, String> {
    let keys = moto.keys(bucket, prefix);
    for table in common::tables() {
        let table_prefix = format!("{prefix}{}", destination(&table.name).replace('.', "/"));
        let metadata = newest_metadata(&keys, &table_prefix).unwrap_or_else(|| {
            panic!(
                "{}: no metadata under s3://{bucket}/{table_prefix}",
                table.name
            )
        });
        let columns = column_names(&table, &["change_pos"]);
        for reader in ["duckdb", "pyiceberg"] {
            let read = read_through_s3(moto, reader, bucket, &metadata)
                .unwrap_or_else(|e| panic!("{reader} cannot read s3://{bucket}/{metadata}: {e}"));
            assert_rows(
                &format!("{reader} through S3, {}", table.name),
                &want[&table.name],
                &read.project(&columns),
            );
        }
        println!(
            "{}: {} rows, equal in DuckDB and pyiceberg through S3",
            table.name,
            want[&table.name].len()
        );
    }
    keys
}

pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// The destination each generator table is mapped to.
pub fn destination(table: &str) -> String {
    // shop.orders -> lake.orders: a namespace other than the source's, to
    // exercise the mapping.
    format!("lake.{}", table.rsplit('.').next().unwrap())
}

/// Pipeline `name` over the generator stream `(seed, max_changes)`, mapping
/// every table in `mode` onto its [`destination`] in the lake, through one
/// Iceberg sink called `iceberg`.
pub fn iceberg_pipeline(
    name: &str,
    seed: u64,
    max_changes: u64,
    mode: TableMode,
    lake: &Lake,
) -> PipelineBuilder {
    let sink = SinkBuilder::new("iceberg", common::plugin("weir-iceberg-sink"))
        .blob_store(&lake.root)
        .limits(1024, 120_000)
        .retries(2)
        .config("warehouse", &lake.warehouse());
    common::tables()
        .iter()
        .fold(PipelineBuilder::generator(seed, max_changes), |p, t| {
            p.table(&t.name, mode, &destination(&t.name))
        })
        .name(name)
        .sink(sink)
}

/// The Python of the project's virtualenv (scripts/setup makes it).
pub fn python() -> PathBuf {
    let python = common::workspace().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup (it installs pyiceberg and DuckDB)",
        python.display()
    );
    python
}

/// Reads a table with pyiceberg or DuckDB. `Err` carries the reader's
/// error output.
pub fn read_python(reader: &str, metadata: &Path) -> Result<Read, String> {
    let script = common::workspace().join("tests/readers/read_iceberg.py");
    let out = Command::new(python())
        .arg(script)
        .arg(reader)
        .arg(metadata)
        .output()
        .expect("python runs");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let columns = json["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let rows = json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .collect();
    Ok(Read { columns, rows })
}

/// The table's rows as the `iceberg` crate scans them (its own local file
/// IO and scan), in the batches it returns.
pub fn scan_native(metadata: &Path) -> Vec<RecordBatch> {
    // One thread: the iceberg crate's equality-delete loader can miss a
    // wake-up on a multi-thread runtime and hang the scan.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let location = format!("file://{}", metadata.display());
    runtime.block_on(async {
        let table = iceberg::table::StaticTable::from_metadata_file(
            &location,
            iceberg::TableIdent::from_strs(["t", "t"]).unwrap(),
            iceberg::io::FileIO::new_with_fs(),
        )
        .await
        .unwrap_or_else(|e| panic!("{location}: {e}"));
        table
            .scan()
            .build()
            .unwrap()
            .to_arrow()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap_or_else(|e| panic!("{location}: scan failed: {e}"))
    })
}

/// Reads a table with the `iceberg` crate, each value in canonical form.
pub fn read_native(metadata: &Path) -> Read {
    let batches = scan_native(metadata);
    let mut read = Read {
        columns: Vec::new(),
        rows: Vec::new(),
    };
    for batch in batches {
        if read.columns.is_empty() {
            read.columns = batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
        }
        for row in 0..batch.num_rows() {
            read.rows.push(
                batch
                    .columns()
                    .iter()
                    .map(|c| canonical_arrow(c.as_ref(), row))
                    .collect(),
            );
        }
    }
    read
}

fn decimal_text(unscaled: i128, scale: i8) -> String {
    if scale <= 0 {
        return unscaled.to_string();
    }
    let scale = scale as u32;
    let sign = if unscaled < 0 { "-" } else { "" };
    let abs = unscaled.unsigned_abs();
    let div = 10u128.pow(scale);
    format!(
        "{sign}{}.{:0width$}",
        abs / div,
        abs % div,
        width = scale as usize
    )
}

/// One Arrow value in canonical form.
pub fn canonical_arrow(array: &dyn Array, row: usize) -> Option<String> {
    if array.is_null(row) {
        return None;
    }
    Some(match array.data_type() {
        DataType::Boolean => array.as_boolean().value(row).to_string(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(row).to_string(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::Float64 => format!(
            "{:016x}",
            array.as_primitive::<Float64Type>().value(row).to_bits()
        ),
        DataType::Decimal128(_, s) => {
            decimal_text(array.as_primitive::<Decimal128Type>().value(row), *s)
        }
        DataType::Utf8 => array.as_string::<i32>().value(row).to_string(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).to_string(),
        DataType::Binary => hex(array.as_binary::<i32>().value(row)),
        DataType::LargeBinary => hex(array.as_binary::<i64>().value(row)),
        DataType::Date32 => array.as_primitive::<Date32Type>().value(row).to_string(),
        DataType::Timestamp(_, _) => array
            .as_primitive::<TimestampMicrosecondType>()
            .value(row)
            .to_string(),
        other => panic!("unexpected column type {other}"),
    })
}

/// One generator value in canonical form.
pub fn canonical_value(value: &Value, data_type: &DataType) -> Option<String> {
    Some(match value {
        Value::Null => return None,
        Value::Bool(v) => v.to_string(),
        Value::Int32(v) => v.to_string(),
        Value::Int64(v) => v.to_string(),
        Value::Float64(v) => format!("{:016x}", v.to_bits()),
        Value::Decimal128(v) => match data_type {
            DataType::Decimal128(_, s) => decimal_text(*v, *s),
            other => panic!("decimal value in a {other} column"),
        },
        Value::Utf8(v) => v.clone(),
        Value::Binary(v) => hex(v),
        Value::Date32(v) => v.to_string(),
        Value::TimestampMicros(v) => v.to_string(),
        other => panic!("the generator makes no {other:?} values"),
    })
}

/// A table's column names, plus extra (metadata) column names.
pub fn column_names(table: &TableSchema, extra: &[&str]) -> Vec<String> {
    table
        .columns
        .iter()
        .map(|c| c.name.clone())
        .chain(extra.iter().map(|s| s.to_string()))
        .collect()
}

fn canonical_row(table: &TableSchema, values: &[Value]) -> Row {
    table
        .columns
        .iter()
        .zip(values)
        .map(|(c, v)| canonical_value(v, &c.data_type))
        .collect()
}

/// What an upsert table must hold when `committed[table]` is where each
/// table stands: the generator's change log applied up to that position,
/// each row followed by the position of its last change (hex). Tables
/// missing from `committed` hold nothing.
pub fn upsert_state_at(
    seed: u64,
    max_changes: u64,
    committed: &BTreeMap<String, Vec<u8>>,
) -> BTreeMap<String, Vec<Row>> {
    let mut state: BTreeMap<String, weir_test_support::Rows<Row>> = common::tables()
        .iter()
        .map(|t| (t.name.clone(), BTreeMap::new()))
        .collect();
    for change in change_log(seed, max_changes) {
        let table = &change.table;
        let Some(at) = committed.get(&table.name) else {
            continue;
        };
        if change.pos.as_bytes() > at.as_slice() {
            continue;
        }
        let mut row = canonical_row(table, &change.values);
        row.push(Some(hex(change.pos.as_bytes())));
        let rows = state.get_mut(&table.name).unwrap();
        apply_change(rows, row_key(table, &change.values), change.op, row);
    }
    state
        .into_iter()
        .map(|(t, rows)| {
            let mut rows: Vec<Row> = rows.into_values().collect();
            rows.sort();
            (t, rows)
        })
        .collect()
}

/// What an append table must hold after the whole stream: every change,
/// followed by its op and position (hex).
pub fn append_rows(seed: u64, max_changes: u64) -> BTreeMap<String, Vec<Row>> {
    let mut out: BTreeMap<String, Vec<Row>> = common::tables()
        .iter()
        .map(|t| (t.name.clone(), Vec::new()))
        .collect();
    for change in change_log(seed, max_changes) {
        let mut row = canonical_row(&change.table, &change.values);
        row.push(Some(change.op.as_str().to_string()));
        row.push(Some(hex(change.pos.as_bytes())));
        out.get_mut(&change.table.name).unwrap().push(row);
    }
    for rows in out.values_mut() {
        rows.sort();
    }
    out
}

/// Compares rows with a readable account of the first differences.
pub fn assert_rows(label: &str, want: &[Row], got: &[Row]) {
    if want == got {
        return;
    }
    let missing: Vec<_> = want.iter().filter(|r| !got.contains(r)).take(3).collect();
    let extra: Vec<_> = got.iter().filter(|r| !want.contains(r)).take(3).collect();
    panic!(
        "{label}: {} rows expected, {} read; missing e.g. {missing:?}; unexpected e.g. {extra:?}",
        want.len(),
        got.len()
    );
}

/// Checks that no key appears twice among `rows` (key = first `key_len`
/// columns after projection by the table's key indexes).
pub fn duplicate_keys(table: &TableSchema, rows: &[Row]) -> usize {
    let mut seen = std::collections::HashSet::new();
    rows.iter()
        .filter(|r| !seen.insert(table.key.iter().map(|&i| r[i].clone()).collect::<Vec<_>>()))
        .count()
}

/// [`iceberg_pipeline`] with extra entries in the Iceberg sink's config.
pub fn iceberg_pipeline_with(
    name: &str,
    seed: u64,
    max_changes: u64,
    mode: TableMode,
    lake: &Lake,
    config: &[(&str, &str)],
) -> PipelineBuilder {
    let sink = config.iter().fold(
        SinkBuilder::new("iceberg", common::plugin("weir-iceberg-sink"))
            .blob_store(&lake.root)
            .limits(1024, 120_000)
            .retries(2)
            .config("warehouse", &lake.warehouse()),
        |sink, (key, value)| sink.config(key, value),
    );
    common::tables()
        .iter()
        .fold(PipelineBuilder::generator(seed, max_changes), |p, t| {
            p.table(&t.name, mode, &destination(&t.name))
        })
        .name(name)
        .sink(sink)
}

/// Keys of `table` that the generator's first `max_changes` changes delete
/// and later insert again.
pub fn reinserted_keys(seed: u64, max_changes: u64, table: &str) -> usize {
    let mut deleted = std::collections::HashSet::new();
    let mut reinserted = std::collections::HashSet::new();
    for change in change_log(seed, max_changes) {
        if change.table.name != table {
            continue;
        }
        let key = row_key(&change.table, &change.values);
        match change.op {
            weir_source::change::Op::Delete => {
                deleted.insert(key);
            }
            weir_source::change::Op::Insert if deleted.contains(&key) => {
                reinserted.insert(key);
            }
            _ => {}
        }
    }
    reinserted.len()
}

/// Wakes a process stopped with SIGSTOP (a zombie host) and waits up to two
/// minutes for it to end; its exit status and what it wrote to stderr.
pub fn wake_and_wait(zombie: &mut std::process::Child) -> (std::process::ExitStatus, String) {
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(zombie.id() as i32, libc::SIGCONT) };
    let woke = std::time::Instant::now();
    let status = loop {
        if let Some(status) = zombie.try_wait().unwrap() {
            break status;
        }
        if woke.elapsed() > std::time::Duration::from_secs(120) {
            zombie.kill().ok();
            panic!("the zombie neither finished nor was refused within two minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut message = String::new();
    use std::io::Read as _;
    zombie
        .stderr
        .take()
        .expect("the zombie's stderr is piped")
        .read_to_string(&mut message)
        .unwrap();
    (status, message)
}

/// The newest `vN.metadata.json` of a table among the bucket's keys.
pub fn newest_metadata(keys: &BTreeMap<String, String>, table_prefix: &str) -> Option<String> {
    keys.keys()
        .filter_map(|key| {
            let name = key.strip_prefix(&format!("{table_prefix}/metadata/v"))?;
            let version: u64 = name.strip_suffix(".metadata.json")?.parse().ok()?;
            Some((version, key.clone()))
        })
        .max()
        .map(|(_, key)| key)
}

/// Reads `s3://<bucket>/<key>` with `reader`, which reaches moto itself.
pub fn read_through_s3(
    moto: &MotoServer,
    reader: &str,
    bucket: &str,
    key: &str,
) -> Result<Read, String> {
    let options = moto.blob_store_options();
    let out = Command::new(python())
        .arg(common::workspace().join("tests/readers/read_iceberg.py"))
        .arg(reader)
        .arg(format!("s3://{bucket}/{key}"))
        .env("WEIR_S3_ENDPOINT", moto.endpoint())
        .env("AWS_ACCESS_KEY_ID", &options["aws_access_key_id"])
        .env("AWS_SECRET_ACCESS_KEY", &options["aws_secret_access_key"])
        .env("AWS_DEFAULT_REGION", &options["aws_region"])
        .output()
        .expect("python runs");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let strings = |v: &serde_json::Value| -> Vec<Option<String>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    Ok(Read {
        columns: strings(&json["columns"]).into_iter().flatten().collect(),
        rows: json["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(strings)
            .collect(),
    })
}
