//! The JavaScript example sink (examples/js-sink, built with sdk/js by
//! scripts/build-plugins) against the Rust hello-sink it copies: the same
//! generator backlog into both must leave the same rows in the same files,
//! deletes included; and a configuration it cannot use stops the pipeline
//! with a sentence naming the key.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::*;

/// The JSON Lines files under a sink's root: `<table>/<batch id>.jsonl` ->
/// the set of its rows, each as canonical JSON text (keys sorted), so two
/// writers that order keys or lines differently still compare equal.
fn json_lines_files(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = BTreeMap::new();
    for table in tables() {
        let folder = root.join(&table.name);
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let rows = text
                .lines()
                .map(|line| {
                    let row: serde_json::Value = serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("{}: {e}: {line}", path.display()));
                    canonical(&row)
                })
                .collect();
            let name = format!(
                "{}/{}",
                table.name,
                path.file_name().unwrap().to_string_lossy()
            );
            files.insert(name, rows);
        }
    }
    files
}

/// JSON text with every object's keys in sorted order.
fn canonical(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Object(map) => {
            let sorted: BTreeMap<&String, String> =
                map.iter().map(|(k, v)| (k, canonical(v))).collect();
            let fields: Vec<String> = sorted
                .iter()
                .map(|(k, v)| format!("{}:{v}", serde_json::Value::String((*k).clone())))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        other => other.to_string(),
    }
}

#[test]
fn the_js_sink_writes_what_the_hello_sink_writes() {
    let dir = tempfile::tempdir().unwrap();
    let workload = workload(21, 2_000, 150)
        .sink(sink("hello", "hello-sink", dir.path()))
        .sink(sink("js", "js-sink", dir.path()));
    let pipeline = workload.write_in(dir.path());
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_COMPONENT_CACHE", &cache())],
    );
    assert!(out.status.success(), "{}", text(&out));

    let hello = json_lines_files(&sink_root(dir.path(), "hello"));
    let js = json_lines_files(&sink_root(dir.path(), "js"));
    assert!(!hello.is_empty(), "the hello-sink wrote nothing");
    let hello_names: Vec<&String> = hello.keys().collect();
    let js_names: Vec<&String> = js.keys().collect();
    assert_eq!(js_names, hello_names, "the two sinks wrote different files");
    for (file, rows) in &hello {
        let js_rows = &js[file];
        let missing: Vec<&String> = rows.difference(js_rows).take(3).collect();
        let extra: Vec<&String> = js_rows.difference(rows).take(3).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{file}: the JS sink lacks {missing:?} and has {extra:?}"
        );
    }

    // The backlog must have exercised what a JSON writer gets wrong: deletes
    // (key columns only), nulls left out, every operation.
    let all_rows: Vec<serde_json::Value> = js
        .values()
        .flatten()
        .map(|row| serde_json::from_str(row).unwrap())
        .collect();
    let ops: BTreeSet<&str> = all_rows.iter().filter_map(|r| r["op"].as_str()).collect();
    for op in ["insert", "update", "delete"] {
        assert!(ops.contains(op), "no {op} in the backlog: {ops:?}");
    }
    let expected = expected_state(workload.seed(), workload.max_changes());
    assert!(
        all_rows.len() >= expected.rows(),
        "{} rows written for {} rows left at the end",
        all_rows.len(),
        expected.rows()
    );
}

#[test]
fn the_js_sink_names_the_config_key_it_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let run_with = |key: &str, value: &str| {
        let pipeline = workload(3, 200, 100)
            .sink(sink("js", "js-sink", dir.path()).config(key, value))
            .write_in(dir.path());
        weir(
            &["run", pipeline.to_str().unwrap()],
            &[("WEIR_COMPONENT_CACHE", &cache())],
        )
    };

    let out = run_with("colour", "blue");
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    assert!(
        report.contains("unknown key `colour`") && report.contains("`prefix`"),
        "the error does not name the key: {report}"
    );

    let out = run_with("prefix", "../outside");
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    assert!(
        report.contains("`prefix` must be a relative folder") && report.contains("../outside"),
        "the error does not name the key: {report}"
    );
    assert!(
        !sink_root(dir.path(), "js").join("shop.orders").exists(),
        "a refused sink wrote files"
    );

    // The same key with a usable value works: the files go under it.
    let out = run_with("prefix", "export");
    assert!(out.status.success(), "{}", text(&out));
    let files = json_lines_files(&sink_root(dir.path(), "js").join("export"));
    assert!(!files.is_empty(), "nothing under the prefix");
}

/// The shared cache: the interpreter inside this sink compiles once for all
/// of its tests.
fn cache() -> String {
    shared_component_cache().display().to_string()
}
