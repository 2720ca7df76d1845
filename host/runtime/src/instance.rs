//! A sandboxed instance of a sink plugin: its own store, a CPU deadline and
//! a memory limit on every call, the capabilities the sink was granted, and
//! nothing ambient. Host types go in; the plugin's contract version is
//! handled below, in [`wit`](super::wit).

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime::{Store, Trap};
use wasmtime_wasi::WasiCtxBuilder;
use weir_core::CommitRequest;

use super::budget::Claim;
use super::capability::network::{self, SinkNetwork};
use super::capability::{CapabilityStates, Grants, blobstore::BlobScope};
use super::cause;
use super::engine::EPOCH_TICK;
use super::host_state::HostState;
use super::plugin::{Plugin, PluginInfo};
use super::tenant::TenantShare;
use super::types::{BatchHeader, SinkClaim, SinkError};
use super::wit::{Answer, SinkExports};

/// Resources an operator grants one sink instance.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The most linear memory the instance may grow to.
    pub memory_bytes: usize,
    /// The CPU deadline of each call.
    pub call_timeout: Duration,
    /// How much it may log, and how long its log and error messages may be.
    pub log: super::capability::log::LogLimits,
}

impl Default for Limits {
    /// What a sink gets when its pipeline file sets none of these.
    fn default() -> Self {
        Limits {
            memory_bytes: 512 << 20,
            call_timeout: Duration::from_secs(60),
            log: Default::default(),
        }
    }
}

/// How a call into a plugin failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The sink returned an error of its own.
    #[error("{0}")]
    Sink(SinkError),
    /// The instance trapped; it cannot be entered again.
    #[error("trapped: {0}")]
    Trap(String),
    /// The call ran past its CPU deadline.
    #[error("did not return within its CPU deadline of {0:?}")]
    Deadline(Duration),
    /// The call did not return within its wall-clock bound: the guest is
    /// blocked where the CPU deadline cannot reach it. The worker is given up.
    #[error(
        "`{call}` did not return within its wall-clock deadline of {} ms (blocked outside WebAssembly, e.g. sleeping or waiting on I/O)",
        bound.as_millis()
    )]
    Stalled {
        /// The call that overran: `open`, `write`, `commit`, ...
        call: &'static str,
        /// The bound it overran.
        bound: Duration,
    },
    /// The instance asked for more memory than it was granted.
    #[error("{0}")]
    Memory(String),
    /// The instance was not made: its tenant's share of a resource the
    /// host shares (instance slots) is held in full. Nothing ran.
    #[error("{0}")]
    Refused(String),
}

/// One live instance of a plugin. After a trap it is unusable (a trapped
/// component instance cannot be entered again); make a new one.
pub struct SinkInstance {
    store: Store<HostState>,
    plugin: Arc<Plugin>,
    limits: Limits,
    exports: SinkExports,
    /// Its slot of the engine's pool, counted against its tenant until the
    /// instance is dropped: a worker given up on while it still runs holds
    /// its instance, so it keeps counting until its thread really ends.
    _slot: Claim,
}

impl SinkInstance {
    /// A fresh instance of `plugin` for the sink `sink_name`, granted `blob`
    /// and held to `limits`.
    pub fn instantiate(
        plugin: &Arc<Plugin>,
        sink_name: &str,
        blob: Arc<BlobScope>,
        network: SinkNetwork,
        limits: &Limits,
    ) -> Result<Self, CallError> {
        Self::instantiate_for_tenant(plugin, sink_name, blob, network, limits, None)
    }

    /// The same as [`instantiate`](Self::instantiate), for a sink whose
    /// log lines also pass its tenant's shared rate (`weir serve`). The
    /// tenant's storage quota comes with `blob` ([`BlobScope::with_tenant`]).
    pub fn instantiate_for_tenant(
        plugin: &Arc<Plugin>,
        sink_name: &str,
        blob: Arc<BlobScope>,
        network: SinkNetwork,
        limits: &Limits,
        tenant: Option<Arc<TenantShare>>,
    ) -> Result<Self, CallError> {
        let grants = Grants {
            sink_name: sink_name.to_string(),
            blob,
            log: limits.log,
            network,
            tenant,
        };
        Self::new(plugin.clone(), &grants, limits)
    }

    /// A fresh instance of `plugin` with its own store, limits and grants,
    /// in a slot of the engine's pool taken from its tenant's share (or,
    /// for a sink of no tenant, from the pool's reserve as well).
    pub fn new(plugin: Arc<Plugin>, grants: &Grants, limits: &Limits) -> Result<Self, CallError> {
        let slot = plugin
            .take_slot(grants.tenant.as_deref())
            .map_err(|refused| {
                let tenant = grants
                    .tenant
                    .as_ref()
                    .map(|t| format!(" of tenant `{}`", t.tenant))
                    .unwrap_or_default();
                tracing::warn!(sink = %grants.sink_name, "instance refused: {refused}");
                CallError::Refused(format!(
                    "no instance slot for sink `{}`{tenant}: {refused}",
                    grants.sink_name
                ))
            })?;
        // No preopened folders, no environment, no arguments: everything a
        // sink may touch comes through the weir imports, and the network
        // only as far as it was granted (its sockets as the network
        // capability sets them). Its stderr is kept (a bounded tail) only to
        // quote why it died.
        let stderr = cause::StderrTail::default();
        let mut wasi = WasiCtxBuilder::new();
        wasi.stderr(stderr.clone());
        network::configure_sockets(&mut wasi, &grants.network);
        let wasi = wasi.build();
        let capabilities = CapabilityStates::new(grants);
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            capabilities,
            memory_limit: limits.memory_bytes,
            memory_held: 0,
            memory_last_grow: 0,
            memory_exhausted: false,
            stderr,
        };
        let mut store = Store::new(plugin.pre().engine(), state);
        store.limiter(|state| state);
        arm(&mut store, limits);
        let exports = plugin
            .pre()
            .instantiate(&mut store)
            .and_then(|handle| plugin.exports().load(&mut store, &handle))
            .map_err(|e| classify(&store, limits, e))?;
        Ok(SinkInstance {
            store,
            plugin,
            limits: limits.clone(),
            exports,
            _slot: slot,
        })
    }

    /// What the plugin is.
    pub fn info(&self) -> &PluginInfo {
        &self.plugin.info
    }

    /// The linear memory the instance holds now, summed over its memories
    /// (as its limiter counts it).
    pub fn memory_bytes(&self) -> u64 {
        self.store.data().memory_held as u64
    }

    /// Hands the sink its pipeline and configuration; called once, first.
    pub fn open(&mut self, pipeline: &str, config: &[(String, String)]) -> Result<(), CallError> {
        self.arm();
        let answer = self.exports.open(&mut self.store, pipeline, config);
        self.finish(answer)
    }

    /// Stages one batch: its header and its rows as Arrow IPC stream bytes.
    pub fn write(&mut self, header: &BatchHeader, ipc: &[u8]) -> Result<(), CallError> {
        self.arm();
        let answer = self.exports.write(&mut self.store, header, ipc);
        self.finish(answer)
    }

    /// Makes what is staged for the request's table durable.
    pub fn commit(&mut self, request: &CommitRequest) -> Result<(), CallError> {
        self.arm();
        let answer = self.exports.commit(&mut self.store, request);
        self.finish(answer)
    }

    /// Drops what is staged for `table`.
    pub fn abort(&mut self, table: &str) -> Result<(), CallError> {
        self.arm();
        let result = self.exports.abort(&mut self.store, table);
        result.map_err(|e| classify(&self.store, &self.limits, e))
    }

    /// The sink's own record of where a table stands, if it has `positions`.
    pub fn committed(
        &mut self,
        pipeline: &str,
        table: &str,
    ) -> Result<Option<SinkClaim>, CallError> {
        self.arm();
        let answer = self.exports.committed(&mut self.store, pipeline, table);
        self.finish(answer)
    }

    /// Runs the sink's maintenance (`weir maintain`) and returns its report;
    /// `None` from a sink without `maintenance`.
    pub fn maintain(
        &mut self,
        pipeline: &str,
        tables: &[String],
        what: &[String],
    ) -> Result<Option<String>, CallError> {
        self.arm();
        let answer = self
            .exports
            .maintain(&mut self.store, pipeline, tables, what);
        self.finish(answer)
    }

    /// Sets the CPU deadline for the next call, and forgets the output of
    /// earlier ones.
    fn arm(&mut self) {
        arm(&mut self.store, &self.limits);
        self.store.data().stderr.clear();
    }

    fn finish<T>(&mut self, answer: Answer<T>) -> Result<T, CallError> {
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(CallError::Sink(e)),
            Err(e) => Err(classify(&self.store, &self.limits, e)),
        }
    }
}

fn arm(store: &mut Store<HostState>, limits: &Limits) {
    let ticks = (limits.call_timeout.as_millis() / EPOCH_TICK.as_millis()).max(1);
    store.set_epoch_deadline(ticks as u64);
    store.epoch_deadline_trap();
}

fn classify(store: &Store<HostState>, limits: &Limits, error: wasmtime::Error) -> CallError {
    if store.data().memory_exhausted {
        return CallError::Memory(format!(
            "exceeded its memory limit of {} MiB",
            limits.memory_bytes >> 20
        ));
    }
    if let Some(Trap::Interrupt) = error.downcast_ref::<Trap>() {
        return CallError::Deadline(limits.call_timeout);
    }
    CallError::Trap(cause::describe(&error, &store.data().stderr))
}
