//! Hosts as a request or a connection names them, and the host patterns
//! of grants.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::canonical;
use super::parse::{
    looks_numeric, normalize_name, parse_ipv4, parse_ipv6, parse_port, parse_range, split_host_port,
};

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
    /// could never match (see the [module docs](super)), with a phrase saying why.
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
    pub(super) fn parse_bare(text: &str, bare_range: bool) -> Result<HostPattern, String> {
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
    pub(super) fn parse_bracketed(inner: &str) -> Result<HostPattern, String> {
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
    /// brackets IPv4 ranges too; see [`HttpGrant`](super::HttpGrant)'s `Display`).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::tests::ip;

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
}
