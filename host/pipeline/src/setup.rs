//! What a run needs, built from the pipeline config: the source, the sink
//! workers, the table descriptions sinks are told, and the batcher.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use weir_contract::{MetadataColumn, Mode};

use super::{RunError, RunOptions};
use crate::config::{PipelineConfig, SinkConfig, SourceConfig};
use crate::dead_letter::DeadLetter;
use weir_core::commit::{SinkId, SinkSpec};
use weir_metrics::PipelineMetrics;
use weir_runtime::network::SinkNetwork;
use weir_runtime::{
    BlobScope, Plugin, SinkWorker, TableDescription, TenantShare, WasmEngine, WorkerSpec, plugin,
};
use weir_source::Source;
use weir_source::batch::{BatchLimits, Batcher};
use weir_source::change::TableSchema;
use weir_source::generator::{Generator, GeneratorConfig};
use weir_source::mysql::{MysqlSettings, MysqlSource};
use weir_source::postgres::{PieceLimits, PostgresSettings, PostgresSource};

/// Builds the configured source. `stop` is the run's stop flag: a source
/// waiting for a server that is away gives up when it is set.
pub fn make_source(
    config: &PipelineConfig,
    options: &RunOptions,
    io: &tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> Result<Box<dyn Source>, RunError> {
    match &config.source {
        SourceConfig::Postgres(pg) => {
            let settings = PostgresSettings {
                config: pg.clone(),
                append_tables: append_tables(config),
                state_dir: config.state_dir(),
                io: io.clone(),
                take_over_slot: options.take_over_source,
                stop,
            };
            // A transaction bigger than a batch is handed on in pieces of
            // a batch, so memory does not grow with it.
            let pieces = PieceLimits {
                changes: config.batch.max_rows,
                bytes: config.batch.max_bytes,
            };
            Ok(Box::new(
                PostgresSource::open(settings)?.with_piece_limits(pieces),
            ))
        }
        SourceConfig::Mysql(my) => {
            let settings = MysqlSettings {
                config: my.clone(),
                pipeline: config.pipeline.clone(),
                append_tables: append_tables(config),
                state_dir: config.state_dir(),
                io: io.clone(),
                stop,
            };
            let pieces = PieceLimits {
                changes: config.batch.max_rows,
                bytes: config.batch.max_bytes,
            };
            Ok(Box::new(
                MysqlSource::open(settings)?.with_piece_limits(pieces),
            ))
        }
        SourceConfig::Generator(g) => Ok(Box::new(Generator::new(GeneratorConfig {
            seed: g.seed,
            max_changes: options.max_changes.or(g.max_changes),
        }))),
    }
}

/// The tables the pipeline writes in append mode.
fn append_tables(config: &PipelineConfig) -> std::collections::BTreeSet<String> {
    config
        .tables
        .iter()
        .filter(|(_, table)| table.mode == Mode::Append)
        .map(|(name, _)| name.clone())
        .collect()
}

/// The loaded sinks of a pipeline, in config order.
pub struct Sinks {
    /// None for an optional sink that could not start.
    pub workers: Vec<Option<SinkWorker>>,
    pub specs: Vec<SinkSpec>,
    /// Optional sinks that could not even start, with the reason.
    pub failed_to_start: BTreeMap<String, String>,
    /// Each sink's dead-letter valve, where its `dead_letter` is set.
    pub dead_letters: Vec<Option<DeadLetter>>,
}

impl Sinks {
    /// The sinks that could not start, by index, with the reason: what
    /// recovery needs to leave them out of the run.
    pub fn not_started(&self) -> Vec<(SinkId, String)> {
        self.workers
            .iter()
            .enumerate()
            .filter(|(_, worker)| worker.is_none())
            .map(|(sink, _)| {
                let name = &self.specs[sink].name;
                let reason = self.failed_to_start.get(name).cloned().unwrap_or_default();
                (sink, reason)
            })
            .collect()
    }
}

/// What starts sink workers: the engine, a linker made once, the I/O
/// runtime, and what every worker of this pipeline reports into and shares.
pub struct SinkFactory<'a> {
    engine: &'a WasmEngine,
    linker: plugin::SinkLinker,
    io: tokio::runtime::Handle,
    metrics: PipelineMetrics,
    tenant: Option<Arc<TenantShare>>,
}

impl<'a> SinkFactory<'a> {
    pub fn new(
        engine: &'a WasmEngine,
        io: &tokio::runtime::Handle,
        metrics: PipelineMetrics,
        tenant: Option<Arc<TenantShare>>,
    ) -> Result<Self, RunError> {
        Ok(SinkFactory {
            engine,
            linker: plugin::linker(engine)?,
            io: io.clone(),
            metrics,
            tenant,
        })
    }

    /// Loads `sink`'s plugin from `plugin` (pinned to `sha256` if given),
    /// checks it against the contract and its grants, instantiates it and
    /// calls its `open`. Whatever fails is said in the error.
    pub fn start(
        &self,
        config: &PipelineConfig,
        sink: &SinkConfig,
        plugin: &Path,
        sha256: Option<&str>,
    ) -> Result<SinkWorker, String> {
        // Checked when the pipeline file was read; this only converts.
        let grants = Arc::new(sink.grants.parse()?);
        let loaded = Plugin::load(
            self.engine,
            &self.linker,
            plugin,
            sha256,
            &sink.limits.compile_limits(),
            &grants,
        )
        .map_err(|e| e.to_string())?;
        let mut blob = sink_blob_scope(config, sink, &self.io)?;
        if let Some(share) = &self.tenant {
            blob = blob.with_tenant(share.clone());
        }
        let spec = SinkParts {
            loaded,
            blob,
            grants,
            metrics: self.metrics.sink(&sink.name),
            tenant: self.tenant.clone(),
        }
        .spec(config, sink);
        SinkWorker::start(spec).map_err(|e| format!("failed to start: {e}"))
    }
}

impl SinkFactory<'_> {
    /// `sink`'s dead-letter valve, if its entry sets one.
    pub fn dead_letter(
        &self,
        config: &PipelineConfig,
        sink: &SinkConfig,
    ) -> Result<Option<DeadLetter>, RunError> {
        let Some(valve) = &sink.dead_letter else {
            return Ok(None);
        };
        let store = open_scope(&valve.url, &valve.options, config, &self.io).map_err(|e| {
            RunError::Sink {
                sink: sink.name.clone(),
                detail: format!("dead_letter.url `{}`: {e}", valve.url),
            }
        })?;
        Ok(Some(DeadLetter::new(
            &config.pipeline,
            &sink.name,
            valve.clone(),
            store,
        )))
    }
}

/// The blob-store root the pipeline file grants `sink`, with its limits.
pub fn sink_blob_scope(
    config: &PipelineConfig,
    sink: &SinkConfig,
    io: &tokio::runtime::Handle,
) -> Result<BlobScope, String> {
    let url = &sink.blob_store.url;
    Ok(open_scope(url, &sink.blob_store.options, config, io)
        .map_err(|e| e.to_string())?
        .with_limits(sink.limits.blob_limits(&sink.name, url)))
}

/// A blob-store root at `url` with its object-store `options`, relative
/// paths taken from the pipeline file's folder.
fn open_scope(
    url: &str,
    options: &BTreeMap<String, String>,
    config: &PipelineConfig,
    io: &tokio::runtime::Handle,
) -> Result<BlobScope, weir_runtime::capability::blobstore::ScopeError> {
    let options: Vec<(String, String)> = options
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    BlobScope::open(url, &options, &config.base_dir, io.clone())
}

/// What a sink's worker is started with besides its pipeline-file entry;
/// `weir run` and `weir maintain` start sinks alike from it.
pub struct SinkParts {
    pub loaded: Plugin,
    pub blob: BlobScope,
    pub grants: Arc<weir_runtime::network::NetworkGrants>,
    pub metrics: weir_metrics::SinkMetrics,
    pub tenant: Option<Arc<TenantShare>>,
}

impl SinkParts {
    /// The worker spec: the parts, with the limits, retries and `config`
    /// map of `sink`'s entry.
    pub fn spec(self, config: &PipelineConfig, sink: &SinkConfig) -> WorkerSpec {
        WorkerSpec {
            name: sink.name.clone(),
            plugin: Arc::new(self.loaded),
            blob: Arc::new(self.blob),
            network: SinkNetwork::new(&sink.name, self.grants, sink.limits.network_limits()),
            limits: sink.limits.call_limits(),
            retries: sink.retries,
            pipeline: config.pipeline.clone(),
            config: sink
                .config
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            metrics: self.metrics,
            tenant: self.tenant,
        }
    }
}

/// Loads, checks and starts every sink of the pipeline. A required sink
/// that cannot start fails the run; an optional one is left out of it.
pub fn start_sinks(config: &PipelineConfig, factory: &SinkFactory) -> Result<Sinks, RunError> {
    crate::plugin_ref::refuse_uploaded(config, "weir run").map_err(RunError::Setup)?;
    check_roots(config)?;
    let mut sinks = Sinks {
        workers: Vec::new(),
        specs: Vec::new(),
        failed_to_start: BTreeMap::new(),
        dead_letters: Vec::new(),
    };
    for sink in &config.sinks {
        sinks.dead_letters.push(factory.dead_letter(config, sink)?);
        let plugin = config.resolve(&sink.plugin);
        match factory.start(config, sink, &plugin, sink.sha256.as_deref()) {
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

/// An endpoint as compared: scheme, host and port (the scheme's default
/// when left out), and its path without a trailing `/`, in lower case.
fn normal_endpoint(endpoint: &str) -> String {
    match url::Url::parse(endpoint.trim()) {
        Ok(url) => format!(
            "{}://{}:{}{}",
            url.scheme(),
            url.host_str().unwrap_or_default().to_ascii_lowercase(),
            url.port_or_known_default().unwrap_or_default(),
            url.path().trim_end_matches('/')
        ),
        Err(_) => endpoint.trim().trim_end_matches('/').to_ascii_lowercase(),
    }
}

/// Where a sink's root lies, to tell whether two roots overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RootPlace {
    /// A folder, absolute, with links resolved as far as it exists.
    Local(PathBuf),
    /// An object store: its scheme, bucket (host) and endpoint, and the
    /// prefix's segments.
    Remote { store: String, prefix: Vec<String> },
    /// `memory://`: every sink gets a store of its own.
    Memory,
}

impl RootPlace {
    fn of(sink: &SinkConfig, base_dir: &Path) -> RootPlace {
        RootPlace::of_url(&sink.blob_store.url, &sink.blob_store.options, base_dir)
    }

    fn of_url(url: &str, options: &BTreeMap<String, String>, base_dir: &Path) -> RootPlace {
        if url == "memory://" || url == "memory:" {
            return RootPlace::Memory;
        }
        let local = match url.strip_prefix("file://") {
            Some(rest) => Some(rest),
            None if !url.contains("://") => Some(url),
            None => None,
        };
        if let Some(path) = local {
            return RootPlace::Local(resolved(&base_dir.join(path)));
        }
        let Ok(parsed) = url::Url::parse(url) else {
            // BlobScope::open refuses it with the parser's word.
            return RootPlace::Memory;
        };
        // One endpoint may be spelled several ways (`aws_endpoint`,
        // `endpoint_url`, a trailing `/`, upper case): compared as parsed.
        let mut endpoints: Vec<String> = options
            .iter()
            .filter(|(key, _)| key.to_ascii_lowercase().contains("endpoint"))
            .map(|(_, value)| normal_endpoint(value))
            .collect();
        endpoints.sort();
        endpoints.dedup();
        RootPlace::Remote {
            store: format!(
                "{}://{}{:?}",
                parsed.scheme(),
                parsed.host_str().unwrap_or_default(),
                endpoints
            ),
            prefix: parsed
                .path_segments()
                .map(|s| s.filter(|s| !s.is_empty()).map(str::to_owned).collect())
                .unwrap_or_default(),
        }
    }

    /// Whether one contains the other (a root contains itself).
    fn overlaps(&self, other: &RootPlace) -> bool {
        match (self, other) {
            (RootPlace::Local(a), RootPlace::Local(b)) => a.starts_with(b) || b.starts_with(a),
            (
                RootPlace::Remote { store, prefix },
                RootPlace::Remote {
                    store: other_store,
                    prefix: other_prefix,
                },
            ) => {
                store == other_store
                    && (prefix.starts_with(other_prefix) || other_prefix.starts_with(prefix))
            }
            _ => false,
        }
    }

    fn contains(&self, path: &Path) -> bool {
        matches!(self, RootPlace::Local(root) if path.starts_with(root))
    }
}

/// An absolute form of `path` with links resolved as far as it exists (the
/// rest, not yet created, taken as written with `.` and `..` applied), so
/// two spellings of one folder compare equal.
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            let mut out = canonical;
            for part in rest.iter().rev() {
                match part {
                    Component::ParentDir => {
                        out.pop();
                    }
                    Component::Normal(name) => out.push(name),
                    _ => {}
                }
            }
            return out;
        }
        match (existing.parent(), existing.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last);
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// Refuses, before anything is loaded, blob roots that overlap the state
/// folder (which holds the position store and the compiled plugins), each
/// other, or a sink's plugin file: a sink may write anything under its
/// root, so overlap would let it rewrite another sink's data, the host's
/// positions, or code the host runs.
fn check_roots(config: &PipelineConfig) -> Result<(), RunError> {
    let state = resolved(&config.state_dir());
    let places: Vec<RootPlace> = config
        .sinks
        .iter()
        .map(|sink| RootPlace::of(sink, &config.base_dir))
        .collect();
    let shown = |place: &RootPlace, sink: &SinkConfig| match place {
        RootPlace::Local(path) => path.display().to_string(),
        _ => sink.blob_store.url.clone(),
    };
    let pipeline_file = resolved(&config.file);
    for (i, (sink, place)) in config.sinks.iter().zip(&places).enumerate() {
        if place.overlaps(&RootPlace::Local(state.clone())) {
            return Err(RunError::Setup(format!(
                "sinks[{i}].blob_store.url: the root of sink `{}` ({}) overlaps the state_dir \
                 ({}), which holds the position store and the compiled plugins; give the sink \
                 a root outside the state_dir, or move the state_dir",
                sink.name,
                shown(place, sink),
                state.display()
            )));
        }
        if !config.file.as_os_str().is_empty() && place.contains(&pipeline_file) {
            return Err(RunError::Setup(format!(
                "sinks[{i}].blob_store.url: the root of sink `{}` ({}) contains the pipeline \
                 file ({}), which the sink could rewrite to grant itself more; keep the \
                 pipeline file outside every root",
                sink.name,
                shown(place, sink),
                pipeline_file.display()
            )));
        }
    }
    for (i, (sink, place)) in config.sinks.iter().zip(&places).enumerate() {
        for (j, (other, other_place)) in config.sinks.iter().zip(&places).enumerate() {
            if j > i && place.overlaps(other_place) {
                return Err(RunError::Setup(format!(
                    "sinks[{j}].blob_store.url: the roots of sinks `{}` ({}) and `{}` ({}) \
                     overlap (one contains the other); each sink needs a root of its own",
                    sink.name,
                    shown(place, sink),
                    other.name,
                    shown(other_place, other)
                )));
            }
            let plugin = resolved(&config.resolve(&other.plugin));
            if place.contains(&plugin) {
                return Err(RunError::Setup(format!(
                    "sinks[{i}].blob_store.url: the root of sink `{}` ({}) contains the plugin \
                     of sink `{}` ({}), which the sink could replace; keep plugins outside \
                     every root",
                    sink.name,
                    shown(place, sink),
                    other.name,
                    plugin.display()
                )));
            }
        }
    }
    // The host writes a dead-letter location; no sink may reach it (it
    // could rewrite the record of what it refused), and it must not mix
    // with the host's state.
    for (i, sink) in config.sinks.iter().enumerate() {
        let Some(valve) = &sink.dead_letter else {
            continue;
        };
        let place = RootPlace::of_url(&valve.url, &valve.options, &config.base_dir);
        if place == RootPlace::Memory {
            continue;
        }
        let shown_valve = match &place {
            RootPlace::Local(path) => path.display().to_string(),
            _ => valve.url.clone(),
        };
        if place.overlaps(&RootPlace::Local(state.clone())) {
            return Err(RunError::Setup(format!(
                "sinks[{i}].dead_letter.url: `{shown_valve}` overlaps the state_dir ({}); give \
                 the dead-letter location a folder of its own",
                state.display()
            )));
        }
        for (other, other_place) in config.sinks.iter().zip(&places) {
            if place.overlaps(other_place) {
                return Err(RunError::Setup(format!(
                    "sinks[{i}].dead_letter.url: `{shown_valve}` overlaps the root of sink `{}` \
                     ({}), which could then rewrite what was set aside; give the dead-letter \
                     location a folder outside every sink's root",
                    other.name,
                    shown(other_place, other)
                )));
            }
        }
    }
    Ok(())
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
    weir_source::batch::validate_metadata(tables, &metadata).map_err(RunError::Setup)?;
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
