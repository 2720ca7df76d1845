//! What goes into the commit core and what comes out: the sinks it is
//! told about, the actions it asks for, the events it is fed, and how it
//! refuses or stops.

use std::fmt;

use crate::position::Position;

/// The largest fencing epoch a host ever hands out. Each run takes one, so
/// no honest sink can have seen more; a claim above it is a lie, and
/// refusing it keeps one lying sink from pushing the pipeline's epoch to the
/// end of the range, where no later run could fence anything again.
pub const MAX_EPOCH: u64 = 1 << 48;

/// Index of a sink in the pipeline's sink list.
pub type SinkId = usize;

/// What the core needs to know about a sink.
#[derive(Clone, Debug)]
pub struct SinkSpec {
    pub name: String,
    /// A required sink that fails stops the pipeline; an optional one is
    /// disabled for the rest of the run and the others go on.
    pub required: bool,
    /// The sink exports `positions`: it stores positions with its data.
    pub positioned: bool,
}

/// Which sinks must have committed before the source checkpoint moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CommitPolicy {
    /// Every required sink.
    #[default]
    Required,
    /// Every sink, required or not.
    All,
    /// A majority of all sinks.
    Quorum,
}

impl CommitPolicy {
    pub const ALL: [CommitPolicy; 3] = [
        CommitPolicy::Required,
        CommitPolicy::All,
        CommitPolicy::Quorum,
    ];

    /// The spelling in pipeline configs.
    pub fn as_str(self) -> &'static str {
        match self {
            CommitPolicy::Required => "required",
            CommitPolicy::All => "all",
            CommitPolicy::Quorum => "quorum",
        }
    }

    pub fn parse(text: &str) -> Option<CommitPolicy> {
        CommitPolicy::ALL.into_iter().find(|p| p.as_str() == text)
    }
}

/// Where a sink's committed position for a table came from on start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The sink's `positions` capability (authoritative).
    Sink,
    /// The host's out-of-sink position store.
    Store,
    /// Committed during this run.
    ThisRun,
}

impl Origin {
    /// The spelling `weir status` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Sink => "sink",
            Origin::Store => "store",
            Origin::ThisRun => "this run",
        }
    }
}

/// How a sink call ended badly, as far as the core cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The batch can never be written.
    Poison,
    /// A newer host owns the destination.
    Fenced,
    /// The sink cannot go on: fatal error, trap, deadline, memory limit, or
    /// retries exhausted.
    Broken,
}

/// A failed sink call, with the sentence to show the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

/// A commit the core asks a sink to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitRequest {
    pub table: String,
    pub high: Position,
    pub pipeline: String,
    pub epoch: u64,
}

/// What the shell must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Call a sink: stage the offered batch or commit it.
    Call(SinkCall),
    /// Write (or clear) a sink's position in the out-of-sink store, durably.
    Record(Record),
    /// Every sink the policy requires has committed up to here: the source
    /// may release it (Postgres: `confirmed_flush_lsn`).
    Checkpoint { position: Position },
    /// An optional sink failed; it takes no more batches in this run.
    Disable { sink: SinkId, reason: String },
}

/// A call into one sink. The calls of one wave go to different sinks and
/// may run in parallel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkCall {
    /// Send the offered batch to the sink, keeping only changes whose
    /// position is after `after` (those at or before it are committed there
    /// already and must not be applied twice).
    Stage {
        sink: SinkId,
        table: String,
        after: Option<Position>,
    },
    /// Make what is staged for the table durable.
    Commit {
        sink: SinkId,
        request: CommitRequest,
    },
}

impl SinkCall {
    pub fn sink(&self) -> SinkId {
        match self {
            SinkCall::Stage { sink, .. } | SinkCall::Commit { sink, .. } => *sink,
        }
    }
}

/// One position to write (or with `None` clear) in the out-of-sink store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub sink: SinkId,
    pub table: String,
    pub position: Option<Position>,
}

/// What the shell learned from carrying out an action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Staged { sink: SinkId },
    Committed { sink: SinkId },
    Recorded { sink: SinkId },
    Failed { sink: SinkId, failure: Failure },
}

/// The pipeline must stop: a required sink failed, or a sink was fenced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stop {
    pub sink: String,
    pub table: String,
    pub low: Position,
    pub high: Position,
    pub failure: Failure,
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.failure.kind {
            FailureKind::Poison => "refused the batch as poison",
            FailureKind::Fenced => "was fenced by a newer run",
            FailureKind::Broken => "failed",
        };
        write!(
            f,
            "sink `{}` {what} for table `{}` at positions {}..={}: {}; nothing was advanced past {}",
            self.sink, self.table, self.low, self.high, self.failure.message, self.low
        )
    }
}

impl std::error::Error for Stop {}

/// What a positioned sink says about a table on start: the position it
/// committed and the fencing epoch it committed it under. Untrusted: the
/// core checks it before acting on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkClaim {
    pub position: Position,
    pub epoch: u64,
}

/// A sink's claim the core cannot act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRefused {
    pub sink: String,
    pub table: String,
    pub claim: String,
    pub why: String,
}

impl fmt::Display for ClaimRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sink `{}` claims {} for table `{}`, which cannot be true: {}; nothing was acknowledged",
            self.sink, self.claim, self.table, self.why
        )
    }
}

impl std::error::Error for ClaimRefused {}

/// Where the source must resume for every sink to get what it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resume {
    FromStart,
    After(Position),
}
