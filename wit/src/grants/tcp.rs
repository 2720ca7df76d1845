//! TCP grants (`grants.tcp`): the grant, and the checks of a name lookup
//! and of a connection.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::parse::{check_characters, parse_port, split_host_port};
use super::{
    GrantError, GrantKind, Grants, Host, HostPattern, Refusal, Verdict, canonical, decide,
};

/// One entry of `grants.tcp`: connections to this host and port may be
/// opened.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TcpGrant {
    host: HostPattern,
    port: u16,
}

impl TcpGrant {
    /// Reads `host:port` (see the [module docs](super) for the host forms). The
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

impl Grants {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::tests::ip;

    fn tcp(pattern: &str) -> TcpGrant {
        TcpGrant::parse(pattern).unwrap_or_else(|e| panic!("{e}"))
    }

    fn tcp_refused(pattern: &str, needle: &str) {
        let e = TcpGrant::parse(pattern).expect_err(pattern);
        let message = e.to_string();
        assert!(message.contains("grants.tcp"), "{message}");
        assert!(message.contains(needle), "{pattern}: {message}");
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
}
