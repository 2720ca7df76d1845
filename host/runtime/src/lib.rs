//! The plugin runtime: one wasmtime engine, plugins loaded and checked
//! against the contract, sandboxed instances of them, one worker thread per
//! sink, and the host capabilities a sink may import.
//!
//! Everything above this module speaks the host's types ([`types`]); which
//! version of the WIT contract a plugin was built against is settled inside,
//! in the private `wit` module.

pub mod budget;
pub mod capability;
mod cause;
pub mod compiler;
pub mod engine;
mod guest_error;
pub mod host_state;
pub mod instance;
pub mod plugin;
pub mod tenant;
pub mod types;
mod wit;
pub mod worker;

pub use capability::blobstore::{BlobError, BlobScope};
// The crates above name the network's grants and limits here, beside the
// runtime's other entry points.
pub use capability::network;
pub use engine::{EngineError, WasmEngine};
pub use instance::{CallError, Limits, SinkInstance};
pub use plugin::{LoadError, Plugin, PluginInfo};
pub use tenant::TenantShare;
pub use types::{
    BatchHeader, CommitRequest, MetadataColumn, OptionalExport, SinkClaim, SinkError,
    TableDescription,
};
pub use worker::{Pending, SinkWorker, WorkerSpec};
