//! The one wasmtime engine every plugin shares: pooling allocator, epoch
//! ticker for CPU deadlines, and the on-disk cache of precompiled components.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances; CPU deadlines are counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The largest memory any plugin may be granted; the pooling allocator
/// reserves address space for this much per slot.
pub const MAX_PLUGIN_MEMORY: usize = 4 << 30;

/// The engine, its epoch ticker and its component cache.
pub struct WasmEngine {
    engine: Engine,
    cache_dir: PathBuf,
    stop_ticker: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

/// Why the engine cannot start or compile a plugin.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine or the linker cannot be set up.
    #[error("cannot configure the WebAssembly engine: {0}")]
    Config(String),
    /// A plugin does not compile.
    #[error("cannot compile plugin {path}: {detail}")]
    Compile { path: PathBuf, detail: String },
    /// The cache of compiled plugins cannot be written.
    #[error("component cache {path}: {detail}")]
    Cache { path: PathBuf, detail: String },
}

impl WasmEngine {
    /// Starts the engine and its epoch ticker; compiled plugins are cached
    /// in `cache_dir`.
    pub fn new(cache_dir: &Path) -> Result<Self, EngineError> {
        let engine = match Engine::new(&config(true)) {
            Ok(engine) => engine,
            // Some hosts cap virtual memory (ulimit -v) below what the pool
            // reserves; plugins still run, just without the pool's reuse.
            Err(pool_error) => {
                tracing::warn!(%pool_error, "pooling allocator unavailable; using on-demand allocation");
                Engine::new(&config(false)).map_err(|e| EngineError::Config(e.to_string()))?
            }
        };
        let stop_ticker = Arc::new(AtomicBool::new(false));
        let ticker = {
            let engine = engine.clone();
            let stop = stop_ticker.clone();
            std::thread::Builder::new()
                .name("weir-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| EngineError::Config(e.to_string()))?
        };
        Ok(WasmEngine {
            engine,
            cache_dir: cache_dir.to_path_buf(),
            stop_ticker,
            ticker: Some(ticker),
        })
    }

    /// The wasmtime engine itself.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Loads a component from its wasm bytes, through the cache of
    /// precompiled artifacts keyed by the wasm digest and the engine's
    /// compatibility hash (a different wasmtime or different settings
    /// compile anew instead of loading something incompatible).
    pub fn component(
        &self,
        path: &Path,
        wasm: &[u8],
        digest: &str,
    ) -> Result<Component, EngineError> {
        let cached = self
            .cache_dir
            .join(format!("{digest}-{:016x}.cwasm", self.compat_hash()));
        if cached.exists() {
            // SAFETY: the cache folder is written only by this host, from
            // bytes `precompile_component` produced, and the file name pins
            // both the wasm digest and the engine's compatibility hash.
            match unsafe { Component::deserialize_file(&self.engine, &cached) } {
                Ok(component) => return Ok(component),
                Err(error) => {
                    tracing::warn!(cache = %cached.display(), %error, "ignoring an unreadable cached component")
                }
            }
        }
        let compiled =
            self.engine
                .precompile_component(wasm)
                .map_err(|e| EngineError::Compile {
                    path: path.to_path_buf(),
                    detail: format!("{e:#}"),
                })?;
        let cache_error = |detail: String| EngineError::Cache {
            path: cached.clone(),
            detail,
        };
        std::fs::create_dir_all(&self.cache_dir).map_err(|e| cache_error(e.to_string()))?;
        // Write then rename, so a crash never leaves a torn artifact behind.
        let temp = cached.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&temp, &compiled).map_err(|e| cache_error(e.to_string()))?;
        std::fs::rename(&temp, &cached).map_err(|e| cache_error(e.to_string()))?;
        // SAFETY: as above; the bytes were produced by this engine just now.
        unsafe { Component::deserialize(&self.engine, &compiled) }.map_err(|e| {
            EngineError::Compile {
                path: path.to_path_buf(),
                detail: format!("{e:#}"),
            }
        })
    }

    fn compat_hash(&self) -> u64 {
        let mut hasher = std::hash::DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        hasher.finish()
    }
}

impl Drop for WasmEngine {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
    }
}

fn config(pooling: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    // On by default in wasmtime 48, and it makes every component call
    // several times slower; sinks are called synchronously.
    config.concurrency_support(false);
    config.epoch_interruption(true);
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(64);
        pool.total_core_instances(512);
        pool.total_memories(128);
        pool.total_tables(256);
        pool.max_memory_size(MAX_PLUGIN_MEMORY);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// The sha256 of a plugin's bytes, as lowercase hex.
pub fn digest(wasm: &[u8]) -> String {
    hex::encode(Sha256::digest(wasm))
}
