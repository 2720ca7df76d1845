//! What both sink benchmarks feed a sink: the generator's changes batched as
//! the host would batch them, already encoded as Arrow IPC.

use std::sync::Arc;
use std::time::Duration;

use weir_runtime::{BatchHeader, CommitRequest, TableDescription};
use weir_sdk::native::encode_ipc;
use weir_source::Source;
use weir_source::batch::{BatchLimits, Batcher};
use weir_source::generator::{Generator, GeneratorConfig};

/// Where scripts/build-plugins puts the components.
pub fn components_dir() -> std::path::PathBuf {
    let workspace = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("wasm32-wasip2/release")
}

/// A scratch folder for a benchmark's blob stores: on tmpfs (`/dev/shm`)
/// where there is one, so that the two sides compare code, not the disk:
/// both blob stores fsync every object, and on a shared disk the fsyncs'
/// time swings by more than the difference measured. `WEIR_BENCH_DIR` picks
/// another folder.
#[allow(dead_code)]
pub fn scratch_dir() -> tempfile::TempDir {
    let base = std::env::var_os("WEIR_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let shm = std::path::PathBuf::from("/dev/shm");
            if shm.is_dir() {
                shm
            } else {
                std::env::temp_dir()
            }
        });
    tempfile::tempdir_in(&base).unwrap()
}

pub struct Prepared {
    pub header: BatchHeader,
    pub ipc: Vec<u8>,
}

impl Prepared {
    /// The commit that follows the batch, for the wasmtime host.
    pub fn commit_request(&self) -> CommitRequest {
        CommitRequest {
            table: self.header.table.name.clone(),
            high: self.header.high.clone(),
            pipeline: "bench".into(),
            epoch: 1,
        }
    }

    /// The batch's header as the SDK's native runner takes it.
    #[allow(dead_code)]
    pub fn native_meta(&self) -> weir_sdk::BatchMeta {
        let table = &self.header.table;
        weir_sdk::BatchMeta {
            table: weir_sdk::Table {
                name: table.name.clone(),
                key_columns: table.key_columns.clone(),
                mode: table.mode,
                destination: table.destination.clone(),
                metadata: Vec::new(),
            },
            id: self.header.id.clone(),
            low: self.header.low.as_bytes().to_vec(),
            high: self.header.high.as_bytes().to_vec(),
            rows: self.header.rows,
        }
    }

    /// The commit that follows the batch, for the native runner.
    #[allow(dead_code)]
    pub fn native_commit(&self) -> weir_sdk::CommitRequest {
        weir_sdk::CommitRequest {
            table: self.header.table.name.clone(),
            high: self.header.high.as_bytes().to_vec(),
            pipeline: "bench".into(),
            epoch: 1,
        }
    }
}

/// Upsert-mode batches of `changes` generator changes and their row count.
pub fn prepare(changes: u64, max_rows: usize) -> (Vec<Prepared>, usize) {
    let mut source = Generator::new(GeneratorConfig {
        seed: 99,
        max_changes: Some(changes),
    });
    let mut batcher = Batcher::new(
        source.tables(),
        BatchLimits {
            max_rows,
            max_bytes: 64 << 20,
            linger: Duration::from_secs(3600),
        },
        Vec::new(),
    );
    let mut flushes = Vec::new();
    while let Some(tx) = source.next_transaction().unwrap() {
        flushes.extend(batcher.push(tx).unwrap());
    }
    flushes.extend(batcher.flush(false));
    let mut out = Vec::new();
    let mut rows = 0;
    for flush in flushes {
        for batch in flush.batches {
            rows += batch.rows();
            out.push(Prepared {
                header: BatchHeader {
                    table: Arc::new(TableDescription {
                        name: batch.table.name.clone(),
                        key_columns: batch.table.key_names(),
                        mode: weir_sdk::Mode::Upsert,
                        destination: batch.table.name.clone(),
                        metadata: Vec::new(),
                    }),
                    id: batch.id.clone(),
                    low: batch.low.clone(),
                    high: batch.high.clone(),
                    rows: batch.rows() as u32,
                },
                ipc: encode_ipc(&batch.records),
            });
        }
    }
    (out, rows)
}

/// What calling a plugin in process takes, set up once the way the host
/// does it: one wasmtime engine (its compile cache under `scratch`), the
/// sink linker, and the I/O runtime blob stores run on.
pub struct InProcess {
    scratch: std::path::PathBuf,
    io: tokio::runtime::Runtime,
    engine: weir_runtime::WasmEngine,
    linker: weir_runtime::plugin::SinkLinker,
}

impl InProcess {
    pub fn new(scratch: &std::path::Path) -> Self {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let engine = weir_runtime::WasmEngine::new(&scratch.join("cache")).unwrap();
        let linker = weir_runtime::plugin::linker(&engine).unwrap();
        InProcess {
            scratch: scratch.to_path_buf(),
            io,
            engine,
            linker,
        }
    }

    /// Loads (and compiles, the first time) the plugin at `wasm`, checked
    /// against `network`.
    pub fn load(
        &self,
        wasm: &std::path::Path,
        network: &weir_runtime::network::NetworkGrants,
    ) -> Arc<weir_runtime::Plugin> {
        let loaded = weir_runtime::Plugin::load(
            &self.engine,
            &self.linker,
            wasm,
            None,
            &Default::default(),
            network,
        )
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/build-plugins)", wasm.display()));
        Arc::new(loaded)
    }

    /// A fresh instance of `plugin` as sink `bench`, its blob root `root`.
    pub fn instance(
        &self,
        plugin: &Arc<weir_runtime::Plugin>,
        root: &std::path::Path,
        network: weir_runtime::network::SinkNetwork,
        limits: &weir_runtime::Limits,
    ) -> weir_runtime::SinkInstance {
        let blob = weir_runtime::BlobScope::open(
            root.to_str().unwrap(),
            &[],
            &self.scratch,
            self.io.handle().clone(),
        )
        .unwrap();
        weir_runtime::SinkInstance::instantiate(plugin, "bench", Arc::new(blob), network, limits)
            .unwrap()
    }
}

/// The best (shortest) wall-clock and CPU times over several timed rounds.
/// CPU time counts every thread of the process, since the host's I/O
/// threads do part of a component's work; on a busy shared machine it moves
/// far less than wall-clock time, so both are printed.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy)]
pub struct Best {
    pub wall: Duration,
    pub cpu: Duration,
}

#[allow(dead_code)]
impl Best {
    pub fn new() -> Self {
        Best {
            wall: Duration::MAX,
            cpu: Duration::MAX,
        }
    }

    /// Runs `work` once and keeps its times if they beat the best so far.
    pub fn time(&mut self, work: impl FnOnce()) {
        let (wall, cpu) = (std::time::Instant::now(), process_cpu_time());
        work();
        self.wall = self.wall.min(wall.elapsed());
        self.cpu = self.cpu.min(process_cpu_time().saturating_sub(cpu));
    }

    /// `self`'s times over `baseline`'s: (wall-clock ratio, CPU ratio).
    pub fn ratio_to(&self, baseline: &Best) -> (f64, f64) {
        (
            self.wall.as_secs_f64() / baseline.wall.as_secs_f64(),
            self.cpu.as_secs_f64() / baseline.cpu.as_secs_f64(),
        )
    }
}

fn process_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}
