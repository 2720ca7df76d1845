//! Faults a test host injects into a sink's blob store, to see what the
//! sink does when a write fails for a moment or when it dies in the middle
//! of a commit. Only `weir plugin test` arms them; a scope without a plan
//! (every pipeline's) never fails on purpose.

use std::sync::Mutex;

/// What happens at the armed write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The write fails with `io`, as a throttled or briefly unreachable
    /// store would; later writes succeed.
    TransientIo,
    /// The sink traps in the middle of the call: its instance is dead, as
    /// if its process had been killed just before that write.
    Crash,
}

/// Counts the mutating calls (`put`, `put-if-absent`, `delete`) since it
/// was armed and fails the one it was armed for.
#[derive(Debug, Default)]
pub struct BlobFaults {
    state: Mutex<FaultState>,
}

#[derive(Debug, Default)]
struct FaultState {
    armed: Option<(FaultKind, u64)>,
    writes: u64,
    fired: bool,
}

/// A fault that fired: the write it hit, and what the sink is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    pub kind: FaultKind,
    pub message: String,
}

impl BlobFaults {
    /// Fails the `at`-th mutating call from now (1 is the next one).
    pub fn arm(&self, kind: FaultKind, at: u64) {
        let mut state = self.lock();
        *state = FaultState {
            armed: Some((kind, at.max(1))),
            writes: 0,
            fired: false,
        };
    }

    /// Stops failing; says whether the armed fault fired and how many
    /// mutating calls were made since it was armed.
    pub fn disarm(&self) -> (bool, u64) {
        let mut state = self.lock();
        state.armed = None;
        (state.fired, state.writes)
    }

    /// Called before every mutating call: the fault, if this is its call.
    pub(super) fn before_write(&self, path: &str) -> Option<Fired> {
        let mut state = self.lock();
        let (kind, at) = state.armed?;
        state.writes += 1;
        if state.writes != at {
            return None;
        }
        state.fired = true;
        let message = match kind {
            FaultKind::TransientIo => {
                format!("{path}: injected transient failure (weir plugin test)")
            }
            FaultKind::Crash => {
                format!("crash injected at write {at} (`{path}`) by weir plugin test")
            }
        };
        Some(Fired { kind, message })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
