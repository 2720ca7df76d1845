//! Loading plugins: `weir plugin inspect` reports what each shipped `.wasm`
//! is, and files that are not weir sinks are refused with a sentence that
//! says why, before anything runs.

use crate::common;

use common::*;

fn inspect(file: &std::path::Path, cache: &std::path::Path) -> serde_json::Value {
    let out = weir(
        &[
            "plugin",
            "inspect",
            file.to_str().unwrap(),
            "--json",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn inspect_reports_capabilities_of_every_shipped_plugin() {
    // The compiled code comes from the cache the tests share: compiling
    // every plugin afresh took most of a minute of CPU, and writing the
    // cache is checked below with two small plugins.
    let shared = shared_component_cache();
    let cases = [
        ("weir-parquet-sink", false, &[][..]),
        ("weir-null-sink", false, &[]),
        ("weir-iceberg-sink", true, &["http"]),
        ("weir-redis-sink", true, &["tcp"]),
        ("weir-fixture-positioned", true, &[]),
        ("weir-fixture-trap", false, &[]),
        ("weir-fixture-spin", false, &[]),
        ("weir-fixture-hog", false, &[]),
        ("weir-fixture-poison", false, &[]),
        ("weir-fixture-netprobe", false, &["http", "tcp"]),
        ("hello-sink", false, &[]),
    ];
    for (name, positioned, network) in cases {
        let file = plugin(name);
        let info = inspect(&file, &shared);
        assert_eq!(info["wit_version"], "0.1.0", "{name}");
        let capabilities: Vec<&str> = info["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(
            capabilities.contains(&"positions"),
            positioned,
            "{name}: {info}"
        );
        assert_eq!(info["network"], serde_json::json!(network), "{name}");
        // Only the Iceberg sink's network use (a REST catalog) is optional:
        // it loads on the file-system catalog without `grants.http`.
        let optional: &[&str] = if name == "weir-iceberg-sink" {
            &["http"]
        } else {
            &[]
        };
        assert_eq!(
            info["optional_network"],
            serde_json::json!(optional),
            "{name}"
        );
        let bytes = std::fs::read(&file).unwrap();
        assert_eq!(info["size"], bytes.len() as u64, "{name}");
        assert_eq!(info["sha256"].as_str().unwrap().len(), 64);
        let exports: Vec<&str> = info["exports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert!(exports.contains(&"weir:sink/sink@0.1.0"), "{name}: {info}");
        // Only the Iceberg sink maintains its tables, through the package
        // built beside the released contract.
        let maintained = name == "weir-iceberg-sink";
        assert_eq!(
            capabilities.contains(&"maintenance"),
            maintained,
            "{name}: {info}"
        );
        assert_eq!(
            exports.contains(&"weir:maintenance/maintenance@0.1.0"),
            maintained,
            "{name}: {info}"
        );
        for import in info["imports"].as_array().unwrap() {
            let import = import.as_str().unwrap();
            assert!(
                import.starts_with("wasi:") || import.starts_with("weir:sink/"),
                "{name} imports {import}"
            );
        }
    }
    // Inspecting compiles into the cache it is given, one artifact per
    // plugin, each with its seal beside it (`.cwasm.seal`): count artifacts.
    let cache = tempfile::tempdir().unwrap();
    let small = ["weir-null-sink", "hello-sink"];
    for name in small {
        inspect(&plugin(name), cache.path());
    }
    let cached = std::fs::read_dir(cache.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("cwasm".as_ref()))
        .count();
    assert_eq!(cached, small.len(), "one cached artifact per plugin");
}

#[test]
fn files_that_are_not_weir_sinks_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let core_module = dir.path().join("core.wasm");
    std::fs::write(&core_module, b"\0asm\x01\0\0\0").unwrap();
    let not_wasm = dir.path().join("notes.wasm");
    std::fs::write(&not_wasm, b"hello").unwrap();
    for (file, needle) in [
        (core_module, "core WebAssembly module"),
        (not_wasm, "is not WebAssembly"),
        (dir.path().join("missing.wasm"), "cannot read plugin"),
    ] {
        let out = weir(
            &[
                "plugin",
                "inspect",
                file.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(1));
        let report = text(&out);
        assert!(report.contains(needle), "missing {needle:?}: {report}");
    }
}

#[test]
fn a_pinned_digest_that_does_not_match_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = workload(1, 100, 50)
        .linger_ms(10)
        .sink(sink("exact", "weir-fixture-positioned", dir.path()).sha256(&"0".repeat(64)))
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("pins") && report.contains("`exact`"),
        "{report}"
    );
    assert!(!dir.path().join("out/exact").join("shop.orders").exists());
}

#[test]
fn a_bad_config_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = dir.path().join("p.yaml");
    std::fs::write(
        &pipeline,
        "pipeline: p\nsource:\n  generator: { seed: 1 }\nsinks:\n  - name: s\n    plugin: x.wasm\n    blob_store: { url: out }\n    limits: { memory_mib: 5 }\n",
    )
    .unwrap();
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("memory_mib") && report.contains("line 8"),
        "{report}"
    );
}

#[test]
fn the_hello_sink_example_writes_every_committed_change() {
    let dir = tempfile::tempdir().unwrap();
    let root = sink_root(dir.path(), "hello");
    let workload =
        workload(9, 500, 100)
            .linger_ms(10)
            .sink(sink("hello", "hello-sink", dir.path()));
    let pipeline = workload.write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let mut lines = 0;
    let mut files = Vec::new();
    for table in tables() {
        let folder = root.join(&table.name);
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            files.push(path.clone());
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let row: serde_json::Value = serde_json::from_str(line).unwrap();
                assert!(row.get("op").is_some(), "{line}");
                lines += 1;
            }
        }
    }
    assert!(!files.is_empty());
    // Last write wins per key inside a batch, so the files hold at most one
    // line per change and at least one per key still present at the end.
    let expected = expected_state(workload.seed(), workload.max_changes());
    assert!(
        lines >= expected.rows(),
        "{lines} lines for {} rows",
        expected.rows()
    );
    assert!(lines as u64 <= workload.max_changes() + 10);
}
