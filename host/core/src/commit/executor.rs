//! The executor: the one loop that carries out the core's actions, used by
//! the host's pipeline and by the crash tests alike.
//!
//! It knows the order of things (which calls may run side by side, when the
//! store is written, where a crash can land) and nothing of how they are
//! done: that is the [`Effects`] a caller supplies. The host's effects call
//! sink workers, the position store and the source; the crash tests' effects
//! change an in-memory world and can "crash" before any step by returning an
//! error, which ends the run exactly as SIGKILL would.

use super::{
    Action, ClaimRefused, Core, Event, Failure, Record, Resume, SinkCall, SinkClaim, SinkId, Stop,
};
use crate::position::Position;

/// The named moments between the steps of a commit where a crash matters
/// most; crash tests aim at them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// A sink is about to be asked to commit.
    BeforeSinkCommit,
    /// Sinks acknowledged durable commits; the store has not been written.
    AfterSinkCommit,
    /// The store holds the new positions; the core has not heard of it.
    AfterStoreWrite,
    /// The source was just told it may release what every required sink
    /// committed (for Postgres: the slot's confirmed LSN moved). The
    /// executor never passes it; the host's run loop does.
    AfterSourceAck,
}

impl CrashPoint {
    /// The spelling failpoints use.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::BeforeSinkCommit => "before-sink-commit",
            CrashPoint::AfterSinkCommit => "after-sink-commit",
            CrashPoint::AfterStoreWrite => "after-store-write",
            CrashPoint::AfterSourceAck => "after-source-ack",
        }
    }
}

/// What the executor asks of the world. Every method may fail with the
/// caller's error, which ends the run where it stands (nothing after it
/// happens, as in a crash).
pub trait Effects {
    type Error;

    /// Where the out-of-sink store says a sink stands for a table.
    fn stored(&mut self, sink: SinkId, table: &str) -> Result<Option<Position>, Self::Error>;

    /// Where a sink with `positions` says it stands for a table. Only asked
    /// of positioned sinks that started.
    fn sink_committed(
        &mut self,
        sink: SinkId,
        table: &str,
    ) -> Result<Option<SinkClaim>, Self::Error>;

    /// Makes the store's epoch for the pipeline at least `at_least` and
    /// returns the epoch it now holds.
    fn raise_epoch(&mut self, at_least: u64) -> Result<u64, Self::Error>;

    /// Carries out one wave of sink calls (each to a different sink) and
    /// returns each call's outcome, in the order of `calls`.
    fn call_sinks(&mut self, calls: Vec<SinkCall>)
    -> Result<Vec<Result<(), Failure>>, Self::Error>;

    /// Writes positions to the store, durably, all in one transaction.
    fn record(&mut self, records: &[Record]) -> Result<(), Self::Error>;

    /// Tells the source that everything up to `position` may be released.
    fn checkpoint(&mut self, position: &Position) -> Result<(), Self::Error>;

    /// An optional sink failed and takes no more batches in this run.
    fn disable(&mut self, sink: SinkId, table: &str, reason: &str) -> Result<(), Self::Error>;

    /// Passes a named crash point.
    fn reached(&mut self, point: CrashPoint) -> Result<(), Self::Error>;
}

/// Why the executor stopped before the batch was done.
#[derive(Debug)]
pub enum ExecError<E> {
    /// The core stopped the pipeline (a required sink failed, or fencing).
    Stopped(Box<Stop>),
    /// A sink claimed something on start that cannot be true.
    Refused(ClaimRefused),
    /// An effect failed (or a test crashed the run).
    Effect(E),
}

impl<E> From<ClaimRefused> for ExecError<E> {
    fn from(refused: ClaimRefused) -> Self {
        ExecError::Refused(refused)
    }
}

impl<E> From<Box<Stop>> for ExecError<E> {
    fn from(stop: Box<Stop>) -> Self {
        ExecError::Stopped(stop)
    }
}

/// Recovers every sink's position for every table, repairs the store where
/// a positioned sink disagrees with it, raises the epoch above any a sink
/// has seen, and says where the source must resume.
///
/// A sink in `not_started` could not be started: it is not asked, keeps
/// the store's positions, and is disabled for this run with the reason.
pub fn recover<E: Effects>(
    core: &mut Core,
    tables: &[String],
    not_started: &[(SinkId, String)],
    effects: &mut E,
) -> Result<Resume, ExecError<E::Error>> {
    let mut repairs = Vec::new();
    for sink in 0..core.sink_count() {
        let started = !not_started.iter().any(|(s, _)| *s == sink);
        for table in tables {
            let from_store = effects.stored(sink, table).map_err(ExecError::Effect)?;
            // A sink disabled for a refused claim is not asked again.
            let asked =
                started && core.sink_spec(sink).positioned && core.is_disabled(sink).is_none();
            let from_sink = if asked {
                effects
                    .sink_committed(sink, table)
                    .map_err(ExecError::Effect)?
            } else {
                None
            };
            for action in core.recover(sink, table, from_sink, from_store)? {
                match action {
                    Action::Record(record) => repairs.push(record),
                    Action::Disable { sink, reason } => effects
                        .disable(sink, table, &reason)
                        .map_err(ExecError::Effect)?,
                    other => unreachable!("recovery asked for {other:?}"),
                }
            }
        }
    }
    for (sink, reason) in not_started {
        core.disable(*sink, reason.clone());
    }
    if !repairs.is_empty() {
        effects.record(&repairs).map_err(ExecError::Effect)?;
    }
    if let Some(floor) = core.epoch_floor()? {
        let epoch = effects.raise_epoch(floor).map_err(ExecError::Effect)?;
        core.set_epoch(epoch.max(floor));
    }
    Ok(core.resume())
}

/// Offers one table's batch and carries out every action until each sink
/// is done with it. On error the batch may be staged in some sinks: the
/// caller aborts it there.
pub fn commit_batch<E: Effects>(
    core: &mut Core,
    table: &str,
    low: Position,
    high: Position,
    effects: &mut E,
) -> Result<(), ExecError<E::Error>> {
    let actions = core.offer(table, low, high);
    execute(core, actions, table, effects)
}

/// Writes what positioned sinks committed and the store lacks (with
/// [`Core::defer_positioned_records`]) in one transaction, then moves the
/// checkpoint as far as the records allow. Returns whether it wrote
/// anything. Only between batches.
pub fn record_deferred<E: Effects>(
    core: &mut Core,
    effects: &mut E,
) -> Result<bool, ExecError<E::Error>> {
    let records = core.unrecorded();
    if records.is_empty() {
        return Ok(false);
    }
    effects.record(&records).map_err(ExecError::Effect)?;
    effects
        .reached(CrashPoint::AfterStoreWrite)
        .map_err(ExecError::Effect)?;
    for action in core.record_deferred(&records) {
        match action {
            Action::Checkpoint { position } => {
                effects.checkpoint(&position).map_err(ExecError::Effect)?
            }
            other => unreachable!("a deferred record asked for {other:?}"),
        }
    }
    Ok(true)
}

/// Carries out actions in waves: the sink calls of one wave run side by
/// side; the store writes of one wave share one transaction, made after
/// every sink call of the wave has returned.
fn execute<E: Effects>(
    core: &mut Core,
    actions: Vec<Action>,
    table: &str,
    effects: &mut E,
) -> Result<(), ExecError<E::Error>> {
    let mut pending = actions;
    while !pending.is_empty() {
        let mut calls = Vec::new();
        let mut records = Vec::new();
        for action in std::mem::take(&mut pending) {
            match action {
                Action::Call(call) => {
                    if matches!(call, SinkCall::Commit { .. }) {
                        effects
                            .reached(CrashPoint::BeforeSinkCommit)
                            .map_err(ExecError::Effect)?;
                    }
                    calls.push(call);
                }
                Action::Record(record) => records.push(record),
                Action::Checkpoint { position } => {
                    effects.checkpoint(&position).map_err(ExecError::Effect)?
                }
                Action::Disable { sink, reason } => effects
                    .disable(sink, table, &reason)
                    .map_err(ExecError::Effect)?,
            }
        }
        let mut events = Vec::new();
        if !calls.is_empty() {
            let kinds: Vec<(SinkId, bool)> = calls
                .iter()
                .map(|c| (c.sink(), matches!(c, SinkCall::Commit { .. })))
                .collect();
            let outcomes = effects.call_sinks(calls).map_err(ExecError::Effect)?;
            assert_eq!(outcomes.len(), kinds.len(), "one outcome per sink call");
            let mut committed = false;
            for ((sink, is_commit), outcome) in kinds.into_iter().zip(outcomes) {
                events.push(match outcome {
                    Ok(()) if is_commit => {
                        committed = true;
                        Event::Committed { sink }
                    }
                    Ok(()) => Event::Staged { sink },
                    Err(failure) => Event::Failed { sink, failure },
                });
            }
            if committed {
                effects
                    .reached(CrashPoint::AfterSinkCommit)
                    .map_err(ExecError::Effect)?;
            }
        }
        if !records.is_empty() {
            // A transaction is made anyway: deferred records ride along free.
            let riders: Vec<Record> = core
                .unrecorded()
                .into_iter()
                .filter(|d| {
                    !records
                        .iter()
                        .any(|r| r.sink == d.sink && r.table == d.table)
                })
                .collect();
            let written = [records.as_slice(), riders.as_slice()].concat();
            effects.record(&written).map_err(ExecError::Effect)?;
            effects
                .reached(CrashPoint::AfterStoreWrite)
                .map_err(ExecError::Effect)?;
            core.note_recorded(&riders);
            events.extend(records.iter().map(|r| Event::Recorded { sink: r.sink }));
        }
        for event in events {
            pending.extend(core.handle(event)?);
        }
    }
    Ok(())
}
