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
use super::instance::{CallError, Limits, SinkInstance};
use super::network::SinkNetwork;
use super::plugin::{Plugin, PluginInfo};
use super::types::{BatchHeader, SinkClaim, SinkError};

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

enum Job {
    Committed {
        pipeline: String,
        table: String,
        reply: Sender<Result<Option<SinkClaim>, CallError>>,
    },
    Write {
        header: BatchHeader,
        ipc: Arc<Vec<u8>>,
        reply: Sender<Result<(), CallError>>,
    },
    Commit {
        request: CommitRequest,
        reply: Sender<Result<(), CallError>>,
    },
    Abort {
        table: String,
    },
}

/// What the worker of one sink is doing, shared between its thread and
/// everyone who waits for it.
struct Watch {
    sink: String,
    bound: Duration,
    state: Mutex<CallState>,
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
        });
        register(&watch);
        let thread = {
            let watch = watch.clone();
            std::thread::Builder::new()
                .name(format!("sink-{}", spec.name))
                .spawn(move || {
                    let _ended = ended_tx;
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
        self.call(|reply| Job::Committed {
            pipeline: pipeline.to_string(),
            table: table.to_string(),
            reply,
        })
    }

    /// Stages one batch: its header and its rows as Arrow IPC stream bytes.
    pub fn write(&self, header: BatchHeader, ipc: Arc<Vec<u8>>) -> Pending<()> {
        self.call(|reply| Job::Write { header, ipc, reply })
    }

    /// Makes what is staged for the request's table durable.
    pub fn commit(&self, request: CommitRequest) -> Pending<()> {
        self.call(|reply| Job::Commit { request, reply })
    }

    /// Drops what is staged for `table`; nobody waits for the answer.
    pub fn abort(&self, table: &str) {
        if self.watch.stalled().is_none() {
            self.send(Job::Abort {
                table: table.to_string(),
            });
        }
    }

    /// Queues a job, unless the worker was given up on: then the reply is
    /// that failure, at once, and nothing waits behind the stuck call.
    fn call<T>(&self, job: impl FnOnce(Sender<Result<T, CallError>>) -> Job) -> Pending<T> {
        let reply = match self.watch.stalled() {
            Some(e) => Err(e),
            None => {
                let (reply, rx) = channel();
                self.send(job(reply));
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
            SinkInstance::instantiate(
                &spec.plugin,
                &spec.name,
                spec.blob.clone(),
                spec.network.clone(),
                &spec.limits,
            )
        })
        .and_then(|mut instance| {
            watch.run("open", || instance.open(&spec.pipeline, &spec.config))?;
            Ok(instance)
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
    // After a trap, deadline or memory blow-up the instance cannot be
    // entered again; every later call gets the original failure.
    let mut broken: Option<CallError> = None;
    let backoff = ExponentialBuilder::new()
        .with_min_delay(FIRST_PAUSE)
        .with_max_delay(MAX_PAUSE)
        .with_max_times(spec.retries as usize);
    for job in inbox {
        if watch.stalled().is_some() {
            // Given up on while a call ran late: nobody waits any more.
            return;
        }
        match job {
            Job::Committed {
                pipeline,
                table,
                reply,
            } => {
                let result = match &broken {
                    Some(e) => Err(e.clone()),
                    None => watch.run("committed", || instance.committed(&pipeline, &table)),
                };
                let _ = reply.send(result);
            }
            Job::Write { header, ipc, reply } => {
                let result = match &broken {
                    Some(e) => Err(e.clone()),
                    None => with_retries(&spec.name, &backoff, || {
                        watch.run("write", || instance.write(&header, &ipc))
                    }),
                };
                note_broken(&result, &mut broken);
                let _ = reply.send(result);
            }
            Job::Commit { request, reply } => {
                let result = match &broken {
                    Some(e) => Err(e.clone()),
                    None => with_retries(&spec.name, &backoff, || {
                        watch.run("commit", || instance.commit(&request))
                    }),
                };
                note_broken(&result, &mut broken);
                let _ = reply.send(result);
            }
            Job::Abort { table } => {
                if broken.is_none()
                    && let Err(e) = watch.run("abort", || instance.abort(&table))
                {
                    broken = Some(e);
                }
            }
        }
    }
}

/// Runs `call`, and again after a pause each time the sink answers
/// retryable, as often as `backoff` allows. Each try has its own wall-clock
/// bound (the waiter measures from the start of the try under way).
fn with_retries(
    sink: &str,
    backoff: &ExponentialBuilder,
    call: impl FnMut() -> Result<(), CallError>,
) -> Result<(), CallError> {
    let mut attempt = 0;
    call.retry(backoff)
        .sleep(std::thread::sleep)
        .when(|e| matches!(e, CallError::Sink(SinkError::Retryable(_))))
        .notify(|e, pause| {
            attempt += 1;
            let message = match e {
                CallError::Sink(SinkError::Retryable(message)) => message.as_str(),
                _ => "",
            };
            tracing::warn!(sink, attempt, ?pause, "retrying: {message}");
        })
        .call()
}

fn note_broken(result: &Result<(), CallError>, broken: &mut Option<CallError>) {
    if let Err(e) = result
        && !matches!(e, CallError::Sink(_))
    {
        *broken = Some(e.clone());
    }
}
