//! weir: streams row changes from operational databases into destinations
//! written as WebAssembly components, exactly once where the sink keeps
//! positions and at-least-once (idempotent by batch id) where it does not.
//!
//! The layout follows the data: [`source`] produces [`change`]s at
//! [`position`]s, [`batch`] turns them into Arrow batches per table, the
//! [`commit`] core decides what is staged, committed, recorded in the
//! [`store`] and acknowledged, and the [`runtime`] runs the sink plugins.
//! [`pipeline`] is the shell that wires them together.

pub mod batch;
pub mod change;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod failpoint;
pub mod metrics;
pub mod pipeline;
pub mod runtime;
pub mod serve;
pub mod source;
pub mod status;
pub mod store;

// The sans-IO core lives in its own crate (no I/O crate in its dependencies);
// these keep the host's paths to it short.
pub use weir_core::{commit, position};
