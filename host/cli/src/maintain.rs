//! `weir maintain`: runs the maintenance a sink exports (for the Iceberg
//! sink: compaction and snapshot expiry) on the destinations of one
//! pipeline, on demand.
//!
//! It needs neither the source nor the position store, so it runs beside
//! a `weir run` of the same pipeline: the sink commits every change of its
//! destination atomically against the version it read (the Iceberg sink:
//! `put_if_absent` of the next metadata version), so the two writers race
//! safely, the loser plans again. The sink is loaded with the same grants
//! and limits as in the run.

use std::path::Path;
use std::sync::Arc;

use weir_metrics::PipelineMetrics;
use weir_pipeline::config::{PipelineConfig, SinkConfig};
use weir_pipeline::setup::{SinkParts, sink_blob_scope};
use weir_runtime::capability::blob_faults::{BlobFaults, FaultKind};
use weir_runtime::{Plugin, SinkWorker, WasmEngine, plugin};

/// With the `failpoints` feature, `WEIR_MAINTAIN_CRASH_AT=N` makes the
/// sink die (trap) just before its N-th blob write of the maintenance, as
/// a kill at that moment would: the crash tests aim at every step of it.
const CRASH_VAR: &str = "WEIR_MAINTAIN_CRASH_AT";

/// What `weir maintain` was asked to do.
pub struct MaintainArgs<'a> {
    pub pipeline: &'a Path,
    /// Only this sink; otherwise every sink that exports maintenance.
    pub sink: Option<&'a str>,
    /// Source tables; empty for every table the pipeline wrote.
    pub tables: &'a [String],
    /// Kinds of work (`compact`, `expire`); empty for all the sink knows.
    pub what: Vec<String>,
}

/// One sink's answer.
pub struct Maintained {
    pub sink: String,
    pub report: String,
}

/// Runs the maintenance; `Err` is the sentence to print.
pub fn maintain(
    args: &MaintainArgs,
    io: &tokio::runtime::Handle,
) -> Result<Vec<Maintained>, String> {
    let crash_at = crash_from_env()?;
    let config = PipelineConfig::load(args.pipeline).map_err(|e| e.to_string())?;
    weir_pipeline::plugin_ref::refuse_uploaded(&config, "weir maintain")?;
    let sinks: Vec<&SinkConfig> = match args.sink {
        Some(name) => {
            let found = config.sinks.iter().find(|s| s.name == name);
            let Some(sink) = found else {
                let names: Vec<&str> = config.sinks.iter().map(|s| s.name.as_str()).collect();
                return Err(format!(
                    "pipeline `{}` has no sink `{name}` (its sinks: {})",
                    config.pipeline,
                    names.join(", ")
                ));
            };
            vec![sink]
        }
        None => config.sinks.iter().collect(),
    };
    let engine = WasmEngine::new(&config.cache_dir()).map_err(|e| e.to_string())?;
    let linker = plugin::linker(&engine).map_err(|e| e.to_string())?;
    let mut done = Vec::new();
    let mut without = Vec::new();
    for sink in sinks {
        let plugin_path = config.resolve(&sink.plugin);
        let grants = Arc::new(sink.grants.parse()?);
        let loaded = Plugin::load(
            &engine,
            &linker,
            &plugin_path,
            sink.sha256.as_deref(),
            &sink.limits.compile_limits(),
            &grants,
        )
        .map_err(|e| format!("sink `{}`: {e}", sink.name))?;
        if !loaded
            .info
            .exports(weir_runtime::OptionalExport::Maintenance)
        {
            without.push(format!("`{}` ({})", sink.name, plugin_path.display()));
            continue;
        }
        let worker = start(&config, sink, loaded, grants, io, crash_at)?;
        let report = worker
            .maintain(&config.pipeline, args.tables, &args.what)
            .wait()
            .map_err(|e| {
                format!(
                    "pipeline `{}`, sink `{}`: maintenance failed: {e}; nothing the pipeline \
                     committed is lost (run it again to finish)",
                    config.pipeline, sink.name
                )
            })?
            .ok_or_else(|| format!("sink `{}` stopped exporting maintenance", sink.name))?;
        done.push(Maintained {
            sink: sink.name.clone(),
            report,
        });
    }
    if done.is_empty() {
        return Err(format!(
            "pipeline `{}`: no sink to maintain: {} {} not export the `maintenance` interface \
             (rebuild it with `export_positioned_sink!(T, maintenance)` if it should)",
            config.pipeline,
            without.join(", "),
            if without.len() == 1 { "does" } else { "do" }
        ));
    }
    for name in without {
        tracing::info!("sink {name} does not export maintenance; skipped");
    }
    Ok(done)
}

/// Starts the sink's worker with the grants and limits of the pipeline
/// file (and the planned crash of a crash test).
fn start(
    config: &PipelineConfig,
    sink: &SinkConfig,
    loaded: Plugin,
    grants: Arc<weir_runtime::network::NetworkGrants>,
    io: &tokio::runtime::Handle,
    crash_at: Option<u64>,
) -> Result<SinkWorker, String> {
    let mut blob = sink_blob_scope(config, sink, io)?;
    if let Some(at) = crash_at {
        let faults = Arc::new(BlobFaults::default());
        faults.arm(FaultKind::Crash, at);
        blob = blob.with_faults(faults);
    }
    let spec = SinkParts {
        loaded,
        blob,
        grants,
        metrics: PipelineMetrics::detached().sink(&sink.name),
        tenant: None,
    }
    .spec(config, sink);
    SinkWorker::start(spec).map_err(|e| format!("sink `{}` failed to start: {e}", sink.name))
}

fn crash_from_env() -> Result<Option<u64>, String> {
    let Ok(spec) = std::env::var(CRASH_VAR) else {
        return Ok(None);
    };
    if !cfg!(feature = "failpoints") {
        return Err(format!(
            "{CRASH_VAR}={spec}: this weir was built without crash points \
             (build it with `--features failpoints`)"
        ));
    }
    spec.parse()
        .ok()
        .filter(|n| *n >= 1)
        .map(Some)
        .ok_or_else(|| format!("{CRASH_VAR}={spec}: the write to crash at must be 1 or more"))
}
