//! The out-of-sink position store: where the host keeps each sink's
//! committed position per table when the sink cannot keep it itself, and
//! each pipeline's fencing epoch.
//!
//! Behind a trait, so the host service and multi-host set-ups can add other
//! stores beside the embedded one ([`embedded::EmbeddedStore`], redb).

// redb's error type is large; its errors are rare and end the run, so
// boxing them buys nothing.
#![allow(clippy::result_large_err)]

pub mod embedded;

use std::path::PathBuf;

use weir_core::position::Position;

pub use embedded::EmbeddedStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the position store {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: redb::DatabaseError,
    },
    #[error("position store {path}: {detail}")]
    Io { path: PathBuf, detail: String },
    #[error("pipeline `{pipeline}` has used every fencing epoch; it cannot start again")]
    EpochsExhausted { pipeline: String },
    /// This run may no longer write: another owner took the pipeline, or
    /// this host could lose it before a commit ends.
    #[error("pipeline `{pipeline}` is no longer this run's to commit: {detail}")]
    Fenced { pipeline: String, detail: String },
    /// A store shared by several hosts could not be reached or read.
    #[error("the position store: {0}")]
    Shared(String),
}

/// One position to write or clear.
#[derive(Clone, Debug)]
pub struct Entry {
    pub sink: String,
    pub table: String,
    pub position: Option<Position>,
}

/// A stored position, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub sink: String,
    pub table: String,
    pub position: Position,
}

/// Where positions and epochs are kept, durably. Every write is atomic and
/// durable when it returns: the commit core counts on it.
pub trait PositionStore: Send {
    /// Takes the next fencing epoch for a pipeline: every run gets a larger
    /// one than every run before it.
    fn next_epoch(&self, pipeline: &str) -> Result<u64, StoreError>;

    /// Makes a pipeline's epoch at least `at_least` and returns the epoch
    /// now in force.
    fn raise_epoch(&self, pipeline: &str, at_least: u64) -> Result<u64, StoreError>;

    /// The last epoch taken for a pipeline, if any.
    fn current_epoch(&self, pipeline: &str) -> Result<Option<u64>, StoreError>;

    /// A sink's position for a table.
    fn get(&self, pipeline: &str, sink: &str, table: &str) -> Result<Option<Position>, StoreError>;

    /// Writes (or clears) several positions in one transaction.
    fn put_all(&self, pipeline: &str, entries: &[Entry]) -> Result<(), StoreError>;

    /// Every position stored for a pipeline.
    fn list(&self, pipeline: &str) -> Result<Vec<Stored>, StoreError>;

    /// Whether this run may still begin a commit. A store shared by several
    /// hosts refuses once this host could lose the pipeline before the
    /// commit ends; the embedded store is one host's, and always agrees.
    fn may_commit(&self, pipeline: &str) -> Result<(), StoreError> {
        let _ = pipeline;
        Ok(())
    }
}
