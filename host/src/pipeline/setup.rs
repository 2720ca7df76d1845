//! What a run needs, built from the pipeline config: the source, the sink
//! workers, the table descriptions sinks are told, and the batcher.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use weir_contract::{MetadataColumn, Mode};

use super::{RunError, RunOptions};
use crate::batch::{BatchLimits, Batcher};
use crate::change::TableSchema;
use crate::commit::SinkSpec;
use crate::config::{PipelineConfig, SinkConfig, SourceConfig};
use crate::runtime::{
    BlobScope, Limits, Plugin, SinkWorker, TableDescription, WasmEngine, WorkerSpec, plugin,
};
use crate::source::Source;
use crate::source::generator::{Generator, GeneratorConfig};
use crate::source::postgres::{PostgresSettings, PostgresSource};

/// Builds the configured source.
pub fn make_source(
    config: &PipelineConfig,
    options: &RunOptions,
    io: &tokio::runtime::Handle,
) -> Result<Box<dyn Source>, RunError> {
    match &config.source {
        SourceConfig::Postgres(pg) => {
            let settings = PostgresSettings {
                config: pg.clone(),
                append_tables: config
                    .tables
                    .iter()
                    .filter(|(_, table)| table.mode == Mode::Append)
                    .map(|(name, _)| name.clone())
                    .collect(),
                state_dir: config.state_dir(),
                io: io.clone(),
            };
            Ok(Box::new(PostgresSource::open(settings)?))
        }
        SourceConfig::Generator(g) => Ok(Box::new(Generator::new(GeneratorConfig {
            seed: g.seed,
            max_changes: options.max_changes.or(g.max_changes),
        }))),
    }
}

/// The loaded sinks of a pipeline, in config order.
pub struct Sinks {
    /// None for an optional sink that could not start.
    pub workers: Vec<Option<SinkWorker>>,
    pub specs: Vec<SinkSpec>,
    /// Optional sinks that could not even start, with the reason.
    pub failed_to_start: BTreeMap<String, String>,
}

/// Loads, checks and starts every sink of the pipeline. A required sink
/// that cannot start fails the run; an optional one is left out of it.
pub fn start_sinks(
    config: &PipelineConfig,
    engine: &WasmEngine,
    io: &tokio::runtime::Handle,
) -> Result<Sinks, RunError> {
    let linker = plugin::linker(engine)?;
    let mut sinks = Sinks {
        workers: Vec::new(),
        specs: Vec::new(),
        failed_to_start: BTreeMap::new(),
    };
    for sink in &config.sinks {
        match start_sink(config, sink, engine, &linker, io) {
            Ok(worker) => {
                sinks.specs.push(SinkSpec {
                    name: sink.name.clone(),
                    required: sink.required,
                    positioned: worker.info.positioned(),
                });
                sinks.workers.push(Some(worker));
            }
            Err(detail) if sink.required => {
                return Err(RunError::Sink {
                    sink: sink.name.clone(),
                    detail,
                });
            }
            Err(detail) => {
                tracing::error!(sink = %sink.name, "optional sink disabled: {detail}");
                sinks.failed_to_start.insert(sink.name.clone(), detail);
                sinks.specs.push(SinkSpec {
                    name: sink.name.clone(),
                    required: false,
                    positioned: false,
                });
                sinks.workers.push(None);
            }
        }
    }
    Ok(sinks)
}

fn start_sink(
    config: &PipelineConfig,
    sink: &SinkConfig,
    engine: &WasmEngine,
    linker: &plugin::SinkLinker,
    io: &tokio::runtime::Handle,
) -> Result<SinkWorker, String> {
    let path = config.resolve(&sink.plugin);
    let loaded =
        Plugin::load(engine, linker, &path, sink.sha256.as_deref()).map_err(|e| e.to_string())?;
    let options: Vec<(String, String)> = sink
        .blob_store
        .options
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let blob = BlobScope::open(&sink.blob_store.url, &options, &config.base_dir, io.clone())
        .map_err(|e| e.to_string())?;
    SinkWorker::start(WorkerSpec {
        name: sink.name.clone(),
        plugin: Arc::new(loaded),
        blob: Arc::new(blob),
        limits: Limits {
            memory_bytes: (sink.limits.memory_mb << 20) as usize,
            call_timeout: Duration::from_millis(sink.limits.call_timeout_ms),
        },
        retries: sink.retries,
        pipeline: config.pipeline.clone(),
        config: sink
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
    .map_err(|e| format!("failed to start: {e}"))
}

/// What every sink is told about each source table: its key, its mode (a
/// keyless table is always appended), its destination name and the context
/// columns it carries. Refuses table mappings that name no source table.
pub fn describe_tables(
    config: &PipelineConfig,
    tables: &[Arc<TableSchema>],
) -> Result<HashMap<String, Arc<TableDescription>>, RunError> {
    for name in config.tables.keys() {
        if !tables.iter().any(|t| &t.name == name) {
            let known: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
            return Err(RunError::Setup(format!(
                "tables.{name}: the source has no such table (it has: {})",
                known.join(", ")
            )));
        }
    }
    let metadata = metadata_columns(config);
    crate::batch::validate_metadata(tables, &metadata).map_err(RunError::Setup)?;
    Ok(tables
        .iter()
        .map(|t| {
            let mapping = config.tables.get(&t.name).cloned().unwrap_or_default();
            let description = TableDescription {
                name: t.name.clone(),
                key_columns: t.key_names(),
                mode: Mode::for_table(mapping.mode, !t.key.is_empty()),
                destination: mapping.destination.unwrap_or_else(|| t.name.clone()),
                metadata: metadata.clone(),
            };
            (t.name.clone(), Arc::new(description))
        })
        .collect())
}

fn metadata_columns(config: &PipelineConfig) -> Vec<MetadataColumn> {
    config
        .metadata
        .iter()
        .map(|m| MetadataColumn {
            field: m.from,
            name: m.name.clone(),
        })
        .collect()
}

/// The batcher for the run: the config's limits and context columns, and
/// every change kept for tables applied as an append-only log.
pub fn batcher(
    config: &PipelineConfig,
    tables: &[Arc<TableSchema>],
    descriptions: &HashMap<String, Arc<TableDescription>>,
) -> Batcher {
    let mut batcher = Batcher::new(
        tables.to_vec(),
        BatchLimits {
            max_rows: config.batch.max_rows,
            max_bytes: config.batch.max_bytes,
            linger: config.batch.linger(),
        },
        metadata_columns(config),
    );
    for (name, description) in descriptions {
        if description.mode == Mode::Append {
            batcher.keep_every_change(name);
        }
    }
    batcher
}
