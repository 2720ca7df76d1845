//! weir's core: positions, and the commit/recovery state machine that
//! decides what is staged, committed, recorded and acknowledged, and in
//! which order, plus the executor that carries its actions out over an
//! [`Effects`](executor::Effects) implementation.
//!
//! Nothing here does I/O, so a test can stop after any step, throw the core
//! away as a crash would, and start a new one from what was durable.

pub mod commit;
pub mod position;

pub use commit::{
    Action, ClaimRefused, CommitPolicy, CommitRequest, Core, CrashPoint, Effects, Event, ExecError,
    Failure, FailureKind, MAX_EPOCH, Origin, Record, Resume, SinkCall, SinkClaim, SinkId, SinkSpec,
    Stop,
};
pub use position::Position;
