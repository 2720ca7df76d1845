//! How the world outside a running pipeline talks to it: stop, pause,
//! resume, and swap a sink's worker for another, each carried out by the
//! run loop at a commit boundary; and what the run shows of itself (its
//! live status) while it runs.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use weir_metrics::PipelineMetrics;
use weir_runtime::SinkWorker;

/// Shared by a running pipeline and whoever steers it.
pub struct Control {
    stop: Arc<AtomicBool>,
    paused: AtomicBool,
    /// Set once the run has recovered and takes changes.
    recovered: AtomicBool,
    /// Set while a swap is queued.
    swap_waiting: AtomicBool,
    /// Set once the run has ended: a swap asked for then is answered at once.
    ended: AtomicBool,
    /// Set while a request waits, so the loop looks at the queue cheaply.
    pending: AtomicBool,
    swaps: Mutex<Vec<SwapRequest>>,
    live: Mutex<LiveStatus>,
    pub metrics: PipelineMetrics,
}

/// A started worker of a new plugin version, waiting for the boundary.
pub struct SwapRequest {
    /// The sink whose worker it replaces.
    pub sink: String,
    /// Started: instantiated and opened, not yet called.
    pub worker: SinkWorker,
    /// Answers once the swap was made or refused.
    pub reply: Sender<Result<SwapDone, String>>,
}

/// A swap carried out.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SwapDone {
    pub sink: String,
    /// How long the run stopped taking changes for it: from the boundary
    /// (the batch in flight committed, as it would have anyway) to the new
    /// worker in place.
    pub pause_ms: f64,
    /// The checkpoint at the boundary where the new version took over.
    pub at: Option<String>,
}

/// What a running pipeline shows of itself: its report so far and where
/// each sink stands, filled in by `RunReport::publish`. `weir serve` sends
/// it and `weir ctl` reads it back; a field a server of another version
/// leaves out reads as its default.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LiveStatus {
    pub epoch: u64,
    pub transactions: u64,
    pub changes: u64,
    pub batches_committed: u64,
    pub checkpoint: Option<String>,
    /// Seconds the oldest change not yet committed has waited (0 when
    /// everything read is committed).
    pub lag_seconds: f64,
    /// Bytes of source log not yet acknowledged, where the source can say.
    pub lag_bytes: Option<u64>,
    pub sinks: BTreeMap<String, LiveSink>,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LiveSink {
    pub required: bool,
    pub positioned: bool,
    /// Why the sink is out of this run, if it is.
    pub disabled: Option<String>,
    pub tables: BTreeMap<String, LiveTable>,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LiveTable {
    pub position: Option<String>,
    /// "sink" (its `positions` said so), "store" (the host's store), or
    /// "this-run" (committed since this run started). Borrowed as the run
    /// fills it in on every commit; owned only when read back from JSON.
    pub from: Option<Cow<'static, str>>,
}

impl Control {
    pub fn new(metrics: PipelineMetrics) -> Arc<Control> {
        Self::with_stop(Arc::new(AtomicBool::new(false)), metrics)
    }

    /// A control whose stop flag is shared with a signal handler.
    pub fn with_stop(stop: Arc<AtomicBool>, metrics: PipelineMetrics) -> Arc<Control> {
        Arc::new(Control {
            stop,
            paused: AtomicBool::new(false),
            recovered: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            swap_waiting: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            swaps: Mutex::new(Vec::new()),
            live: Mutex::new(LiveStatus::default()),
            metrics,
        })
    }

    /// The stop flag itself, for what waits outside the run loop (a
    /// source waiting for its server) and must give up when it is set.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Asks the run to stop at the next commit boundary.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.pending.store(true, Ordering::Release);
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Stops taking changes at the next commit boundary until resumed.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
        self.pending.store(true, Ordering::Release);
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }

    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Queues a swap for the next commit boundary; answered at once with
    /// [`RUN_ENDED`] when the run has ended.
    pub fn request_swap(&self, request: SwapRequest) {
        let mut swaps = lock(&self.swaps);
        if self.ended.load(Ordering::Acquire) {
            let _ = request.reply.send(Err(RUN_ENDED.to_string()));
            return;
        }
        swaps.push(request);
        self.swap_waiting.store(true, Ordering::Release);
    }

    /// True while a swap waits for the next commit boundary. The run takes
    /// it at the next boundary it reaches anyway (a batch committed, or
    /// nothing buffered), so a swap never forces an early commit.
    pub(super) fn swap_waiting(&self) -> bool {
        self.swap_waiting.load(Ordering::Acquire)
    }

    /// The run has ended, however: every swap still queued is answered.
    pub(super) fn end(&self) {
        let mut swaps = lock(&self.swaps);
        self.ended.store(true, Ordering::Release);
        for request in swaps.drain(..) {
            let _ = request.reply.send(Err(RUN_ENDED.to_string()));
        }
    }

    /// True when something waits for a commit boundary.
    pub(super) fn wants_boundary(&self) -> bool {
        // The stop flag may be set from outside (a signal handler shares it).
        self.pending.load(Ordering::Acquire) || self.stopping()
    }

    /// The swaps waiting, taken.
    pub(super) fn take_swaps(&self) -> Vec<SwapRequest> {
        let mut swaps = lock(&self.swaps);
        self.swap_waiting.store(false, Ordering::Release);
        std::mem::take(&mut *swaps)
    }

    /// Leaves the flag set only while a stop or a pause still waits.
    pub(super) fn settle(&self) {
        let _swaps = lock(&self.swaps);
        let waiting = self.stopping() || self.paused();
        self.pending.store(waiting, Ordering::Release);
    }

    /// Sleeps one `step` while paused, so a stop or a swap is seen soon.
    pub(super) fn wait_while_paused(&self, step: Duration) {
        std::thread::sleep(step);
    }

    /// The run has recovered: from now on it takes changes.
    pub(super) fn mark_recovered(&self) {
        self.recovered.store(true, Ordering::Release);
        self.metrics.state("running");
    }

    pub fn recovered(&self) -> bool {
        self.recovered.load(Ordering::Acquire)
    }

    pub fn live(&self) -> LiveStatus {
        lock(&self.live).clone()
    }

    pub(super) fn update_live(&self, f: impl FnOnce(&mut LiveStatus)) {
        f(&mut lock(&self.live));
    }
}

/// The answer to a swap whose run ended before a commit boundary.
pub const RUN_ENDED: &str = "the pipeline's run ended before the swap";

/// Ends the control's run when dropped, however the run ends.
pub(super) struct EndOnDrop<'a>(pub &'a Control);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
