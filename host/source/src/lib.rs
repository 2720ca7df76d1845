//! Sources: where row changes come from, in position order, one whole
//! transaction at a time ([`Source`]: the [`generator`], [`postgres`] and
//! [`mysql`]),
//! the [`change`]s they produce, and the [`batch`]er that turns them into
//! one Arrow batch per table for the commit core.

pub mod batch;
pub mod change;
pub mod commit_order;
pub mod generator;
pub mod mysql;
pub mod postgres;

use std::sync::Arc;

use crate::change::{TableSchema, Transaction};
use weir_core::position::Position;

/// A server a source connects to, as an operator's grants name it: under
/// `weir serve` each must be granted to the pipeline's tenant, whichever
/// kind of source it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A host name or address, and a TCP port.
    Tcp { host: String, port: u16 },
    /// A Unix socket, by its folder or path.
    Unix(String),
}

/// A source of row changes in position order.
pub trait Source: Send {
    /// Every table this source can emit, known up front.
    fn tables(&self) -> Vec<Arc<TableSchema>>;

    /// Skip everything at or before `after` (None = from the beginning).
    /// Called once, before the first `next_transaction`.
    fn resume_after(&mut self, after: Option<&Position>) -> Result<(), SourceError>;

    /// The next whole transaction, or Ok(None) when a bounded source is exhausted.
    /// When resuming inside a transaction, this is the part of it after the resume position.
    fn next_transaction(&mut self) -> Result<Option<Transaction>, SourceError>;

    /// The source's current head (the last position it has, or will produce
    /// in bounded mode), for lag reporting.
    fn head(&self) -> Option<Position>;

    /// The furthest position this source can have produced so far, in any
    /// run, or None when it cannot tell. A sink that claims to have
    /// committed past it is lying, and the host refuses the claim rather
    /// than acknowledge what the source never produced.
    fn ceiling(&mut self) -> Result<Option<Position>, SourceError> {
        Ok(None)
    }

    /// The lowest position a sink may stand at and still be given every
    /// later change (`None`: any). A sink behind it cannot catch up: the
    /// source has released what it needs (a Postgres slot's confirmed
    /// position).
    fn first_available(&mut self) -> Result<Option<Position>, SourceError> {
        Ok(None)
    }

    /// How many of the source's transactions lie after `position` (all of
    /// them for `None`) up to its head, where the source can count them
    /// from its own positions (the generator can; Postgres says how far
    /// behind it is in bytes, [`Source::lag_bytes`]). For `weir status`,
    /// never for decisions: nothing above the sources reads a position.
    fn transactions_after(&self, _position: Option<&Position>) -> Option<u64> {
        None
    }

    /// How many bytes of the source's log lie past what was acknowledged,
    /// where the source can say (for the lag metric; never for decisions).
    fn lag_bytes(&self) -> Option<u64> {
        None
    }

    /// Every required sink has durably committed up to `pos`: the source may
    /// release what lies at or before it (Postgres: `confirmed_flush_lsn`).
    fn acknowledge(&mut self, pos: &Position) -> Result<(), SourceError>;
}

/// Why a source could not go on.
#[derive(thiserror::Error, Debug)]
pub enum SourceError {
    /// The source cannot start where it was asked to (the position is not
    /// one of its own, or what lies after it has already been released).
    #[error("cannot resume after position {position}: {reason}")]
    Resume { position: Position, reason: String },
    /// The source could not be reached or dropped the connection; retrying may help.
    #[error("source unavailable: {0}")]
    Unavailable(String),
    /// The source sent something that cannot be turned into changes
    /// (unknown table, undecodable value, protocol violation).
    #[error("source sent invalid data: {0}")]
    Invalid(String),
    /// The source is configured in a way it cannot work with.
    #[error("source misconfigured: {0}")]
    Config(String),
    #[error("source I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

impl SourceError {
    /// Whether retrying the same call later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SourceError::Unavailable(_) | SourceError::Io(_))
    }
}
