//! Outgoing network access for sinks: nothing unless the operator granted
//! it in the pipeline (`sinks[].grants.http`, `sinks[].grants.tcp`), and
//! then only to the granted hosts and ports, checked at the address the
//! host actually connects to.
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

pub use weir_contract::grants::Grants as NetworkGrants;

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
    /// TCP sockets open at once.
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
