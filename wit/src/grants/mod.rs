//! Network grants: the hosts and ports a sink may reach, as the operator
//! writes them in the pipeline (`grants: { http: [...], tcp: [...] }`).
//!
//! One definition for the host (which enforces grants on `wasi:http` and
//! `wasi:sockets`) and for the SDK's native runner (which refuses the same
//! targets in tests), so a sink that passes its native tests is granted the
//! same way in production.
//!
//! # Syntax
//!
//! An HTTP grant is `scheme://host[:port]`, a TCP grant is `host:port`:
//!
//! | host form            | HTTP grant                     | TCP grant                  |
//! |----------------------|--------------------------------|----------------------------|
//! | DNS name             | `https://api.example.com`      | `redis.internal:6379`      |
//! | subdomains of a name | `https://*.example.com`        | `*.cache.internal:6379`    |
//! | IPv4 address         | `http://127.0.0.1:8080`        | `10.1.2.3:6379`            |
//! | IPv6 address         | `http://[::1]:8080`            | `[fd00::5]:6379`           |
//! | IPv4 range (CIDR)    | `http://[10.0.0.0/8]:8080`     | `10.0.0.0/8:6379`          |
//! | IPv6 range (CIDR)    | `http://[fd00::/8]:8080`       | `[fd00::/8]:6379`          |
//!
//! - The scheme is `http` or `https` (any case). The HTTP port defaults to
//!   80 or 443; a TCP port is required. A grant is for one port.
//! - In an HTTP grant a range is written in brackets, because in URL form a
//!   bare `/` would start a path. A TCP grant may bracket any range and must
//!   bracket IPv6 addresses and ranges.
//! - Names compare without case and without a trailing dot.
//!   `*.example.com` grants every name below `example.com`
//!   (`a.example.com`, `a.b.example.com`) but not `example.com` itself.
//! - A range must not have bits set past its prefix (`10.1.0.0/8` is
//!   refused: write `10.0.0.0/8`, or `10.1.0.0/16`).
//! - Refused: user info (`user@host`), paths other than `/`, queries,
//!   fragments, IPv6 zone ids, port 0, names that end in a numeric label
//!   (`127.1`, `1.2.3.4.5`: URL parsers read some of them as IPv4
//!   addresses), non-ASCII names (write the `xn--` form) and `*` alone.
//!
//! # Names reach public addresses only
//!
//! A grant by name says "this service", not "whatever address its DNS
//! answers today": a name that resolves to a loopback, private, link-local
//! or otherwise non-public address (see [`is_public`]) is refused unless
//! that address, or a range holding it, is granted too, for the same port
//! (and for HTTP the same scheme). Without this rule, whoever controls a
//! granted name's DNS could point the sink at the host's own loopback or
//! its private network. Addresses and ranges granted directly are reached
//! whatever they are: the operator named them.
//!
//! # Deciding
//!
//! - HTTP: [`Grants::check_http`] before resolving the request's host, then
//!   [`Grants::check_http_address`] for each address it resolved to.
//! - TCP: [`Grants::allows_lookup`] before resolving a name, then
//!   [`Grants::check_tcp_address`] when connecting, with the name that
//!   resolved to the address if there is one.

mod address;
mod host;
mod http;
mod parse;
mod tcp;

use std::fmt;
use std::net::IpAddr;

pub use address::{address_class, canonical, is_public};
pub use host::{Host, HostPattern};
pub use http::{HttpGrant, Scheme};
pub use tcp::TcpGrant;

/// Which list of the pipeline's `grants` a grant belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GrantKind {
    /// Outgoing HTTP requests (`wasi:http`).
    Http,
    /// Outgoing TCP connections (`wasi:sockets`).
    Tcp,
}

impl GrantKind {
    /// The pipeline key that holds grants of this kind: `grants.http` or
    /// `grants.tcp`. Refusals name it so the operator knows where to add.
    pub fn key(self) -> &'static str {
        match self {
            GrantKind::Http => "grants.http",
            GrantKind::Tcp => "grants.tcp",
        }
    }
}

/// A grant pattern that cannot be used: names the list, the pattern, and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantError {
    /// The list the pattern was given in.
    pub kind: GrantKind,
    /// The pattern as written.
    pub pattern: String,
    /// What is wrong, as a phrase.
    pub why: String,
}

impl fmt::Display for GrantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} entry `{}`: {}",
            self.kind.key(),
            self.pattern,
            self.why
        )
    }
}

impl std::error::Error for GrantError {}

/// Why a request or a connection is refused. Its message names the target
/// and the grant to add, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No grant names the target.
    NotGranted {
        /// The kind of grant that would allow it.
        kind: GrantKind,
        /// The target as the sink asked for it.
        target: String,
        /// The grant that would allow it.
        grant: String,
    },
    /// The target is granted by name, but the name resolved to a
    /// non-public address that no grant holds.
    NonPublic {
        /// The kind of grant that would allow it.
        kind: GrantKind,
        /// The target as the sink asked for it.
        target: String,
        /// The address the name resolved to.
        ip: IpAddr,
        /// What kind of non-public address it is (see [`address_class`]).
        class: &'static str,
        /// The address grant that would allow it.
        grant: String,
    },
    /// The target cannot be granted at all (a malformed host, or a scheme
    /// other than `http` and `https`).
    Malformed {
        /// The kind of grant it was checked against.
        kind: GrantKind,
        /// The target as the sink asked for it.
        target: String,
        /// What is wrong, as a phrase.
        why: String,
    },
}

impl Refusal {
    /// The kind of grant the refusal is about.
    pub fn kind(&self) -> GrantKind {
        match self {
            Refusal::NotGranted { kind, .. }
            | Refusal::NonPublic { kind, .. }
            | Refusal::Malformed { kind, .. } => *kind,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotGranted {
                kind,
                target,
                grant,
            } => write!(
                f,
                "{} {target} is not granted: add `{grant}` to {}",
                noun(*kind),
                kind.key()
            ),
            Refusal::NonPublic {
                kind,
                target,
                ip,
                class,
                grant,
            } => write!(
                f,
                "{} {target} resolved to {ip}, a {class} address, and a granted name reaches \
                 public addresses only: add `{grant}` (or a range holding it) to {}",
                noun(*kind),
                kind.key()
            ),
            Refusal::Malformed { kind, target, why } => {
                write!(f, "{} {target} {why}", noun(*kind))
            }
        }
    }
}

impl std::error::Error for Refusal {}

fn noun(kind: GrantKind) -> &'static str {
    match kind {
        GrantKind::Http => "HTTP request to",
        GrantKind::Tcp => "TCP connection to",
    }
}

/// What the operator granted one sink: every HTTP and TCP grant. Empty
/// (the default) refuses everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// The entries of `grants.http`.
    pub http: Vec<HttpGrant>,
    /// The entries of `grants.tcp`.
    pub tcp: Vec<TcpGrant>,
}

impl Grants {
    /// Reads both lists; the first bad pattern is the error.
    pub fn parse<H, T>(
        http: impl IntoIterator<Item = H>,
        tcp: impl IntoIterator<Item = T>,
    ) -> Result<Grants, GrantError>
    where
        H: AsRef<str>,
        T: AsRef<str>,
    {
        Ok(Grants {
            http: http
                .into_iter()
                .map(|p| HttpGrant::parse(p.as_ref()))
                .collect::<Result<_, _>>()?,
            tcp: tcp
                .into_iter()
                .map(|p| TcpGrant::parse(p.as_ref()))
                .collect::<Result<_, _>>()?,
        })
    }

    /// True when nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.http.is_empty() && self.tcp.is_empty()
    }

    /// Checks that every grant of `narrower` lies within one of these (same
    /// scheme and port, a host pattern this one covers); the error names
    /// the first that does not, as `http` or `tcp` and its pattern.
    pub fn check_within(&self, narrower: &Grants) -> Result<(), (GrantKind, String)> {
        for grant in &narrower.http {
            let within = self.http.iter().any(|own| {
                own.scheme() == grant.scheme()
                    && own.port() == grant.port()
                    && own.host().covers(grant.host())
            });
            if !within {
                return Err((GrantKind::Http, grant.to_string()));
            }
        }
        for grant in &narrower.tcp {
            let within = self
                .tcp
                .iter()
                .any(|own| own.port() == grant.port() && own.host().covers(grant.host()));
            if !within {
                return Err((GrantKind::Tcp, grant.to_string()));
            }
        }
        Ok(())
    }
}

/// What [`decide`] found.
enum Verdict<'g, G> {
    Allowed(&'g G),
    NotGranted,
    NonPublic(&'static str),
}

/// The rule for reaching `ip` for a target `host`: a grant holding the
/// address itself (or a range holding it) always reaches it; a grant of
/// the name reaches it only when it is public. An address target is
/// reached only through a grant holding the address.
fn decide<'g, G>(
    host: &Host,
    by_name: Option<&'g G>,
    by_address: Option<&'g G>,
    ip: IpAddr,
) -> Verdict<'g, G> {
    if let Some(grant) = by_address {
        return Verdict::Allowed(grant);
    }
    match (host, by_name) {
        (Host::Name(_), Some(grant)) => match address_class(ip) {
            None => Verdict::Allowed(grant),
            Some(class) => Verdict::NonPublic(class),
        },
        _ => Verdict::NotGranted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn refusals_name_the_target_and_the_grant_to_add() {
        let grants = Grants::default();
        let e = grants
            .check_http("https", "API.example.com", None)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "HTTP request to https://api.example.com:443 is not granted: add \
             `https://api.example.com` to grants.http"
        );
        let e = grants.check_http("http", "::1", Some(8080)).unwrap_err();
        assert!(e.to_string().contains("add `http://[::1]:8080`"), "{e}");
        let e = grants.check_http("ftp", "example.com", None).unwrap_err();
        assert!(matches!(e, Refusal::Malformed { .. }), "{e}");
        let e = grants.check_http("http", "127.1", None).unwrap_err();
        assert!(matches!(e, Refusal::Malformed { .. }), "{e}");
        let e = grants
            .check_tcp_address(Some("redis.internal"), ip("203.0.114.1"), 6379)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "TCP connection to redis.internal:6379 is not granted: add \
             `redis.internal:6379` to grants.tcp"
        );
        let e = grants
            .check_tcp_address(None, ip("fd00::1"), 6379)
            .unwrap_err();
        assert!(e.to_string().contains("add `[fd00::1]:6379`"), "{e}");
        assert_eq!(e.kind(), GrantKind::Tcp);
    }

    #[test]
    fn a_tenant_s_grants_bound_a_sink_s() {
        let tenant = Grants::parse(
            ["https://*.a.example", "http://[10.1.0.0/16]:8080"],
            ["db.a.example:5432", "10.2.0.0/16:6379"],
        )
        .unwrap();
        let within = |http: &[&str], tcp: &[&str]| {
            tenant.check_within(&Grants::parse(http.iter().copied(), tcp.iter().copied()).unwrap())
        };
        assert!(within(&["https://api.a.example", "https://*.x.a.example"], &[]).is_ok());
        assert!(within(&["http://10.1.2.3:8080", "http://[10.1.4.0/24]:8080"], &[]).is_ok());
        assert!(
            within(
                &[],
                &["db.a.example:5432", "10.2.3.4:6379", "[10.2.3.0/24]:6379"]
            )
            .is_ok()
        );
        for (http, tcp) in [
            (vec!["https://a.example"], vec![]),
            (vec!["http://api.a.example"], vec![]),
            (vec!["https://api.a.example:8443"], vec![]),
            (vec!["https://*.example"], vec![]),
            (vec!["http://[10.0.0.0/8]:8080"], vec![]),
            (vec![], vec!["db.a.example:5433"]),
            (vec![], vec!["[10.0.0.0/8]:6379"]),
            (vec![], vec!["other.example:5432"]),
        ] {
            let refused = within(&http, &tcp);
            assert!(refused.is_err(), "{http:?} {tcp:?} was let through");
        }
    }
}
