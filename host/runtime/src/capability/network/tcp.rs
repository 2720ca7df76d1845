//! `wasi:sockets` for a sink: TCP connections to granted addresses only.
//!
//! wasmtime checks each socket address before it is used; that check sees
//! only an IP address, so name lookup is the host's too: it answers only
//! names a TCP grant names, and remembers which name each address it gave
//! stands for. A connect is then checked as that name (a granted name may
//! reach only public addresses unless the address is granted as well) or,
//! for an address the sink wrote itself, as that address. Binding is
//! allowed only as the implicit bind of a connect; listening, accepting
//! and UDP are refused.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::pin::Pin;

use wasmtime::component::{Linker, Resource, ResourceTable, ResourceType};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::p2::bindings::sockets::network::{ErrorCode, IpAddress, IpAddressFamily};
use wasmtime_wasi::p2::bindings::sockets::tcp_create_socket::Host as _;
use wasmtime_wasi::p2::{Network, TcpSocket, UdpSocket};
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::sockets::WasiSocketsView as _;
use wasmtime_wasi_io::poll::{DynPollable, Pollable, subscribe};

use super::{SinkNetwork, TcpSockets};

/// The interfaces whose lookup and socket creation the host replaces, in
/// the version wasmtime links (older guest versions resolve to them by
/// semver).
const NAME_LOOKUP: &str = "wasi:sockets/ip-name-lookup@0.2.12";
const CREATE_SOCKET: &str = "wasi:sockets/tcp-create-socket@0.2.12";
const TCP: &str = "wasi:sockets/tcp@0.2.12";
const CREATE_UDP_SOCKET: &str = "wasi:sockets/udp-create-socket@0.2.12";

/// The store data the replaced functions need: the sink's network, the
/// instance's resource table, and how many TCP sockets it holds. A trait of
/// its own beside [`HasCapabilities`](crate::capability::HasCapabilities)
/// because they need the table and the network's state at once.
pub trait HasNetwork: WasiView + Send + 'static {
    fn network(&mut self) -> (&SinkNetwork, &mut ResourceTable);
    fn tcp_sockets(&mut self) -> &mut TcpSockets;
}

type Check = Pin<Box<dyn Future<Output = bool> + Send + Sync>>;

/// wasmtime's per-address check for one sink's sockets.
pub fn address_check(
    network: SinkNetwork,
) -> impl Fn(SocketAddr, SocketAddrUse) -> Check + Send + Sync + 'static {
    move |address, use_| {
        let allowed = decide(&network, address, use_);
        Box::pin(async move { allowed })
    }
}

fn decide(network: &SinkNetwork, address: SocketAddr, use_: SocketAddrUse) -> bool {
    let refuse = |why: &dyn std::fmt::Display| {
        tracing::warn!(sink = %network.sink, target = %address, "socket refused: {why}");
        false
    };
    match use_ {
        SocketAddrUse::TcpConnect => {
            let name = network.name_of(address.ip());
            match network
                .grants
                .check_tcp_address(name.as_deref(), address.ip(), address.port())
            {
                Ok(_) => true,
                Err(refusal) => refuse(&refusal),
            }
        }
        // A connect binds the socket to the wildcard address first.
        SocketAddrUse::TcpBind if address.ip().is_unspecified() && address.port() == 0 => true,
        SocketAddrUse::TcpBind | SocketAddrUse::TcpListen | SocketAddrUse::TcpAccept => {
            refuse(&"sinks may not listen for connections")
        }
        _ => refuse(&"sinks may not use UDP"),
    }
}

/// The answer to one lookup, complete when it is made.
pub struct GrantedLookup {
    addresses: std::vec::IntoIter<IpAddr>,
}

#[wasmtime_wasi_io::async_trait]
impl Pollable for GrantedLookup {
    async fn ready(&mut self) {}
}

/// Replaces `wasi:sockets/ip-name-lookup` in `linker` with the host's
/// granted lookup, TCP socket creation with one that counts the instance's
/// sockets, connected or not, against `limits.max_tcp_connections`, its
/// tenant's `max_sockets` and the host's descriptors (before the socket
/// takes a descriptor), and UDP socket creation with a refusal.
pub fn add_name_lookup_to_linker<T: HasNetwork>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    linker.instance(CREATE_SOCKET)?.func_wrap(
        "create-tcp-socket",
        |mut store, (family,): (IpAddressFamily,)| {
            let state = store.data_mut();
            let held = state.tcp_sockets().held();
            let (network, _) = state.network();
            let (sink, most) = (network.sink.clone(), network.limits.max_tcp_connections);
            if held >= most {
                tracing::warn!(
                    %sink,
                    "TCP socket refused: {held} already open (limits.max_tcp_connections = {most})"
                );
                return Ok((Err(ErrorCode::NewSocketLimit),));
            }
            if let Err(full) = state.tcp_sockets().take() {
                tracing::warn!(%sink, "TCP socket refused: {full}");
                return Ok((Err(ErrorCode::NewSocketLimit),));
            }
            match state.sockets().create_tcp_socket(family) {
                Ok(socket) => Ok((Ok(socket),)),
                Err(error) => {
                    state.tcp_sockets().give_back();
                    Ok((Err(error.downcast()?),))
                }
            }
        },
    )?;
    linker.instance(CREATE_UDP_SOCKET)?.func_wrap(
        "create-udp-socket",
        |mut store, (_family,): (IpAddressFamily,)| {
            let (network, _) = store.data_mut().network();
            tracing::warn!(sink = %network.sink, "UDP socket refused: sinks may not use UDP");
            Ok((Err::<Resource<UdpSocket>, _>(ErrorCode::AccessDenied),))
        },
    )?;
    // The same resource, with a destructor that also counts it out.
    linker.instance(TCP)?.resource(
        "tcp-socket",
        ResourceType::host::<TcpSocket>(),
        |mut store, rep| {
            let state = store.data_mut();
            let (_, table) = state.network();
            table.delete(Resource::<TcpSocket>::new_own(rep))?;
            state.tcp_sockets().give_back();
            Ok(())
        },
    )?;
    let mut lookup = linker.instance(NAME_LOOKUP)?;
    lookup.resource(
        "resolve-address-stream",
        ResourceType::host::<GrantedLookup>(),
        |mut store, rep| {
            let (_, table) = store.data_mut().network();
            table.delete(Resource::<GrantedLookup>::new_own(rep))?;
            Ok(())
        },
    )?;
    lookup.func_wrap(
        "resolve-addresses",
        |mut store, (network, name): (Resource<Network>, String)| {
            let (sink, table) = store.data_mut().network();
            table.get(&network)?;
            let answer = match resolve(sink, &name) {
                Ok(addresses) => Ok(table.push(GrantedLookup {
                    addresses: addresses.into_iter(),
                })?),
                Err(code) => Err(code),
            };
            Ok((answer,))
        },
    )?;
    lookup.func_wrap(
        "[method]resolve-address-stream.resolve-next-address",
        |mut store, (this,): (Resource<GrantedLookup>,)| {
            let (_, table) = store.data_mut().network();
            let next = table.get_mut(&this)?.addresses.next().map(IpAddress::from);
            Ok((Ok::<_, ErrorCode>(next),))
        },
    )?;
    lookup.func_wrap(
        "[method]resolve-address-stream.subscribe",
        |mut store, (this,): (Resource<GrantedLookup>,)| {
            let (_, table) = store.data_mut().network();
            let pollable: Resource<DynPollable> = subscribe(table, this)?;
            Ok((pollable,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The addresses of `name` if a TCP grant names it, remembered for the
/// connect check; an address literal is its own answer.
fn resolve(network: &SinkNetwork, name: &str) -> Result<Vec<IpAddr>, ErrorCode> {
    let literal = name.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    if !network.grants.allows_lookup(name) {
        tracing::warn!(
            sink = %network.sink,
            target = %name,
            "name lookup refused: no grants.tcp entry names `{name}`"
        );
        return Err(ErrorCode::PermanentResolverFailure);
    }
    let found: Vec<IpAddr> = (name, 0u16)
        .to_socket_addrs()
        .map_err(|_| ErrorCode::NameUnresolvable)?
        .map(|address| address.ip())
        .collect();
    for ip in &found {
        network.remember(name, *ip);
    }
    Ok(found)
}
