//! A plugin must not make the host hold, store or print without bound, nor
//! reach the host's state or another sink's code. The hostile sink is the
//! `hoard` fixture (its `mode` config picks the attack), run beside an
//! honest positioned sink `exact`, with `memory_mb: 64`: each bound holds,
//! the message names the sink, the limit and its config key, the honest
//! sink finishes exact, and no position of the hostile sink advances.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const SEED: u64 = 5;
const CHANGES: u64 = 1_500;

/// The hostile sink, optional, in `mode`, with `memory_mb: 64` and a call
/// bound generous enough for its puts to reach the disk.
fn hoard(dir: &Path, mode: &str) -> SinkBuilder {
    sink("bad", "weir-fixture-hoard", dir)
        .required(false)
        .limits(64, 10_000)
        .config("mode", mode)
}

fn exact_beside(bad: SinkBuilder, dir: &Path) -> PathBuf {
    workload(SEED, CHANGES, 300)
        .sink(sink("exact", "weir-fixture-positioned", dir))
        .sink(bad)
        .write_in(dir)
}

/// Runs the pipeline, expects `bad` disabled (exit 3) with every needle in
/// the output, `exact` exact, and no position of `bad` advanced.
fn disabled_with(pipeline: &Path, dir: &Path, needles: &[&str]) -> String {
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    for needle in needles {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    assert_positioned_exact(&sink_root(dir, "exact"), &expected_state(SEED, CHANGES));
    for (table, position) in positions_of(&status(pipeline), "bad") {
        assert_eq!(position, None, "the hostile sink advanced on {table}");
    }
    report
}

fn stored_bytes(root: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let meta = entry.metadata().unwrap();
        total += match meta.is_dir() {
            true => stored_bytes(&entry.path()),
            false => meta.len(),
        };
    }
    total
}

#[test]
fn a_sink_cannot_store_past_its_quota() {
    let dir = tempfile::tempdir().unwrap();
    let bad = hoard(dir.path(), "many-puts")
        .config("size_mb", "8")
        .config("count", "40")
        .max_stored_mb(48);
    let pipeline = exact_beside(bad, dir.path());
    disabled_with(
        &pipeline,
        dir.path(),
        &["`bad`", "quota of 48 MiB", "limits.max_stored_mb"],
    );
    let stored = stored_bytes(&sink_root(dir.path(), "bad"));
    assert!(stored <= 48 << 20, "the root holds {stored} bytes");
}

#[test]
fn a_memory_root_cannot_grow_the_host_past_its_quota() {
    let dir = tempfile::tempdir().unwrap();
    let mut bad = hoard(dir.path(), "many-puts")
        .config("size_mb", "16")
        .config("count", "60")
        .max_stored_mb(96);
    bad = bad.blob_store(Path::new("memory://"));
    let pipeline = exact_beside(bad, dir.path());
    // Poll the child's peak resident size (VmHWM) while it runs: it is a
    // high-water mark, so the last reading is the peak up to that moment.
    let mut child = weir_command()
        .args(["run", pipeline.to_str().unwrap()])
        .env("WEIR_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    while child.try_wait().unwrap().is_none() {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
            peak_kb = peak_kb.max(hwm.unwrap_or(0));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    for needle in ["`bad`", "quota of 96 MiB", "limits.max_stored_mb"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    // 960 MiB were attempted; the quota (96), the sink's memory (64) and
    // the host's own share fit well below this.
    assert!(peak_kb > 0, "no reading of the host's memory");
    assert!(
        peak_kb < 400 << 10,
        "the host peaked at {} MiB",
        peak_kb >> 10
    );
    assert_positioned_exact(
        &sink_root(dir.path(), "exact"),
        &expected_state(SEED, CHANGES),
    );
}

#[test]
fn one_huge_put_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = hoard(dir.path(), "huge-put")
        .config("size_mb", "40")
        .max_object_mb(16);
    let pipeline = exact_beside(bad, dir.path());
    disabled_with(
        &pipeline,
        dir.path(),
        &["`bad`", "largest object of 16 MiB", "limits.max_object_mb"],
    );
    assert!(!sink_root(dir.path(), "bad").join("hoard/huge.bin").exists());
}

#[test]
fn a_huge_get_or_range_is_refused_before_the_host_reads_it() {
    for mode in ["huge-get", "huge-range"] {
        let dir = tempfile::tempdir().unwrap();
        // A sparse 4 GiB object: no disk used, but far more than the sink
        // (64 MiB) could hold, and more than the host should read for it.
        let root = sink_root(dir.path(), "bad");
        std::fs::create_dir_all(&root).unwrap();
        let huge = std::fs::File::create(root.join("huge.bin")).unwrap();
        huge.set_len(4 << 30).unwrap();
        let pipeline = exact_beside(hoard(dir.path(), mode), dir.path());
        disabled_with(
            &pipeline,
            dir.path(),
            &["`bad`", "largest read of 64 MiB", "limits.max_object_mb"],
        );
    }
}

#[test]
fn a_log_flood_is_cut_rate_limited_and_cannot_forge_host_lines() {
    let dir = tempfile::tempdir().unwrap();
    let bad = hoard(dir.path(), "log-flood")
        .config("size_mb", "8")
        .config("flood_ms", "700")
        .log_rate(50, 200);
    let pipeline = exact_beside(bad, dir.path());
    let started = Instant::now();
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let elapsed = started.elapsed().as_secs();
    let report = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        &report[..report.len().min(4000)]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let flood = stderr.lines().filter(|l| l.contains("flood line")).count() as u64;
    // The burst, plus the rate over the whole run, plus one second of slack.
    let allowed = 200 + 50 * (elapsed + 1);
    assert!(
        flood <= allowed,
        "{flood} flood lines passed; at most {allowed}"
    );
    assert!(
        stderr.contains("sink `bad` logged too fast")
            && stderr.contains("limits.log_lines_per_second = 50"),
        "no report of dropped lines"
    );
    let longest = stderr.lines().map(str::len).max().unwrap_or(0);
    assert!(
        longest < 8 << 10,
        "a line of {longest} bytes reached stderr"
    );
    assert!(
        stderr.contains("[cut:"),
        "the 8 MiB line was not marked as cut"
    );
    for line in stderr.lines() {
        assert!(!line.starts_with("2030-01-01"), "a forged line: {line}");
        if line.contains("FORGED") {
            assert!(line.contains("innocent"), "a forged line: {line}");
        }
    }
    assert!(
        stderr.contains("FORGED"),
        "the forging lines were never logged"
    );
}

#[test]
fn a_huge_error_is_cut_before_it_is_logged_or_retried() {
    for kind in ["fatal", "retryable"] {
        let dir = tempfile::tempdir().unwrap();
        // 8 MiB, built twice over in the sink's 64 MiB.
        let bad = hoard(dir.path(), "huge-error")
            .config("size_mb", "8")
            .config("kind", kind)
            .retries(3);
        let pipeline = exact_beside(bad, dir.path());
        let report = disabled_with(&pipeline, dir.path(), &["`bad`", "[cut:"]);
        assert!(
            report.len() < 256 << 10,
            "{kind}: {} bytes of output for an 8 MiB error",
            report.len()
        );
    }
}

#[test]
fn a_root_overlapping_the_state_dir_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // Run once, so the state folder holds compiled plugins to tamper with.
    let honest = workload(SEED, 100, 50).sink(sink("exact", "weir-fixture-positioned", dir.path()));
    let first = weir(
        &["run", honest.write_in(dir.path()).to_str().unwrap()],
        IN_STATE_CACHE,
    );
    assert!(first.status.success(), "{}", text(&first));
    let state = dir.path().join("state");
    let before = cache_files(&state);
    assert!(!before.is_empty(), "the first run cached nothing");
    // A root that contains the state folder, a plugin that overwrites
    // every compiled plugin it finds.
    let tamper = hoard(dir.path(), "tamper").blob_store(dir.path());
    let pipeline = workload(SEED, 100, 50)
        .sink(sink("exact", "weir-fixture-positioned", dir.path()))
        .sink(tamper)
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], IN_STATE_CACHE);
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    for needle in ["sinks[1].blob_store.url", "`bad`", "state_dir"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
    assert_eq!(cache_files(&state), before, "the cache was touched");
}

#[test]
fn nested_roots_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let outer = sink("outer", "weir-fixture-positioned", dir.path());
    let inner = sink("inner", "weir-fixture-positioned", dir.path())
        .blob_store(&sink_root(dir.path(), "outer").join("nested"));
    let pipeline = workload(SEED, 100, 50)
        .sink(outer)
        .sink(inner)
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    for needle in ["sinks[1].blob_store.url", "`outer`", "`inner`", "overlap"] {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
}

/// The component cache where a pipeline keeps it without
/// `WEIR_COMPONENT_CACHE` (empty: unset), beside its state, which these
/// tests tamper with; scripts/test points the variable at a cache every
/// other test shares.
const IN_STATE_CACHE: &[(&str, &str)] = &[("WEIR_COMPONENT_CACHE", "")];

/// The component cache's files with their bytes, by name.
fn cache_files(state: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(state.join("component-cache"))
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

fn sha256_of(plugin: &Path, scratch: &Path) -> String {
    let cache = scratch.join("inspect-cache");
    let out = weir(
        &[
            "plugin",
            "inspect",
            plugin.to_str().unwrap(),
            "--json",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    info["sha256"].as_str().unwrap().to_string()
}

#[test]
fn a_tampered_cache_is_compiled_again_and_the_pinned_sink_stays_itself() {
    let dir = tempfile::tempdir().unwrap();
    let positioned = plugin("weir-fixture-positioned");
    let pin = sha256_of(&positioned, dir.path());
    let null_pin = sha256_of(&plugin("weir-null-sink"), dir.path());
    let run = |changes: u64| {
        let pipeline = workload(SEED, changes, 300)
            .sink(sink("exact", "weir-fixture-positioned", dir.path()).sha256(&pin))
            .sink(sink("other", "weir-null-sink", dir.path()))
            .write_in(dir.path());
        weir(&["run", pipeline.to_str().unwrap()], IN_STATE_CACHE)
    };
    let first = run(500);
    assert!(first.status.success(), "{}", text(&first));
    // What a plugin that could write the cache folder would do: put another
    // component's compiled code, with whatever sits beside it, in place of
    // the pinned plugin's.
    let cache = dir.path().join("state/component-cache");
    let named = |digest: &str| -> Vec<PathBuf> {
        std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(digest))
            .collect()
    };
    let victims = named(&pin);
    let donors = named(&null_pin);
    assert!(!victims.is_empty() && !donors.is_empty(), "nothing cached");
    for victim in &victims {
        let suffix = victim.file_name().unwrap().to_string_lossy()[pin.len()..].to_string();
        let donor = cache.join(format!("{null_pin}{suffix}"));
        std::fs::copy(&donor, victim).unwrap();
    }
    let second = run(CHANGES);
    let report = text(&second);
    assert!(second.status.success(), "{report}");
    assert!(
        report.contains("not one this host wrote"),
        "no warning about the tampered cache: {report}"
    );
    assert_positioned_exact(
        &sink_root(dir.path(), "exact"),
        &expected_state(SEED, CHANGES),
    );
    let artifact = victims
        .iter()
        .find(|p| p.extension().unwrap() == "cwasm")
        .unwrap();
    let donor = cache.join(
        artifact
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(&pin, &null_pin),
    );
    assert_ne!(
        std::fs::read(artifact).unwrap(),
        std::fs::read(donor).unwrap(),
        "the pinned plugin's artifact is still the other component's"
    );
}
