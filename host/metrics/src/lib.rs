//! The host's metrics, in Prometheus text format for `GET /metrics`.
//!
//! One [`Metrics`] registry per process; a [`PipelineMetrics`] per running
//! pipeline (labels `tenant`, `pipeline`) and a [`SinkMetrics`] per sink
//! instance (plus `sink`). Handles are cheap to clone and safe to use from
//! any thread; `weir run` uses the same code and simply never renders.
//!
//! A handle asked for twice with the same labels (a restarted pipeline, a
//! swapped plugin) records into the same series, so counters keep counting
//! across restarts.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

mod process;
use process::ProcessCollector;

/// A label value from configuration (a tenant, pipeline, sink or table
/// name), escaped when rendered. prometheus-client 0.24 writes label values
/// as they are (prometheus/client_rust#151), so a name holding a quote or a
/// newline would otherwise break the whole page for every scraper.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Text(Arc<str>);

impl Text {
    fn new(value: &str) -> Self {
        Text(Arc::from(value))
    }
}

impl EncodeLabelValue for Text {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        // The three escapes both the Prometheus and the OpenMetrics text
        // formats define; every other character is valid as it is.
        let mut rest = &*self.0;
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PipelineLabels {
    tenant: Text,
    pipeline: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    #[prometheus(flatten)]
    of: PipelineLabels,
    table: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SinkLabels {
    #[prometheus(flatten)]
    of: PipelineLabels,
    sink: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SinkTableLabels {
    #[prometheus(flatten)]
    of: SinkLabels,
    table: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SwapLabels {
    #[prometheus(flatten)]
    of: SinkLabels,
    outcome: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: Text,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    #[prometheus(flatten)]
    of: PipelineLabels,
    state: Text,
}

/// A gauge holding an `f64` (seconds).
type SecondsGauge = Gauge<f64, AtomicU64>;

/// The commit histogram's buckets: 1 ms doubling 16 times, to about 33 s.
fn commit_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Every metric family; cloning one shares its series.
#[derive(Clone)]
struct Families {
    rows_in: Family<TableLabels, Counter>,
    rows_out: Family<SinkTableLabels, Counter>,
    bytes_out: Family<SinkTableLabels, Counter>,
    dead_letter_rows: Family<SinkTableLabels, Counter>,
    commit_duration: Family<TableLabels, Histogram>,
    sink_commit_duration: Family<SinkTableLabels, Histogram>,
    source_lag_bytes: Family<PipelineLabels, Gauge>,
    source_lag_seconds: Family<PipelineLabels, SecondsGauge>,
    sink_retries: Family<SinkLabels, Counter>,
    sink_traps: Family<SinkLabels, Counter>,
    sink_deadline_hits: Family<SinkLabels, Counter>,
    sink_memory_high_water: Family<SinkLabels, Gauge>,
    plugin_swaps: Family<SwapLabels, Counter>,
    pipeline_state: Family<StateLabels, Gauge>,
    pipeline_restarts: Family<PipelineLabels, Counter>,
    cluster: ClusterMetrics,
}

/// The process's registry.
pub struct Metrics {
    registry: Registry,
    families: Families,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let families = Families {
            rows_in: Family::default(),
            rows_out: Family::default(),
            bytes_out: Family::default(),
            dead_letter_rows: Family::default(),
            commit_duration: Family::new_with_constructor(commit_histogram),
            sink_commit_duration: Family::new_with_constructor(commit_histogram),
            source_lag_bytes: Family::default(),
            source_lag_seconds: Family::default(),
            sink_retries: Family::default(),
            sink_traps: Family::default(),
            sink_deadline_hits: Family::default(),
            sink_memory_high_water: Family::default(),
            plugin_swaps: Family::default(),
            pipeline_state: Family::default(),
            pipeline_restarts: Family::default(),
            cluster: ClusterMetrics::detached(),
        };
        let f = families.clone();
        let mut registry = Registry::default();
        // Counters are registered without `_total`: the encoder adds it.
        registry.register(
            "weir_rows_in",
            "Rows the source handed to a pipeline, per table",
            f.rows_in,
        );
        registry.register(
            "weir_rows_out",
            "Rows handed to a sink in its writes, per table",
            f.rows_out,
        );
        // The unit before `_total`, as Prometheus names counters of bytes
        // (`weir_bytes_out_total` until stop 39).
        registry.register(
            "weir_written_bytes",
            "Arrow IPC bytes handed to a sink in its writes, per table",
            f.bytes_out,
        );
        registry.register(
            "weir_dead_letter_rows",
            "Rows a sink refused that its dead-letter valve set aside instead of stopping the pipeline, per table",
            f.dead_letter_rows,
        );
        registry.register(
            "weir_commit_duration_seconds",
            "Time to commit one table batch through every sink, start to end",
            f.commit_duration,
        );
        registry.register(
            "weir_sink_commit_duration_seconds",
            "Time one sink took to commit one table batch, its retries included",
            f.sink_commit_duration,
        );
        // Rendered `weir_build_info{version="…"} 1`.
        registry.register(
            "weir_build",
            "The version of weir this host runs",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        registry.register_collector(Box::new(ProcessCollector));
        registry.register(
            "weir_source_lag_bytes",
            "How far a pipeline's checkpoint is behind the source's head, in bytes of its log",
            f.source_lag_bytes,
        );
        registry.register(
            "weir_source_lag_seconds",
            "How far a pipeline's checkpoint is behind the source's head, in seconds",
            f.source_lag_seconds,
        );
        registry.register(
            "weir_sink_retries",
            "Calls into a sink retried after it answered retryable",
            f.sink_retries,
        );
        registry.register(
            "weir_sink_traps",
            "Sink instances that trapped or blew their memory limit",
            f.sink_traps,
        );
        registry.register(
            "weir_sink_deadline_hits",
            "Calls into a sink stopped at their CPU deadline or given up at their wall-clock bound",
            f.sink_deadline_hits,
        );
        registry.register(
            "weir_sink_memory_high_water_bytes",
            "The most linear memory a sink's instances have held",
            f.sink_memory_high_water,
        );
        registry.register(
            "weir_plugin_swaps",
            "Replacements of a sink's plugin, by outcome (swapped, refused, rolled_back)",
            f.plugin_swaps,
        );
        registry.register(
            "weir_pipeline_state",
            "1 for the state a pipeline is in, 0 for the others",
            f.pipeline_state,
        );
        registry.register(
            "weir_pipeline_restarts",
            "Restarts of a pipeline after a failure",
            f.pipeline_restarts,
        );
        let c = f.cluster;
        registry.register(
            "weir_cluster_assignments",
            "Pipelines this host holds a claim on (a cluster's host only)",
            c.assignments,
        );
        registry.register(
            "weir_cluster_claims",
            "Claims this host took: a pipeline placed here and free",
            c.claims,
        );
        registry.register(
            "weir_cluster_lease_renewals",
            "Renewals of this host's lease, by outcome (renewed, failed, expired)",
            c.renewals,
        );
        registry.register(
            "weir_cluster_lease_renewal_duration_seconds",
            "Time etcd took to confirm a renewal of this host's lease",
            c.renewal_duration,
        );
        registry.register(
            "weir_cluster_fenced_writes",
            "Commits and position writes this host was refused because it no longer held the pipeline",
            c.fenced_writes,
        );
        registry.register(
            "weir_cluster_leader",
            "1 while this host leads (places pipelines), else 0",
            c.leader,
        );
        Arc::new(Metrics { registry, families })
    }

    /// The handle of this host's part in a cluster.
    pub fn cluster(&self) -> ClusterMetrics {
        self.families.cluster.clone()
    }

    /// Every metric, in the OpenMetrics text format (which Prometheus
    /// reads), ending with `# EOF`.
    pub fn render(&self) -> String {
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &self.registry)
            .expect("writing to a String cannot fail");
        page
    }

    /// The page [`render`](Self::render) writes, with only the series of
    /// `tenant`: what a tenant's token may read of a host others share.
    pub fn render_for_tenant(&self, tenant: &str) -> String {
        let page = self.render();
        let mut own = String::with_capacity(page.len());
        for line in page.lines() {
            let keep = line.starts_with('#') || label_value(line, "tenant") == Some(tenant.into());
            if keep {
                own.push_str(line);
                own.push('\n');
            }
        }
        own
    }

    /// The handle of one pipeline of one tenant (`weir run` passes tenant "").
    pub fn pipeline(self: &Arc<Self>, tenant: &str, pipeline: &str) -> PipelineMetrics {
        let labels = PipelineLabels {
            tenant: Text::new(tenant),
            pipeline: Text::new(pipeline),
        };
        let f = &self.families;
        // Created now, so a pipeline shows all its states (and a restart
        // count of 0) from its start, not only once they change.
        let states = STATES
            .iter()
            .map(|state| {
                f.pipeline_state.get_or_create_owned(&StateLabels {
                    of: labels.clone(),
                    state: Text::new(state),
                })
            })
            .collect();
        PipelineMetrics {
            families: f.clone(),
            restarts: f.pipeline_restarts.get_or_create_owned(&labels),
            states: Arc::new(states),
            labels,
        }
    }
}

/// The value of label `name` of a sample line (`metric{a="x",b="y"} 1`),
/// unescaped; `None` when the line has no such label.
fn label_value(line: &str, name: &str) -> Option<String> {
    let (_, mut rest) = line.split_once('{')?;
    loop {
        let (label, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        if label.trim_start_matches(',') == name {
            return Some(value);
        }
        rest = &after[end + 1..];
        if !rest.starts_with(',') {
            return None;
        }
    }
}

/// The metrics of one pipeline.
#[derive(Clone)]
pub struct PipelineMetrics {
    families: Families,
    labels: PipelineLabels,
    /// One gauge per entry of [`STATES`], in that order.
    states: Arc<Vec<Gauge>>,
    restarts: Counter,
}

impl PipelineMetrics {
    /// A handle that records into a registry nobody renders.
    pub fn detached() -> PipelineMetrics {
        Metrics::new().pipeline("", "")
    }

    fn table(&self, table: &str) -> TableLabels {
        TableLabels {
            of: self.labels.clone(),
            table: Text::new(table),
        }
    }

    /// Rows the source handed to the pipeline for `table` (one committed batch).
    pub fn rows_in(&self, table: &str, rows: u64) {
        self.families
            .rows_in
            .get_or_create(&self.table(table))
            .inc_by(rows);
    }
    /// One table batch committed through the core, start to end.
    pub fn commit_seconds(&self, table: &str, seconds: f64) {
        self.families
            .commit_duration
            .get_or_create(&self.table(table))
            .observe(seconds);
    }
    /// How far the pipeline's checkpoint is behind the source's head.
    pub fn source_lag(&self, bytes: Option<u64>, seconds: Option<f64>) {
        if let Some(bytes) = bytes {
            self.families
                .source_lag_bytes
                .get_or_create(&self.labels)
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        if let Some(seconds) = seconds {
            self.families
                .source_lag_seconds
                .get_or_create(&self.labels)
                .set(seconds);
        }
    }
    /// A plugin replacement of `sink`, `outcome` one of "swapped", "refused", "rolled_back".
    pub fn swap(&self, sink: &str, outcome: &str) {
        self.families
            .plugin_swaps
            .get_or_create(&SwapLabels {
                of: self.sink_labels(sink),
                outcome: Text::new(outcome),
            })
            .inc();
    }
    /// The pipeline's state now: exactly one of [`STATES`] is 1.
    pub fn state(&self, state: &str) {
        if !STATES.contains(&state) {
            // A programming error, not an operator's: keep the last state
            // rather than report none.
            debug_assert!(false, "unknown pipeline state `{state}`");
            tracing::warn!("metrics: unknown pipeline state `{state}` not reported");
            return;
        }
        for (gauge, name) in self.states.iter().zip(STATES) {
            gauge.set(i64::from(*name == state));
        }
    }
    /// The pipeline was restarted after a failure.
    pub fn restarted(&self) {
        self.restarts.inc();
    }

    /// Takes every series of the pipeline off the page (it was deleted):
    /// those of its `sinks` and `tables` and its own.
    pub fn forget(&self, sinks: &[String], tables: &[String]) {
        let f = &self.families;
        for table in tables {
            let labels = self.table(table);
            f.rows_in.remove(&labels);
            f.commit_duration.remove(&labels);
        }
        for sink in sinks {
            let labels = self.sink_labels(sink);
            for table in tables {
                let of = SinkTableLabels {
                    of: labels.clone(),
                    table: Text::new(table),
                };
                f.rows_out.remove(&of);
                f.bytes_out.remove(&of);
                f.dead_letter_rows.remove(&of);
                f.sink_commit_duration.remove(&of);
            }
            for outcome in SWAP_OUTCOMES {
                f.plugin_swaps.remove(&SwapLabels {
                    of: labels.clone(),
                    outcome: Text::new(outcome),
                });
            }
            f.sink_retries.remove(&labels);
            f.sink_traps.remove(&labels);
            f.sink_deadline_hits.remove(&labels);
            f.sink_memory_high_water.remove(&labels);
        }
        for state in STATES {
            f.pipeline_state.remove(&StateLabels {
                of: self.labels.clone(),
                state: Text::new(state),
            });
        }
        f.source_lag_bytes.remove(&self.labels);
        f.source_lag_seconds.remove(&self.labels);
        f.pipeline_restarts.remove(&self.labels);
    }

    fn sink_labels(&self, sink: &str) -> SinkLabels {
        SinkLabels {
            of: self.labels.clone(),
            sink: Text::new(sink),
        }
    }

    /// The handle of one of its sinks.
    pub fn sink(&self, sink: &str) -> SinkMetrics {
        let labels = self.sink_labels(sink);
        let f = &self.families;
        // Every outcome is on the page from the start, so a rate reads 0
        // rather than nothing before the first swap.
        for outcome in SWAP_OUTCOMES {
            let _ = f.plugin_swaps.get_or_create(&SwapLabels {
                of: labels.clone(),
                outcome: Text::new(outcome),
            });
        }
        SinkMetrics {
            rows_out: f.rows_out.clone(),
            bytes_out: f.bytes_out.clone(),
            dead_letter_rows: f.dead_letter_rows.clone(),
            commit_duration: f.sink_commit_duration.clone(),
            retries: f.sink_retries.get_or_create_owned(&labels),
            traps: f.sink_traps.get_or_create_owned(&labels),
            deadline_hits: f.sink_deadline_hits.get_or_create_owned(&labels),
            memory_high_water: f.sink_memory_high_water.get_or_create_owned(&labels),
            labels,
        }
    }
}

/// What a plugin swap can come to.
pub const SWAP_OUTCOMES: &[&str] = &["swapped", "refused", "rolled_back"];

/// The states a pipeline is reported in.
pub const STATES: &[&str] = &[
    "starting", "running", "paused", "backoff", "parked", "stopped", "finished", "standby",
];

/// The metrics of one sink of one pipeline.
#[derive(Clone)]
pub struct SinkMetrics {
    labels: SinkLabels,
    rows_out: Family<SinkTableLabels, Counter>,
    bytes_out: Family<SinkTableLabels, Counter>,
    dead_letter_rows: Family<SinkTableLabels, Counter>,
    commit_duration: Family<SinkTableLabels, Histogram>,
    retries: Counter,
    traps: Counter,
    deadline_hits: Counter,
    memory_high_water: Gauge,
}

impl SinkMetrics {
    /// Rows and Arrow IPC bytes handed to the sink in one `write` of `table`.
    pub fn written(&self, table: &str, rows: u64, bytes: u64) {
        let labels = SinkTableLabels {
            of: self.labels.clone(),
            table: Text::new(table),
        };
        self.rows_out.get_or_create(&labels).inc_by(rows);
        self.bytes_out.get_or_create(&labels).inc_by(bytes);
    }
    /// `rows` rows of `table` the sink refused were set aside in its
    /// dead-letter location.
    pub fn dead_lettered(&self, table: &str, rows: u64) {
        let labels = SinkTableLabels {
            of: self.labels.clone(),
            table: Text::new(table),
        };
        self.dead_letter_rows.get_or_create(&labels).inc_by(rows);
    }
    /// The sink committed a batch of `table` in `seconds`.
    pub fn committed(&self, table: &str, seconds: f64) {
        let labels = SinkTableLabels {
            of: self.labels.clone(),
            table: Text::new(table),
        };
        self.commit_duration.get_or_create(&labels).observe(seconds);
    }
    /// A retryable answer was retried.
    pub fn retry(&self) {
        self.retries.inc();
    }
    /// The instance trapped (including a memory blow-up).
    pub fn trap(&self) {
        self.traps.inc();
    }
    /// A call overran its CPU deadline or its wall-clock bound.
    pub fn deadline_hit(&self) {
        self.deadline_hits.inc();
    }
    /// The instance's linear memory now; the high-water mark is kept.
    pub fn memory(&self, bytes: u64) {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.memory_high_water
            .inner()
            .fetch_max(bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tenant_page_holds_only_its_own_series() {
        let metrics = Metrics::new();
        metrics.pipeline("a", "orders").restarted();
        // A table name made to look like another tenant's label.
        metrics
            .pipeline("b", "secret-pipeline")
            .rows_in("x\",tenant=\"a", 1);
        let page = metrics.render_for_tenant("a");
        assert!(page.contains("pipeline=\"orders\""), "{page}");
        assert!(!page.contains("secret-pipeline"), "{page}");
        assert!(page.ends_with("# EOF\n"), "{page}");
        assert!(metrics.render().contains("secret-pipeline"));
        assert_eq!(
            super::label_value(r#"m{a="x\"y",tenant="b"} 1"#, "tenant").as_deref(),
            Some("b")
        );
    }

    use super::*;

    /// The sample lines of `page` for metric `name` (exactly, or with a
    /// histogram's suffixes) whose labels hold every one of `labels`.
    fn samples<'p>(page: &'p str, name: &str, labels: &[&str]) -> Vec<&'p str> {
        page.lines()
            .filter(|line| {
                !line.starts_with('#')
                    && line
                        .strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(['{', ' ', '_']))
                    && labels.iter().all(|l| line.contains(l))
            })
            .collect()
    }

    /// The value of the one sample of `name` with `labels`.
    fn value(page: &str, name: &str, labels: &[&str]) -> f64 {
        let found = samples(page, name, labels);
        assert_eq!(found.len(), 1, "{name} {labels:?} in:\n{page}");
        found[0].rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn values_move_and_the_page_holds_them() {
        let metrics = Metrics::new();
        let orders = metrics.pipeline("acme", "orders");
        let lake = orders.sink("lake");
        let t = r#"table="public.orders""#;

        orders.rows_in("public.orders", 10);
        orders.rows_in("public.orders", 5);
        orders.commit_seconds("public.orders", 0.005);
        orders.commit_seconds("public.orders", 12.0);
        orders.source_lag(Some(4096), Some(1.5));
        orders.source_lag(None, None);
        orders.swap("lake", "swapped");
        orders.swap("lake", "refused");
        orders.swap("lake", "refused");
        orders.state("running");
        orders.restarted();
        lake.written("public.orders", 15, 2048);
        lake.dead_lettered("public.orders", 2);
        lake.dead_lettered("public.orders", 1);
        lake.committed("public.orders", 0.25);
        lake.retry();
        lake.retry();
        lake.trap();
        lake.deadline_hit();
        lake.memory(3 << 20);
        lake.memory(1 << 20);

        let page = metrics.render();
        assert!(page.ends_with("# EOF\n"), "{page}");
        let p = ["tenant=\"acme\"", "pipeline=\"orders\""];
        let s = [p[0], p[1], "sink=\"lake\""];
        assert_eq!(value(&page, "weir_rows_in_total", &[p[0], p[1], t]), 15.0);
        assert_eq!(value(&page, "weir_rows_out_total", &[s[0], s[2], t]), 15.0);
        assert_eq!(
            value(&page, "weir_written_bytes_total", &[s[0], s[2], t]),
            2048.0
        );
        assert_eq!(
            value(&page, "weir_dead_letter_rows_total", &[s[0], s[2], t]),
            3.0
        );
        assert_eq!(
            value(&page, "weir_sink_commit_duration_seconds_count", &[s[2], t]),
            1.0
        );
        assert_eq!(
            value(&page, "weir_sink_commit_duration_seconds_sum", &[s[2], t]),
            0.25
        );
        assert_eq!(
            value(&page, "weir_commit_duration_seconds_count", &[t]),
            2.0
        );
        assert_eq!(
            value(&page, "weir_commit_duration_seconds_sum", &[t]),
            12.005
        );
        // Buckets double from 1 ms: 5 ms counts from the 8 ms one on, 12 s
        // from the 16.384 s one.
        let bucket = |le: &str| {
            let le = format!("le=\"{le}\"");
            value(&page, "weir_commit_duration_seconds_bucket", &[t, &le])
        };
        assert_eq!(bucket("0.001"), 0.0);
        assert_eq!(bucket("0.004"), 0.0);
        assert_eq!(bucket("0.008"), 1.0);
        assert_eq!(bucket("8.192"), 1.0);
        assert_eq!(bucket("16.384"), 2.0);
        assert_eq!(bucket("32.768"), 2.0);
        assert_eq!(bucket("+Inf"), 2.0);
        // None left the lag as it was.
        assert_eq!(value(&page, "weir_source_lag_bytes", &p), 4096.0);
        assert_eq!(value(&page, "weir_source_lag_seconds", &p), 1.5);
        assert_eq!(value(&page, "weir_sink_retries_total", &s), 2.0);
        assert_eq!(value(&page, "weir_sink_traps_total", &s), 1.0);
        assert_eq!(value(&page, "weir_sink_deadline_hits_total", &s), 1.0);
        assert_eq!(
            value(&page, "weir_sink_memory_high_water_bytes", &s),
            (3 << 20) as f64
        );
        let outcome = |o: &str| format!("outcome=\"{o}\"");
        assert_eq!(
            value(
                &page,
                "weir_plugin_swaps_total",
                &[s[2], &outcome("refused")]
            ),
            2.0
        );
        assert_eq!(
            value(
                &page,
                "weir_plugin_swaps_total",
                &[s[2], &outcome("swapped")]
            ),
            1.0
        );
        assert_eq!(value(&page, "weir_pipeline_restarts_total", &p), 1.0);
        assert!(page.contains("# TYPE weir_rows_in counter\n"), "{page}");
        assert!(
            page.contains("# TYPE weir_commit_duration_seconds histogram\n"),
            "{page}"
        );
        assert!(
            page.contains("# TYPE weir_sink_memory_high_water_bytes gauge\n"),
            "{page}"
        );
    }

    #[test]
    fn the_state_is_one_hot() {
        let metrics = Metrics::new();
        let orders = metrics.pipeline("acme", "orders");
        let state = |name: &str| {
            let page = metrics.render();
            value(
                &page,
                "weir_pipeline_state",
                &[&format!("state=\"{name}\"")],
            )
        };
        // Every state is reported from the start, all 0.
        for name in STATES {
            assert_eq!(state(name), 0.0, "{name}");
        }
        orders.state("running");
        orders.state("backoff");
        for name in STATES {
            assert_eq!(state(name), f64::from(*name == "backoff"), "{name}");
        }
    }

    #[test]
    fn pipelines_and_sinks_are_told_apart_and_a_second_handle_shares_the_series() {
        let metrics = Metrics::new();
        metrics.pipeline("acme", "orders").rows_in("t", 1);
        metrics.pipeline("acme", "orders").rows_in("t", 2);
        metrics.pipeline("globex", "orders").rows_in("t", 7);
        let orders = metrics.pipeline("acme", "orders");
        orders.sink("a").retry();
        orders.sink("b").memory(10);
        orders.sink("b").memory(20);
        let page = metrics.render();
        let rows = |tenant: &str| {
            value(
                &page,
                "weir_rows_in_total",
                &[&format!("tenant=\"{tenant}\"")],
            )
        };
        assert_eq!(rows("acme"), 3.0);
        assert_eq!(rows("globex"), 7.0);
        assert_eq!(
            value(&page, "weir_sink_retries_total", &["sink=\"a\""]),
            1.0
        );
        assert_eq!(
            value(&page, "weir_sink_retries_total", &["sink=\"b\""]),
            0.0
        );
        assert_eq!(
            value(&page, "weir_sink_memory_high_water_bytes", &["sink=\"b\""]),
            20.0
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::new();
        let forged = "x\"} 1\nweir_forged_total 99\n\\";
        metrics.pipeline("acme", forged).rows_in("t", 4);
        let page = metrics.render();
        assert!(!page.contains("\nweir_forged_total"), "{page}");
        let line = page
            .lines()
            .find(|l| l.starts_with("weir_rows_in_total{"))
            .expect("a rows line");
        assert_eq!(
            line,
            r#"weir_rows_in_total{tenant="acme",pipeline="x\"} 1\nweir_forged_total 99\n\\",table="t"} 4"#
        );
    }

    #[test]
    fn a_detached_handle_records_without_a_page() {
        let orders = PipelineMetrics::detached();
        orders.rows_in("t", 3);
        orders.state("running");
        let sink = orders.sink("s");
        sink.written("t", 3, 30);
        sink.memory(5);
        assert_eq!(sink.memory_high_water.get(), 5);
        assert_eq!(orders.states[1].get(), 1);
        assert_eq!(
            orders
                .families
                .rows_in
                .get_or_create(&orders.table("t"))
                .get(),
            3
        );
    }

    #[test]
    fn a_forgotten_pipeline_leaves_the_page() {
        let metrics = Metrics::new();
        let gone = metrics.pipeline("t", "gone");
        let kept = metrics.pipeline("t", "kept");
        for p in [&gone, &kept] {
            p.rows_in("orders", 3);
            p.commit_seconds("orders", 0.01);
            p.source_lag(Some(5), Some(0.5));
            p.swap("lake", "swapped");
            p.sink("lake").written("orders", 3, 100);
            p.sink("lake").retry();
        }
        gone.forget(&["lake".to_string()], &["orders".to_string()]);
        let page = metrics.render();
        assert!(!page.contains("pipeline=\"gone\""), "{page}");
        assert!(page.contains("pipeline=\"kept\""), "{page}");
    }

    #[test]
    fn the_process_and_the_build_are_on_the_operators_page_only() {
        // Enough CPU time to be counted: the kernel counts in ticks of 10 ms.
        let busy = std::time::Instant::now();
        let mut spun = 0u64;
        while busy.elapsed() < std::time::Duration::from_millis(50) {
            spun = std::hint::black_box(spun.wrapping_add(1));
        }
        let metrics = Metrics::new();
        metrics.pipeline("acme", "orders").restarted();
        let page = metrics.render();
        let version = format!(
            "weir_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(page.contains(&version), "{page}");
        let cpu = value(&page, "process_cpu_seconds_total", &[]);
        assert!(cpu > 0.0, "{page}");
        let resident = value(&page, "process_resident_memory_bytes", &[]);
        assert!(resident > f64::from(1 << 20), "{page}");
        let (open, max) = (
            value(&page, "process_open_fds", &[]),
            value(&page, "process_max_fds", &[]),
        );
        assert!(open >= 3.0 && max >= open, "{page}");
        assert!(value(&page, "process_threads", &[]) >= 1.0, "{page}");
        let tenant = metrics.render_for_tenant("acme");
        assert!(!tenant.contains("process_cpu_seconds_total "), "{tenant}");
        assert!(tenant.contains("weir_pipeline_restarts_total{"), "{tenant}");
    }
}

/// The metrics of a host's part in a cluster (no tenant label: a tenant's
/// token does not see them).
#[derive(Clone)]
pub struct ClusterMetrics {
    assignments: Gauge,
    claims: Counter,
    renewals: Family<OutcomeLabels, Counter>,
    renewal_duration: Histogram,
    fenced_writes: Counter,
    leader: Gauge,
}

impl ClusterMetrics {
    /// A handle nothing renders (tests, and hosts outside a registry).
    pub fn detached() -> ClusterMetrics {
        ClusterMetrics {
            assignments: Gauge::default(),
            claims: Counter::default(),
            renewals: Family::default(),
            renewal_duration: commit_histogram(),
            fenced_writes: Counter::default(),
            leader: Gauge::default(),
        }
    }

    pub fn assignments(&self, held: usize) {
        self.assignments.set(held as i64);
    }

    pub fn claimed(&self) {
        self.claims.inc();
    }

    /// A renewal ended: `renewed`, `failed` or `expired`, and how long
    /// etcd took to answer.
    pub fn renewal(&self, outcome: &str, seconds: f64) {
        self.renewals
            .get_or_create(&OutcomeLabels {
                outcome: Text::new(outcome),
            })
            .inc();
        self.renewal_duration.observe(seconds);
    }

    pub fn fenced(&self) {
        self.fenced_writes.inc();
    }

    pub fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}
