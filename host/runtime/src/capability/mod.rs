//! The host capabilities a sink may import, one module each, all with the
//! same life cycle (the shape of Spin's factors):
//!
//! 1. at load, every import a plugin names must be one some capability
//!    provides ([`Capability::PROVIDES`]: a `weir:sink` interface, or whole
//!    WASI packages), or the contract's shared types, or WASI with nothing
//!    ambient; and the capability that provides it checks it against what
//!    the operator granted the sink ([`Capability::check_import`]). Anything
//!    else is refused before anything runs;
//! 2. once per engine, its imports are linked to its state, reached through
//!    [`HasCapabilities`]: a `weir:sink` interface by every contract
//!    version's module (`wit::add_to_linker`), the network's WASI packages
//!    by [`network::add_to_linker`];
//! 3. for every instance, it builds the state those functions see from what
//!    the operator granted the sink ([`Capability::instance_state`]).
//!
//! A new capability is one more module here implementing [`Capability`],
//! one more entry in [`PROVIDERS`], one more field in [`CapabilityStates`],
//! and its imports linked (in each version module, for a `weir:sink`
//! interface); loading asks the capabilities, so it needs no change, and
//! nothing above the runtime does either.

pub mod blob_faults;
pub mod blob_walk;
pub mod blobstore;
pub mod log;
pub mod network;
pub mod token_bucket;

use std::sync::Arc;

use blobstore::{BlobScope, Blobstore};
use log::{Log, LogLimits};
use network::{Network, NetworkGrants, SinkNetwork};

use crate::tenant::TenantShare;

/// One host capability a sink may import.
pub trait Capability {
    /// The imports it provides.
    const PROVIDES: Provides;

    /// What one sink instance holds of it.
    type State: Send + 'static;

    /// Builds one instance's state from the sink's grants.
    fn instance_state(grants: &Grants) -> Self::State;

    /// Whether the sink's grants let a plugin import `import`, one this
    /// capability provides. Checked at load, so that a sink missing a grant
    /// is refused before it runs rather than failing at its first call; the
    /// error completes the sentence `plugin <path> ...`. Every import is
    /// granted unless the capability says otherwise.
    fn check_import(_import: &Import, _grants: &ImportGrants) -> Result<(), String> {
        Ok(())
    }
}

/// The imports a capability provides.
#[derive(Debug, Clone, Copy)]
pub enum Provides {
    /// One interface of the contract, in the version the plugin was built
    /// against (loading checks the version): `blobstore` for
    /// `weir:sink/blobstore@0.1.0`.
    ContractInterface(&'static str),
    /// Every interface of these WASI packages, in whichever version
    /// wasmtime links: `wasi:http` for `wasi:http/outgoing-handler@0.2.6`.
    WasiPackages(&'static [&'static str]),
}

impl Provides {
    /// Whether `import` is one of these.
    pub fn covers(self, import: &Import) -> bool {
        match self {
            Provides::ContractInterface(interface) => {
                import.package == crate::wit::PACKAGE && import.interface == interface
            }
            Provides::WasiPackages(packages) => packages.contains(&import.package),
        }
    }
}

/// One import as a plugin names it: `weir:sink/blobstore@0.1.0` is the
/// interface `blobstore` of the package `weir:sink`, version `0.1.0`.
#[derive(Debug, Clone, Copy)]
pub struct Import<'a> {
    /// The whole name, as a message quotes it.
    pub name: &'a str,
    pub package: &'a str,
    pub interface: &'a str,
    /// Empty when the name has none.
    pub version: &'a str,
}

impl<'a> Import<'a> {
    /// Splits an import's name; `None` for a name with no interface (a bare
    /// function or instance name), which no capability provides.
    pub fn parse(name: &'a str) -> Option<Self> {
        let (package, rest) = name.split_once('/')?;
        let (interface, version) = rest.split_once('@').unwrap_or((rest, ""));
        Some(Import {
            name,
            package,
            interface,
            version,
        })
    }
}

/// The part of a sink's grants that decides, at load, whether a plugin's
/// imports may link at all; the rest of [`Grants`] (its blob root, its log
/// limits) only shapes an instance, and loading has none.
#[derive(Debug, Clone, Copy)]
pub struct ImportGrants<'a> {
    /// The hosts and ports it may reach, and how.
    pub network: &'a NetworkGrants,
}

/// One capability as loading sees it: the load-time half of [`Capability`],
/// without its state type, so that every capability fits in one list.
#[derive(Clone, Copy)]
pub struct Provider {
    pub provides: Provides,
    check: fn(&Import, &ImportGrants) -> Result<(), String>,
}

impl Provider {
    const fn of<C: Capability>() -> Self {
        Provider {
            provides: C::PROVIDES,
            check: C::check_import,
        }
    }

    /// Whether the sink's grants let a plugin import `import`, one this
    /// capability provides; the error is the refusal's sentence.
    pub fn check_import(&self, import: &Import, grants: &ImportGrants) -> Result<(), String> {
        (self.check)(import, grants)
    }
}

/// Every capability, in the order an operator reads them in a message.
pub const PROVIDERS: [Provider; 3] = [
    Provider::of::<Blobstore>(),
    Provider::of::<Log>(),
    Provider::of::<Network>(),
];

/// The capability that provides `import`, if any does.
pub fn provider_of(import: &Import) -> Option<Provider> {
    PROVIDERS
        .into_iter()
        .find(|provider| provider.provides.covers(import))
}

/// The contract interfaces the capabilities provide (`blobstore`, `log`),
/// in the order an operator reads them in a message.
pub fn contract_interfaces() -> impl Iterator<Item = &'static str> {
    PROVIDERS
        .into_iter()
        .filter_map(|provider| match provider.provides {
            Provides::ContractInterface(interface) => Some(interface),
            Provides::WasiPackages(_) => None,
        })
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
    pub network: SinkNetwork,
    /// The tenant whose shares (log rate, sockets) it draws on with the
    /// tenant's other sinks, under `weir serve`.
    pub tenant: Option<Arc<TenantShare>>,
}

/// The per-instance state of every capability.
pub struct CapabilityStates {
    pub(super) blobstore: <Blobstore as Capability>::State,
    pub(super) log: <Log as Capability>::State,
    pub(super) network: <Network as Capability>::State,
}

impl CapabilityStates {
    /// Each capability's state for a new instance of the sink.
    pub fn new(grants: &Grants) -> Self {
        CapabilityStates {
            blobstore: Blobstore::instance_state(grants),
            log: Log::instance_state(grants),
            network: Network::instance_state(grants),
        }
    }
}
