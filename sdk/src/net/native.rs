//! Natively: the grant check of the host, then `std::net` and `ureq`.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;

use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

use super::grants::{Grants, Host, Refusal};
use super::http::{HttpError, Prepared, Response};
use crate::native::network;

/// How a native refusal tells the test author where grants go.
fn native_hint(refusal: &Refusal) -> String {
    let call = match refusal.kind() {
        super::grants::GrantKind::Http => "NativeSink::grant_http",
        super::grants::GrantKind::Tcp => "NativeSink::grant_tcp",
    };
    format!("{refusal} (natively: {call})")
}

fn denied(refusal: &Refusal) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, native_hint(refusal))
}

pub fn tcp_connect(target: &str, host: &Host, port: u16) -> io::Result<TcpStream> {
    let grants = network::current();
    let (name, addresses): (Option<&str>, Vec<SocketAddr>) = match host {
        Host::Ip(ip) => (None, vec![SocketAddr::new(*ip, port)]),
        Host::Name(name) => {
            // The host resolves only names a grant names.
            grants.check_lookup(name, port).map_err(|r| denied(&r))?;
            let found = (name.as_str(), port).to_socket_addrs().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("TCP target {target}: cannot resolve: {e}"),
                )
            })?;
            (Some(name.as_str()), found.collect())
        }
    };
    let mut refusal = None;
    let mut failure = None;
    for address in addresses {
        match grants.check_tcp_address(name, address.ip(), port) {
            Ok(_) => match TcpStream::connect(address) {
                Ok(stream) => return Ok(stream),
                Err(e) => failure = Some(e),
            },
            Err(r) => {
                refusal.get_or_insert(r);
            }
        }
    }
    match (failure, refusal) {
        (Some(e), _) => Err(io::Error::new(
            e.kind(),
            format!("TCP connection to {target} failed: {e}"),
        )),
        (None, Some(r)) => Err(denied(&r)),
        (None, None) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("TCP target {target} resolved to no address"),
        )),
    }
}

/// Hands ureq the addresses the grants allow, and nothing else: the
/// addresses were resolved and checked once, so what is connected to
/// is what was checked.
#[derive(Debug)]
struct CheckedAddresses(Vec<SocketAddr>);

impl Resolver for CheckedAddresses {
    fn resolve(
        &self,
        _uri: &ureq::http::Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut found = self.empty();
        // ureq keeps at most 16 addresses; more would panic its push.
        for address in self.0.iter().take(16) {
            found.push(*address);
        }
        Ok(found)
    }
}

/// The addresses of `prepared`'s host that the grants allow it to
/// reach, or why none.
fn checked_addresses(prepared: &Prepared, grants: &Grants) -> Result<Vec<SocketAddr>, HttpError> {
    let scheme = prepared.scheme.as_str();
    let host = prepared.host.to_string();
    let target = prepared.target();
    grants
        .check_http(scheme, &host, prepared.port)
        .map_err(|r| HttpError::Denied(native_hint(&r)))?;
    let port = prepared
        .port
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    let ips: Vec<IpAddr> = match &prepared.host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => (name.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| HttpError::Connection(format!("{target}: cannot resolve: {e}")))?
            .map(|a| a.ip())
            .collect(),
    };
    let mut refusal = None;
    let mut allowed = Vec::new();
    for ip in ips {
        match grants.check_http_address(scheme, &host, prepared.port, ip) {
            Ok(_) => allowed.push(SocketAddr::new(ip, port)),
            Err(r) => {
                refusal.get_or_insert(r);
            }
        }
    }
    match (allowed.is_empty(), refusal) {
        (false, _) => Ok(allowed),
        (true, Some(r)) => Err(HttpError::Denied(native_hint(&r))),
        (true, None) => Err(HttpError::Connection(format!(
            "{target} resolved to no address"
        ))),
    }
}

pub fn send(prepared: Prepared) -> Result<Response, HttpError> {
    let grants: Arc<Grants> = network::current();
    let addresses = checked_addresses(&prepared, &grants)?;
    let target = format!("{} {}", prepared.request.method(), prepared.request.uri());
    let timeout = Some(prepared.timeout);
    let config = ureq::config::Config::builder()
        .http_status_as_error(false)
        // The target of a redirect is not checked against the grants
        // here, and `wasi:http` does not follow redirects either.
        .max_redirects(0)
        // Environment proxies would send the request somewhere the
        // grants do not name.
        .proxy(None)
        .timeout_connect(timeout)
        .timeout_per_read(timeout)
        .timeout_per_write(timeout)
        .build();
    let agent =
        ureq::Agent::with_parts(config, DefaultConnector::new(), CheckedAddresses(addresses));
    let mut response = agent
        .run(prepared.request)
        .map_err(|e| classify(&target, e))?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .body_mut()
        .with_config()
        .limit(prepared.max_response_bytes as u64)
        .read_to_vec()
        .map_err(|e| classify(&target, e))?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn classify(target: &str, e: ureq::Error) -> HttpError {
    let message = format!("{target}: {e}");
    match e {
        ureq::Error::Timeout(_) => HttpError::Timeout(message),
        ureq::Error::Io(io) if io.kind() == io::ErrorKind::TimedOut => HttpError::Timeout(message),
        ureq::Error::BodyExceedsLimit(limit) => {
            HttpError::TooLarge(format!("{target}: the response body exceeds {limit} bytes"))
        }
        ureq::Error::BadUri(_) | ureq::Error::Http(_) => HttpError::Invalid(message),
        _ => HttpError::Connection(message),
    }
}
