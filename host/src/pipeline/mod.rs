//! The shell around the commit core: it reads the source, batches, and has
//! the core's executor carry out its actions against sink workers, the
//! position store and the source. Every decision is the core's; the shell
//! only does I/O.
//!
//! [`setup`] builds what a run needs from the config, [`shell`] is the
//! executor's effects, and [`run`] is the loop that feeds the batcher and
//! acknowledges what the core checkpoints.

pub mod setup;
mod shell;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::batch::{Batcher, Flush};
use crate::commit::{ClaimRefused, Core, Resume, Stop};
use crate::config::PipelineConfig;
use crate::runtime::WasmEngine;
use crate::source::Source;
use crate::store::{EmbeddedStore, PositionStore};
use shell::Shell;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Stopped(#[from] Box<Stop>),
    #[error(transparent)]
    Refused(#[from] ClaimRefused),
    #[error("sink `{sink}`: {detail}")]
    Sink { sink: String, detail: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Engine(#[from] crate::runtime::EngineError),
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

/// Runs a pipeline until its source ends (bounded) or `stop` is set. `io`
/// is the runtime that carries the blob stores' and the source's I/O.
pub fn run(
    config: &PipelineConfig,
    options: &RunOptions,
    io: &tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> Result<RunReport, RunError> {
    let store = EmbeddedStore::open(&config.store_path())?;
    let epoch = store.next_epoch(&config.pipeline)?;
    let engine = WasmEngine::new(&config.cache_dir())?;
    let sinks = setup::start_sinks(config, &engine, io)?;
    let mut source = setup::make_source(config, options, io)?;
    let tables = source.tables();
    let descriptions = setup::describe_tables(config, &tables)?;
    let table_names: Vec<String> = tables.iter().map(|t| t.name.clone()).collect();
    let mut core = Core::new(
        config.pipeline.clone(),
        epoch,
        config.commit_policy,
        table_names.clone(),
        sinks.specs.clone(),
    );
    let mut report = RunReport {
        pipeline: config.pipeline.clone(),
        epoch,
        ..Default::default()
    };
    report.disabled.extend(sinks.failed_to_start.clone());
    let mut shell = Shell::new(
        &config.pipeline,
        sinks,
        Box::new(store),
        descriptions,
        report,
    );
    core.set_source_head(source.ceiling()?);
    tracing::info!(pipeline = %config.pipeline, epoch, "starting");

    let resume = shell.recover(&mut core, &table_names)?;
    let resumed_after = match resume {
        Resume::FromStart => None,
        Resume::After(p) => Some(p),
    };
    source.resume_after(resumed_after.as_ref())?;
    shell.report.epoch = core.epoch();
    shell.report.resumed_after = resumed_after.as_ref().map(ToString::to_string);

    let mut batcher = setup::batcher(config, &tables, shell.descriptions());
    let mut run = Run {
        core: &mut core,
        shell: &mut shell,
        source: source.as_mut(),
    };
    run.until_done(&mut batcher, config, &stop)?;
    shell.report.checkpoint = core.checkpoint().map(ToString::to_string);
    Ok(shell.report)
}

/// The loop of one run: the source feeds the batcher, every flush goes
/// through the core, and what the core checkpoints is acknowledged.
struct Run<'a> {
    core: &'a mut Core,
    shell: &'a mut Shell,
    source: &'a mut dyn Source,
}

impl Run<'_> {
    fn until_done(
        &mut self,
        batcher: &mut Batcher,
        config: &PipelineConfig,
        stop: &AtomicBool,
    ) -> Result<(), RunError> {
        let pace = config.source.pace();
        let mut last_heartbeat = Instant::now();
        loop {
            if stop.load(Ordering::Relaxed) {
                tracing::info!("stopping at a commit boundary");
                return self.flush(batcher.flush(false));
            }
            match self.source.next_transaction()? {
                Some(tx) => {
                    // An empty transaction is a source heartbeat, not a transaction.
                    self.shell.report.transactions += u64::from(!tx.changes.is_empty());
                    self.shell.report.changes += tx.changes.len() as u64;
                    for flush in batcher.push(tx)? {
                        self.flush(Some(flush))?;
                    }
                }
                None => {
                    if batcher.consumed().is_some() {
                        self.flush(batcher.flush(true))?;
                    }
                    return Ok(());
                }
            }
            let now = Instant::now();
            if batcher.linger_expired(now) {
                self.flush(batcher.flush(false))?;
            }
            if now.duration_since(last_heartbeat) >= config.batch.heartbeat() {
                last_heartbeat = now;
                if batcher.consumed().is_some() {
                    self.flush(batcher.flush(true))?;
                }
            }
            if !pace.is_zero() {
                std::thread::sleep(pace);
            }
        }
    }

    /// Commits a flush, then tells the source what every required sink now
    /// holds durably.
    fn flush(&mut self, flush: Option<Flush>) -> Result<(), RunError> {
        let Some(flush) = flush else {
            return Ok(());
        };
        self.shell.commit(self.core, flush)?;
        if let Some(position) = self.shell.take_checkpoint() {
            self.source.acknowledge(&position)?;
        }
        Ok(())
    }
}
