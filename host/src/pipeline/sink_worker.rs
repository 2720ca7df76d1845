//! One thread per sink instance: it owns the plugin's store, so calls into
//! different sinks run in parallel while calls into one sink stay ordered.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::runtime::bindings::v0_1_0::types::CommitRequest as WitCommitRequest;
use crate::runtime::plugin::WitBatch;
use crate::runtime::{BlobScope, CallError, Limits, Plugin, PluginInfo, SinkError, SinkPosition};

enum Job {
    Committed {
        pipeline: String,
        table: String,
        reply: Sender<Result<Option<SinkPosition>, CallError>>,
    },
    Write {
        batch: WitBatch,
        ipc: Arc<Vec<u8>>,
        reply: Sender<Result<(), CallError>>,
    },
    Commit {
        request: WitCommitRequest,
        reply: Sender<Result<(), CallError>>,
    },
    Abort {
        table: String,
    },
}

/// A reply still to come from a worker.
pub struct Pending<T>(Receiver<Result<T, CallError>>);

impl<T> Pending<T> {
    pub fn wait(self) -> Result<T, CallError> {
        self.0
            .recv()
            .unwrap_or_else(|_| Err(CallError::Trap("the sink's worker thread ended".into())))
    }
}

pub struct SinkWorker {
    pub name: String,
    pub info: PluginInfo,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Everything a worker needs to start its instance.
pub struct WorkerSpec {
    pub name: String,
    pub plugin: Arc<Plugin>,
    pub blob: Arc<BlobScope>,
    pub limits: Limits,
    pub retries: u32,
    pub pipeline: String,
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

    pub fn committed(&self, pipeline: &str, table: &str) -> Pending<Option<SinkPosition>> {
        let (reply, rx) = channel();
        self.send(Job::Committed {
            pipeline: pipeline.to_string(),
            table: table.to_string(),
            reply,
        });
        Pending(rx)
    }

    pub fn write(&self, batch: WitBatch, ipc: Arc<Vec<u8>>) -> Pending<()> {
        let (reply, rx) = channel();
        self.send(Job::Write { batch, ipc, reply });
        Pending(rx)
    }

    pub fn commit(&self, request: WitCommitRequest) -> Pending<()> {
        let (reply, rx) = channel();
        self.send(Job::Commit { request, reply });
        Pending(rx)
    }

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
    let retry = |call: &mut dyn FnMut() -> Result<(), CallError>| -> Result<(), CallError> {
        let mut attempt = 0;
        loop {
            match call() {
                Err(CallError::Sink(SinkError::Retryable(message))) if attempt < spec.retries => {
                    attempt += 1;
                    let pause = Duration::from_millis(50 << attempt.min(6));
                    tracing::warn!(sink = %spec.name, attempt, ?pause, "retrying: {message}");
                    std::thread::sleep(pause);
                }
                other => return other,
            }
        }
    };
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
            Job::Write { batch, ipc, reply } => {
                let result = match &broken {
                    Some(e) => Err(e.clone()),
                    None => retry(&mut || instance.write(&batch, &ipc)),
                };
                note_broken(&result, &mut broken);
                let _ = reply.send(result);
            }
            Job::Commit { request, reply } => {
                let result = match &broken {
                    Some(e) => Err(e.clone()),
                    None => retry(&mut || instance.commit(&request)),
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

fn note_broken(result: &Result<(), CallError>, broken: &mut Option<CallError>) {
    if let Err(e) = result
        && !matches!(e, CallError::Sink(_))
    {
        *broken = Some(e.clone());
    }
}
