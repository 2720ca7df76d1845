//! The shell around the commit core: it reads the source, batches, and
//! carries out the core's actions against sink workers, the position store
//! and the source. Every decision is the core's; this file only does I/O.

pub mod sink_worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;

use crate::batch::{BatchLimits, Batcher, ContextField, Flush, MetadataColumn, TableBatch};
use crate::change::TableSchema;
use crate::commit::{
    Action, CommitPolicy, Core, Event, Failure, FailureKind, Resume, SinkId, SinkSpec, Stop,
};
use crate::config::{PipelineConfig, TableMode};
use crate::failpoint;
use crate::position::Position;
use crate::runtime::bindings::v0_1_0::types as wit;
use crate::runtime::plugin::{self, Limits};
use crate::runtime::{BlobScope, CallError, Plugin, SinkError, WasmEngine};
use crate::source::Source;
use crate::source::generator::{Generator, GeneratorConfig};
use crate::store::{Entry, PositionStore};
use sink_worker::{SinkWorker, WorkerSpec};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Stopped(#[from] Box<Stop>),
    #[error("sink `{sink}`: {detail}")]
    Sink { sink: String, detail: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Engine(#[from] crate::runtime::engine::EngineError),
    #[error("source: {0}")]
    Source(#[from] crate::source::SourceError),
    #[error("batching: {0}")]
    Batch(#[from] crate::batch::BatchError),
    #[error("{0}")]
    Setup(String),
}

/// Knobs a command line may set on top of the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides the generator's `max_changes` (a bounded run).
    pub max_changes: Option<u64>,
}

/// What a run did, for the command line to print.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunReport {
    pub pipeline: String,
    pub epoch: u64,
    pub resumed_after: Option<String>,
    pub transactions: u64,
    pub changes: u64,
    pub batches_committed: u64,
    pub checkpoint: Option<String>,
    /// Optional sinks that failed and were disabled, with the reason.
    pub disabled: BTreeMap<String, String>,
}

/// The tokio runtime that carries the blob stores' I/O; sink threads block
/// on it from outside.
pub fn io_runtime() -> Result<tokio::runtime::Runtime, RunError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("weir-io")
        .enable_all()
        .build()
        .map_err(|e| RunError::Setup(format!("cannot start the I/O runtime: {e}")))
}

/// Builds the configured source.
pub fn make_source(
    config: &PipelineConfig,
    options: &RunOptions,
) -> Result<Box<dyn Source>, RunError> {
    if let Some(pg) = &config.source.postgres {
        return Ok(Box::new(crate::source::postgres::PostgresSource::open(
            pg, config,
        )?));
    }
    let g = config.source.generator();
    Ok(Box::new(Generator::new(GeneratorConfig {
        seed: g.seed,
        max_changes: options.max_changes.or(g.max_changes),
    })))
}

/// The loaded sinks of a pipeline.
pub struct Sinks {
    pub workers: Vec<Option<SinkWorker>>,
    pub specs: Vec<SinkSpec>,
    /// Optional sinks that could not even start.
    pub failed_to_start: BTreeMap<String, String>,
}

/// Loads, checks and starts every sink of the pipeline.
pub fn start_sinks(
    config: &PipelineConfig,
    engine: &WasmEngine,
    io: &tokio::runtime::Handle,
) -> Result<Sinks, RunError> {
    let linker = plugin::linker(engine)?;
    let mut workers = Vec::new();
    let mut specs = Vec::new();
    let mut failed_to_start = BTreeMap::new();
    for sink in &config.sinks {
        let started = (|| -> Result<SinkWorker, String> {
            let path = config.resolve(&sink.plugin);
            let loaded = Plugin::load(engine, &linker, &path, sink.sha256.as_deref())
                .map_err(|e| e.to_string())?;
            let options: Vec<(String, String)> = sink
                .blob_store
                .options
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let blob =
                BlobScope::open(&sink.blob_store.url, &options, &config.base_dir, io.clone())
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
        })();
        match started {
            Ok(worker) => {
                specs.push(SinkSpec {
                    name: sink.name.clone(),
                    required: sink.required,
                    positioned: worker.info.positioned(),
                });
                workers.push(Some(worker));
            }
            Err(detail) if sink.required => {
                return Err(RunError::Sink {
                    sink: sink.name.clone(),
                    detail,
                });
            }
            Err(detail) => {
                tracing::error!(sink = %sink.name, "optional sink disabled: {detail}");
                failed_to_start.insert(sink.name.clone(), detail);
                specs.push(SinkSpec {
                    name: sink.name.clone(),
                    required: false,
                    positioned: false,
                });
                workers.push(None);
            }
        }
    }
    Ok(Sinks {
        workers,
        specs,
        failed_to_start,
    })
}

/// Runs a pipeline until its source ends (bounded) or `stop` is set.
pub fn run(
    config: &PipelineConfig,
    options: &RunOptions,
    stop: Arc<AtomicBool>,
) -> Result<RunReport, RunError> {
    let io = io_runtime()?;
    let store = PositionStore::open(&config.store_path())?;
    let epoch = store.next_epoch(&config.pipeline)?;
    let engine = WasmEngine::new(&config.cache_dir())?;
    let sinks = start_sinks(config, &engine, io.handle())?;
    let mut source = make_source(config, options)?;
    let tables = source.tables();
    let mut shell = Shell::new(config, epoch, sinks, &tables, store)?;
    tracing::info!(pipeline = %config.pipeline, epoch, "starting");

    let resume = shell.recover()?;
    let resumed_after = match &resume {
        Resume::FromStart => None,
        Resume::After(p) => Some(p.clone()),
    };
    source.resume_after(resumed_after.as_ref())?;
    shell.report.resumed_after = resumed_after.as_ref().map(ToString::to_string);

    let metadata = config
        .metadata
        .iter()
        .map(|m| {
            let field: ContextField = m
                .from
                .parse()
                .map_err(|e| RunError::Setup(format!("metadata: {e}")))?;
            Ok(MetadataColumn {
                field,
                name: m.name.clone(),
            })
        })
        .collect::<Result<Vec<_>, RunError>>()?;
    crate::batch::validate_metadata(&tables, &metadata).map_err(RunError::Setup)?;
    let mut batcher = Batcher::new(
        tables.clone(),
        BatchLimits {
            max_rows: config.batch.max_rows,
            max_bytes: config.batch.max_bytes,
            linger: config.batch.linger(),
        },
        metadata,
    );
    for (name, table) in &shell.tables {
        if table.mode == TableMode::Append.as_str() {
            batcher.keep_every_change(name);
        }
    }
    let pace = config.source.pace();
    let mut last_heartbeat = Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) {
            tracing::info!("stopping at a commit boundary");
            if let Some(flush) = batcher.flush(false) {
                shell.process(flush, source.as_mut())?;
            }
            break;
        }
        match source.next_transaction()? {
            Some(tx) => {
                // An empty transaction is a source heartbeat, not a transaction.
                shell.report.transactions += u64::from(!tx.changes.is_empty());
                shell.report.changes += tx.changes.len() as u64;
                for flush in batcher.push(tx)? {
                    shell.process(flush, source.as_mut())?;
                }
            }
            None => {
                if batcher.consumed().is_some()
                    && let Some(flush) = batcher.flush(true)
                {
                    shell.process(flush, source.as_mut())?;
                }
                break;
            }
        }
        let now = Instant::now();
        if batcher.linger_expired(now)
            && let Some(flush) = batcher.flush(false)
        {
            shell.process(flush, source.as_mut())?;
        }
        if now.duration_since(last_heartbeat) >= config.batch.heartbeat() {
            last_heartbeat = now;
            if batcher.consumed().is_some()
                && let Some(flush) = batcher.flush(true)
            {
                shell.process(flush, source.as_mut())?;
            }
        }
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
    }
    shell.report.checkpoint = shell.core.checkpoint().map(ToString::to_string);
    Ok(shell.report)
}

struct Shell {
    pipeline: String,
    core: Core,
    sinks: Vec<Option<SinkWorker>>,
    sink_names: Vec<String>,
    store: PositionStore,
    tables: HashMap<String, wit::Table>,
    report: RunReport,
}

impl Shell {
    fn new(
        config: &PipelineConfig,
        epoch: u64,
        sinks: Sinks,
        tables: &[Arc<TableSchema>],
        store: PositionStore,
    ) -> Result<Self, RunError> {
        for name in config.tables.keys() {
            if !tables.iter().any(|t| &t.name == name) {
                return Err(RunError::Setup(format!(
                    "tables.{name}: the source has no such table (it has: {})",
                    tables
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        let wit_tables = tables
            .iter()
            .map(|t| {
                let mapping = config.tables.get(&t.name).cloned().unwrap_or_default();
                let mode = if t.key.is_empty() {
                    TableMode::Append
                } else {
                    mapping.mode
                };
                let table = wit::Table {
                    name: t.name.clone(),
                    key_columns: t.key_names(),
                    mode: mode.as_str().to_string(),
                    destination: mapping.destination.unwrap_or_else(|| t.name.clone()),
                    metadata: config
                        .metadata
                        .iter()
                        .map(|m| wit::MetadataColumn {
                            source: m.from.replace('_', "-"),
                            name: m.name.clone(),
                        })
                        .collect(),
                };
                (t.name.clone(), table)
            })
            .collect();
        let policy: CommitPolicy = config.commit_policy.into();
        let core = Core::new(
            config.pipeline.clone(),
            epoch,
            policy,
            tables.iter().map(|t| t.name.clone()).collect(),
            sinks.specs.clone(),
        );
        let mut report = RunReport {
            pipeline: config.pipeline.clone(),
            epoch,
            ..Default::default()
        };
        report.disabled.extend(sinks.failed_to_start);
        Ok(Shell {
            pipeline: config.pipeline.clone(),
            core,
            sink_names: sinks.specs.iter().map(|s| s.name.clone()).collect(),
            sinks: sinks.workers,
            store,
            tables: wit_tables,
            report,
        })
    }

    /// Asks every positioned sink and the store where each table stands,
    /// repairs the store where the sink disagrees, and says where to resume.
    fn recover(&mut self) -> Result<Resume, RunError> {
        let mut repairs = Vec::new();
        let mut newest_sink_epoch: Option<u64> = None;
        let table_names: Vec<String> = self.tables.keys().cloned().collect();
        for sink in 0..self.sinks.len() {
            let name = self.sink_names[sink].clone();
            for table in &table_names {
                let from_store = self.store.get(&self.pipeline, &name, table)?;
                let from_sink = match &self.sinks[sink] {
                    Some(worker) if worker.info.positioned() => worker
                        .committed(&self.pipeline, table)
                        .wait()
                        .map_err(|e| RunError::Sink {
                            sink: name.clone(),
                            detail: format!("cannot say where table `{table}` stands: {e}"),
                        })?
                        .map(|c| {
                            newest_sink_epoch = newest_sink_epoch.max(Some(c.epoch));
                            Position::from_bytes(c.position)
                        }),
                    _ => None,
                };
                if self.core.sink_spec(sink).positioned && from_sink != from_store {
                    tracing::warn!(
                        sink = %name, table = %table,
                        sink_says = ?from_sink, store_says = ?from_store,
                        "the sink and the position store disagree; the sink wins"
                    );
                }
                for action in self.core.recover(sink, table, from_sink, from_store) {
                    if let Action::Record {
                        sink,
                        table,
                        position,
                    } = action
                    {
                        repairs.push(Entry {
                            sink: self.sink_names[sink].clone(),
                            table,
                            position,
                        });
                    }
                }
            }
            if self.sinks[sink].is_none() {
                // Could not start: keep it out of this run.
                let reason = self.report.disabled.get(&name).cloned().unwrap_or_default();
                self.core.disable(sink, reason);
            }
        }
        self.store.put_all(&self.pipeline, &repairs)?;
        // A sink that committed under a newer epoch than this store knows
        // (the store was lost, or another host ran the pipeline last): this
        // run is the newest now, so it must fence that one, not be fenced.
        if let Some(seen) = newest_sink_epoch
            && seen >= self.core.epoch()
        {
            let epoch = self.store.raise_epoch(&self.pipeline, seen + 1)?;
            tracing::warn!(
                seen,
                epoch,
                "a sink has seen a newer epoch than the position store; this run takes epoch {epoch}"
            );
            self.core.set_epoch(epoch);
            self.report.epoch = epoch;
        }
        Ok(self.core.resume())
    }

    fn process(&mut self, flush: Flush, source: &mut dyn Source) -> Result<(), RunError> {
        for batch in flush.batches {
            let actions = self
                .core
                .offer(&batch.table.name, batch.low.clone(), batch.high.clone());
            if let Err(e) = self.execute(actions, &batch, source) {
                for worker in self.sinks.iter().flatten() {
                    worker.abort(&batch.table.name);
                }
                return Err(e);
            }
            self.report.batches_committed += 1;
        }
        Ok(())
    }

    /// Carries out actions in waves: calls to different sinks in one wave
    /// run in parallel; store writes of one wave share one transaction.
    fn execute(
        &mut self,
        actions: Vec<Action>,
        batch: &TableBatch,
        source: &mut dyn Source,
    ) -> Result<(), RunError> {
        let mut pending = actions;
        let mut encoded: HashMap<Option<Position>, (Arc<Vec<u8>>, wit::Batch)> = HashMap::new();
        while !pending.is_empty() {
            let wave = std::mem::take(&mut pending);
            let mut calls: Vec<(SinkId, bool, sink_worker::Pending<()>)> = Vec::new();
            let mut records: Vec<(SinkId, Entry)> = Vec::new();
            for action in wave {
                match action {
                    Action::Stage { sink, after, .. } => {
                        let (ipc, meta) = match encoded.get(&after) {
                            Some(hit) => hit.clone(),
                            None => {
                                let made = self.encode(batch, after.as_ref())?;
                                encoded.insert(after.clone(), made.clone());
                                made
                            }
                        };
                        calls.push((sink, false, self.worker(sink).write(meta, ipc)));
                    }
                    Action::Commit { sink, request } => {
                        failpoint::hit("before-sink-commit");
                        let request = wit::CommitRequest {
                            table: request.table,
                            high: request.high.into_bytes(),
                            pipeline: request.pipeline,
                            epoch: request.epoch,
                        };
                        calls.push((sink, true, self.worker(sink).commit(request)));
                    }
                    Action::Record {
                        sink,
                        table,
                        position,
                    } => records.push((
                        sink,
                        Entry {
                            sink: self.sink_names[sink].clone(),
                            table,
                            position,
                        },
                    )),
                    Action::Checkpoint { position } => {
                        source.acknowledge(&position)?;
                    }
                    Action::Disable { sink, reason } => {
                        let name = self.sink_names[sink].clone();
                        tracing::error!(sink = %name, "optional sink disabled for this run: {reason}");
                        self.report.disabled.insert(name, reason);
                        self.worker(sink).abort(&batch.table.name);
                    }
                }
            }
            let mut events = Vec::new();
            let mut committed = false;
            for (sink, is_commit, call) in calls {
                events.push(match call.wait() {
                    Ok(()) if is_commit => {
                        committed = true;
                        Event::Committed { sink }
                    }
                    Ok(()) => Event::Staged { sink },
                    Err(error) => Event::Failed {
                        sink,
                        failure: failure_of(error),
                    },
                });
            }
            if committed {
                // Every sink of this wave has acknowledged; nothing recorded yet.
                failpoint::hit("after-sink-commit");
            }
            if !records.is_empty() {
                let entries: Vec<Entry> = records.iter().map(|(_, e)| e.clone()).collect();
                self.store.put_all(&self.pipeline, &entries)?;
                failpoint::hit("after-store-write");
                events.extend(
                    records
                        .iter()
                        .map(|(sink, _)| Event::Recorded { sink: *sink }),
                );
            }
            for event in events {
                pending.extend(self.core.handle(event)?);
            }
        }
        Ok(())
    }

    fn worker(&self, sink: SinkId) -> &SinkWorker {
        self.sinks[sink]
            .as_ref()
            .expect("the core only addresses sinks that started")
    }

    /// The batch as one sink should see it: only changes after what it has.
    fn encode(
        &self,
        batch: &TableBatch,
        after: Option<&Position>,
    ) -> Result<(Arc<Vec<u8>>, wit::Batch), RunError> {
        let filtered;
        let view = match after {
            Some(a) if *a >= batch.low => {
                filtered = batch.filter_after(a);
                &filtered
            }
            _ => batch,
        };
        let ipc = encode_ipc(&view.records)
            .map_err(|e| RunError::Setup(format!("cannot encode a batch as Arrow IPC: {e}")))?;
        let meta = wit::Batch {
            table: self.tables[&batch.table.name].clone(),
            id: view.id.clone(),
            low: view.low.as_bytes().to_vec(),
            high: view.high.as_bytes().to_vec(),
            rows: view.records.num_rows() as u32,
        };
        Ok((Arc::new(ipc), meta))
    }
}

fn failure_of(error: CallError) -> Failure {
    let kind = match &error {
        CallError::Sink(SinkError::Poison(_)) => FailureKind::Poison,
        CallError::Sink(SinkError::Fenced(_)) => FailureKind::Fenced,
        _ => FailureKind::Broken,
    };
    Failure {
        kind,
        message: error.to_string(),
    }
}

/// Arrow IPC stream bytes of one record batch.
pub fn encode_ipc(batch: &RecordBatch) -> Result<Vec<u8>, arrow_schema::ArrowError> {
    let mut out = Vec::new();
    {
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, &batch.schema())?;
        writer.write(batch)?;
        writer.finish()?;
    }
    Ok(out)
}
