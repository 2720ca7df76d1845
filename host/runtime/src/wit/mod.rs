//! The released versions of the sink contract, one module each with its own
//! `bindgen!` (the shape of Zed's `since_v0_*` modules). A plugin speaks one
//! version; the enums here dispatch to it, so nothing above the runtime sees
//! a version or a WIT-generated type. A new version is one more module and
//! one more variant in each enum.

mod v0_1_0;

use wasmtime::Store;
use wasmtime::component::{Instance, InstancePre, Linker};
use weir_core::CommitRequest;

use super::capability::HasCapabilities;
use super::types::{BatchHeader, OptionalExport, SinkClaim, SinkError};

/// The contract's package, as it prefixes import and export names.
pub const PACKAGE: &str = "weir:sink";

/// Every contract version this host speaks, oldest first.
pub const VERSIONS: [&str; 1] = [v0_1_0::VERSION];

/// The version a new plugin should be built against.
pub const NEWEST: &str = v0_1_0::VERSION;

/// Whether this host speaks `version` of the contract.
pub fn speaks(version: &str) -> bool {
    VERSIONS.contains(&version)
}

/// The versions this host speaks, as an operator reads them in a message.
pub fn spoken() -> String {
    let names: Vec<String> = VERSIONS.iter().map(|v| format!("{PACKAGE}@{v}")).collect();
    names.join(", ")
}

/// The name of `interface` of `version` in imports and exports:
/// `weir:sink/sink@0.1.0`.
pub fn interface_name(interface: &str, version: &str) -> String {
    format!("{PACKAGE}/{interface}@{version}")
}

/// The export name of an optional export for a plugin of `version`;
/// `None` where that version has no such export.
pub fn export_name(export: OptionalExport, version: &str) -> Option<String> {
    match (export, version) {
        (OptionalExport::Positions, _) => Some(interface_name("positions", version)),
        (OptionalExport::Maintenance, v0_1_0::VERSION) => {
            Some(v0_1_0::MAINTENANCE_EXPORT.to_string())
        }
        _ => None,
    }
}

/// Adds every version's interfaces: the shared `types`, and each
/// capability's interface served by that capability's state.
pub fn add_to_linker<T: HasCapabilities>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    v0_1_0::add_to_linker(linker)
}

/// Where a loaded plugin's exports sit, for the version it speaks.
pub enum ExportIndices {
    V0_1_0(v0_1_0::ExportIndices),
}

impl ExportIndices {
    /// Finds the exports of a plugin that speaks `version`: `sink`, and
    /// each of `optional`.
    pub fn new<T: 'static>(
        version: &str,
        pre: &InstancePre<T>,
        optional: &[OptionalExport],
    ) -> wasmtime::Result<Self> {
        match version {
            v0_1_0::VERSION => Ok(Self::V0_1_0(v0_1_0::ExportIndices::new(pre, optional)?)),
            other => Err(wasmtime::format_err!(
                "{PACKAGE}@{other} is not a version this host speaks"
            )),
        }
    }

    /// The exports of one instance.
    pub fn load<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        instance: &Instance,
    ) -> wasmtime::Result<SinkExports> {
        match self {
            Self::V0_1_0(indices) => Ok(SinkExports::V0_1_0(indices.load(store, instance)?)),
        }
    }
}

/// What a call into a sink returns: the outer error is the engine's (a
/// trap, a deadline), the inner one the sink's own answer.
pub type Answer<T> = wasmtime::Result<Result<T, SinkError>>;

/// One instance's exports, in the version its plugin speaks.
pub enum SinkExports {
    V0_1_0(v0_1_0::SinkExports),
}

impl SinkExports {
    /// `sink.open`.
    pub fn open<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        pipeline: &str,
        config: &[(String, String)],
    ) -> Answer<()> {
        match self {
            Self::V0_1_0(exports) => exports.open(store, pipeline, config),
        }
    }

    /// `sink.write`.
    pub fn write<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        header: &BatchHeader,
        ipc: &[u8],
    ) -> Answer<()> {
        match self {
            Self::V0_1_0(exports) => exports.write(store, header, ipc),
        }
    }

    /// `sink.commit`.
    pub fn commit<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        request: &CommitRequest,
    ) -> Answer<()> {
        match self {
            Self::V0_1_0(exports) => exports.commit(store, request),
        }
    }

    /// `sink.abort`.
    pub fn abort<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        table: &str,
    ) -> wasmtime::Result<()> {
        match self {
            Self::V0_1_0(exports) => exports.abort(store, table),
        }
    }

    /// `maintenance.maintain`: the sink's report, or `None` from a sink
    /// without `maintenance`.
    pub fn maintain<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        pipeline: &str,
        tables: &[String],
        what: &[String],
    ) -> Answer<Option<String>> {
        match self {
            Self::V0_1_0(exports) => exports.maintain(store, pipeline, tables, what),
        }
    }

    /// `positions.committed`; `None` from a sink without `positions`.
    pub fn committed<T: HasCapabilities>(
        &self,
        store: &mut Store<T>,
        pipeline: &str,
        table: &str,
    ) -> Answer<Option<SinkClaim>> {
        match self {
            Self::V0_1_0(exports) => exports.committed(store, pipeline, table),
        }
    }
}
