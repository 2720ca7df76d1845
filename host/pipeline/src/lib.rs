//! The shell around the commit core: it reads the source, batches, and has
//! the core's executor carry out its actions against sink workers, the
//! position store and the source. Every decision is the core's; the shell
//! only does I/O.
//!
//! [`setup`] builds what a run needs from the config, [`shell`] is the
//! executor's effects, [`run`] is the loop that feeds the batcher and
//! acknowledges what the core checkpoints, and [`report`] makes the
//! [`RunReport`] and the live status from the facts each of them owns.

pub mod config;
pub mod control;
pub mod dead_letter;
pub mod failpoint;
pub mod plugin_ref;
mod report;
pub mod setup;
mod shell;
pub mod status;
pub mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::PipelineConfig;
use crate::store::{EmbeddedStore, PositionStore};
pub use control::{Control, SwapDone, SwapRequest};
use report::ReadCounts;
pub use report::RunReport;
use setup::SinkFactory;
use shell::Shell;
use weir_core::commit::{Action, ClaimRefused, Core, Resume, Stop};
use weir_core::position::Position;
use weir_runtime::{TenantShare, WasmEngine};
use weir_source::Source;
use weir_source::batch::{Batcher, Flush};
use weir_source::commit_order::describe;

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
    Engine(#[from] weir_runtime::EngineError),
    #[error("source: {0}")]
    Source(#[from] weir_source::SourceError),
    #[error("batching: {0}")]
    Batch(#[from] weir_source::batch::BatchError),
    #[error("{0}")]
    Setup(String),
}

/// Knobs a command line may set on top of the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides the generator's `max_changes` (a bounded run).
    pub max_changes: Option<u64>,
    /// The run holds a fenced claim (a cluster's owner): what an earlier
    /// owner left holding the source (a Postgres slot's walsender) is
    /// taken from it.
    pub take_over_source: bool,
}

/// How often a paused run looks whether it was resumed, stopped or asked
/// to swap.
const PAUSE_STEP: Duration = Duration::from_millis(20);

#[derive(Debug, PartialEq, Eq)]
enum Boundary {
    Go,
    Stop,
}

/// What a run gets from whoever starts it: the I/O runtime that carries
/// the blob stores' and the source's I/O, the engine (shared by every
/// pipeline of a `weir serve`), the control it is steered by, and what its
/// sinks share with the other sinks of their tenant.
pub struct RunHost<'a> {
    pub io: &'a tokio::runtime::Handle,
    pub engine: &'a WasmEngine,
    pub control: &'a Arc<Control>,
    pub tenant: Option<Arc<TenantShare>>,
    /// Where the run keeps positions and takes its epoch, when not in the
    /// embedded store under the pipeline's state folder (a cluster's hosts
    /// share one in etcd).
    pub store: Option<&'a OpenStore>,
}

/// Opens the position store of a run.
pub type OpenStore =
    dyn Fn(&PipelineConfig) -> Result<Box<dyn PositionStore>, store::StoreError> + Send + Sync;

/// Runs a pipeline until its source ends (bounded) or it is stopped.
pub fn run(
    config: &PipelineConfig,
    options: &RunOptions,
    host: &RunHost,
) -> Result<RunReport, RunError> {
    let _end = control::EndOnDrop(host.control);
    // Before the store is opened: nothing of the pipeline is made on disk
    // for a file this run cannot load.
    plugin_ref::refuse_uploaded(config, "weir run").map_err(RunError::Setup)?;
    let store: Box<dyn PositionStore> = match host.store {
        Some(open) => open(config)?,
        None => Box::new(EmbeddedStore::open(&config.store_path())?),
    };
    let epoch = store.next_epoch(&config.pipeline)?;
    let metrics = host.control.metrics.clone();
    let factory = SinkFactory::new(host.engine, host.io, metrics.clone(), host.tenant.clone())?;
    let sinks = setup::start_sinks(config, &factory)?;
    let not_started = sinks.not_started();
    let mut source = setup::make_source(config, options, host.io, host.control.stop_flag())?;
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
    let record_every = config.batch.record_positioned();
    if record_every.is_some() {
        core.defer_positioned_records();
    }
    let mut shell = Shell::new(
        &config.pipeline,
        sinks,
        store,
        descriptions,
        metrics,
        record_every,
    );
    core.set_source_head(source.ceiling()?);
    tracing::info!(pipeline = %config.pipeline, epoch, "starting");

    let resume = shell.recover(&mut core, &table_names, &not_started)?;
    let resume = match source.first_available()? {
        Some(first) => {
            let (resume, left_out) = core.leave_behind(resume, &first);
            for action in left_out {
                if let Action::Disable { sink, reason } = action {
                    let name = &core.sink_spec(sink).name;
                    tracing::error!(sink = %name, "optional sink left out: {reason}");
                }
            }
            resume
        }
        None => resume,
    };
    let resumed_after = match resume {
        Resume::FromStart => None,
        Resume::After(p) => Some(p),
    };
    source.resume_after(resumed_after.as_ref())?;
    RunReport::of(&core, ReadCounts::default(), resumed_after.as_ref()).publish(
        &core,
        &table_names,
        host.control,
        None,
        None,
    );
    host.control.mark_recovered();

    let mut batcher = setup::batcher(config, &tables, shell.descriptions());
    // Each commit runs on a thread of the scope while the loop reads and
    // batches what comes next (see `Run`).
    let read = std::thread::scope(|scope| {
        let mut run = Run {
            scope,
            parts: Some((&mut core, &mut shell)),
            in_flight: None,
            read_since: None,
            read: ReadCounts::default(),
            resumed_after: resumed_after.as_ref(),
            source: source.as_mut(),
            control: host.control,
            tables: &table_names,
        };
        let done = run.until_done(&mut batcher, config);
        // Whatever happened, the last commit ends before the run does.
        let settled = run.settle();
        // A run that ended well leaves the store where the sinks stand.
        done.and(settled)
            .and_then(|()| run.record(true))
            .map(|()| run.read)
    })?;
    let report = RunReport::of(&core, read, resumed_after.as_ref());
    // Shown as the last live status too, so the two never disagree. The
    // run ended at a commit boundary: everything read is committed.
    report.publish(&core, &table_names, host.control, source.lag_bytes(), None);
    Ok(report)
}

/// A commit running on a thread of its own, with the core and shell it
/// borrowed, and when the oldest change it commits was read.
struct InFlight<'scope, 'a> {
    handle: std::thread::ScopedJoinHandle<'scope, Committed<'a>>,
    read_since: Option<Instant>,
}

/// What a commit's thread hands back.
type Committed<'a> = (Result<(), RunError>, &'a mut Core, &'a mut Shell);

/// The loop of one run: the source feeds the batcher, every flush goes
/// through the core, and what the core checkpoints is acknowledged.
///
/// A flush is committed on a thread of its own while the loop goes on
/// reading the source and batching the next one: the source is no longer
/// idle while a batch is encoded, written into the sinks and committed.
/// One commit is in flight at a time, and nothing moves past it: the next
/// flush, a swap, a pause or a stop first waits for it ([`Run::settle`]),
/// and the source is acknowledged only for what a finished commit
/// checkpointed. While it runs, the commit holds the core and the shell.
struct Run<'scope, 'a> {
    scope: &'scope std::thread::Scope<'scope, 'a>,
    /// The core and the shell, when no commit holds them.
    parts: Option<(&'a mut Core, &'a mut Shell)>,
    in_flight: Option<InFlight<'scope, 'a>>,
    /// When the oldest change read and not yet handed to a commit was read.
    read_since: Option<Instant>,
    /// What was read so far, for the run's report.
    read: ReadCounts,
    /// Where recovery resumed the source, for the run's report.
    resumed_after: Option<&'a Position>,
    source: &'a mut dyn Source,
    control: &'a Arc<Control>,
    tables: &'a [String],
}

impl<'scope, 'a> Run<'scope, 'a> {
    /// Waits for the commit in flight, if any; takes the core and the shell
    /// back, acknowledges what it checkpointed and shows where the run
    /// stands. Its error, if it failed, is the run's.
    fn settle(&mut self) -> Result<(), RunError> {
        let Some(in_flight) = self.in_flight.take() else {
            return Ok(());
        };
        let (result, core, shell) = in_flight
            .handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        self.parts = Some((core, shell));
        result.and_then(|()| self.acknowledge(in_flight.read_since))?;
        if self.control.swap_waiting() {
            // Its batch committed: the swap costs only its own pause.
            self.swaps(Instant::now());
        }
        Ok(())
    }

    /// Tells the source what the last commit or record checkpointed, and
    /// shows where the run stands.
    fn acknowledge(&mut self, read_since: Option<Instant>) -> Result<(), RunError> {
        let (core, shell) = self
            .parts
            .as_mut()
            .expect("the core and shell are back: no commit is in flight");
        if let Some(position) = shell.take_checkpoint() {
            self.source.acknowledge(&position)?;
            crate::failpoint::reached(weir_core::CrashPoint::AfterSourceAck);
        }
        RunReport::of(core, self.read, self.resumed_after).publish(
            core,
            self.tables,
            self.control,
            self.source.lag_bytes(),
            read_since,
        );
        Ok(())
    }

    /// Writes positioned sinks' deferred records when they are due (or at
    /// once, `now_anyway`), if no commit is in flight, and acknowledges what
    /// they let the checkpoint pass.
    fn record(&mut self, now_anyway: bool) -> Result<(), RunError> {
        let Some((core, shell)) = self.parts.as_mut() else {
            return Ok(());
        };
        if shell.record(core, Instant::now(), now_anyway)? {
            self.acknowledge(None)?;
        }
        Ok(())
    }

    /// The core and the shell; only between commits.
    fn parts(&mut self) -> (&mut Core, &mut Shell) {
        let (core, shell) = self
            .parts
            .as_mut()
            .expect("the core and shell are back: no commit is in flight");
        (core, shell)
    }

    fn until_done(
        &mut self,
        batcher: &mut Batcher,
        config: &PipelineConfig,
    ) -> Result<(), RunError> {
        let pace = config.source.pace();
        let mut last_heartbeat = Instant::now();
        // The commit of the last transaction counted: the pieces of a big
        // source transaction share their commit and count once.
        loop {
            if self.control.wants_boundary() && self.at_boundary(batcher)? == Boundary::Stop {
                return Ok(());
            }
            if self
                .in_flight
                .as_ref()
                .is_some_and(|c| c.handle.is_finished())
            {
                // Acknowledged and shown now, not at the next flush.
                self.settle()?;
            }
            if self.control.swap_waiting() && batcher.buffered_changes() == 0 {
                // Nothing buffered: once the commit in flight is done, this
                // is a commit boundary.
                self.settle()?;
                self.swaps(Instant::now());
            }
            match self.source.next_transaction()? {
                Some(tx) => {
                    // An empty transaction is a source heartbeat, not a transaction.
                    let rows = tx.rows();
                    if rows > 0 && !tx.continued {
                        self.read.transactions += 1;
                    }
                    self.read.changes += rows as u64;
                    if rows > 0 {
                        self.read_since.get_or_insert_with(Instant::now);
                    }
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
            if now.duration_since(last_heartbeat) >= config.batch.heartbeat() {
                last_heartbeat = now;
                batcher.heartbeat_due();
            }
            if batcher.linger_expired(now) {
                // Carries a heartbeat that is due.
                self.flush(batcher.flush(false))?;
            } else if batcher.is_heartbeat_due() && self.in_flight.is_none() {
                // Never while a commit is in flight: the flush would wait
                // for it, and with commits slower than the heartbeat every
                // transaction read in between would become a batch of its
                // own, each as slow to commit (an Iceberg table on a slow
                // object store fell from hundreds of changes a commit to
                // one and never recovered). The next flush made for any
                // reason carries the heartbeat (a backfill's batch-sized
                // pieces flush with a commit always in flight), and once
                // the commit in flight is settled at the top of the loop,
                // an idle run's heartbeat is flushed here.
                self.flush(batcher.flush(true))?;
            }
            // Idle after a burst: the last commits are recorded all the same.
            self.record(false)?;
            if !pace.is_zero() {
                std::thread::sleep(pace);
            }
        }
    }

    /// Starts committing a flush, once the commit before it is done (and
    /// the source told what every required sink then held durably).
    fn flush(&mut self, flush: Option<Flush>) -> Result<(), RunError> {
        let Some(flush) = flush else {
            return Ok(());
        };
        self.settle()?;
        let (core, shell) = self
            .parts
            .take()
            .expect("the core and shell are back: the commit before was settled");
        // The commit logs under the run's span (`weir serve` names the
        // tenant and pipeline there), as it did on the run's own thread.
        let span = tracing::Span::current();
        let handle = std::thread::Builder::new()
            .name("weir-commit".into())
            .spawn_scoped(self.scope, move || {
                let result = span.in_scope(|| shell.commit(core, flush));
                (result, core, shell)
            })
            .map_err(|e| RunError::Setup(format!("cannot start a commit's thread: {e}")))?;
        self.in_flight = Some(InFlight {
            handle,
            read_since: self.read_since.take(),
        });
        Ok(())
    }

    /// Carries out every swap waiting; `since`: when the run stopped taking
    /// changes for them.
    fn swaps(&mut self, since: Instant) {
        for request in self.control.take_swaps() {
            self.swap(request, since);
        }
    }

    /// Something waits for a commit boundary: commits what the batcher
    /// holds, then stops, swaps workers, or waits while paused.
    fn at_boundary(&mut self, batcher: &mut Batcher) -> Result<Boundary, RunError> {
        let mut noticed = Instant::now();
        self.flush(batcher.flush(false))?;
        self.settle()?;
        // Paused or stopped, the store shows where the sinks stand.
        self.record(true)?;
        let mut paused = false;
        loop {
            if self.control.stopping() {
                tracing::info!("stopped at a commit boundary");
                return Ok(Boundary::Stop);
            }
            self.swaps(noticed);
            if !self.control.paused() {
                if paused {
                    tracing::info!("resumed");
                    self.control.metrics.state("running");
                }
                self.control.settle();
                return Ok(Boundary::Go);
            }
            if !paused {
                paused = true;
                tracing::info!("paused at a commit boundary");
                self.control.metrics.state("paused");
            }
            // A swap asked for while paused is made at once: this is a
            // commit boundary all along.
            self.control.wait_while_paused(PAUSE_STEP);
            noticed = Instant::now();
        }
    }

    /// Hands a sink's batches to the worker of its new version, or says why
    /// not; the old worker stays in place when the new one is refused.
    fn swap(&mut self, request: SwapRequest, noticed: Instant) {
        let sink = request.sink.clone();
        let tables = self.tables;
        let (core, shell) = self.parts();
        let answer = shell
            .swap(core, tables, &sink, request.worker)
            .map(|()| SwapDone {
                sink: sink.clone(),
                pause_ms: noticed.elapsed().as_secs_f64() * 1000.0,
                at: core.checkpoint().map(describe),
            });
        // Counted by whoever asked (serve), which alone knows whether the
        // swap was a rollback and sees the refusals made before the run.
        match &answer {
            Ok(done) => {
                tracing::info!(sink = %sink, pause_ms = done.pause_ms, "plugin swapped at a commit boundary");
            }
            Err(e) => tracing::warn!(sink = %sink, "plugin swap refused: {e}"),
        }
        let _ = request.reply.send(answer);
    }
}
