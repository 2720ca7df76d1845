//! The contract between the weir host and every sink, as Rust: the facts
//! both sides must spell the same way. The WIT packages beside this crate
//! (`wit/since_vX.Y.Z/`) say what crosses the boundary; this crate says how
//! the values inside it are named and encoded, so the host and the SDK
//! cannot drift apart.

pub mod blob_path;
pub mod columns;
pub mod grants;
pub mod ipc;

pub use columns::{
    CONTROL_COLUMNS, ContextField, MetadataColumn, Mode, OP_COLUMN, Op, POS_COLUMN, UTC_ZONE,
    utc_micros,
};
