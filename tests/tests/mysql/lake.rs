//! MariaDB types into Iceberg and Parquet, exactly: the typed tables of
//! `cdc` (a column of nearly every MariaDB type) go by backfill and by the
//! stream into the Iceberg sink and the Parquet sink, and DuckDB and
//! pyiceberg must each return what MariaDB itself returns for the same rows
//! (the Parquet files, a change log, folded by position). See
//! docs/mysql.md, "Types".

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::text;
use crate::iceberg_support::{Lake, read_python};
use crate::mysql_support::*;

use super::cdc::{Rng, SCHEMA, initial_load, workload};

/// How a value is compared: as printed, or parsed where the readers and
/// MariaDB print one value in different ways.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Form {
    Plain,
    /// A double: the readers print its IEEE-754 bits in hex.
    Float,
    /// A time of day, compared in microseconds.
    Time,
}

/// `(column, SQL giving MariaDB's text in the readers' canonical form, form)`.
const CUSTOMERS: &[(&str, &str, Form)] = &[
    ("id", "CAST(id AS CHAR)", Form::Plain),
    ("name", "name", Form::Plain),
    ("email", "email", Form::Plain),
    ("balance", "CAST(balance AS CHAR)", Form::Plain),
    ("tiny", "CAST(tiny AS CHAR)", Form::Plain),
    ("small", "CAST(small AS CHAR)", Form::Plain),
    ("medium", "CAST(medium AS CHAR)", Form::Plain),
    ("int_u", "CAST(int_u AS CHAR)", Form::Plain),
    ("big_u", "CAST(big_u AS CHAR)", Form::Plain),
    ("ratio", "CAST(ratio AS CHAR)", Form::Float),
    ("score", "CAST(CAST(score AS DOUBLE) AS CHAR)", Form::Float),
    (
        "born",
        "CAST(DATEDIFF(born, '1970-01-01') AS CHAR)",
        Form::Plain,
    ),
    (
        "seen_at",
        "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', seen_at) AS CHAR)",
        Form::Plain,
    ),
    (
        "updated_at",
        "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', updated_at) AS CHAR)",
        Form::Plain,
    ),
    ("wake", "TIME_FORMAT(wake, '%H:%i:%s.%f')", Form::Time),
    ("since", "CAST(since AS CHAR)", Form::Plain),
    ("kind", "kind", Form::Plain),
    ("flags", "flags", Form::Plain),
    (
        "active",
        "CASE WHEN active IS NULL THEN NULL WHEN active = 1 THEN 'true' ELSE 'false' END",
        Form::Plain,
    ),
    ("mask", "LPAD(LOWER(HEX(mask)), 4, '0')", Form::Plain),
    ("avatar", "LOWER(HEX(avatar))", Form::Plain),
    ("code", "LOWER(HEX(code))", Form::Plain),
    ("prefs", "prefs", Form::Plain),
    ("note", "note", Form::Plain),
];

const ITEMS: &[(&str, &str, Form)] = &[
    ("order_id", "CAST(order_id AS CHAR)", Form::Plain),
    ("sku", "sku", Form::Plain),
    ("qty", "CAST(qty AS CHAR)", Form::Plain),
];

fn normal(form: Form, text: Option<&str>) -> Option<String> {
    let text = text?;
    Some(match form {
        Form::Plain => text.to_string(),
        Form::Float => {
            let value = if text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
                f64::from_bits(u64::from_str_radix(text, 16).unwrap())
            } else {
                text.parse::<f64>().unwrap()
            };
            format!("{value:e}")
        }
        Form::Time => {
            let (clock, frac) = text.split_once('.').unwrap_or((text, "0"));
            let mut parts = clock.split(':').map(|p| p.parse::<i64>().unwrap());
            let (h, m, s) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            let micros: i64 = format!("{frac:0<6}")[..6].parse().unwrap();
            (((h * 60 + m) * 60 + s) * 1_000_000 + micros).to_string()
        }
    })
}

/// MariaDB's rows keyed by the first `key` columns, in canonical form.
fn server_rows(
    maria: &Maria,
    db: &str,
    table: &str,
    columns: &[(&str, &str, Form)],
    key: usize,
) -> BTreeMap<Vec<Option<String>>, Vec<Option<String>>> {
    let select: Vec<&str> = columns.iter().map(|c| c.1).collect();
    let sql = format!(
        "SET time_zone = '+00:00'; SELECT {} FROM `{table}`",
        select.join(", ")
    );
    maria
        .rows(db, &sql)
        .into_iter()
        .map(|row| {
            let row: Vec<Option<String>> = row
                .iter()
                .zip(columns)
                .map(|(v, c)| normal(c.2, v.as_deref()))
                .collect();
            (row[..key].to_vec(), row)
        })
        .collect()
}

fn assert_reader_equals_server(
    reader: &str,
    metadata: &Path,
    want: &BTreeMap<Vec<Option<String>>, Vec<Option<String>>>,
    columns: &[(&str, &str, Form)],
    key: usize,
) {
    let read = read_python(reader, metadata).unwrap_or_else(|e| panic!("{reader} failed: {e}"));
    let index: Vec<usize> = columns
        .iter()
        .map(|(name, ..)| {
            read.columns
                .iter()
                .position(|c| c == name)
                .unwrap_or_else(|| panic!("{reader}: no column {name} in {:?}", read.columns))
        })
        .collect();
    let got: BTreeMap<Vec<Option<String>>, Vec<Option<String>>> = read
        .rows
        .iter()
        .map(|row| {
            let row: Vec<Option<String>> = index
                .iter()
                .zip(columns)
                .map(|(&i, c)| normal(c.2, row[i].as_deref()))
                .collect();
            (row[..key].to_vec(), row)
        })
        .collect();
    assert_eq!(
        got.len(),
        read.rows.len(),
        "{reader}: a key twice in {}",
        metadata.display()
    );
    let differ: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .take(2)
        .map(|(k, v)| format!("{k:?}:\n  mariadb {v:?}\n  {reader} {:?}", got.get(k)))
        .collect();
    assert!(
        differ.is_empty() && got.len() == want.len(),
        "{reader} of {}: mariadb has {} rows, the reader {}; differing:\n{}",
        metadata.display(),
        want.len(),
        got.len(),
        differ.join("\n")
    );
}

/// The Parquet sink's change log under `folder`, as DuckDB reads it, folded:
/// per key the change with the greatest position, deletes removed.
fn parquet_rows(
    folder: &Path,
    columns: &[(&str, &str, Form)],
    key: usize,
) -> BTreeMap<Vec<Option<String>>, Vec<Option<String>>> {
    let read =
        read_python("duckdb-parquet", folder).unwrap_or_else(|e| panic!("DuckDB failed: {e}"));
    let at = |name: &str| {
        read.columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no column {name} in the Parquet files: {:?}", read.columns))
    };
    let (op, pos) = (at("__op"), at("__pos"));
    let index: Vec<usize> = columns.iter().map(|(name, ..)| at(name)).collect();
    let mut log: Vec<&Vec<Option<String>>> = read.rows.iter().collect();
    // Positions compare as bytes; their hex compares the same way.
    log.sort_by(|a, b| a[pos].cmp(&b[pos]));
    let mut state = BTreeMap::new();
    for row in log {
        let values: Vec<Option<String>> = index
            .iter()
            .zip(columns)
            .map(|(&i, c)| normal(c.2, row[i].as_deref()))
            .collect();
        let k = values[..key].to_vec();
        if row[op].as_deref() == Some("delete") {
            state.remove(&k);
        } else {
            state.insert(k, values);
        }
    }
    state
}

#[test]
fn every_type_reaches_iceberg_and_parquet_as_duckdb_and_pyiceberg_read_it_equal_to_mariadb() {
    let maria = server();
    let db = "weir_my_lake";
    maria.fresh_db(db);
    maria.sql(db, SCHEMA);
    let mut rng = Rng::seeded(0x1a4e_0000_0000_0001);
    maria.sql(db, &initial_load(250, &mut rng));
    let mut next_id = 250;

    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    std::fs::create_dir_all(&lake.root).unwrap();
    let files = dir.path().join("files");
    let yaml = format!(
        "pipeline: mylake\nstate_dir: state\nsource:\n  mysql:\n    host: 127.0.0.1\n    port: {}\n    user: {USER}\n    password: {PASSWORD}\n    server_id: 5501\n    tables: [\"{db}.*\"]\n    chunk_rows: 100\n    heartbeat_ms: 500\n    exit_when_caught_up: true\nbatch: {{ max_rows: 400, linger_ms: 50, heartbeat_ms: 300 }}\nsinks:\n  - name: lake\n    plugin: {}\n    blob_store: {{ url: {} }}\n    config: {{ warehouse: \"{}\" }}\n    limits: {{ memory_mb: 1024, call_timeout_ms: 120000 }}\n  - name: files\n    plugin: {}\n    blob_store: {{ url: {} }}\n",
        maria.port,
        crate::common::plugin("weir-iceberg-sink").display(),
        lake.root.display(),
        lake.warehouse(),
        crate::common::plugin("weir-parquet-sink").display(),
        files.display(),
    );
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, yaml).unwrap();

    // The backfill, then the stream.
    let out = drain(&file);
    assert!(
        out.status.success(),
        "the backfill run failed: {}",
        text(&out)
    );
    maria.sql(db, &workload(&mut rng, 200, &mut next_id));
    let out = drain(&file);
    assert!(
        out.status.success(),
        "the streaming run failed: {}",
        text(&out)
    );

    for (table, columns, key) in [("customers", CUSTOMERS, 1), ("items", ITEMS, 2)] {
        let want = server_rows(&maria, db, table, columns, key);
        assert!(
            want.len() > 100,
            "{table}: too few rows to say much ({})",
            want.len()
        );
        let metadata = lake.metadata(&format!("{db}.{table}")).unwrap_or_else(|| {
            panic!(
                "no Iceberg table for {db}.{table} under {}",
                lake.root.display()
            )
        });
        for reader in ["duckdb", "pyiceberg"] {
            assert_reader_equals_server(reader, &metadata, &want, columns, key);
        }
        let parquet = files.join(db).join(table);
        assert_eq!(
            parquet_rows(&parquet, columns, key),
            want,
            "DuckDB's read of the Parquet files under {}",
            parquet.display()
        );
        println!(
            "{table}: {} rows equal in DuckDB (Iceberg and Parquet) and pyiceberg",
            want.len()
        );
    }
}
