//! `weir plugin new` end to end: the project it writes into a folder
//! outside this repository builds for wasm32-wasip2 on its own (against
//! this tree's SDK, as a path dependency from outside the workspace), its
//! pipeline runs the built sink from the generator and leaves every change
//! the generator made once, and `weir plugin test` finds it at-least-once,
//! idempotent by batch id.
//!
//! The build shares scripts/build-plugins' target folder
//! (`target/plugins`), with the same flags and C toolchain variables and
//! this repository's `Cargo.lock` copied into the project, so that the same
//! dependency versions resolve. The project's dependencies have features
//! of their own (the workspace's plugins, built together, enable more), so
//! none of the plugins' compiled dependencies serve it: the first run
//! compiles them all. It does so in the dev profile, without debug info:
//! the same code as the README's `--release` build, in 69 CPU-seconds from
//! nothing instead of 200 (measured on two cores), which on a fresh clone
//! is the difference between a minute and three of the test run. Later
//! runs compile only the project.
//!
//! The Python and JavaScript projects are built by their own `build.sh`,
//! which runs this tree's SDK build tools by absolute path (componentize-py
//! from `.venv`, node with `sdk/js/node_modules`: scripts/setup installs
//! both), and tested with `weir plugin test` only: the build and the
//! component's compile (about 10 CPU-seconds each, per language, on an idle
//! machine) are most of their cost, and `weir run` would add little the
//! Rust project's run does not show.

use crate::common;
use crate::plugin_test::plugin_test_file;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::*;
use serde_json::Value;
use weir_source::change::{Change, Op};

/// The generated project's crate name.
const NAME: &str = "scaffolded-sink";

/// The changes the test's run takes from the generator.
const CHANGES: u64 = 3_000;

#[test]
fn a_new_sink_project_builds_runs_and_is_at_least_once() {
    let started = Instant::now();
    let folder = project_folder();
    let project = folder.join(NAME);
    let step = |what: &str| eprintln!("{what}: {:.1} s", started.elapsed().as_secs_f64());

    let out = weir(
        &["plugin", "new", NAME, "--dir", project.to_str().unwrap()],
        &[],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    for needed in [
        "src/lib.rs",
        "pipeline.yaml",
        "plugin-test.yaml",
        "cargo build --release --target wasm32-wasip2",
        "weir run pipeline.yaml",
    ] {
        assert!(
            said.contains(needed),
            "`weir plugin new` never says {needed:?}: {said}"
        );
    }
    // A folder with files in it is never written over.
    let again = weir(
        &["plugin", "new", NAME, "--dir", project.to_str().unwrap()],
        &[],
    );
    let refused = text(&again);
    assert_eq!(again.status.code(), Some(1), "{refused}");
    assert!(
        refused.contains(&format!("{} exists and is not empty", project.display())),
        "{refused}"
    );
    step("written");

    let wasm = build(&project);
    step("built");

    let inspected = weir(
        &[
            "plugin",
            "inspect",
            wasm.to_str().unwrap(),
            "--json",
            "--cache-dir",
            shared_component_cache().to_str().unwrap(),
        ],
        &[],
    );
    assert!(inspected.status.success(), "{}", text(&inspected));
    let info: Value = serde_json::from_slice(&inspected.stdout).unwrap();
    assert_eq!(info["capabilities"], serde_json::json!([]), "{info}");
    assert_eq!(info["network"], serde_json::json!([]), "{info}");
    step("inspected");

    let pipeline = project.join("pipeline.yaml");
    let changes = CHANGES.to_string();
    let run = weir(
        &["run", pipeline.to_str().unwrap(), "--max-changes", &changes],
        &[],
    );
    assert!(run.status.success(), "{}", text(&run));
    let seed = generator_seed(&pipeline);
    check_written_against_the_generator(&project.join("out").join(NAME), seed);
    step("run and checked");

    let report = plugin_test_file(&wasm, &project.join("plugin-test.yaml"), &[]);
    report.check_shape(&wasm, false);
    report.assert_earned("at-least-once", "at-least-once, idempotent by batch id");
    step("plugin test");
    // Left behind by a failure, for a look; the next run starts afresh.
    let _ = std::fs::remove_dir_all(&folder);
}

/// The Python and the JavaScript project, each written into a folder
/// outside the repository and built as its README says, earn the same
/// guarantee as the Rust one. The two run side by side: each build and
/// each compile has long single-threaded stretches.
#[test]
fn new_python_and_js_sink_projects_build_and_are_at_least_once() {
    let started = Instant::now();
    let venv_tool = workspace().join(".venv/bin/componentize-py");
    assert!(
        venv_tool.exists(),
        "{} is missing: run scripts/setup (it installs componentize-py into .venv)",
        venv_tool.display()
    );
    let js_tools = workspace().join("sdk/js/node_modules/@bytecodealliance/componentize-js");
    assert!(
        js_tools.exists(),
        "{} is missing: run scripts/setup (it runs npm ci in sdk/js)",
        js_tools.display()
    );
    let folder = tempfile::Builder::new()
        .prefix("weir-plugin-new-scripted-")
        .tempdir()
        .unwrap();
    assert!(
        !folder.path().starts_with(workspace()),
        "{} is inside the repository: set TMPDIR elsewhere",
        folder.path().display()
    );
    std::thread::scope(|scope| {
        let runs: Vec<_> = [("python", "src/scaffolded_sink.py"), ("js", "src/sink.js")]
            .into_iter()
            .map(|(lang, sink)| {
                let project = folder.path().join(lang);
                scope.spawn(move || new_build_and_test(lang, sink, &project, started))
            })
            .collect();
        for run in runs {
            if let Err(panic) = run.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// `weir plugin new NAME --lang LANG` into `project`, its build, and `weir
/// plugin test` of the component with the project's config.
fn new_build_and_test(lang: &str, sink: &str, project: &Path, started: Instant) {
    let step = |what: &str| eprintln!("{lang}: {what}: {:.1} s", started.elapsed().as_secs_f64());
    let out = weir(
        &[
            "plugin",
            "new",
            NAME,
            "--lang",
            lang,
            "--dir",
            project.to_str().unwrap(),
        ],
        &[],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    for needed in [
        sink,
        "build.sh",
        "pipeline.yaml",
        "plugin-test.yaml",
        "./build.sh",
        "weir run pipeline.yaml",
    ] {
        assert!(
            said.contains(needed),
            "`weir plugin new --lang {lang}` never says {needed:?}: {said}"
        );
    }
    assert!(!said.contains("cargo"), "{said}");
    step("written");

    // The README's build command, run in the project's folder as it says.
    let readme = std::fs::read_to_string(project.join("README.md")).unwrap();
    let build_command = readme
        .split("## Build\n")
        .nth(1)
        .and_then(|section| section.split("```sh\n").nth(1))
        .and_then(|block| block.lines().next())
        .unwrap_or_else(|| panic!("{lang}: the README has no build command:\n{readme}"));
    assert_eq!(build_command, "./build.sh", "{lang}");
    let out = Command::new(project.join("build.sh"))
        .current_dir(project)
        // Where scripts/build-plugins builds the Python SDK's socket stub
        // tool: built there once, not again for this test.
        .env(
            "CARGO_TARGET_DIR",
            plugin_target_dir().with_file_name("tools"),
        )
        .output()
        .expect("build.sh runs");
    assert!(
        out.status.success(),
        "{lang}: ./build.sh failed: {}",
        text(&out)
    );
    let wasm = project.join("target/scaffolded_sink.wasm");
    assert!(
        wasm.is_file(),
        "{lang}: no {}: {}",
        wasm.display(),
        text(&out)
    );
    for file in ["pipeline.yaml", "plugin-test.yaml"] {
        let config = std::fs::read_to_string(project.join(file)).unwrap();
        assert!(
            config.contains("target/scaffolded_sink.wasm"),
            "{lang}: {file} names another component:\n{config}"
        );
    }
    step("built");

    let report = plugin_test_file(&wasm, &project.join("plugin-test.yaml"), &[]);
    report.check_shape(&wasm, false);
    report.assert_earned("at-least-once", "at-least-once, idempotent by batch id");
    forget_compiled(&wasm);
    step("plugin test");
}

/// Removes the compiled `wasm` from the shared component cache. Neither
/// componentize-py nor ComponentizeJS builds the same bytes twice, so no
/// later run would use it: left there, every run would add tens of
/// megabytes.
fn forget_compiled(wasm: &Path) {
    let prefix = sha256_hex(&std::fs::read(wasm).unwrap()) + "-";
    let Ok(entries) = std::fs::read_dir(shared_component_cache()) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// An empty folder outside the repository, the same one every run: the
/// project's crate is then the same package to cargo every time, built
/// over its last build in the shared target folder instead of beside it.
fn project_folder() -> PathBuf {
    let mut hasher = DefaultHasher::new();
    workspace().hash(&mut hasher);
    let folder = std::env::temp_dir().join(format!("weir-plugin-new-{:016x}", hasher.finish()));
    assert!(
        !folder.starts_with(workspace()),
        "{} is inside the repository: set TMPDIR elsewhere",
        folder.display()
    );
    match std::fs::remove_dir_all(&folder) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot empty {}: {e}", folder.display()),
    }
    std::fs::create_dir_all(&folder).unwrap();
    folder
}

/// Builds the project as its README says, in the plugins' target folder,
/// and puts the component where its pipeline names it.
fn build(project: &Path) -> PathBuf {
    std::fs::copy(workspace().join("Cargo.lock"), project.join("Cargo.lock")).unwrap();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(project)
        .args(["build", "--target", "wasm32-wasip2"])
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env("CARGO_TARGET_DIR", plugin_target_dir());
    // As scripts/build-plugins sets them (the C code some sinks compile),
    // so that nothing it built is built again for a changed variable.
    for (variable, default) in [
        ("CC_wasm32_wasip2", "clang-16"),
        ("AR_wasm32_wasip2", "llvm-ar-16"),
        ("CFLAGS_wasm32_wasip2", "--target=wasm32-wasi -msimd128"),
    ] {
        if std::env::var_os(variable).is_none() {
            command.env(variable, default);
        }
    }
    let out = command.output().expect("cargo runs");
    assert!(
        out.status.success(),
        "building the project failed: {}",
        text(&out)
    );

    let file = format!("{}.wasm", NAME.replace('-', "_"));
    let built = plugin_target_dir().join("wasm32-wasip2/debug").join(&file);
    let placed = project.join("target/wasm32-wasip2/release").join(&file);
    std::fs::create_dir_all(placed.parent().unwrap()).unwrap();
    std::fs::copy(&built, &placed).unwrap_or_else(|e| panic!("{}: {e}", built.display()));
    placed
}

/// The generator's seed in the pipeline file.
fn generator_seed(pipeline: &Path) -> u64 {
    let text = std::fs::read_to_string(pipeline).unwrap();
    text.lines()
        .find_map(|line| line.trim().strip_prefix("seed:"))
        .and_then(|seed| seed.trim().parse().ok())
        .unwrap_or_else(|| panic!("{} names no generator seed:\n{text}", pipeline.display()))
}

/// One line the sink wrote.
struct Written {
    file: String,
    row: serde_json::Map<String, Value>,
}

/// Every line of every `<table>/<batch id>.jsonl` under `root`, by table.
fn written(root: &Path) -> BTreeMap<String, Vec<Written>> {
    let mut out = BTreeMap::new();
    for table in tables() {
        let folder = root.join(&table.name);
        let mut lines = Vec::new();
        let entries =
            std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let file = format!("{}/{name}", table.name);
            let id = name.strip_suffix(".jsonl").unwrap_or_default();
            assert!(
                id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "{file} is not named after a batch id"
            );
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let row: Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{file}: {e}: {line}"));
                let Value::Object(row) = row else {
                    panic!("{file}: not an object: {line}")
                };
                lines.push(Written {
                    file: file.clone(),
                    row,
                });
            }
        }
        out.insert(table.name.clone(), lines);
    }
    out
}

/// A key part as the JSON writer writes it.
fn key_json(part: &KeyPart) -> Value {
    match part {
        KeyPart::Int64(v) => Value::from(*v),
        KeyPart::Int32(v) => Value::from(*v),
        KeyPart::Utf8(v) => Value::from(v.as_str()),
        other => panic!("the generator has no key of this type: {other:?}"),
    }
}

/// Compares what the sink wrote with the generator's stream `(seed,
/// CHANGES)`: every line is one of its changes (same table, operation and
/// key, found by the line's `source_pos`), none twice, the last change of
/// every key is there, and applying the lines in source order leaves
/// exactly the rows the generator's tables end with.
fn check_written_against_the_generator(root: &Path, seed: u64) {
    let log: Vec<Change> = change_log(seed, CHANGES).collect();
    let by_position: HashMap<String, usize> = log
        .iter()
        .enumerate()
        .map(|(i, change)| (change.pos.to_hex(), i))
        .collect();
    let written = written(root);

    let mut positions_written = BTreeSet::new();
    let mut deletes = 0;
    for (table, lines) in &written {
        for line in lines {
            let pos = line
                .row
                .get("source_pos")
                .and_then(Value::as_str)
                .unwrap_or_else(|| {
                    panic!("{}: a line without `source_pos`: {:?}", line.file, line.row)
                });
            let index = *by_position.get(pos).unwrap_or_else(|| {
                panic!(
                    "{}: position {pos} is no change of the generator",
                    line.file
                )
            });
            let change = &log[index];
            assert_eq!(&change.table.name, table, "{}: {:?}", line.file, line.row);
            assert_eq!(
                line.row.get("op").and_then(Value::as_str),
                Some(change.op.as_str()),
                "{}: {:?}",
                line.file,
                line.row
            );
            let names = change.table.key_names();
            let key = row_key(&change.table, &change.values);
            for (name, part) in names.iter().zip(&key) {
                assert_eq!(
                    line.row.get(name),
                    Some(&key_json(part)),
                    "{}: key column {name}: {:?}",
                    line.file,
                    line.row
                );
            }
            assert!(
                positions_written.insert(index),
                "{}: change {pos} was written twice",
                line.file
            );
            deletes += usize::from(change.op == Op::Delete);
        }
    }
    assert!(
        deletes > 0,
        "the stream had no deletes: the check proves less than it says"
    );

    // The last change of each key is never folded into a later one of the
    // same batch: every one of them must be there.
    let mut last_change: HashMap<(String, Vec<KeyPart>), usize> = HashMap::new();
    for (i, change) in log.iter().enumerate() {
        last_change.insert(
            (
                change.table.name.clone(),
                row_key(&change.table, &change.values),
            ),
            i,
        );
    }
    let missing: Vec<String> = last_change
        .iter()
        .filter(|(_, i)| !positions_written.contains(*i))
        .map(|((table, key), i)| format!("{table} {key:?} at {}", log[*i].pos.to_hex()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} keys' last changes were not written, such as {:?}",
        missing.len(),
        &missing[..missing.len().min(3)]
    );

    // The lines applied in source order: the generator's final rows, by key.
    let mut rebuilt: BTreeMap<String, Rows<()>> = BTreeMap::new();
    for &i in &positions_written {
        let change = &log[i];
        let rows = rebuilt.entry(change.table.name.clone()).or_default();
        apply_change(rows, row_key(&change.table, &change.values), change.op, ());
    }
    let expected = expected_state(seed, CHANGES);
    for table in tables() {
        let want: BTreeSet<&Vec<KeyPart>> = expected.tables[&table.name].keys().collect();
        let got: BTreeSet<&Vec<KeyPart>> = rebuilt
            .get(&table.name)
            .map(|rows| rows.keys().collect())
            .unwrap_or_default();
        assert_eq!(
            got.len(),
            want.len(),
            "{}: {} rows rebuilt, {} expected",
            table.name,
            got.len(),
            want.len()
        );
        assert!(got == want, "{}: the rebuilt keys differ", table.name);
    }
    let lines: usize = written.values().map(Vec::len).sum();
    eprintln!(
        "{lines} lines for {CHANGES} changes and {} rows at the end",
        expected.rows()
    );
}
