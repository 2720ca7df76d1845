//! The pieces of grant and target syntax: characters, authority, host and
//! port, port numbers, addresses, ranges and names.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Refuses whitespace and control characters anywhere in a pattern: a
/// space is more likely a typo joining two patterns than part of a host.
pub(super) fn check_characters(pattern: &str) -> Result<(), String> {
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
pub(super) fn split_http_authority(rest: &str) -> Result<(&str, Option<&str>), String> {
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
pub(super) fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
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

pub(super) fn parse_port(text: &str) -> Result<u16, String> {
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
pub(super) fn looks_numeric(text: &str) -> bool {
    let text = text.strip_suffix('.').unwrap_or(text);
    let last = text.rsplit('.').next().unwrap_or(text);
    let numeric_label = !last.is_empty()
        && (last.bytes().all(|b| b.is_ascii_digit())
            || (last.len() > 2
                && last[..2].eq_ignore_ascii_case("0x")
                && last[2..].bytes().all(|b| b.is_ascii_hexdigit())));
    numeric_label || (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
}

pub(super) fn parse_ipv4(text: &str) -> Result<Ipv4Addr, String> {
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

pub(super) fn parse_ipv6(text: &str) -> Result<Ipv6Addr, String> {
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
pub(super) fn parse_range(text: &str) -> Result<IpNet, String> {
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
pub(super) fn normalize_name(text: &str) -> Result<String, String> {
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
