//! Commit and recovery: the sans-IO state machine ([`core`]) that decides
//! what is staged, committed, recorded and acknowledged, and in which order.

pub mod core;

pub use self::core::{
    Action, CommitPolicy, CommitRequest, Core, Event, Failure, FailureKind, Origin, Resume, SinkId,
    SinkSpec, Stop,
};
