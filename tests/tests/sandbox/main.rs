//! The sandbox and the plugin runtime: what a sink may and may not do
//! (memory, time, bytes, claims, load-time checks, network grants), how
//! plugins are inspected and tested (`weir plugin inspect`, `weir plugin
//! test`), a new sink project made by `weir plugin new` built and run, and
//! sinks written in Python and JavaScript.
//!
//! One binary for the area, one module per concern (each was a test binary
//! of its own, linking the whole host again). `python_sink` runs the
//! runtime in this process; the rest start the `weir` binary.

#[path = "../common/mod.rs"]
mod common;

mod basics;
mod bytes;
mod claims;
mod error_text;
mod js_sink;
mod load;
mod network_grants;
mod plugin_new;
mod plugin_test;
mod plugins;
mod python_sink;
mod time;
