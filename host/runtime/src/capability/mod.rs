//! The host capabilities a sink may import, one module each, all with the
//! same life cycle (the shape of Spin's factors):
//!
//! 1. at load, a plugin may import a capability's interface
//!    ([`Capability::INTERFACE`]); an import no capability provides is
//!    refused before anything runs;
//! 2. once per engine, every contract version's module links the
//!    capability's interface to its state (`wit::add_to_linker`), reached
//!    through [`HasCapabilities`];
//! 3. for every instance, it builds the state those functions see from what
//!    the operator granted the sink ([`Capability::instance_state`]).
//!
//! A new capability is one more module here, one more field in
//! [`CapabilityStates`] and its interface linked in each version module;
//! nothing above the runtime changes.

pub mod blob_faults;
pub mod blob_walk;
pub mod blobstore;
pub mod log;
pub mod token_bucket;

use std::sync::Arc;

use blobstore::{BlobScope, Blobstore};
use log::{Log, LogLimits};

/// One host capability a sink may import.
pub trait Capability {
    /// The `weir:sink` interface it provides, as named in a plugin's import
    /// (`blobstore` in `weir:sink/blobstore@0.1.0`).
    const INTERFACE: &'static str;

    /// What one sink instance holds of it.
    type State: Send + 'static;

    /// Builds one instance's state from the sink's grants.
    fn instance_state(grants: &Grants) -> Self::State;
}

/// The store data host functions reach their capability's state through.
/// Generic, so that capabilities know nothing of the instance that holds
/// them.
pub trait HasCapabilities: Send + 'static {
    fn capabilities(&mut self) -> &mut CapabilityStates;
}

/// What the operator granted one sink; every capability takes its part.
#[derive(Clone)]
pub struct Grants {
    /// The sink's name in the pipeline, to tag what it logs.
    pub sink_name: String,
    /// The one blob-store root it may use.
    pub blob: Arc<BlobScope>,
    /// How much it may log, and how long its messages may be.
    pub log: LogLimits,
    /// The hosts and ports it may reach, and how.
    pub network: crate::network::SinkNetwork,
}

/// The per-instance state of every capability.
pub struct CapabilityStates {
    pub(super) blobstore: <Blobstore as Capability>::State,
    pub(super) log: <Log as Capability>::State,
}

impl CapabilityStates {
    /// Each capability's state for a new instance of the sink.
    pub fn new(grants: &Grants) -> Self {
        CapabilityStates {
            blobstore: Blobstore::instance_state(grants),
            log: Log::instance_state(grants),
        }
    }
}

/// The interfaces the capabilities provide, in the order an operator reads
/// them in a message.
pub const INTERFACES: [&str; 2] = [Blobstore::INTERFACE, Log::INTERFACE];
