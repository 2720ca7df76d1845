//! The data of one instance's store: what its host functions see (WASI
//! with nothing ambient, the capabilities' state) and what its limiter
//! counts.

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpView};

use super::capability::network::tcp::HasNetwork;
use super::capability::network::{SinkNetwork, TcpSockets};
use super::capability::{CapabilityStates, HasCapabilities};
use super::cause::StderrTail;

/// Per-instance state the host functions see.
pub struct HostState {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) capabilities: CapabilityStates,
    /// The most linear memory the instance may hold, summed over all its
    /// memories: a component may carry several core modules, each with
    /// memories of its own.
    pub(super) memory_limit: usize,
    /// What its memories hold now, summed.
    pub(super) memory_held: usize,
    /// What the last grow added to `memory_held`, undone if it failed.
    pub(super) memory_last_grow: usize,
    pub(super) memory_exhausted: bool,
    /// The tail of the guest's stderr, to quote a panic message.
    pub(super) stderr: StderrTail,
}

impl HasCapabilities for HostState {
    fn capabilities(&mut self) -> &mut CapabilityStates {
        &mut self.capabilities
    }
}

// The network capability's functions need the instance's resource table
// beside its state: both borrowed at once, as disjoint fields.
impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        self.capabilities.network.http_view(&mut self.table)
    }
}

impl HasNetwork for HostState {
    fn network(&mut self) -> (&SinkNetwork, &mut ResourceTable) {
        (self.capabilities.network.granted(), &mut self.table)
    }

    fn tcp_sockets(&mut self) -> &mut TcpSockets {
        self.capabilities.network.tcp_sockets()
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

/// At most this many linear memories and tables per instance; a sink built
/// from one language needs one or two of each.
pub(super) const MAX_MEMORIES: usize = 16;
pub(super) const MAX_TABLES: usize = 64;
/// The most elements one table may grow to.
const MAX_TABLE_ELEMENTS: usize = 1_000_000;

impl wasmtime::ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // wasmtime asks per memory; the limit holds for their sum, or a
        // component with many memories would hold many times its limit.
        let others = self.memory_held.saturating_sub(current);
        let total = others.saturating_add(desired);
        if total > self.memory_limit {
            self.memory_exhausted = true;
            // An error (rather than `false`) traps at once with this
            // message instead of letting the guest's allocator abort.
            return Err(wasmtime::format_err!(
                "memory limit of {} MiB reached (its memories would hold {} MiB)",
                self.memory_limit >> 20,
                total >> 20
            ));
        }
        self.memory_last_grow = total - self.memory_held;
        self.memory_held = total;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        // The guest sees the failed grow (-1); only the count is undone.
        self.memory_held -= self.memory_last_grow;
        self.memory_last_grow = 0;
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}
