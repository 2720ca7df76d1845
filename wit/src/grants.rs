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

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

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

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP; default port 80.
    Http,
    /// HTTP over TLS; default port 443.
    Https,
}

impl Scheme {
    /// Reads a scheme without regard to case; `None` for anything but
    /// `http` and `https`.
    pub fn parse(text: &str) -> Option<Scheme> {
        if text.eq_ignore_ascii_case("http") {
            Some(Scheme::Http)
        } else if text.eq_ignore_ascii_case("https") {
            Some(Scheme::Https)
        } else {
            None
        }
    }

    /// The scheme in lower case.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The port a URL of this scheme means when it names none.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A host as a request or a connection names it: a DNS name (lower case,
/// without a trailing dot) or an IP address (IPv4-mapped IPv6 addresses
/// are stored as the IPv4 address they map).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name.
    Name(String),
    /// An address literal.
    Ip(IpAddr),
}

impl Host {
    /// Reads a URL's or a connection's host: a DNS name, an IPv4 address,
    /// or an IPv6 address with or without brackets. Refuses what a grant
    /// could never match (see the module docs), with a phrase saying why.
    pub fn parse(text: &str) -> Result<Host, String> {
        if let Some(inner) = text.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| "has `[` without a closing `]`".to_string())?;
            return parse_ipv6(inner).map(|ip| Host::Ip(canonical(IpAddr::V6(ip))));
        }
        if text.contains(':') {
            return parse_ipv6(text).map(|ip| Host::Ip(canonical(IpAddr::V6(ip))));
        }
        if looks_numeric(text) {
            return parse_ipv4(text).map(|ip| Host::Ip(IpAddr::V4(ip)));
        }
        normalize_name(text).map(Host::Name)
    }

    /// Reads a connection target `host:port` (IPv6 in brackets), the form
    /// a sink passes to open a TCP connection.
    pub fn parse_with_port(text: &str) -> Result<(Host, u16), String> {
        if text.contains('@') || text.contains("://") {
            return Err("is not `host:port`".into());
        }
        let (host, port) = split_host_port(text)?;
        let port = parse_port(port.ok_or_else(|| "has no port; write `host:port`".to_string())?)?;
        // `split_host_port` leaves the opening bracket on, the closing one off.
        let host = match host.strip_prefix('[') {
            Some(inner) => Host::Ip(canonical(IpAddr::V6(parse_ipv6(inner)?))),
            None => Host::parse(host)?,
        };
        Ok((host, port))
    }
}

impl fmt::Display for Host {
    /// A name or an IPv4 address as is, an IPv6 address in brackets: the
    /// form that goes before `:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// The host part of a grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// One DNS name, lower case, without a trailing dot.
    Name(String),
    /// `*.example.com`, stored as `example.com`: every name strictly below
    /// it, not the name itself.
    Subdomains(String),
    /// One address (an IPv4-mapped IPv6 address is stored as IPv4).
    Address(IpAddr),
    /// A CIDR range, without bits set past its prefix.
    Range(IpNet),
}

impl HostPattern {
    /// True when this pattern names `name` (a DNS name as [`Host::parse`]
    /// leaves it: lower case, no trailing dot). Address patterns name no
    /// name.
    pub fn matches_name(&self, name: &str) -> bool {
        match self {
            HostPattern::Name(granted) => granted == name,
            HostPattern::Subdomains(parent) => name
                .strip_suffix(parent.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            HostPattern::Address(_) | HostPattern::Range(_) => false,
        }
    }

    /// True when this pattern is an address or a range holding `ip` (in
    /// either of its forms, plain or IPv4-mapped). Name patterns hold no
    /// address.
    pub fn matches_ip(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match self {
            HostPattern::Address(granted) => *granted == ip,
            HostPattern::Range(range) => range.contains(&ip),
            HostPattern::Name(_) | HostPattern::Subdomains(_) => false,
        }
    }

    /// True when everything `other` names this pattern names too: how a
    /// tenant's grants bound what its sinks may be granted.
    pub fn covers(&self, other: &HostPattern) -> bool {
        match other {
            HostPattern::Name(name) => self.matches_name(name),
            HostPattern::Subdomains(parent) => match self {
                HostPattern::Subdomains(own) => own == parent || self.matches_name(parent),
                _ => false,
            },
            HostPattern::Address(ip) => self.matches_ip(*ip),
            HostPattern::Range(range) => match self {
                HostPattern::Range(own) => own.contains(range),
                HostPattern::Address(ip) => {
                    range.prefix_len() == range.max_prefix_len() && range.addr() == *ip
                }
                _ => false,
            },
        }
    }

    /// True when this pattern matches `host`.
    pub fn matches(&self, host: &Host) -> bool {
        match host {
            Host::Name(name) => self.matches_name(name),
            Host::Ip(ip) => self.matches_ip(*ip),
        }
    }

    /// Reads a host pattern written without brackets: a name, `*.name`, an
    /// IPv4 address, or (where `bare_range` allows) an IPv4 range.
    fn parse_bare(text: &str, bare_range: bool) -> Result<HostPattern, String> {
        if text.is_empty() {
            return Err("has no host".into());
        }
        if text.contains('/') {
            if !bare_range {
                return Err("has a path; a range goes in brackets, e.g. `[10.0.0.0/8]`".into());
            }
            return parse_range(text).map(HostPattern::Range);
        }
        if text.contains(':') {
            return Err("has an IPv6 address without brackets; write it as `[addr]`".into());
        }
        if text == "*" {
            return Err("grants every host; name the hosts, or use `*.example.com` \
                 for the names below one"
                .into());
        }
        if let Some(parent) = text.strip_prefix("*.") {
            let parent = normalize_name(parent)?;
            return Ok(HostPattern::Subdomains(parent));
        }
        if text.contains('*') {
            return Err("has `*` other than as the whole first label (`*.example.com`)".into());
        }
        match Host::parse(text)? {
            Host::Name(name) => Ok(HostPattern::Name(name)),
            Host::Ip(ip) => Ok(HostPattern::Address(ip)),
        }
    }

    /// Reads what stands between `[` and `]`: an IPv6 address or a range.
    fn parse_bracketed(inner: &str) -> Result<HostPattern, String> {
        if inner.contains('/') {
            return parse_range(inner).map(HostPattern::Range);
        }
        if !inner.contains(':') {
            return Err(format!(
                "has `[{inner}]`; brackets hold an IPv6 address or a range, \
                 write an IPv4 address or a name without them"
            ));
        }
        parse_ipv6(inner).map(|ip| HostPattern::Address(canonical(IpAddr::V6(ip))))
    }
}

impl fmt::Display for HostPattern {
    /// The pattern as a TCP grant writes it before `:port` (an HTTP grant
    /// brackets IPv4 ranges too; see [`HttpGrant`]'s `Display`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Name(name) => f.write_str(name),
            HostPattern::Subdomains(parent) => write!(f, "*.{parent}"),
            HostPattern::Address(IpAddr::V4(ip)) => write!(f, "{ip}"),
            HostPattern::Address(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            HostPattern::Range(IpNet::V4(net)) => write!(f, "{net}"),
            HostPattern::Range(IpNet::V6(net)) => write!(f, "[{net}]"),
        }
    }
}

/// One entry of `grants.http`: requests with this scheme to this host and
/// port may be sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpGrant {
    scheme: Scheme,
    host: HostPattern,
    port: u16,
}

impl HttpGrant {
    /// Reads `scheme://host[:port]` (see the module docs for the host
    /// forms). The error names the pattern and what is wrong.
    pub fn parse(pattern: &str) -> Result<HttpGrant, GrantError> {
        let fail = |why: String| GrantError {
            kind: GrantKind::Http,
            pattern: pattern.to_string(),
            why,
        };
        check_characters(pattern).map_err(fail)?;
        let Some((scheme_text, rest)) = pattern.split_once("://") else {
            return Err(fail(
                "is not `scheme://host[:port]`, e.g. `https://api.example.com`".into(),
            ));
        };
        let scheme = Scheme::parse(scheme_text).ok_or_else(|| {
            fail(format!(
                "has scheme `{scheme_text}`; an HTTP grant is for `http` or `https`"
            ))
        })?;
        let (host, port) = split_http_authority(rest).map_err(fail)?;
        let port = match port {
            Some(text) => parse_port(text).map_err(fail)?,
            None => scheme.default_port(),
        };
        let host = match host.strip_prefix('[') {
            Some(inner) => HostPattern::parse_bracketed(inner),
            None => HostPattern::parse_bare(host, false),
        }
        .map_err(fail)?;
        Ok(HttpGrant { scheme, host, port })
    }

    /// The scheme requests must use.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The hosts granted.
    pub fn host(&self) -> &HostPattern {
        &self.host
    }

    /// The port granted (the scheme's default when the pattern named none).
    pub fn port(&self) -> u16 {
        self.port
    }

    fn allows(&self, scheme: Scheme, host: &Host, port: u16) -> bool {
        self.scheme == scheme && self.port == port && self.host.matches(host)
    }
}

impl fmt::Display for HttpGrant {
    /// The canonical form, port always written:
    /// `https://api.example.com:443`, `http://[10.0.0.0/8]:8080`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Range(IpNet::V4(net)) => {
                write!(f, "{}://[{net}]:{}", self.scheme, self.port)
            }
            host => write!(f, "{}://{host}:{}", self.scheme, self.port),
        }
    }
}

impl FromStr for HttpGrant {
    type Err = GrantError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HttpGrant::parse(s)
    }
}

/// One entry of `grants.tcp`: connections to this host and port may be
/// opened.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TcpGrant {
    host: HostPattern,
    port: u16,
}

impl TcpGrant {
    /// Reads `host:port` (see the module docs for the host forms). The
    /// error names the pattern and what is wrong.
    pub fn parse(pattern: &str) -> Result<TcpGrant, GrantError> {
        let fail = |why: String| GrantError {
            kind: GrantKind::Tcp,
            pattern: pattern.to_string(),
            why,
        };
        check_characters(pattern).map_err(fail)?;
        if pattern.contains("://") {
            return Err(fail(
                "has a scheme; a TCP grant is `host:port`, e.g. `redis.internal:6379` \
                 (HTTP grants go in grants.http)"
                    .into(),
            ));
        }
        if pattern.contains('@') {
            return Err(fail(
                "has user info (`...@`); a grant names a host and port only".into(),
            ));
        }
        let (host, port) = split_host_port(pattern).map_err(fail)?;
        let port = parse_port(port.ok_or_else(|| {
            fail("has no port; a TCP grant is `host:port`, e.g. `redis.internal:6379`".into())
        })?)
        .map_err(fail)?;
        let host = match host.strip_prefix('[') {
            Some(inner) => HostPattern::parse_bracketed(inner),
            None => HostPattern::parse_bare(host, true),
        }
        .map_err(fail)?;
        Ok(TcpGrant { host, port })
    }

    /// The hosts granted.
    pub fn host(&self) -> &HostPattern {
        &self.host
    }

    /// The port granted.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for TcpGrant {
    /// The canonical form: `redis.internal:6379`, `[fd00::/8]:6379`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl FromStr for TcpGrant {
    type Err = GrantError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TcpGrant::parse(s)
    }
}

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

    /// The grant that allows a request to `scheme://host:port` (`port`
    /// `None`: the scheme's default), before its host is resolved. `host`
    /// is the URL's host: a name, or an address literal with or without
    /// brackets. A name is matched by name grants, an address by address
    /// and range grants.
    pub fn allows_http(&self, scheme: &str, host: &str, port: Option<u16>) -> Option<&HttpGrant> {
        self.check_http(scheme, host, port).ok()
    }

    /// Like [`Grants::allows_http`], with the reason when refused.
    pub fn check_http(
        &self,
        scheme: &str,
        host: &str,
        port: Option<u16>,
    ) -> Result<&HttpGrant, Refusal> {
        let (scheme, host, port, target) = http_target(scheme, host, port)?;
        self.http
            .iter()
            .find(|g| g.allows(scheme, &host, port))
            .ok_or_else(|| Refusal::NotGranted {
                kind: GrantKind::Http,
                grant: http_suggestion(scheme, &host, port),
                target,
            })
    }

    /// Whether a request to `scheme://host:port`, granted by
    /// [`Grants::check_http`], may connect to `ip`, one of the addresses
    /// its host resolved to. Allowed when an HTTP grant for the same scheme
    /// and port holds `ip`, or when `host` is a granted name and `ip` is
    /// public.
    pub fn check_http_address(
        &self,
        scheme: &str,
        host: &str,
        port: Option<u16>,
        ip: IpAddr,
    ) -> Result<&HttpGrant, Refusal> {
        let ip = canonical(ip);
        let by_request = self.check_http(scheme, host, port)?;
        let (scheme, host, port, target) = http_target(scheme, host, port)?;
        let by_address = self
            .http
            .iter()
            .find(|g| g.allows(scheme, &Host::Ip(ip), port));
        match decide(&host, Some(by_request), by_address, ip) {
            Verdict::Allowed(grant) => Ok(grant),
            Verdict::NotGranted => Err(Refusal::NotGranted {
                kind: GrantKind::Http,
                target: format!("{target} (at {})", Host::Ip(ip)),
                grant: http_suggestion(scheme, &Host::Ip(ip), port),
            }),
            Verdict::NonPublic(class) => Err(Refusal::NonPublic {
                kind: GrantKind::Http,
                target,
                ip,
                class,
                grant: http_suggestion(scheme, &Host::Ip(ip), port),
            }),
        }
    }

    /// The grant that names `name` (a DNS name, or an address literal
    /// with or without brackets) for `port`, before it is resolved.
    pub fn allows_tcp_name(&self, name: &str, port: u16) -> Option<&TcpGrant> {
        let host = Host::parse(name).ok()?;
        self.tcp
            .iter()
            .find(|g| g.port == port && g.host.matches(&host))
    }

    /// The TCP grant that holds `ip` (an address or a range grant) for
    /// `port`.
    pub fn allows_ip(&self, ip: IpAddr, port: u16) -> Option<&TcpGrant> {
        self.tcp
            .iter()
            .find(|g| g.port == port && g.host.matches_ip(ip))
    }

    /// Whether the sink may resolve `name` (`wasi:sockets` name lookup):
    /// only names a TCP grant names, for any of its ports. The addresses
    /// found are then checked one by one by [`Grants::check_tcp_address`].
    pub fn allows_lookup(&self, name: &str) -> bool {
        match Host::parse(name) {
            Ok(Host::Name(name)) => self.tcp.iter().any(|g| g.host.matches_name(&name)),
            Ok(Host::Ip(ip)) => self.tcp.iter().any(|g| g.host.matches_ip(ip)),
            Err(_) => false,
        }
    }

    /// Like [`Grants::allows_lookup`], refusing with the grant that would
    /// allow a connection to `name:port` (the port is only for that).
    pub fn check_lookup(&self, name: &str, port: u16) -> Result<(), Refusal> {
        let host = Host::parse(name).map_err(|why| Refusal::Malformed {
            kind: GrantKind::Tcp,
            target: format!("{name}:{port}"),
            why: format!("has a host that {why}"),
        })?;
        if self.allows_lookup(name) {
            return Ok(());
        }
        let target = format!("{host}:{port}");
        Err(Refusal::NotGranted {
            kind: GrantKind::Tcp,
            grant: target.clone(),
            target,
        })
    }

    /// Whether a TCP connection to `ip:port` may be opened. `name` is the
    /// name the sink resolved to reach `ip` (`None` when it connects to an
    /// address directly). Allowed when a TCP grant holds `ip` for `port`,
    /// or when a TCP grant names `name` for `port` and `ip` is public.
    pub fn check_tcp_address(
        &self,
        name: Option<&str>,
        ip: IpAddr,
        port: u16,
    ) -> Result<&TcpGrant, Refusal> {
        let ip = canonical(ip);
        let host = match name {
            None => Host::Ip(ip),
            Some(name) => Host::parse(name).map_err(|why| Refusal::Malformed {
                kind: GrantKind::Tcp,
                target: format!("{name}:{port}"),
                why: format!("has a host that {why}"),
            })?,
        };
        let by_name = self
            .tcp
            .iter()
            .find(|g| g.port == port && g.host.matches(&host));
        let target = format!("{host}:{port}");
        match decide(&host, by_name, self.allows_ip(ip, port), ip) {
            Verdict::Allowed(grant) => Ok(grant),
            Verdict::NotGranted => Err(Refusal::NotGranted {
                kind: GrantKind::Tcp,
                grant: target.clone(),
                target,
            }),
            Verdict::NonPublic(class) => Err(Refusal::NonPublic {
                kind: GrantKind::Tcp,
                target,
                ip,
                class,
                grant: format!("{}:{port}", Host::Ip(ip)),
            }),
        }
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

/// Reads the parts of an HTTP request's target, or refuses it.
fn http_target(
    scheme: &str,
    host: &str,
    port: Option<u16>,
) -> Result<(Scheme, Host, u16, String), Refusal> {
    let shown = |port: Option<u16>| match port {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    };
    let Some(parsed_scheme) = Scheme::parse(scheme) else {
        return Err(Refusal::Malformed {
            kind: GrantKind::Http,
            target: shown(port),
            why: "uses a scheme other than http or https".into(),
        });
    };
    let port = port.unwrap_or(parsed_scheme.default_port());
    let parsed_host = Host::parse(host).map_err(|why| Refusal::Malformed {
        kind: GrantKind::Http,
        target: shown(Some(port)),
        why: format!("has a host that {why}"),
    })?;
    let target = format!("{parsed_scheme}://{parsed_host}:{port}");
    Ok((parsed_scheme, parsed_host, port, target))
}

/// The HTTP grant an operator would write to allow exactly this target.
fn http_suggestion(scheme: Scheme, host: &Host, port: u16) -> String {
    if port == scheme.default_port() {
        format!("{scheme}://{host}")
    } else {
        format!("{scheme}://{host}:{port}")
    }
}

/// True for an address anyone on the internet could reach: not loopback,
/// private (RFC 1918, IPv6 unique local), shared (CGNAT `100.64.0.0/10`),
/// link-local, unspecified, multicast, broadcast, documentation or
/// benchmarking, reserved, or an IPv4-mapped, NAT64 or 6to4 form of one of
/// those. IPv6 outside `2000::/3` (the global unicast block) is not public.
pub fn is_public(ip: IpAddr) -> bool {
    address_class(ip).is_none()
}

/// What kind of non-public address `ip` is (`"loopback"`, `"private"`,
/// ...), or `None` for a public one. See [`is_public`].
pub fn address_class(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(ip) => ipv4_class(ip),
        IpAddr::V6(ip) => ipv6_class(ip),
    }
}

fn ipv4_class(ip: Ipv4Addr) -> Option<&'static str> {
    // (network, prefix length, class), after the IANA IPv4 special-purpose
    // address registry; the ranges it marks globally reachable are left
    // out as too small to matter.
    const NON_PUBLIC: [([u8; 4], u8, &str); 16] = [
        ([0, 0, 0, 0], 8, "unspecified (\"this network\")"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "shared (carrier-grade NAT)"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([169, 254, 0, 0], 16, "link-local"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "protocol-assignment"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "reserved (6to4 relay)"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([240, 0, 0, 0], 4, "reserved"),
        ([255, 255, 255, 255], 32, "broadcast"),
    ];
    let bits = u32::from(ip);
    // The broadcast address is inside 240/4; name it for what it is.
    if ip == Ipv4Addr::BROADCAST {
        return Some("broadcast");
    }
    NON_PUBLIC.iter().find_map(|&(net, len, class)| {
        let mask = u32::MAX << (32 - u32::from(len));
        (bits & mask == u32::from(Ipv4Addr::from(net))).then_some(class)
    })
}

fn ipv6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    let within = |net: u128, len: u32| bits & (u128::MAX << (128 - len)) == net;
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // Forms that carry an IPv4 address: judge the address they lead to.
    if within(0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96) {
        // NAT64 well-known prefix: the gateway connects to the embedded
        // IPv4 address.
        return ipv4_class(Ipv4Addr::from(bits as u32));
    }
    if within(0x2002_0000_0000_0000_0000_0000_0000_0000, 16) {
        // 6to4: the relay forwards to the IPv4 address in bits 16..48.
        return ipv4_class(Ipv4Addr::from((bits >> 80) as u32));
    }
    if within(0xfc00 << 112, 7) {
        return Some("private (unique local)");
    }
    if within(0xfe80 << 112, 10) {
        return Some("link-local");
    }
    if within(0xff00 << 112, 8) {
        return Some("multicast");
    }
    if within(0x2001_0db8 << 96, 32) || within(0x3fff << 112, 20) {
        return Some("documentation");
    }
    if within(0x2001 << 112, 23) {
        // IETF protocol assignments: Teredo, benchmarking, ORCHID, ...
        return Some("protocol-assignment");
    }
    if within(0x5f00 << 112, 16) {
        return Some("segment-routing");
    }
    if !within(0x2000 << 112, 3) {
        // IPv4-compatible, NAT64 local-use, discard-only, site-local, and
        // everything IANA has not allocated for global unicast.
        return Some("reserved");
    }
    None
}

/// The address as grants compare it: an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) is its IPv4 address, so neither form slips past a
/// grant or a rule written for the other.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Refuses whitespace and control characters anywhere in a pattern: a
/// space is more likely a typo joining two patterns than part of a host.
fn check_characters(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("is empty".into());
    }
    if pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("has whitespace or a control character".into());
    }
    Ok(())
}

/// Splits what follows `scheme://` into host and optional port, allowing
/// one trailing `/` and refusing user info, paths, queries and fragments.
fn split_http_authority(rest: &str) -> Result<(&str, Option<&str>), String> {
    // Past a closing bracket (which may hold a range's `/`), the authority
    // ends at the first `/`, `?` or `#`.
    let search_from = rest.find(']').map_or(0, |i| i + 1);
    let end = rest[search_from..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |i| search_from + i);
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        return Err("has user info (`...@`); a grant names a host and port only".into());
    }
    if !tail.is_empty() && tail != "/" {
        if !authority.starts_with('[')
            && let Some(prefix) = tail.strip_prefix('/')
            && let Some(len) = prefix.split(':').next()
            && !len.is_empty()
            && len.bytes().all(|b| b.is_ascii_digit())
        {
            let port = prefix.split_once(':').map_or("", |(_, p)| p);
            let port = if port.is_empty() {
                String::new()
            } else {
                format!(":{port}")
            };
            return Err(format!(
                "has a path; an HTTP grant writes a range in brackets: `[{authority}/{len}]{port}`"
            ));
        }
        return Err(format!(
            "has `{tail}` after the host; an HTTP grant names scheme, host and port only"
        ));
    }
    split_host_port(authority)
}

/// Splits `host[:port]`, where host may be bracketed.
fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if authority.starts_with('[') {
        let close = authority
            .find(']')
            .ok_or_else(|| "has `[` without a closing `]`".to_string())?;
        let (host, after) = authority.split_at(close + 1);
        return match after {
            "" => Ok((&host[..close], None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((&host[..close], Some(port))),
                None => Err(format!("has `{after}` after `]`; expected `:port`")),
            },
        };
    }
    match authority.matches(':').count() {
        0 => Ok((authority, None)),
        1 => {
            let (host, port) = authority.split_once(':').expect("one colon");
            Ok((host, Some(port)))
        }
        _ => Err("has an IPv6 address without brackets; write it as `[addr]`".into()),
    }
}

fn parse_port(text: &str) -> Result<u16, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "has port `{text}`; a port is a number from 1 to 65535"
        ));
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!(
            "has port {text}; a port is a number from 1 to 65535"
        )),
        Ok(port) => Ok(port),
    }
}

/// True for text made of digits and dots only (and so, if anything, an
/// IPv4 address), or whose last label is numeric, which URL parsers may
/// also read as an address (`0x7f.1`, `1.2.3.4.5`).
fn looks_numeric(text: &str) -> bool {
    let text = text.strip_suffix('.').unwrap_or(text);
    let last = text.rsplit('.').next().unwrap_or(text);
    let numeric_label = !last.is_empty()
        && (last.bytes().all(|b| b.is_ascii_digit())
            || (last.len() > 2
                && last[..2].eq_ignore_ascii_case("0x")
                && last[2..].bytes().all(|b| b.is_ascii_hexdigit())));
    numeric_label || (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
}

fn parse_ipv4(text: &str) -> Result<Ipv4Addr, String> {
    // The standard parser takes exactly four decimal parts without leading
    // zeros, which refuses the octal, hexadecimal and shortened forms some
    // resolvers still accept (`0177.0.0.1`, `127.1`, `2130706433`).
    text.parse().map_err(|_| {
        format!(
            "`{text}` is not an IPv4 address of four decimal parts (and a name may not \
             end in a numeric label)"
        )
    })
}

fn parse_ipv6(text: &str) -> Result<Ipv6Addr, String> {
    if text.contains('%') {
        return Err(format!(
            "`{text}` has a zone id (`%...`); grants do not reach link-local scopes"
        ));
    }
    text.parse()
        .map_err(|_| format!("`{text}` is not an IPv6 address"))
}

/// Reads a CIDR range, refusing bits set past the prefix and storing
/// ranges of IPv4-mapped IPv6 addresses as the IPv4 range they map.
fn parse_range(text: &str) -> Result<IpNet, String> {
    if text.contains('%') {
        return Err(format!("`{text}` has a zone id (`%...`)"));
    }
    let range: IpNet = text
        .parse()
        .map_err(|_| format!("`{text}` is not a CIDR range like `10.0.0.0/8` or `fd00::/8`"))?;
    if range.trunc() != range {
        return Err(format!(
            "`{text}` has bits set past its /{} prefix: write `{}` (or a longer prefix)",
            range.prefix_len(),
            range.trunc()
        ));
    }
    if let IpNet::V6(v6) = range {
        let mapped =
            Ipv6Net::new(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96).expect("a valid prefix");
        if v6.prefix_len() >= 96 && mapped.contains(&v6.network()) {
            let v4 = v6.network().to_ipv4_mapped().expect("inside ::ffff:0:0/96");
            let net = Ipv4Net::new(v4, v6.prefix_len() - 96).expect("prefix at most 32");
            return Ok(IpNet::V4(net));
        }
    }
    Ok(range)
}

/// Lower-cases a DNS name, drops one trailing dot, and checks it: ASCII
/// letters, digits, `-` and `_`, labels of 1 to 63 characters not starting
/// or ending with `-`, at most 253 characters, last label not numeric.
fn normalize_name(text: &str) -> Result<String, String> {
    if !text.is_ascii() {
        return Err(format!(
            "`{text}` is not ASCII; write an international name in its `xn--` form"
        ));
    }
    let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
    if name.is_empty() {
        return Err("has no host".into());
    }
    if name.len() > 253 {
        return Err(format!("`{text}` is longer than a DNS name may be (253)"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(format!("`{text}` has an empty label"));
        }
        if label.len() > 63 {
            return Err(format!("`{text}` has a label longer than 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "`{text}` is not a DNS name (letters, digits, `-` and `_` only)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("`{text}` has a label starting or ending with `-`"));
        }
    }
    if looks_numeric(&name) {
        return Err(parse_ipv4(text).expect_err("numeric names are not addresses here"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(pattern: &str) -> HttpGrant {
        HttpGrant::parse(pattern).unwrap_or_else(|e| panic!("{e}"))
    }

    fn tcp(pattern: &str) -> TcpGrant {
        TcpGrant::parse(pattern).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn http_refused(pattern: &str, needle: &str) {
        let e = HttpGrant::parse(pattern).expect_err(pattern);
        let message = e.to_string();
        assert!(message.contains("grants.http"), "{message}");
        assert!(message.contains(pattern), "{message}");
        assert!(message.contains(needle), "{pattern}: {message}");
    }

    fn tcp_refused(pattern: &str, needle: &str) {
        let e = TcpGrant::parse(pattern).expect_err(pattern);
        let message = e.to_string();
        assert!(message.contains("grants.tcp"), "{message}");
        assert!(message.contains(needle), "{pattern}: {message}");
    }

    #[test]
    fn http_grants_parse_to_canonical_forms() {
        for (pattern, canonical) in [
            ("https://api.example.com", "https://api.example.com:443"),
            ("http://api.example.com", "http://api.example.com:80"),
            ("HTTPS://API.Example.COM.", "https://api.example.com:443"),
            ("https://api.example.com/", "https://api.example.com:443"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://[::1]:8080", "http://[::1]:8080"),
            ("http://[::ffff:127.0.0.1]:8080", "http://127.0.0.1:8080"),
            ("http://[10.0.0.0/8]:8080", "http://[10.0.0.0/8]:8080"),
            ("https://[fd00::/8]", "https://[fd00::/8]:443"),
            ("https://[::ffff:10.0.0.0/104]", "https://[10.0.0.0/8]:443"),
            ("https://*.Example.com", "https://*.example.com:443"),
            ("http://my_service:9000", "http://my_service:9000"),
            ("http://localhost:65535", "http://localhost:65535"),
        ] {
            assert_eq!(http(pattern).to_string(), canonical, "{pattern}");
            // The canonical form reads back as the same grant.
            assert_eq!(http(canonical), http(pattern));
        }
        let g = http("https://api.example.com");
        assert_eq!(g.scheme(), Scheme::Https);
        assert_eq!(g.port(), 443);
        assert_eq!(g.host(), &HostPattern::Name("api.example.com".into()));
    }

    #[test]
    fn bad_http_grants_say_what_is_wrong() {
        http_refused("", "is empty");
        http_refused("api.example.com", "scheme://host");
        http_refused("ftp://example.com", "scheme `ftp`");
        http_refused("http://user:pw@example.com", "user info");
        http_refused("http://user@example.com", "user info");
        http_refused("http://example.com/path", "after the host");
        http_refused("http://example.com?q=1", "after the host");
        http_refused("http://example.com#x", "after the host");
        http_refused("http://example.com:0", "port 0");
        http_refused("http://example.com:65536", "port 65536");
        http_refused("http://example.com:", "port ``");
        http_refused("http://example.com:http", "port `http`");
        http_refused("http://example.com:+80", "port `+80`");
        http_refused("http://10.0.0.0/8:8080", "`[10.0.0.0/8]:8080`");
        http_refused("http://10.0.0.0/8", "`[10.0.0.0/8]`");
        http_refused("http://::1:8080", "without brackets");
        http_refused("http://[::1", "closing `]`");
        http_refused("http://[::1]x", "expected `:port`");
        http_refused("http://[10.0.0.1]", "brackets hold an IPv6");
        http_refused("http://[fe80::1%eth0]", "zone id");
        http_refused("http://[10.1.0.0/8]", "write `10.0.0.0/8`");
        http_refused("http://[10.0.0.0/33]", "not a CIDR range");
        http_refused("http://*", "grants every host");
        http_refused("http://a.*.example.com", "whole first label");
        http_refused("http://*example.com", "whole first label");
        http_refused("http://127.1", "four decimal parts");
        http_refused("http://2130706433", "four decimal parts");
        http_refused("http://0177.0.0.1", "four decimal parts");
        http_refused("http://1.2.3.4.5", "four decimal parts");
        http_refused("http://example.0x7f", "four decimal parts");
        http_refused("http://bücher.example", "xn--");
        http_refused("http://a..b", "empty label");
        http_refused("http://-a.example", "`-`");
        http_refused("http://a b", "whitespace");
        http_refused("http://exa$mple.com", "not a DNS name");
        http_refused(&format!("http://{}.com", "a".repeat(64)), "63");
    }

    #[test]
    fn tcp_grants_parse_to_canonical_forms() {
        for (pattern, canonical) in [
            ("redis.internal:6379", "redis.internal:6379"),
            ("Redis.Internal.:6379", "redis.internal:6379"),
            ("10.1.2.3:6379", "10.1.2.3:6379"),
            ("10.0.0.0/8:6379", "10.0.0.0/8:6379"),
            ("[10.0.0.0/8]:6379", "10.0.0.0/8:6379"),
            ("[fd00::/8]:6379", "[fd00::/8]:6379"),
            ("[::1]:6379", "[::1]:6379"),
            ("[::ffff:192.168.1.1]:6379", "192.168.1.1:6379"),
            ("*.cache.internal:6379", "*.cache.internal:6379"),
        ] {
            assert_eq!(tcp(pattern).to_string(), canonical, "{pattern}");
            assert_eq!(tcp(canonical), tcp(pattern));
        }
    }

    #[test]
    fn bad_tcp_grants_say_what_is_wrong() {
        tcp_refused("redis.internal", "has no port");
        tcp_refused("redis://redis.internal:6379", "has a scheme");
        tcp_refused("user@redis.internal:6379", "user info");
        tcp_refused("fd00::/8:6379", "without brackets");
        tcp_refused("::1:6379", "without brackets");
        tcp_refused("10.0.0.1/8:6379", "write `10.0.0.0/8`");
        tcp_refused("redis.internal:0", "port 0");
        tcp_refused("redis.internal:99999", "port 99999");
        tcp_refused("*:6379", "grants every host");
        tcp_refused("10.0.0.256:6379", "four decimal parts");
        tcp_refused("[10.0.0.1]:6379", "brackets hold an IPv6");
        tcp_refused(":6379", "has no host");
    }

    #[test]
    fn http_matching_by_name() {
        let grants = Grants::parse(
            [
                "https://api.example.com",
                "http://hooks.example.com:8080",
                "https://*.svc.example.com",
            ],
            [] as [&str; 0],
        )
        .unwrap();
        let allows = |scheme, host, port| grants.allows_http(scheme, host, port).is_some();
        assert!(allows("https", "api.example.com", None));
        assert!(allows("https", "api.example.com", Some(443)));
        assert!(allows("HTTPS", "API.EXAMPLE.COM.", None));
        // Another scheme, port or name is another target.
        assert!(!allows("http", "api.example.com", None));
        assert!(!allows("https", "api.example.com", Some(8443)));
        assert!(!allows("https", "example.com", None));
        assert!(!allows("https", "api.example.com.evil.net", None));
        assert!(!allows("https", "evilapi.example.com", None));
        assert!(allows("http", "hooks.example.com", Some(8080)));
        assert!(!allows("http", "hooks.example.com", None));
        // Subdomains, at any depth, but not the parent itself.
        assert!(allows("https", "a.svc.example.com", None));
        assert!(allows("https", "a.b.svc.example.com", None));
        assert!(!allows("https", "svc.example.com", None));
        assert!(!allows("https", "xsvc.example.com", None));
        // A name grant does not grant the address the name has.
        assert!(!allows("https", "93.184.216.34", None));
        // Malformed hosts are refused, never matched.
        assert!(!allows("https", "api.example.com:443", None));
        assert!(!allows("https", "", None));
    }

    #[test]
    fn http_matching_by_address_and_range() {
        let grants = Grants::parse(
            [
                "http://127.0.0.1:8080",
                "http://[::1]:8080",
                "http://[10.0.0.0/8]:9000",
                "https://[fd00::/8]",
            ],
            [] as [&str; 0],
        )
        .unwrap();
        let allows = |scheme, host, port| grants.allows_http(scheme, host, port).is_some();
        assert!(allows("http", "127.0.0.1", Some(8080)));
        assert!(allows("http", "[::ffff:127.0.0.1]", Some(8080)));
        assert!(allows("http", "::ffff:7f00:1", Some(8080)));
        assert!(!allows("http", "127.0.0.2", Some(8080)));
        assert!(!allows("http", "127.0.0.1", Some(8081)));
        assert!(allows("http", "[::1]", Some(8080)));
        assert!(allows("http", "::1", Some(8080)));
        assert!(allows("http", "10.200.3.4", Some(9000)));
        assert!(allows("http", "[::ffff:10.200.3.4]", Some(9000)));
        assert!(!allows("http", "11.0.0.1", Some(9000)));
        assert!(allows("https", "[fd12:3456::1]", None));
        assert!(!allows("https", "[fe80::1]", None));
        // Neither a name nor an ambiguous numeric host matches an address.
        assert!(!allows("http", "localhost", Some(8080)));
        assert!(!allows("http", "2130706433", Some(8080)));
        assert!(!allows("http", "127.1", Some(8080)));
        assert!(!allows("http", "0x7f.0.0.1", Some(8080)));
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
    fn names_reach_public_addresses_only() {
        let grants = Grants::parse(
            [
                "https://api.example.com",
                "http://localhost:8080",
                "http://internal.example.com:8080",
                "http://[10.0.0.0/8]:8080",
            ],
            [] as [&str; 0],
        )
        .unwrap();
        let public = ip("93.184.216.34");
        assert!(
            grants
                .check_http_address("https", "api.example.com", None, public)
                .is_ok()
        );
        // DNS pointing a granted name at loopback is refused ...
        let e = grants
            .check_http_address("https", "api.example.com", None, ip("127.0.0.1"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "HTTP request to https://api.example.com:443 resolved to 127.0.0.1, a loopback \
             address, and a granted name reaches public addresses only: add \
             `https://127.0.0.1` (or a range holding it) to grants.http"
        );
        // ... also in its IPv4-mapped IPv6 form.
        let e = grants
            .check_http_address("https", "api.example.com", None, ip("::ffff:127.0.0.1"))
            .unwrap_err();
        assert!(
            matches!(e, Refusal::NonPublic { ip, .. } if ip == "127.0.0.1".parse::<IpAddr>().unwrap())
        );
        // `localhost` is a name like any other.
        assert!(
            grants
                .check_http_address("http", "localhost", Some(8080), ip("127.0.0.1"))
                .is_err()
        );
        // A private address is reached when a range for the same scheme and
        // port holds it.
        let by = grants
            .check_http_address("http", "internal.example.com", Some(8080), ip("10.1.2.3"))
            .unwrap();
        assert_eq!(by.to_string(), "http://[10.0.0.0/8]:8080");
        assert!(
            grants
                .check_http_address("http", "internal.example.com", Some(8080), ip("172.16.0.1"))
                .is_err()
        );
        // An ungranted name is refused before its address matters.
        assert!(matches!(
            grants.check_http_address("https", "other.example.com", None, public),
            Err(Refusal::NotGranted { .. })
        ));
        // A granted address literal reaches exactly that address.
        let grants = Grants::parse(["http://127.0.0.1:8080"], [] as [&str; 0]).unwrap();
        assert!(
            grants
                .check_http_address("http", "127.0.0.1", Some(8080), ip("127.0.0.1"))
                .is_ok()
        );
        assert!(
            grants
                .check_http_address("http", "127.0.0.1", Some(8080), ip("127.0.0.2"))
                .is_err()
        );
    }

    #[test]
    fn tcp_names_addresses_and_lookups() {
        let grants = Grants::parse(
            [] as [&str; 0],
            [
                "redis.example.com:6379",
                "cache.internal:6379",
                "[fd00::/8]:6379",
                "127.0.0.1:6379",
            ],
        )
        .unwrap();
        assert!(grants.allows_tcp_name("REDIS.example.com.", 6379).is_some());
        assert!(grants.allows_tcp_name("redis.example.com", 6380).is_none());
        assert!(grants.allows_ip(ip("fd00::7"), 6379).is_some());
        assert!(grants.allows_ip(ip("fe80::7"), 6379).is_none());
        assert!(grants.allows_ip(ip("::ffff:127.0.0.1"), 6379).is_some());
        assert!(grants.allows_lookup("redis.example.com"));
        assert!(grants.allows_lookup("cache.internal."));
        assert!(!grants.allows_lookup("example.com"));
        assert!(!grants.allows_lookup("bad name"));
        assert!(grants.check_lookup("cache.internal", 1).is_ok());
        assert_eq!(
            grants
                .check_lookup("db.internal", 5432)
                .unwrap_err()
                .to_string(),
            "TCP connection to db.internal:5432 is not granted: add `db.internal:5432` to grants.tcp"
        );

        // Public address through a granted name: yes.
        assert!(
            grants
                .check_tcp_address(Some("redis.example.com"), ip("8.8.8.8"), 6379)
                .is_ok()
        );
        // Private address through a granted name: no ...
        let e = grants
            .check_tcp_address(Some("cache.internal"), ip("10.0.0.5"), 6379)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "TCP connection to cache.internal:6379 resolved to 10.0.0.5, a private address, \
             and a granted name reaches public addresses only: add `10.0.0.5:6379` (or a \
             range holding it) to grants.tcp"
        );
        // ... unless a range holds it, for the same port.
        assert!(
            grants
                .check_tcp_address(Some("cache.internal"), ip("fd00::5"), 6379)
                .is_ok()
        );
        assert!(
            grants
                .check_tcp_address(Some("cache.internal"), ip("fd00::5"), 6380)
                .is_err()
        );
        // Direct addresses: only the granted ones.
        assert!(
            grants
                .check_tcp_address(None, ip("127.0.0.1"), 6379)
                .is_ok()
        );
        assert!(grants.check_tcp_address(None, ip("8.8.8.8"), 6379).is_err());
        // A name nobody granted is refused even when its address is public.
        assert!(matches!(
            grants.check_tcp_address(Some("other.example.com"), ip("8.8.8.8"), 6379),
            Err(Refusal::NotGranted { .. })
        ));
        // A name grant for another port does not carry over.
        assert!(
            grants
                .check_tcp_address(Some("redis.example.com"), ip("8.8.8.8"), 6380)
                .is_err()
        );
    }

    #[test]
    fn public_and_non_public_addresses() {
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
            "64:ff9b::808:808",
            "2002:0808:0808::1",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(ip(public)), "{public} should be public");
        }
        for (non_public, class) in [
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("10.0.0.1", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.255", "carrier-grade NAT"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("169.254.169.254", "link-local"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.0.0.8", "protocol-assignment"),
            ("192.0.2.1", "documentation"),
            ("192.168.1.1", "private"),
            ("198.18.0.1", "benchmarking"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("224.0.0.251", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.255", "broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::127.0.0.1", "reserved"),
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::a00:1", "private"),
            ("64:ff9b:1::1", "reserved"),
            ("2002:7f00:0001::1", "loopback"),
            ("2002:c0a8:0101::1", "private"),
            ("fc00::1", "unique local"),
            ("fd12:3456::1", "unique local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "reserved"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("2001::1", "protocol-assignment"),
            ("2001:2::1", "protocol-assignment"),
            ("5f00::1", "segment-routing"),
            ("100::1", "reserved"),
        ] {
            let found = address_class(ip(non_public));
            assert!(
                found.is_some_and(|c| c.contains(class)),
                "{non_public}: expected {class}, got {found:?}"
            );
        }
    }

    #[test]
    fn hosts_parse_like_grants() {
        assert_eq!(
            Host::parse("Example.COM.").unwrap(),
            Host::Name("example.com".into())
        );
        assert_eq!(Host::parse("[::1]").unwrap(), Host::Ip(ip("::1")));
        assert_eq!(
            Host::parse("::ffff:1.2.3.4").unwrap(),
            Host::Ip(ip("1.2.3.4"))
        );
        assert_eq!(Host::Ip(ip("::1")).to_string(), "[::1]");
        for bad in ["", "127.1", "a..b", "[::1", "[fe80::1%25eth0]", "exa mple"] {
            assert!(Host::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            Host::parse_with_port("[::1]:6379").unwrap(),
            (Host::Ip(ip("::1")), 6379)
        );
        assert_eq!(
            Host::parse_with_port("Redis.internal:6379").unwrap(),
            (Host::Name("redis.internal".into()), 6379)
        );
        for bad in [
            "redis.internal",
            "redis.internal:",
            "redis.internal:0",
            "::1:6379",
            "redis://r:6379",
            "u@r:6379",
        ] {
            assert!(Host::parse_with_port(bad).is_err(), "{bad:?} accepted");
        }
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
