//! `weir plugin test` on the sinks we ship and on fixtures that each break
//! one rule: the shipped sinks earn the guarantee their docs claim, and
//! every deliberately broken fixture fails at the scenario meant to catch
//! its flaw, for the reason that flaw gives.
//!
//! Each run reads the destination only through the readers in
//! tests/plugin-test/ (pyarrow, DuckDB, redis-cli, a webhook receiver), with
//! the configs there. The Redis test starts a private `redis-server`, the
//! webhook test the receiver script; guards stop them, also on panic.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::Value;

/// Every scenario `weir plugin test` runs, in its order.
const SCENARIOS: [&str; 13] = [
    "delivery",
    "replay",
    "crash-after-stage",
    "crash-after-commit",
    "abort-retry",
    "delete-missing-key",
    "empty-commit",
    "same-batch-twice",
    "older-epoch",
    "commit-inside-staged",
    "new-nullable-column",
    "retryable",
    "trap-mid-commit",
];

/// What one `weir plugin test --json` said.
pub(crate) struct Report {
    exit: Option<i32>,
    json: Value,
    /// The whole output, for assertion messages.
    text: String,
}

impl Report {
    fn verdict(&self) -> &str {
        self.json["verdict"]
            .as_str()
            .unwrap_or_else(|| panic!("the report has no verdict string:\n{}", self.text))
    }

    fn scenario(&self, name: &str) -> &Value {
        self.scenarios()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("the report has no scenario {name}:\n{}", self.text))
    }

    fn scenarios(&self) -> &Vec<Value> {
        self.json["scenarios"]
            .as_array()
            .unwrap_or_else(|| panic!("the report has no scenario list:\n{}", self.text))
    }

    /// Names of the scenarios with `outcome`.
    fn with_outcome(&self, outcome: &str) -> Vec<&str> {
        self.scenarios()
            .iter()
            .filter(|s| s["outcome"] == outcome)
            .map(|s| s["name"].as_str().unwrap())
            .collect()
    }

    /// The report's shape, whatever the verdict: the plugin, whether it has
    /// positions, every scenario once in order with a known outcome.
    pub(crate) fn check_shape(&self, plugin: &Path, positioned: bool) {
        assert_eq!(
            self.json["plugin"].as_str().map(PathBuf::from).as_deref(),
            Some(plugin),
            "{}",
            self.text
        );
        assert_eq!(self.json["positioned"], positioned, "{}", self.text);
        let names: Vec<&str> = self
            .scenarios()
            .iter()
            .map(|s| s["name"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(names, SCENARIOS, "{}", self.text);
        for scenario in self.scenarios() {
            let outcome = scenario["outcome"].as_str().unwrap_or("");
            assert!(
                ["pass", "fail", "n/a", "refused", "cannot-verify"].contains(&outcome),
                "scenario {}: outcome {outcome:?}:\n{}",
                scenario["name"],
                self.text
            );
            assert!(scenario["detail"].is_string(), "{}", self.text);
        }
    }

    /// A guarantee was earned: exit 0, the verdict and guarantee given,
    /// and no scenario failed or went unverified.
    pub(crate) fn assert_earned(&self, guarantee: &str, verdict: &str) {
        assert_eq!(self.exit, Some(0), "{}", self.text);
        assert_eq!(self.json["guarantee"], guarantee, "{}", self.text);
        assert_eq!(self.verdict(), verdict, "{}", self.text);
        assert!(self.with_outcome("fail").is_empty(), "{}", self.text);
        assert!(
            self.with_outcome("cannot-verify").is_empty(),
            "{}",
            self.text
        );
    }

    /// It fails (exit 1), and the verdict names one of `scenarios`, which
    /// failed; returns the scenario's name and detail.
    fn assert_fails_at(&self, scenarios: &[&str]) -> (String, String) {
        assert_eq!(self.exit, Some(1), "{}", self.text);
        assert_eq!(self.json["guarantee"], "fails", "{}", self.text);
        let verdict = self.verdict();
        let rest = verdict
            .strip_prefix("fails: ")
            .unwrap_or_else(|| panic!("verdict {verdict:?} does not start `fails: `"));
        let (name, why) = rest
            .split_once(": ")
            .unwrap_or_else(|| panic!("verdict {verdict:?} names no scenario"));
        assert!(
            scenarios.contains(&name),
            "it failed at {name}, expected one of {scenarios:?}:\n{}",
            self.text
        );
        let scenario = self.scenario(name);
        assert_eq!(scenario["outcome"], "fail", "{}", self.text);
        assert_eq!(scenario["detail"], why, "{}", self.text);
        (name.to_string(), why.to_string())
    }
}

/// Runs `weir plugin test` on the plugin crate's component with the test
/// config `tests/plugin-test/<config>.yaml`.
fn plugin_test(crate_name: &str, config: &str, envs: &[(&str, &str)]) -> (PathBuf, Report) {
    let config = workspace().join(format!("tests/plugin-test/{config}.yaml"));
    plugin_test_with(crate_name, &config, envs)
}

/// Runs `weir plugin test` on the plugin crate's component with the test
/// config at `config`.
fn plugin_test_with(crate_name: &str, config: &Path, envs: &[(&str, &str)]) -> (PathBuf, Report) {
    let wasm = plugin(crate_name);
    let report = plugin_test_file(&wasm, config, envs);
    (wasm, report)
}

/// Runs `weir plugin test --json` on the component `wasm` with the test
/// config at `config`. Compiled components are shared by the tests: the
/// Python and JavaScript sinks embed an interpreter that takes close to a
/// minute to compile.
pub(crate) fn plugin_test_file(wasm: &Path, config: &Path, envs: &[(&str, &str)]) -> Report {
    let cache = shared_component_cache();
    let out = weir(
        &[
            "plugin",
            "test",
            wasm.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--json",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        envs,
    );
    let text = text(&out);
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("`--json` did not print one JSON object ({e}):\n{text}"));
    Report {
        exit: out.status.code(),
        json,
        text,
    }
}

/// The pyarrow/DuckDB readers run the repository's virtualenv.
fn require_venv() {
    let python = workspace().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup (the readers need pyarrow and DuckDB)",
        python.display()
    );
}

#[test]
fn positioned_fixture_is_exactly_once() {
    require_venv();
    let (wasm, report) = plugin_test("weir-fixture-positioned", "positioned", &[]);
    report.check_shape(&wasm, true);
    report.assert_earned("exactly-once", "exactly-once");
}

#[test]
fn python_example_sink_is_at_least_once_idempotent_by_batch_id() {
    let config = workspace().join("examples/python-sink/plugin-test.yaml");
    let (wasm, report) = plugin_test_with("python-sink", &config, &[]);
    report.check_shape(&wasm, false);
    report.assert_earned("at-least-once", "at-least-once, idempotent by batch id");
}

#[test]
fn javascript_example_sink_is_at_least_once_idempotent_by_batch_id() {
    let config = workspace().join("examples/js-sink/plugin-test.yaml");
    let (wasm, report) = plugin_test_with("js-sink", &config, &[]);
    report.check_shape(&wasm, false);
    report.assert_earned("at-least-once", "at-least-once, idempotent by batch id");
}

#[test]
fn iceberg_sink_is_exactly_once() {
    require_venv();
    let (wasm, report) = plugin_test("weir-iceberg-sink", "iceberg", &[]);
    report.check_shape(&wasm, true);
    report.assert_earned("exactly-once", "exactly-once");
}

/// The Iceberg sink committing through an Iceberg REST catalog (the
/// suite's test catalog, pyiceberg's SqlCatalog behind the REST routes):
/// the same verdict, read back through the catalog.
#[test]
fn iceberg_sink_on_a_rest_catalog_is_exactly_once() {
    require_venv();
    let catalog = weir_test_support::iceberg_rest::IcebergRestServer::start();
    if catalog.token().is_some() {
        // An external catalog with a token: the reader takes none.
        return;
    }
    let (wasm, report) = plugin_test(
        "weir-iceberg-sink",
        "iceberg-rest",
        &[("WEIR_TEST_ICEBERG_REST", catalog.uri())],
    );
    report.check_shape(&wasm, true);
    report.assert_earned("exactly-once", "exactly-once");
    // It really went through the catalog: the delivery table is there.
    let listed = catalog.pyiceberg(
        "print(json.dumps(sorted('.'.join(t) for t in catalog.list_tables('plugin_test'))))",
    );
    assert!(
        listed.contains("plugin_test.delivery"),
        "the catalog has no plugin_test.delivery: {listed}"
    );
}

#[test]
fn redis_sink_is_exactly_once() {
    let server = RedisServer::start();
    let address = server.address();
    let (wasm, report) = plugin_test("weir-redis-sink", "redis", &[("WEIR_TEST_REDIS", &address)]);
    report.check_shape(&wasm, true);
    report.assert_earned("exactly-once", "exactly-once");
    // It really wrote there: the reader did not pass on an empty server.
    let mut con = server.client();
    let rows: Vec<String> = ::redis::cmd("KEYS")
        .arg("weir:plugin_test.delivery:*")
        .query(&mut con)
        .unwrap();
    assert_eq!(rows.len(), 22, "rows of plugin_test.delivery: {rows:?}");
}

#[test]
fn parquet_sink_is_at_least_once_idempotent_by_batch_id() {
    require_venv();
    let (wasm, report) = plugin_test("weir-parquet-sink", "parquet", &[]);
    report.check_shape(&wasm, false);
    report.assert_earned("at-least-once", "at-least-once, idempotent by batch id");
    // Without positions, fencing is the host's.
    assert_eq!(report.scenario("older-epoch")["outcome"], "n/a");
    assert_eq!(report.scenario("commit-inside-staged")["outcome"], "n/a");
}

/// tests/plugin-test/webhook_receiver.py on a free port, storing into a
/// folder of its own; killed when dropped, also when the test panics.
struct WebhookReceiver {
    child: Child,
    url: String,
    folder: tempfile::TempDir,
}

impl WebhookReceiver {
    fn start() -> WebhookReceiver {
        let folder = tempfile::tempdir().unwrap();
        let script = workspace().join("tests/plugin-test/webhook_receiver.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(folder.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start python3 {}: {e}", script.display()));
        // Its first line is its URL, printed once it listens.
        let mut url = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let read = BufReader::new(stdout).read_line(&mut url);
        let receiver = WebhookReceiver {
            child,
            url: url.trim().to_string(),
            folder,
        };
        assert!(
            matches!(read, Ok(n) if n > 0) && receiver.url.starts_with("http://127.0.0.1:"),
            "the webhook receiver did not say where it listens ({read:?}, {:?})",
            receiver.url
        );
        receiver
    }

    fn folder(&self) -> &str {
        self.folder.path().to_str().unwrap()
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn webhook_sink_is_at_least_once_idempotent_by_batch_id() {
    let receiver = WebhookReceiver::start();
    let (wasm, report) = plugin_test(
        "weir-webhook-sink",
        "webhook",
        &[
            ("WEIR_TEST_WEBHOOK", &receiver.url),
            ("WEIR_TEST_WEBHOOK_DIR", receiver.folder()),
        ],
    );
    report.check_shape(&wasm, false);
    report.assert_earned("at-least-once", "at-least-once, idempotent by batch id");
    // The replay reached the receiver and was dropped there: the batch is
    // stored once, as one file.
    let replayed = receiver.folder.path().join("plugin_test.replay");
    let files = std::fs::read_dir(&replayed)
        .unwrap_or_else(|e| panic!("{}: {e}", replayed.display()))
        .count();
    assert_eq!(files, 1, "batches stored for plugin_test.replay");
}

#[test]
fn flawed_fixture_lying_about_its_position_fails() {
    require_venv();
    let (wasm, report) = plugin_test("weir-fixture-flawed", "flawed-lies-about-position", &[]);
    report.check_shape(&wasm, true);
    let (_, why) = report.assert_fails_at(&["delivery", "crash-after-commit"]);
    assert!(
        why.contains("`committed`") && why.contains("answered position"),
        "the reason does not name its position claim: {why}"
    );
    // Its data is right: every failure is about the claim, none about rows.
    for name in report.with_outcome("fail") {
        let detail = report.scenario(name)["detail"].as_str().unwrap();
        assert!(
            detail.contains("`committed`"),
            "{name} failed for another reason than the claim: {detail}"
        );
    }
}

#[test]
fn flawed_fixture_visible_before_commit_fails() {
    require_venv();
    let (wasm, report) = plugin_test("weir-fixture-flawed", "flawed-visible-before-commit", &[]);
    report.check_shape(&wasm, true);
    let (_, why) = report.assert_fails_at(&SCENARIOS);
    assert!(
        why.contains("before commit") || why.contains("before `commit`"),
        "the reason does not say rows showed before commit: {why}"
    );
    assert!(why.contains("never committed"), "{why}");
}

#[test]
fn flawed_fixture_accepting_an_older_epoch_fails() {
    require_venv();
    let (wasm, report) = plugin_test("weir-fixture-flawed", "flawed-accepts-older-epoch", &[]);
    report.check_shape(&wasm, true);
    let (_, why) = report.assert_fails_at(&["older-epoch"]);
    assert!(why.contains("epoch"), "{why}");
    // Fencing is the only rule it breaks.
    assert_eq!(
        report.with_outcome("fail"),
        ["older-epoch"],
        "{}",
        report.text
    );
}

#[test]
fn flawed_fixture_committing_over_another_hosts_commit_fails() {
    require_venv();
    let (wasm, report) = plugin_test(
        "weir-fixture-flawed",
        "flawed-commits-over-another-host",
        &[],
    );
    report.check_shape(&wasm, true);
    let (_, why) = report.assert_fails_at(&["commit-inside-staged"]);
    assert!(
        why.contains("was accepted") && why.contains("held twice"),
        "{why}"
    );
    // The check of the staged changes is the only rule it breaks.
    assert_eq!(
        report.with_outcome("fail"),
        ["commit-inside-staged"],
        "{}",
        report.text
    );
}

#[test]
fn forgetful_fixture_duplicates_replays() {
    let (wasm, report) = plugin_test("weir-fixture-forgetful", "forgetful", &[]);
    report.check_shape(&wasm, false);
    let (_, why) = report.assert_fails_at(&["replay", "crash-after-commit"]);
    assert!(why.contains("duplicate"), "{why}");
    // With the usual cause and its fix.
    assert!(why.contains("`batch.id`"), "the reason names no fix: {why}");
    // Only replays across instances show it: it stages, aborts and takes a
    // repeated write correctly.
    for name in report.with_outcome("fail") {
        assert!(
            ["replay", "crash-after-commit"].contains(&name),
            "{name} failed too:\n{}",
            report.text
        );
    }
}

#[test]
fn without_a_reader_nothing_is_claimed() {
    let wasm = plugin("weir-fixture-positioned");
    let cache = shared_component_cache();
    let out = weir(
        &[
            "plugin",
            "test",
            wasm.to_str().unwrap(),
            "--json",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &[],
    );
    let text = text(&out);
    assert_eq!(out.status.code(), Some(4), "{text}");
    let json: Value = serde_json::from_slice(&out.stdout).expect(&text);
    assert_eq!(json["guarantee"], "cannot-verify", "{text}");
    let verdict = json["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("cannot verify: delivery: no reader named"),
        "{verdict}"
    );
}
