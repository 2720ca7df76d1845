//! The data of one instance's store: what its host functions see (WASI
//! with nothing ambient, the capabilities' state) and what its limiter
//! counts.

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::capability::{CapabilityStates, HasCapabilities};
use super::cause::StderrTail;

/// Per-instance state the host functions see.
pub struct HostState {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) capabilities: CapabilityStates,
    pub(super) memory_limit: usize,
    pub(super) memory_exhausted: bool,
    /// The tail of the guest's stderr, to quote a panic message.
    pub(super) stderr: StderrTail,
}

impl HasCapabilities for HostState {
    fn capabilities(&mut self) -> &mut CapabilityStates {
        &mut self.capabilities
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl wasmtime::ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_exhausted = true;
            // An error (rather than `false`) traps at once with this
            // message instead of letting the guest's allocator abort.
            return Err(wasmtime::format_err!(
                "memory limit of {} MiB reached (asked for {} MiB)",
                self.memory_limit >> 20,
                desired >> 20
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}
