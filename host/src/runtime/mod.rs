//! The plugin runtime: one wasmtime engine, the capabilities a sink may
//! import, and sandboxed instances of sink components.

pub mod bindings;
pub mod blobstore;
pub mod engine;
pub mod plugin;

pub use blobstore::{BlobError, BlobScope};
pub use engine::WasmEngine;
pub use plugin::{
    CallError, Limits, LoadError, Plugin, PluginInfo, SinkError, SinkInstance, SinkPosition,
};
