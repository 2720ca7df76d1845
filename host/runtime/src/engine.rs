//! The one wasmtime engine every plugin shares: pooling allocator, epoch
//! ticker for CPU deadlines, and the on-disk cache of precompiled components.
//!
//! A cached `.cwasm` is native code that wasmtime loads without checking
//! (`deserialize` is unsafe), so the cache is trusted only for what this
//! host wrote: beside each artifact lies its seal, an HMAC-SHA256 of its
//! file name and bytes under a key only the host knows (a random file kept
//! beside the cache folder, in the state folder no sink root may reach).
//! A plugin that can write the cache folder cannot forge a seal, and a seal
//! copied from another artifact names the other file; an artifact whose
//! seal does not match is compiled again, with a warning, never loaded.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use super::budget::{Budget, Claim, Exhausted};
use super::tenant::TenantShare;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances; CPU deadlines are counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The largest memory any plugin may be granted; the pooling allocator
/// reserves address space for this much per slot.
pub const MAX_PLUGIN_MEMORY: usize = 4 << 30;

/// The most core instances one component may make (a Rust sink makes a
/// handful: its module, the shims, the WASI adapter).
const MAX_CORE_INSTANCES: u32 = 64;

/// The slots of the instance pool when nobody asks for another size: each
/// slot is one component instance with up to [`MEMORIES_PER_SLOT`]
/// memories and [`TABLES_PER_SLOT`] tables.
pub const DEFAULT_POOL_SLOTS: usize = 64;
/// The memories and tables one slot gives; an instance with more takes
/// more slots ([`slots_needed`]), so that the pool's memories and tables
/// run out no sooner than its slots, and counting slots counts them all.
const MEMORIES_PER_SLOT: usize = 2;
const TABLES_PER_SLOT: usize = 4;
/// The slots no tenant may take: what sinks of no tenant (`weir run`,
/// `weir plugin test`) and the host's own checks can always have.
pub const RESERVED_POOL_SLOTS: usize = 4;

/// The slots one instance of `component` takes.
pub fn slots_needed(component: &Component) -> usize {
    let Some(needs) = component.resources_required() else {
        // Only a component importing core modules has no answer, and the
        // contract gives none: count it as large as a component may be.
        return super::host_state::MAX_MEMORIES.div_ceil(MEMORIES_PER_SLOT);
    };
    let memories = (needs.num_memories as usize).div_ceil(MEMORIES_PER_SLOT);
    let tables = (needs.num_tables as usize).div_ceil(TABLES_PER_SLOT);
    memories.max(tables).max(1)
}

/// The engine's instance pool as sinks take it: every instance takes its
/// slots from `slots`, and a tenant's also from `for_tenants`, which keeps
/// [`RESERVED_POOL_SLOTS`] back from all tenants together.
#[derive(Debug)]
pub struct InstancePool {
    pub slots: Arc<Budget>,
    pub for_tenants: Arc<Budget>,
}

impl InstancePool {
    fn new(slots: usize) -> InstancePool {
        InstancePool {
            slots: Budget::new("the host's instance pool", slots),
            for_tenants: Budget::new(
                format!("the host's instance pool less {RESERVED_POOL_SLOTS} slots it keeps"),
                slots.saturating_sub(RESERVED_POOL_SLOTS),
            ),
        }
    }

    /// Takes `slots` for one instance: from `tenant`'s share first, then
    /// from what the pool leaves tenants, then from the pool (a sink of no
    /// tenant may use the reserve too).
    pub fn take(&self, slots: usize, tenant: Option<&TenantShare>) -> Result<Claim, Exhausted> {
        match tenant {
            Some(tenant) => Claim::take([
                (&tenant.instances, slots),
                (&self.for_tenants, slots),
                (&self.slots, slots),
            ]),
            None => Claim::take([(&self.slots, slots)]),
        }
    }
}

/// The engine, its epoch ticker and its component cache.
pub struct WasmEngine {
    engine: Engine,
    cache_dir: PathBuf,
    /// The key that seals cached artifacts, read or made on first use.
    seal_key: OnceLock<[u8; 32]>,
    stop_ticker: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
    pool: Arc<InstancePool>,
    /// The pool size the engine was made with (None: on demand), which a
    /// compiling child needs to make the same engine.
    pool_slots: Option<usize>,
    compiles: std::sync::atomic::AtomicU64,
}

/// What loading one plugin may cost the host, so that a plugin made to be
/// slow to compile (a huge function) cannot hold the host's start-up: see
/// [`crate::compiler`] for how each bound is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    /// The largest plugin file read and compiled.
    pub max_bytes: u64,
    /// The CPU time compiling may use (in a child process; whole seconds).
    pub cpu: Duration,
    /// How long compiling may take on the clock: a backstop well above
    /// `cpu`, the only bound when compiles run in the host's own process.
    pub timeout: Duration,
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            max_bytes: 256 << 20,
            cpu: Duration::from_secs(120),
            timeout: Duration::from_secs(600),
        }
    }
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
    /// Compiling a plugin took longer than its limit.
    #[error(
        "cannot compile plugin {path}: compiling took longer than {}s \
         (limits.compile_timeout_ms = {}); it was given up",
        .limit.as_secs_f64(),
        .limit.as_millis()
    )]
    CompileTimeout { path: PathBuf, limit: Duration },
    /// Compiling a plugin used more CPU time than its limit.
    #[error(
        "cannot compile plugin {path}: compiling used more than {seconds}s of CPU time \
         (limits.compile_cpu_ms = {}); the compiling process was ended",
        .limit.as_millis()
    )]
    CompileCpu {
        path: PathBuf,
        limit: Duration,
        /// The bound the kernel kept, in its whole seconds.
        seconds: u64,
    },
    /// The cache of compiled plugins cannot be written.
    #[error("component cache {path}: {detail}")]
    Cache { path: PathBuf, detail: String },
}

impl WasmEngine {
    /// Starts the engine and its epoch ticker, with a pool of
    /// [`DEFAULT_POOL_SLOTS`]; compiled plugins are cached in `cache_dir`.
    pub fn new(cache_dir: &Path) -> Result<Self, EngineError> {
        Self::with_pool_slots(cache_dir, DEFAULT_POOL_SLOTS)
    }

    /// The same, with a pool of `slots` instance slots (`weir serve` sizes
    /// it to its tenants' shares and the reserve).
    pub fn with_pool_slots(cache_dir: &Path, slots: usize) -> Result<Self, EngineError> {
        let (engine, pool_slots) = match Engine::new(&config(Some(slots))) {
            Ok(engine) => (engine, Some(slots)),
            // Some hosts cap virtual memory (ulimit -v) below what the pool
            // reserves; plugins still run, just without the pool's reuse
            // (the slots are still counted).
            Err(pool_error) => {
                tracing::warn!(%pool_error, "pooling allocator unavailable; using on-demand allocation");
                let engine =
                    Engine::new(&config(None)).map_err(|e| EngineError::Config(e.to_string()))?;
                (engine, None)
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
            seal_key: OnceLock::new(),
            stop_ticker,
            ticker: Some(ticker),
            pool: Arc::new(InstancePool::new(slots)),
            pool_slots,
            compiles: Default::default(),
        })
    }

    /// How many plugins this engine compiled, rather than loaded from the
    /// cache.
    pub fn compiles(&self) -> u64 {
        self.compiles.load(Ordering::Relaxed)
    }

    /// The wasmtime engine itself.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Its instance pool, as sinks take slots of it.
    pub fn pool(&self) -> &Arc<InstancePool> {
        &self.pool
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
        limits: &CompileLimits,
    ) -> Result<Component, EngineError> {
        let name = format!("{digest}-{:016x}.cwasm", self.compat_hash());
        let cached = self.cache_dir.join(&name);
        let seal_path = self.cache_dir.join(format!("{name}.seal"));
        let cache_error = |detail: String| EngineError::Cache {
            path: cached.clone(),
            detail,
        };
        let key = self.seal_key().map_err(cache_error)?;
        if let Some(component) = self.load_sealed(&cached, &seal_path, &name, &key) {
            return Ok(component);
        }
        // One compile per cache: whoever holds the plugin's lock compiles,
        // and the others (pipelines of this host, other processes on the
        // same cache) wait for its artifact instead of compiling the same
        // plugin beside it. The wait is bounded like a compile; past it,
        // this loader compiles on its own.
        std::fs::create_dir_all(&self.cache_dir).map_err(|e| cache_error(e.to_string()))?;
        let _compiling = match lock_within(
            &self.cache_dir.join(format!("{name}.lock")),
            limits.timeout,
        ) {
            Ok(lock) => {
                if let Some(component) = self.load_sealed(&cached, &seal_path, &name, &key) {
                    return Ok(component);
                }
                lock
            }
            Err(cause) => {
                tracing::warn!(plugin = %path.display(), %cause, "compiling without the cache's lock");
                None
            }
        };
        let in_child = match crate::compiler::child_program() {
            Some(program) => {
                crate::compiler::compile_in_child(program, self.pool_slots, path, wasm, limits)?
            }
            None => None,
        };
        let compiled = match in_child {
            Some(compiled) => compiled,
            None => self.precompile(path, wasm, limits.timeout)?,
        };
        self.compiles.fetch_add(1, Ordering::Relaxed);
        // Artifact first, then its seal, each written then renamed: a crash
        // in between leaves an artifact without its seal, compiled again.
        let sealed = hex::encode(seal(&key, &name, &compiled));
        replace_file(&cached, &compiled).map_err(cache_error)?;
        replace_file(&seal_path, sealed.as_bytes()).map_err(cache_error)?;
        // SAFETY: the bytes were produced by this engine just now.
        unsafe { Component::deserialize(&self.engine, &compiled) }.map_err(|e| {
            EngineError::Compile {
                path: path.to_path_buf(),
                detail: format!("{e:#}"),
            }
        })
    }

    /// The cached artifact `name`, if its seal is this host's; an
    /// unsealed or unreadable one is reported and left to be compiled over.
    fn load_sealed(
        &self,
        cached: &Path,
        seal_path: &Path,
        name: &str,
        key: &[u8; 32],
    ) -> Option<Component> {
        if let Ok(bytes) = std::fs::read(cached) {
            let sealed = std::fs::read_to_string(seal_path)
                .is_ok_and(|found| found.trim() == hex::encode(seal(key, name, &bytes)));
            if sealed {
                // SAFETY: the bytes are the ones the seal covers (read once,
                // checked, then deserialized from memory), and only this host
                // knows the key: it wrote them, from `precompile_component`,
                // for this wasm digest and engine compatibility hash.
                match unsafe { Component::deserialize(&self.engine, &bytes) } {
                    Ok(component) => return Some(component),
                    Err(error) => {
                        tracing::warn!(cache = %cached.display(), %error, "ignoring an unreadable cached component")
                    }
                }
            } else {
                tracing::warn!(
                    cache = %cached.display(),
                    "the cached component is not one this host wrote (its seal does not match); \
                     compiling the plugin again"
                );
            }
        }
        None
    }

    /// Compiles on a thread of its own and waits at most `timeout`: the
    /// way of a process that cannot start compiling children (see
    /// [`crate::compiler`]). Cranelift cannot be interrupted: a compile
    /// given up runs on, detached, until it ends.
    fn precompile(
        &self,
        path: &Path,
        wasm: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, EngineError> {
        let (done, outcome) = std::sync::mpsc::sync_channel(1);
        let engine = self.engine.clone();
        let wasm = wasm.to_vec();
        std::thread::Builder::new()
            .name("weir-compile".into())
            .spawn(move || {
                let _ = done.send(engine.precompile_component(&wasm));
            })
            .map_err(|e| EngineError::Config(e.to_string()))?;
        match outcome.recv_timeout(timeout) {
            Ok(compiled) => compiled.map_err(|e| EngineError::Compile {
                path: path.to_path_buf(),
                detail: format!("{e:#}"),
            }),
            Err(_) => Err(EngineError::CompileTimeout {
                path: path.to_path_buf(),
                limit: timeout,
            }),
        }
    }

    /// The host's sealing key: `component-cache.key` beside the cache
    /// folder, 32 random bytes made on first use, readable by the owner only.
    fn seal_key(&self) -> Result<[u8; 32], String> {
        if let Some(key) = self.seal_key.get() {
            return Ok(*key);
        }
        let path = self
            .cache_dir
            .parent()
            .unwrap_or(&self.cache_dir)
            .join("component-cache.key");
        let key = read_or_make_key(&path).map_err(|e| format!("key {}: {e}", path.display()))?;
        Ok(*self.seal_key.get_or_init(|| key))
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

/// The engine's settings; `pool_slots` sizes the pooling allocator, `None`
/// allocates each instance on demand. A compiling child makes its engine
/// from the same settings, so that its artifacts load in the host's.
pub(crate) fn config(pool_slots: Option<usize>) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    // On by default in wasmtime 48, and it makes every component call
    // several times slower; sinks are called synchronously.
    config.concurrency_support(false);
    // Bounds every call in time (instance.rs). The check it compiles into
    // every loop and function entry costs compute-heavy guests: without it
    // the Parquet sink ran at 1.21x its native time instead of 1.40x
    // (sink_overhead, on tmpfs). It is the price of a host no plugin can
    // hang; fuel, the other way, costs more.
    config.epoch_interruption(true);
    // The 64x64->128-bit multiply hashing is built on (the Rust sinks are
    // built to use it: .cargo/config.toml); without it a guest emulates
    // the multiply in several, and the Parquet sink loses 5% of its speed.
    config.wasm_wide_arithmetic(true);
    // For sink authors measuring their plugin: `perf` then names the
    // plugin's own functions instead of bare addresses.
    if std::env::var_os("WEIR_PERF_MAP").is_some_and(|v| v == "1") {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    if let Some(slots) = pool_slots {
        let slots_u32 = u32::try_from(slots).unwrap_or(u32::MAX);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(slots_u32);
        // Core instances are not counted by slot (wasmtime does not say how
        // many a component makes): there are enough for every slot to make
        // the most a component may.
        pool.total_core_instances(slots_u32.saturating_mul(MAX_CORE_INSTANCES));
        pool.total_memories(slots_u32.saturating_mul(MEMORIES_PER_SLOT as u32));
        pool.total_tables(slots_u32.saturating_mul(TABLES_PER_SLOT as u32));
        pool.max_memory_size(MAX_PLUGIN_MEMORY);
        // One component must not take the whole pool from the others.
        pool.max_memories_per_component(super::host_state::MAX_MEMORIES as u32);
        pool.max_tables_per_component(super::host_state::MAX_TABLES as u32);
        pool.max_core_instances_per_component(MAX_CORE_INSTANCES);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// Writes `bytes` to `path` by way of a temporary file and a rename, so a
/// crash never leaves a torn file behind.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let temp = unique_temp(path);
    std::fs::write(&temp, bytes).map_err(|e| e.to_string())?;
    std::fs::rename(&temp, path).map_err(|e| e.to_string())
}

/// Reads the key at `path`, or makes one from the system's random source
/// when there is none (or it is not 32 bytes). Two hosts starting at once
/// agree: the file is created exclusively, and the loser reads it.
fn read_or_make_key(path: &Path) -> std::io::Result<[u8; 32]> {
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Ok(bytes) = std::fs::read(path)
        && let Ok(key) = <[u8; 32]>::try_from(bytes.as_slice())
    {
        return Ok(key);
    }
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    if let Some(folder) = path.parent() {
        std::fs::create_dir_all(folder)?;
    }
    let temp = unique_temp(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    file.write_all(&key)?;
    file.sync_all()?;
    // A hard link fails if another host made the key meanwhile: use theirs.
    if path.exists() {
        // Another engine may have made it since the read above (keys are
        // linked into place whole): use that one, or every artifact it
        // seals would be compiled again by this engine, and the other way
        // round. Only a key file that holds no key is replaced.
        if let Ok(bytes) = std::fs::read(path)
            && let Ok(theirs) = <[u8; 32]>::try_from(bytes.as_slice())
        {
            let _ = std::fs::remove_file(&temp);
            return Ok(theirs);
        }
        std::fs::rename(&temp, path)?;
        return Ok(key);
    }
    let linked = std::fs::hard_link(&temp, path);
    let _ = std::fs::remove_file(&temp);
    match linked {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let bytes = std::fs::read(path)?;
            <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not a 32-byte key")
            })
        }
        Err(e) => Err(e),
    }
}

/// HMAC-SHA256 (RFC 2104) under `key` of an artifact's file name and bytes;
/// the NUL between them cannot occur in a name, so no two inputs collide.
fn seal(key: &[u8; 32], name: &str, bytes: &[u8]) -> [u8; 32] {
    let mut inner_pad = [0x36u8; 64];
    let mut outer_pad = [0x5cu8; 64];
    for (i, k) in key.iter().enumerate() {
        inner_pad[i] ^= k;
        outer_pad[i] ^= k;
    }
    let inner = Sha256::new()
        .chain_update(inner_pad)
        .chain_update(name.as_bytes())
        .chain_update([0u8])
        .chain_update(bytes)
        .finalize();
    Sha256::new()
        .chain_update(outer_pad)
        .chain_update(inner)
        .finalize()
        .into()
}

/// The sha256 of a plugin's bytes, as lowercase hex.
pub fn digest(wasm: &[u8]) -> String {
    hex::encode(Sha256::digest(wasm))
}

/// A temporary name beside `path`, unique within the process too: two
/// pipelines loading the same plugin at once must not share one file.
fn unique_temp(path: &Path) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_extension(format!("tmp{}-{n}", std::process::id()))
}

/// Takes the exclusive lock on `path` (created if missing), waiting at most
/// `patience` for whoever holds it. The lock is the open file's: it ends
/// when the returned file is dropped, or with the process that held it.
/// `Ok(None)` when the file system has no locks (nothing to wait for).
fn lock_within(path: &Path, patience: Duration) -> Result<Option<std::fs::File>, String> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let deadline = std::time::Instant::now() + patience;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(format!(
                    "{} stayed locked for {patience:?}: another compile of this plugin is still under way",
                    path.display()
                ));
            }
            Err(std::fs::TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
                return Ok(None);
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(format!("{}: {e}", path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_take_their_share_and_leave_the_reserve_to_sinks_of_no_tenant() {
        let pool = InstancePool::new(RESERVED_POOL_SLOTS + 4);
        let tenant = |name: &str, max_instances| {
            let bounds = crate::tenant::TenantBounds {
                max_instances,
                ..Default::default()
            };
            TenantShare::new(name, bounds, 0)
        };
        let (acme, globex) = (tenant("acme", 3), tenant("globex", 3));
        let held = [
            pool.take(2, Some(&acme)).unwrap(),
            pool.take(1, Some(&acme)).unwrap(),
        ];
        let over_share = pool.take(1, Some(&acme)).unwrap_err();
        assert_eq!(over_share.key, "tenants.acme.max_instances");
        let globex_one = pool.take(1, Some(&globex)).unwrap();
        // Globex is within its share, but the tenants hold all the pool
        // leaves them.
        let over_pool = pool.take(1, Some(&globex)).unwrap_err();
        assert!(
            over_pool.key.contains("less 4 slots it keeps"),
            "{over_pool}"
        );
        assert_eq!(globex.instances.held(), 1);
        // The reserve is there for a sink of no tenant.
        let reserve = pool.take(RESERVED_POOL_SLOTS, None).unwrap();
        assert!(pool.take(1, None).is_err());
        drop((held, globex_one, reserve));
        assert_eq!(pool.slots.held(), 0);
        assert_eq!(acme.instances.held(), 0);
    }

    /// Engines of several pipelines or processes on one cache that load a
    /// plugin new to it at the same moment: one compiles it, the others
    /// wait for its artifact and load that.
    #[test]
    fn engines_loading_a_new_plugin_at_once_compile_it_once() {
        let path = crate::worker::tests::fixture("weir-null-sink");
        let wasm = std::fs::read(&path).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let engines: Vec<WasmEngine> = (0..3)
            .map(|_| WasmEngine::new(&cache.path().join("components")).unwrap())
            .collect();
        let start = std::sync::Barrier::new(engines.len());
        std::thread::scope(|scope| {
            for engine in &engines {
                let (start, path, wasm) = (&start, &path, &wasm);
                scope.spawn(move || {
                    start.wait();
                    engine
                        .component(path, wasm, "null-sink-digest", &CompileLimits::default())
                        .expect("the plugin loads");
                });
            }
        });
        let compiles: Vec<u64> = engines.iter().map(WasmEngine::compiles).collect();
        assert_eq!(
            compiles.iter().sum::<u64>(),
            1,
            "compiles per engine: {compiles:?}"
        );
    }
}
