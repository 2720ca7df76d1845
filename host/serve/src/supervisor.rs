//! One pipeline under `weir serve`: its definition, the plugin version each
//! sink runs, and the thread that runs it, restarts it with backoff when it
//! fails, and parks it when it keeps failing.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::host_file::RestartConfig;
use super::tenant::Tenant;
use weir_metrics::PipelineMetrics;
use weir_pipeline::config::PipelineConfig;
use weir_pipeline::control::LiveStatus;
use weir_pipeline::{self, Control, RunError, RunHost, RunOptions};
use weir_runtime::WasmEngine;

/// Where a pipeline is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Starting,
    Running,
    Paused,
    /// Failed; restarted after a pause.
    Backoff,
    /// Failed too often in a row (or on a batch that can never be
    /// written); waits for the operator.
    Parked,
    /// Stopped by the operator (or the host is stopping).
    Stopped,
    /// Its source ended (a bounded generator).
    Finished,
    /// In a cluster: another host runs it, or none is placed yet; this
    /// host runs it when it is placed here and claimed.
    Standby,
    /// Never a pipeline's own state: what `weir ctl` reads when a server
    /// leaves the state out or names one this build does not know, so the
    /// rest of its reply still shows.
    #[default]
    #[serde(other)]
    Unknown,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Paused => "paused",
            State::Backoff => "backoff",
            State::Parked => "parked",
            State::Stopped => "stopped",
            State::Finished => "finished",
            State::Standby => "standby",
            State::Unknown => "unknown",
        }
    }
}

/// What the operator wants of a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Run,
    Stop,
    /// The slot goes away once its run ended.
    Delete,
}

/// The plugin a sink runs now, and the one before it (for rollback).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginVersion {
    pub path: PathBuf,
    pub sha256: String,
    pub previous: Option<(PathBuf, String)>,
    pub swaps: u64,
    /// The digest of the plugin the pipeline file names, when this version
    /// was swapped in: a version swapped in through the API outlives a
    /// restart of the host only while the file's plugin stays that one.
    #[serde(default)]
    pub file_sha256: String,
}

/// One swap asked for, as the status shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SwapRecord {
    pub sink: String,
    /// `swapped`, `rolled_back` or `refused`: borrowed on the server, owned
    /// when a client reads it back (where a newer server may say more).
    pub outcome: Cow<'static, str>,
    pub sha256: String,
    pub pause_ms: Option<f64>,
    pub at: Option<String>,
    pub reason: Option<String>,
}

/// The swaps the status keeps, newest last.
const SWAPS_KEPT: usize = 64;

pub struct Slot {
    pub tenant: Arc<Tenant>,
    pub name: String,
    pub metrics: PipelineMetrics,
    inner: Mutex<Inner>,
    changed: Condvar,
    /// Held while a swap of one of its sinks is under way: one at a time,
    /// so a flood of uploads cannot keep the host compiling.
    pub swapping: Mutex<()>,
}

struct Inner {
    config: PipelineConfig,
    /// SHA-256 of the definition's text, to tell a change from a re-read.
    definition: String,
    plugins: BTreeMap<String, PluginVersion>,
    wanted: Wanted,
    /// Set when the definition changed: the next run takes it.
    restart: bool,
    state: State,
    reason: Option<String>,
    failures: u32,
    control: Option<Arc<Control>>,
    swaps: VecDeque<SwapRecord>,
    ended: bool,
    /// The live status of the last run, kept once it ended.
    last_live: Option<LiveStatus>,
    /// The last error each sink caused, with when.
    sink_errors: BTreeMap<String, String>,
    /// In a cluster: the claim this host holds on the pipeline, without
    /// which it does not run.
    held: Option<Held>,
    /// `restart.rollback_within_commits` of the host (0: no trials).
    rollback_within: u64,
    /// Sinks whose version was swapped in and is still on trial.
    trials: BTreeMap<String, Trial>,
}

/// A version swapped in, on trial until it has made its first
/// `restart.rollback_within_commits` commits: a failure it causes before
/// that rolls it back on its own.
#[derive(Debug, Clone, Copy)]
struct Trial {
    commits_left: u64,
    /// The run's count of committed batches when the version took over
    /// (0 for a version taken at a run's start).
    baseline: u64,
}

/// A claim on a pipeline, held on a lease of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub lease: i64,
    pub epoch: u64,
}

/// What the thread of a slot needs from the host.
#[derive(Clone)]
pub struct Context {
    pub engine: Arc<WasmEngine>,
    pub io: tokio::runtime::Handle,
    pub restart: RestartConfig,
    /// In a cluster, the host's session: a pipeline runs only while this
    /// host holds its claim, and keeps its positions in etcd.
    pub cluster: Option<Arc<weir_cluster::Session>>,
    /// In a cluster with `plugin_store`: where plugins uploaded through the
    /// API are kept for every host.
    pub plugin_store: Option<Arc<crate::plugin_store::PluginStore>>,
}

impl Slot {
    pub fn new(
        tenant: Arc<Tenant>,
        name: &str,
        config: PipelineConfig,
        definition: String,
        plugins: BTreeMap<String, PluginVersion>,
        metrics: PipelineMetrics,
    ) -> Arc<Slot> {
        metrics.state(State::Starting.as_str());
        Arc::new(Slot {
            tenant,
            name: name.to_string(),
            metrics,
            inner: Mutex::new(Inner {
                config,
                definition,
                plugins,
                wanted: Wanted::Run,
                restart: false,
                state: State::Starting,
                reason: None,
                failures: 0,
                control: None,
                swaps: VecDeque::new(),
                ended: false,
                last_live: None,
                sink_errors: BTreeMap::new(),
                held: None,
                rollback_within: 0,
                trials: BTreeMap::new(),
            }),
            changed: Condvar::new(),
            swapping: Mutex::new(()),
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `tenant/pipeline`, as logs and `/ready` name it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.tenant.name, self.name)
    }

    /// Starts the slot's thread.
    pub fn spawn(self: &Arc<Self>, context: Context) -> std::io::Result<()> {
        let slot = self.clone();
        std::thread::Builder::new()
            .name(format!("pipeline-{}", self.id()))
            .spawn(move || slot.supervise(&context))
            .map(|_| ())
    }

    /// The state now: a run that has recovered is running (or paused).
    pub fn state(&self) -> (State, Option<String>) {
        let inner = self.inner();
        let state = match (&inner.control, inner.state) {
            (Some(c), State::Starting) if c.recovered() && !c.stopping() => {
                if c.paused() {
                    State::Paused
                } else {
                    State::Running
                }
            }
            (_, state) => state,
        };
        (state, inner.reason.clone())
    }

    pub fn definition(&self) -> String {
        self.inner().definition.clone()
    }

    pub fn config(&self) -> PipelineConfig {
        self.inner().config.clone()
    }

    pub fn control(&self) -> Option<Arc<Control>> {
        self.inner().control.clone()
    }

    /// The last error of each sink that caused one.
    pub fn sink_errors(&self) -> BTreeMap<String, String> {
        self.inner().sink_errors.clone()
    }

    /// The running run's live status, or the last run's.
    pub fn live(&self) -> Option<LiveStatus> {
        let inner = self.inner();
        match &inner.control {
            Some(control) => Some(control.live()),
            None => inner.last_live.clone(),
        }
    }

    pub fn plugin(&self, sink: &str) -> Option<PluginVersion> {
        self.inner().plugins.get(sink).cloned()
    }

    pub fn plugins(&self) -> BTreeMap<String, PluginVersion> {
        self.inner().plugins.clone()
    }

    pub fn failures(&self) -> u32 {
        self.inner().failures
    }

    pub fn swaps(&self) -> Vec<SwapRecord> {
        self.inner().swaps.iter().cloned().collect()
    }

    pub fn memory_mb(&self) -> u64 {
        self.inner().config.sinks_memory_mb()
    }

    /// True once its thread has ended (after a delete).
    pub fn ended(&self) -> bool {
        self.inner().ended
    }

    /// Whether a run of it is under way.
    pub fn running(&self) -> bool {
        self.inner().control.is_some()
    }

    /// Whether the operator wants it to run (not stopped, not parked).
    pub fn wants_to_run(&self) -> bool {
        let inner = self.inner();
        inner.wanted == Wanted::Run && inner.state != State::Parked
    }

    /// In a cluster: the claim this host holds on it.
    pub fn held(&self) -> Option<Held> {
        self.inner().held
    }

    /// In a cluster: this host claimed it; it runs from now on.
    pub fn grant(&self, held: Held) {
        let mut inner = self.inner();
        inner.held = Some(held);
        if inner.state == State::Standby {
            self.set_state(&mut inner, State::Starting, None);
        }
        self.changed.notify_all();
    }

    /// In a cluster: this host no longer holds it (or must give it up).
    /// The run under way stops at a commit boundary; `why` is shown.
    pub fn revoke(&self, why: String) {
        let mut inner = self.inner();
        inner.held = None;
        if let Some(control) = &inner.control {
            control.stop();
        }
        if inner.control.is_none() && inner.wanted == Wanted::Run {
            self.set_state(&mut inner, State::Standby, Some(why));
        } else {
            inner.reason = Some(why);
        }
        self.changed.notify_all();
    }

    /// In a cluster: says where it runs while this host does not run it.
    pub fn standby(&self, why: String) {
        let mut inner = self.inner();
        if inner.held.is_none()
            && inner.control.is_none()
            && inner.wanted == Wanted::Run
            && matches!(inner.state, State::Starting | State::Standby)
            && (inner.state != State::Standby || inner.reason.as_deref() != Some(why.as_str()))
        {
            self.set_state(&mut inner, State::Standby, Some(why));
        }
    }

    /// Takes a new definition: the run under way stops at a commit boundary
    /// and the next one runs the new definition.
    pub fn redefine(
        &self,
        config: PipelineConfig,
        definition: String,
        plugins: BTreeMap<String, PluginVersion>,
    ) {
        let mut inner = self.inner();
        inner.config = config;
        inner.definition = definition;
        inner.plugins = plugins;
        inner.restart = true;
        inner.failures = 0;
        if let Some(control) = &inner.control {
            control.stop();
        }
        self.changed.notify_all();
    }

    /// Sets the plugin version a sink runs from now on (a swap was made, or
    /// the pipeline was not running) and records the swap.
    pub fn set_plugin(&self, sink: &str, version: PluginVersion, record: SwapRecord) {
        let mut inner = self.inner();
        inner.plugins.insert(sink.to_string(), version);
        // A new version is on trial; one rolled back to was already tried.
        if record.outcome == "swapped" && inner.rollback_within > 0 {
            let baseline = inner
                .control
                .as_ref()
                .map_or(0, |c| c.live().batches_committed);
            let trial = Trial {
                commits_left: inner.rollback_within,
                baseline,
            };
            inner.trials.insert(sink.to_string(), trial);
        } else {
            inner.trials.remove(sink);
        }
        push_swap(&mut inner, record);
    }

    pub fn record_swap(&self, record: SwapRecord) {
        push_swap(&mut self.inner(), record);
    }

    pub fn pause(&self) -> Result<(), String> {
        let inner = self.inner();
        match &inner.control {
            Some(control) if inner.state == State::Starting => {
                control.pause();
                Ok(())
            }
            _ => Err(format!("it is {}, not running", inner.state.as_str())),
        }
    }

    pub fn resume(&self) -> Result<(), String> {
        let mut inner = self.inner();
        match inner.state {
            State::Parked | State::Backoff => {
                inner.failures = 0;
                inner.wanted = Wanted::Run;
                inner.state = State::Starting;
                inner.reason = None;
                self.changed.notify_all();
                Ok(())
            }
            _ => match &inner.control {
                Some(control) => {
                    control.resume();
                    Ok(())
                }
                None => Err(format!("it is {}, not paused", inner.state.as_str())),
            },
        }
    }

    pub fn stop(&self) {
        self.want(Wanted::Stop);
    }

    pub fn delete(&self) {
        self.want(Wanted::Delete);
    }

    pub fn start(&self) {
        let mut inner = self.inner();
        inner.wanted = Wanted::Run;
        inner.failures = 0;
        if matches!(
            inner.state,
            State::Parked | State::Backoff | State::Stopped | State::Finished
        ) {
            inner.state = State::Starting;
            inner.reason = None;
        }
        self.changed.notify_all();
    }

    fn want(&self, wanted: Wanted) {
        let mut inner = self.inner();
        inner.wanted = wanted;
        if let Some(control) = &inner.control {
            control.stop();
        }
        self.changed.notify_all();
    }

    /// Waits until the slot's thread ended, at most `bound`.
    pub fn wait_ended(&self, bound: Duration) -> bool {
        let inner = self.inner();
        let (inner, _) = self
            .changed
            .wait_timeout_while(inner, bound, |i| !i.ended)
            .unwrap_or_else(PoisonError::into_inner);
        inner.ended
    }

    fn set_state(&self, inner: &mut Inner, state: State, reason: Option<String>) {
        inner.state = state;
        inner.reason = reason;
        self.metrics.state(state.as_str());
        self.changed.notify_all();
    }

    /// The thread: runs, restarts and parks, until deleted.
    fn supervise(self: Arc<Self>, context: &Context) {
        self.inner().rollback_within = context.restart.rollback_within_commits;
        loop {
            let (config, control, held) = {
                let mut inner = self.inner();
                loop {
                    match inner.wanted {
                        Wanted::Delete => {
                            inner.ended = true;
                            inner.control = None;
                            self.set_state(&mut inner, State::Stopped, Some("deleted".into()));
                            return;
                        }
                        Wanted::Stop => {
                            if inner.state != State::Stopped {
                                self.set_state(&mut inner, State::Stopped, None);
                            }
                        }
                        Wanted::Run if context.cluster.is_some() && inner.held.is_none() => {
                            if inner.state == State::Starting {
                                self.set_state(
                                    &mut inner,
                                    State::Standby,
                                    Some("waiting to be placed on a host".into()),
                                );
                            }
                        }
                        Wanted::Run
                            if matches!(inner.state, State::Starting | State::Standby)
                                || inner.restart =>
                        {
                            break;
                        }
                        Wanted::Run => {}
                    }
                    inner = self
                        .changed
                        .wait(inner)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                inner.restart = false;
                let control = Control::new(self.metrics.clone());
                inner.control = Some(control.clone());
                self.set_state(&mut inner, State::Starting, None);
                (effective(&inner), control, inner.held)
            };
            let open_store = context.cluster.clone().zip(held).map(|(session, held)| {
                let id = weir_cluster::PipelineId::new(&self.tenant.name, &self.name);
                move |_: &PipelineConfig| -> Result<Box<dyn weir_pipeline::store::PositionStore>, _> {
                    Ok(Box::new(weir_cluster::EtcdStore::new(
                        session.clone(),
                        id.clone(),
                        held.lease,
                    )))
                }
            });
            let host = RunHost {
                io: &context.io,
                engine: &context.engine,
                control: &control,
                tenant: Some(self.tenant.share.clone()),
                store: open_store
                    .as_ref()
                    .map(|open| open as &weir_pipeline::OpenStore),
            };
            let span =
                tracing::info_span!("pipeline", tenant = %self.tenant.name, pipeline = %self.name);
            let options = RunOptions {
                take_over_source: held.is_some(),
                ..RunOptions::default()
            };
            let result = span.in_scope(|| weir_pipeline::run(&config, &options, &host));
            self.after_run(result, &control, context);
        }
    }

    /// Rolls `sink` back to the version before the one on trial that made
    /// the run fail after `used` of its first commits, and says why; `None`
    /// when there is no version to go back to.
    fn roll_back_on_trial(
        &self,
        inner: &mut Inner,
        sink: &str,
        used: u64,
        failure: &str,
    ) -> Option<String> {
        let current = inner.plugins.get(sink)?.clone();
        let (path, sha256) = current.previous.clone()?;
        inner.trials.remove(sink);
        let why = format!(
            "sink `{sink}`: the version swapped in ({}) failed after {used} of its first {} \
             commits and was rolled back on its own to {}: {failure}",
            short(&current.sha256),
            inner.rollback_within,
            short(&sha256)
        );
        inner.plugins.insert(
            sink.to_string(),
            PluginVersion {
                path,
                sha256: sha256.clone(),
                previous: Some((current.path, current.sha256)),
                swaps: current.swaps + 1,
                file_sha256: current.file_sha256,
            },
        );
        push_swap(
            inner,
            SwapRecord {
                sink: sink.to_string(),
                outcome: Cow::Borrowed("rolled_back"),
                sha256,
                pause_ms: None,
                at: None,
                reason: Some(why.clone()),
            },
        );
        self.metrics.swap(sink, "rolled_back");
        inner.failures = 0;
        crate::server::save_plugin_versions(&self.id(), &inner.config, &inner.plugins);
        tracing::warn!(pipeline = %self.id(), "{why}");
        Some(why)
    }

    fn after_run(
        &self,
        result: Result<weir_pipeline::RunReport, RunError>,
        control: &Control,
        context: &Context,
    ) {
        let mut inner = self.inner();
        inner.control = None;
        let live = control.live();
        let committed = live.batches_committed > 0;
        let on_trial = settle_trials(&mut inner, live.batches_committed);
        inner.last_live = Some(live);
        if context.cluster.is_some() {
            // Fenced, or etcd out of reach: not a failure of the pipeline
            // (which restarts would count until it parks) but of this
            // host's hold on it. The claim is given up; the agent claims
            // it again if it is still placed here once etcd answers.
            let lost_hold = matches!(
                &result,
                Err(RunError::Store(
                    weir_pipeline::store::StoreError::Fenced { .. }
                        | weir_pipeline::store::StoreError::Shared(_)
                ))
            );
            if lost_hold || inner.held.is_none() {
                inner.held = None;
                let why = match &result {
                    Err(e) => format!("given up by this host: {e}"),
                    Ok(_) => "given up by this host at a commit boundary".into(),
                };
                tracing::warn!(pipeline = %self.id(), "{why}");
                if inner.wanted == Wanted::Run {
                    self.set_state(&mut inner, State::Standby, Some(why));
                }
                return;
            }
        }
        match result {
            Ok(_) if inner.restart || inner.wanted != Wanted::Run => {
                // Stopped on purpose: the loop decides what is next.
                if inner.restart {
                    self.set_state(&mut inner, State::Starting, None);
                }
            }
            Ok(report) => {
                let reason = (!report.disabled.is_empty()).then(|| {
                    let names: Vec<&String> = report.disabled.keys().collect();
                    format!("finished with optional sinks disabled: {names:?}")
                });
                self.set_state(&mut inner, State::Finished, reason);
            }
            Err(e) => {
                let message = self.tenant.explain(e.to_string());
                tracing::error!(pipeline = %self.id(), "run failed: {message}");
                let sink = match &e {
                    RunError::Stopped(stop) => Some(stop.sink.clone()),
                    RunError::Sink { sink, .. } => Some(sink.clone()),
                    _ => None,
                };
                if let Some(sink) = &sink {
                    inner.sink_errors.insert(sink.clone(), message.clone());
                }
                if inner.restart || inner.wanted != Wanted::Run {
                    if inner.restart {
                        self.set_state(&mut inner, State::Starting, Some(message));
                    }
                    return;
                }
                if let Some(sink) = &sink
                    && let Some(&(used, left)) = on_trial.get(sink)
                    && used < left
                    && let Some(why) = self.roll_back_on_trial(&mut inner, sink, used, &message)
                {
                    self.set_state(&mut inner, State::Starting, Some(why));
                    return;
                }
                inner.failures = if committed { 1 } else { inner.failures + 1 };
                let hopeless = is_poison(&e);
                if hopeless || inner.failures >= context.restart.max_failures {
                    let why = if hopeless {
                        format!("parked: a batch can never be written: {message}")
                    } else {
                        format!(
                            "parked after {} failures in a row: {message}",
                            inner.failures
                        )
                    };
                    tracing::error!(pipeline = %self.id(), "{why}");
                    self.set_state(&mut inner, State::Parked, Some(why));
                    return;
                }
                let pause = context.restart.backoff(inner.failures);
                self.metrics.restarted();
                let why = format!(
                    "restarting in {:.1} s after failure {}: {message}",
                    pause.as_secs_f64(),
                    inner.failures
                );
                self.set_state(&mut inner, State::Backoff, Some(why));
                // Wait out the pause unless told otherwise meanwhile.
                let (mut inner, _) = self
                    .changed
                    .wait_timeout_while(inner, pause, |i| {
                        i.wanted == Wanted::Run && i.state == State::Backoff && !i.restart
                    })
                    .unwrap_or_else(PoisonError::into_inner);
                if inner.wanted == Wanted::Run && inner.state == State::Backoff {
                    self.set_state(&mut inner, State::Starting, None);
                }
            }
        }
    }
}

/// Counts this run's commits against every version on trial: returns each
/// trial's commits made in this run and the commits it had left before it,
/// and ends the trials that are over.
fn settle_trials(inner: &mut Inner, commits: u64) -> BTreeMap<String, (u64, u64)> {
    let mut counted = BTreeMap::new();
    for (sink, trial) in &mut inner.trials {
        let used = commits.saturating_sub(trial.baseline);
        counted.insert(sink.clone(), (used, trial.commits_left));
        trial.commits_left = trial.commits_left.saturating_sub(used);
        // The next run counts from its own start.
        trial.baseline = 0;
    }
    inner.trials.retain(|_, trial| trial.commits_left > 0);
    counted
}

fn push_swap(inner: &mut Inner, record: SwapRecord) {
    if inner.swaps.len() == SWAPS_KEPT {
        inner.swaps.pop_front();
    }
    inner.swaps.push_back(record);
}

/// The definition with each sink running its current plugin version.
fn effective(inner: &Inner) -> PipelineConfig {
    let mut config = inner.config.clone();
    for sink in &mut config.sinks {
        if let Some(version) = inner.plugins.get(&sink.name) {
            sink.plugin = version.path.clone();
            sink.sha256 = Some(version.sha256.clone());
        }
    }
    config
}

/// A failure that a restart cannot mend: a batch no sink can ever write.
fn is_poison(error: &RunError) -> bool {
    matches!(error, RunError::Stopped(stop) if stop.failure.kind == weir_core::FailureKind::Poison)
}

/// The first twelve hex digits of a digest, as replies print them.
fn short(sha256: &str) -> &str {
    &sha256[..sha256.len().min(12)]
}
