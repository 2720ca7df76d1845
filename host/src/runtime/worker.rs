//! One thread per sink instance: it owns the plugin's store, so calls into
//! different sinks run in parallel while calls into one sink stay ordered.
//! A call the sink calls retryable is retried here, with backoff.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use backon::{BlockingRetryable, ExponentialBuilder};
use weir_core::CommitRequest;

use super::capability::blobstore::BlobScope;
use super::instance::{CallError, Limits};
use super::plugin::{Plugin, PluginInfo};
use super::types::{BatchHeader, SinkError, SinkPosition};

/// The pause before the first retry; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(3200);

enum Job {
    Committed {
        pipeline: String,
        table: String,
        reply: Sender<Result<Option<SinkPosition>, CallError>>,
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

/// A reply still to come from a worker.
pub struct Pending<T>(Receiver<Result<T, CallError>>);

impl<T> Pending<T> {
    /// Blocks until the worker answers.
    pub fn wait(self) -> Result<T, CallError> {
        self.0
            .recv()
            .unwrap_or_else(|_| Err(CallError::Trap("the sink's worker thread ended".into())))
    }
}

/// The worker thread of one sink, and the way to send it work.
pub struct SinkWorker {
    /// The sink's name in the pipeline.
    pub name: String,
    /// What its plugin is and speaks.
    pub info: PluginInfo,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Everything a worker needs to start its instance.
pub struct WorkerSpec {
    /// The sink's name in the pipeline.
    pub name: String,
    /// The loaded plugin to instantiate.
    pub plugin: Arc<Plugin>,
    /// The blob-store root the sink was granted.
    pub blob: Arc<BlobScope>,
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
    /// Starts the worker, instantiates the plugin and calls its `open`.
    pub fn start(spec: WorkerSpec) -> Result<SinkWorker, CallError> {
        let (jobs, inbox) = channel::<Job>();
        let (ready_tx, ready_rx) = channel::<Result<(), CallError>>();
        let name = spec.name.clone();
        let info = spec.plugin.info.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sink-{}", spec.name))
            .spawn(move || worker_main(spec, inbox, ready_tx))
            .map_err(|e| CallError::Trap(format!("cannot start a worker thread: {e}")))?;
        ready_rx
            .recv()
            .unwrap_or_else(|_| Err(CallError::Trap("the sink's worker thread ended".into())))?;
        Ok(SinkWorker {
            name,
            info,
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Asks a positioned sink where `table` stands; `None` from a sink
    /// without `positions` or for a table it never committed.
    pub fn committed(&self, pipeline: &str, table: &str) -> Pending<Option<SinkPosition>> {
        let (reply, rx) = channel();
        self.send(Job::Committed {
            pipeline: pipeline.to_string(),
            table: table.to_string(),
            reply,
        });
        Pending(rx)
    }

    /// Stages one batch: its header and its rows as Arrow IPC stream bytes.
    pub fn write(&self, header: BatchHeader, ipc: Arc<Vec<u8>>) -> Pending<()> {
        let (reply, rx) = channel();
        self.send(Job::Write { header, ipc, reply });
        Pending(rx)
    }

    /// Makes what is staged for the request's table durable.
    pub fn commit(&self, request: CommitRequest) -> Pending<()> {
        let (reply, rx) = channel();
        self.send(Job::Commit { request, reply });
        Pending(rx)
    }

    /// Drops what is staged for `table`; nobody waits for the answer.
    pub fn abort(&self, table: &str) {
        self.send(Job::Abort {
            table: table.to_string(),
        });
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
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn worker_main(spec: WorkerSpec, inbox: Receiver<Job>, ready: Sender<Result<(), CallError>>) {
    let started = spec
        .plugin
        .instantiate(&spec.name, spec.blob.clone(), &spec.limits)
        .and_then(|mut instance| {
            instance.open(&spec.pipeline, &spec.config)?;
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
        match job {
            Job::Committed {
                pipeline,
                table,
                reply,
            } => {
                let result = match &broken {
                    Some(e) => Err(e.clone()),
                    None => instance.committed(&pipeline, &table),
                };
                let _ = reply.send(result);
            }
            Job::Write { header, ipc, reply } => {
                let result = match &broken {
                    Some(e) => Err(e.clone()),
                    None => with_retries(&spec.name, &backoff, || instance.write(&header, &ipc)),
                };
                note_broken(&result, &mut broken);
                let _ = reply.send(result);
            }
            Job::Commit { request, reply } => {
                let result = match &broken {
                    Some(e) => Err(e.clone()),
                    None => with_retries(&spec.name, &backoff, || instance.commit(&request)),
                };
                note_broken(&result, &mut broken);
                let _ = reply.send(result);
            }
            Job::Abort { table } => {
                if broken.is_none()
                    && let Err(e) = instance.abort(&table)
                {
                    broken = Some(e);
                }
            }
        }
    }
}

/// Runs `call`, and again after a pause each time the sink answers
/// retryable, as often as `backoff` allows.
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
