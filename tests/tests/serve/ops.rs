//! `weir serve` as an operator runs it (docs/serve.md): its metrics read by
//! the official Prometheus client's parsers, `/ready` naming what does not
//! run while a crash loop backs off and parks, SIGTERM under load ending
//! within the grace with nothing lost or duplicated after a restart on the
//! same folders, and pipelines and plugins deployed through the watched
//! folder alone.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use weir_source::generator::oracle::change_log;

const TENANT: &str = "acme";
const SINK: &str = "lake";

// ---------------------------------------------------------------------------
// Reading /metrics with a parser we did not write
// ---------------------------------------------------------------------------

/// Parses the page on stdin with `prometheus_client`'s OpenMetrics parser
/// (the page is OpenMetrics text, ending in `# EOF`) and, where the page
/// allows, its classic Prometheus text parser; prints both as JSON. An
/// OpenMetrics parse error ends the script with a traceback.
const PARSE_METRICS_PY: &str = r#"
import json, math, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as classic

def families(parse, text):
    out = []
    for family in parse(text):
        samples = []
        for s in family.samples:
            value = s.value if math.isfinite(s.value) else str(s.value)
            samples.append({"name": s.name, "labels": dict(s.labels), "value": value})
        out.append({"name": family.name, "type": family.type, "samples": samples})
    return out

text = sys.stdin.read()
result = {"openmetrics": families(openmetrics, text)}
try:
    result["classic"] = families(classic, text)
except Exception as e:
    result["classic_error"] = f"{type(e).__name__}: {e}"
json.dump(result, sys.stdout)
"#;

/// One sample as the parser read it.
#[derive(Clone, Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// One metric family as the parser read it.
#[derive(Clone, Debug)]
struct Family {
    kind: String,
    samples: Vec<Sample>,
}

type Families = BTreeMap<String, Family>;

/// A `/metrics` page as `prometheus_client` parsed it.
struct Scrape {
    /// The page as the host served it.
    page: String,
    families: Families,
    /// The classic text parser's reading, or why it could not read the page.
    classic: Result<Families, String>,
}

/// The virtualenv's Python (scripts/setup makes it, with prometheus-client).
fn python() -> PathBuf {
    let python = workspace().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup (it installs prometheus-client)",
        python.display()
    );
    python
}

/// The families the script printed. A name the parser gives more than one
/// family (the classic parser makes an untyped family of each OpenMetrics
/// counter's `_total` sample) is merged, keeping the first family's type.
fn families_of(value: &Value) -> Families {
    let mut families = Families::new();
    let parsed = value
        .as_array()
        .expect("a list of families")
        .iter()
        .map(|family| {
            let samples = family["samples"]
                .as_array()
                .expect("samples")
                .iter()
                .map(|s| Sample {
                    name: s["name"].as_str().expect("a sample name").to_string(),
                    labels: s["labels"]
                        .as_object()
                        .expect("labels")
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().expect("a label value").into()))
                        .collect(),
                    value: s["value"].as_f64().unwrap_or(f64::NAN),
                })
                .collect();
            let name = family["name"].as_str().expect("a family name").to_string();
            let kind = family["type"].as_str().expect("a family type").to_string();
            (name, Family { kind, samples })
        });
    for (name, family) in parsed {
        families
            .entry(name)
            .and_modify(|f: &mut Family| f.samples.extend(family.samples.clone()))
            .or_insert(family);
    }
    families
}

/// Parses a `/metrics` page with the official client; panics with the
/// parser's error and the page if the page is not valid OpenMetrics text.
fn parse_metrics(page: &str) -> Scrape {
    let mut child = Command::new(python())
        .arg("-c")
        .arg(PARSE_METRICS_PY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    child
        .stdin
        .take()
        .expect("a stdin")
        .write_all(page.as_bytes())
        .expect("the page reaches python");
    let out = child.wait_with_output().expect("python runs");
    assert!(
        out.status.success(),
        "prometheus_client refused the /metrics page:\n{}\n--- the page ---\n{page}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let classic = match parsed.get("classic") {
        Some(families) => Ok(families_of(families)),
        None => Err(parsed["classic_error"].as_str().unwrap_or("?").to_string()),
    };
    Scrape {
        page: page.to_string(),
        families: families_of(&parsed["openmetrics"]),
        classic,
    }
}

/// GETs `/metrics` and parses it.
fn scrape(host: &ServeHost) -> Scrape {
    let reply = host.get_with("/metrics", host.operator_token());
    assert_eq!(reply.code, 200, "GET /metrics: {reply}");
    parse_metrics(&reply.body)
}

fn has_labels(sample: &Sample, labels: &[(&str, &str)]) -> bool {
    labels
        .iter()
        .all(|(k, v)| sample.labels.get(*k).map(String::as_str) == Some(*v))
}

impl Scrape {
    /// The family `name`, which must exist with type `kind`.
    fn family(&self, name: &str, kind: &str) -> &Family {
        let family = self.families.get(name).unwrap_or_else(|| {
            panic!(
                "no metric family `{name}` on /metrics; it has {:?}\n--- the page ---\n{}",
                self.families.keys().collect::<Vec<_>>(),
                self.page
            )
        });
        assert_eq!(family.kind, kind, "the type of `{name}`");
        family
    }

    /// The samples named `sample` (in any family) carrying every one of
    /// `labels`.
    fn samples<'s>(&'s self, sample: &str, labels: &[(&str, &str)]) -> Vec<&'s Sample> {
        self.families
            .values()
            .flat_map(|f| &f.samples)
            .filter(|s| s.name == sample && has_labels(s, labels))
            .collect()
    }

    /// The sum of those samples' values (0 when there is none).
    fn sum(&self, sample: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(sample, labels).iter().map(|s| s.value).sum()
    }

    /// The value of the one sample named `sample` with `labels`.
    fn one(&self, sample: &str, labels: &[(&str, &str)]) -> f64 {
        let found = self.samples(sample, labels);
        assert_eq!(
            found.len(),
            1,
            "samples `{sample}` with {labels:?}: {found:?}"
        );
        found[0].value
    }

    /// The values of those samples by their label `by` (the table).
    fn by_label(&self, sample: &str, labels: &[(&str, &str)], by: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.samples(sample, labels) {
            let key = s.labels.get(by).cloned().unwrap_or_default();
            *out.entry(key).or_insert(0.0) += s.value;
        }
        out
    }
}

/// The sink every test here runs: the small exactly-once fixture.
fn positioned_sink() -> SinkBuilder {
    SinkBuilder::new(SINK, plugin("weir-fixture-positioned"))
        .limits(256, 30_000)
        .retries(1)
}

/// How many changes of the generator stream `(seed, changes)` each table gets.
fn changes_per_table(seed: u64, changes: u64) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for change in change_log(seed, changes) {
        *out.entry(change.table.name.clone()).or_insert(0.0) += 1.0;
    }
    out
}

/// The families host/metrics/src/lib.rs registers, with their types, that a
/// running generator pipeline has series in. A family without series is
/// not on the page at all (prometheus-client writes no HELP or TYPE for
/// it), so two are checked only where they have some: see
/// [`FAMILIES_ONCE_USED`].
const DOCUMENTED_FAMILIES: &[(&str, &str)] = &[
    ("weir_rows_in", "counter"),
    ("weir_rows_out", "counter"),
    ("weir_written_bytes", "counter"),
    ("weir_commit_duration_seconds", "histogram"),
    ("weir_sink_commit_duration_seconds", "histogram"),
    ("weir_build", "info"),
    ("process_cpu_seconds", "counter"),
    ("process_resident_memory_bytes", "gauge"),
    ("process_open_fds", "gauge"),
    ("process_start_time_seconds", "gauge"),
    ("weir_source_lag_seconds", "gauge"),
    ("weir_sink_retries", "counter"),
    ("weir_sink_traps", "counter"),
    ("weir_sink_deadline_hits", "counter"),
    ("weir_sink_memory_high_water_bytes", "gauge"),
    ("weir_pipeline_state", "gauge"),
    ("weir_pipeline_restarts", "counter"),
];

/// Families with series only once something happened: a plugin swap (the
/// folder-deploy test sees it), a source that measures its lag in bytes
/// (Postgres, not the generator).
const FAMILIES_ONCE_USED: &[(&str, &str)] = &[
    ("weir_plugin_swaps", "counter"),
    ("weir_source_lag_bytes", "gauge"),
];

const STATES: &[&str] = &[
    "starting", "running", "paused", "backoff", "parked", "stopped", "finished",
];

/// Asserts that exactly `state` of the pipeline's state gauges is 1.
fn assert_state_gauge(scrape: &Scrape, pipeline: &str, state: &str) {
    for name in STATES {
        let value = scrape.one(
            "weir_pipeline_state",
            &[("tenant", TENANT), ("pipeline", pipeline), ("state", name)],
        );
        let want = if *name == state { 1.0 } else { 0.0 };
        assert_eq!(
            value, want,
            "weir_pipeline_state{{pipeline=\"{pipeline}\",state=\"{name}\"}} while it is {state}"
        );
    }
}

#[test]
fn metrics_parse_with_the_official_client_and_move_while_a_pipeline_runs() {
    const PIPELINE: &str = "orders";
    const SEED: u64 = 41;
    const CHANGES: u64 = 1_000;
    let host = ServeHost::builder().tenant(Tenant::new(TENANT)).start();
    let token = host.token(TENANT).to_string();
    // One change per batch: then rows_in counts each of the source's changes
    // exactly once, with no last-write-wins folding in between, and the
    // oracle says how many each table gets. The pace (about 400 transactions,
    // 20 ms apart) keeps it running at least 8 s on any machine: room for
    // two scrapes seconds apart.
    let pipeline = PipelineBuilder::generator(SEED, CHANGES)
        .name(PIPELINE)
        .pace_us(20_000)
        .max_rows(1)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(positioned_sink());
    let reply = host.deploy(TENANT, &pipeline, &token);
    assert!(reply.is_success(), "creating the pipeline: {reply}");
    host.wait_for_state(TENANT, PIPELINE, "running", Duration::from_secs(60));
    let of_pipeline = [("tenant", TENANT), ("pipeline", PIPELINE)];
    let of_sink = [("tenant", TENANT), ("pipeline", PIPELINE), ("sink", SINK)];

    std::thread::sleep(Duration::from_secs(1));
    let first = scrape(&host);
    std::thread::sleep(Duration::from_secs(3));
    let second = scrape(&host);
    let status = host.status(TENANT, PIPELINE, &token);
    assert_eq!(
        status["state"], "running",
        "the pipeline ended before the second scrape, so nothing shows the values moving \
         (raise CHANGES): {status}"
    );

    for scrape in [&first, &second] {
        for (name, kind) in DOCUMENTED_FAMILIES {
            scrape.family(name, kind);
        }
        for (name, kind) in FAMILIES_ONCE_USED {
            if scrape.families.contains_key(*name) {
                scrape.family(name, kind);
            }
        }
    }
    for (sample, labels) in [
        ("weir_rows_in_total", &of_pipeline[..]),
        ("weir_rows_out_total", &of_sink[..]),
        ("weir_written_bytes_total", &of_sink[..]),
        ("weir_commit_duration_seconds_count", &of_pipeline[..]),
        ("weir_commit_duration_seconds_sum", &of_pipeline[..]),
        ("weir_sink_commit_duration_seconds_count", &of_sink[..]),
        ("process_cpu_seconds_total", &[][..]),
    ] {
        let (before, after) = (first.sum(sample, labels), second.sum(sample, labels));
        assert!(
            before > 0.0 && after > before,
            "{sample} did not grow between the scrapes: {before} then {after}"
        );
    }
    // The histogram's buckets are cumulative and end in +Inf = count.
    for (table, count) in
        second.by_label("weir_commit_duration_seconds_count", &of_pipeline, "table")
    {
        let labels = [
            ("tenant", TENANT),
            ("pipeline", PIPELINE),
            ("table", table.as_str()),
        ];
        let mut buckets: Vec<(f64, f64)> = second
            .samples("weir_commit_duration_seconds_bucket", &labels)
            .iter()
            .map(|s| {
                let le = s.labels["le"].parse::<f64>().expect("a numeric `le`");
                (le, s.value)
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{table}: buckets not cumulative: {buckets:?}"
        );
        let last = buckets.last().expect("buckets");
        assert_eq!(
            (last.0, last.1),
            (f64::INFINITY, count),
            "{table}: +Inf bucket"
        );
    }
    assert!(
        second.one("weir_sink_memory_high_water_bytes", &of_sink) > 0.0,
        "the sink's memory high-water mark is 0 while it runs"
    );
    let version = second.samples("weir_build_info", &[]);
    assert_eq!(version.len(), 1, "one weir_build_info sample");
    assert_eq!(version[0].labels["version"], env!("CARGO_PKG_VERSION"));
    let (resident, fds) = (
        second.one("process_resident_memory_bytes", &[]),
        second.one("process_open_fds", &[]),
    );
    assert!(
        resident > (1 << 20) as f64 && fds >= 3.0,
        "process_resident_memory_bytes {resident}, process_open_fds {fds}"
    );
    let started = second.one("process_start_time_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 600.0..now).contains(&started),
        "process_start_time_seconds {started} is not within ten minutes before {now}"
    );
    let lag = second.one("weir_source_lag_seconds", &of_pipeline);
    assert!(
        (0.0..60.0).contains(&lag),
        "weir_source_lag_seconds is {lag}"
    );
    assert_eq!(
        second.one("weir_pipeline_restarts_total", &of_pipeline),
        0.0
    );
    assert_state_gauge(&second, PIPELINE, "running");

    host.wait_for_state(TENANT, PIPELINE, "finished", Duration::from_secs(300));
    let last = scrape(&host);
    assert_state_gauge(&last, PIPELINE, "finished");
    let expected = changes_per_table(SEED, CHANGES);
    let rows_in = last.by_label("weir_rows_in_total", &of_pipeline, "table");
    let rows_out = last.by_label("weir_rows_out_total", &of_sink, "table");
    let bytes_out = last.by_label("weir_written_bytes_total", &of_sink, "table");
    // One sink: it committed every table batch the pipeline did.
    assert_eq!(
        last.by_label("weir_sink_commit_duration_seconds_count", &of_sink, "table"),
        last.by_label("weir_commit_duration_seconds_count", &of_pipeline, "table"),
        "per sink and per pipeline, the commits of each table"
    );
    let committed = last.by_label("weir_commit_duration_seconds_count", &of_pipeline, "table");
    for (table, changes) in &expected {
        let got = rows_in.get(table).copied().unwrap_or(0.0);
        assert_eq!(
            got, *changes,
            "weir_rows_in_total of {table}: the oracle has {changes} changes"
        );
        assert_eq!(
            rows_out.get(table).copied().unwrap_or(0.0),
            got,
            "weir_rows_out_total of {table} (one sink, no replay: as many as came in)"
        );
        assert!(
            bytes_out.get(table).copied().unwrap_or(0.0) > 0.0,
            "no weir_written_bytes_total for {table}"
        );
        assert!(
            committed.get(table).copied().unwrap_or(0.0) >= *changes,
            "{table}: fewer commits than changes at one change per batch: {committed:?}"
        );
    }
    assert_eq!(
        rows_in
            .keys()
            .filter(|t| !expected.contains_key(*t))
            .count(),
        0,
        "rows_in names tables the generator does not have: {rows_in:?}"
    );
    assert_positioned_exact(
        &host.sink_root(TENANT, PIPELINE, SINK),
        &expected_state(SEED, CHANGES),
    );

    // The classic Prometheus text parser, where it reads the page, must
    // read the same samples with the same values (it may type them
    // otherwise: an OpenMetrics counter's `_total` samples are untyped to it).
    match &last.classic {
        Ok(classic) => {
            let values = |families: &Families| -> BTreeMap<String, f64> {
                families
                    .values()
                    .flat_map(|f| &f.samples)
                    .map(|s| (format!("{}{:?}", s.name, s.labels), s.value))
                    .collect()
            };
            assert_eq!(
                values(classic),
                values(&last.families),
                "the classic text parser reads other samples than the OpenMetrics one"
            );
            // Where the two parsers group samples into families otherwise.
            let regrouped: Vec<String> = classic
                .iter()
                .filter(|(name, f)| {
                    last.families
                        .get(*name)
                        .is_none_or(|o| o.samples.len() != f.samples.len())
                })
                .map(|(name, f)| format!("{name} ({}, {} samples)", f.kind, f.samples.len()))
                .collect();
            println!(
                "the classic text parser reads the same samples and values; families it makes \
                 otherwise: {regrouped:?}"
            );
        }
        Err(why) => println!("the classic text parser does not read the page: {why}"),
    }
    println!("rows_in per table at the end: {rows_in:?}");
}

// ---------------------------------------------------------------------------
// /ready, /health, and a crash loop that backs off and parks
// ---------------------------------------------------------------------------

/// The failure number in a status reason "restarting in ... after failure N: ...".
fn failure_number(reason: &str) -> Option<u32> {
    let (_, rest) = reason.split_once("after failure ")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn assert_healthy(host: &ServeHost) {
    let reply = host.get("/health");
    assert_eq!(reply.code, 200, "GET /health: {reply}");
}

/// Polls `/ready` (and `/health`) until it answers `code`.
fn wait_ready(host: &ServeHost, code: u16, timeout: Duration) -> Reply {
    let deadline = Instant::now() + timeout;
    loop {
        assert_healthy(host);
        let reply = host.get("/ready");
        if reply.code == code {
            return reply;
        }
        assert!(
            Instant::now() < deadline,
            "/ready does not answer {code} after {timeout:?}: {reply}\n{}",
            host.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ready_names_what_does_not_run_and_a_crash_loop_backs_off_and_parks() {
    const FIRST_BACKOFF_MS: u64 = 500;
    // Four failures: three restarts, so the pauses between them can be seen
    // to grow (500, 1000, 2000 ms, more than a run's time varies).
    const MAX_FAILURES: u32 = 4;
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT))
        .restart(FIRST_BACKOFF_MS, 10_000, MAX_FAILURES)
        .start();
    let token = host.token(TENANT).to_string();
    assert_healthy(&host);
    wait_ready(&host, 200, Duration::from_secs(5));

    // A long pipeline, stopped through the API.
    let orders = PipelineBuilder::generator(5, 50_000)
        .name("orders")
        .pace_us(2_000)
        .max_rows(50)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(positioned_sink());
    let reply = host.deploy(TENANT, &orders, &token);
    assert!(reply.is_success(), "creating orders: {reply}");
    host.wait_for_state(TENANT, "orders", "running", Duration::from_secs(60));
    wait_ready(&host, 200, Duration::from_secs(10));
    let reply = host.stop(TENANT, "orders", &token);
    assert!(reply.is_success(), "stopping orders: {reply}");
    host.wait_for_state(TENANT, "orders", "stopped", Duration::from_secs(30));
    let reply = wait_ready(&host, 503, Duration::from_secs(5));
    assert!(reply.body.contains("acme/orders"), "{reply}");

    // A pipeline whose sink traps at its first write, every run.
    let broken = PipelineBuilder::generator(6, 1_000)
        .name("broken")
        .max_rows(50)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(
            SinkBuilder::new(SINK, plugin("weir-fixture-trap"))
                .limits(128, 30_000)
                .retries(1),
        );
    let reply = host.deploy(TENANT, &broken, &token);
    assert!(reply.is_success(), "creating broken: {reply}");

    // Watch it fail: when each failure is first seen, until it is parked.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut failed_at: BTreeMap<u32, Instant> = BTreeMap::new();
    let parked = loop {
        assert_healthy(&host);
        let status = host.status(TENANT, "broken", &token);
        let now = Instant::now();
        let reason = status["reason"].as_str().unwrap_or_default();
        match status["state"].as_str() {
            Some("backoff") => {
                if let Some(n) = failure_number(reason) {
                    failed_at.entry(n).or_insert(now);
                }
            }
            Some("parked") => {
                failed_at.entry(MAX_FAILURES).or_insert(now);
                break status;
            }
            // Between its recovery and its first write a run counts as
            // running; it never gets further.
            Some("finished") => panic!("the trap fixture's pipeline finished: {status}"),
            _ => {}
        }
        assert!(
            now < deadline,
            "broken is not parked after 120 s; seen failures {:?}; its status: {status}\n{}",
            failed_at.keys().collect::<Vec<_>>(),
            host.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let reason = parked["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("parked after {MAX_FAILURES} failures in a row"))
            && reason.contains("fixture trap"),
        "the parked reason: {parked}"
    );
    assert_eq!(parked["failures"], MAX_FAILURES, "{parked}");
    let seen: Vec<u32> = failed_at.keys().copied().collect();
    assert_eq!(
        seen,
        (1..=MAX_FAILURES).collect::<Vec<_>>(),
        "every failure seen once, in order"
    );
    // Between failure n and n+1 the host waited its back-off for n, which
    // doubles: the loop was not hammered.
    let gaps: Vec<Duration> = seen
        .windows(2)
        .map(|w| failed_at[&w[1]] - failed_at[&w[0]])
        .collect();
    for (i, gap) in gaps.iter().enumerate() {
        let backoff = Duration::from_millis(FIRST_BACKOFF_MS << i);
        // The status is polled every ~10 ms: allow that much of jitter.
        assert!(
            *gap + Duration::from_millis(30) >= backoff,
            "failure {} came {gap:?} after failure {}: its back-off is {backoff:?}; gaps {gaps:?}",
            i + 2,
            i + 1
        );
    }
    assert!(
        gaps.windows(2).all(|w| w[1] > w[0]),
        "the time between restarts does not grow: {gaps:?}"
    );
    println!("failures of broken, each after the one before: {gaps:?}");

    let metrics = scrape(&host);
    let of_broken = [("tenant", TENANT), ("pipeline", "broken")];
    assert_eq!(
        metrics.one("weir_pipeline_restarts_total", &of_broken),
        f64::from(MAX_FAILURES - 1),
        "restarts: one after each failure but the one that parked it"
    );
    assert!(
        metrics.sum("weir_sink_traps_total", &of_broken) >= f64::from(MAX_FAILURES),
        "a trap per run at least"
    );
    assert_state_gauge(&metrics, "broken", "parked");
    assert_state_gauge(&metrics, "orders", "stopped");

    // Not ready, naming both.
    assert_healthy(&host);
    let reply = host.get("/ready");
    assert_eq!(
        reply.code, 503,
        "/ready with one stopped and one parked: {reply}"
    );
    let body = reply.json();
    assert_eq!(body["ready"], false, "{reply}");
    let not_running: BTreeMap<String, String> = body["not_running"]
        .as_array()
        .expect("not_running")
        .iter()
        .map(|p| {
            (
                p["pipeline"].as_str().unwrap_or_default().to_string(),
                p["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let want: BTreeMap<String, String> = [
        ("acme/broken".to_string(), "parked".to_string()),
        ("acme/orders".to_string(), "stopped".to_string()),
    ]
    .into();
    assert_eq!(not_running, want, "{reply}");

    // Start the stopped one, delete the parked one: ready again.
    let reply = host.start(TENANT, "orders", &token);
    assert!(reply.is_success(), "starting orders: {reply}");
    let reply = host.delete(TENANT, "broken", &token);
    assert!(reply.is_success(), "deleting broken: {reply}");
    let gone = host.get_with("/v1/pipelines/acme/broken", &token);
    assert_eq!(gone.code, 404, "broken after its delete: {gone}");
    let reply = wait_ready(&host, 200, Duration::from_secs(60));
    assert_eq!(reply.json()["ready"], true, "{reply}");
    let state = host.status(TENANT, "orders", &token)["state"].clone();
    assert!(
        state == "running" || state == "finished",
        "orders after its start: {state}"
    );
    assert_healthy(&host);
}

// ---------------------------------------------------------------------------
// SIGTERM under load, and a restart on the same folders
// ---------------------------------------------------------------------------

/// The exit may take this much beyond `shutdown_grace_ms`: the process's own
/// end (the I/O runtime is given 0.5 s) and the test's polling.
const EXIT_SLACK: Duration = Duration::from_millis(2_000);

/// A later `weir serve` on the host file and folders of a [`ServeHost`]
/// that exited: same port, tokens, state and pipelines. [`ServeHost`]
/// always starts in a fresh folder, so this local guard does the restart;
/// it asks the API through `weir ctl` (the product's own client) and kills
/// the process when dropped.
struct Relaunched {
    child: Child,
    exited: Option<ExitStatus>,
    server: String,
    operator_token: String,
    log: PathBuf,
}

impl Relaunched {
    fn start(first: &ServeHost, generation: u32) -> Relaunched {
        let host_file = first.dir().join("host.yaml");
        let text = std::fs::read_to_string(&host_file).expect("the host file");
        let config: Value = serde_json::from_str(&text).expect("the test host file is JSON");
        let log = first.dir().join(format!("serve-{generation}.log"));
        let out = std::fs::File::create(&log).expect("the log file");
        let err = out.try_clone().expect("the log file, twice");
        let mut command = weir_command();
        command
            .arg("serve")
            .arg(&host_file)
            .current_dir(first.dir())
            .env("WEIR_LOG", "info")
            .env(
                config["operator_token_env"]
                    .as_str()
                    .expect("operator_token_env"),
                first.operator_token(),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (tenant, entry) in config["tenants"].as_object().expect("tenants") {
            command.env(
                entry["token_env"].as_str().expect("token_env"),
                first.token(tenant),
            );
        }
        let child = command.spawn().expect("`weir serve` starts again");
        Relaunched {
            child,
            exited: None,
            server: format!("http://{}", config["listen"].as_str().expect("listen")),
            operator_token: first.operator_token().to_string(),
            log,
        }
    }

    fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        format!(
            "--- the last {lines} lines of {} ---\n{}",
            self.log.display(),
            all[all.len().saturating_sub(lines)..].join("\n")
        )
    }

    /// `weir ctl status TENANT/PIPELINE --json`; `None` until the server
    /// answers it (starting, or the watcher has not read the file yet).
    fn status(&mut self, pipeline: &str) -> Option<Value> {
        if let Some(status) = self.try_exit() {
            panic!(
                "the relaunched `weir serve` exited with {status}\n{}",
                self.log_tail(60)
            );
        }
        let out = weir_command()
            .args(["ctl", "status", &format!("{TENANT}/{pipeline}"), "--json"])
            .env("WEIR_SERVER", &self.server)
            .env("WEIR_TOKEN", &self.operator_token)
            .env("WEIR_LOG", "warn")
            .output()
            .expect("weir ctl runs");
        if !out.status.success() {
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).expect("`weir ctl status --json` prints JSON"))
    }

    fn wait_for_state(&mut self, pipeline: &str, state: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status(pipeline);
            if let Some(status) = &status
                && status["state"] == state
            {
                return status.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{pipeline} is not {state} after {timeout:?} on the relaunched host: {status:?}\n{}",
                self.log_tail(60)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().expect("waiting for weir serve");
        }
        self.exited
    }
}

impl Drop for Relaunched {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail(120));
        }
    }
}

/// Sends SIGTERM to `pid` and waits for it to exit within `bound`;
/// returns how long it took and how it ended.
fn sigterm_and_wait(
    pid: u32,
    bound: Duration,
    mut exited: impl FnMut() -> Option<ExitStatus>,
) -> (Duration, ExitStatus) {
    let pid = libc::pid_t::try_from(pid).expect("a pid fits pid_t");
    let sent = Instant::now();
    // SAFETY: kill(2) on a child we spawned and have not reaped (so its pid
    // cannot have been reused), with a valid signal number.
    let result = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(result, 0, "SIGTERM: {}", std::io::Error::last_os_error());
    loop {
        if let Some(status) = exited() {
            return (sent.elapsed(), status);
        }
        assert!(
            sent.elapsed() < bound,
            "`weir serve` still runs {bound:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many of the stream's changes the positioned fixture under `root`
/// holds: per table, every change up to the newest committed position.
fn changes_committed(root: &Path, seed: u64, changes: u64) -> u64 {
    let mut newest: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for table in shop_tables() {
        let batches = read_positioned(root, &table.name);
        if let Some(high) = weir_test_support::changes(&table, &batches)
            .into_iter()
            .map(|c| c.pos)
            .max()
        {
            newest.insert(table.name.clone(), high);
        }
    }
    change_log(seed, changes)
        .filter(|c| {
            newest
                .get(&c.table.name)
                .is_some_and(|high| c.pos.as_bytes() <= high.as_slice())
        })
        .count() as u64
}

#[test]
fn sigterm_under_load_exits_within_the_grace_and_a_restart_finishes_exactly() {
    const PIPELINE: &str = "orders";
    const SEED: u64 = 23;
    // About 4,900 transactions 3 ms apart: at least 15 s of changes on any
    // machine (the pace is slept; commits add to it), in batches of at most
    // 20. Three SIGTERMs, each 1 to 4 s into a run, land before the end.
    const CHANGES: u64 = 12_000;
    const PACE_US: u64 = 3_000;
    const GRACE_MS: u64 = 5_000;
    let grace = Duration::from_millis(GRACE_MS);
    let mut delays = KillSchedule::from_env_or_random();
    let mut host = ServeHost::builder()
        .tenant(Tenant::new(TENANT))
        .shutdown_grace_ms(GRACE_MS)
        .start();
    let token = host.token(TENANT).to_string();
    let pipeline = PipelineBuilder::generator(SEED, CHANGES)
        .name(PIPELINE)
        .pace_us(PACE_US)
        .max_rows(20)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(positioned_sink());
    let reply = host.deploy(TENANT, &pipeline, &token);
    assert!(reply.is_success(), "creating the pipeline: {reply}");
    let root = host.sink_root(TENANT, PIPELINE, SINK);

    let mut landed = Vec::new();
    let mut committed_before = 0;
    let mut relaunched: Option<Relaunched> = None;
    for generation in 0..3u32 {
        let delay = Duration::from_millis(delays.next_ms(1_000, 4_000));
        // Running: recovered, taking changes.
        match relaunched.as_mut() {
            None => host.wait_for_state(TENANT, PIPELINE, "running", Duration::from_secs(60)),
            Some(later) => later.wait_for_state(PIPELINE, "running", Duration::from_secs(60)),
        };
        std::thread::sleep(delay);
        let before = match relaunched.as_mut() {
            None => host.status(TENANT, PIPELINE, &token),
            Some(later) => later.status(PIPELINE).expect("the status before SIGTERM"),
        };
        assert_eq!(
            before["state"],
            "running",
            "SIGTERM {} would not land mid-stream (inconclusive: raise CHANGES): {before}",
            generation + 1
        );
        let (took, status) = match relaunched.as_mut() {
            None => {
                let pid = host.pid();
                sigterm_and_wait(pid, grace + EXIT_SLACK, || host.wait_exit(Duration::ZERO))
            }
            Some(later) => {
                let pid = later.child.id();
                sigterm_and_wait(pid, grace + EXIT_SLACK, || later.try_exit())
            }
        };
        assert!(
            status.success(),
            "SIGTERM {}: `weir serve` exited with {status} after {took:?}",
            generation + 1
        );
        let committed = changes_committed(&root, SEED, CHANGES);
        assert!(
            committed > committed_before && committed < CHANGES,
            "SIGTERM {} landed outside the stream (inconclusive): {committed} of {CHANGES} \
             changes committed, {committed_before} before",
            generation + 1
        );
        landed.push(format!(
            "SIGTERM {} at {delay:?} into run {}: exit in {took:?}, {committed} of {CHANGES} \
             changes committed ({committed_before} before the run; checkpoint {} just before \
             the signal)",
            generation + 1,
            generation + 1,
            before["live"]["checkpoint"]
        ));
        committed_before = committed;
        relaunched = Some(Relaunched::start(&host, generation + 1));
    }
    let mut last = relaunched.expect("a relaunched host");
    let finished = last.wait_for_state(PIPELINE, "finished", Duration::from_secs(300));
    let (took, status) = {
        let pid = last.child.id();
        sigterm_and_wait(pid, grace + EXIT_SLACK, || last.try_exit())
    };
    assert!(
        status.success(),
        "the last SIGTERM: exited {status} after {took:?}"
    );
    for line in &landed {
        println!("{line}");
    }
    // Each run took a new fencing epoch: four runs, the last one epoch 4.
    assert_eq!(finished["live"]["epoch"], 4, "the last run: {finished}");
    assert_positioned_exact(&root, &expected_state(SEED, CHANGES));
}

// ---------------------------------------------------------------------------
// Deploying through the watched folder
// ---------------------------------------------------------------------------

/// Polls the pipeline's status until `done` holds for it; panics after
/// `timeout` with the last status.
fn wait_status(
    host: &ServeHost,
    pipeline: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Reply) -> bool,
) -> (Reply, Duration) {
    let started = Instant::now();
    loop {
        let reply = host.get_with(
            &format!("/v1/pipelines/{TENANT}/{pipeline}"),
            host.operator_token(),
        );
        if done(&reply) {
            return (reply, started.elapsed());
        }
        assert!(
            started.elapsed() < timeout,
            "{what}: not within {timeout:?}; the last status: {reply}\n{}",
            host.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_pipeline_file_and_a_renamed_plugin_in_the_watched_folder_deploy_swap_and_delete() {
    const PIPELINE: &str = "orders";
    const SEED: u64 = 57;
    // About 4,900 transactions 3 ms apart: at least 15 s, so the swap (the
    // new version compiles first, seconds on a busy machine) lands while it
    // runs.
    const CHANGES: u64 = 12_000;
    const WATCH_MS: u64 = 200;
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT))
        .watch_interval_ms(WATCH_MS)
        .start();
    let folder = host.pipelines_dir(TENANT);
    let honest = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    let plugin_path = host.add_plugin(TENANT, "lake.wasm", &honest);

    // The pipeline file is written outside and copied in, as an operator
    // would.
    let pipeline = PipelineBuilder::generator(SEED, CHANGES)
        .name(PIPELINE)
        .pace_us(3_000)
        .max_rows(50)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(
            SinkBuilder::new(SINK, &plugin_path)
                .limits(256, 30_000)
                .retries(1),
        )
        .for_serve();
    let outside = tempfile::tempdir().unwrap();
    let written = pipeline.write_in(outside.path());
    let file = folder.join(format!("{PIPELINE}.yaml"));
    std::fs::copy(&written, &file).unwrap();
    let (_, appeared) = wait_status(
        &host,
        PIPELINE,
        Duration::from_millis(5 * WATCH_MS + 1_000),
        "the copied pipeline file creates the pipeline within a few watch intervals",
        |r| r.code == 200,
    );
    let running = host.wait_for_state(TENANT, PIPELINE, "running", Duration::from_secs(60));
    let first_sha = sha256_hex(&honest);
    assert_eq!(running["plugins"][SINK]["sha256"], first_sha, "{running}");
    assert_eq!(running["plugins"][SINK]["swaps"], 0, "{running}");

    // A new version copied beside the old one and renamed over it.
    let next = with_custom_section(&honest, "weir-test-version", b"2");
    let next_sha = sha256_hex(&next);
    let beside = folder.join(".lake.wasm.new");
    std::fs::write(&beside, &next).unwrap();
    std::fs::rename(&beside, &plugin_path).unwrap();
    let (swapped, swap_took) = wait_status(
        &host,
        PIPELINE,
        Duration::from_secs(120),
        "the renamed plugin is swapped in",
        |r| r.code == 200 && r.json()["plugins"][SINK]["sha256"] == next_sha,
    );
    let swapped = swapped.json();
    let plugins = &swapped["plugins"][SINK];
    assert_eq!(plugins["previous_sha256"], first_sha, "{swapped}");
    assert_eq!(plugins["swaps"], 1, "{swapped}");
    let records = swapped["swaps"].as_array().expect("swaps");
    assert_eq!(records.len(), 1, "one swap recorded: {swapped}");
    assert_eq!(records[0]["sink"], SINK, "{swapped}");
    assert_eq!(records[0]["outcome"], "swapped", "{swapped}");
    assert_eq!(records[0]["sha256"], next_sha, "{swapped}");
    assert!(
        records[0]["pause_ms"].is_number(),
        "the swap did not land in the running pipeline (it ended too soon: raise CHANGES or \
         the pace): {swapped}"
    );
    assert_eq!(
        swapped["state"], "running",
        "the pipeline ran on after the swap: {swapped}"
    );
    let metrics = scrape(&host);
    metrics.family("weir_plugin_swaps", "counter");
    assert_eq!(
        metrics.one(
            "weir_plugin_swaps_total",
            &[
                ("pipeline", PIPELINE),
                ("sink", SINK),
                ("outcome", "swapped")
            ]
        ),
        1.0
    );

    // It finishes exact through the swap; then removing the file deletes it.
    host.wait_for_state(TENANT, PIPELINE, "finished", Duration::from_secs(300));
    assert_positioned_exact(
        &host.sink_root(TENANT, PIPELINE, SINK),
        &expected_state(SEED, CHANGES),
    );
    std::fs::remove_file(&file).unwrap();
    let (_, deleted) = wait_status(
        &host,
        PIPELINE,
        Duration::from_millis(5 * WATCH_MS + 2_000),
        "removing the pipeline file deletes the pipeline",
        |r| r.code == 404,
    );
    let listed = host.list(host.operator_token()).json();
    assert_eq!(listed["pipelines"], Value::Array(vec![]), "{listed}");
    println!(
        "folder deploy: created {appeared:?} after the copy; swapped {swap_took:?} after the \
         rename (pause {} ms, at {}); deleted {deleted:?} after the file was removed",
        records[0]["pause_ms"], records[0]["at"]
    );
}
