//! One thread per sink instance: it owns the plugin's store, so calls into
//! different sinks run in parallel while calls into one sink stay ordered.
//! A call the sink calls retryable is retried here, with backoff.
//!
//! Every call is bounded in wall-clock time, whatever the guest waits on.
//! The CPU deadline (epoch interruption) only stops running WebAssembly; a
//! guest blocked in a WASI poll or inside a host call is out of its reach.
//! So whoever waits for a call (a [`Pending`], the start of a worker, its
//! shutdown) waits at most [`wall_bound`] per attempt, and when that passes
//! the worker is given up on: the call fails with [`CallError::Stalled`],
//! every later call fails at once with the same error, nothing more is
//! queued to it, and its thread is left behind, never joined.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use backon::{BlockingRetryable, ExponentialBuilder};
use weir_core::CommitRequest;

use super::capability::blobstore::BlobScope;
use super::capability::network::SinkNetwork;
use super::instance::{CallError, Limits, SinkInstance};
use super::plugin::{Plugin, PluginInfo};
use super::types::{BatchHeader, SinkClaim, SinkError};
use weir_metrics::SinkMetrics;

/// The pause before the first retry; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(3200);
/// Fixed part of the slack the wall-clock bound leaves the CPU deadline, so
/// a guest spinning in WebAssembly is stopped by the epoch (and reported as
/// a CPU overrun) before the wall clock gives up on it.
const WALL_SLACK: Duration = Duration::from_millis(500);

/// The wall-clock bound of one attempt of a call whose CPU deadline is
/// `call_timeout`: the deadline plus a tenth plus [`WALL_SLACK`] (the epoch
/// ticker's sleeps drift a little over long deadlines).
pub fn wall_bound(call_timeout: Duration) -> Duration {
    call_timeout + call_timeout / 10 + WALL_SLACK
}

/// One call into the sink, run on its worker's thread. Each export is a
/// closure over the instance (see `SinkWorker::call`), not a variant of
/// its own: a new export needs a method on `SinkInstance` and one here.
type Job = Box<dyn FnOnce(&mut Session<'_>) + Send>;

/// What a job runs against: the sink's instance, and what its worker keeps
/// between calls.
struct Session<'a> {
    instance: &'a mut SinkInstance,
    watch: &'a Watch,
    spec: &'a WorkerSpec,
    backoff: &'a ExponentialBuilder,
    /// After a trap, deadline or memory blow-up the instance cannot be
    /// entered again; every later call gets the original failure.
    broken: Option<CallError>,
}

/// Whether a call is tried again, after a pause, when the sink answers
/// retryable (`write`, `commit` and `maintain` are; reads and `abort` not).
#[derive(Clone, Copy)]
enum Retry {
    Never,
    WhileRetryable,
}

impl Session<'_> {
    /// Runs guest call `name` on the instance, unless it is broken; notes
    /// a failure that breaks it.
    fn call<T>(
        &mut self,
        name: &'static str,
        retry: Retry,
        mut call: impl FnMut(&mut SinkInstance) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let (watch, instance) = (self.watch, &mut *self.instance);
        let result = match retry {
            Retry::Never => watch.run(name, || call(instance)),
            Retry::WhileRetryable => {
                with_retries(&self.spec.name, &self.spec.metrics, self.backoff, || {
                    watch.run(name, || call(instance))
                })
            }
        };
        if let Err(e) = &result
            && !matches!(e, CallError::Sink(_))
        {
            self.broken = Some(e.clone());
        }
        result
    }
}

/// What the worker of one sink is doing, shared between its thread and
/// everyone who waits for it.
struct Watch {
    sink: String,
    bound: Duration,
    state: Mutex<CallState>,
    /// Where the calls that trap or overrun are counted.
    metrics: SinkMetrics,
}

#[derive(Default)]
struct CallState {
    /// The guest call under way and when it was entered.
    running: Option<(&'static str, Instant)>,
    /// Set once a call overran its bound: the worker is given up on.
    stalled: Option<CallError>,
}

impl Watch {
    fn state(&self) -> MutexGuard<'_, CallState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stalled(&self) -> Option<CallError> {
        self.state().stalled.clone()
    }

    /// Runs one guest call on the worker's thread, visible to the waiters.
    /// Refused once the worker was given up on: its instance may be in the
    /// middle of a call that never returned.
    fn run<T>(
        &self,
        call: &'static str,
        f: impl FnOnce() -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        {
            let mut state = self.state();
            if let Some(e) = &state.stalled {
                return Err(e.clone());
            }
            state.running = Some((call, Instant::now()));
        }
        let result = f();
        self.state().running = None;
        // Counted here, where a failure is new: later calls of a broken
        // instance repeat it without entering the guest.
        match &result {
            Err(CallError::Trap(_) | CallError::Memory(_)) => self.metrics.trap(),
            Err(CallError::Deadline(_) | CallError::Stalled { .. }) => self.metrics.deadline_hit(),
            Ok(_) | Err(CallError::Sink(_) | CallError::Refused(_)) => {}
        }
        result
    }

    /// How long a waiter may still wait, or the error if the call under way
    /// has overrun its bound (which gives the worker up).
    fn check(&self) -> Result<Duration, CallError> {
        let mut state = self.state();
        if let Some(e) = &state.stalled {
            return Err(e.clone());
        }
        let Some((call, since)) = state.running else {
            // Between calls (queued, or pausing before a retry): look again
            // after a full bound.
            return Ok(self.bound);
        };
        let elapsed = since.elapsed();
        if elapsed < self.bound {
            return Ok(self.bound - elapsed);
        }
        let error = CallError::Stalled {
            call,
            bound: self.bound,
        };
        tracing::error!(sink = %self.sink, "{error}; the sink's thread is left behind");
        self.metrics.deadline_hit();
        state.stalled = Some(error.clone());
        Err(error)
    }

    /// Waits for a message on `rx` while the worker keeps within its bound:
    /// `Ok(None)` when the sender is gone, `Err` when a call overran.
    fn wait<R>(&self, rx: &Receiver<R>) -> Result<Option<R>, CallError> {
        loop {
            match rx.recv_timeout(self.check()?) {
                Ok(message) => return Ok(Some(message)),
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Err(RecvTimeoutError::Timeout) => continue,
            }
        }
    }

    /// One line on the call under way, if any.
    fn describe(&self) -> Option<String> {
        let state = self.state();
        let (call, since) = state.running?;
        let given_up = if state.stalled.is_some() {
            ", given up on"
        } else {
            ""
        };
        Some(format!(
            "sink `{}`: `{call}` running for {:.1} s{given_up}",
            self.sink,
            since.elapsed().as_secs_f64()
        ))
    }
}

/// Every worker's watch, for [`calls_in_flight`].
static WATCHES: Mutex<Vec<Weak<Watch>>> = Mutex::new(Vec::new());

fn register(watch: &Arc<Watch>) {
    let mut watches = WATCHES.lock().unwrap_or_else(PoisonError::into_inner);
    watches.retain(|w| w.strong_count() > 0);
    watches.push(Arc::downgrade(watch));
}

/// The guest calls under way in this process, one line each (sink, call,
/// how long it has run), for a stop that cannot wait for them.
pub fn calls_in_flight() -> Vec<String> {
    let watches = WATCHES.lock().unwrap_or_else(PoisonError::into_inner);
    watches
        .iter()
        .filter_map(Weak::upgrade)
        .filter_map(|w| w.describe())
        .collect()
}

/// A reply still to come from a worker.
pub struct Pending<T> {
    reply: Result<Receiver<Result<T, CallError>>, CallError>,
    watch: Arc<Watch>,
}

impl<T> Pending<T> {
    /// Blocks until the worker answers, or until the call under way has run
    /// past its wall-clock bound.
    pub fn wait(self) -> Result<T, CallError> {
        match self.watch.wait(&self.reply?)? {
            Some(answer) => answer,
            None => Err(self.watch.stalled().unwrap_or_else(thread_ended)),
        }
    }
}

fn thread_ended() -> CallError {
    CallError::Trap("the sink's worker thread ended".into())
}

/// The worker thread of one sink, and the way to send it work.
pub struct SinkWorker {
    /// The sink's name in the pipeline.
    pub name: String,
    /// What its plugin is and speaks.
    pub info: PluginInfo,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    watch: Arc<Watch>,
    /// Disconnects when the thread ends.
    ended: Receiver<()>,
}

/// Everything a worker needs to start its instance.
pub struct WorkerSpec {
    /// The sink's name in the pipeline.
    pub name: String,
    /// The loaded plugin to instantiate.
    pub plugin: Arc<Plugin>,
    /// The blob-store root the sink was granted.
    pub blob: Arc<BlobScope>,
    /// The hosts and ports it may reach.
    pub network: SinkNetwork,
    /// Its memory and CPU limits.
    pub limits: Limits,
    /// How often a retryable `write` or `commit` is tried again.
    pub retries: u32,
    /// The pipeline, as `open` gets it.
    pub pipeline: String,
    /// The operator's `config` map for the sink, as `open` gets it.
    pub config: Vec<(String, String)>,
    /// Where its retries, traps, deadline hits and memory are counted.
    pub metrics: weir_metrics::SinkMetrics,
    /// What it shares with the other sinks of its tenant (`weir serve`).
    pub tenant: Option<Arc<super::TenantShare>>,
}

impl SinkWorker {
    /// Starts the worker, instantiates the plugin and calls its `open`,
    /// waiting at most the wall-clock bound for each.
    pub fn start(spec: WorkerSpec) -> Result<SinkWorker, CallError> {
        let (jobs, inbox) = channel::<Job>();
        let (ready_tx, ready_rx) = channel::<Result<(), CallError>>();
        let (ended_tx, ended) = channel::<()>();
        let name = spec.name.clone();
        let info = spec.plugin.info.clone();
        let watch = Arc::new(Watch {
            sink: spec.name.clone(),
            bound: wall_bound(spec.limits.call_timeout),
            state: Mutex::default(),
            metrics: spec.metrics.clone(),
        });
        register(&watch);
        let thread = {
            let watch = watch.clone();
            // The sink's log lines carry its pipeline's fields (tenant and
            // pipeline under `weir serve`) and its own name.
            let span = tracing::info_span!("sink", sink = %spec.name);
            std::thread::Builder::new()
                .name(format!("sink-{}", spec.name))
                .spawn(move || {
                    let _ended = ended_tx;
                    let _span = span.enter();
                    worker_main(spec, &watch, inbox, ready_tx)
                })
                .map_err(|e| CallError::Trap(format!("cannot start a worker thread: {e}")))?
        };
        // A stalled start leaves the thread behind (the handle is dropped).
        watch
            .wait(&ready_rx)?
            .unwrap_or_else(|| Err(thread_ended()))?;
        Ok(SinkWorker {
            name,
            info,
            jobs: Some(jobs),
            thread: Some(thread),
            watch,
            ended,
        })
    }

    /// Asks a positioned sink where `table` stands; `None` from a sink
    /// without `positions` or for a table it never committed.
    pub fn committed(&self, pipeline: &str, table: &str) -> Pending<Option<SinkClaim>> {
        let (pipeline, table) = (pipeline.to_string(), table.to_string());
        self.call(move |s| {
            s.call("committed", Retry::Never, |i| {
                i.committed(&pipeline, &table)
            })
        })
    }

    /// Stages one batch: its header and its rows as Arrow IPC stream bytes.
    pub fn write(&self, header: BatchHeader, ipc: Arc<Vec<u8>>) -> Pending<()> {
        self.call(move |s| s.call("write", Retry::WhileRetryable, |i| i.write(&header, &ipc)))
    }

    /// Makes what is staged for the request's table durable.
    pub fn commit(&self, request: CommitRequest) -> Pending<()> {
        self.call(move |s| {
            let started = Instant::now();
            let committed = s.call("commit", Retry::WhileRetryable, |i| i.commit(&request));
            if committed.is_ok() {
                // Retries included: what the pipeline waited on this sink.
                s.spec
                    .metrics
                    .committed(&request.table, started.elapsed().as_secs_f64());
            }
            committed
        })
    }

    /// Runs the sink's maintenance (`weir maintain`): its report, or `None`
    /// from a sink without `maintenance`. Retried like a commit when the
    /// sink answers retryable.
    pub fn maintain(
        &self,
        pipeline: &str,
        tables: &[String],
        what: &[String],
    ) -> Pending<Option<String>> {
        let (pipeline, tables, what) = (pipeline.to_string(), tables.to_vec(), what.to_vec());
        self.call(move |s| {
            s.call("maintain", Retry::WhileRetryable, |i| {
                i.maintain(&pipeline, &tables, &what)
            })
        })
    }

    /// Drops what is staged for `table`; nobody waits for the answer.
    pub fn abort(&self, table: &str) {
        if self.watch.stalled().is_none() {
            let table = table.to_string();
            self.send(Box::new(move |s| {
                let _ = s.call("abort", Retry::Never, |i| i.abort(&table));
            }));
        }
    }

    /// Queues a call, unless the worker was given up on: then the reply is
    /// that failure, at once, and nothing waits behind the stuck call.
    fn call<T: Send + 'static>(
        &self,
        call: impl FnOnce(&mut Session<'_>) -> Result<T, CallError> + Send + 'static,
    ) -> Pending<T> {
        let reply = match self.watch.stalled() {
            Some(e) => Err(e),
            None => {
                let (reply, rx) = channel();
                self.send(Box::new(move |session| {
                    let _ = reply.send(call(session));
                }));
                Ok(rx)
            }
        };
        Pending {
            reply,
            watch: self.watch.clone(),
        }
    }

    fn send(&self, job: Job) {
        // A send fails only when the thread is gone; the reply channel then
        // reports it to whoever waits.
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(job);
        }
    }
}

impl Drop for SinkWorker {
    /// Lets the worker finish what is queued (each call within its bound)
    /// and joins it; a worker that overruns is left behind, so a stuck guest
    /// cannot hold up the host's exit.
    fn drop(&mut self) {
        self.jobs.take();
        let Some(thread) = self.thread.take() else {
            return;
        };
        if self.watch.stalled().is_some() {
            // Given up on already (and said so): nothing to wait for.
            return;
        }
        // An overrun is logged where it is noticed; the thread is left.
        if self.watch.wait(&self.ended).is_ok() {
            let _ = thread.join();
        }
    }
}

fn worker_main(
    spec: WorkerSpec,
    watch: &Watch,
    inbox: Receiver<Job>,
    ready: Sender<Result<(), CallError>>,
) {
    let started = watch
        .run("instantiate", || {
            SinkInstance::instantiate_for_tenant(
                &spec.plugin,
                &spec.name,
                spec.blob.clone(),
                spec.network.clone(),
                &spec.limits,
                spec.tenant.clone(),
            )
        })
        .and_then(|mut instance| {
            let opened = watch.run("open", || instance.open(&spec.pipeline, &spec.config));
            spec.metrics.memory(instance.memory_bytes());
            opened.map(|()| instance)
        });
    let mut instance = match started {
        Ok(instance) => {
            let _ = ready.send(Ok(()));
            instance
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let backoff = ExponentialBuilder::new()
        .with_min_delay(FIRST_PAUSE)
        .with_max_delay(MAX_PAUSE)
        .with_max_times(spec.retries as usize);
    let mut session = Session {
        instance: &mut instance,
        watch,
        spec: &spec,
        backoff: &backoff,
        broken: None,
    };
    for job in inbox {
        if watch.stalled().is_some() {
            // Given up on while a call ran late: nobody waits any more.
            return;
        }
        job(&mut session);
        // Memories only grow, so the size after each call is the most the
        // call held.
        spec.metrics.memory(session.instance.memory_bytes());
    }
}

/// Runs `call`, and again after a pause each time the sink answers
/// retryable, as often as `backoff` allows. Each try has its own wall-clock
/// bound (the waiter measures from the start of the try under way).
fn with_retries<T>(
    sink: &str,
    metrics: &SinkMetrics,
    backoff: &ExponentialBuilder,
    call: impl FnMut() -> Result<T, CallError>,
) -> Result<T, CallError> {
    let mut attempt = 0;
    call.retry(backoff)
        .sleep(std::thread::sleep)
        .when(|e| matches!(e, CallError::Sink(SinkError::Retryable(_))))
        .notify(|e, pause| {
            attempt += 1;
            metrics.retry();
            let message = match e {
                CallError::Sink(SinkError::Retryable(message)) => message.as_str(),
                _ => "",
            };
            tracing::warn!(sink, attempt, ?pause, "retrying: {message}");
        })
        .call()
}

/// The counting above, checked with the misbehaving fixtures (built by
/// scripts/build-plugins) run through a real worker.
#[cfg(test)]
pub(crate) mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
    use weir_contract::{Mode, OP_COLUMN, POS_COLUMN};
    use weir_core::Position;

    use super::*;
    use crate::capability::log::LogLimits;
    use crate::capability::network::NetworkGrants;
    use crate::engine::WasmEngine;
    use crate::plugin::{self, SinkLinker};
    use crate::tenant::TenantShare;
    use crate::types::TableDescription;
    use weir_metrics::Metrics;

    /// One engine for every test, as in the host: each engine reserves its
    /// own pool, and compiling a fixture once is enough.
    struct Host {
        scratch: tempfile::TempDir,
        io: tokio::runtime::Runtime,
        engine: WasmEngine,
        linker: SinkLinker,
        /// Each fixture loaded once. Loads are one at a time: the engine's
        /// cache writes one temporary file per process and artifact, which
        /// two threads loading the same plugin would share.
        plugins: Mutex<std::collections::HashMap<String, Arc<Plugin>>>,
    }

    fn host() -> &'static Host {
        static HOST: OnceLock<Host> = OnceLock::new();
        HOST.get_or_init(|| {
            let scratch = tempfile::tempdir().unwrap();
            let engine = WasmEngine::new(&scratch.path().join("cache")).unwrap();
            let linker = plugin::linker(&engine).unwrap();
            let io = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            Host {
                scratch,
                io,
                engine,
                linker,
                plugins: Mutex::default(),
            }
        })
    }

    fn load(crate_name: &str) -> Arc<Plugin> {
        let host = host();
        let mut plugins = host.plugins.lock().unwrap();
        let plugin = plugins.entry(crate_name.to_string()).or_insert_with(|| {
            let loaded = Plugin::load(
                &host.engine,
                &host.linker,
                &fixture(crate_name),
                None,
                &Default::default(),
                &NetworkGrants::default(),
            );
            Arc::new(loaded.unwrap())
        });
        plugin.clone()
    }

    pub(crate) fn fixture(crate_name: &str) -> PathBuf {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
        let file = target
            .join("wasm32-wasip2/release")
            .join(format!("{}.wasm", crate_name.replace('-', "_")));
        assert!(
            file.exists(),
            "{} is missing: run scripts/build-plugins",
            file.display()
        );
        file
    }

    fn limits(memory_mb: usize, call_timeout_ms: u64) -> Limits {
        Limits {
            memory_bytes: memory_mb << 20,
            call_timeout: Duration::from_millis(call_timeout_ms),
            log: LogLimits::default(),
        }
    }

    /// Sink `sink` of pipeline `p` of tenant `acme`, running `fixture`.
    struct Sink<'a> {
        fixture: &'a str,
        sink: &'a str,
        config: &'a [(&'a str, &'a str)],
        limits: Limits,
        retries: u32,
        tenant: Option<Arc<TenantShare>>,
    }

    impl Sink<'_> {
        fn start(self, metrics: &Arc<Metrics>) -> Result<SinkWorker, CallError> {
            let host = host();
            let root = host.scratch.path().join("acme").join(self.sink);
            let mut blob = BlobScope::open(
                root.to_str().unwrap(),
                &[],
                host.scratch.path(),
                host.io.handle().clone(),
            )
            .unwrap();
            if let Some(tenant) = &self.tenant {
                blob = blob.with_tenant(tenant.clone());
            }
            SinkWorker::start(WorkerSpec {
                name: self.sink.to_string(),
                plugin: load(self.fixture),
                blob: Arc::new(blob),
                network: SinkNetwork::none(self.sink),
                limits: self.limits,
                retries: self.retries,
                pipeline: "p".into(),
                config: self
                    .config
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                metrics: metrics.pipeline("acme", "p").sink(self.sink),
                tenant: self.tenant,
            })
        }
    }

    fn sink<'a>(fixture: &'a str, sink: &'a str) -> Sink<'a> {
        Sink {
            fixture,
            sink,
            config: &[],
            limits: limits(64, 2000),
            retries: 0,
            tenant: None,
        }
    }

    /// A batch of two rows, with the control columns every batch has.
    fn batch() -> (BatchHeader, Arc<Vec<u8>>) {
        let records = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            (
                OP_COLUMN,
                Arc::new(StringArray::from(vec!["insert", "insert"])) as ArrayRef,
            ),
            (
                POS_COLUMN,
                Arc::new(BinaryArray::from_iter_values([[0u8, 1], [0, 2]])) as ArrayRef,
            ),
        ])
        .unwrap();
        let mut writer =
            arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &records.schema()).unwrap();
        writer.write(&records).unwrap();
        let header = BatchHeader {
            table: Arc::new(TableDescription {
                name: "t".into(),
                key_columns: vec!["id".into()],
                mode: Mode::Upsert,
                destination: "t".into(),
                metadata: Vec::new(),
            }),
            id: "b-1".into(),
            low: Position::streaming(&[1, 0]),
            high: Position::streaming(&[1, 1]),
            rows: 2,
        };
        (header, Arc::new(writer.into_inner().unwrap()))
    }

    fn write(worker: &SinkWorker) -> Result<(), CallError> {
        let (header, ipc) = batch();
        worker.write(header, ipc).wait()
    }

    /// The value of `metric` for sink `sink` on the rendered page.
    fn value(metrics: &Metrics, metric: &str, sink: &str) -> f64 {
        let page = metrics.render();
        let labels = format!("sink=\"{sink}\"");
        let found: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&labels))
            .collect();
        assert_eq!(found.len(), 1, "{metric} of {sink} in:\n{page}");
        found[0].rsplit(' ').next().unwrap().parse().unwrap()
    }

    const TRAPS: &str = "weir_sink_traps_total";
    const DEADLINES: &str = "weir_sink_deadline_hits_total";
    const RETRIES: &str = "weir_sink_retries_total";
    const MEMORY: &str = "weir_sink_memory_high_water_bytes";

    #[test]
    fn a_trap_is_counted_once_and_the_memory_is_reported() {
        let metrics = Metrics::new();
        let worker = sink("weir-fixture-trap", "trap").start(&metrics).unwrap();
        // Open has run: the instance's memory is known before any write.
        assert!(value(&metrics, MEMORY, "trap") > 0.0);
        assert!(matches!(write(&worker), Err(CallError::Trap(_))));
        // A broken instance repeats its failure without entering the guest.
        assert!(matches!(write(&worker), Err(CallError::Trap(_))));
        drop(worker);
        assert_eq!(value(&metrics, TRAPS, "trap"), 1.0);
        assert_eq!(value(&metrics, DEADLINES, "trap"), 0.0);
        assert_eq!(value(&metrics, RETRIES, "trap"), 0.0);
    }

    #[test]
    fn a_memory_blow_up_is_a_trap_and_the_high_water_stays_under_the_limit() {
        let metrics = Metrics::new();
        let worker = sink("weir-fixture-hog", "hog").start(&metrics).unwrap();
        assert!(matches!(write(&worker), Err(CallError::Memory(_))));
        drop(worker);
        assert_eq!(value(&metrics, TRAPS, "hog"), 1.0);
        let high = value(&metrics, MEMORY, "hog");
        assert!(
            high > (32 << 20) as f64 && high <= (64 << 20) as f64,
            "{high}"
        );
    }

    #[test]
    fn a_cpu_deadline_and_a_wall_clock_stall_are_deadline_hits() {
        let metrics = Metrics::new();
        let spin = Sink {
            limits: limits(64, 200),
            ..sink("weir-fixture-spin", "spin")
        };
        let worker = spin.start(&metrics).unwrap();
        assert!(matches!(write(&worker), Err(CallError::Deadline(_))));
        drop(worker);
        let stall = Sink {
            config: &[("mode", "sleep-in-write"), ("sleep_ms", "3000")],
            limits: limits(64, 100),
            ..sink("weir-fixture-stall", "stall")
        };
        let worker = stall.start(&metrics).unwrap();
        assert!(matches!(write(&worker), Err(CallError::Stalled { .. })));
        assert!(matches!(write(&worker), Err(CallError::Stalled { .. })));
        drop(worker);
        for name in ["spin", "stall"] {
            assert_eq!(value(&metrics, DEADLINES, name), 1.0, "{name}");
            assert_eq!(value(&metrics, TRAPS, name), 0.0, "{name}");
        }
    }

    #[test]
    fn every_retry_is_counted() {
        let metrics = Metrics::new();
        let flaky = Sink {
            config: &[
                ("mode", "huge-error"),
                ("kind", "retryable"),
                ("size_mb", "0"),
            ],
            retries: 2,
            ..sink("weir-fixture-hoard", "flaky")
        };
        let worker = flaky.start(&metrics).unwrap();
        let result = write(&worker);
        assert!(
            matches!(result, Err(CallError::Sink(SinkError::Retryable(_)))),
            "{result:?}"
        );
        drop(worker);
        assert_eq!(value(&metrics, RETRIES, "flaky"), 2.0);
        assert_eq!(value(&metrics, TRAPS, "flaky"), 0.0);
    }

    #[test]
    fn a_worker_given_up_on_holds_its_tenant_slot_until_its_thread_ends() {
        let metrics = Metrics::new();
        let bounds = crate::tenant::TenantBounds {
            max_instances: 2,
            ..Default::default()
        };
        let share = Arc::new(TenantShare::new("acme", bounds, 0));
        let sleep_ms = 4000;
        let sleep = sleep_ms.to_string();
        let config = [("mode", "sleep-in-open"), ("sleep_ms", sleep.as_str())];
        let stuck = |name| Sink {
            config: &config,
            limits: limits(64, 50),
            tenant: Some(share.clone()),
            ..sink("weir-fixture-stall", name)
        };
        // Compiled before the clock starts: only the stalls count.
        load("weir-fixture-stall");
        let started = Instant::now();
        for name in ["stuck-1", "stuck-2"] {
            let refused = stuck(name).start(&metrics).err();
            assert!(
                matches!(refused, Some(CallError::Stalled { call: "open", .. })),
                "{refused:?}"
            );
        }
        // Both left-behind workers still hold their slots.
        assert_eq!(share.instances.held(), 2);
        let refused = stuck("third").start(&metrics).err();
        let Some(CallError::Refused(message)) = refused else {
            panic!("a third instance was not refused: {refused:?}");
        };
        assert_eq!(
            message,
            "no instance slot for sink `third` of tenant `acme`: 2 of 2 held already \
             (tenants.acme.max_instances)"
        );
        assert!(
            started.elapsed() < Duration::from_millis(sleep_ms),
            "inconclusive: the stuck workers may have woken before the third start"
        );
        // Woken, they end and give their slots back.
        let deadline = Instant::now() + Duration::from_secs(10);
        while share.instances.held() > 0 {
            assert!(Instant::now() < deadline, "the slots never came back");
            std::thread::sleep(Duration::from_millis(20));
        }
        let again = Sink {
            tenant: Some(share.clone()),
            ..sink("weir-fixture-trap", "again")
        }
        .start(&metrics);
        assert!(again.is_ok(), "{:?}", again.err());
    }

    #[test]
    fn the_sinks_of_a_tenant_share_its_quota_and_its_log_rate() {
        let metrics = Metrics::new();
        let share = Arc::new(crate::tenant::acme(3 << 20, 0, 1, 20));
        let puts = [("mode", "many-puts"), ("count", "2"), ("size_mb", "1")];
        let hoarder = |name| Sink {
            config: &puts,
            tenant: Some(share.clone()),
            ..sink("weir-fixture-hoard", name)
        };
        let first = hoarder("first").start(&metrics).unwrap();
        let second = hoarder("second").start(&metrics).unwrap();
        write(&first).unwrap();
        // Its own root holds 1 MiB, under its own quota; the tenant's is full.
        let refused = write(&second).unwrap_err().to_string();
        assert!(
            refused.contains("over tenant `acme`'s quota of 3 MiB (tenants.acme.max_stored_mb)"),
            "{refused}"
        );
        assert_eq!(share.stored_bytes(), 3 << 20);
        // A flood within the sink's own burst of 1000 lines still drains
        // the tenant's 20 for all its sinks.
        let flood = [("mode", "log-flood"), ("size_mb", "0"), ("flood_ms", "50")];
        let flooder = Sink {
            config: &flood,
            tenant: Some(share.clone()),
            ..sink("weir-fixture-hoard", "flooder")
        };
        let worker = flooder.start(&metrics).unwrap();
        write(&worker).unwrap();
        let left = (0..5).filter(|_| share.admit_log_line()).count();
        assert!(left <= 1, "{left} lines left in the tenant's bucket");
    }

    #[test]
    fn both_kinds_of_stack_overflow_are_reported_as_stack_overflows() {
        let metrics = Metrics::new();
        // The shadow stack in linear memory runs out first (the trap
        // fixture's frames hold 4 KiB there), or wasmtime's limit on the
        // native stack does (the stall fixture's frames hold nothing there).
        let cases = [
            (
                "weir-fixture-trap",
                "stack-overflow",
                "its stack ran below address 0",
            ),
            ("weir-fixture-stall", "overflow", "call stack exhausted"),
        ];
        for (fixture, mode, detail) in cases {
            let config = [("mode", mode)];
            let overflowing = Sink {
                config: &config,
                ..sink(fixture, mode)
            };
            let worker = overflowing.start(&metrics).unwrap();
            match write(&worker) {
                Err(CallError::Trap(cause)) => {
                    assert!(cause.starts_with("stack overflow ("), "{mode}: {cause}");
                    assert!(cause.contains(detail), "{mode}: {cause}");
                }
                other => panic!("{mode}: {other:?}"),
            }
        }
    }
}
