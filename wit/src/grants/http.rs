//! HTTP grants (`grants.http`): the scheme, the grant, and the checks of a
//! request and of each address its host resolved to.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use super::parse::{check_characters, parse_port, split_http_authority};
use super::{
    GrantError, GrantKind, Grants, Host, HostPattern, Refusal, Verdict, canonical, decide,
};

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

/// One entry of `grants.http`: requests with this scheme to this host and
/// port may be sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpGrant {
    scheme: Scheme,
    host: HostPattern,
    port: u16,
}

impl HttpGrant {
    /// Reads `scheme://host[:port]` (see the [module docs](super) for the host
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

impl Grants {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::tests::ip;

    fn http(pattern: &str) -> HttpGrant {
        HttpGrant::parse(pattern).unwrap_or_else(|e| panic!("{e}"))
    }

    fn http_refused(pattern: &str, needle: &str) {
        let e = HttpGrant::parse(pattern).expect_err(pattern);
        let message = e.to_string();
        assert!(message.contains("grants.http"), "{message}");
        assert!(message.contains(pattern), "{message}");
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
}
