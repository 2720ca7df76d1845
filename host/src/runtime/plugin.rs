//! Loading a sink plugin: read and pin the `.wasm`, check what it imports and
//! exports before anything runs, pre-instantiate it, and run its calls under
//! a CPU deadline and a memory limit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{InstancePre, Linker, ResourceTable, types::ComponentItem};
use wasmtime::{Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::v0_1_0 as wit;
use super::blobstore::BlobScope;
use super::engine::{EPOCH_TICK, EngineError, WasmEngine, digest};

/// Why a plugin cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read plugin {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "plugin {path} has sha256 {actual}, but the pipeline pins {expected}; \
         update the pin if this plugin is the one you meant"
    )]
    Pin {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("plugin {path} is not a WebAssembly component weir can load: {detail}")]
    NotAComponent { path: PathBuf, detail: String },
    #[error("plugin {path} {detail}")]
    Contract { path: PathBuf, detail: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What `weir plugin inspect` reports, and what loading checks.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PluginInfo {
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
    /// The `weir:sink` package version the plugin was built against.
    pub wit_version: String,
    /// Optional capabilities it exports (`positions`).
    pub capabilities: Vec<String>,
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

impl PluginInfo {
    pub fn positioned(&self) -> bool {
        self.capabilities.iter().any(|c| c == "positions")
    }
}

/// A loaded, checked and pre-instantiated plugin, ready for instances.
pub struct Plugin {
    pub info: PluginInfo,
    pre: InstancePre<HostState>,
    sink: wit::sink::GuestIndices,
    positions: Option<wit::positions::GuestIndices>,
}

/// Resources an operator grants one sink instance.
#[derive(Debug, Clone)]
pub struct Limits {
    pub memory_bytes: usize,
    pub call_timeout: Duration,
}

/// Per-instance state the host functions see.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    blob: Arc<BlobScope>,
    sink_name: String,
    memory_limit: usize,
    memory_exhausted: bool,
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

impl wit::types::Host for HostState {}

impl wit::blobstore::Host for HostState {
    fn get(&mut self, path: String) -> Result<Vec<u8>, wit::blobstore::BlobError> {
        self.blob.get(&path).map_err(Into::into)
    }

    fn get_range(
        &mut self,
        path: String,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, wit::blobstore::BlobError> {
        self.blob
            .get_range(&path, offset, length)
            .map_err(Into::into)
    }

    fn put(&mut self, path: String, data: Vec<u8>) -> Result<(), wit::blobstore::BlobError> {
        self.blob.put(&path, data).map_err(Into::into)
    }

    fn put_if_absent(
        &mut self,
        path: String,
        data: Vec<u8>,
    ) -> Result<(), wit::blobstore::BlobError> {
        self.blob.put_if_absent(&path, data).map_err(Into::into)
    }

    fn list(
        &mut self,
        prefix: String,
    ) -> Result<Vec<wit::blobstore::ObjectMeta>, wit::blobstore::BlobError> {
        Ok(self
            .blob
            .list(&prefix)?
            .into_iter()
            .map(|m| wit::blobstore::ObjectMeta {
                path: m.path,
                size: m.size,
            })
            .collect())
    }

    fn delete(&mut self, path: String) -> Result<(), wit::blobstore::BlobError> {
        self.blob.delete(&path).map_err(Into::into)
    }
}

impl From<super::blobstore::BlobError> for wit::blobstore::BlobError {
    fn from(e: super::blobstore::BlobError) -> Self {
        use super::blobstore::BlobError as E;
        match e {
            E::NotFound(m) => Self::NotFound(m),
            E::AlreadyExists(m) => Self::AlreadyExists(m),
            E::Denied(m) => Self::Denied(m),
            E::Io(m) => Self::Io(m),
        }
    }
}

impl wit::log::Host for HostState {
    fn log(&mut self, level: wit::log::Level, message: String) {
        let sink = self.sink_name.as_str();
        match level {
            wit::log::Level::Trace => tracing::trace!(sink, "{message}"),
            wit::log::Level::Debug => tracing::debug!(sink, "{message}"),
            wit::log::Level::Info => tracing::info!(sink, "{message}"),
            wit::log::Level::Warn => tracing::warn!(sink, "{message}"),
            wit::log::Level::Error => tracing::error!(sink, "{message}"),
        }
    }
}

/// Builds the linker every plugin is checked and instantiated against: WASI
/// (with nothing ambient: see `new_instance`) and the weir host interfaces.
pub fn linker(engine: &WasmEngine) -> Result<Linker<HostState>, EngineError> {
    let mut linker = Linker::new(engine.engine());
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| EngineError::Config(format!("{e:#}")))?;
    wit::PositionedSinkPlugin::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
        &mut linker,
        |state| state,
    )
    .map_err(|e| EngineError::Config(format!("{e:#}")))?;
    Ok(linker)
}

impl Plugin {
    /// Reads, pins, compiles (or loads from the cache), checks and
    /// pre-instantiates a plugin.
    pub fn load(
        engine: &WasmEngine,
        linker: &Linker<HostState>,
        path: &Path,
        pin: Option<&str>,
    ) -> Result<Plugin, LoadError> {
        let wasm = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let sha256 = digest(&wasm);
        if let Some(expected) = pin {
            let expected = expected.trim().trim_start_matches("sha256:").to_lowercase();
            if expected != sha256 {
                return Err(LoadError::Pin {
                    path: path.to_path_buf(),
                    expected,
                    actual: sha256,
                });
            }
        }
        check_is_component(path, &wasm)?;
        let component = engine.component(path, &wasm, &sha256)?;
        let info = inspect_component(engine, path, &component, &sha256, wasm.len() as u64)?;
        check_imports(path, &info)?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Contract {
                path: path.to_path_buf(),
                detail: format!("cannot be linked against this host: {e:#}"),
            })?;
        let contract = |e: wasmtime::Error| LoadError::Contract {
            path: path.to_path_buf(),
            detail: format!("does not match weir:sink@{}: {e:#}", wit::VERSION),
        };
        let sink = wit::sink::GuestIndices::new(&pre).map_err(contract)?;
        let positions = if info.positioned() {
            Some(wit::positions::GuestIndices::new(&pre).map_err(contract)?)
        } else {
            None
        };
        Ok(Plugin {
            info,
            pre,
            sink,
            positions,
        })
    }

    /// A fresh, sandboxed instance with its own store and limits.
    pub fn instantiate(
        self: &Arc<Self>,
        sink_name: &str,
        blob: Arc<BlobScope>,
        limits: &Limits,
    ) -> Result<SinkInstance, CallError> {
        // No preopened folders, no environment, no arguments, no network:
        // everything a sink may touch comes through the weir imports.
        let wasi = WasiCtxBuilder::new()
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            blob,
            sink_name: sink_name.to_string(),
            memory_limit: limits.memory_bytes,
            memory_exhausted: false,
        };
        let mut store = Store::new(self.pre.engine(), state);
        store.limiter(|state| state);
        let mut instance = SinkInstance {
            store,
            plugin: self.clone(),
            limits: limits.clone(),
            sink: None,
            positions: None,
        };
        instance.arm();
        let handle = self
            .pre
            .instantiate(&mut instance.store)
            .map_err(|e| instance.classify(e))?;
        instance.sink = Some(
            self.sink
                .load(&mut instance.store, &handle)
                .map_err(|e| instance.classify(e))?,
        );
        if let Some(indices) = &self.positions {
            instance.positions = Some(
                indices
                    .load(&mut instance.store, &handle)
                    .map_err(|e| instance.classify(e))?,
            );
        }
        Ok(instance)
    }
}

/// Reads what a component imports and exports, and which contract version
/// and capabilities it speaks. Used by loading and by `weir plugin inspect`.
pub fn inspect(engine: &WasmEngine, path: &Path) -> Result<PluginInfo, LoadError> {
    let wasm = std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    check_is_component(path, &wasm)?;
    let sha256 = digest(&wasm);
    let component = engine.component(path, &wasm, &sha256)?;
    inspect_component(engine, path, &component, &sha256, wasm.len() as u64)
}

fn inspect_component(
    engine: &WasmEngine,
    path: &Path,
    component: &wasmtime::component::Component,
    sha256: &str,
    size: u64,
) -> Result<PluginInfo, LoadError> {
    let ty = component.component_type();
    let imports: Vec<String> = ty
        .imports(engine.engine())
        .map(|(name, _)| name.to_string())
        .collect();
    let exports: Vec<String> = ty
        .exports(engine.engine())
        .filter(|(_, item)| matches!(item.ty, ComponentItem::ComponentInstance(_)))
        .map(|(name, _)| name.to_string())
        .collect();
    let sink_exports: Vec<&String> = exports
        .iter()
        .filter(|e| e.starts_with("weir:sink/sink"))
        .collect();
    let wit_version = match sink_exports.as_slice() {
        [] => {
            return Err(LoadError::Contract {
                path: path.to_path_buf(),
                detail: format!(
                    "does not export `{}`; is it a weir sink? (it exports: {})",
                    wit::SINK_EXPORT,
                    list_or_none(&exports)
                ),
            });
        }
        [one] => one
            .split_once('@')
            .map(|(_, v)| v.to_string())
            .unwrap_or_default(),
        _ => {
            return Err(LoadError::Contract {
                path: path.to_path_buf(),
                detail: "exports more than one version of weir:sink/sink".into(),
            });
        }
    };
    if wit_version != wit::VERSION {
        return Err(LoadError::Contract {
            path: path.to_path_buf(),
            detail: format!(
                "was built against weir:sink@{wit_version}, but this host speaks weir:sink@{}; \
                 rebuild it against weir-sdk for {} or upgrade weir",
                wit::VERSION,
                wit::VERSION
            ),
        });
    }
    let capabilities = if exports.iter().any(|e| e == wit::POSITIONS_EXPORT) {
        vec!["positions".to_string()]
    } else {
        Vec::new()
    };
    Ok(PluginInfo {
        path: path.to_path_buf(),
        sha256: sha256.to_string(),
        size,
        wit_version,
        capabilities,
        imports,
        exports,
    })
}

/// Refuses, with a sentence naming it, any import this host does not grant.
fn check_imports(path: &Path, info: &PluginInfo) -> Result<(), LoadError> {
    for import in &info.imports {
        let granted = match import.split_once('/') {
            Some(("weir:sink", rest)) => {
                let (interface, version) = rest.split_once('@').unwrap_or((rest, ""));
                if version != wit::VERSION {
                    return Err(LoadError::Contract {
                        path: path.to_path_buf(),
                        detail: format!(
                            "imports `{import}`, but this host provides weir:sink@{}",
                            wit::VERSION
                        ),
                    });
                }
                matches!(interface, "blobstore" | "log" | "types")
            }
            Some(("wasi:http", _)) => false,
            Some((package, _)) => package.starts_with("wasi:"),
            None => false,
        };
        if !granted {
            return Err(LoadError::Contract {
                path: path.to_path_buf(),
                detail: format!(
                    "imports `{import}`, which weir does not grant to sinks \
                     (granted: weir:sink/blobstore, weir:sink/log and WASI without files, \
                     sockets or environment)"
                ),
            });
        }
    }
    Ok(())
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "nothing".into()
    } else {
        items.join(", ")
    }
}

/// Refuses files that are not components before the compiler sees them, so
/// the operator reads what is wrong rather than a parser's complaint. The
/// header's layer field tells components (1) from core modules (0).
fn check_is_component(path: &Path, wasm: &[u8]) -> Result<(), LoadError> {
    let refuse = |detail: &str| {
        Err(LoadError::NotAComponent {
            path: path.to_path_buf(),
            detail: detail.to_string(),
        })
    };
    if wasm.len() < 8 || wasm[..4] != *b"\0asm" {
        return refuse("it is not WebAssembly (no `\\0asm` header)");
    }
    if wasm[6..8] != [0x01, 0x00] {
        return refuse(
            "it is a core WebAssembly module, not a component; build it for wasm32-wasip2 \
             (or wrap it with `wasm-tools component new`)",
        );
    }
    Ok(())
}

/// How a call into a plugin failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The sink returned an error of its own.
    #[error("{0}")]
    Sink(SinkError),
    #[error("trapped: {0}")]
    Trap(String),
    #[error("did not return within its CPU deadline of {0:?}")]
    Deadline(Duration),
    #[error("{0}")]
    Memory(String),
}

/// A sink's own error, as the WIT `sink-error` says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    #[error("retryable error: {0}")]
    Retryable(String),
    #[error("poison batch: {0}")]
    Poison(String),
    #[error("fenced: {0}")]
    Fenced(String),
    #[error("fatal error: {0}")]
    Fatal(String),
}

impl From<wit::types::SinkError> for SinkError {
    fn from(e: wit::types::SinkError) -> Self {
        use wit::types::SinkError as E;
        match e {
            E::Retryable(m) => SinkError::Retryable(m),
            E::Poison(m) => SinkError::Poison(m),
            E::Fenced(m) => SinkError::Fenced(m),
            E::Fatal(m) => SinkError::Fatal(m),
        }
    }
}

pub use wit::types::{Batch as WitBatch, MetadataColumn as WitMetadataColumn, Table as WitTable};

/// A committed position as a positioned sink reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkPosition {
    pub position: Vec<u8>,
    pub epoch: u64,
}

/// One live instance of a plugin. After a trap it is unusable (a trapped
/// component instance cannot be entered again); make a new one.
pub struct SinkInstance {
    store: Store<HostState>,
    plugin: Arc<Plugin>,
    limits: Limits,
    sink: Option<wit::sink::Guest>,
    positions: Option<wit::positions::Guest>,
}

impl SinkInstance {
    pub fn info(&self) -> &PluginInfo {
        &self.plugin.info
    }

    pub fn open(&mut self, pipeline: &str, config: &[(String, String)]) -> Result<(), CallError> {
        self.arm();
        let sink = self.sink.clone().expect("instantiated");
        let result = sink.call_open(&mut self.store, pipeline, config);
        self.finish(result)
    }

    pub fn write(&mut self, batch: &WitBatch, ipc: &[u8]) -> Result<(), CallError> {
        self.arm();
        let sink = self.sink.clone().expect("instantiated");
        let result = sink.call_write(&mut self.store, batch, ipc);
        self.finish(result)
    }

    pub fn commit(&mut self, request: &wit::types::CommitRequest) -> Result<(), CallError> {
        self.arm();
        let sink = self.sink.clone().expect("instantiated");
        let result = sink.call_commit(&mut self.store, request);
        self.finish(result)
    }

    pub fn abort(&mut self, table: &str) -> Result<(), CallError> {
        self.arm();
        let sink = self.sink.clone().expect("instantiated");
        let result = sink.call_abort(&mut self.store, table);
        result.map_err(|e| self.classify(e))
    }

    /// The sink's own record of where a table stands, if it has `positions`.
    pub fn committed(
        &mut self,
        pipeline: &str,
        table: &str,
    ) -> Result<Option<SinkPosition>, CallError> {
        let Some(positions) = self.positions.clone() else {
            return Ok(None);
        };
        self.arm();
        let result = positions.call_committed(&mut self.store, pipeline, table);
        let answer = self.finish(result)?;
        Ok(answer.map(|c| SinkPosition {
            position: c.position,
            epoch: c.epoch,
        }))
    }

    /// Sets the CPU deadline for the next call.
    fn arm(&mut self) {
        let ticks = (self.limits.call_timeout.as_millis() / EPOCH_TICK.as_millis()).max(1);
        self.store.set_epoch_deadline(ticks as u64);
        self.store.epoch_deadline_trap();
    }

    fn finish<T>(
        &mut self,
        result: wasmtime::Result<Result<T, wit::types::SinkError>>,
    ) -> Result<T, CallError> {
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(CallError::Sink(e.into())),
            Err(e) => Err(self.classify(e)),
        }
    }

    fn classify(&mut self, error: wasmtime::Error) -> CallError {
        if self.store.data().memory_exhausted {
            return CallError::Memory(format!(
                "exceeded its memory limit of {} MiB",
                self.limits.memory_bytes >> 20
            ));
        }
        if let Some(Trap::Interrupt) = error.downcast_ref::<Trap>() {
            return CallError::Deadline(self.limits.call_timeout);
        }
        CallError::Trap(first_line(&format!("{error:#}")))
    }
}

fn first_line(text: &str) -> String {
    // wasmtime appends a multi-line backtrace; the operator needs the cause.
    let mut lines = text.lines();
    let head = lines.next().unwrap_or_default().to_string();
    match text.find("panicked at") {
        Some(i) => format!("{head} ({})", text[i..].lines().next().unwrap_or_default()),
        None => head,
    }
}
