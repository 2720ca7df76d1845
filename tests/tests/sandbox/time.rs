//! Plugins that block where the CPU deadline cannot reach them (sleeping in
//! a WASI poll in `open`, `write`, `commit` or `abort`), and plugins that
//! die (panic, `exit`, stack overflow, `unreachable`): every run ends within
//! a bound, the message names the sink and the cause, an optional bad sink
//! is disabled while the honest one finishes exact, a required one stops
//! the pipeline with exit 1, and no position of the bad sink advances.
//! A stop request (Ctrl-C) always ends the process, also while a sink is
//! blocked.
//!
//! Every `weir` here runs under a kill-after guard, so a host that hangs
//! fails the test instead of hanging it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const SEED: u64 = 3;
const CHANGES: u64 = 1_500;
const MEMORY_MB: u64 = 64;
const CALL_TIMEOUT_MS: u64 = 1_000;
/// What the fixture's `panic` mode panics with (its crate is wasm-only).
const PANIC_MESSAGE: &str = "stall fixture panics on purpose";
/// The wall-clock deadline the host derives from [`CALL_TIMEOUT_MS`]
/// (weir_runtime::worker::wall_bound), as its messages print it.
const WALL_DEADLINE: &str = "wall-clock deadline of 1600 ms";
/// A generous bound on a whole run with one stalled call: start-up (which
/// compiles both plugins into a fresh cache on a busy machine), the stalled
/// call's deadline, and the rest of the run.
const RUN_BOUND: Duration = Duration::from_secs(45);
/// Past this the guard kills `weir` and the test fails.
const KILL_AFTER: Duration = Duration::from_secs(120);

/// A finished `weir` run: exit code, output, and how long it took.
struct Finished {
    code: Option<i32>,
    output: String,
    elapsed: Duration,
}

/// A `weir` process whose output goes to files (so nothing blocks on a full
/// pipe), and the guard that kills it after [`KILL_AFTER`].
struct Running {
    child: Child,
    started: Instant,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Running {
    fn start(args: &[&str], log: &str, dir: &Path) -> Running {
        let stdout = dir.join("weir.stdout");
        let stderr = dir.join("weir.stderr");
        let child = weir_command()
            .args(args)
            .env("WEIR_LOG", log)
            .env("NO_COLOR", "1")
            .stdout(Stdio::from(std::fs::File::create(&stdout).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
            .spawn()
            .expect("weir starts");
        Running {
            child,
            started: Instant::now(),
            stdout,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill {signal} failed");
    }

    /// Waits for the process to end; kills it (and fails) after the guard.
    fn finish(mut self) -> Finished {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let output = format!(
                    "exit {:?}\nstdout:\n{}\nstderr:\n{}",
                    status.code(),
                    std::fs::read_to_string(&self.stdout).unwrap_or_default(),
                    self.stderr()
                );
                return Finished {
                    code: status.code(),
                    output,
                    elapsed: self.started.elapsed(),
                };
            }
            if self.started.elapsed() > KILL_AFTER {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "weir did not end within {KILL_AFTER:?}; killed it. stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn run(pipeline: &Path, dir: &Path) -> Finished {
    Running::start(&["run", pipeline.to_str().unwrap()], "warn", dir).finish()
}

/// The stall fixture as sink `bad`, in `mode`, with the limits.
fn stall(mode: &str, dir: &Path) -> SinkBuilder {
    sink("bad", "weir-fixture-stall", dir)
        .limits(MEMORY_MB, CALL_TIMEOUT_MS)
        .config("mode", mode)
}

/// The honest positioned sink `exact` beside `bad`.
fn beside_exact(bad: SinkBuilder, dir: &Path) -> PathBuf {
    workload(SEED, CHANGES, 300)
        .sink(sink("exact", "weir-fixture-positioned", dir))
        .sink(bad)
        .write_in(dir)
}

fn assert_mentions(finished: &Finished, needles: &[&str]) {
    for needle in needles {
        assert!(
            finished.output.contains(needle),
            "missing {needle:?} in: {}",
            finished.output
        );
    }
}

fn assert_bad_never_advanced(pipeline: &Path) {
    for (table, position) in positions_of(&status(pipeline), "bad") {
        assert_eq!(position, None, "the bad sink advanced on {table}");
    }
}

/// Runs `bad` as an optional sink beside `exact`: the run ends within the
/// bound with exit 3, the message names `bad` and carries every `cause`,
/// `exact` holds exactly the source, and `bad` advanced nowhere.
fn optional_bad_sink_is_disabled(bad: SinkBuilder, causes: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = beside_exact(bad.required(false), dir.path());
    let finished = run(&pipeline, dir.path());
    assert_eq!(finished.code, Some(3), "{}", finished.output);
    assert!(
        finished.elapsed < RUN_BOUND,
        "took {:?}: {}",
        finished.elapsed,
        finished.output
    );
    assert_mentions(&finished, &["`bad`"]);
    assert_mentions(&finished, causes);
    assert_positioned_exact(
        &sink_root(dir.path(), "exact"),
        &expected_state(SEED, CHANGES),
    );
    assert_bad_never_advanced(&pipeline);
}

/// Runs `bad` as a required sink beside `exact`: the run stops within the
/// bound with exit 1, names `bad` and every `cause`, and `bad` advanced
/// nowhere.
fn required_bad_sink_stops_the_pipeline(bad: SinkBuilder, causes: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = beside_exact(bad, dir.path());
    let finished = run(&pipeline, dir.path());
    assert_eq!(finished.code, Some(1), "{}", finished.output);
    assert!(
        finished.elapsed < RUN_BOUND,
        "took {:?}: {}",
        finished.elapsed,
        finished.output
    );
    assert_mentions(&finished, &["`bad`"]);
    assert_mentions(&finished, causes);
    assert_bad_never_advanced(&pipeline);
}

#[test]
fn an_optional_sink_sleeping_forever_in_write_is_stopped_and_disabled() {
    let dir = tempfile::tempdir().unwrap();
    optional_bad_sink_is_disabled(
        stall("sleep-in-write", dir.path()),
        &[
            "`write` did not return",
            WALL_DEADLINE,
            "blocked outside WebAssembly",
        ],
    );
}

#[test]
fn an_optional_sink_sleeping_forever_in_commit_is_stopped_and_disabled() {
    let dir = tempfile::tempdir().unwrap();
    optional_bad_sink_is_disabled(
        stall("sleep-in-commit", dir.path()),
        &["`commit` did not return", WALL_DEADLINE],
    );
}

#[test]
fn an_optional_sink_sleeping_forever_in_open_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    optional_bad_sink_is_disabled(
        stall("sleep-in-open", dir.path()),
        &["failed to start", "`open` did not return", WALL_DEADLINE],
    );
}

#[test]
fn a_sleep_far_past_the_deadline_is_cut_at_the_deadline() {
    // The case: a 20 s sleep under a 1 s deadline ran to its end.
    // A minute per batch would outlast the run bound many times over.
    let dir = tempfile::tempdir().unwrap();
    optional_bad_sink_is_disabled(
        stall("sleep-in-write", dir.path()).config("sleep_ms", "60000"),
        &["`write` did not return", WALL_DEADLINE],
    );
}

#[test]
fn a_sleep_within_the_deadline_is_not_cut() {
    // Half the deadline per write: slow, but within it. Batches fill to
    // their row limit (no linger or heartbeat flushes), so a slow sink
    // does not shrink them to a transaction each.
    let dir = tempfile::tempdir().unwrap();
    let bad = stall("sleep-in-write", dir.path()).config("sleep_ms", "500");
    let pipeline = workload(SEED, CHANGES, 300)
        .linger_ms(600_000)
        .heartbeat_ms(600_000)
        .sink(sink("exact", "weir-fixture-positioned", dir.path()))
        .sink(bad)
        .write_in(dir.path());
    let finished = run(&pipeline, dir.path());
    assert_eq!(finished.code, Some(0), "{}", finished.output);
    assert_positioned_exact(
        &sink_root(dir.path(), "exact"),
        &expected_state(SEED, CHANGES),
    );
}

#[test]
fn commits_slower_than_the_heartbeat_do_not_shrink_batches_to_a_transaction_each() {
    // A paced stream and a sink whose commits (150 ms a table) outlast the
    // heartbeat and the linger many times over. A flush waits for the
    // commit in flight, so a heartbeat made while one was in flight was
    // always overdue again when it returned: every transaction read in
    // between became a batch of its own (about 600 batches here, a minute
    // and a half of commits). The heartbeat now waits for the commit in
    // flight or rides on the next linger flush, so each batch holds what
    // was read during the commit before it.
    let dir = tempfile::tempdir().unwrap();
    let slow = stall("sleep-in-commit", dir.path()).config("sleep_ms", "150");
    let pipeline = workload(SEED, CHANGES, 1_000)
        .pace_us(1_000)
        .linger_ms(100)
        .heartbeat_ms(50)
        .sink(sink("exact", "weir-fixture-positioned", dir.path()))
        .sink(slow)
        .write_in(dir.path());
    let finished = run(&pipeline, dir.path());
    assert_eq!(finished.code, Some(0), "{}", finished.output);
    let root = sink_root(dir.path(), "exact");
    assert_positioned_exact(&root, &expected_state(SEED, CHANGES));
    for table in shop_tables() {
        let commits = std::fs::read_dir(root.join(&table.name))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "arrow")
            })
            .count();
        println!("{}: {commits} commits", table.name);
        // Reading takes about 1.5 s at the pace, each commit about 0.45 s
        // (three tables): a dozen commits, far fewer under load (the
        // batches grow); one a transaction would be hundreds.
        assert!(
            (1..=40).contains(&commits),
            "{}: {commits} commits for {CHANGES} changes in {:?}",
            table.name,
            finished.elapsed
        );
    }
}

#[test]
fn a_required_sink_sleeping_forever_in_write_stops_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    required_bad_sink_stops_the_pipeline(
        stall("sleep-in-write", dir.path()),
        &["`write` did not return", WALL_DEADLINE],
    );
}

#[test]
fn a_required_sink_sleeping_forever_in_open_stops_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    required_bad_sink_stops_the_pipeline(
        stall("sleep-in-open", dir.path()),
        &["failed to start", "`open` did not return", WALL_DEADLINE],
    );
}

#[test]
fn poison_then_sleeping_in_abort_ends_and_prints_the_poison() {
    let dir = tempfile::tempdir().unwrap();
    required_bad_sink_stops_the_pipeline(
        stall("poison-then-sleep-in-abort", dir.path()),
        &[
            "poison",
            "stall fixture refuses the commit",
            "`abort` did not return",
        ],
    );
}

#[test]
fn a_panic_is_reported_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    optional_bad_sink_is_disabled(
        stall("panic", dir.path()),
        &[
            "trapped: panicked at",
            PANIC_MESSAGE,
            "`unreachable` instruction executed",
        ],
    );
}

#[test]
fn an_exit_is_reported_with_its_status() {
    // WASI 0.2's `exit` carries success or failure only: `exit(3)` arrives
    // as a failure, status 1.
    let dir = tempfile::tempdir().unwrap();
    optional_bad_sink_is_disabled(
        stall("exit", dir.path()),
        &["trapped: the plugin called exit with status 1"],
    );
}

#[test]
fn a_stack_overflow_is_reported_as_such() {
    let dir = tempfile::tempdir().unwrap();
    optional_bad_sink_is_disabled(
        stall("overflow", dir.path()),
        &["trapped: stack overflow (wasm trap: call stack exhausted)"],
    );
}

#[test]
fn an_unreachable_trap_is_reported_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    optional_bad_sink_is_disabled(
        stall("unreachable", dir.path()),
        &["trapped: wasm trap: wasm `unreachable` instruction executed"],
    );
}

/// Starts a long run with `bad` sleeping in `write`, and waits until the
/// pipeline is running (so `bad` is, or is about to be, blocked).
fn long_run_blocked_in(bad: SinkBuilder, dir: &Path) -> Running {
    let pipeline = workload(SEED, 100_000_000, 300)
        .pace_us(100)
        .sink(sink("exact", "weir-fixture-positioned", dir))
        .sink(bad)
        .write_in(dir);
    let running = Running::start(&["run", pipeline.to_str().unwrap()], "info", dir);
    let waited = Instant::now();
    while !running.stderr().contains("starting") {
        assert!(
            waited.elapsed() < KILL_AFTER,
            "the run never started: {}",
            running.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The first batch reaches `bad` within the linger; give it a moment.
    std::thread::sleep(Duration::from_millis(1_500));
    running
}

#[test]
fn ctrl_c_ends_a_run_whose_optional_sink_is_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let bad = stall("sleep-in-write", dir.path()).required(false);
    let running = long_run_blocked_in(bad, dir.path());
    running.signal("-INT");
    let signalled = Instant::now();
    let finished = running.finish();
    // The blocked call ends at its deadline, `bad` is disabled, and the run
    // stops at the next commit boundary.
    assert!(
        signalled.elapsed() < Duration::from_millis(1_600) + Duration::from_secs(10),
        "took {:?} after Ctrl-C: {}",
        signalled.elapsed(),
        finished.output
    );
    assert_eq!(finished.code, Some(3), "{}", finished.output);
    assert_mentions(&finished, &["Ctrl-C", "`bad`", WALL_DEADLINE]);
}

#[test]
fn a_second_ctrl_c_exits_at_once_naming_the_call_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    // A deadline far beyond the test: only the second Ctrl-C can end it.
    let bad = stall("sleep-in-write", dir.path()).limits(MEMORY_MB, 600_000);
    let running = long_run_blocked_in(bad, dir.path());
    running.signal("-INT");
    std::thread::sleep(Duration::from_millis(500));
    running.signal("-INT");
    let signalled = Instant::now();
    let finished = running.finish();
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "took {:?} after the second Ctrl-C: {}",
        signalled.elapsed(),
        finished.output
    );
    assert_eq!(finished.code, Some(130), "{}", finished.output);
    assert_mentions(
        &finished,
        &["Ctrl-C again", "sink `bad`: `write` running for"],
    );
}

#[test]
fn sigterm_is_a_stop_request_too() {
    let dir = tempfile::tempdir().unwrap();
    let bad = stall("sleep-in-write", dir.path()).limits(MEMORY_MB, 600_000);
    let running = long_run_blocked_in(bad, dir.path());
    running.signal("-TERM");
    std::thread::sleep(Duration::from_millis(500));
    running.signal("-TERM");
    let finished = running.finish();
    assert_eq!(finished.code, Some(143), "{}", finished.output);
    assert_mentions(&finished, &["SIGTERM again", "sink `bad`: `write`"]);
}
