//! The log capability: a sink's messages go into the host's log, tagged
//! with the sink's name.

use wasmtime::component::Linker;

use super::{Capability, Grants};
use crate::runtime::instance::HostState;
use crate::runtime::wit;

/// The log capability.
pub struct Log;

impl Capability for Log {
    const INTERFACE: &'static str = "log";
    type State = SinkLog;

    fn instance_state(grants: &Grants) -> SinkLog {
        SinkLog {
            sink: grants.sink_name.clone(),
        }
    }

    fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        wit::link_log(linker, |state| &state.capabilities.log)
    }
}

/// How important a sink's message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Step-by-step detail.
    Trace,
    /// Detail for whoever debugs the sink.
    Debug,
    /// Normal operation.
    Info,
    /// Something the operator may want to look at.
    Warn,
    /// Something failed.
    Error,
}

/// One instance's log: where its messages go and under which name.
#[derive(Debug, Clone)]
pub struct SinkLog {
    sink: String,
}

impl SinkLog {
    /// Writes one message from the sink.
    pub fn write(&self, level: LogLevel, message: &str) {
        let sink = self.sink.as_str();
        match level {
            LogLevel::Trace => tracing::trace!(sink, "{message}"),
            LogLevel::Debug => tracing::debug!(sink, "{message}"),
            LogLevel::Info => tracing::info!(sink, "{message}"),
            LogLevel::Warn => tracing::warn!(sink, "{message}"),
            LogLevel::Error => tracing::error!(sink, "{message}"),
        }
    }
}
