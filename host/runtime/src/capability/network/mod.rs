//! The network capability: outgoing network access for sinks, nothing
//! unless the operator granted it in the pipeline (`sinks[].grants.http`,
//! `sinks[].grants.tcp`), and then only to the granted hosts and ports,
//! checked at the address the host actually connects to.
//!
//! It provides whole WASI packages rather than a `weir:sink` interface, and
//! is the one capability that refuses an import at load: a plugin importing
//! `wasi:http` or `wasi:sockets` loads only for a sink granted that kind of
//! access ([`Network::check_import`]).
//!
//! - HTTP (`wasi:http`) is sent by the host's own client ([`http`]): the
//!   request's host is checked, resolved by the host, every address checked
//!   again (a granted name must not lead to a loopback or private address
//!   unless that address is granted too), and the connection made to the
//!   checked address, with bounded timeouts, response size and requests in
//!   flight.
//! - TCP (`wasi:sockets`) connects only to checked addresses ([`tcp`]):
//!   name lookup answers only granted names and remembers what it answered,
//!   so the connect check knows which name an address stands for. No
//!   listening, no UDP.
//!
//! The decisions themselves are `weir_contract::grants`, shared with the
//! SDK's native runner so a sink's unit tests are granted the same way.

pub mod http;
pub mod tcp;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};
pub use weir_contract::grants::Grants as NetworkGrants;

use self::http::HttpGate;
use self::tcp::HasNetwork;
use super::{Capability, Grants, Import, ImportGrants, Provides};
use crate::budget::{self, Budget, Claim, Exhausted};
use crate::tenant::TenantShare;

/// The package a plugin imports to send HTTP requests.
const HTTP_PACKAGE: &str = "wasi:http";
/// The package a plugin imports to open TCP connections.
const SOCKETS_PACKAGE: &str = "wasi:sockets";

/// One kind of network access a plugin may import.
struct Access {
    /// The WASI package that gives it.
    package: &'static str,
    /// Its key under a sink's `grants`, and its name in
    /// `weir plugin inspect`'s `network` list.
    kind: &'static str,
    /// A grant to show a sink refused for lack of one.
    example: &'static str,
    /// Whether a sink's grants open it.
    granted: fn(&NetworkGrants) -> bool,
}

/// Every kind, in the order `weir plugin inspect` lists them.
const ACCESS: [Access; 2] = [
    Access {
        package: HTTP_PACKAGE,
        kind: "http",
        example: "[\"https://api.example.com\"]",
        granted: |grants| !grants.http.is_empty(),
    },
    Access {
        package: SOCKETS_PACKAGE,
        kind: "tcp",
        example: "[\"redis.internal:6379\"]",
        granted: |grants| !grants.tcp.is_empty(),
    },
];

/// The kinds of network access, as grants and plugins name them.
pub const KINDS: [&str; 2] = [ACCESS[0].kind, ACCESS[1].kind];

/// The kind of network access an import reaches for, if it is a network one.
pub fn kind_of(import: &Import) -> Option<&'static str> {
    ACCESS
        .iter()
        .find(|access| access.package == import.package)
        .map(|access| access.kind)
}

/// The network capability.
pub struct Network;

impl Capability for Network {
    const PROVIDES: Provides = Provides::WasiPackages(&[HTTP_PACKAGE, SOCKETS_PACKAGE]);
    type State = InstanceNetwork;

    fn instance_state(grants: &Grants) -> InstanceNetwork {
        let shared = SharedSockets::of(grants.tenant.as_deref());
        InstanceNetwork {
            granted: grants.network.clone(),
            http: WasiHttpCtx::new(),
            http_gate: HttpGate::new(grants.network.clone(), shared.clone()),
            tcp_sockets: TcpSockets {
                held: Vec::new(),
                shared,
            },
        }
    }

    /// The network is granted per sink: its packages link only for a sink
    /// whose pipeline entry grants that kind of access.
    fn check_import(import: &Import, grants: &ImportGrants) -> Result<(), String> {
        let Some(access) = ACCESS
            .iter()
            .find(|access| access.package == import.package)
        else {
            return Ok(());
        };
        if (access.granted)(grants.network) {
            return Ok(());
        }
        let key = format!("grants.{}", access.kind);
        Err(format!(
            "imports `{}`, but its sink has no `{key}`: add the hosts it may reach to the \
             sink's entry, for example `{key}: {}`",
            import.name, access.example
        ))
    }
}

/// The kinds of network access `imports` reach for (`http` for `wasi:http`,
/// `tcp` for `wasi:sockets`): its sink's entry must grant them before the
/// plugin loads.
pub fn imported_kinds(imports: &[String]) -> Vec<String> {
    let imports_package = |package: &str| {
        imports
            .iter()
            .any(|name| Import::parse(name).is_some_and(|import| import.package == package))
    };
    ACCESS
        .iter()
        .filter(|access| imports_package(access.package))
        .map(|access| access.kind.to_string())
        .collect()
}

/// Links the network's packages: `wasi:http` sent through each instance's
/// [`HttpGate`], and the host's own name lookup and counted TCP sockets in
/// place of WASI's (see [`tcp`]). Called after WASI is linked, since it
/// shadows some of WASI's sockets functions.
pub fn add_to_linker<T: WasiHttpView + HasNetwork>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    wasmtime_wasi_http::p2::add_only_http_to_linker_sync(linker)?;
    tcp::add_name_lookup_to_linker(linker)
}

/// Sets an instance's WASI sockets to what its sink was granted. wasmtime
/// allows socket kinds and checks addresses in the WASI context, not in the
/// linker, so each instance's context is configured here.
pub fn configure_sockets(wasi: &mut WasiCtxBuilder, network: &SinkNetwork) {
    let tcp_granted = !network.grants.tcp.is_empty();
    wasi.allow_tcp(tcp_granted)
        // UDP is never granted: a UDP socket is refused when it is made,
        // before it takes a descriptor (the host's `create-udp-socket`
        // logs the refusal, see `tcp`).
        .allow_udp(false)
        // Name lookup is the host's own (see `tcp`), which answers only
        // granted names.
        .allow_ip_name_lookup(false)
        .socket_addr_check(tcp::address_check(network.clone()));
}

/// One instance's network: what its sink may reach, `wasi:http`'s state
/// and the gate its every request passes, and the TCP sockets it holds.
pub struct InstanceNetwork {
    granted: SinkNetwork,
    http: WasiHttpCtx,
    http_gate: HttpGate,
    tcp_sockets: TcpSockets,
}

/// The budgets each socket and HTTP connection of a sink counts against
/// beside the sink's own limit: its tenant's `max_sockets`, under `weir
/// serve`, and the descriptors the host lets all plugins hold.
#[derive(Clone)]
pub struct SharedSockets {
    budgets: Vec<Arc<Budget>>,
}

impl SharedSockets {
    pub fn of(tenant: Option<&TenantShare>) -> SharedSockets {
        let mut budgets = vec![budget::plugin_descriptors().clone()];
        if let Some(tenant) = tenant {
            budgets.insert(0, tenant.sockets.clone());
        }
        SharedSockets { budgets }
    }

    /// One socket's place in every budget, given back when dropped.
    pub fn take(&self) -> Result<Claim, Exhausted> {
        Claim::take(self.budgets.iter().map(|budget| (budget, 1)))
    }
}

/// The TCP sockets one instance holds: one claim on the shared budgets
/// each. Its sockets close with its store, and so do the claims: dropped
/// with the instance however it ended.
pub struct TcpSockets {
    held: Vec<Claim>,
    shared: SharedSockets,
}

impl TcpSockets {
    /// How many it holds.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Counts one more, if the shared budgets have room for it.
    pub fn take(&mut self) -> Result<(), Exhausted> {
        self.held.push(self.shared.take()?);
        Ok(())
    }

    /// Counts one out: the guest dropped a socket.
    pub fn give_back(&mut self) {
        self.held.pop();
    }
}

impl InstanceNetwork {
    /// What `wasi:http` works with, beside the instance's resource table
    /// (which the store data holds, not the capability).
    pub fn http_view<'a>(&'a mut self, table: &'a mut ResourceTable) -> WasiHttpCtxView<'a> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table,
            hooks: &mut self.http_gate,
        }
    }

    /// What the sink may reach, for the host's name lookup.
    pub fn granted(&self) -> &SinkNetwork {
        &self.granted
    }

    /// The TCP sockets the instance holds now.
    pub fn tcp_sockets(&mut self) -> &mut TcpSockets {
        &mut self.tcp_sockets
    }
}

/// The bounds on one sink's outgoing network use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkLimits {
    /// Connecting (TCP and TLS handshakes included).
    pub connect_timeout: Duration,
    /// From the request sent to the response's head.
    pub first_byte_timeout: Duration,
    /// Between two pieces of a response body.
    pub between_bytes_timeout: Duration,
    /// The largest response body.
    pub max_response_bytes: u64,
    /// Requests in flight at once.
    pub max_concurrent_requests: usize,
    /// TCP sockets open at once, connected or not.
    pub max_tcp_connections: usize,
}

impl Default for NetworkLimits {
    fn default() -> Self {
        NetworkLimits {
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(30),
            between_bytes_timeout: Duration::from_secs(30),
            max_response_bytes: 64 << 20,
            max_concurrent_requests: 16,
            max_tcp_connections: 16,
        }
    }
}

/// One sink's network: what it was granted, its limits, and the names its
/// lookups answered (so a connect to an address can be checked as the name
/// it was resolved from).
#[derive(Clone)]
pub struct SinkNetwork {
    pub sink: Arc<str>,
    pub grants: Arc<NetworkGrants>,
    pub limits: NetworkLimits,
    resolved: Arc<Mutex<HashMap<IpAddr, String>>>,
}

impl SinkNetwork {
    pub fn new(sink: &str, grants: Arc<NetworkGrants>, limits: NetworkLimits) -> Self {
        SinkNetwork {
            sink: sink.into(),
            grants,
            limits,
            resolved: Arc::default(),
        }
    }

    /// Nothing granted: the default for every sink.
    pub fn none(sink: &str) -> Self {
        Self::new(sink, Arc::default(), NetworkLimits::default())
    }

    fn remember(&self, name: &str, ip: IpAddr) {
        let mut resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        resolved.insert(ip, name.to_string());
    }

    fn name_of(&self, ip: IpAddr) -> Option<String> {
        let resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        resolved.get(&ip).cloned()
    }
}
