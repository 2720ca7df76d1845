//! The executor's effects in the host: sink calls go to the sink workers
//! (one wave in parallel), positions to the position store, checkpoints
//! back to the run loop, crash points to the failpoints.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_core::commit::{commit_batch, record_deferred, recover_all};
use weir_core::{
    CrashPoint, Effects, ExecError, Failure, FailureKind, Record, SinkCall, SinkClaim, SinkId,
};

use super::RunError;
use super::setup::Sinks;
use crate::dead_letter::{DeadLetter, ValveError};
use crate::failpoint;
use crate::store::{Entry, PositionStore};
use weir_core::commit::{Core, Resume};
use weir_core::position::Position;
use weir_metrics::{PipelineMetrics, SinkMetrics};
use weir_runtime::{BatchHeader, CallError, SinkError, SinkWorker, TableDescription};
use weir_source::batch::{Flush, TableBatch};

pub(super) struct Shell {
    pipeline: String,
    sinks: Vec<Option<SinkWorker>>,
    sink_names: Vec<String>,
    /// Each sink's dead-letter valve, where one is set.
    dead_letters: Vec<Option<DeadLetter>>,
    store: Box<dyn PositionStore>,
    descriptions: HashMap<String, Arc<TableDescription>>,
    /// The batch on offer, and its encodings by the position a sink already
    /// has (sinks at the same place share one encoding).
    batch: Option<TableBatch>,
    encoded: HashMap<Option<Position>, (Arc<Vec<u8>>, BatchHeader)>,
    /// The newest position the core checkpointed, not yet acknowledged.
    checkpoint: Option<Position>,
    /// True while recovering: store writes then are repairs, worth a warning.
    recovering: bool,
    /// How often positioned sinks' deferred records are written, when
    /// they are deferred, and when they last were.
    record_every: Option<Duration>,
    last_record: Instant,
    metrics: PipelineMetrics,
    sink_metrics: Vec<SinkMetrics>,
}

impl Shell {
    pub(super) fn new(
        pipeline: &str,
        sinks: Sinks,
        store: Box<dyn PositionStore>,
        descriptions: HashMap<String, Arc<TableDescription>>,
        metrics: PipelineMetrics,
        record_every: Option<Duration>,
    ) -> Self {
        Shell {
            sink_metrics: sinks.specs.iter().map(|s| metrics.sink(&s.name)).collect(),
            metrics,
            pipeline: pipeline.to_string(),
            sink_names: sinks.specs.iter().map(|s| s.name.clone()).collect(),
            sinks: sinks.workers,
            dead_letters: sinks.dead_letters,
            store,
            descriptions,
            batch: None,
            encoded: HashMap::new(),
            checkpoint: None,
            recovering: false,
            record_every,
            last_record: Instant::now(),
        }
    }

    pub(super) fn descriptions(&self) -> &HashMap<String, Arc<TableDescription>> {
        &self.descriptions
    }

    /// Asks every positioned sink and the store where each table stands,
    /// repairs the store where the sink disagrees, and says where to resume.
    /// The sinks in `not_started` (setup's, with the reason) are out of the
    /// run from here on, the core holding why.
    pub(super) fn recover(
        &mut self,
        core: &mut Core,
        tables: &[String],
        not_started: &[(SinkId, String)],
    ) -> Result<Resume, RunError> {
        self.recovering = true;
        let resume = recover_all(core, tables, not_started, self);
        self.recovering = false;
        resume.map_err(run_error)
    }

    /// Commits every table batch of a flush, one at a time, in order.
    pub(super) fn commit(&mut self, core: &mut Core, flush: Flush) -> Result<(), RunError> {
        for batch in flush.batches {
            let (table, low, high) = (
                batch.table.name.clone(),
                batch.low.clone(),
                batch.high.clone(),
            );
            let rows = batch.records.num_rows() as u64;
            self.batch = Some(batch);
            self.encoded.clear();
            let started = Instant::now();
            let result = commit_batch(core, &table, low, high, self);
            self.batch = None;
            if let Err(e) = result {
                // Whatever was staged must not linger into a later commit.
                for worker in self.sinks.iter().flatten() {
                    worker.abort(&table);
                }
                return Err(run_error(e));
            }
            self.metrics.rows_in(&table, rows);
            self.metrics
                .commit_seconds(&table, started.elapsed().as_secs_f64());
        }
        self.record(core, Instant::now(), false).map(drop)
    }

    /// Writes what positioned sinks committed and the store lacks, when
    /// records are deferred and `now` is a record interval after the last
    /// one, or at once when `now_anyway` (a pause, a stop, the run's end).
    /// Returns whether it wrote (only then can the checkpoint have moved).
    /// Only between commits.
    pub(super) fn record(
        &mut self,
        core: &mut Core,
        now: Instant,
        now_anyway: bool,
    ) -> Result<bool, RunError> {
        let Some(every) = self.record_every else {
            return Ok(false);
        };
        if !now_anyway && now.duration_since(self.last_record) < every {
            return Ok(false);
        }
        let wrote = record_deferred(core, self).map_err(run_error)?;
        if wrote {
            self.last_record = now;
        }
        Ok(wrote)
    }

    /// Puts `worker`, a started new version of `sink`'s plugin, in place of
    /// its worker, at a commit boundary. Refused (the old worker stays)
    /// when the sink is out of this run, when the new version does not
    /// keep the `positions` capability, or when a positioned new version
    /// does not say every table stands where the pipeline knows it does.
    pub(super) fn swap(
        &mut self,
        core: &Core,
        tables: &[String],
        sink_name: &str,
        worker: SinkWorker,
    ) -> Result<(), String> {
        let sink = self
            .sink_names
            .iter()
            .position(|n| n == sink_name)
            .ok_or_else(|| format!("the pipeline has no sink `{sink_name}`"))?;
        if self.sinks[sink].is_none() {
            return Err(format!(
                "sink `{sink_name}` is out of this run; restart the pipeline to load a new version"
            ));
        }
        core.admit_swap(sink, worker.info.positioned())?;
        if worker.info.positioned() {
            for table in tables {
                let claim = worker
                    .committed(&self.pipeline, table)
                    .wait()
                    .map_err(|e| {
                        format!("the new version cannot say where `{table}` stands: {e}")
                    })?;
                core.check_swap_claim(sink, table, claim.as_ref().map(|c| &c.position))?;
            }
        }
        let old = self.sinks[sink].replace(worker);
        // Nothing is staged at a boundary; the old worker's thread ends on
        // its own (each call within its bound), off the run's path.
        if let Some(old) = old {
            let _ = std::thread::Builder::new()
                .name(format!("retire-{sink_name}"))
                .spawn(move || drop(old));
        }
        Ok(())
    }

    /// The newest checkpoint since the last call, for the source.
    pub(super) fn take_checkpoint(&mut self) -> Option<Position> {
        self.checkpoint.take()
    }

    fn worker(&self, sink: SinkId) -> &SinkWorker {
        self.sinks[sink]
            .as_ref()
            .expect("the core only addresses sinks that started")
    }

    /// The batch on offer as one sink should see it: only the changes after
    /// what it already has.
    fn view(&self, after: &Option<Position>) -> TableBatch {
        let batch = self.batch.as_ref().expect("a batch is on offer");
        match after {
            Some(a) if *a >= batch.low => batch.filter_after(a),
            _ => batch.clone(),
        }
    }

    /// [`Shell::view`] as Arrow IPC, with its header.
    fn encoded(
        &mut self,
        after: Option<Position>,
    ) -> Result<(Arc<Vec<u8>>, BatchHeader), RunError> {
        if let Some(hit) = self.encoded.get(&after) {
            return Ok(hit.clone());
        }
        let view = &self.view(&after);
        let batch = self.batch.as_ref().expect("a batch is on offer");
        let ipc = weir_contract::ipc::encode(&view.records)
            .map_err(|e| RunError::Setup(format!("cannot encode a batch as Arrow IPC: {e}")))?;
        let header = BatchHeader {
            table: self.descriptions[&batch.table.name].clone(),
            id: view.id.clone(),
            low: view.low.clone(),
            high: view.high.clone(),
            rows: view.records.num_rows() as u32,
        };
        let made = (Arc::new(ipc), header);
        self.encoded.insert(after, made.clone());
        Ok(made)
    }
}

impl Shell {
    /// A sink with a dead-letter valve refused the batch on offer as
    /// poison: the valve sets aside the rows it refuses and stages the
    /// rest. Still poison when more rows are refused than the valve allows.
    fn set_aside(
        &mut self,
        sink: SinkId,
        after: Option<Position>,
        why: String,
    ) -> Result<(), Failure> {
        let view = self.view(&after);
        let (_, header) = self.encoded(after).map_err(|e| Failure {
            kind: FailureKind::Broken,
            message: e.to_string(),
        })?;
        let valve = self.dead_letters[sink]
            .as_ref()
            .expect("only sinks with a valve are asked");
        let worker = self.sinks[sink]
            .as_ref()
            .expect("the core only addresses sinks that started");
        match valve.set_aside(worker, &header, &view, why.clone()) {
            Ok(refused) => {
                let table = &header.table.name;
                self.sink_metrics[sink].dead_lettered(table, refused.len() as u64);
                tracing::warn!(
                    sink = %self.sink_names[sink], table = %table, batch = %header.id,
                    rows = refused.len(), of = header.rows,
                    "the sink refused rows of a batch; they were set aside in its dead-letter \
                     location and the rest goes on: {why}"
                );
                Ok(())
            }
            Err(ValveError::Poison(message)) => Err(Failure {
                kind: FailureKind::Poison,
                message,
            }),
            Err(ValveError::Call(error)) => Err(failure_of(error)),
            Err(ValveError::Store(message)) => Err(Failure {
                kind: FailureKind::Broken,
                message,
            }),
        }
    }
}

impl Effects for Shell {
    type Error = RunError;

    fn stored(&mut self, sink: SinkId, table: &str) -> Result<Option<Position>, RunError> {
        Ok(self
            .store
            .get(&self.pipeline, &self.sink_names[sink], table)?)
    }

    fn sink_committed(&mut self, sink: SinkId, table: &str) -> Result<Option<SinkClaim>, RunError> {
        let answer = self.worker(sink).committed(&self.pipeline, table).wait();
        answer.map_err(|e| RunError::Sink {
            sink: self.sink_names[sink].clone(),
            detail: format!("cannot say where table `{table}` stands: {e}"),
        })
    }

    fn raise_epoch(&mut self, at_least: u64) -> Result<u64, RunError> {
        let epoch = self.store.raise_epoch(&self.pipeline, at_least)?;
        tracing::warn!(
            epoch,
            "a sink has seen a newer epoch than the position store; this run takes epoch {epoch}"
        );
        Ok(epoch)
    }

    fn call_sinks(&mut self, calls: Vec<SinkCall>) -> Result<Vec<Result<(), Failure>>, RunError> {
        // Asked before the sinks are told to commit, not after: a host that
        // could lose the pipeline mid-commit must not begin one.
        if calls.iter().any(|c| matches!(c, SinkCall::Commit { .. })) {
            self.store.may_commit(&self.pipeline)?;
        }
        let mut pending = Vec::with_capacity(calls.len());
        let mut staging = Vec::with_capacity(calls.len());
        for call in calls {
            staging.push(match &call {
                SinkCall::Stage { sink, after, .. } => Some((*sink, after.clone())),
                SinkCall::Commit { .. } => None,
            });
            pending.push(match call {
                SinkCall::Stage { sink, after, .. } => {
                    let (ipc, header) = self.encoded(after)?;
                    self.sink_metrics[sink].written(
                        &header.table.name,
                        u64::from(header.rows),
                        ipc.len() as u64,
                    );
                    self.worker(sink).write(header, ipc)
                }
                SinkCall::Commit { sink, request } => self.worker(sink).commit(request),
            });
        }
        // Sent to every worker first, so different sinks work side by side.
        let answers: Vec<Result<(), CallError>> = pending.into_iter().map(|c| c.wait()).collect();
        Ok(answers
            .into_iter()
            .zip(staging)
            .map(|(answer, staged)| match (answer, staged) {
                (Err(CallError::Sink(SinkError::Poison(why))), Some((sink, after)))
                    if self.dead_letters[sink].is_some() =>
                {
                    self.set_aside(sink, after, why)
                }
                (answer, _) => answer.map_err(failure_of),
            })
            .collect())
    }

    fn record(&mut self, records: &[Record]) -> Result<(), RunError> {
        let entries: Vec<Entry> = records
            .iter()
            .map(|r| Entry {
                sink: self.sink_names[r.sink].clone(),
                table: r.table.clone(),
                position: r.position.clone(),
            })
            .collect();
        if self.recovering {
            for entry in &entries {
                tracing::warn!(
                    sink = %entry.sink, table = %entry.table, sink_says = ?entry.position,
                    "the sink and the position store disagree; the sink wins"
                );
            }
        }
        Ok(self.store.put_all(&self.pipeline, &entries)?)
    }

    fn checkpoint(&mut self, position: &Position) -> Result<(), RunError> {
        self.checkpoint = Some(position.clone());
        Ok(())
    }

    fn disable(&mut self, sink: SinkId, table: &str, reason: &str) -> Result<(), RunError> {
        // The core keeps the reason; the run's report reads it there.
        let name = &self.sink_names[sink];
        tracing::error!(sink = %name, "optional sink disabled for this run: {reason}");
        self.worker(sink).abort(table);
        Ok(())
    }

    fn reached(&mut self, point: CrashPoint) -> Result<(), RunError> {
        failpoint::reached(point);
        Ok(())
    }
}

fn run_error(error: ExecError<RunError>) -> RunError {
    match error {
        ExecError::Stopped(stop) => RunError::Stopped(stop),
        ExecError::Refused(refused) => RunError::Refused(refused),
        ExecError::Effect(e) => e,
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
