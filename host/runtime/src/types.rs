//! What the host says to a sink and hears back, in the host's own types.
//! The contract version a plugin speaks is the runtime's business: these
//! are converted to and from that version's WIT types inside
//! [`runtime`](super) only.

use std::sync::Arc;

use weir_contract::Mode;
use weir_core::Position;

/// A context column present in every batch, under the operator's name.
pub use weir_contract::MetadataColumn;

/// The request to make what is staged for a table durable, as the commit
/// core issues it.
pub use weir_core::CommitRequest;

/// An export a sink may have beside `sink`. Found when its plugin loads,
/// listed by `weir plugin inspect`, and looked up in each instance: this
/// enum is the one list of them, so a new optional export is added here
/// and where its version's WIT is bound (`wit/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptionalExport {
    /// `positions`: the sink stores positions with its data (exactly-once).
    Positions,
    /// `maintenance`: the sink maintains its destination (`weir maintain`).
    Maintenance,
}

impl OptionalExport {
    /// Every optional export, in the order `weir plugin inspect` lists them.
    pub const ALL: [OptionalExport; 2] = [OptionalExport::Positions, OptionalExport::Maintenance];

    /// The capability's name, as operators read it.
    pub fn name(self) -> &'static str {
        match self {
            OptionalExport::Positions => "positions",
            OptionalExport::Maintenance => "maintenance",
        }
    }
}

impl std::fmt::Display for OptionalExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a sink needs to know about the table a batch belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDescription {
    /// The table's name in the source, for example `public.orders`.
    pub name: String,
    /// The key columns, in key order; empty for a table without a key.
    pub key_columns: Vec<String>,
    /// How changes are applied in the destination.
    pub mode: Mode,
    /// The destination name the operator chose; `name` when not mapped.
    pub destination: String,
    /// Context columns the operator asked for, present in every batch.
    pub metadata: Vec<MetadataColumn>,
}

/// Everything about a batch besides its rows (which travel as Arrow IPC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    /// The table, shared by every batch of it.
    pub table: Arc<TableDescription>,
    /// Deterministic for the same table and position range, across restarts.
    pub id: String,
    /// Position of the first change in the batch.
    pub low: Position,
    /// Position the table stands at once the batch is committed.
    pub high: Position,
    /// Number of rows in the Arrow stream.
    pub rows: u32,
}

/// Where a positioned sink says a table stands (position and epoch of its
/// last durable commit), as the commit core takes it: untrusted until the
/// core has checked it.
pub use weir_core::SinkClaim;

/// A sink's own error: what it asks the host to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Transient: retry the same call.
    #[error("retryable error: {0}")]
    Retryable(String),
    /// The batch can never be written: stop without advancing past it.
    #[error("poison batch: {0}")]
    Poison(String),
    /// A newer host owns the table: stop and commit nothing more.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The sink cannot go on.
    #[error("fatal error: {0}")]
    Fatal(String),
}
