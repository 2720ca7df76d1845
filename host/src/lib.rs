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
pub mod commit;
pub mod config;
pub mod failpoint;
pub mod pipeline;
pub mod position;
pub mod runtime;
pub mod source;
pub mod status;
pub mod store;
