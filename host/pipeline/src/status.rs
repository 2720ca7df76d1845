//! `weir status`: where every sink stands for every table, where that answer
//! came from, and how far behind the source's head it is.
//!
//! The answer is the commit core's own recovery (the sink wins over the
//! store), so status says exactly what the next run would resume from.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde::Serialize;

use crate::config::PipelineConfig;
use crate::store::{EmbeddedStore, PositionStore};
use crate::{RunError, RunOptions, setup};
use weir_core::commit::{Action, CommitPolicy, Core, SinkClaim, SinkSpec};
use weir_core::position::Position;
use weir_runtime::{SinkWorker, WasmEngine};
use weir_source::commit_order::describe;

#[derive(Debug, Serialize)]
pub struct Status {
    pub pipeline: String,
    pub epoch: Option<u64>,
    pub source_head: Option<String>,
    pub sinks: Vec<SinkStatus>,
}

#[derive(Debug, Serialize)]
pub struct SinkStatus {
    pub sink: String,
    pub positioned: bool,
    pub required: bool,
    /// Set when the sink could not be loaded or asked.
    pub error: Option<String>,
    pub tables: Vec<TableStatus>,
}

#[derive(Debug, Serialize)]
pub struct TableStatus {
    pub table: String,
    pub position: Option<String>,
    /// Raw position bytes, hex, for scripts.
    pub position_hex: Option<String>,
    /// `sink` (its own `positions` record), `store` (the host's), or `none`.
    pub source: &'static str,
    /// What the store says, when it differs from the sink.
    pub store_position: Option<String>,
    /// Source transactions between the committed position and the head,
    /// where the source can count them (the generator).
    pub lag_transactions: Option<u64>,
    /// Rows the sink refused that its dead-letter valve set aside, counted
    /// in the dead-letter location (unset without a valve).
    pub dead_letter_rows: Option<u64>,
}

/// The pipeline's source, opened to be asked, not run (`weir status`,
/// `weir tables`). No stop flag to share: these commands install no signal
/// handler, so Ctrl-C ends them whatever they wait for.
fn read_only_source(
    config: &PipelineConfig,
    io: &tokio::runtime::Handle,
) -> Result<Box<dyn weir_source::Source>, RunError> {
    let never = Arc::new(AtomicBool::new(false));
    setup::make_source(config, &RunOptions::default(), io, never)
}

/// One table as a sink's `write` receives it (`weir tables`).
#[derive(Debug, Serialize)]
pub struct TableShape {
    /// The source's name for the table.
    pub table: String,
    /// Where the sink is asked to write it (`tables.<name>.destination`).
    pub destination: String,
    /// `upsert` (by the key) or `append`.
    pub mode: String,
    /// The key columns, in key order: what upserts and deletes match on.
    pub key: Vec<String>,
    /// Every column of a batch, in order.
    pub columns: Vec<ColumnShape>,
}

#[derive(Debug, Serialize)]
pub struct ColumnShape {
    pub name: String,
    /// The Arrow type, as arrow prints it (`Decimal128(12, 2)`).
    pub arrow_type: String,
    /// `key`, `column` (the source's other columns), `metadata` (added by
    /// the pipeline's `metadata:`) or `control` (`__op`, `__pos`).
    pub role: &'static str,
    /// Whether inserts and updates can carry null here. Delete rows carry
    /// only the key: their other columns are null whatever this says.
    pub nullable: bool,
}

/// The tables the pipeline's source gives its sinks, with every column of
/// their batches: what a sink author must handle. Reads the source only (a
/// Postgres source connects and reads its publication's tables; it creates
/// nothing) and loads no sink.
pub fn tables(
    config: &PipelineConfig,
    io: &tokio::runtime::Handle,
) -> Result<Vec<TableShape>, RunError> {
    let tables = read_only_source(config, io)?.tables();
    let descriptions = setup::describe_tables(config, &tables)?;
    Ok(tables
        .iter()
        .map(|table| {
            let description = &descriptions[&table.name];
            let schema = weir_source::batch::batch_schema(table, &description.metadata);
            let metadata = description.metadata.len();
            let columns = schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, field)| {
                    let (role, nullable) = match table.columns.get(i) {
                        Some(column) if table.key.contains(&i) => ("key", column.nullable),
                        Some(column) => ("column", column.nullable),
                        None if i < table.columns.len() + metadata => ("metadata", false),
                        None => ("control", false),
                    };
                    ColumnShape {
                        name: field.name().clone(),
                        arrow_type: field.data_type().to_string(),
                        role,
                        nullable,
                    }
                })
                .collect();
            TableShape {
                table: table.name.clone(),
                destination: description.destination.clone(),
                mode: description.mode.to_string(),
                key: table.key_names(),
                columns,
            }
        })
        .collect())
}

pub fn status(config: &PipelineConfig, io: &tokio::runtime::Handle) -> Result<Status, RunError> {
    let store = EmbeddedStore::open(&config.store_path()).map_err(|e| {
        RunError::Setup(format!(
            "{e} (if `weir run` is running for this pipeline, it holds the store; stop it first)"
        ))
    })?;
    let engine = WasmEngine::new(&config.cache_dir())?;
    let mut source = read_only_source(config, io)?;
    let head = source.head();
    let ceiling = source.ceiling()?;
    let tables = source.tables();
    let factory =
        setup::SinkFactory::new(&engine, io, weir_metrics::PipelineMetrics::detached(), None)?;
    let started = match setup::start_sinks(config, &factory) {
        Ok(sinks) => Some(sinks),
        Err(e) => {
            tracing::warn!("{e}");
            None
        }
    };
    let mut out = Vec::new();
    for (i, sink) in config.sinks.iter().enumerate() {
        let worker = started
            .as_ref()
            .and_then(|s| s.workers.get(i))
            .and_then(Option::as_ref);
        let mut error = match &started {
            Some(s) => s.failed_to_start.get(&sink.name).cloned(),
            None => Some("could not load the sinks; run `weir run` to see why".into()),
        };
        let positioned = worker.is_some_and(|w| w.info.positioned());
        // A core of one sink, recovered the way a run would recover it;
        // optional here, so that a claim the core refuses becomes this
        // sink's error instead of ending the whole status.
        let spec = SinkSpec {
            name: sink.name.clone(),
            required: false,
            positioned,
        };
        let names = tables.iter().map(|t| t.name.clone()).collect();
        let mut core = Core::new(&config.pipeline, 0, CommitPolicy::All, names, vec![spec]);
        // Checked as a run checks it: a claim past the source is shown as
        // the sink's error, and the store's position as where it stands.
        core.set_source_head(ceiling.clone());
        let mut rows = Vec::new();
        for table in &tables {
            let from_store = store.get(&config.pipeline, &sink.name, &table.name)?;
            let from_sink = match worker {
                Some(w) if positioned => ask(w, &config.pipeline, &table.name, &mut error),
                _ => None,
            };
            let claimed = from_sink.as_ref().map(|c| c.position.clone());
            for action in core.recover(0, &table.name, from_sink, from_store.clone())? {
                if let Action::Disable { reason, .. } = action {
                    error = Some(reason);
                }
            }
            let committed = core.committed(0, &table.name);
            let position = committed.map(|(p, _)| p.clone());
            rows.push(TableStatus {
                table: table.name.clone(),
                position_hex: position.as_ref().map(Position::to_hex),
                position: position.as_ref().map(describe),
                source: committed.map_or("none", |(_, origin)| origin.as_str()),
                store_position: (positioned && from_store != claimed)
                    .then(|| from_store.as_ref().map(describe))
                    .flatten(),
                lag_transactions: source.transactions_after(position.as_ref()),
                dead_letter_rows: match started.as_ref().and_then(|s| s.dead_letters[i].as_ref()) {
                    Some(valve) => match valve.count(&table.name) {
                        Ok(rows) => Some(rows),
                        Err(e) => {
                            error = Some(e);
                            None
                        }
                    },
                    None => None,
                },
            });
        }
        out.push(SinkStatus {
            sink: sink.name.clone(),
            positioned,
            required: sink.required,
            error,
            tables: rows,
        });
    }
    Ok(Status {
        pipeline: config.pipeline.clone(),
        epoch: store.current_epoch(&config.pipeline)?,
        source_head: head.as_ref().map(describe),
        sinks: out,
    })
}

/// A positioned sink's claim for a table; a failure to answer is noted as
/// the sink's error and counts as no claim.
fn ask(
    worker: &SinkWorker,
    pipeline: &str,
    table: &str,
    error: &mut Option<String>,
) -> Option<SinkClaim> {
    match worker.committed(pipeline, table).wait() {
        Ok(claim) => claim,
        Err(e) => {
            *error = Some(e.to_string());
            None
        }
    }
}
